"""The live view of `hermes run`: trials, GPUs, leaderboard, elapsed time and ETA, in the terminal.

The engine's thread takes a snapshot after each event (throttled); Rich's refresh thread draws
the latest snapshot, so the view keeps ticking while the engine waits for trials and never reads
the core while the core changes.

The view fits the terminal: the trials table gets the lines that the header and the leaderboard
leave (running trials first, then the best ended ones; pending trials are only counted), and in a
narrow terminal the GPU and state columns go before any number is cut.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState
from hermes.report import format_number

if TYPE_CHECKING:
    from hermes.search.budget import Budget

LEADERS = 5  # trials on the leaderboard
SNAPSHOT_INTERVAL = 0.2  # seconds between snapshots of the core

_STATE_STYLE = {
    TrialState.RUNNING: "bold green",
    TrialState.SUSPENDING: "yellow",
    TrialState.SUSPENDED: "yellow",
    TrialState.PENDING: "dim",
    TrialState.COMPLETED: "cyan",
    TrialState.STOPPED: "dim",
    TrialState.FAILED: "red",
}


@dataclass(frozen=True, slots=True)
class _Row:
    trial_id: str
    seq: int
    state: TrialState
    gpu: str
    step: int
    budget: int
    last: float | None
    best: float | None  # the value of its best report, as `hermes results` has it (nan where it reported only nan)
    score: float  # for ordering: higher is better


@dataclass(frozen=True, slots=True)
class Work:
    """What the ETA knows of one trial."""

    ended: bool
    step: int  # the last step reported (0: none yet)
    budget: int  # steps it trains unless stopped
    reported_gpu_seconds: float  # GPU seconds it had used at that report
    gpu_seconds: float  # GPU seconds it has used until now


@dataclass(frozen=True, slots=True)
class Eta:
    """An estimate of the time until the experiment ends; ``bound``: it is the time left of that budget,
    which ends the experiment then, sooner than the estimate (an upper bound)."""

    seconds: float
    bound: str | None = None

    def __str__(self) -> str:
        if self.bound is not None:
            return f"<= {_duration(self.seconds)} ({self.bound})"
        return f"~{_duration(self.seconds)}"


def estimate_eta(
    work: Sequence[Work],
    *,
    gpus: int,
    to_ask: int | None,
    time_left: float | None = None,
    gpu_seconds_left: float | None = None,
) -> Eta | None:
    """The time until the experiment ends, at the GPU seconds per step each trial has used so far.

    The trials not ended need their steps left (at their own pace; the mean pace for those that have
    not reported yet), none faster than on one GPU: the longest of them at least, and all of them
    shared over the GPUs. ``to_ask`` more trials (None: unknown) each cost the mean GPU seconds of a trial
    so far. A budget of GPU seconds ends it once spent, one of time (``time_left``) at the latest.
    None where there is nothing to estimate from: no pace yet, or no count of the trials to come,
    and no time budget.
    """
    bounded = None if time_left is None else Eta(max(0.0, time_left), "max_time")
    paced = [w for w in work if w.step > 0 and w.reported_gpu_seconds > 0]
    pace = sum(w.reported_gpu_seconds for w in paced) / sum(w.step for w in paced) if paced else None
    lefts: list[float | None] = []  # GPU seconds each trial not ended still needs
    costs: list[float] = []  # GPU seconds of each trial in all: used, and still needed
    for w in work:
        if w.ended:
            costs.append(w.gpu_seconds)
            continue
        own = w.reported_gpu_seconds / w.step if w.step > 0 and w.reported_gpu_seconds > 0 else pace
        if own is None:
            lefts.append(None)
            continue
        # into its next step since the report: time already spent on what is left
        left = max(0.0, (w.budget - w.step) * own - max(0.0, w.gpu_seconds - w.reported_gpu_seconds))
        lefts.append(left)
        costs.append(w.gpu_seconds + left)
    if gpus < 1 or any(left is None for left in lefts):
        return bounded
    known = [left for left in lefts if left is not None]
    total = sum(known)
    if to_ask is None:
        if gpu_seconds_left is None:
            return bounded
        total = max(0.0, gpu_seconds_left)  # more trials come until it is spent
    elif to_ask > 0:
        if not costs:
            return bounded
        total += to_ask * sum(costs) / len(costs)
    if gpu_seconds_left is not None:
        total = min(total, max(0.0, gpu_seconds_left))
    seconds = max(min(max(known, default=0.0), total), total / gpus)
    if bounded is not None and bounded.seconds <= seconds:
        return bounded
    return Eta(seconds)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    taken_at: float  # the executor clock
    rows: tuple[_Row, ...]
    counts: dict[str, int]
    gpus_busy: int
    gpus: int
    work: tuple[Work, ...]
    to_ask: int | None  # trials the searcher will still ask; None: unknown
    gpu_seconds: float  # used by all trials, at taken_at


class LiveView:
    """An engine listener that keeps a Rich live display of the experiment.

    ``budget``: the search's (``ExperimentSession.budget``), for the trials still to come and the time
    budget in the ETA; without it, the ETA waits until the searcher has asked its last trial. ``in_flight``:
    at most this many trials at once (the searcher's ``max_pending``), fewer than the GPUs perhaps."""

    def __init__(
        self,
        title: str,
        metric: str,
        mode: str,
        scheduler: Scheduler,
        clock: Callable[[], float],
        console: Console,
        *,
        budget: Budget | None = None,
        in_flight: int | None = None,
    ) -> None:
        self.title, self.metric, self.mode = title, metric, mode
        self.in_flight = in_flight
        self.scheduler = scheduler
        self.clock = clock
        self.console = console
        self.budget = budget
        self._snapshot: _Snapshot | None = None
        self._last_snapshot = 0.0
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._interrupted = False  # the run ended on an exception: its last frame must not show it running

    def __enter__(self) -> LiveView:
        self._take()
        self._live = Live(self, console=self.console, refresh_per_second=4, transient=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._interrupted = exc_info[0] is not None
        self._take()
        if self._live is not None:
            self._live.__exit__(*exc_info)

    def __call__(self, event: Event, decisions: list[Decision]) -> None:
        now = time.monotonic()
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL or self.scheduler.finished:
            self._last_snapshot = now
            self._take()

    def _take(self) -> None:
        rows, counts, work = [], {}, []
        used = 0.0
        now = self.clock()
        for trial in self.scheduler.trials.values():
            counts[trial.state.value] = counts.get(trial.state.value, 0) + 1
            scores = trial.scores
            best = max(range(len(scores)), key=scores.__getitem__) if scores else None  # the first best report
            rows.append(
                _Row(
                    trial.trial_id, trial.seq, trial.state, trial.gpu or "", trial.step, trial.budget,
                    trial.values[-1] if trial.values else None,
                    None if best is None else trial.values[best],
                    -float("inf") if best is None else scores[best],
                )
            )  # fmt: skip
            gpu_seconds = trial.gpu_time_at(now)
            used += gpu_seconds
            reported = trial.report_gpu_time[-1] if trial.report_gpu_time else 0.0
            step = trial.steps[-1] if trial.steps else 0
            work.append(Work(trial.state.is_terminal, step, trial.budget, reported, gpu_seconds))
        gpus = self.scheduler.cluster.gpu_count
        busy = sum(1 for row in rows if row.state.holds_gpu)
        if not self.scheduler.submissions_open:
            to_ask: int | None = 0
        elif self.budget is not None and self.budget.trials is not None:
            to_ask = max(0, self.budget.trials - len(rows))
        else:
            to_ask = None
        snapshot = _Snapshot(now, tuple(rows), counts, busy, gpus, tuple(work), to_ask, used)
        with self._lock:
            self._snapshot = snapshot

    # ------------------------------------------------------------------ drawing
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.render(console, options)

    def render(self, console: Console, options: ConsoleOptions) -> RenderableType:
        """The view, fitted to the console's height and width."""
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return Text("starting...")
        now = max(snapshot.taken_at, self.clock())
        eta = None if self._interrupted else self.eta(snapshot, now)
        header = Text.assemble(
            (f"{self.title}  ", "bold"),
            ("interrupted  ", "bold red") if self._interrupted else "",  # its trials stopped: none runs
            f"elapsed {_duration(now)}  ",
            f"ETA {eta}  " if eta is not None else "",
            f"GPUs {0 if self._interrupted else snapshot.gpus_busy}/{snapshot.gpus} busy  ",
            "  ".join(f"{state} {count}" for state, count in snapshot.counts.items()),
        )
        height = options.size.height
        listed = _order(snapshot.rows)
        pending = len(snapshot.rows) - len(listed)

        def lines(*parts: RenderableType) -> int:
            return len(console.render_lines(Group(*parts), options, pad=False))

        leaders = LEADERS
        board = self._leaderboard(console, options, snapshot, leaders)
        while leaders > 1 and lines(header, board) > height:  # a very short terminal: fewer leaders
            leaders -= 1
            board = self._leaderboard(console, options, snapshot, leaders)
        if lines(header, board) > height:  # not even one leader's table: its line
            board = self._best_line(snapshot)
        shown = min(len(listed), height)
        while True:
            table = self._trials_table(console, options, listed, shown, pending)
            if table is None:
                return Group(header, board)
            excess = lines(header, table, board) - height
            if excess <= 0:
                return Group(header, table, board)
            if shown == 0:  # not even that line fits: the header counts the trials
                return Group(header, board)
            shown = max(0, shown - excess)

    def eta(self, snapshot: _Snapshot, now: float) -> Eta | None:
        """The snapshot's estimate, less the time since it was taken; a time budget bounds it."""
        budget = self.budget
        time_left = None if budget is None or budget.seconds is None else budget.seconds - now
        gpu_left = None if budget is None or budget.gpu_seconds is None else budget.gpu_seconds - snapshot.gpu_seconds
        at_once = snapshot.gpus if self.in_flight is None else min(snapshot.gpus, self.in_flight)
        eta = estimate_eta(snapshot.work, gpus=at_once, to_ask=snapshot.to_ask, gpu_seconds_left=gpu_left)
        if eta is not None:
            eta = Eta(max(0.0, eta.seconds - (now - snapshot.taken_at)))
        if time_left is not None and (eta is None or eta.seconds >= time_left):
            return Eta(max(0.0, time_left), "max_time")
        return eta

    def _trials_table(
        self, console: Console, options: ConsoleOptions, listed: Sequence[_Row], shown: int, pending: int
    ) -> RenderableType | None:
        """The first ``shown`` of ``listed``, the rest and the pending trials counted; None where there is none."""
        if not listed and not pending:
            return None
        rows = listed[:shown]
        more = len(listed) - len(rows)
        notes = ([f"{more} more"] if more else []) + ([f"{pending} pending"] if pending else [])
        caption = "... and " + ", ".join(notes) if notes else None
        if not rows:  # no room for a table: a line that counts them
            counted = [f"{len(listed)} not listed"] * bool(listed) + [f"{pending} pending"] * bool(pending)
            return Text("trials: " + ", ".join(counted), style="dim")
        layouts = (
            ("state", "GPU", f"last {self.metric}", f"best {self.metric}"),
            ("state", f"last {self.metric}", f"best {self.metric}"),
            ("state", "last", "best"),
            ("last", "best"),
        )
        for columns in layouts:
            table = Table(title="trials" if columns[-1] == f"best {self.metric}" else f"trials ({self.metric})",
                          title_justify="left", caption=caption, caption_justify="left")
            _number_column(table, "trial", rows, lambda r: r.trial_id, justify="left")
            if "state" in columns:
                table.add_column("state", no_wrap=True)
            if "GPU" in columns:
                table.add_column("GPU")
            _number_column(table, "step", rows, lambda r: f"{r.step}/{r.budget}")
            _number_column(table, columns[-2], rows, lambda r: format_number(r.last))
            _number_column(table, columns[-1], rows, lambda r: format_number(r.best))
            for row in rows:
                style = "" if "state" in columns else _STATE_STYLE[row.state]  # else its colour tells its state
                cells: list[RenderableType] = [Text(row.trial_id, style=style)]
                if "state" in columns:
                    cells.append(Text(row.state.value, style=_STATE_STYLE[row.state]))
                if "GPU" in columns:
                    cells.append(row.gpu)
                cells += [f"{row.step}/{row.budget}", format_number(row.last), format_number(row.best)]
                table.add_row(*cells)
            if _fits(console, options, table):
                break
        return table

    def _best_line(self, snapshot: _Snapshot) -> Text:
        """The leader in one line, for a terminal too short for a table (its cells were all "...")."""
        ranked = sorted((r for r in snapshot.rows if r.best is not None), key=lambda r: (-r.score, r.seq))
        if not ranked:
            return Text(f"best {self.metric}: none yet", style="dim")
        return Text(f"best {self.metric}: {format_number(ranked[0].best)} (trial {ranked[0].trial_id})")

    def _leaderboard(self, console: Console, options: ConsoleOptions, snapshot: _Snapshot, leaders: int) -> Table:
        ranked = sorted((r for r in snapshot.rows if r.best is not None), key=lambda r: (-r.score, r.seq))[:leaders]
        for columns in (("best " + self.metric, "state"), ("best", "state"), ("best",)):
            table = Table(title=f"leaderboard (best {self.metric}, {self.mode})", title_justify="left")
            _number_column(table, "#", ranked, lambda r: str(ranked.index(r) + 1))
            _number_column(table, "trial", ranked, lambda r: r.trial_id, justify="left")
            _number_column(table, columns[0], ranked, lambda r: format_number(r.best))
            if "state" in columns:
                table.add_column("state", no_wrap=True)
            for place, row in enumerate(ranked, start=1):
                table.add_row(str(place), row.trial_id, format_number(row.best), *(
                    [Text(row.state.value, style=_STATE_STYLE[row.state])] if "state" in columns else []))
            if _fits(console, options, table):
                break
        return table


def _order(rows: Iterable[_Row]) -> list[_Row]:
    """The trials worth a line, most telling first: those running (the best first), then those suspended,
    then the ended ones, the best first. Pending trials have nothing to show but that they wait."""
    def rank(row: _Row) -> tuple[int, float, int]:
        group = 0 if row.state.holds_gpu else 2 if row.state.is_terminal else 1
        return group, -row.score, row.seq

    return sorted((row for row in rows if row.state is not TrialState.PENDING), key=rank)


def _number_column(
    table: Table, header: str, rows: Sequence[_Row], cell: Callable[[_Row], str], justify: str = "right"
) -> None:
    """A column that is never cut: as wide as its widest cell, on one line."""
    width = max((cell_len(cell(row)) for row in rows), default=1)
    table.add_column(header, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]


def _fits(console: Console, options: ConsoleOptions, table: Table) -> bool:
    """Whether the table fits the width without cutting a cell: a column on one line is as wide as its
    widest cell (header included), the others as their longest word; each has a space either side, and
    a border between and around them."""
    need = len(table.columns) + 1
    for column in table.columns:
        sizes = [Measurement.get(console, options, cell) for cell in (column.header, *column.cells)]
        need += 2 + max(size.maximum if column.no_wrap else size.minimum for size in sizes)
    return need <= options.max_width


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
