"""Node level of the two-level scheduler: time-slices the GPUs of one node.

At every step boundary or period it picks, for each GPU of its node, which of the node's trials
runs, by the policy's priority, and preempts a trial whose turn is over when a better one waits.
"""

from __future__ import annotations

import heapq

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

    def ranked_waiting(
        self, now: float, limit: int, free: list[str] | None = None, exclude: frozenset[str] | set[str] = frozenset()
    ) -> list[tuple[float, Trial]]:
        """The ``limit`` best runnable waiting trials with their priorities, best first.

        Ties go to the earlier arrival. With ``free``, only trials that may run on one of those
        GPUs; without it, only trials that may leave their GPU (movable, or never started).
        """
        priority_of = self.policy.priority
        if limit == 1:  # the common case: one pass, no list
            best_priority, best = 0.0, None
            for trial in self.node.members.values():
                if not trial.waiting or (exclude and trial.trial_id in exclude):
                    continue
                if not (trial.movable or trial.last_gpu is None or (free is not None and trial.last_gpu in free)):
                    continue
                priority = priority_of(trial, now)
                if priority is not None and (
                    best is None or priority > best_priority or (priority == best_priority and trial.seq < best.seq)
                ):
                    best_priority, best = priority, trial
            return [] if best is None else [(best_priority, best)]
        ranked: list[tuple[float, int, Trial]] = []
        for trial in self.node.members.values():
            if not trial.waiting or trial.trial_id in exclude:
                continue
            if not (trial.movable or trial.last_gpu is None or (free is not None and trial.last_gpu in free)):
                continue
            priority = priority_of(trial, now)
            if priority is not None:
                ranked.append((-priority, trial.seq, trial))
        return [(-key, trial) for key, _, trial in heapq.nsmallest(limit, ranked, key=_rank_key)]

    def fill(self, now: float) -> list[Decision]:
        """Give every free GPU to the best waiting trials, each on its last GPU when that is free."""
        free = self.node.free_gpus()
        if not free:
            return []
        decisions: list[Decision] = []
        while free:
            placed = False
            for _, trial in self.ranked_waiting(now, len(free), free):
                if trial.last_gpu in free:
                    gpu = trial.last_gpu
                elif trial.movable or trial.last_gpu is None:
                    gpu = free[0]
                else:
                    continue  # its own GPU went to a better trial in this pass; look again for the rest
                free.remove(gpu)
                self.node.occupant[gpu] = trial
                fresh = trial.state is TrialState.PENDING
                migrated = trial.begin_run(gpu, now)
                decisions.append(Start(trial.trial_id, gpu) if fresh else Resume(trial.trial_id, gpu, migrated))
                placed = True
            if not placed:
                break
        return decisions

    def release(self, trial: Trial) -> None:
        """``trial`` left its GPU: its claim, if any, is settled."""
        self.claims.pop(trial.trial_id, None)

    def review(self, trial: Trial, now: float) -> list[Decision]:
        """Preempt running ``trial`` if its turn is over and a better trial waits on this node."""
        policy = self.policy
        if (
            not policy.time_sharing
            or trial.state is not TrialState.RUNNING
            or trial.stop_requested
            or not policy.turn_over(trial, now)
        ):
            return []
        best = self.ranked_waiting(now, 1, [trial.gpu], set(self.claims.values()))
        if not best:
            return []
        challenger_priority, challenger = best[0]
        mine = policy.priority(trial, now)
        if mine is not None and (mine, -trial.seq) > (challenger_priority, -challenger.seq):
            return []
        self.claims[trial.trial_id] = challenger.trial_id
        return self.suspend(trial)

    def suspend(self, trial: Trial) -> list[Decision]:
        trial.move_to(TrialState.SUSPENDING)
        return [Suspend(trial.trial_id)]


def _rank_key(entry: tuple[float, int, Trial]) -> tuple[float, int]:
    return entry[0], entry[1]
