"""What an experiment store keeps, and the contract every backend honours.

The event log is the source of truth: replaying ``events()`` into a fresh core rebuilds its state.
Trials, metrics and decisions are kept for people (dashboard, leaderboard, GPU timeline).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.states import TrialState
from hermes.errors import HermesError, NoSpaceError


class StoreError(HermesError):
    """The store cannot do what was asked: unknown experiment, conflicting spec, or a backend failure."""


class DamagedRecord(StoreError):
    """A record the store holds but cannot decode (edited by hand, or damaged on disk). ``record`` names it:
    its table, its row's key and its column, and what is wrong there."""

    def __init__(self, message: str, record: str) -> None:
        super().__init__(message)
        self.record = record


class WriterLost(StoreError):
    """Another store object claimed the experiment (``claim_writer``): this one may write to it no more."""


class StoreFull(StoreError, NoSpaceError):
    """The store's disk is full: nothing of the write was kept, and the store is intact."""


class NameTaken(StoreError):
    """An experiment of that name (of that owner) is in the store already: ``submit_experiment`` refuses it."""


class TooManyExperiments(StoreError):
    """The owner has as many unfinished experiments as ``submit_experiment``'s ``max_active`` allows."""


class StoreUnavailable(StoreError):
    """The store cannot be written now: another process held it locked past the wait, it was made read-only,
    or its disk refused the write (a file-size limit). Nothing of the write was kept; not the experiment's
    fault: its run stops, recorded as interrupted where the store lets it, and running it again continues it."""


# How the error of a pool's experiment that waits for the files its spec names begins (``hermes.pool``)
WAITING_FOR_FILES = "waiting for its files"


