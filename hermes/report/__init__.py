"""Read-only views of a stored experiment: ``hermes status``, ``hermes results`` and ``hermes plot``.

Nothing here writes to the store, so a report may run while the experiment's runner is writing.
Times are the experiment's clock (seconds since it started), as stamped on its events.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.cells import cell_len

from hermes.core.scheduler import Objective
from hermes.core.states import TrialState
from hermes.errors import HermesError, SpecError
from hermes.store import (
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    Run,
    SqlStore,
    TrialRecord,
)
from hermes.store.lock import LOCK_FILE, clock_now, holder

STORE_FILE = "hermes.db"  # in the storage dir (``storage.dir`` of the spec); one file holds every experiment
POOL_LOCK = Path("pool", LOCK_FILE)  # a pool's lock (``hermes.pool``), in its folder beside its store: a server's root
NAMES_SHOWN = 10  # names a "no experiment" error lists, the newest: a server may hold thousands


@dataclass(frozen=True, slots=True)
class Target:
    """The metric an experiment optimises, as its stored spec names it."""

    name: str
    objective: Objective

    @classmethod
    def of(cls, experiment: ExperimentRecord) -> Target:
        metric = experiment.spec.get("metric")
        if not isinstance(metric, Mapping) or not metric.get("name") or metric.get("mode") not in ("max", "min"):
            raise HermesError(f"experiment {experiment.name!r}: its stored spec has no metric.name and metric.mode")
        return cls(str(metric["name"]), Objective(str(metric["mode"])))

    def value(self, values: Mapping[str, float]) -> float | None:
        """The objective among one report's metrics.

        By name; else the report's only metric (a trial that reports one metric under another name), or
        ``value``, the group a spec's ``metrics_regex`` captures it in.
        """
        if self.name in values:
            return values[self.name]
        if len(values) == 1:
            return next(iter(values.values()))
        return values.get("value")


@dataclass(frozen=True, slots=True)
class ExperimentView:
    """What every report reads: the experiment, its trials, its objective's reports and its GPU timeline."""

    experiment: ExperimentRecord
    target: Target
    trials: list[TrialRecord]
    metrics: list[MetricRecord]  # in report order
    runs: list[Run]
    clock: float | None = None  # the experiment's time now, while its runner runs it; None: not known

    @classmethod
    def load(cls, store: ExperimentStore, experiment: ExperimentRecord, lock: Path | None = None) -> ExperimentView:
        """Read it all now; the view does not change when the runner writes more. ``lock``: the storage dir's
        runner lock, whose holder notes the experiment's clock (``hermes.store.lock.clock_now``)."""
        experiment_id = experiment.experiment_id
        who = _runner_of(experiment, lock) if experiment.owner is None else None
        return cls(
            experiment,
            Target.of(experiment),
            store.trials(experiment_id),
            store.metrics(experiment_id),
            store.runs(experiment_id),
            clock_now(who) if who else None,
        )

    @property
    def now(self) -> float:
        """The experiment's time now while it runs; else the latest time recorded in reports and runs. A run
        still going counts up to here."""
        times = [record.at for record in self.metrics]
        for run in self.runs:
            times += [time for time in (run.started_at, run.yield_requested_at, run.ended_at) if time is not None]
        if self.clock is not None:
            times.append(self.clock)
        return max(times, default=0.0)


def is_live(experiment: ExperimentRecord, lock: Path | None) -> bool:
    """Whether a runner runs it now: it says running, and the storage dir's runner holds its ``lock`` (when
    known). One with an owner is a pool's, whose lock is beside it (``POOL_LOCK``), where the storage dir is a
    server's root: after ``kill -9`` of the server, its experiments said running on busy GPUs for ever. A pool
    whose folder is elsewhere (``python -m hermes.pool --dir``) cannot be asked: its experiments count as running."""
    if experiment.status is not ExperimentStatus.RUNNING:
        return False
    if lock is None:
        return True
    if experiment.owner is not None:
        pool = lock.parent / POOL_LOCK
        return not pool.exists() or holder(pool) is not None
    return _runner_of(experiment, lock) is not None


