"""Several experiments on one simulated GPU pool: how GPU time is shared between them.

The same pool scheduler (``hermes.core.pool``) and per-experiment schedulers as a real pool,
driven by the simulated executor. ``simulate_pool`` measures each experiment's GPU seconds over
the whole run and over the *contested* stretch: from the start until some experiment has fewer
unfinished trials than the pool has GPUs (before that, every experiment could use the whole pool,
so the split is decided by the weights alone).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from hermes.core.decisions import Decision
from hermes.core.events import GpuAdded, GpuRemoved, NodeAdded, NodeRemoved, SubmissionsClosed
from hermes.core.policy import plugin_call
from hermes.core.pool import PoolScheduler, qualify
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.errors import HermesError
from hermes.policies import make_policy
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.simulate import cluster_layout
from hermes.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class PoolExperiment:
    """One experiment of a pool simulation: a trace replayed under a policy, with its weights."""

    name: str
    trace: Trace
    policy: str = "hermes"
    weight: float = 1.0
    owner: str = ""
    seed: int = 0  # arrival order of its trials


@dataclass(slots=True)
class PoolResult:
    gpus: int
    makespan_s: float
    contested_s: float  # how long every experiment could use the whole pool
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # over the whole run
    contested_gpu_seconds: dict[str, float] = field(default_factory=dict)  # over the contested stretch
    finished_at: dict[str, float] = field(default_factory=dict)
    states: dict[str, Counter[TrialState]] = field(default_factory=dict)  # how each experiment's trials ended
    preemptions: int = 0
    decisions: list[tuple[float, str, str, str]] = field(default_factory=list, repr=False)  # with ``record``

    def contested_shares(self) -> dict[str, float]:
        """Each experiment's fraction of the GPU seconds used while every one could use the pool."""
        total = sum(self.contested_gpu_seconds.values())
        return {name: (used / total if total else 0.0) for name, used in self.contested_gpu_seconds.items()}


def simulate_pool(
    experiments: list[PoolExperiment],
    *,
    gpus: int,
    nodes: int = 1,
    costs: SwitchCosts = SwitchCosts(),
    quantum: float = 60.0,
    record: bool = False,
    changes: Iterable[NodeAdded | NodeRemoved | GpuAdded | GpuRemoved] = (),
) -> PoolResult:
    """Run every experiment to its end on one pool of ``gpus`` GPUs; all arrive at time 0.

    ``record``: keep every decision as ``(time, verb, qualified trial id, GPU)``, as ``simulate`` does.
    ``changes``: nodes and GPUs that join or leave the pool at their times (a Ray cluster's, say)."""
    if len({experiment.name for experiment in experiments}) != len(experiments):
        raise HermesError("pool experiments need distinct names")
    executor = SimulatedExecutor(cluster_layout(gpus, nodes), costs, changes=changes)
    pool = PoolScheduler(quantum=quantum)
    result = PoolResult(gpus=gpus, makespan_s=0.0, contested_s=0.0)
    pending = []
    schedulers = {}
    for experiment in experiments:
        policy = make_policy(experiment.policy)
        plugin_call(policy, "configure", executor.profile)
        scheduler = schedulers[experiment.name] = Scheduler(policy, objective=Objective(experiment.trace.mode))
        pending += _unfailed(pool, pool.add_experiment(experiment.name, scheduler, at=0.0, weight=experiment.weight,
                                                       owner=experiment.owner))
        for curve in experiment.trace.shuffled(experiment.seed):
            submitted = executor.submit(qualify(experiment.name, curve.name), curve, at=0.0)
            pending += _unfailed(pool, pool.handle(submitted))
        pending += _unfailed(pool, pool.tell(experiment.name, SubmissionsClosed(0.0)))
        result.gpu_seconds[experiment.name] = result.contested_gpu_seconds[experiment.name] = 0.0
    for decision in pending:
        executor.apply(decision, 0.0)
    contested, last = True, 0.0
    while pool.tenants:
        events = executor.next_events()
        if not events:
            if executor.idle():
                raise HermesError("the simulated pool stalled with experiments unfinished")
            continue
        for event in events:
            elapsed = event.at - last
            for name, tenant in pool.tenants.items():
                result.gpu_seconds[name] += len(tenant.gpus) * elapsed
                if contested:
                    result.contested_gpu_seconds[name] += len(tenant.gpus) * elapsed
            if contested:
                result.contested_s = event.at
            last = event.at
            decisions = _unfailed(pool, pool.handle(event))
            if record:
                result.decisions += [(event.at, type(d).__name__, d.trial_id, getattr(d, "gpu", "")) for d in decisions]
            for decision in decisions:
                executor.apply(decision, event.at)
            executor.settled(event)
            for name in pool.finished_experiments:
                result.finished_at.setdefault(name, event.at)
            if any(t.demand < gpus for t in pool.tenants.values()) or len(pool.tenants) < len(experiments):
                contested = False
    result.makespan_s = executor.now()
    result.states = {name: Counter(trial.state for trial in scheduler.trials.values())
                     for name, scheduler in schedulers.items()}
    result.preemptions = executor.accounts.preemptions
    return result


def _unfailed(pool: PoolScheduler, decisions: list[Decision]) -> list[Decision]:
    """The decisions of the pool's last call; a plug-in that failed in it fails the simulation, as ``simulate``."""
    if pool.failed:
        raise next(iter(pool.failed.values()))
    return decisions