class ExperimentStatus(str, Enum):
    QUEUED = "queued"  # submitted to a pool (``submit_experiment``), not yet taken up
    RUNNING = "running"  # created, or reopened by a runner
    FINISHED = "finished"  # the core finished: every trial is terminal
    FAILED = "failed"  # the runner gave up with an error
    INTERRUPTED = "interrupted"  # the runner was stopped; reopening resumes it
    CANCELLED = "cancelled"  # ended on request (``request_cancel``): its unfinished trials were stopped

    @property
    def is_final(self) -> bool:
        """No runner will take it up again."""
        return self in (ExperimentStatus.FINISHED, ExperimentStatus.FAILED, ExperimentStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    experiment_id: int
    name: str
    spec: dict[str, Any]
    created_at: float  # wall-clock seconds since the epoch
    status: ExperimentStatus
    owner: str | None = None  # who submitted it to a pool; None: not a pool's (``hermes run`` made it)
    weight: float = 1.0  # its weight in the pool's fair share
    cancel_requested: bool = False
    error: str | None = None  # why it failed, when its runner said
    gpu_seconds_used: float = 0.0  # a pool's fair-share accounts: GPU seconds it held so far,
    gpu_seconds_owed: float = 0.0  # and what its share came to (``save_accounts``)

    @property
    def full_name(self) -> str:
        """``owner/name`` for a pool's experiment (names are per owner), else its name."""
        return f"{self.owner}/{self.name}" if self.owner else self.name


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """A trial as people see it; the runner writes it whenever the trial changes."""

    trial_id: str
    params: dict[str, Any]
    state: TrialState
    budget: int
    submitted_at: float
    step: int = 0  # last step reported
    checkpoint_step: int = 0  # step its durable checkpoint holds
    gpu: str | None = None  # GPU it holds now, if any
    error: str | None = None
    started_at: float | None = None  # first start
    ended_at: float | None = None  # reached a terminal state


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """One report: the first of its step. A step reported again after a rollback to an older
    checkpoint is in the event log twice, but here once (a unique key on experiment, trial, step)."""

    trial_id: str
    step: int
    at: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    event_seq: int  # the event (1-based position in ``events()``) that caused the decision
    at: float  # the time of that event
    decision: Decision


@dataclass(frozen=True, slots=True)
class Run:
    """One stretch of a trial on a GPU: a bar of the GPU timeline."""

    trial_id: str
    gpu: str
    started_at: float  # when Start or Resume was decided
    resumed: bool  # begun by Resume rather than Start
    migrated: bool
    yield_requested_at: float | None = None  # when Suspend or Stop was decided while it ran
    ended_at: float | None = None  # when the GPU was released; None while it still runs
    ended_by: str | None = None  # suspended | completed | stopped | failed | lost (its GPU or node went away)


class ExperimentStore(ABC):
    """Durable record of experiments, in the spirit of Optuna's ``BaseStorage``.

    Contract for every implementation:

    - Atomicity: each method call is one transaction. ``append_event`` stores the event and the
      decisions it caused together or not at all.
    - Durability: once a write method returns, its data survives a crash of the process
      (``kill -9``); a file-backed store also survives the machine's crash.
    - Ordering: ``events`` returns events in append order; event ``i`` (0-based) has sequence
      number ``i + 1``. There is one writer of events per experiment (its runner); metrics and
      trials may be written from other threads.
    - One writer: once a store object has claimed an experiment (``claim_writer``), writes to it
      through any other store object raise WriterLost, so two runners can never interleave one log.
    - One pool: a store object that holds the store's pool (``claim_pool``) keeps every other one from
      holding it, in any process, until it releases it, closes or its process ends.
    - Thread safety: all methods may be called from any thread. Records returned are fresh
      copies: later writes never change a record already read.
    - Reopening: the same name and spec returns the same experiment id, so a restarted runner
      resumes by replaying ``events``; a different spec under that name raises StoreError.
    """

    @abstractmethod
    def create_or_open_experiment(self, name: str, spec: Mapping[str, Any], may_change: Collection[str] = ()) -> int:
        """Create the experiment (status running), or return the id of the one with this name and spec.

        ``may_change``: dotted paths of the spec that may differ from the stored one, with all below
        them (a budget extended by a rerun, another policy); the stored spec then becomes ``spec``.
        Any other difference raises."""

    @abstractmethod
    def experiment(self, experiment_id: int) -> ExperimentRecord:
        """The experiment with this id; StoreError if there is none."""

    @abstractmethod
    def experiments(
        self, status: ExperimentStatus | Collection[ExperimentStatus] | None = None
    ) -> list[ExperimentRecord]:
        """Every experiment (with ``status``: those in that status, or in one of those), oldest first; one whose
        record is damaged is left out, so that it stops no other (``experiment`` raises DamagedRecord for it)."""

    @abstractmethod
    def set_status(self, experiment_id: int, status: ExperimentStatus, error: str | None = None) -> None:
        """``error``: why it failed, kept on the record (None leaves the stored reason as it is for a status of
        failed, and clears it for any other)."""

    # ------------------------------------------------------------------ a pool's experiments (hermes.pool)
    @abstractmethod
    def submit_experiment(self, name: str, spec: Mapping[str, Any], owner: str = "", weight: float = 1.0,
                          max_active: int | None = None) -> int:
        """Queue a new experiment for a pool (status queued); a name the owner uses already raises
        StoreError. Names are per owner: two owners may each have an experiment called ``mnist``.
        ``max_active``: the owner's unfinished experiments (queued, running or interrupted) this one may join, or
        TooManyExperiments; counted in the write that adds it, so submissions at once cannot pass it together.

        ``spec`` as ``ExperimentSpec.model_dump(mode="json")`` gives it (what a runner stores), so
        that the pool's session reopens it as is."""

    @abstractmethod
    def set_weight(self, experiment_id: int, weight: float) -> None:
        """Change a pool experiment's weight (a positive number); the pool applies it while running."""

    @abstractmethod
    def request_cancel(self, experiment_id: int) -> None:
        """Ask the pool to cancel the experiment: a queued one never starts, a running one has its
        trials stopped. Idempotent; a finished experiment stays as it is."""

    @abstractmethod
    def save_accounts(self, accounts: Mapping[int, tuple[float, float]]) -> None:
        """A pool's fair-share accounts, ``experiment id -> (GPU seconds used, GPU seconds owed)``,
        in one transaction, so that a restarted pool goes on from them."""

    @abstractmethod
    def set_owner_weight(self, owner: str, weight: float) -> None:
        """An owner's weight in the pool's fair share (default 1): the pool is split between owners
        first, then each owner's part between their experiments."""

    @abstractmethod
    def owner_weights(self) -> dict[str, float]:
        """The weights ``set_owner_weight`` set, by owner."""

    @abstractmethod
    def claim_writer(self, experiment_id: int, holder: str) -> None:
        """Make this store object the experiment's only writer; ``holder`` (pid, host, command)
        names it in the error an earlier writer gets on its next write."""

    def claim_pool(self, who: dict[str, Any]) -> None:
        """Hold the store's pool, or raise StorageInUse naming the pool that holds it: two pools on one store took
        each other's experiments. ``who`` (pid, host, command, since: a ``RunnerLock``'s) names this one
        to a refused pool. Held until ``release_pool``, ``close``, or the end of the process."""
        raise StoreError(f"{type(self).__name__} cannot hold a pool")

    def release_pool(self) -> None:
        """Let another pool hold the store (``claim_pool``); nothing if this object holds none."""

    @abstractmethod
    def append_event(self, experiment_id: int, event: Event, decisions: Sequence[Decision] = ()) -> int:
        """Append ``event`` and the decisions the core made about it, atomically; return its sequence number."""

    def record_event(
        self, experiment_id: int, event: Event, decisions: Sequence[Decision], trials: Sequence[TrialRecord]
    ) -> int:
        """What one event changed, in one transaction: the event and its decisions, its report's
        ``metrics`` when it is a TrialReported, and the records of the trials it touched. A crash
        leaves all of it or none, so no report is ever stored twice or lost; return the event's
        sequence number."""
        return self.record_events(experiment_id, [(event, decisions, trials)])[0]

    @abstractmethod
    def record_events(
        self, experiment_id: int, records: Sequence[tuple[Event, Sequence[Decision], Sequence[TrialRecord]]]
    ) -> list[int]:
        """``record_event`` for several events, in order, in one transaction (one commit, one
        flush to the disk); return their sequence numbers."""

    @abstractmethod
    def events(self, experiment_id: int) -> list[Event]:
        """The whole event log, in append order: replaying it into a fresh core rebuilds the core."""

    @abstractmethod
    def decisions(self, experiment_id: int) -> list[DecisionRecord]:
        """Every decision, in the order the core made them."""

    @abstractmethod
    def upsert_trial(self, experiment_id: int, trial: TrialRecord) -> None:
        """Insert the trial or replace the stored record with the same ``trial_id``."""

    @abstractmethod
    def trials(self, experiment_id: int) -> list[TrialRecord]:
        """Every trial, in order of first insertion."""

    @abstractmethod
    def record_metrics(
        self, experiment_id: int, trial_id: str, step: int, at: float, metrics: Mapping[str, float]
    ) -> None:
        """Keep one report: every metric the trial measured at ``step``; a step kept already is left as it is."""

    @abstractmethod
    def metrics(self, experiment_id: int, trial_id: str | None = None) -> list[MetricRecord]:
        """Reports in the order they were recorded, of one trial or of all."""

    # ------------------------------------------------------------------ reading what is new
    @abstractmethod
    def events_after(self, experiment_id: int, after: int, limit: int | None = None) -> list[tuple[int, Event]]:
        """``(seq, event)`` for the events with sequence numbers above ``after``, in order, at most ``limit``."""

    @abstractmethod
    def decisions_after(self, experiment_id: int, after: int, upto: int | None = None) -> list[DecisionRecord]:
        """The decisions of the events ``after < seq <= upto``, in order."""

    @abstractmethod
    def metrics_after(
        self, experiment_id: int, after: int, limit: int | None = None, trial_id: str | None = None,
    ) -> list[tuple[int, MetricRecord]]:
        """``(cursor, report)`` for the reports recorded after the one whose cursor is ``after`` (0: from the
        first), of one trial (``trial_id``) or all, in order, at most ``limit``; cursors grow with recording
        order."""

    @abstractmethod
    def latest_event_at(self) -> float:
        """The latest time on the clock of any experiment in the store (0 for none). A pool that starts again
        goes on from there, so that the runs of its experiments, old and new, never overlap in time."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""

    def runs(self, experiment_id: int) -> list[Run]:
        """Who ran where and when, derived from the event log and the decisions."""
        return build_runs(self.events(experiment_id), self.decisions(experiment_id))


def build_runs(events: Sequence[Event], decisions: Sequence[DecisionRecord]) -> list[Run]:
    """Replay the log: Start/Resume open a run; its trial's release, or the loss of its GPU, closes it."""
    by_event: dict[int, list[DecisionRecord]] = {}
    for record in decisions:
        by_event.setdefault(record.event_seq, []).append(record)
    timeline = RunTimeline()
    for seq, event in enumerate(events, start=1):
        timeline.feed(event, by_event.get(seq, ()))
    return timeline.runs


@dataclass(slots=True)
class _Progress:
    """What the core knows of a trial's steps, to end its runs as the core ends the trial."""

    budget: int
    movable: bool
    step: int = 0  # the last step reported, or caught up to after a fall back
    checkpoint_step: int = 0
    reported: bool = False  # one that exits without a report failed (the core's rule)

    def fall_back(self) -> None:
        """A run gone without a suspension (a crash, a lost GPU): the core goes back to the step its next run
        catches up to (``Trial.catch_up_step``)."""
        if self.movable:
            self.step = self.checkpoint_step


class RunTimeline:
    """``build_runs`` one event at a time, for readers that follow a growing log (the dashboard).

    Each event is applied before the decisions it caused, as in the engine loop.
    """

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._open: dict[str, int] = {}  # trial id -> index in runs
        self._node_gpus: dict[str, set[str]] = {}
        self._stopping: set[str] = set()
        self._progress: dict[str, _Progress] = {}

    def open_run(self, trial_id: str) -> int | None:
        """The index of the trial's run that has not ended yet, if any."""
        return self._open.get(trial_id)

    def feed(self, event: Event, decisions: Sequence[DecisionRecord]) -> set[int]:
        """Apply one event and its decisions; return the indices of the runs they opened or changed."""
        changed: set[int] = set()
        if isinstance(event, TrialSubmitted):
            self._progress[event.trial_id] = _Progress(event.budget, event.movable)
        elif isinstance(event, TrialReported):
            progress = self._progress[event.trial_id]
            progress.step, progress.reported = event.step, True
            if event.checkpointed:
                progress.checkpoint_step = event.step
        elif isinstance(event, TrialSuspended):
            progress = self._progress[event.trial_id]
            progress.step = progress.checkpoint_step = event.step
            changed |= self._close(event.trial_id, event.at, "suspended")
        elif isinstance(event, TrialExited):
            changed |= self._close(event.trial_id, event.at, self._exit(event))
        elif isinstance(event, NodeAdded):
            self._node_gpus[event.node] = set(event.gpus)
        elif isinstance(event, GpuAdded):
            self._node_gpus.setdefault(event.node, set()).add(event.gpu)
        elif isinstance(event, NodeRemoved):
            changed |= self._close_gpus(self._node_gpus.pop(event.node, set()), event.at)
        elif isinstance(event, GpuRemoved):
            changed |= self._close_gpus({event.gpu}, event.at)
        elif isinstance(event, SubmissionsReopened):  # a larger budget runs again the trials its end stopped
            self._stopping.clear()
        for record in decisions:
            decision = record.decision
            if isinstance(decision, (Start, Resume)):
                self._open[decision.trial_id] = len(self.runs)
                changed.add(len(self.runs))
                migrated = isinstance(decision, Resume) and decision.migrated
                self.runs.append(
                    Run(decision.trial_id, decision.gpu, record.at, isinstance(decision, Resume), migrated)
                )
            elif isinstance(decision, (Suspend, Stop)):
                if isinstance(decision, Stop):
                    self._stopping.add(decision.trial_id)
                index = self._open.get(decision.trial_id)
                if index is not None and self.runs[index].yield_requested_at is None:
                    self.runs[index] = replace(self.runs[index], yield_requested_at=record.at)
                    changed.add(index)
        return changed

    def _exit(self, event: TrialExited) -> str:
        """How the core ends the trial's run as it exits: a crash after its last step completes it, as an exit
        that succeeded after a report does; a crash before may run again from its checkpoint."""
        progress = self._progress[event.trial_id]
        if event.trial_id in self._stopping:
            return "stopped"
        if (event.succeeded and progress.reported) or (event.crashed and progress.step >= progress.budget):
            return "completed"
        if event.crashed:
            progress.fall_back()
        return "failed"

    def _close(self, trial_id: str, at: float, ended_by: str) -> set[int]:
        index = self._open.pop(trial_id, None)
        if index is None:
            return set()
        self.runs[index] = replace(self.runs[index], ended_at=at, ended_by=ended_by)
        return {index}

    def _close_gpus(self, gpus: set[str], at: float) -> set[int]:
        changed: set[int] = set()
        for trial_id in [t for t, i in self._open.items() if self.runs[i].gpu in gpus]:
            self._progress[trial_id].fall_back()
            changed |= self._close(trial_id, at, "lost")
        return changed
