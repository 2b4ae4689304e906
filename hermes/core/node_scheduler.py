"""Node level of the two-level scheduler: time-slices the GPUs of one node.

At every step boundary or period it picks, for each GPU of its node, which of the node's trials
runs, by the policy's priority, and preempts a trial whose turn is over when a better one waits.
A GPU that frees goes to a trial whose state it holds where the policy's migration penalty allows:
a resume on another GPU spills the state to disk and back.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from operator import itemgetter

from hermes.core.cluster import Node
from hermes.core.decisions import Decision, Resume, Start, Suspend
from hermes.core.states import PENDING, RUNNING, SUSPENDING
from hermes.core.trial import Trial
from hermes.core.policy import (
    PluginError,
    SchedulingPolicy,
    checked_migration_penalty,
    checked_priority,
    checked_turn_over,
)


class NodeScheduler:
    def __init__(self, node: Node, policy: SchedulingPolicy) -> None:
        self.node = node
        self.policy = policy
        # suspending trial -> the waiting trial it yields to, so that two GPUs are not both
        # preempted for the same challenger.
        self.claims: dict[str, str] = {}
        # Waiting trials sorted once, for policies that promise a time-invariant order
        # (SchedulingPolicy.order_version); kept up to date by add_waiting, rebuilt when the counter moves.
        self._sorted: list[Trial] = []
        self._listed: set[Trial] = set()  # the trials in _sorted, some of them no longer waiting here
        self._sorted_for: int | None = None  # the order_version the sort is valid for

    def ranked_waiting(
        self,
        now: float,
        limit: int,
        free: list[str] | None = None,
        exclude: Collection[str] = (),
        home: str | None = None,
    ) -> list[tuple[float, Trial]]:
        """The ``limit`` best runnable waiting trials with their priorities, best first.

        Ties go to the earlier arrival. With ``free``, only trials that may run on one of those
        GPUs; without it, only trials that may leave their GPU (movable, or never started). With
        ``home``, only trials that never ran or left that GPU.
        """
        policy = self.policy
        if policy.order_version is not None:
            return self._from_sorted(now, limit, free, exclude, home)
        if limit == 1:  # the common case: one pass, no list
            best_priority, best = 0.0, None
            for trial in self.node.members.values():
                if not trial.waiting or (exclude and trial.trial_id in exclude):
                    continue
                if not (trial.movable or trial.last_gpu is None or (free is not None and trial.last_gpu in free)):
                    continue
                if home is not None and trial.last_gpu is not None and trial.last_gpu != home:
                    continue
                priority = checked_priority(policy, trial, now)
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
            if home is not None and trial.last_gpu is not None and trial.last_gpu != home:
                continue
            priority = checked_priority(policy, trial, now)
            if priority is not None:
                ranked.append((-priority, trial.seq, trial))
        return [(-key, trial) for key, _, trial in heapq.nsmallest(limit, ranked, key=_rank_key)]

    def _from_sorted(
        self, now: float, limit: int, free: list[str] | None, exclude: Collection[str], home: str | None
    ) -> list[tuple[float, Trial]]:
        """``ranked_waiting`` from the cached order: trials that stopped waiting are skipped lazily."""
        policy = self.policy
        key = policy.order_version
        if self._sorted_for != key:
            entries = []
            for trial in self.node.members.values():
                if trial.waiting:
                    priority = checked_priority(policy, trial, now)
                    if priority is not None:
                        entries.append((-priority, trial.seq, trial))
            entries.sort()  # by (-priority, seq); seqs are unique, so trials are never compared
            self._sorted = [trial for _, _, trial in entries]
            self._listed = set(self._sorted)
            self._sorted_for = key
        chosen: list[tuple[float, Trial]] = []
        members = self.node.members
        ordered = self._sorted
        while ordered and (not ordered[0].waiting or ordered[0].trial_id not in members):
            self._listed.discard(ordered.pop(0))  # started or gone since the sort: add_waiting brings it back
        for trial in ordered:
            if not trial.waiting or trial.trial_id not in members or trial.trial_id in exclude:
                continue
            if not (trial.movable or trial.last_gpu is None or (free is not None and trial.last_gpu in free)):
                continue
            if home is not None and trial.last_gpu is not None and trial.last_gpu != home:
                continue
            priority = checked_priority(policy, trial, now)
            if priority is None:
                continue
            chosen.append((priority, trial))
            if len(chosen) == limit:
                break
        return chosen

    def add_waiting(self, trial: Trial, now: float) -> None:
        """``trial`` joined this node or became waiting on it: put it in the cached order, if any.

        Under a time-invariant order the cached list is still sorted by the priorities of ``now``,
        so a binary search with live priorities finds its place."""
        if self._sorted_for is None or self._sorted_for != self.policy.order_version:
            return  # no valid cache: the next query sorts everything anyway
        ordered = self._sorted
        if trial in self._listed:
            ordered.remove(trial)  # a stale entry from an earlier wait
            self._listed.discard(trial)
        if insort_by_priority(ordered, trial, self.policy, now):
            self._listed.add(trial)

    def fill(self, now: float) -> list[Decision]:
        """Give every free GPU to the best waiting trials, each on its last GPU when that is free. A plug-in that fails
        in a later pass carries the Starts and Resumes of the earlier ones (``carry``)."""
        free = self.node.free_gpus()
        if not free:
            return []
        decisions: list[Decision] = []
        try:
            while free:
                placed = False
                for priority, trial in self.ranked_waiting(now, len(free), free):
                    if not trial.waiting:
                        continue  # a GPU's own trial placed in this pass ahead of its rank
                    if trial.last_gpu in free:
                        gpu = trial.last_gpu
                    elif trial.movable or trial.last_gpu is None:
                        gpu = free[0]
                        if trial.last_gpu is not None:
                            trial = self._own_trial(gpu, priority, trial, now)
                    else:
                        continue  # its own GPU went to a better trial in this pass; look again for the rest
                    free.remove(gpu)
                    self.node.occupant[gpu] = trial
                    fresh = trial.state is PENDING
                    migrated = trial.begin_run(gpu, now)
                    decisions.append(Start(trial.trial_id, gpu) if fresh else Resume(trial.trial_id, gpu, migrated))
                    placed = True
                if not placed:
                    break
        except PluginError as error:
            carry(error, decisions)
            raise
        return decisions

    def _own_trial(self, gpu: str, priority: float, trial: Trial, now: float) -> Trial:
        """The trial to put on free ``gpu`` instead of ``trial`` (best, of ``priority``, but it left another GPU): the
        best that left this one or never ran, where its priority is within the migration's price
        (``SchedulingPolicy.migration_penalty``) of ``trial``'s. A migration spills the state to disk."""
        penalty = checked_migration_penalty(self.policy, trial, now)
        if not penalty:
            return trial
        own = self.ranked_waiting(now, 1, [gpu], home=gpu)
        if own and own[0][0] >= priority - penalty:
            return own[0][1]
        return trial

    def release(self, trial: Trial) -> None:
        """``trial`` left its GPU: its claim, if any, is settled."""
        self.claims.pop(trial.trial_id, None)

    def review(self, trial: Trial, now: float) -> list[Decision]:
        """Preempt running ``trial`` if its turn is over and a better trial waits on this node. One that reported its
        budget's last step is ending (a final evaluation, its last save): preempted, it held its memory stopped, and
        its end waited a round of turns (an unmodified program's final phase was stopped and resumed for minutes)."""
        policy = self.policy
        if not policy.time_sharing or trial.state is not RUNNING or trial.stop_requested or trial.step >= trial.budget:
            return []
        if not checked_turn_over(policy, trial, now):
            return []
        best = self.ranked_waiting(now, 1, [trial.gpu], self.claims.values())
        if not best:
            return []
        challenger_priority, challenger = best[0]
        mine = checked_priority(policy, trial, now)
        if mine is not None and (mine, -trial.seq) > (challenger_priority, -challenger.seq):
            return []
        self.claims[trial.trial_id] = challenger.trial_id
        return self.suspend(trial)

    def suspend(self, trial: Trial) -> list[Decision]:
        trial.move_to(SUSPENDING)
        return [Suspend(trial.trial_id)]


def carry(error: PluginError, decisions: list[Decision]) -> None:
    """``decisions`` were made in the event before the plug-in failed (``error``): the error carries them, ahead of
    those made since, as ``error.decisions``. The core counts those trials as running or suspending, so the host must
    carry them out (``Scheduler.handle``), or the executor never runs a trial that the core believes holds a GPU."""
    error.decisions = decisions + error.decisions


def insort_by_priority(ordered: list[Trial], trial: Trial, policy: SchedulingPolicy, now: float) -> bool:
    """Put ``trial`` into ``ordered`` (sorted by a time-invariant order, ``SchedulingPolicy.order_version``) where
    a binary search with live priorities finds its place; False, and left out, where the policy says not now."""
    priority = checked_priority(policy, trial, now)
    if priority is None:
        return False
    low, high = 0, len(ordered)
    while low < high:
        middle = (low + high) // 2
        other = ordered[middle]
        other_priority = checked_priority(policy, other, now)
        if other_priority is None or (-other_priority, other.seq) > (-priority, trial.seq):
            high = middle
        else:
            low = middle + 1
    ordered.insert(low, trial)
    return True


_rank_key = itemgetter(0, 1)  # (-priority, seq) of a (-priority, seq, trial) entry
