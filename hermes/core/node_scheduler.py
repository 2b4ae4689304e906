"""Node level of the two-level scheduler: time-slices the GPUs of one node.

At every step boundary or period it picks, for each GPU of its node, which of the node's trials
runs, by the policy's priority, and preempts a trial whose turn is over when a better one waits.
"""

from __future__ import annotations

from hermes.core.cluster import Node
from hermes.core.decisions import Decision, Resume, Start, Suspend
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.policies.base import SchedulingPolicy


class NodeScheduler:
    def __init__(self, node: Node, policy: SchedulingPolicy) -> None:
        self.node = node
        self.policy = policy
        # suspending trial -> the waiting trial it yields to, so that two GPUs are not both
        # preempted for the same challenger.
        self.claims: dict[str, str] = {}

    def ranked_waiting(self, now: float, limit: int, free: list[str] | None = None) -> list[Trial]:
        """The ``limit`` best runnable waiting trials, best first (ties to the earlier arrival).

        With ``free``, only trials that may run on one of those GPUs; without it, only trials
        that may leave this node (for migration).
        """
        ranked = []
        for trial in self.node.members.values():
            if trial.waiting and self._may_take(trial, free):
                priority = self.policy.priority(trial, now)
                if priority is not None:
                    ranked.append((-priority, trial.seq, trial))
        ranked.sort(key=lambda entry: entry[:2])
        return [trial for _, _, trial in ranked[:limit]]

    def fill(self, now: float) -> list[Decision]:
        """Give every free GPU to the best waiting trials, each on its last GPU when that is free."""
        free = self.node.free_gpus()
        if not free:
            return []
        decisions: list[Decision] = []
        for trial in self.ranked_waiting(now, len(free), free):
            if not free:
                break
            if trial.last_gpu in free:
                gpu = trial.last_gpu
            elif trial.movable or trial.last_gpu is None:
                gpu = free[0]
            else:
                continue  # its GPU was taken by a better trial of this same pass
            free.remove(gpu)
            self.node.occupant[gpu] = trial
            fresh = trial.state is TrialState.PENDING
            migrated = trial.begin_run(gpu, now)
            decisions.append(Start(trial.trial_id, gpu) if fresh else Resume(trial.trial_id, gpu, migrated))
        return decisions

    @staticmethod
    def _may_take(trial: Trial, free: list[str] | None) -> bool:
        if trial.movable or trial.last_gpu is None:
            return True
        return free is not None and trial.last_gpu in free

    def release(self, trial: Trial) -> None:
        """``trial`` left its GPU: its claim, if any, is settled."""
        self.claims.pop(trial.trial_id, None)

    def review(self, trial: Trial, now: float) -> list[Decision]:
        """Preempt running ``trial`` if its turn is over and a better trial waits on this node."""
        policy = self.policy
        if not policy.time_sharing or trial.state is not TrialState.RUNNING or not policy.turn_over(trial, now):
            return []
        claimed = set(self.claims.values())
        best: tuple[float, int, Trial] | None = None
        for other in self.node.members.values():
            if other.waiting and other.trial_id not in claimed and self._may_take(other, [trial.gpu]):
                priority = policy.priority(other, now)
                if priority is not None and (best is None or (-priority, other.seq) < best[:2]):
                    best = (-priority, other.seq, other)
        if best is None:
            return []
        mine = policy.priority(trial, now)
        if mine is not None and (-mine, trial.seq) < best[:2]:
            return []
        self.claims[trial.trial_id] = best[2].trial_id
        return self.suspend(trial)

    def suspend(self, trial: Trial) -> list[Decision]:
        trial.move_to(TrialState.SUSPENDING)
        return [Suspend(trial.trial_id)]
