"""The live view of `hermes run`: trials, GPUs, leaderboard, elapsed time and ETA, in the terminal.

The engine's thread takes a snapshot after each event (throttled); Rich's refresh thread draws
the latest snapshot, so the view keeps ticking while the engine waits for trials and never reads
the core while the core changes.

Both run in the engine's process, under one GIL: whatever they cost, the run waits for. So neither a
snapshot nor a frame walks every trial. The view keeps what it shows as events come: a snapshot looks
again at the trials that the events since the last one named (their own, and their decisions') and at
those holding a GPU (a lost node takes theirs without naming them). Only trials holding a GPU change
while they stay as they are (their GPU time grows), and there are as many as GPUs: the suspended and the
ended trials are kept ranked as they come and go, the ETA's sums of them and of the pending trials too.
A frame draws the few rows it has room for, each part once.

The view fits the terminal: the trials table gets the lines that the header and the leaderboard
leave (running trials first, then the best ended ones; pending trials are only counted), and in a
narrow terminal the GPU and state columns go before any number is cut.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from hermes.core.decisions import Decision
from hermes.core.events import Event, SubmissionsReopened, TrialSubmitted
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.report import format_number, shown_state
from hermes.report.results import can_be_best

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
    best: float | None  # the value of its best report, as `hermes results` has it (None where all are NaN or inf)
    score: float  # for ordering: higher is better


def _ranked(row: _Row) -> tuple[float, int]:
    """The order of the rows of a kind of trials, and of the leaderboard: the best first, the earlier of equals."""
    return -row.score, row.seq


class _Ranking:
    """Rows in ``_ranked`` order, as trials come and go. A snapshot holds the list itself, which is copied before
    it next changes: no frame sees it change."""

    def __init__(self) -> None:
        self._rows: list[_Row] = []
        self._shared = False

    def add(self, row: _Row) -> None:
        self._own()
        insort(self._rows, row, key=_ranked)

    def remove(self, row: _Row) -> None:
        self._own()
        del self._rows[bisect_left(self._rows, _ranked(row), key=_ranked)]

    def share(self) -> Sequence[_Row]:
        self._shared = True
        return self._rows

    def _own(self) -> None:
        if self._shared:
            self._rows = list(self._rows)
            self._shared = False


@dataclass(frozen=True, slots=True)
class Work:
    """What the ETA knows of one trial."""

    ended: bool
    step: int  # the last step reported (0: none yet)
    budget: int  # steps it trains unless stopped
    reported_gpu_seconds: float  # GPU seconds it had used at that report
    gpu_seconds: float  # GPU seconds it has used until now

    @property
    def paced(self) -> bool:
        """Whether it has a pace of its own: GPU seconds per step at its last report."""
        return self.step > 0 and self.reported_gpu_seconds > 0

    def left(self, pace: float | None) -> float | None:
        """The GPU seconds it still needs, not ended: its steps left at its own pace (else at ``pace``), less the time
        it has spent since its report, into its next step; None without a pace."""
        own = self.reported_gpu_seconds / self.step if self.paced else pace
        if own is None:
            return None
        return max(0.0, (self.budget - self.step) * own - max(0.0, self.gpu_seconds - self.reported_gpu_seconds))


@dataclass(slots=True)
class _Sums:
    """Sums over trials whose part of the ETA depends on no other trial: the ended ones (what they used, at what
    pace), and those not ended that have a pace of their own (and what they still need at it)."""

    trials: int = 0
    paced_steps: int = 0
    paced_gpu_seconds: float = 0.0
    used: float = 0.0  # GPU seconds
    left: float = 0.0  # GPU seconds still needed

    def add(self, work: Work, left: float, sign: int = 1) -> None:
        self.trials += sign
        if work.paced:
            self.paced_steps += sign * work.step
            self.paced_gpu_seconds += sign * work.reported_gpu_seconds
        self.used += sign * work.gpu_seconds
        self.left += sign * left
        if not self.trials:  # what rounding left of the sums of the trials gone
            self.paced_gpu_seconds = self.used = self.left = 0.0


@dataclass(frozen=True, slots=True)
class _Load:
    """What the ETA knows of all the trials: ``summed``, and the most that one of those still needs; the trials that
    have neither reported nor used a GPU (``fresh``), which go at the mean pace, by their budgets alone; the others
    one by one (those holding a GPU, whose GPU time grows, and those without a pace of their own)."""

    summed: _Sums
    longest: float
    fresh: int
    fresh_steps: int  # their budgets, summed
    longest_fresh: int
    others: tuple[Work, ...]


def _load_of(work: Iterable[Work]) -> _Load:
    summed, longest, fresh, fresh_steps, longest_fresh, others = _Sums(), 0.0, 0, 0, 0, []
    for w in work:
        if w.ended:
            summed.add(w, 0.0)
        elif (left := w.left(None)) is not None:
            summed.add(w, left)
            longest = max(longest, left)
        elif w.step == 0 and w.reported_gpu_seconds == 0 and w.gpu_seconds == 0:
            fresh += 1
            fresh_steps += w.budget
            longest_fresh = max(longest_fresh, w.budget)
        else:
            others.append(w)
    return _Load(summed, longest, fresh, fresh_steps, longest_fresh, tuple(others))


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
    return _estimate(_load_of(work), gpus=gpus, to_ask=to_ask, time_left=time_left, gpu_seconds_left=gpu_seconds_left)


def _estimate(
    load: _Load, *, gpus: int, to_ask: int | None, time_left: float | None, gpu_seconds_left: float | None
) -> Eta | None:
    """``estimate_eta`` of the trials that ``load`` sums up."""
    bounded = None if time_left is None else Eta(max(0.0, time_left), "max_time")
    summed, others = load.summed, load.others
    paced_steps = summed.paced_steps + sum(w.step for w in others if w.paced)
    paced_gpu_seconds = summed.paced_gpu_seconds + sum(w.reported_gpu_seconds for w in others if w.paced)
    pace = paced_gpu_seconds / paced_steps if paced_steps else None
    lefts: list[float] = []  # GPU seconds each of the others still needs
    cost = summed.used + summed.left  # GPU seconds of all the trials: used, and still needed
    for w in others:
        left = w.left(pace)
        if left is None:
            return bounded
        lefts.append(left)
        cost += w.gpu_seconds + left
    if gpus < 1 or (load.fresh and pace is None):
        return bounded
    total = summed.left + sum(lefts)
    longest = max(load.longest, max(lefts, default=0.0))
    if load.fresh and pace is not None:
        total += load.fresh_steps * pace
        cost += load.fresh_steps * pace
        longest = max(longest, load.longest_fresh * pace)
    trials = summed.trials + len(others) + load.fresh
    if to_ask is None:
        if gpu_seconds_left is None:
            return bounded
        total = max(0.0, gpu_seconds_left)  # more trials come until it is spent
    elif to_ask > 0:
        if not trials:
            return bounded
        total += to_ask * cost / trials
    if gpu_seconds_left is not None:
        total = min(total, max(0.0, gpu_seconds_left))
    seconds = max(min(longest, total), total / gpus)
    if bounded is not None and bounded.seconds <= seconds:
        return bounded
    return Eta(seconds)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a frame shows, taken on the engine's thread; nothing in it changes after."""

    taken_at: float  # the executor clock
    counts: dict[str, int]  # trials per state, the states in the order of their first trial
    gpus_busy: int
    gpus: int
    holding: tuple[_Row, ...]  # the trials holding a GPU, the best first; then, so ranked too:
    suspended: Sequence[_Row]
    ended: Sequence[_Row]
    pending: int
    leaders: tuple[_Row, ...]  # the best trials that reported, at most LEADERS
    load: _Load
    to_ask: int | None  # trials the searcher will still ask; None: unknown
    gpu_seconds: float  # used by all trials, at taken_at
    interrupted: bool  # the run ended on an exception: its last frame must not show it running


