"""The trial API: the few calls a training function makes to be scheduled by Hermes.

    from hermes import trial

    state = trial.Checkpoint(model=model, optimizer=optimizer)   # saved at every checkpoint
    for epoch in range(state.restore(), trial.budget()):          # 0, or the step resumed from
        ...
        trial.report(epoch + 1, accuracy=accuracy)                # may suspend or stop the process
                                                                  # (the step may be left out: the next one)

``report`` blocks until the scheduler answers. On *suspend* it commits a checkpoint and raises
``SuspendExit`` (a SystemExit), so the process ends cleanly and frees its GPU; the executor
restarts it later, maybe on another GPU, and ``restore`` picks up from the checkpoint. On *stop*
it raises ``StopExit``. See docs/trials.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hermes.trial import protocol
from hermes.trial.checkpoint import Checkpoint, Files, Saver, capture_rng, load_state, restore_rng
from hermes.trial.session import ResumeError, Session, StopExit, SuspendExit, current


def config() -> dict[str, Any]:
    """The trial's hyper-parameters."""
    return dict(current().config)


def trial_id() -> str:
    return current().trial_id


def budget() -> int:
    """Steps the trial trains when it is never stopped; it should exit after reporting this step."""
    return current().budget


def start_step() -> int:
    """The step of the checkpoint this process resumes from; 0 when it starts fresh."""
    return current().step_to_go_on_from()


def trial_dir() -> Path:
    """The trial's own directory, kept across suspensions: put final outputs (models, plots) here."""
    return current().directory


def checkpoint_dir() -> Path | None:
    """The newest committed checkpoint's directory (read-only by convention); None when there is none."""
    latest = protocol.latest_checkpoint(current().directory)
    return latest[0] if latest is not None else None


def report(step: int | Mapping[str, Any] | None = None, **metrics: Any) -> None:
    """Report the metrics of ``step`` (> the previous step) and obey the scheduler's answer.

    ``report(3, accuracy=0.9)``, ``report(step=3, accuracy=0.9)``, ``report(accuracy=0.9)`` or
    ``report({"accuracy": 0.9})`` (a mapping's ``"step"`` is the step too): without a step it is the previous
    one plus one, counted from the checkpoint's step after a resume (from 1 for a trial with no saver, which
    starts over). Returns when the trial may go on; raises ``SuspendExit`` after committing a checkpoint of
    ``step`` when it is suspended, ``StopExit`` when it is stopped.
    """
    session = current()
    if isinstance(step, Mapping):
        metrics = {**step, **metrics}
        step = metrics.pop("step", None)
    session.report(session.next_step() if step is None else step, metrics)


__all__ = [
    "Checkpoint",
    "Files",
    "ResumeError",
    "Saver",
    "Session",
    "StopExit",
    "SuspendExit",
    "budget",
    "capture_rng",
    "checkpoint_dir",
    "config",
    "current",
    "load_state",
    "report",
    "restore_rng",
    "start_step",
    "trial_dir",
    "trial_id",
]