def _runner_of(experiment: ExperimentRecord, lock: Path | None) -> dict[str, Any] | None:
    """What the runner of a running experiment wrote in the storage dir's ``lock`` (who, since when, its clock);
    None when no runner of it holds the lock."""
    if experiment.status is not ExperimentStatus.RUNNING or lock is None:
        return None
    who = holder(lock)
    return who if who is not None and who.get("experiment") in (experiment.name, None) else None


INTERRUPTED = "interrupted"  # what the reports call a trial the log left on a GPU when no runner runs it
LEFT_ON_A_GPU = (TrialState.RUNNING, TrialState.SUSPENDING)


def shown_state(state: TrialState, live: bool) -> str:
    """A trial's state as ``hermes status`` and ``hermes results`` show it: where no runner runs the experiment
    (``is_live``), one the log left on a GPU is interrupted (it goes on from its checkpoint when it continues)."""
    return INTERRUPTED if not live and state in LEFT_ON_A_GPU else state.value


def open_store(directory: str | Path) -> SqlStore:
    """The store in a storage dir, read-only: a report never writes, not even the schema into an
    empty file. A HermesError names the path when there is none, and the storage dir where a file was given."""
    given = Path(directory)
    if given.is_file():
        raise HermesError(_not_a_storage_dir(given))
    path = given / STORE_FILE
    if not path.is_file():
        where = "does not exist" if not given.exists() else f"holds no {STORE_FILE}"
        raise HermesError(
            f"no Hermes store at {path}: {directory} {where}; pass the storage dir of a run (storage.dir in its spec)"
        )
    return SqlStore.open_read_only(path)


def _not_a_storage_dir(path: Path) -> str:
    """What to give instead of a file: the runner lock, the checkpoints and the plots are found from the storage
    dir, so a report takes that, not the store's file nor the spec that names it."""
    if path.name == STORE_FILE:
        return f"{path} is the store's file: give its folder, the storage dir {path.parent}"
    told = f"{path} is a file: give the storage dir of a run (storage.dir in its spec), which holds {STORE_FILE}"
    if path.suffix not in (".yaml", ".yml"):
        return told
    from pydantic import ValidationError  # and YAML: paid only when a spec is given

    from hermes.experiment.spec import StorageSpec, read_spec

    try:  # only its storage section: a spec whose trial or policy cannot load here still names its storage dir
        storage = StorageSpec.model_validate(read_spec(path).get("storage", {})).dir
    except (SpecError, ValidationError):
        return told
    return f"{path} is a spec: give its storage dir, {os.path.normpath(path.parent / Path(storage).expanduser())}"


def pick_experiment(store: ExperimentStore, name: str | None) -> ExperimentRecord:
    """The experiment called ``name`` (see ``named``), or the newest one when no name is given."""
    experiments = store.experiments()
    if not experiments:
        raise HermesError(f"{store_location(store)} holds no experiment yet")
    if name is None:
        return experiments[-1]
    return named(experiments, name, store_location(store))


def named(experiments: Sequence[ExperimentRecord], name: str, where: str) -> ExperimentRecord:
    """The one of ``experiments`` (those of ``where``) called ``name``, or ``owner/name``: a pool's
    names are per owner, so an admin may see several of one name."""
    found = [experiment for experiment in experiments if name in (experiment.name, experiment.full_name)]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(experiment.full_name for experiment in found)
        raise HermesError(f"{len(found)} experiments in {where} are called {name!r}: {names}; name one as OWNER/NAME")
    newest = [experiment.full_name for experiment in experiments[-NAMES_SHOWN:]]
    names = ", ".join(newest) if len(experiments) <= NAMES_SHOWN else (
        f"{len(experiments)} experiments, the newest {', '.join(newest)} (`hermes list` names them all)")
    raise HermesError(f"no experiment {name!r} in {where}; it holds {names or 'none'}")


def store_location(store: ExperimentStore) -> str:
    return getattr(store, "url", type(store).__name__)


