"""A simulated executor: replays recorded learning curves in simulated time.

It is a discrete-event engine (a heap of ``(time, sequence, ...)``, ties broken by the sequence
counter) behind the same execution contract as the real executors (hermes/execution/contract.py).
Suspension is cooperative, as in the real trial API: a trial suspends at its next epoch boundary,
so no epoch is ever trained twice or lost. Cluster changes (``changes``: nodes and GPUs that join
or leave) come out of ``next_events`` at their times; a run on a lost GPU falls back to its last
suspension's checkpoint. A trial that is not movable (``TraceTrial.movable``: an unmodified program,
SIGSTOPped in place) moves no state when it switches, and where its process is lost it starts again
from its beginning and catches up, unreported, to the epoch the core knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from heapq import heappop, heappush

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError
from hermes.execution.contract import Executor
from hermes.sim.costs import SwitchCosts
from hermes.sim.trace import TraceTrial

_EPOCH_END, _SUSPENDED, _KILLED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One trained epoch, for checking invariants."""

    trial_id: str
    epoch: int
    gpu: str
    start: float
    end: float


@dataclass(slots=True, eq=False)
class _SimTrial:
    trial_id: str
    curve: TraceTrial
    moved_mb: float | None  # state a switch moves: none for a process stopped in place; None: the default
    gpu: str | None = None
    last_node: str | None = None
    last_gpu: str | None = None
    epoch: int = 0  # epochs completed
    checkpoint: int = 0  # epochs its last suspension saved
    known: int = 0  # epochs the core has: a process started again re-trains them without reporting them
    token: int = 0  # bumped to cancel what is scheduled for this trial
    epoch_started: float = 0.0  # when the epoch in progress began training
    run_started: float = 0.0
    suspend_requested: bool = False


@dataclass(slots=True)
class Accounts:
    """Where simulated GPU time went."""

    busy: float = 0.0  # GPU-seconds held by trials
    useful: float = 0.0  # GPU-seconds of epochs trained to their end
    overhead: float = 0.0  # GPU-seconds spent suspending, resuming and migrating
    # every report's time and value (two lists of floats: no tuple per report for the garbage collector to track)
    report_times: list[float] = field(default_factory=list)
    report_values: list[float] = field(default_factory=list)
    completed_at: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0  # Suspend decisions
    migrations: int = 0  # Resume decisions onto another GPU