@dataclass(slots=True, eq=False)
class _Followed:
    """The view's record of one trial, as it last looked."""

    trial: Trial
    state: TrialState
    row: _Row
    best: int | None  # the index of its first best report among the ``seen`` first
    seen: int


class LiveView:
    """An engine listener that keeps a Rich live display of the experiment.

    ``budget``: the search's (``ExperimentSession.budget``), for the trials still to come and the time
    budget in the ETA; without it, the ETA waits until the searcher has asked its last trial. ``in_flight``:
    at most this many trials at once (the searcher's ``max_pending``), fewer than the GPUs perhaps.

    It must be told every event the core handles once it has looked at a trial; trials that come without an
    event (those a session replays from its log before its first event) are read as they are when it finds them.
    """

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
        self._interrupted = False
        self._forget()

    def _forget(self) -> None:
        """Start over: the next look reads every trial as it is. What is kept assumes that an ended trial stays
        ended; a reopening (a rerun with a larger budget) runs again those its end stopped."""
        # Kept on the engine's thread, as events come: every trial the view knows (the core's first ones, in order)
        self._followed: dict[str, _Followed] = {}
        self._submitted: list[str] = []  # trials submitted since the last snapshot
        self._touched: set[str] = set()  # trials named by an event or a decision since the last snapshot
        self._counts = dict.fromkeys(TrialState, 0)
        self._pending: deque[_Followed] = deque()  # the pending trials in order, and some that were (dropped later)
        self._pending_steps = 0  # their budgets, summed
        self._longest_pending: list[tuple[int, int, _Followed]] = []  # heap of (-budget, seq), and some that were
        self._holding: dict[str, _Followed] = {}
        self._suspended = _Ranking()
        self._suspended_seqs: list[int] = []  # sorted
        # What the ETA knows of the suspended trials, which stays so while they do: with a pace of their own, what
        # they still need at it, summed (and the most, of sorted (-left, seq)); without, one by one
        self._paced: dict[str, tuple[Work, float]] = {}
        self._paced_sums = _Sums()
        self._paced_lefts: list[tuple[float, int]] = []
        self._unpaced: dict[str, Work] = {}
        self._ended = _Ranking()
        self._ended_leaders: list[_Row] = []  # the first LEADERS of the ended trials that reported
        self._ended_sums = _Sums()
        self._first_ended: dict[TrialState, int] = {}  # the seq of the first trial in each terminal state

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
        if type(event) is SubmissionsReopened:
            self._forget()
        elif type(event) is TrialSubmitted:
            self._submitted.append(event.trial_id)
        else:
            trial_id = getattr(event, "trial_id", None)
            if trial_id is not None:
                self._touched.add(trial_id)
        for decision in decisions:
            self._touched.add(decision.trial_id)
        now = time.monotonic()
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL or self.scheduler.finished:
            self._last_snapshot = now
            self._take()

    # ------------------------------------------------------------------ following the core
    def _take(self) -> None:
        now = self.clock()
        self._look()
        counts = self._counts
        first = dict(self._first_ended)  # the seq of the first trial in each state
        pending = self._pending
        while pending and pending[0].state is not TrialState.PENDING:
            pending.popleft()
        if pending:
            first[TrialState.PENDING] = pending[0].trial.seq
        if self._suspended_seqs:
            first[TrialState.SUSPENDED] = self._suspended_seqs[0]
        holding, others = [], []
        for followed in self._holding.values():
            trial, state = followed.trial, followed.state
            first[state] = min(first.get(state, trial.seq), trial.seq)
            holding.append(followed.row)
            reported = trial.report_gpu_time[-1] if trial.report_gpu_time else 0.0
            others.append(Work(False, trial.steps[-1] if trial.steps else 0, trial.budget, reported,
                               trial.gpu_time_at(now)))  # fmt: skip
        holding.sort(key=_ranked)
        others += self._unpaced.values()
        paced, ended = self._paced_sums, self._ended_sums
        summed = _Sums(paced.trials + ended.trials, paced.paced_steps + ended.paced_steps,
                       paced.paced_gpu_seconds + ended.paced_gpu_seconds, paced.used + ended.used, paced.left)
        longest = self._longest_pending
        while longest and longest[0][2].state is not TrialState.PENDING:
            heapq.heappop(longest)
        load = _Load(summed, -self._paced_lefts[0][0] if self._paced_lefts else 0.0, counts[TrialState.PENDING],
                     self._pending_steps, -longest[0][0] if longest else 0, tuple(others))  # fmt: skip
        suspended = self._suspended.share()
        leaders = sorted([
            *(row for row in holding if row.best is not None),
            *islice((row for row in suspended if row.best is not None), LEADERS),
            *self._ended_leaders,
        ], key=_ranked)  # fmt: skip
        if not self.scheduler.submissions_open:
            to_ask: int | None = 0
        elif self.budget is not None and self.budget.trials is not None:
            to_ask = max(0, self.budget.trials - len(self._followed))
        else:
            to_ask = None
        shown: dict[str, int] = {}  # by the state reports show: a run that ended leaves none running
        for state in sorted(first, key=first.__getitem__):
            name = shown_state(state, live=not self._interrupted)
            shown[name] = shown.get(name, 0) + counts[state]
        snapshot = _Snapshot(
            now, shown,
            counts[TrialState.RUNNING] + counts[TrialState.SUSPENDING], self.scheduler.cluster.gpu_count,
            tuple(holding), suspended, self._ended.share(), counts[TrialState.PENDING], tuple(leaders[:LEADERS]), load,
            to_ask, summed.used + sum(w.gpu_seconds for w in others), self._interrupted,
        )  # fmt: skip
        with self._lock:
            self._snapshot = snapshot

    def _look(self) -> None:
        """Look again at the trials that may have changed since the last look: the new ones, those the events
        named, and those holding a GPU."""
        trials = self.scheduler.trials
        known = len(self._followed)
        if known + len(self._submitted) == len(trials):
            new: Iterable[Trial] = [trials[trial_id] for trial_id in self._submitted]
        else:  # trials that came without an event: whatever is new, in order
            new = islice(trials.values(), known, None)
        self._submitted.clear()
        for trial in new:
            self._see(trial, None)
        followed = self._followed
        for trial_id in self._touched:
            if trial_id in followed:
                self._see(followed[trial_id].trial, followed[trial_id])
        self._touched.clear()
        for holding in list(self._holding.values()):
            self._see(holding.trial, holding)

    def _see(self, trial: Trial, followed: _Followed | None) -> None:
        """Update the trial's row, and what is kept of its kind of trials: it leaves them and joins them again
        (pending and ended trials change nothing there while they stay so)."""
        scores = trial.scores
        best = None if followed is None else followed.best
        for index in range(0 if followed is None else followed.seen, len(scores)):
            # the first best report; none of NaN or infinity (their score is -inf), as `hermes results` has it
            if scores[index] > (-math.inf if best is None else scores[best]):
                best = index
        row = _Row(
            trial.trial_id, trial.seq, trial.state, trial.gpu or "", trial.step, trial.budget,
            trial.values[-1] if trial.values else None,
            None if best is None else trial.values[best],
            -float("inf") if best is None else scores[best],
        )  # fmt: skip
        if followed is None:
            followed = self._followed[trial.trial_id] = _Followed(trial, trial.state, row, best, len(scores))
            self._enter(followed)
            return
        if followed.state is trial.state and (trial.state is TrialState.PENDING or trial.state.is_terminal):
            followed.row, followed.best, followed.seen = row, best, len(scores)
            return
        self._leave(followed)
        followed.state, followed.row, followed.best, followed.seen = trial.state, row, best, len(scores)
        self._enter(followed)

    def _enter(self, followed: _Followed) -> None:
        trial, state = followed.trial, followed.state
        self._counts[state] += 1
        if state is TrialState.PENDING:
            self._pending.append(followed)
            self._pending_steps += trial.budget
            heapq.heappush(self._longest_pending, (-trial.budget, trial.seq, followed))
        elif state.holds_gpu:
            self._holding[trial.trial_id] = followed
        elif state is TrialState.SUSPENDED:
            self._suspended.add(followed.row)
            insort(self._suspended_seqs, trial.seq)
            reported = trial.report_gpu_time[-1] if trial.report_gpu_time else 0.0
            work = Work(False, trial.steps[-1] if trial.steps else 0, trial.budget, reported, trial.gpu_time)
            left = work.left(None)
            if left is None:
                self._unpaced[trial.trial_id] = work
            else:
                self._paced[trial.trial_id] = work, left
                self._paced_sums.add(work, left)
                insort(self._paced_lefts, (-left, trial.seq))
        else:
            self._end(followed)

    def _leave(self, followed: _Followed) -> None:
        trial, state = followed.trial, followed.state
        self._counts[state] -= 1
        if state is TrialState.PENDING:
            self._pending_steps -= trial.budget
        elif state.holds_gpu:
            del self._holding[trial.trial_id]
        elif state is TrialState.SUSPENDED:
            self._suspended.remove(followed.row)
            del self._suspended_seqs[bisect_left(self._suspended_seqs, trial.seq)]
            if self._unpaced.pop(trial.trial_id, None) is None:
                work, left = self._paced.pop(trial.trial_id)
                self._paced_sums.add(work, left, -1)
                del self._paced_lefts[bisect_left(self._paced_lefts, (-left, trial.seq))]

    def _end(self, followed: _Followed) -> None:
        """An ended trial stays as it is: its row is ranked once, and the ETA's sums take what it used."""
        trial, row = followed.trial, followed.row
        first = self._first_ended.get(trial.state)
        self._first_ended[trial.state] = trial.seq if first is None else min(first, trial.seq)
        self._ended.add(row)
        if row.best is not None and can_be_best(trial.state):  # a failed trial's partial best is no result
            insort(self._ended_leaders, row, key=_ranked)
            del self._ended_leaders[LEADERS:]
        reported = trial.report_gpu_time[-1] if trial.report_gpu_time else 0.0
        # it holds no GPU: its GPU time is all it used
        self._ended_sums.add(Work(True, trial.steps[-1] if trial.steps else 0, trial.budget, reported, trial.gpu_time),
                             0.0)  # fmt: skip

    # ------------------------------------------------------------------ drawing
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.render(console, options)

    def render(self, console: Console, options: ConsoleOptions) -> RenderableType:
        """The view, fitted to the console's height and width: each part is drawn into lines once, and fitted by
        its count of lines."""
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return Text("starting...")
        now = max(snapshot.taken_at, self.clock())
        eta = None if snapshot.interrupted else self.eta(snapshot, now)
        header = Text.assemble(
            (f"{self.title}  ", "bold"),
            ("interrupted  ", "bold red") if snapshot.interrupted else "",  # its trials stopped: none runs
            f"elapsed {_duration(now)}  ",
            f"ETA {eta}  " if eta is not None else "",
            f"GPUs {0 if snapshot.interrupted else snapshot.gpus_busy}/{snapshot.gpus} busy  ",
            "  ".join(f"{state} {count}" for state, count in snapshot.counts.items()),
        )
        height = options.size.height

        def lines(part: RenderableType) -> list[list[Segment]]:
            return console.render_lines(part, options, pad=False)

        top = lines(header)
        leaders = LEADERS
        board = lines(self._leaderboard(console, options, snapshot.leaders[:leaders], snapshot.interrupted))
        while leaders > 1 and len(top) + len(board) > height:  # a very short terminal: fewer leaders
            leaders -= 1
            board = lines(self._leaderboard(console, options, snapshot.leaders[:leaders], snapshot.interrupted))
        if len(top) + len(board) > height:  # not even one leader's table: its line
            board = lines(self._best_line(snapshot))
        shown = min(len(snapshot.holding) + len(snapshot.suspended) + len(snapshot.ended), height)
        while True:
            made = self._trials_table(console, options, snapshot, shown)
            if made is None:
                return _Lines(top + board)
            table, table_height = made
            excess = len(top) + table_height + len(board) - height
            if excess <= 0:
                return _Lines(top + lines(table) + board)
            if shown == 0:  # not even that line fits: the header counts the trials
                return _Lines(top + board)
            shown = max(0, shown - excess)

    def eta(self, snapshot: _Snapshot, now: float) -> Eta | None:
        """The snapshot's estimate, less the time since it was taken; a time budget bounds it."""
        budget = self.budget
        time_left = None if budget is None or budget.seconds is None else budget.seconds - now
        gpu_left = None if budget is None or budget.gpu_seconds is None else budget.gpu_seconds - snapshot.gpu_seconds
        at_once = snapshot.gpus if self.in_flight is None else min(snapshot.gpus, self.in_flight)
        eta = _estimate(snapshot.load, gpus=at_once, to_ask=snapshot.to_ask, time_left=None, gpu_seconds_left=gpu_left)
        if eta is not None:
            eta = Eta(max(0.0, eta.seconds - (now - snapshot.taken_at)))
        if time_left is not None and (eta is None or eta.seconds >= time_left):
            return Eta(max(0.0, time_left), "max_time")
        return eta

    def _trials_table(
        self, console: Console, options: ConsoleOptions, snapshot: _Snapshot, shown: int
    ) -> tuple[RenderableType, int] | None:
        """The first ``shown`` of the trials holding a GPU, then of the suspended ones, then of the ended ones, the
        rest and the pending trials counted, and the lines it takes; None where there is none."""
        holding, suspended, ended, pending = snapshot.holding, snapshot.suspended, snapshot.ended, snapshot.pending
        listed = len(holding) + len(suspended) + len(ended)
        if not listed and not pending:
            return None
        rows = [*holding[:shown], *suspended[: max(0, shown - len(holding))],
                *ended[: max(0, shown - len(holding) - len(suspended))]]  # fmt: skip
        more = listed - len(rows)
        notes = ([f"{more} more"] if more else []) + ([f"{pending} pending"] if pending else [])
        caption = "... and " + ", ".join(notes) if notes else None
        if not rows:  # no room for a table: a line that counts them
            counted = [f"{listed} not listed"] * bool(listed) + [f"{pending} pending"] * bool(pending)
            line = Text("trials: " + ", ".join(counted), style="dim")
            return line, len(console.render_lines(line, options, pad=False))
        metric = self.metric  # titles and headers are Text, no markup: a name's [brackets] and :codes: are its own
        layouts = (
            ("state", "GPU", f"last {metric}", f"best {metric}"),
            ("state", f"last {metric}", f"best {metric}"),
            ("state", "last", "best"),
            ("last", "best"),
        )
        for columns in layouts:
            table = Table(title=Text("trials" if columns[-1] == f"best {metric}" else f"trials ({metric})"),
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
                    cells.append(_state_cell(row, snapshot.interrupted))
                if "GPU" in columns:
                    cells.append(Text("" if snapshot.interrupted else row.gpu))  # a cell's str is markup too
                cells += [f"{row.step}/{row.budget}", format_number(row.last), format_number(row.best)]
                table.add_row(*cells)
            widest = _widest(console, options, table)
            if _fits(options, table, widest):
                break
        return table, _height(console, options, table, widest)

    def _best_line(self, snapshot: _Snapshot) -> Text:
        """The leader in one line, for a terminal too short for a table (its cells were all "...")."""
        if not snapshot.leaders:
            return Text(f"best {self.metric}: none yet", style="dim")
        best = snapshot.leaders[0]
        return Text(f"best {self.metric}: {format_number(best.best)} (trial {best.trial_id})")

    def _leaderboard(
        self, console: Console, options: ConsoleOptions, ranked: Sequence[_Row], interrupted: bool
    ) -> Table:
        metric = self.metric
        for columns in (("best " + metric, "state"), ("best", "state"), ("best",)):
            table = Table(title=Text(f"leaderboard (best {metric}, {self.mode})"), title_justify="left")
            _number_column(table, "#", ranked, lambda r: str(ranked.index(r) + 1))
            _number_column(table, "trial", ranked, lambda r: r.trial_id, justify="left")
            _number_column(table, columns[0], ranked, lambda r: format_number(r.best))
            if "state" in columns:
                table.add_column("state", no_wrap=True)
            for place, row in enumerate(ranked, start=1):
                table.add_row(str(place), Text(row.trial_id), format_number(row.best), *(
                    [_state_cell(row, interrupted)] if "state" in columns else []))
            if _fits(options, table, _widest(console, options, table)):
                break
        return table


class _Lines:
    """Lines drawn already (``Console.render_lines``), given as they are."""

    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        for line in self.lines:
            yield from line
            yield new_line


def _state_cell(row: _Row, interrupted: bool) -> Text:
    """A trial's state as ``hermes status`` will show it: once the run was interrupted, none is running."""
    shown = shown_state(row.state, live=not interrupted)
    return Text(shown, style="bold red" if shown != row.state.value else _STATE_STYLE[row.state])


def _number_column(
    table: Table, header: str, rows: Sequence[_Row], cell: Callable[[_Row], str], justify: str = "right"
) -> None:
    """A column that is never cut: as wide as its widest cell, on one line."""
    width = max((cell_len(cell(row)) for row in rows), default=1)
    table.add_column(Text(header), justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]


def _widest(console: Console, options: ConsoleOptions, table: Table) -> list[tuple[int, int]]:
    """Each column's widest cell (header included): by its longest word, and by its whole length."""
    widest = []
    for column in table.columns:
        sizes = [Measurement.get(console, options, cell) for cell in (column.header, *column.cells)]
        widest.append((max(size.minimum for size in sizes), max(size.maximum for size in sizes)))
    return widest


def _fits(options: ConsoleOptions, table: Table, widest: list[tuple[int, int]]) -> bool:
    """Whether the table fits the width without cutting a cell: a column on one line is as wide as its
    widest cell (header included), the others as their longest word; each has a space either side, and
    a border between and around them."""
    need = len(table.columns) + 1
    for column, (word, whole) in zip(table.columns, widest):
        need += 2 + (whole if column.no_wrap else word)
    return need <= options.max_width


def _height(console: Console, options: ConsoleOptions, table: Table, widest: list[tuple[int, int]]) -> int:
    """The lines the table takes. Where every column can be as wide as its widest cell, each row is a line: the
    columns are given those widths (Rich's own, which it need not measure again to draw it), and its rows are
    counted, not drawn (a table of its first row alone, its columns as wide, gives the rest)."""
    widths = [max(whole, column.min_width or 0) for column, (_, whole) in zip(table.columns, widest)]
    if len(table.rows) < 2 or sum(widths) + 3 * len(widths) + 1 > options.max_width:  # a cell wraps: draw it
        return len(console.render_lines(table, options, pad=False))
    first = Table(title=table.title, title_justify=table.title_justify, caption=table.caption,
                  caption_justify=table.caption_justify)
    for column, width in zip(table.columns, widths):
        column.width = width
        first.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap, width=width)
    first.add_row(*(next(iter(column.cells)) for column in table.columns))
    return len(console.render_lines(first, options, pad=False)) + len(table.rows) - 1


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