def format_number(value: float | None) -> str:
    """Four significant digits, enough to rank trials and short enough for a table."""
    if value is None:
        return "-"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def param_text(value: object) -> str:
    """A hyper-parameter as CSV writes it: as JSON does (true, [64, 32]), but text as it is, unless it would read as
    JSON: text "1" or "true" is written quoted, as JSON text, apart from the choice's 1 or true beside it (a reader
    takes a cell as JSON where it parses, else as text)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value)


def format_param(value: object) -> str:
    """A hyper-parameter for people: a float to four significant digits (``format_number``), else as CSV writes it
    (``param_text``), so that text "1" shows apart from 1, and "true" from true."""
    return format_number(value) if isinstance(value, float) else param_text(value)


TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'\s*File "(?P<file>.+)", line (?P<line>\d+), in ')  # of a traceback (not of faulthandler's)
# faulthandler's dump of a fatal error (a segfault): the thread that crashed, innermost frame first
CRASHED_THREAD = re.compile(r"(Current thread 0x[0-9a-f]+|Stack) \(most recent call first\):")
DUMPED_FRAME = re.compile(r'\s*File "(?P<file>.+)", line (?P<line>\d+) in ')
FATAL_ERROR = "Fatal Python error:"  # what faulthandler writes before a crash's dump, not before one a program asked
CRASHES = re.compile(r"\(its runs crashed (\d+) times; trial\.max_failures is \d+\)")  # the core's note
HERMES_PACKAGE = Path(__file__).resolve().parent.parent  # its frames in a trial's traceback are not the user's
PYTHON_LIBRARY = Path(os.path.realpath(sysconfig.get_path("stdlib")))
INSTALLED = {Path(os.path.realpath(sysconfig.get_path(kind))) for kind in ("purelib", "platlib")}  # may be in it


def every_trial_failed(trials: Sequence[TrialRecord]) -> str | None:
    """A spec or a script that cannot work: every trial failed. What to fix, from its first trial; None when not so."""
    if not trials or any(trial.state is not TrialState.FAILED for trial in trials):
        return None
    first = trials[0]
    return f"every trial failed; trial {first.trial_id}: {summarise_error(first.error or '', width=400)}"


def summarise_error(error: str, width: int = 160) -> str:
    """A trial's error on one line: its reason and the exception of its traceback with where it was raised, or its
    reason and where the thread that crashed was (a segfault's faulthandler dump), or else the last line of what it
    said (a program that logs to stderr, or a trial told it retrains, says much before it), unless the first line
    already says it; a traceback's header says nothing, so it is left out, and the core's note of repeated crashes
    becomes a short count."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    crashes = CRASHES.fullmatch(lines[-1]) if lines else None
    if crashes is not None:
        lines.pop()
    if not lines:
        return ""
    first, last = lines[0].removesuffix(TRACEBACK).rstrip(": "), lines[-1]
    reason = first.partition(": ")[0]
    raised, crashed_at = _raised(error.splitlines()), _crashed_at(error.splitlines())
    if crashed_at is not None:
        text = f"{reason}, at {crashed_at}"
    elif raised is not None:
        exception, where = raised
        kind, _, said = exception.partition(": ")
        if reason.endswith(kind.rpartition(".")[2]):  # "uncaught ValueError": a warm worker's words for it
            text = f"{reason}: {said}" if said else reason
        else:
            text = f"{reason} ... {exception}" if reason else exception
        text += f", at {where}"
    elif len(lines) == 1 or (last.partition(": ")[2] or last) in first:
        text = first
    else:  # "exit code 1: <its first line of stderr>": the reason, then its last line
        text = f"{reason} ... {last}" if reason else last
    if crashes is not None:
        text += f" (crashed {crashes[1]} times)"
    return text if len(text) <= width else text[: width - 3] + "..."


def _raised(lines: Sequence[str]) -> tuple[str, str] | None:
    """The exception of the last Python traceback in ``lines`` and where it was raised, ``<file name>:<line>`` of its
    innermost frame outside Hermes's own package (the user's ``trial.report`` call, not the line of Hermes that
    refused it), or of its innermost where every frame is Hermes's; None where there is none."""
    start = max((index for index, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK)), default=0)
    frames = [(index, frame) for index, line in enumerate(lines[start:], start) if (frame := FRAME.match(line))]
    if not frames:
        return None
    index, innermost = frames[-1]
    exception = next((line for line in lines[index + 1:] if line.strip() and not line[0].isspace()), None)
    if exception is None:
        return None
    frame = next((frame for _, frame in reversed(frames) if not _of_hermes(frame["file"])), innermost)
    return exception.strip(), f"{Path(frame['file']).name}:{frame['line']}"