class SimulatedExecutor(Executor[TraceTrial]):
    """Runs recorded curves (``submit`` a ``TraceTrial``) on the GPUs of ``layout`` (node -> GPUs)."""

    def __init__(
        self,
        layout: Mapping[str, tuple[str, ...]],
        costs: SwitchCosts = SwitchCosts(),
        *,
        changes: Iterable[NodeAdded | NodeRemoved | GpuAdded | GpuRemoved] = (),
        record_epochs: bool = False,
    ) -> None:
        self.trials: dict[str, _SimTrial] = {}
        self.gpu_node = {gpu: node for node, gpus in layout.items() for gpu in gpus}
        self.costs = costs
        self.profile = ExecutionProfile(costs.switch_cost(), costs.migration_cost())  # till a trial says its state size
        self.clock = 0.0
        self.accounts = Accounts()
        self.epochs: list[EpochRecord] | None = [] if record_epochs else None
        self._heap: list[tuple[float, int, int, _SimTrial, int]] = []  # (time, sequence, token, trial, kind)
        self._sequence = 0
        self._membership: list[Event] = [NodeAdded(0.0, node, tuple(gpus)) for node, gpus in layout.items()]
        self._changes = sorted(changes, key=lambda change: change.at)  # stable: equal times keep their order
        self._woken = False

    def submit(self, trial_id: str, work: TraceTrial, *, at: float | None = None, reported_step: int = 0) -> TrialSubmitted:
        if trial_id in self.trials:
            raise HermesError(f"trial {trial_id} submitted twice")
        trial = _SimTrial(trial_id, work, work.state_mb if work.movable else 0.0)
        switch = self.costs.switch_cost(trial.moved_mb)
        if not self.trials or switch > self.profile.switch_cost:
            # the dearest of its trials, as the local executor
            self.profile = ExecutionProfile(switch, self.costs.migration_cost(trial.moved_mb))
        self.trials[trial_id] = trial
        if work.movable:
            trial.epoch = trial.checkpoint = reported_step
        else:  # it kept no checkpoint: its next run starts from the beginning
            trial.known = reported_step
        return TrialSubmitted(self.clock if at is None else at, trial_id, work.epochs, work.params, work.movable)

    def now(self) -> float:
        return self.clock

    def wake(self) -> None:
        self._woken = True

    def idle(self) -> bool:
        return not (self._heap or self._membership or self._changes)

    # ------------------------------------------------------------------ decisions in
    def apply(self, decision: Decision, at: float) -> None:
        trial = self.trials[decision.trial_id]
        if isinstance(decision, Start):
            self._run(trial, decision.gpu, at, self.costs.start, overhead=False)
        elif isinstance(decision, Resume):
            self.accounts.migrations += decision.migrated
            if not trial.curve.movable and trial.last_gpu is None:  # its process is gone: a new one starts
                cost = self.costs.start
            else:
                other_node = trial.last_node is not None and self.gpu_node[decision.gpu] != trial.last_node
                other_gpu = trial.last_gpu is not None and decision.gpu != trial.last_gpu
                cost = self.costs.resume_cost(trial.moved_mb, other_gpu=other_gpu, other_node=other_node)
            self._run(trial, decision.gpu, at, cost, overhead=True)
        elif isinstance(decision, Suspend):
            if trial.gpu is None:  # it ended: its exit came in the batch of events that made the core suspend it
                return
            self.accounts.preemptions += 1
            if trial.epoch_started == at:  # at an epoch boundary right now: checkpoint at once
                trial.token += 1
                self._suspend(trial, at)
            else:
                trial.suspend_requested = True
        elif isinstance(decision, Stop):
            if trial.gpu is not None:
                trial.token += 1
                self._push(at, trial, _KILLED)

    def _run(self, trial: _SimTrial, gpu: str, at: float, cost: float, *, overhead: bool) -> None:
        if trial.gpu is not None:
            raise HermesError(f"trial {trial.trial_id} is already running on {trial.gpu}")
        trial.gpu = gpu
        trial.run_started = at
        trial.suspend_requested = False
        if overhead:
            self.accounts.overhead += cost
        self._begin_epoch(trial, at + cost)

    def _begin_epoch(self, trial: _SimTrial, at: float) -> None:
        trial.epoch_started = at
        self._push(at + trial.curve.seconds[trial.epoch], trial, _EPOCH_END)

    def _suspend(self, trial: _SimTrial, at: float) -> None:
        cost = self.costs.suspend_cost(trial.moved_mb)
        self.accounts.overhead += cost
        self._push(at + cost, trial, _SUSPENDED)

    def _push(self, at: float, trial: _SimTrial, kind: int) -> None:
        self._sequence += 1
        heappush(self._heap, (at, self._sequence, trial.token, trial, kind))

    # ------------------------------------------------------------------ events out
    def next_events(self) -> list[Event]:
        if self._membership:  # the cluster as it starts, before anything else
            events, self._membership = self._membership, []
            return events
        if self._woken:  # posted events come first: they happened now, the heap's later
            self._woken = False
            return []
        heap = self._heap
        if self._changes:
            while heap and heap[0][2] != heap[0][3].token:
                heappop(heap)  # cancelled: the change comes before anything left after it
            if not heap or heap[0][0] >= self._changes[0].at:
                return [self._change(self._changes.pop(0))]
        while heap:
            at, _, token, trial, kind = heappop(heap)
            if token != trial.token:
                continue  # cancelled
            self.clock = at
            if kind == _EPOCH_END:
                return self._epoch_end(trial, at)
            self._release(trial, at)
            if kind == _SUSPENDED:
                trial.checkpoint = trial.epoch
                return [TrialSuspended(at, trial.trial_id, max(trial.epoch, trial.known))]  # the core's step
            return [TrialExited(at, trial.trial_id, succeeded=False, error="stopped")]
        return []

    def _epoch_end(self, trial: _SimTrial, at: float) -> list[Event]:
        trial_id, curve = trial.trial_id, trial.curve
        trial.epoch += 1
        epoch = trial.epoch
        self.accounts.useful += curve.seconds[epoch - 1]
        if self.epochs is not None:
            self.epochs.append(EpochRecord(trial_id, epoch, trial.gpu, trial.epoch_started, at))
        if epoch > len(curve.metrics):  # the trace says this epoch diverged
            self._release(trial, at)
            return [TrialExited(at, trial_id, succeeded=False, error=f"diverged in epoch {epoch}")]
        events: list[Event] = []
        if epoch > trial.known:  # else caught up: the core has it
            value = curve.metrics[epoch - 1]
            self.accounts.report_times.append(at)
            self.accounts.report_values.append(value)
            events.append(TrialReported(at, trial_id, epoch, value))
        if epoch == len(curve.seconds):  # its last epoch
            self._release(trial, at)
            self.accounts.completed_at[trial_id] = at
            events.append(TrialExited(at, trial_id, succeeded=True))
        elif trial.suspend_requested:
            trial.epoch_started = at
            self._suspend(trial, at)
        else:
            self._begin_epoch(trial, at)
        return events

    def remove_gpu(self, gpu: str) -> None:
        """Lose ``gpu`` now, as a failure would: GpuRemoved comes out of the next ``next_events``."""
        self._changes.insert(0, GpuRemoved(self.clock, gpu))

    def _change(self, change: Event) -> Event:
        """Apply a cluster change at its time; runs on lost GPUs fall back to their checkpoints."""
        self.clock = change.at
        if isinstance(change, NodeAdded):
            self.gpu_node.update(dict.fromkeys(change.gpus, change.node))
        elif isinstance(change, GpuAdded):
            self.gpu_node[change.gpu] = change.node
        else:
            if isinstance(change, GpuRemoved):
                lost = {change.gpu}
            else:
                lost = {gpu for gpu, node in self.gpu_node.items() if node == change.node}
            for trial in self.trials.values():
                if trial.gpu in lost:
                    self._release(trial, change.at)
                    if trial.curve.movable:
                        trial.epoch = trial.checkpoint
                if not trial.curve.movable and trial.gpu is None and trial.last_gpu in lost:
                    self._lose_process(trial)
        return change

    @staticmethod
    def _lose_process(trial: _SimTrial) -> None:
        """Its process, running or stopped, went with its GPU: the next starts from the beginning (no checkpoint),
        and catches up to the epoch the core knows, as ``Trial.catch_up_step`` says."""
        trial.known = max(trial.known, trial.epoch)
        trial.epoch = trial.checkpoint = 0
        trial.last_gpu = trial.last_node = None

    def _release(self, trial: _SimTrial, at: float) -> None:
        self.accounts.busy += at - trial.run_started
        trial.last_node = self.gpu_node[trial.gpu]
        trial.last_gpu = trial.gpu
        trial.gpu = None
        trial.token += 1
