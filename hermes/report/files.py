"""Where a stored experiment's trials keep their files on this machine: what ``hermes results`` and
``hermes trace`` point at.

On one machine (and in a pool), a trial's files are ``<experiment dir>/trials/<trial>``. In a Ray run,
each node keeps the trials it ran under ``<experiment dir>/nodes/<node>/trials/<trial>`` (a trial that
moved has one on each node; only this machine's nodes are here), and their durable checkpoints go to
``storage.uri``, by default ``<experiment dir>/checkpoints/<trial>/``. The store keeps no ``storage.uri`` (the
checkpoints may move), so a Ray run notes its experiment's folder of it in ``<experiment dir>/checkpoints.uri``.
"""

from __future__ import annotations

import glob
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hermes.trial import protocol

LOCATION_FILE = "checkpoints.uri"  # in an experiment's folder: where its last (Ray) run kept durable checkpoints


@dataclass(frozen=True, slots=True)
class TrialFiles:
    directory: Path | None  # its logs, its config and its local checkpoints; None: not on this machine
    checkpoint: Path | str | None  # its newest committed checkpoint of its state; a URI on s3:// and such; None: none


def note_checkpoint_location(experiment_dir: Path, uri: str | None) -> None:
    """Note where the experiment's durable checkpoints go (``uri``: the folder of its trials' folders, as a Ray
    executor's ``storage_uri``) for ``checkpoint_location``; None: none (an earlier run's note goes)."""
    path = experiment_dir / LOCATION_FILE
    if uri is None:
        if path.exists():  # false too where the experiment's folder is not one: its trials say so
            path.unlink()
        return
    experiment_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{LOCATION_FILE}.tmp")
    temporary.write_text(f"{uri}\n")
    os.replace(temporary, path)  # a reader sees the old note or the new one


def checkpoint_location(experiment_dir: Path) -> str:
    """Where the experiment's durable checkpoints are: as its last run noted, else the default place."""
    try:
        noted = (experiment_dir / LOCATION_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):  # none (the default), or unreadable: a report lists trials all the same
        noted = ""
    return noted or str(experiment_dir / "checkpoints")


def trial_files(experiment_dir: Path, trial_id: str, checkpoints: str | None = None, saved_step: int = 0,
                recorded_step: int | None = None) -> TrialFiles:
    """The trial's directory (in a Ray run, that of the node where it last saved, or else wrote, anything) and
    its newest checkpoint, local or durable (a durable one on a tie: any node resumes from it), of its state: one
    that holds only ``hermes.json`` (the metrics a trial with no saver keeps, to report a step again) is none.

    ``checkpoints``: where the experiment's durable checkpoints are (default: ``checkpoint_location``). On storage
    read through a client (s3://, gs://), the durable one is the trial's folder there (whose ``latest`` names the
    checkpoint), where the store says the trial saved one (``saved_step``: its step). ``recorded_step``: the last
    step the store holds of the trial (None: any); a checkpoint past it was committed as its run ended, before the
    store recorded its report, so it is of a step the results do not list (the trial reports it again from there
    when the experiment goes on)."""
    pattern = f"{glob.escape(str(experiment_dir))}/nodes/*/trials/{glob.escape(trial_id)}"
    directories = [path for path in (experiment_dir / "trials" / trial_id, *map(Path, glob.glob(pattern)))
                   if path.is_dir()]
    local = {directory: _readable(protocol.latest_checkpoint, directory) for directory in directories}
    directory = max(directories, key=lambda d: (local[d][1] if local[d] else -1, _last_written(d)), default=None)
    saved: list[tuple[int, bool, Path | str]] = [(found[1], False, found[0]) for found in local.values()
                                                 if found and _of_state(*found, recorded_step)]
    location = checkpoints if checkpoints is not None else checkpoint_location(experiment_dir)
    folder = _folder(location)
    if folder is not None:
        durable = _readable(protocol.published_checkpoint, folder / trial_id)
        if durable is not None and _of_state(*durable, recorded_step):
            saved.append((durable[1], True, durable[0]))
    elif saved_step:
        saved.append((saved_step, True, f"{location.rstrip('/')}/{trial_id}"))
    checkpoint = max(saved, key=lambda entry: entry[:2])[2] if saved else None
    return TrialFiles(directory, checkpoint)


def _folder(location: str) -> Path | None:
    """The folder that a path or a ``file://`` URI names, as ``hermes.ray.storage`` reads it; None for other storage."""
    if location.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(location).path))
    return None if "://" in location else Path(location)


def _readable(find: Callable[[Path], tuple[Path, int] | None], directory: Path) -> tuple[Path, int] | None:
    """The newest checkpoint ``find`` finds there; None where it is damaged (its trial sets it aside when it
    resumes): a report lists every trial, not a traceback."""
    try:
        return find(directory)
    except protocol.DamagedCheckpoint:
        return None


def _of_state(checkpoint: Path, step: int, recorded_step: int | None) -> bool:
    """Whether a checkpoint holds a saver's part (a Checkpoint's or Files'), of a step the store holds."""
    if recorded_step is not None and step > recorded_step:
        return False
    try:
        return any(entry.name != protocol.META_FILE for entry in checkpoint.iterdir())
    except FileNotFoundError:  # replaced by a newer one while its trial runs: the next report finds that
        return False


def _last_written(directory: Path) -> float:
    """When a file directly in ``directory`` was last written (its runner may be replacing one meanwhile)."""
    times = [0.0]
    for path in directory.iterdir():
        try:
            times.append(path.stat().st_mtime)
        except FileNotFoundError:
            continue
    return max(times)
