"""Learning-curve traces: the recorded epochs that the simulator replays instead of training.

A trace is a CSV file with the header ``trial,epoch,metric,seconds`` and optional
``param_<name>`` columns, an optional ``state_mb`` column (the size of the trial's state, which
sets what a switch costs in the simulator; its first row counts) and an optional ``movable`` column
(1, the default, or 0 for an unmodified program, which a run suspends in place with SIGSTOP: it never
migrates and a switch moves no state; its first row counts), one row per trial per epoch. The rows of a trial are
contiguous and number its epochs 1, 2, ... in order. ``seconds`` is the time the
epoch took on one GPU, at most a year. An empty ``metric`` means the trial diverged in that epoch
and produced no value, so it must be the trial's last row. Any other column is refused (a misspelt one).

The loader is strict because a silently misread trace would make every scheduler
comparison built on it wrong; each error names the file and the line to fix.
"""

from __future__ import annotations

import csv
import difflib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import TextIO

import numpy as np

from hermes.errors import TraceError

REQUIRED_COLUMNS = ("trial", "epoch", "metric", "seconds")
STATE_COLUMN = "state_mb"
MOVABLE_COLUMN = "movable"
PARAM_PREFIX = "param_"
MODES = ("max", "min")
# A year: far beyond any real epoch, yet low enough that no sum of a trace's epochs overflows to
# infinity (1e308 passes a finiteness check, and the simulated clock and its figures become inf and NaN).
MAX_EPOCH_SECONDS = 365 * 24 * 3600


@dataclass(frozen=True, slots=True)
class TraceTrial:
    """One recorded training run, replayed epoch by epoch by the simulator."""

    name: str
    metrics: tuple[float, ...]
    """Metric after each epoch 1..n; a diverged trial's failed epoch has no entry."""
    seconds: tuple[float, ...]
    """Seconds each epoch took on one GPU, including a diverged trial's failed epoch."""
    diverged: bool
    """True if the last epoch failed, so a scheduler pays for it and gets no value."""
    params: Mapping[str, float | str] = field(hash=False)
    """Hyper-parameters from the ``param_<name>`` columns, floats where they parse."""
    state_mb: float | None = None
    """MB of state a switch moves (model, optimizer, data position); None: the cost model's default."""
    movable: bool = True
    """False for an unmodified program: suspended in place (SIGSTOP), it never migrates and a switch moves no state,
    and a run that lost its process starts again from its beginning (TrialSubmitted.movable)."""

    @property
    def epochs(self) -> int:
        """Epochs the trial can run, counting a failed one, since each costs GPU time."""
        return len(self.seconds)


@dataclass(frozen=True, slots=True)
class Trace:
    """All trials of one benchmark, and whether a larger or a smaller metric is better."""

    path: str
    mode: str
    trials: tuple[TraceTrial, ...]

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TraceError(f"{self.path}: mode must be 'max' or 'min', got {self.mode!r}")

    def best_final(self) -> TraceTrial:
        """The trial with the best last metric, the oracle's pick that regret is measured against.

        Diverged trials never count; a tie goes to the trial first in the file (``best_finals`` has them all).
        """
        return self.best_finals()[0]

    def best_finals(self) -> tuple[TraceTrial, ...]:
        """Every trial whose last metric is the best, in file order: the best is reached when any of them is."""
        finished = [t for t in self.trials if not t.diverged]
        if not finished:
            raise TraceError(f"{self.path}: every trial diverged, so none has a final metric")
        best = (max if self.mode == "max" else min)(t.metrics[-1] for t in finished)
        return tuple(t for t in finished if t.metrics[-1] == best)

    def shuffled(self, seed: int) -> tuple[TraceTrial, ...]:
        """The trials in a seeded random arrival order, so runs differ only by the seed."""
        order = np.random.default_rng(seed).permutation(len(self.trials))
        return tuple(self.trials[i] for i in order)


def write_trace(trace: Trace, out: str | os.PathLike[str] | TextIO) -> None:
    """Write ``trace`` in the format ``load_trace`` reads, to a path or an open text file (stdout, say)."""
    if not isinstance(out, (str, os.PathLike)):
        _write_rows(trace, out)
        return
    with open(out, "w", newline="", encoding="utf-8") as file:
        _write_rows(trace, file)