def _crashed_at(lines: Sequence[str]) -> str | None:
    """Where the thread that crashed was, in the last faulthandler dump in ``lines`` (a warm worker's segfault dumps
    every thread, its main one last; the crash is in the trial's): ``<file name>:<line>`` of its innermost frame
    that is neither Hermes's nor Python's own library's (a segfault in ``ctypes.string_at`` is its caller's doing),
    or of its innermost. None where there is no crash's dump (after a ``Fatal Python error:`` line) after the last
    Python traceback, which then says more (a dump of a child process's, say, that the trial went on after), and
    none for a dump that was no crash (``faulthandler.dump_traceback()``, a trial's own ``faulthandler.register``)."""
    after = max((index for index, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK)), default=-1)
    fatal = max((index for index, line in enumerate(lines[after + 1:], after + 1)
                 if FATAL_ERROR in line), default=None)
    if fatal is None:
        return None
    start = next((index for index, line in enumerate(lines[fatal + 1:], fatal + 1)
                  if CRASHED_THREAD.fullmatch(line.strip())), None)
    if start is None:
        return None
    frames: list[re.Match[str]] = []
    for line in lines[start + 1:]:
        if (frame := DUMPED_FRAME.match(line)) is None:
            break
        frames.append(frame)
    if not frames:
        return None
    frame = next((frame for frame in frames if not _of_hermes(frame["file"]) and not _of_python(frame["file"])),
                 frames[0])
    return f"{Path(frame['file']).name}:{frame['line']}"


@functools.lru_cache(maxsize=256)
def _of_python(file: str) -> bool:
    """Whether a dumped frame's file is of Python's standard library (or frozen in it: ``<frozen runpy>``), as this
    process has it, not of a package installed there."""
    if file.startswith("<"):
        return True
    path = Path(os.path.realpath(file))
    return path.is_relative_to(PYTHON_LIBRARY) and not any(path.is_relative_to(folder) for folder in INSTALLED)


@functools.lru_cache(maxsize=256)
def _of_hermes(file: str) -> bool:
    """Whether a traceback's file is one of Hermes's own modules (as this process has them); the trials of a report
    share their files, each resolved once."""
    return Path(os.path.realpath(file)).is_relative_to(HERMES_PACKAGE)


def format_duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` with its control characters escaped as Python writes them (a newline as ``\\n``, ESC as
    ``\\x1b``), for people: a parameter's newline broke a table's row and a status line in two. CSV and JSON
    carry the text as it is."""
    return CONTROL_CHARACTERS.sub(lambda found: repr(found.group())[1:-1], text)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell, in terminal cells (a CJK character takes two, a combining accent
    none), with control characters escaped (``printable``); the columns numbered in ``right`` (numbers) aligned
    right."""
    header = [printable(cell) for cell in header]
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(cell_len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = []
        for index, (cell, width) in enumerate(zip(cells, widths)):
            padding = " " * (width - cell_len(cell))
            padded.append(padding + cell if index in right else cell + padding)
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), "  ".join("-" * width for width in widths), *(line(row) for row in rows)])


__all__ = [
    "STORE_FILE",
    "ExperimentView",
    "Target",
    "format_duration",
    "format_number",
    "format_param",
    "format_table",
    "is_live",
    "open_store",
    "param_text",
    "pick_experiment",
    "printable",
    "shown_state",
    "store_location",
    "summarise_error",
]
