"""One GPU pool shared by many experiments: the cluster level above each experiment's scheduler.

Every experiment keeps its own ``Scheduler`` (its trials, policy, stopper and objective), and
inside an experiment that policy alone decides which trial runs and when one yields. The pool
decides only which experiment each GPU serves. An experiment's scheduler sees the GPUs it holds
as its cluster: the pool grants a GPU with ``NodeAdded``/``GpuAdded`` and takes it back with
``GpuReclaimed``. Those are ordinary events of that experiment, so its log holds everything its
scheduler handled, and replaying the log rebuilds the experiment on its own (``hermes.pool``).

Events and decisions carry the experiment: at the pool's edge (the executor) trial ids are
qualified, ``"<experiment>.<trial>"`` (``qualify``); inside, each experiment sees its own ids.
``routed`` lists, after each call, every event an experiment handled with the decisions it made,
in its own terms: what a host records per experiment before it applies the pool's decisions.

Fair share. GPU seconds are divided between the experiments that want GPUs by weight: the pool
is split between owners by their weights, then each owner's part between their experiments by
the experiments' weights, none getting more than it can use (``share.nested_shares``). Each
experiment's *deficit* is the GPU time it was owed so far minus what it held; shares are real
numbers, and deficits carry the fractions over time, so GPU time follows the weights even when
the GPUs do not divide evenly.

- A GPU that becomes free (a trial suspends or ends) goes to the experiment most below its
  share: first one holding fewer GPUs than the whole part of its share, then the largest
  deficit, counting the GPUs on their way back to the pool as held by those they will go to.
  Under time-sharing GPUs free up every period, so shares are met without preemption.
- Rebalancing: when an experiment could run a trial on a freed GPU now and holds less than the
  whole part of its share, or is owed ``quantum`` GPU seconds, and no GPU is on its way, the pool
  reclaims a GPU from the experiment most above its share (when preempting for a deficit, one
  that has held at least its share so far), preempting that experiment's running trial of the
  lowest priority by its own policy.
- A trial that cannot move (an unmodified program, SIGSTOPped in place) can continue only on its
  own GPU: the pool never takes back a GPU such a trial runs on or waits on, stopped.
- A lone experiment gets the whole pool (as many GPUs as it can use), exactly as a plain
  ``Scheduler`` on those GPUs would.

A plug-in that fails (its ``PluginError``: it raised, or answered what the core cannot use) fails
its own experiment, never the pool: the call goes on for the others, with what that experiment's
core decided before the plug-in failed (a trial it started), and ``failed`` names it for the host,
which retires it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from hermes.core.decisions import Decision, Resume, Start
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
from hermes.core.policy import PluginError, checked_priority
from hermes.core.scheduler import Scheduler
from hermes.core.share import MAX_WEIGHT, MIN_WEIGHT, nested_shares
from hermes.core.states import HOLDING_GPU, RUNNING
from hermes.core.trial import Trial
from hermes.errors import HermesError

SEPARATOR = "."
_TRIAL_EVENTS = (TrialSubmitted, TrialReported, TrialSuspended, TrialExited)
_EXPERIMENT_EVENTS = (TrialSubmitted, SubmissionsClosed, SubmissionsReopened, ExperimentCancelled)


def qualify(experiment: str, trial_id: str) -> str:
    """The pool-wide id of an experiment's trial."""
    return f"{experiment}{SEPARATOR}{trial_id}"


def split(qualified: str) -> tuple[str, str]:
    """(experiment, trial id) of a pool-wide trial id."""
    experiment, separator, trial_id = qualified.partition(SEPARATOR)
    if not separator or not experiment or not trial_id:
        raise HermesError(f"trial id {qualified!r} names no experiment (expected '<experiment>{SEPARATOR}<trial>')")
    return experiment, trial_id


@dataclass(slots=True)
class Routed:
    """One event as one experiment's scheduler handled it, with the decisions it made (its own ids)."""

    experiment: str
    event: Event
    decisions: list[Decision]


