"""The live view of `hermes run`: trials, GPUs, leaderboard, elapsed time and ETA, in the terminal.

The engine's thread takes a snapshot after each event (throttled); Rich's refresh thread draws
the latest snapshot, so the view keeps ticking while the engine waits for trials and never reads
the core while the core changes.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState

MAX_ROWS = 16  # trials listed; the rest are counted
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
    state: TrialState
    gpu: str
    step: int
    budget: int
    last: float | None
    best: float | None
    score: float  # for ordering: higher is better


@dataclass(frozen=True, slots=True)
class _Snapshot:
    taken_at: float  # the executor clock
    rows: tuple[_Row, ...]
    counts: dict[str, int]
    gpus_busy: int
    gpus: int
    remaining_steps: int
    seconds_per_step: float | None


class LiveView:
    """An engine listener that keeps a Rich live display of the experiment."""

    def __init__(
        self, title: str, metric: str, mode: str, scheduler: Scheduler, clock: Callable[[], float], console: Console
    ) -> None:
        self.title, self.metric, self.mode = title, metric, mode
        self.scheduler = scheduler
        self.clock = clock
        self.console = console
        self._snapshot: _Snapshot | None = None
        self._last_snapshot = 0.0
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        self._take()
        self._live = Live(self, console=self.console, refresh_per_second=4, transient=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._take()
        if self._live is not None:
            self._live.__exit__(*exc_info)

    def __call__(self, event: Event, decisions: list[Decision]) -> None:
        now = time.monotonic()
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL or self.scheduler.finished:
            self._last_snapshot = now
            self._take()

    def _take(self) -> None:
        sign = 1.0 if self.mode == "max" else -1.0
        rows, counts = [], {}
        remaining, trained_steps, gpu_seconds = 0, 0, 0.0
        now = self.clock()
        for trial in self.scheduler.trials.values():
            counts[trial.state.value] = counts.get(trial.state.value, 0) + 1
            best = trial.best_score
            rows.append(
                _Row(
                    trial.trial_id, trial.state, trial.gpu or "", trial.step, trial.budget,
                    trial.values[-1] if trial.values else None,
                    None if best is None else sign * best,
                    -math.inf if best is None else best,
                )
            )  # fmt: skip
            if not trial.state.is_terminal:
                remaining += trial.budget - trial.step
            trained_steps += len(trial.steps)
            gpu_seconds += trial.gpu_time_at(now)
        gpus = self.scheduler.cluster.gpu_count
        busy = sum(1 for row in rows if row.state.holds_gpu)
        snapshot = _Snapshot(
            now, tuple(rows), counts, busy, gpus, remaining, gpu_seconds / trained_steps if trained_steps else None
        )
        with self._lock:
            self._snapshot = snapshot

    def __rich__(self) -> Group:
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return Group(Text("starting..."))
        elapsed = max(snapshot.taken_at, self.clock())
        header = Text.assemble(
            (f"{self.title}  ", "bold"),
            f"elapsed {_duration(elapsed)}  ",
            f"ETA {self._eta(snapshot)}  ",
            f"GPUs {snapshot.gpus_busy}/{snapshot.gpus} busy  ",
            "  ".join(f"{state} {count}" for state, count in snapshot.counts.items()),
        )
        return Group(header, self._trials_table(snapshot), self._leaderboard(snapshot))

    def _eta(self, snapshot: _Snapshot) -> str:
        """Upper bound: the steps left, at the mean GPU time per step so far, over all GPUs.
        Early stopping only makes it shorter."""
        if snapshot.seconds_per_step is None or not snapshot.gpus:
            return "?"
        return "<= " + _duration(snapshot.remaining_steps * snapshot.seconds_per_step / snapshot.gpus)

    def _trials_table(self, snapshot: _Snapshot) -> Table:
        table = Table(title="trials", title_justify="left", expand=False)
        for column in ("trial", "state", "GPU", "step", f"last {self.metric}", f"best {self.metric}"):
            table.add_column(column, justify="right" if column not in ("trial", "state", "GPU") else "left")
        order = sorted(snapshot.rows, key=lambda r: (not r.state.holds_gpu, r.state.is_terminal, -r.score))
        for row in order[:MAX_ROWS]:
            table.add_row(
                row.trial_id,
                Text(row.state.value, style=_STATE_STYLE[row.state]),
                row.gpu,
                f"{row.step}/{row.budget}",
                _number(row.last),
                _number(row.best),
            )
        if len(order) > MAX_ROWS:
            table.caption = f"... and {len(order) - MAX_ROWS} more"
        return table

    def _leaderboard(self, snapshot: _Snapshot) -> Table:
        table = Table(title=f"leaderboard (best {self.metric}, {self.mode})", title_justify="left")
        for column in ("#", "trial", f"best {self.metric}", "state"):
            table.add_column(column)
        ranked = sorted((r for r in snapshot.rows if r.best is not None), key=lambda r: -r.score)
        for place, row in enumerate(ranked[:5], start=1):
            table.add_row(str(place), row.trial_id, _number(row.best), row.state.value)
        return table


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
