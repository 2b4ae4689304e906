"""The scheduling core: a pure state machine, events in, decisions out.

``Scheduler`` is the global level of the paper's two-level design: it owns the trials and the
cluster model, places each new trial on the least loaded node, migrates waiting trials between
nodes to keep the number of trials time-sharing each GPU even, and delegates the choice of
which trial runs on each GPU to one ``NodeScheduler`` per node. It does no I/O and reads no
clock: time comes only from the events' ``at``, so the same core drives real processes and the
simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Collection, Iterable, Sequence

from hermes.core.cluster import Cluster, Node
from hermes.core.decisions import Decision, Stop, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuReclaimed,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    SubmissionsClosed,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.node_scheduler import NodeScheduler, carry, insort_by_priority
from hermes.core.states import COMPLETED, FAILED, HOLDING_GPU, RUNNING, STOPPED, SUSPENDED, SUSPENDING
from hermes.core.trial import Trial
from hermes.errors import HermesError
from hermes.core.policy import (
    PAUSE,
    STOP,
    EarlyStopper,
    PluginError,
    SchedulingPolicy,
    Verdict,
    checked_priority,
    checked_should_stop,
    held_back,
    plugin_answered,
    plugin_call,
    plugin_raised,
)


NO_REPORT = ("ended without a report: a function trial calls hermes.trial.report(step, metric=value); a program "
             "that prints its metrics needs a trial.metrics_regex that matches its lines")


def _load_after_one_more(node: Node) -> float:
    return (len(node.members) + 1) / len(node.occupant)


@dataclass(frozen=True, slots=True)
class Objective:
    mode: str = "max"  # "max" or "min": the direction in which the metric improves

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise HermesError(f"mode must be 'max' or 'min', got {self.mode!r}")

    def score(self, value: float) -> float:
        """The value turned so that higher is better; a non-finite value is the worst score."""
        if not math.isfinite(value):
            return -math.inf
        return value if self.mode == "max" else -value

    def value(self, score: float) -> float:
        """The metric's value that has this score (the inverse of ``score`` for finite values)."""
        return score if self.mode == "max" else -score