@dataclass(slots=True, eq=False)
class Tenant:
    """An experiment in the pool, with its fair-share accounts (GPU seconds)."""

    key: str
    scheduler: Scheduler
    owner: str
    weight: float
    seq: int  # arrival order, the last tie-breaker
    gpus: set[str] = field(default_factory=set)  # GPUs it holds (all in use, or on their way back)
    share: float = 0.0  # GPUs it is owed now
    owed: float = 0.0  # GPU seconds it was owed so far
    used: float = 0.0  # GPU seconds it held so far

    @property
    def deficit(self) -> float:
        return self.owed - self.used

    @property
    def demand(self) -> int:
        """GPUs it could use: one per unfinished trial."""
        return self.scheduler.unfinished


class PoolScheduler:
    """The cluster level for many experiments on one pool; pure like ``Scheduler``: time comes
    only from the events' ``at`` (and the ``at`` of the calls that change the experiments)."""

    def __init__(self, *, quantum: float = 60.0) -> None:
        if not quantum > 0:
            raise HermesError(f"quantum must be positive, got {quantum}")
        self.quantum = quantum
        self.tenants: dict[str, Tenant] = {}
        self.gpu_node: dict[str, str] = {}  # every GPU of the pool -> its node
        self.holder: dict[str, str | None] = {}  # GPU -> the experiment holding it
        self.owner_weights: dict[str, float] = {}
        self.routed: list[Routed] = []
        self.failed: dict[str, PluginError] = {}  # after each call, experiments whose plug-in failed in it: retire them
        self.finished_experiments: list[str] = []  # experiments that ended, in order; the host may forget them
        self._clock = 0.0
        self._arrivals = 0

    # ------------------------------------------------------------------ experiments
    def add_experiment(
        self,
        key: str,
        scheduler: Scheduler,
        *,
        at: float,
        weight: float = 1.0,
        owner: str = "",
        used: float = 0.0,
        owed: float = 0.0,
    ) -> list[Decision]:
        """Let ``scheduler`` (holding no GPU) share the pool from ``at``; return what that changes.

        ``used`` and ``owed``: its accounts (GPU seconds) in an earlier pool, to go on from."""
        if not key or SEPARATOR in key:
            raise HermesError(f"experiment key {key!r} must be non-empty and free of {SEPARATOR!r}")
        if key in self.tenants:
            raise HermesError(f"experiment {key} is in the pool already")
        if scheduler.cluster.gpu_count:
            raise HermesError(f"experiment {key} joins holding GPUs; remove its old nodes first")
        if scheduler.finished:
            raise HermesError(f"experiment {key} is finished")
        _check_weight(weight)
        self._begin(at)
        self.tenants[key] = Tenant(key, scheduler, owner, weight, self._arrivals, owed=owed, used=used)
        self._arrivals += 1
        return self._share(at)

    def set_weight(self, key: str, weight: float, at: float) -> list[Decision]:
        _check_weight(weight)
        self._begin(at)
        self._tenant(key).weight = weight
        return self._share(at)

    def set_owner_weight(self, owner: str, weight: float, at: float) -> list[Decision]:
        _check_weight(weight)
        self._begin(at)
        self.owner_weights[owner] = weight
        return self._share(at)

    def tell(self, key: str, event: Event) -> list[Decision]:
        """An event of one experiment in its own terms: a submission (its own trial id), closed or
        reopened submissions, a cancellation."""
        if not isinstance(event, _EXPERIMENT_EVENTS):
            raise HermesError(f"{type(event).__name__} is not an experiment's event; hand it to handle()")
        self._begin(event.at)
        decisions = self._route(self._tenant(key), event)
        return decisions + self._share(event.at)

    # ------------------------------------------------------------------ the executor's events
    def handle(self, event: Event) -> list[Decision]:
        """An event from the executor (qualified trial ids, the pool's nodes and GPUs)."""
        self._begin(event.at)
        at = event.at
        decisions: list[Decision] = []
        if isinstance(event, _TRIAL_EVENTS):
            key, trial_id = split(event.trial_id)
            tenant = self._tenant(key)
            local = replace(event, trial_id=trial_id)
            if isinstance(local, (TrialSuspended, TrialExited)):
                decisions += self._before_release(tenant, local)
            decisions += self._route(tenant, local)
        elif isinstance(event, PeriodElapsed):
            for tenant in list(self.tenants.values()):
                if tenant.gpus and tenant.key in self.tenants:
                    decisions += self._route(tenant, event)
        elif isinstance(event, NodeAdded):
            for gpu in event.gpus:
                self._add_gpu(event.node, gpu)
        elif isinstance(event, GpuAdded):
            self._add_gpu(event.node, event.gpu)
        elif isinstance(event, NodeRemoved):
            for gpu in [gpu for gpu, node in self.gpu_node.items() if node == event.node]:
                del self.gpu_node[gpu], self.holder[gpu]
            for tenant in list(self.tenants.values()):
                if event.node in tenant.scheduler.cluster.nodes and tenant.key in self.tenants:
                    decisions += self._route(tenant, event)
        elif isinstance(event, GpuRemoved):
            holder = self.holder.pop(event.gpu, None)
            self.gpu_node.pop(event.gpu, None)
            if holder is not None and holder in self.tenants:
                decisions += self._route(self.tenants[holder], event)
        else:
            raise HermesError(f"{type(event).__name__} is an experiment's event; hand it to tell()")
        return decisions + self._share(at)

    # ------------------------------------------------------------------ who gets a GPU
    def _before_release(self, tenant: Tenant, event: TrialSuspended | TrialExited) -> list[Decision]:
        """A trial is about to release its GPU: if another experiment is owed it more, mark it
        reclaimed first, so that this experiment does not refill it; unless a trial that cannot
        move stays tied to it (this one, suspending, or another one stopped there).

        This GPU and those on their way back are handed out together: where this experiment gets
        one of them, it keeps this one, and a GPU it is giving back (its trial suspending for a
        preemption) goes to the experiment that preemption was for, not straight back to it."""
        trial_id, at = event.trial_id, event.at
        trial = tenant.scheduler.trials.get(trial_id)
        if trial is None or trial.state not in HOLDING_GPU or trial.gpu in tenant.scheduler.reclaimed:
            return []
        gpu = trial.gpu
        keeping = len(tenant.gpus) - len(tenant.scheduler.reclaimed) - 1
        if self._handed_out(at, gpu, 1, leaving=tenant)[tenant] > keeping:
            return []
        parks = not trial.movable and isinstance(event, TrialSuspended) and not trial.stop_requested
        others = [member for member in tenant.scheduler.cluster.node_of(gpu).members.values() if member is not trial]
        if parks or gpu in _tied_gpus(others):
            return []
        return self._route(tenant, GpuReclaimed(at, gpu))

    def _ranking(self, now: float, gpu: str) -> list[Tenant]:
        """Experiments that want ``gpu``, the most owed first (``_rank``), once the GPUs on their way
        back to the pool went to those they will go to."""
        held = self._handed_out(now, gpu, 0)
        return sorted(held, key=lambda tenant: _rank(tenant, held[tenant]))

    def _handed_out(self, now: float, gpu: str, count: int, leaving: Tenant | None = None) -> dict[Tenant, int]:
        """Each experiment that wants ``gpu`` -> the GPUs it will hold once ``count`` GPUs and those on their way
        back to the pool (reclaimed, their trials leaving) went, one at a time, to the most owed. A GPU on its way
        counts for the experiment it will go to, not the one it leaves: counted for neither, a GPU that freed first
        went to the experiment a preemption was for, and the preempted GPU came back to the one it left, its trial
        suspended for nothing. ``leaving``: its trial is leaving ``gpu`` (it holds one GPU less, and wants it
        back)."""
        wanting = [
            tenant for tenant in self.tenants.values()
            if tenant is leaving or (tenant.key not in self.failed and self._wants(tenant, gpu, now))
        ]
        held = {tenant: len(tenant.gpus) - len(tenant.scheduler.reclaimed) - (tenant is leaving) for tenant in wanting}
        coming = sum(len(tenant.scheduler.reclaimed) for tenant in self.tenants.values())
        for _ in range(count + coming if wanting else 0):
            held[min(wanting, key=lambda tenant: _rank(tenant, held[tenant]))] += 1
        return held

    def _wants(self, tenant: Tenant, gpu: str, now: float) -> bool:
        """Whether the experiment would run something on ``gpu`` now, or needs a GPU to conclude
        (submissions closed, nothing running: its scheduler ends what it cannot run)."""
        scheduler = tenant.scheduler
        if not scheduler.unfinished:
            return False
        if not scheduler.submissions_open and not scheduler.busy:
            return True
        policy = scheduler.policy
        try:
            return any(
                trial.waiting
                and (trial.movable or trial.last_gpu is None or trial.last_gpu == gpu)
                and checked_priority(policy, trial, now) is not None
                for trial in _members(scheduler)
            )
        except PluginError as error:
            self.failed.setdefault(tenant.key, error)
            return False

    def _usable(self, tenant: Tenant, now: float, enough: int) -> int:
        """GPUs the experiment could use now, counted up to ``enough``: one per trial holding a GPU
        and one per waiting trial it would run on any GPU it were given. A trial its policy holds
        back (priority None: ASHA's paused ones) runs on none, nor does one tied to its own GPU, so
        preempting another experiment for it would only hand the GPU straight back. One that needs
        a GPU to conclude (submissions closed, nothing running) uses one."""
        scheduler = tenant.scheduler
        if not scheduler.submissions_open and not scheduler.busy:
            return min(1, scheduler.unfinished)
        usable = scheduler.busy
        policy = scheduler.policy
        try:
            for trial in _members(scheduler):
                if usable >= enough:
                    break
                if (trial.waiting and (trial.movable or trial.last_gpu is None)
                        and checked_priority(policy, trial, now) is not None):
                    usable += 1
        except PluginError as error:
            self.failed.setdefault(tenant.key, error)
            return scheduler.busy
        return usable

    def _share(self, at: float) -> list[Decision]:
        """Give free GPUs to the most owed experiments, then reclaim GPUs for those still owed."""
        decisions: list[Decision] = []
        self._update_shares()
        for gpu in sorted(gpu for gpu, holder in self.holder.items() if holder is None):
            for tenant in self._ranking(at, gpu):
                granted, made = self._grant(tenant, gpu, at)
                decisions += made
                if granted:
                    self._update_shares()
                    break
        return decisions + self._rebalance(at)

    def _grant(self, tenant: Tenant, gpu: str, at: float) -> tuple[bool, list[Decision]]:
        """Give ``gpu`` to the experiment; take it back at once if it runs nothing there."""
        node = self.gpu_node[gpu]
        scheduler = tenant.scheduler
        event = GpuAdded(at, node, gpu) if node in scheduler.cluster.nodes else NodeAdded(at, node, (gpu,))
        self.holder[gpu] = tenant.key
        tenant.gpus.add(gpu)
        self._backdate(tenant, at, 1)
        decisions = self._route(tenant, event)
        if tenant.key not in self.tenants:  # it finished with this GPU: nothing left to run
            return False, decisions
        if tenant.key in self.failed:  # it keeps the GPU, which its core may hold now, until the host retires it
            return True, decisions
        if any(isinstance(d, (Start, Resume)) and d.gpu == gpu for d in decisions):
            return True, decisions
        if gpu in scheduler.cluster.gpu_node and scheduler.cluster.node_of(gpu).occupant.get(gpu) is None:
            decisions += self._route(tenant, GpuReclaimed(at, gpu))
        return False, decisions

    def _rebalance(self, at: float) -> list[Decision]:
        """Preempt for experiments still owed GPUs when none is on its way to them."""
        decisions: list[Decision] = []
        while True:
            coming = sum(len(t.scheduler.reclaimed) for t in self.tenants.values())
            coming += sum(holder is None for holder in self.holder.values())
            needs, by_deficit = 0, False
            for tenant in self.tenants.values():
                if tenant.key in self.failed:
                    continue  # to be retired: it wants nothing more
                held, whole = len(tenant.gpus), math.floor(tenant.share + 1e-9)
                owed = tenant.deficit >= self.quantum
                if min(tenant.demand, whole) <= held and not (owed and tenant.demand > held):
                    continue  # it wants no GPU even if it could run every unfinished trial
                usable = self._usable(tenant, at, max(whole, held + 1))
                short = min(usable, whole) - held
                if short > 0:
                    needs += short
                elif usable > held and owed:
                    needs += 1
                    by_deficit = True
            if needs <= coming:
                return decisions
            victim = self._victim(by_deficit)
            if victim is None:
                return decisions
            tenant, gpu = victim
            decisions += self._route(tenant, GpuReclaimed(at, gpu, preempt=True))

    def _victim(self, by_deficit: bool) -> tuple[Tenant, str] | None:
        """The running trial to preempt: in the experiment most above its share (the lowest
        deficit), the one its own policy ranks lowest (ties: the latest arrival); never one on a
        GPU that a trial which cannot move is tied to.

        For a deficit, the victim must have held no more than its share so far (a deficit of at
        most 0): the one owed is then at least ``quantum`` GPU seconds ahead of it, so each must
        fall a quantum behind before GPUs move back, however many experiments share the excess."""
        candidates = []
        for tenant in self.tenants.values():
            keeping = len(tenant.gpus) - len(tenant.scheduler.reclaimed)
            if (keeping > tenant.share + 1e-9 and (not by_deficit or tenant.deficit <= 0.0)
                    and tenant.key not in self.failed):
                candidates.append((tenant.deficit, tenant.seq, tenant))
        for _, _, tenant in sorted(candidates, key=lambda entry: entry[:2]):
            try:
                lowest = self._lowest_running(tenant.scheduler)
            except PluginError as error:
                self.failed.setdefault(tenant.key, error)
                continue
            if lowest is not None:
                return tenant, lowest.gpu
        return None

    def _lowest_running(self, scheduler: Scheduler) -> Trial | None:
        """The running trial that the experiment's policy ranks lowest (ties: the latest arrival) and that the pool
        may take back."""
        tied = _tied_gpus(scheduler.trials.values())
        lowest, lowest_rank = None, None
        for trial in scheduler.trials.values():
            if (
                trial.state is not RUNNING
                or trial.stop_requested
                or trial.step >= trial.budget  # it has trained its budget and is exiting
                or trial.gpu in scheduler.reclaimed
                or trial.gpu in tied
            ):
                continue
            priority = checked_priority(scheduler.policy, trial, self._clock)
            rank = (-math.inf if priority is None else priority, -trial.seq)
            if lowest_rank is None or rank < lowest_rank:
                lowest, lowest_rank = trial, rank
        return lowest

    # ------------------------------------------------------------------ bookkeeping
    def accounts(self, tenant: Tenant, at: float | None = None) -> tuple[float, float]:
        """The experiment's GPU seconds (used, owed) charged up to ``at``, the clock left where it is, so that no
        decision changes. A call charges them only up to its own time: a host that saves or shows them between calls
        (an epoch reports once in minutes) asks for them as of now. None: as the last call left them; one that left
        the pool keeps those it had then."""
        elapsed = 0.0
        if at is not None and self.tenants.get(tenant.key) is tenant:
            elapsed = max(0.0, at - self._clock)
        return tenant.used + len(tenant.gpus) * elapsed, tenant.owed + tenant.share * elapsed

    def _begin(self, at: float) -> None:
        """Charge every experiment's accounts up to ``at`` and start new lists of routed events and failures."""
        self.routed = []
        self.failed = {}
        elapsed = at - self._clock
        if elapsed > 0:
            for tenant in self.tenants.values():
                tenant.used += len(tenant.gpus) * elapsed
                tenant.owed += tenant.share * elapsed
            self._clock = at

    def _backdate(self, tenant: Tenant, at: float, gpus: int) -> None:
        """The experiment holds ``gpus`` GPUs more (fewer, if negative) from ``at``. An event older than the clock (the
        executor made it before a call at a later time, a submission say) begins or ends runs at its own time in the
        experiment's log: its GPU time is charged from then, as the GPU timeline shows it, not from the clock."""
        if at < self._clock:
            tenant.used += gpus * (self._clock - at)

    def _update_shares(self) -> None:
        tenants = self.tenants
        shares = nested_shares(
            float(len(self.gpu_node)),
            {key: t.owner for key, t in tenants.items()},
            {key: t.weight for key, t in tenants.items()},
            {key: float(t.demand) for key, t in tenants.items()},
            self.owner_weights,
        )
        for key, tenant in tenants.items():
            tenant.share = shares[key]

    def _route(self, tenant: Tenant, event: Event) -> list[Decision]:
        """Hand ``event`` to the experiment's scheduler; return its decisions with qualified ids. Where a plug-in of
        the experiment fails (``failed``), those its core made before (``Scheduler.handle``): the executor must carry
        them out, or a trial its core believes running never runs, never answers its Stop, and the experiment keeps
        that GPU for ever; the experiment keeps its GPUs until the host retires it."""
        scheduler = tenant.scheduler
        try:
            decisions = scheduler.handle(event)
        except PluginError as error:
            self.failed.setdefault(tenant.key, error)
            decisions = error.decisions
        self.routed.append(Routed(tenant.key, event, decisions))
        for gpu in [gpu for gpu in tenant.gpus if gpu not in scheduler.cluster.gpu_node]:  # released to the pool
            tenant.gpus.discard(gpu)
            self._backdate(tenant, event.at, -1)
            if gpu in self.holder:
                self.holder[gpu] = None
        qualified = [replace(d, trial_id=qualify(tenant.key, d.trial_id)) for d in decisions]
        if scheduler.finished:
            self._backdate(tenant, event.at, -len(tenant.gpus))
            for gpu in tenant.gpus:
                if gpu in self.holder:
                    self.holder[gpu] = None
            del self.tenants[tenant.key]
            self.finished_experiments.append(tenant.key)
            return qualified
        if tenant.key in self.failed:
            return qualified
        idle = [
            gpu
            for gpu in sorted(tenant.gpus)
            if gpu not in scheduler.reclaimed and scheduler.cluster.node_of(gpu).occupant[gpu] is None
            and gpu not in _tied_gpus(scheduler.cluster.node_of(gpu).members.values())
        ]
        if idle and not isinstance(event, (NodeAdded, GpuAdded, GpuReclaimed)):  # it could not use them: back
            for gpu in idle:
                qualified += self._route(tenant, GpuReclaimed(event.at, gpu))
        return qualified

    def _add_gpu(self, node: str, gpu: str) -> None:
        if gpu in self.gpu_node:
            raise HermesError(f"GPU {gpu} is in the pool already")
        self.gpu_node[gpu] = node
        self.holder[gpu] = None

    def _tenant(self, key: str) -> Tenant:
        try:
            return self.tenants[key]
        except KeyError:
            raise HermesError(f"no experiment {key} in the pool") from None


def _members(scheduler: Scheduler) -> Iterator[Trial]:
    """The experiment's unfinished trials: those waiting unplaced, then each node's."""
    yield from scheduler.unplaced.values()
    for node in scheduler.cluster.nodes.values():
        yield from node.members.values()


def _tied_gpus(trials: Iterable[Trial]) -> set[str]:
    """GPUs that trials which cannot move (unmodified programs: their state is their process) run
    on or wait on, stopped. Such a trial can continue on that GPU alone, so its experiment keeps
    it: taken back, the trial would wait for it for as long as another experiment held it, and be
    stopped when its experiment ran out of other work."""
    tied = set()
    for trial in trials:
        if not trial.movable and not trial.state.is_terminal:
            gpu = trial.gpu or trial.last_gpu
            if gpu is not None:
                tied.add(gpu)
    return tied


def _rank(tenant: Tenant, held: int) -> tuple[bool, float, int]:
    """Who is owed a GPU most, first: those holding fewer than the whole part of their share, then by deficit,
    then by arrival."""
    return held >= math.floor(tenant.share + 1e-9), -tenant.deficit, tenant.seq


def _check_weight(weight: float) -> None:
    if not (isinstance(weight, (int, float)) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise HermesError(f"a weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {weight!r}")
