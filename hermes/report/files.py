"""Where a stored experiment's trials keep their files on this machine: what ``hermes results`` and
``hermes trace`` point at.

On one machine (and in a pool), a trial's files are ``<experiment dir>/trials/<trial>``. In a Ray run,
each node keeps the trials it ran under ``<experiment dir>/nodes/<node>/trials/<trial>`` (a trial that
moved has one on each node; only this machine's nodes are here), and their durable checkpoints go to
``storage.uri``, by default ``<experiment dir>/checkpoints/<trial>/``.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hermes.trial import protocol


@dataclass(frozen=True, slots=True)
class TrialFiles:
    directory: Path | None  # its logs, its config and its local checkpoints; None: not on this machine
    checkpoint: Path | None  # its newest committed checkpoint here; None: none


def trial_files(experiment_dir: Path, trial_id: str) -> TrialFiles:
    """The trial's directory (in a Ray run, that of the node where it last saved, or else wrote, anything) and
    its newest checkpoint, local or durable (a durable one on a tie: any node resumes from it)."""
    pattern = f"{glob.escape(str(experiment_dir))}/nodes/*/trials/{glob.escape(trial_id)}"
    directories = [path for path in (experiment_dir / "trials" / trial_id, *map(Path, glob.glob(pattern)))
                   if path.is_dir()]
    local = {directory: _readable(protocol.latest_checkpoint, directory) for directory in directories}
    directory = max(directories, key=lambda d: (local[d][1] if local[d] else -1, _last_written(d)), default=None)
    saved = [(found[1], False, found[0]) for found in local.values() if found is not None]
    durable = _readable(protocol.published_checkpoint, experiment_dir / "checkpoints" / trial_id)
    if durable is not None:
        saved.append((durable[1], True, durable[0]))
    checkpoint = max(saved, key=lambda entry: entry[:2])[2] if saved else None
    return TrialFiles(directory, checkpoint)


def _readable(find: Callable[[Path], tuple[Path, int] | None], directory: Path) -> tuple[Path, int] | None:
    """The newest checkpoint ``find`` finds there; None where it is damaged (its trial sets it aside when it
    resumes): a report lists every trial, not a traceback."""
    try:
        return find(directory)
    except protocol.DamagedCheckpoint:
        return None


def _last_written(directory: Path) -> float:
    """When a file directly in ``directory`` was last written (its runner may be replacing one meanwhile)."""
    times = [0.0]
    for path in directory.iterdir():
        try:
            times.append(path.stat().st_mtime)
        except FileNotFoundError:
            continue
    return max(times)
