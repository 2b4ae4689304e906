"""The engine-neutral half of running a cooperative trial: what to answer each of its reports.

A trial that uses ``hermes.trial`` blocks at every report until it is answered ``continue``,
``suspend`` or ``stop``. The rules here hold for any engine that runs such trials (the local
executor's launchers, a Ray node agent): which metric is the objective, which reports are
catch-up (answered at once, never shown to the core), and that a report is answered only once
the core has decided about it (``Executor.settled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hermes.core.events import TrialReported
from hermes.trial import protocol


def objective_value(metrics: Mapping[str, float], metric: str | None, step: int) -> float:
    """The objective among the metrics of the report of ``step``: the one named ``metric``, or the only one.

    ValueError when it cannot be told: the executor fails the trial with that reason."""
    if metric is not None:
        if metric not in metrics:
            raise ValueError(f"report of step {step} lacks the objective metric {metric!r}")
        return metrics[metric]
    if len(metrics) == 1:
        return next(iter(metrics.values()))
    raise ValueError("several metrics reported but the executor names no objective metric")


@dataclass(slots=True, eq=False, kw_only=True)
class TrialProgress:
    """Where the core stands with a trial, as an engine must know it to filter catch-up reports."""

    trial_id: str
    last_step: int = 0  # the last step the core knows; a report up to it is catch-up
    checkpoint_step: int = 0  # the last step reported with a durable checkpoint

    def reported(
        self, step: int, value: float, metrics: Mapping[str, float], checkpointed: bool, at: float
    ) -> TrialReported:
        """A new report (past ``last_step``), as the event the core gets."""
        if step <= self.last_step:
            raise ValueError(f"reported step {step} after step {self.last_step}")
        if step > protocol.MAX_STEP:
            raise ValueError(f"reported step {step}, past the largest, {protocol.MAX_STEP}")
        self.last_step = step
        if checkpointed:
            self.checkpoint_step = step
        return TrialReported(at, self.trial_id, step, value, checkpointed, dict(metrics))

    def lost(self) -> None:
        """Its run died with its GPU or node: the core falls it back to its last checkpoint."""
        self.last_step = self.checkpoint_step


@dataclass(slots=True, eq=False)
class Handshake:
    """One run's side of the protocol: the report waiting for an answer, and what to answer."""

    progress: TrialProgress
    awaiting: TrialReported | None = None  # the report that waits for the core
    suspend_requested: bool = False
    stop_requested: bool = False

    def report(
        self, step: int, metrics: Mapping[str, float], checkpointed: bool, at: float, metric: str | None
    ) -> tuple[str | None, TrialReported | None]:
        """A report came: an answer to give at once (a catch-up's), or the event to hand to the core, whose
        answer waits for ``settle``. A stopped trial's new report is handed on too (the core keeps it, as Ray
        Tune keeps what a trial reported before it ended), and answered "stop"."""
        value = objective_value(metrics, metric, step)
        if step <= self.progress.last_step:  # catching up from an older checkpoint: known already
            return protocol.STOP if self.stop_requested else protocol.CONTINUE, None
        self.awaiting = self.progress.reported(step, value, metrics, checkpointed, at)
        return None, self.awaiting

    def settle(self, event: TrialReported) -> str | None:
        """The core has decided about ``event``: the answer, if it is the report this run waits on."""
        if self.awaiting is not event:
            return None
        self.awaiting = None
        if self.stop_requested:
            return protocol.STOP
        return protocol.SUSPEND if self.suspend_requested else protocol.CONTINUE