def _write_rows(trace: Trace, file: TextIO) -> None:
    names = list(dict.fromkeys(name for trial in trace.trials for name in trial.params))
    sized = any(trial.state_mb is not None for trial in trace.trials)
    pinned = not all(trial.movable for trial in trace.trials)  # the column only where it says something
    writer = csv.writer(file, lineterminator="\n")
    writer.writerow([*REQUIRED_COLUMNS, *(PARAM_PREFIX + name for name in names), *[STATE_COLUMN] * sized,
                     *[MOVABLE_COLUMN] * pinned])
    for trial in trace.trials:
        params = [trial.params.get(name, "") for name in names]
        state = ["" if trial.state_mb is None else trial.state_mb] * sized
        movable = [int(trial.movable)] * pinned
        for epoch, seconds in enumerate(trial.seconds, 1):
            metric = trial.metrics[epoch - 1] if epoch <= len(trial.metrics) else ""
            writer.writerow([trial.name, epoch, metric, seconds, *params, *state, *movable])


def load_trace(path: str | os.PathLike[str], mode: str, *, state_mb: float | None = None) -> Trace:
    """Read and validate a trace file; ``mode`` is "max" or "min" (the file does not say).

    ``state_mb`` is the state size of the trials that the file gives none (no ``state_mb`` column)."""
    if state_mb is not None and not (math.isfinite(state_mb) and state_mb >= 0):
        raise TraceError(f"{os.fspath(path)}: state_mb must be finite and >= 0, got {state_mb!r}")
    path = os.fspath(path)
    try:
        file = open(path, newline="", encoding="utf-8-sig")
    except OSError as error:
        raise TraceError(f"{path}: cannot open: {error.strerror}") from error
    with file:
        reader = csv.reader(file)
        try:
            trials = _read_trials(path, reader, state_mb)
        except csv.Error as error:
            raise TraceError(f"{path}:{reader.line_num}: {error}") from error
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text (a trace is a CSV file)") from None
    return Trace(path, mode, trials)


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where each field sits in a row of one particular file."""

    width: int
    trial: int
    epoch: int
    metric: int
    seconds: int
    params: tuple[tuple[int, str], ...]
    state_mb: int | None
    movable: int | None


def _read_trials(path: str, reader: Iterator[list[str]], state_mb: float | None) -> tuple[TraceTrial, ...]:
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{path}:1: empty file, expected the header {','.join(REQUIRED_COLUMNS)}")
    header = [name.strip() for name in header]
    twice = next((name for i, name in enumerate(header) if name and name in header[:i]), None)
    if twice is not None:
        raise TraceError(f"{path}:1: column {twice!r} appears twice")
    for name in REQUIRED_COLUMNS:
        if name not in header:
            raise TraceError(f"{path}:1: missing column {name!r}")
    _refuse_unknown_columns(path, header)
    columns = _Columns(
        len(header),
        *(header.index(name) for name in REQUIRED_COLUMNS),
        params=tuple(
            (i, name.removeprefix(PARAM_PREFIX))
            for i, name in enumerate(header)
            if name.startswith(PARAM_PREFIX)
        ),
        state_mb=header.index(STATE_COLUMN) if STATE_COLUMN in header else None,
        movable=header.index(MOVABLE_COLUMN) if MOVABLE_COLUMN in header else None,
    )
    rows = _numbered_rows(path, reader, columns.width)
    ended: dict[str, int] = {}
    trials = tuple(
        _read_trial(path, name, group, columns, ended, state_mb)
        for name, group in groupby(rows, key=lambda numbered: numbered[1][columns.trial])
    )
    if not trials:
        raise TraceError(f"{path}:1: the header is not followed by any rows")
    return trials


def _refuse_unknown_columns(path: str, header: list[str]) -> None:
    """A column the loader does not know is refused, not skipped: a misspelt ``moveable`` or ``state_MB`` would
    leave every trial movable or at the default size, and change every figure without a word. A blank name (the
    trailing comma a spreadsheet adds) names nothing and is skipped."""
    known = (*REQUIRED_COLUMNS, STATE_COLUMN, MOVABLE_COLUMN)
    for name in header:
        if name and name not in known and not name.startswith(PARAM_PREFIX):
            lower = name.lower()  # state_MB, Param_lr: only the case is wrong
            candidates = [*known, lower] if lower.startswith(PARAM_PREFIX) else known
            near = difflib.get_close_matches(lower, candidates, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TraceError(
                f"{path}:1: unknown column {name!r}{hint}; a trace has the columns {', '.join(REQUIRED_COLUMNS)}, "
                f"{PARAM_PREFIX}<name>, {STATE_COLUMN} and {MOVABLE_COLUMN}"
            )


def _numbered_rows(path: str, reader: Iterator[list[str]], width: int) -> Iterator[tuple[int, list[str]]]:
    """Rows with their line numbers, skipping blank lines and rejecting ragged rows."""
    for row in reader:
        if not row:
            continue
        if len(row) != width:
            raise TraceError(f"{path}:{reader.line_num}: expected {width} fields as in the header, got {len(row)}")
        yield reader.line_num, row


def _read_trial(
    path: str,
    name: str,
    rows: Iterable[tuple[int, list[str]]],
    columns: _Columns,
    ended: dict[str, int],
    state_mb: float | None,
) -> TraceTrial:
    """Build one trial from its contiguous rows; ``ended`` maps earlier trials to their last line."""
    metrics: list[float] = []
    seconds: list[float] = []
    params: dict[str, float | str] = {}
    diverged = False
    movable = True
    for line, row in rows:
        where = f"{path}:{line}"
        if name in ended:
            raise TraceError(f"{where}: trial {name} continues after other trials (it ended at line {ended[name]})")
        if diverged:
            raise TraceError(f"{where}: trial {name} has a row after it diverged in epoch {len(seconds)}")
        epoch = _number(where, "epoch", row[columns.epoch], int)
        if epoch != len(seconds) + 1:
            after = f"follows epoch {len(seconds)}" if seconds else "is its first row"
            raise TraceError(f"{where}: epoch {epoch} of trial {name} {after} (epochs must be 1, 2, ... in order)")
        epoch_seconds = _number(where, "seconds", row[columns.seconds], float)
        if not (math.isfinite(epoch_seconds) and epoch_seconds >= 0):
            raise TraceError(f"{where}: seconds must be finite and >= 0, got {row[columns.seconds]!r}")
        if epoch_seconds > MAX_EPOCH_SECONDS:
            raise TraceError(
                f"{where}: seconds must be at most {MAX_EPOCH_SECONDS} (a year) per epoch, got {row[columns.seconds]!r}"
            )
        seconds.append(epoch_seconds)
        if row[columns.metric].strip():
            metric = _number(where, "metric", row[columns.metric], float)
            if not math.isfinite(metric):
                raise TraceError(f"{where}: metric must be finite, got {row[columns.metric]!r}")
            metrics.append(metric)
        else:
            diverged = True
        if epoch == 1:
            params = {key: _param(row[i]) for i, key in columns.params}
            if columns.state_mb is not None and row[columns.state_mb].strip():
                state_mb = _number(where, STATE_COLUMN, row[columns.state_mb], float)
                if not (math.isfinite(state_mb) and state_mb >= 0):
                    raise TraceError(f"{where}: state_mb must be finite and >= 0, got {row[columns.state_mb]!r}")
            if columns.movable is not None and row[columns.movable].strip():
                if row[columns.movable].strip() not in ("0", "1"):
                    raise TraceError(f"{where}: movable must be 1 or 0, got {row[columns.movable]!r}")
                movable = row[columns.movable].strip() == "1"
    ended[name] = line
    return TraceTrial(name, tuple(metrics), tuple(seconds), diverged, params, state_mb, movable)


def _number(where: str, column: str, text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise TraceError(f"{where}: {column} must be {expected}, got {text!r}") from None


def _param(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text