class Scheduler:
    def __init__(
        self,
        policy: SchedulingPolicy,
        *,
        objective: Objective | None = None,
        stopper: EarlyStopper | None = None,
        max_trials_per_gpu: int | None = None,
        max_failures: int = 0,
    ) -> None:
        if max_trials_per_gpu is not None and max_trials_per_gpu < 1:
            raise HermesError(f"max_trials_per_gpu must be at least 1, got {max_trials_per_gpu}")
        if max_failures < 0:
            raise HermesError(f"max_failures must be at least 0, got {max_failures}")
        self.policy = policy
        # A trial that crashes after reporting runs again from its checkpoint, up to this many times.
        self.max_failures = max_failures
        self.objective = objective or Objective()
        self.stopper = stopper
        # A policy without time-sharing runs one trial per GPU: the rest wait unplaced, and the trial placed is the
        # next to start, so the policy's best is placed first (``_best_unplaced``).
        self.trials_per_gpu = max_trials_per_gpu if policy.time_sharing else 1
        self.trials: dict[str, Trial] = {}
        self.cluster = Cluster()
        self.node_schedulers: dict[str, NodeScheduler] = {}
        self.unplaced: dict[str, Trial] = {}  # in arrival order
        # Unplaced trials sorted by a policy without time-sharing that promises a time-invariant order, for the
        # ``order_version`` it is valid for (as ``NodeScheduler`` keeps its waiting trials)
        self._queue: list[Trial] = []
        self._queue_for: int | None = None
        self.submissions_open = True
        self.finished = False
        self._unfinished = 0  # trials not yet terminal
        self._busy = 0  # trials holding a GPU
        self._last_time = 0.0
        self._replaying = False  # in ``replay``: the log's decisions, not the policy's, say who runs where
        self.reclaimed: set[str] = set()  # GPUs a shared pool takes back once their trials release them
        self._avoiding: dict[str, str] = {}  # trial -> the node its last run crashed on, until it reports elsewhere
        self._stopped_by_cancel: list[str] = []  # the trials the last cancellation stopped (``to_run_again``)
        plugin_call(policy, "attach", self.trials)

    @property
    def busy(self) -> int:
        """Trials holding a GPU."""
        return self._busy

    @property
    def unfinished(self) -> int:
        """Trials not yet terminal: those holding a GPU and those waiting for one."""
        return self._unfinished

    def restore_policy(self, policy: SchedulingPolicy, state: dict[str, Any]) -> None:
        """Continue with ``policy`` in the state another instance saved (``state_dict``), mid-run."""
        plugin_call(policy, "load_state_dict", state)
        plugin_call(policy, "attach", self.trials)
        self.policy = policy
        self._queue_for = None
        for node_scheduler in self.node_schedulers.values():
            node_scheduler.policy = policy

    # ------------------------------------------------------------------ events in, decisions out
    def handle(self, event: Event) -> list[Decision]:
        """Apply one event and return what the executor must do about it, in order.

        A plug-in that fails partway raises its ``PluginError`` with ``decisions``: what the core decided about the
        event before, and counts as done (a trial started on one node before the policy failed on the next). A host
        that goes on after the error (a pool retires the experiment) carries them out first, or a trial that the core
        believes holds a GPU never runs, and never answers the Stop that would end it."""
        self._refuse_if_finished(event)
        self._last_time = event.at
        decisions: list[Decision] = []
        try:
            decisions = self._handlers[type(event)](self, event)
            if not self.submissions_open and not self._busy:
                decisions += self._finish()
        except PluginError as error:
            carry(error, decisions)
            raise
        return decisions

    def replay(self, event: Event, decided: Sequence[Decision]) -> None:
        """Apply a logged event with the decisions that were made about it then, instead of deciding anew.

        Recovery rebuilds the core this way, so that a log another version of Hermes wrote (another
        policy, other defaults) still gives the state it describes: the policy and the stopper see
        every report as before, but who ran where, and who was suspended or stopped, is what the
        log says. Trials that wait between runs stay unplaced (placing them is no decision); a
        recovered core loses the old run's nodes first anyway, which unplaces every trial."""
        self._refuse_if_finished(event)
        self._last_time = event.at
        self._replaying = True
        try:
            self._handlers[type(event)](self, event)
        finally:
            self._replaying = False
        for decision in decided:
            self._carry_out(decision, event.at)
        if not self.submissions_open and not self._busy and not self._unfinished:
            self.finished = True

    def _carry_out(self, decision: Decision, now: float) -> None:
        """What the core does when it makes ``decision`` itself, for a decision read from a log."""
        trial = self._trial(decision.trial_id)
        if type(decision) is Suspend:
            trial.move_to(SUSPENDING)
        elif type(decision) is Stop:
            if trial.stop_requested or trial.state.is_terminal:
                raise HermesError(f"trial {trial.trial_id} stopped while {trial.state.value}")
            self._stop(trial)
        else:
            node = self.cluster.node_of(decision.gpu)
            holder = node.occupant[decision.gpu]
            if holder is not None or not trial.waiting:
                raise HermesError(f"trial {trial.trial_id} ({trial.state.value}) given GPU {decision.gpu}, which "
                                  f"{'trial ' + holder.trial_id if holder else 'nobody'} holds")
            if trial.node != node.name:
                self._leave_node(trial)
                trial.node = node.name
                node.members[trial.trial_id] = trial
            node.occupant[decision.gpu] = trial
            trial.begin_run(decision.gpu, now)
            self._busy += 1

    def _on_submitted(self, event: TrialSubmitted) -> list[Decision]:
        if not self.submissions_open:
            raise HermesError(f"trial {event.trial_id} submitted after submissions were closed")
        if event.trial_id in self.trials:
            raise HermesError(f"trial {event.trial_id} submitted twice")
        if event.budget < 1:
            raise HermesError(f"trial {event.trial_id}: budget must be at least 1 step, got {event.budget}")
        # read-only, so that a policy cannot change what the store records as the trial's hyper-parameters
        params = MappingProxyType(dict(event.params))
        trial = Trial(event.trial_id, len(self.trials), event.budget, event.at, params, event.movable)
        trial.idle_since = event.at
        self.trials[trial.trial_id] = trial
        self.unplaced[trial.trial_id] = trial
        if self._queue_for is not None and self._queue_for == self.policy.order_version:
            insort_by_priority(self._queue, trial, self.policy, event.at)
        self._unfinished += 1
        return self._place_and_fill(event.at, set())

    def _on_reported(self, event: TrialReported) -> list[Decision]:
        trial = self.trials.get(event.trial_id) or self._trial(event.trial_id)
        if trial.state not in HOLDING_GPU:
            raise HermesError(f"trial {trial.trial_id} reported while {trial.state.value}")
        if event.step <= trial.step:
            raise HermesError(f"trial {trial.trial_id} reported step {event.step} after step {trial.step}")
        trial.record(event.step, event.value, self.objective.score(event.value), event.at)
        self._avoiding.pop(trial.trial_id, None)  # it runs well elsewhere
        if event.checkpointed:
            trial.checkpoint_step = event.step
        if trial.stop_requested:
            return []
        verdict = self._observe(trial, event.at)
        if self._replaying or event.step == trial.budget:
            return []  # the log says what followed; or, at its budget, it exits by itself
        if verdict is STOP or event.step > trial.budget:  # past its budget: it ignores it, and ends here
            return self._stop(trial)
        if trial.state is SUSPENDING:
            return []  # it is leaving its GPU already
        node_scheduler = self.node_schedulers[trial.node]
        if verdict is PAUSE:
            return node_scheduler.suspend(trial)
        return node_scheduler.review(trial, event.at)

    def _observe(self, trial: Trial, now: float) -> Verdict:
        """The policy's verdict on the trial's report, and the stopper's; what either raises, or an answer of the
        wrong kind (the string "stop" equals STOP, "no" is true: either is a bug), is the plug-in's ``PluginError``."""
        policy = self.policy
        try:
            verdict = policy.observe(trial, now)
        except Exception as error:
            raise plugin_raised(policy, "observe", error, trial) from error
        if type(verdict) is not Verdict:
            raise plugin_answered(policy, "observe", trial, verdict, "a Verdict (Verdict.CONTINUE, PAUSE or STOP)")
        stopper = self.stopper
        if stopper is not None and checked_should_stop(stopper, trial):
            return STOP
        return verdict

    def _on_suspended(self, event: TrialSuspended) -> list[Decision]:
        trial = self._trial(event.trial_id)
        if trial.state is not SUSPENDING:
            raise HermesError(f"trial {trial.trial_id} suspended while {trial.state.value}")
        trial.checkpoint_step = trial.step = event.step
        node = self._release_gpu(trial, event.at)
        if trial.stop_requested:  # told to stop while suspending: the Stop drops the checkpoint
            trial.move_to(COMPLETED if trial.step >= trial.budget else STOPPED)
            self._retire(trial)
            return self._place_and_fill(event.at, {node})
        trial.move_to(SUSPENDED)
        self.node_schedulers[node.name].add_waiting(trial, event.at)
        return self._fill(self.node_schedulers[node.name], event.at)

    def _on_exited(self, event: TrialExited) -> list[Decision]:
        trial = self._trial(event.trial_id)
        if trial.stop_requested:
            outcome = COMPLETED if trial.step >= trial.budget else STOPPED  # stopped once it trained its budget
        elif (event.succeeded and trial.steps) or (event.crashed and trial.step >= trial.budget):
            outcome = COMPLETED  # a crash after its last step (a CUDA or NCCL teardown) loses nothing of it
            if not event.succeeded:  # but it is said: a final save of the model may be what failed
                trial.error = f"after its last step: {event.error}"
        elif event.crashed and trial.crashes < self.max_failures and (
            trial.state in HOLDING_GPU or trial.state is SUSPENDED
        ) and (trial.steps or self._may_try_elsewhere(trial)):
            return self._run_again(trial, event.at)
        else:  # failed, or ended without a single report: nothing to rank it by, most likely a mistake
            outcome = FAILED
            trial.error = event.error if not event.succeeded else NO_REPORT
            if event.crashed and trial.crashes:
                trial.error = (f"{trial.error}\n(its runs crashed {trial.crashes + 1} times; trial.max_failures is "
                               f"{self.max_failures})")
        node = self.cluster.nodes.get(trial.node) if trial.node is not None else None
        if trial.state in HOLDING_GPU:
            self._release_gpu(trial, event.at)
        trial.move_to(outcome)
        self._retire(trial)
        return self._place_and_fill(event.at, {node} if node is not None else set())

    def _run_again(self, trial: Trial, now: float) -> list[Decision]:
        """A run that crashed after reports falls back to its checkpoint, as on a lost GPU, and waits to run
        again (a transient fault: a flaky device, the out-of-memory killer, a node's hiccup). A process that
        held its state is gone with it, so an unmovable trial may run anywhere. A suspended run may crash
        too: a stopped process keeps its memory, which makes it the out-of-memory killer's likeliest pick."""
        trial.crashes += 1
        if trial.state is SUSPENDED:  # waiting already, on its node
            node = self.cluster.nodes[trial.node]
        else:
            node = self._release_gpu(trial, now)
        if not trial.movable:
            trial.last_gpu = None
        if trial.state is SUSPENDED:
            trial.step = trial.catch_up_step
            self.node_schedulers[node.name].add_waiting(trial, now)
        else:
            self._fall_back(trial, now)
        touched = {node}
        elsewhere = self._elsewhere(trial, node)
        if elsewhere is not None:  # the crash may be its node's (a bad host): it runs again on another
            self._avoiding[trial.trial_id] = node.name
            del node.members[trial.trial_id]
            self._join(trial, elsewhere)
            touched.add(elsewhere)
        return self._place_and_fill(now, touched)

    def _elsewhere(self, trial: Trial, node: Node) -> Node | None:
        """Where a crashed trial runs again instead of ``node``: the least loaded other node, when it may move and
        trials time-share (without time-sharing, a node takes no more members than GPUs)."""
        if not trial.movable or self.trials_per_gpu is not None:
            return None
        return self._least_loaded_with_room(besides=node)

    def _may_try_elsewhere(self, trial: Trial) -> bool:
        """A crash before the first report fails the trial at once (a typo would crash again), unless its node may
        be at fault: then it runs once more, on another node."""
        node = self.cluster.nodes.get(trial.node) if trial.node is not None else None
        return trial.crashes == 0 and node is not None and self._elsewhere(trial, node) is not None

    def _on_period(self, event: PeriodElapsed) -> list[Decision]:
        decisions: list[Decision] = []
        if self._replaying:
            return decisions
        try:
            for node_scheduler in self.node_schedulers.values():
                for trial in list(node_scheduler.node.occupant.values()):
                    if trial is not None:
                        decisions += node_scheduler.review(trial, event.at)
        except PluginError as error:
            carry(error, decisions)
            raise
        return decisions

    def _on_node_added(self, event: NodeAdded) -> list[Decision]:
        node = self.cluster.add_node(event.node, event.gpus)
        self.node_schedulers[node.name] = NodeScheduler(node, self.policy)
        return self._place_and_fill(event.at, {node})

    def _on_node_removed(self, event: NodeRemoved) -> list[Decision]:
        node = self.cluster.remove_node(event.node)
        self.reclaimed.difference_update(node.occupant)
        del self.node_schedulers[node.name]
        for trial in node.members.values():
            if trial.state in HOLDING_GPU:
                self._lose(trial, event.at)
            trial.node = None
            if not trial.state.is_terminal:
                self.unplaced[trial.trial_id] = trial
        self._lose_processes(node.occupant.keys(), node.members.values())
        self.unplaced = dict(sorted(self.unplaced.items(), key=lambda item: item[1].seq))
        self._queue_for = None  # trials came back unplaced: the queue is sorted again
        return self._place_and_fill(event.at, set())

    def _on_gpu_added(self, event: GpuAdded) -> list[Decision]:
        self.cluster.add_gpu(event.node, event.gpu)
        return self._place_and_fill(event.at, {self.cluster.nodes[event.node]})

    def _on_gpu_removed(self, event: GpuRemoved) -> list[Decision]:
        self.reclaimed.discard(event.gpu)
        node, trial = self.cluster.remove_gpu(event.gpu)
        if trial is not None:
            self.node_schedulers[node.name].release(trial)
            self._lose(trial, event.at)
        self._lose_processes({event.gpu}, node.members.values())
        self._unplace_if_empty(node)
        return self._place_and_fill(event.at, {node} | set(self.cluster.nodes.values()))

    def _on_gpu_reclaimed(self, event: GpuReclaimed) -> list[Decision]:
        node = self.cluster.node_of(event.gpu)
        trial = node.occupant[event.gpu]
        if trial is None:  # free: it leaves now, and whatever waited for it still waits elsewhere
            self.cluster.remove_gpu(event.gpu)
            self._unplace_if_empty(node)
            return self._place_and_fill(event.at, set(self.cluster.nodes.values()))
        self.reclaimed.add(event.gpu)
        if event.preempt and trial.state is RUNNING and not trial.stop_requested and not self._replaying:
            return self.node_schedulers[node.name].suspend(trial)
        return []  # it is leaving already

    def _unplace_if_empty(self, node: Node) -> None:
        """A node without GPUs cannot run its trials: they wait unplaced, to go wherever GPUs are."""
        if not node.occupant:
            for member in node.members.values():
                member.node = None
                self.unplaced[member.trial_id] = member
            node.members.clear()
            self.unplaced = dict(sorted(self.unplaced.items(), key=lambda item: item[1].seq))
            self._queue_for = None  # as in ``_on_node_removed``

    def _on_submissions_closed(self, event: SubmissionsClosed) -> list[Decision]:
        self._close_submissions(True)
        return []

    def _on_reopened(self, event: SubmissionsReopened) -> list[Decision]:
        """A larger budget undoes the last cancellation: the trials it stopped run again, those that never ran
        too, which a spent time budget had stopped before they started."""
        self._close_submissions(False)
        self.finished = False
        for trial in self.to_run_again:
            if trial.state is STOPPED:  # ended: a runner reopens once the old run's nodes are lost, which ends all
                trial.run_again()
                trial.node = None  # it left its node as it ended
                self.unplaced[trial.trial_id] = trial
                self._unfinished += 1
        self._stopped_by_cancel = []
        self.unplaced = dict(sorted(self.unplaced.items(), key=lambda item: item[1].seq))
        self._queue_for = None  # as in ``_unplace_if_empty``
        return self._place_and_fill(event.at, set())

    def _on_cancelled(self, event: ExperimentCancelled) -> list[Decision]:
        self._close_submissions(True)
        stopping = [trial for trial in self.trials.values() if not trial.state.is_terminal and not trial.stop_requested]
        self._stopped_by_cancel = [trial.trial_id for trial in stopping]  # the log's Stops, handled or replayed
        decisions: list[Decision] = []
        if self._replaying:
            return decisions
        for trial in stopping:
            decisions += self._stop(trial)
        return decisions

    @property
    def to_run_again(self) -> list[Trial]:
        """The trials that the last cancellation stopped, which a reopening runs again, but those that completed
        their budget as they stopped. One still stopping when a runner continues the experiment ends stopped as the
        old run's nodes are lost, before the reopening."""
        trials = (self.trials[trial_id] for trial_id in self._stopped_by_cancel)
        return [trial for trial in trials if trial.state is not COMPLETED]

    def _close_submissions(self, closed: bool) -> None:
        self.submissions_open = not closed
        try:
            self.policy.submissions_closed(closed)
        except Exception as error:
            raise plugin_raised(self.policy, "submissions_closed", error) from error

    def _refuse_if_finished(self, event: Event) -> None:
        """A finished core takes only a reopening, and the loss of nodes: a runner that continues a finished
        experiment with a larger budget loses the old run's nodes before it reopens, so that no new trial is
        started on a node that is gone (its slot's process ran on, and the trial was counted as crashed)."""
        if self.finished and type(event) not in (SubmissionsReopened, NodeRemoved):
            raise HermesError(f"the experiment is finished; cannot handle {type(event).__name__}")

    _handlers = {
        TrialSubmitted: _on_submitted,
        TrialReported: _on_reported,
        TrialSuspended: _on_suspended,
        TrialExited: _on_exited,
        PeriodElapsed: _on_period,
        NodeAdded: _on_node_added,
        NodeRemoved: _on_node_removed,
        GpuAdded: _on_gpu_added,
        GpuRemoved: _on_gpu_removed,
        GpuReclaimed: _on_gpu_reclaimed,
        SubmissionsClosed: _on_submissions_closed,
        SubmissionsReopened: _on_reopened,
        ExperimentCancelled: _on_cancelled,
    }

    # ------------------------------------------------------------------ global placement
    def _place_and_fill(self, now: float, touched: set[Node]) -> list[Decision]:
        """Place what waits unplaced, even out the load, and fill free GPUs of the nodes that changed.

        ``touched`` are the nodes this event changed (a GPU freed, a member left, a node or GPU
        joined): only they can have gained room or lost load, so only they need attention.
        """
        if self._replaying:
            return []
        touched |= self._place()
        touched |= self._rebalance(now, touched)
        decisions: list[Decision] = []
        try:
            for node in sorted(touched, key=lambda n: n.name):  # a fixed order keeps decision logs reproducible
                if node.name in self.node_schedulers:
                    decisions += self._fill(self.node_schedulers[node.name], now)
        except PluginError as error:
            carry(error, decisions)
            raise
        return decisions

    def _fill(self, node_scheduler: NodeScheduler, now: float) -> list[Decision]:
        if self._replaying:
            return []
        try:
            decisions = node_scheduler.fill(now)
        except PluginError as error:
            self._busy += len(error.decisions)  # the runs it began before the plug-in failed (``carry``)
            raise
        self._busy += len(decisions)
        return decisions

    def _has_room(self, node: Node) -> bool:
        return bool(node.occupant) and (
            self.trials_per_gpu is None or len(node.members) < self.trials_per_gpu * len(node.occupant)
        )

    def _place(self) -> set[Node]:
        """Put unplaced trials on the least loaded nodes that have room: in arrival order; without time-sharing, the
        policy's best first (one it says not now to waits)."""
        touched: set[Node] = set()
        while self.unplaced:
            node = self._least_loaded_with_room()
            if node is None:
                break
            trial = next(iter(self.unplaced.values())) if self.policy.time_sharing else self._best_unplaced()
            if trial is None:
                break
            del self.unplaced[trial.trial_id]
            self._join(trial, node)
            touched.add(node)
        return touched

    def _best_unplaced(self) -> Trial | None:
        """The unplaced trial the policy ranks first (ties: the earlier arrival), None if it says not now to all: a
        scan, or the sorted queue where the policy promises a time-invariant order (a scan per placement would take
        time quadratic in the trials waiting)."""
        policy, unplaced, now = self.policy, self.unplaced, self._last_time
        if policy.order_version is None:
            best, best_priority = None, 0.0
            for trial in unplaced.values():
                priority = checked_priority(policy, trial, now)
                if priority is not None and (best is None or priority > best_priority):
                    best, best_priority = trial, priority
            return best
        if self._queue_for != policy.order_version:
            entries = []
            for trial in unplaced.values():
                priority = checked_priority(policy, trial, now)
                if priority is not None:
                    entries.append((-priority, trial.seq, trial))
            entries.sort()  # by (-priority, seq); seqs are unique, so trials are never compared
            self._queue = [trial for _, _, trial in entries]
            self._queue_for = policy.order_version
        queue = self._queue
        while queue and queue[0].trial_id not in unplaced:
            queue.pop(0)  # placed or ended since
        for trial in queue:
            if trial.trial_id in unplaced and checked_priority(policy, trial, now) is not None:
                return trial
        return None

    def _least_loaded_with_room(self, besides: Node | None = None) -> Node | None:
        """The node with room (``besides`` left out) that one more trial would load least, the first of equals.

        A plain loop, as in ``_most_loaded``: it runs at every submission, over every node."""
        least, least_load = None, math.inf
        for node in self.cluster.nodes.values():
            if node is not besides and self._has_room(node):
                load = (len(node.members) + 1) / len(node.occupant)
                if load < least_load:
                    least, least_load = node, load
        return least

    def _rebalance(self, now: float, targets: set[Node]) -> set[Node]:
        """Migrate waiting trials from the most loaded node to each target while that evens the load.

        Only a target below the mean load pulls trials, and the mean costs nothing to compute, so
        the search for the most loaded node is skipped in the common, balanced case.
        """
        moved_to: set[Node] = set()
        gpus = self.cluster.gpu_count
        if len(self.cluster.nodes) < 2 or not gpus:
            return moved_to
        for target in sorted(targets, key=lambda n: n.name):
            while target.name in self.cluster.nodes and self._has_room(target):
                mean = (self._unfinished - len(self.unplaced)) / gpus
                if target.load >= mean:
                    break
                source = self._most_loaded()
                if source is target or _load_after_one_more(target) > (len(source.members) - 1) / len(source.occupant):
                    break
                avoiding = [trial_id for trial_id, node in self._avoiding.items() if node == target.name]
                movable = self.node_schedulers[source.name].ranked_waiting(now, 1, exclude=avoiding)
                if not movable:
                    break
                trial = movable[0][1]
                del source.members[trial.trial_id]
                self._join(trial, target)
                moved_to.add(target)
        return moved_to

    def _most_loaded(self) -> Node:
        """The node with the most trials per GPU, the first of equals (nodes without GPUs aside).

        A plain loop: it runs after most exits, over every node, and ``max`` with a key function
        costs twice as much."""
        most, most_load = None, -1.0
        for node in self.cluster.nodes.values():
            if node.occupant:
                load = len(node.members) / len(node.occupant)
                if load > most_load:
                    most, most_load = node, load
        assert most is not None, "called with GPUs in the cluster"
        return most

    def _join(self, trial: Trial, node: Node) -> None:
        trial.node = node.name
        node.members[trial.trial_id] = trial
        if trial.waiting:
            self.node_schedulers[node.name].add_waiting(trial, self._last_time)

    # ------------------------------------------------------------------ helpers
    def _trial(self, trial_id: str) -> Trial:
        try:
            return self.trials[trial_id]
        except KeyError:
            raise HermesError(f"unknown trial {trial_id}") from None

    def _release_gpu(self, trial: Trial, now: float) -> Node:
        gpu = trial.gpu
        node = self.cluster.node_of(gpu)
        node.occupant[gpu] = None
        self.node_schedulers[node.name].release(trial)
        trial.end_run(now)
        self._busy -= 1
        if self.reclaimed and gpu in self.reclaimed:  # the pool takes it back instead of this experiment refilling it
            self.reclaimed.discard(gpu)
            self.cluster.remove_gpu(gpu)
            self._unplace_if_empty(node)
        return node

    def _lose(self, trial: Trial, now: float) -> None:
        """The trial's process died with its GPU or node: it falls back to its last checkpoint."""
        trial.end_run(now)
        self._busy -= 1
        if trial.stop_requested:
            trial.move_to(STOPPED)
            self._retire(trial)
            return
        self._fall_back(trial, now)

    def _fall_back(self, trial: Trial, now: float) -> None:
        """Its run is gone without a suspension: it waits again from its last checkpoint (one that is not movable
        starts again from its beginning, and catches up every step it reported)."""
        trial.move_to(SUSPENDED)
        trial.step = trial.catch_up_step
        if trial.node in self.node_schedulers:
            self.node_schedulers[trial.node].add_waiting(trial, now)

    @staticmethod
    def _lose_processes(gpus: Collection[str], trials: Iterable[Trial]) -> None:
        """A trial that is not movable keeps its state in a process on its last GPU; when that GPU goes (one
        of ``gpus``, which left with their node or alone), so does the process. Nothing ties it to a GPU any more, or it would wait for ever: its executor runs
        it again from the beginning wherever it is given room, catching up to the step the core knows."""
        for trial in trials:
            if not trial.movable and trial.last_gpu in gpus:
                trial.last_gpu = None

    def _retire(self, trial: Trial) -> None:
        """A terminal trial leaves its node."""
        self._avoiding.pop(trial.trial_id, None)
        self._leave_node(trial)
        self._unfinished -= 1

    def _leave_node(self, trial: Trial) -> None:
        """Out of its node's members, or of the trials waiting unplaced."""
        node = self.cluster.nodes.get(trial.node) if trial.node is not None else None
        if node is not None:
            node.members.pop(trial.trial_id, None)
        self.unplaced.pop(trial.trial_id, None)

    def _stop(self, trial: Trial) -> list[Decision]:
        if trial.state in HOLDING_GPU:
            trial.stop_requested = True
        else:
            trial.move_to(STOPPED)
            self._retire(trial)
        return [Stop(trial.trial_id)]

    def _finish(self) -> list[Decision]:
        """Submissions are closed and no GPU is busy: whatever still waits is not runnable, so stop it. No event is left
        to ask the policy again: a trial it said not now to before it ever ran says so in its error (``held_back``);
        one that ran was paused by it, as asha's trials not promoted are, and ends stopped as such."""
        if self._unfinished and not self.cluster.gpu_count:
            return []  # wait for GPUs to come back
        decisions: list[Decision] = []
        self._place()  # a priority may have changed meanwhile: one that was not now, of a trial unplaced
        try:
            for node_scheduler in self.node_schedulers.values():
                decisions += self._fill(node_scheduler, self._last_time)  # or placed
        except PluginError as error:
            carry(error, decisions)
            raise
        if decisions:
            return decisions
        unfinished = [trial for trial in self.trials.values() if not trial.state.is_terminal]
        held = {trial.trial_id for trial in unfinished
                if trial.started_at is None and checked_priority(self.policy, trial, self._last_time) is None}
        for trial in unfinished:  # the policy asked first, so that its failure loses no Stop
            if trial.trial_id in held:
                trial.error = held_back(self.policy)  # the run prints and stores it: whose doing the stop is
            decisions += self._stop(trial)
        self.finished = True
        return decisions
