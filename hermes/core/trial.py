"""The core's record of one trial: its state, where it runs, and what it reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hermes.core.states import PENDING, RUNNING, SUSPENDED, TrialState, check_transition


@dataclass(slots=True, eq=False)
class Trial:
    """Plain, mutable bookkeeping owned by the Scheduler; policies only read it.

    ``scores`` are the reported values turned so that higher is always better, so policies
    never need to know whether the experiment minimises or maximises.
    """

    trial_id: str
    seq: int  # arrival order, the tie-breaker everywhere
    budget: int
    submitted_at: float
    params: Mapping[str, Any] = field(default_factory=dict)  # read-only: the core's trials hold a MappingProxyType
    movable: bool = True  # may resume on another GPU (its state is in a checkpoint, not a resident process)
    state: TrialState = PENDING
    waiting: bool = True  # pending or suspended: it could be given a GPU now (kept in step with state)
    node: str | None = None  # node whose scheduler owns the trial
    gpu: str | None = None  # GPU it holds while running or suspending
    last_gpu: str | None = None  # GPU it ran on most recently
    step: int = 0  # last step reported
    checkpoint_step: int = 0  # step that its durable checkpoint holds
    values: list[float] = field(default_factory=list)  # raw metric per report
    scores: list[float] = field(default_factory=list)  # metric per report, higher is better
    steps: list[int] = field(default_factory=list)  # step of each report
    report_gpu_time: list[float] = field(default_factory=list)  # GPU seconds used at each report
    gpu_time: float = 0.0  # GPU seconds of finished runs
    running_since: float | None = None
    started_at: float | None = None  # when it first got a GPU
    idle_since: float = 0.0  # when it last left a GPU (or arrived)
    first_report_at: float | None = None
    stop_requested: bool = False
    starts: int = 0
    migrations: int = 0
    crashes: int = 0  # runs that crashed and were run again from the checkpoint
    error: str | None = None

    def move_to(self, state: TrialState) -> None:
        check_transition(self.trial_id, self.state, state)
        self.state = state
        self.waiting = state is PENDING or state is SUSPENDED

    def run_again(self) -> None:
        """Wait to run again after the end of its experiment stopped it (a rerun with a larger budget reopened it):
        the one way out of a terminal state, outside the table of moves (``hermes.core.states``), which is one run's.
        One that never started waits as it did; one that ran goes on from its checkpoint, as after the loss of its
        GPU, and one that is not movable starts again wherever it is given room: its process is gone."""
        self.state = PENDING if self.started_at is None else SUSPENDED
        self.waiting = True
        self.stop_requested = False
        self.step = self.catch_up_step
        if not self.movable:
            self.last_gpu = None

    @property
    def catch_up_step(self) -> int:
        """The step up to which a restarted run's reports are known already (an executor answers them and
        records nothing): its checkpoint's; a trial that is not movable keeps its state in its process, so it
        starts again from its beginning, and every step it reported is known."""
        return self.checkpoint_step if self.movable else self.step

    def gpu_time_at(self, now: float) -> float:
        """GPU seconds consumed up to ``now``, counting the run in progress."""
        return self.gpu_time + (now - self.running_since if self.running_since is not None else 0.0)

    def begin_run(self, gpu: str, now: float) -> bool:
        """Take ``gpu``; return whether this run is a migration (a different GPU than last time)."""
        migrated = self.last_gpu is not None and self.last_gpu != gpu
        self.move_to(RUNNING)
        self.gpu = gpu
        self.running_since = now
        if self.started_at is None:
            self.started_at = now
        self.starts += 1
        self.migrations += migrated
        return migrated

    def end_run(self, now: float) -> None:
        """Release the GPU (suspended, exited or lost), banking the GPU time it used."""
        if self.running_since is not None:
            self.gpu_time += now - self.running_since
        self.running_since = None
        self.last_gpu = self.gpu
        self.gpu = None
        self.idle_since = now

    def record(self, step: int, value: float, score: float, now: float) -> None:
        self.step = step
        self.steps.append(step)
        self.values.append(value)
        self.scores.append(score)
        running_since = self.running_since
        self.report_gpu_time.append(self.gpu_time + (now - running_since if running_since is not None else 0.0))
        if self.first_report_at is None:
            self.first_report_at = now

    @property
    def best_score(self) -> float | None:
        return max(self.scores) if self.scores else None

