"""Run one policy over one trace in simulated time and measure what the paper measures."""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hermes.core.decisions import Decision
from hermes.core.events import Event, GpuAdded, GpuRemoved, NodeAdded, NodeRemoved, SubmissionsClosed
from hermes.core.policy import EarlyStopper, SchedulingPolicy, plugin_call
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import STOPPED
from hermes.execution.engine import Engine
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import EpochRecord, SimulatedExecutor
from hermes.sim.trace import Trace

def cluster_layout(gpus: int, nodes: int = 1) -> dict[str, tuple[str, ...]]:
    """``gpus`` GPUs spread as evenly as possible over ``nodes`` nodes, named ``n<i>/g<j>``."""
    if gpus < 1 or nodes < 1 or nodes > gpus:
        raise ValueError(f"need 1 <= nodes <= gpus, got {nodes} nodes and {gpus} GPUs")
    layout = {}
    for i in range(nodes):
        count = gpus // nodes + (i < gpus % nodes)
        layout[f"n{i}"] = tuple(f"n{i}/g{j}" for j in range(count))
    return layout


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How close to the trace's best final metric counts as reaching the target."""

    amount: float
    relative: bool  # a fraction of the best metric's magnitude, else absolute

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``"1%"`` is relative, ``"0.5"`` is absolute (in the metric's unit); neither may be negative (a distance)
        nor overflow to infinity (``1e400``, as ``inf``), which would put every trial on target."""
        match = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*", text)
        amount = float(match.group(1)) if match else math.nan
        if not match or not math.isfinite(amount):
            raise ValueError(f"target tolerance must be a number or a percentage, got {text!r}")
        if amount < 0:
            raise ValueError(f"target tolerance must not be negative (a distance from the best), got {text!r}")
        return cls(amount / 100 if match.group(2) else amount, bool(match.group(2)))

    def within(self, value: float, best: float) -> bool:
        return abs(value - best) <= (self.amount * abs(best) if self.relative else self.amount) + 1e-12


@dataclass(frozen=True, slots=True)
class SimulationResult:
    policy: str
    gpus: int
    trials: int
    # Trials stopped without a report, which a real run says were "stopped before its first report" (a trial a
    # policy never ran, say); not one that diverged in its first epoch, which ran and failed. The feedback figures
    # are over the trials that reported. Kept out of figures(), as the logs are, so that
    # bench/decision_hashes.py's digests of them stay comparable with older versions'.
    stopped_before_first_report: tuple[str, ...]
    # why, where the core said so: a policy that held them back (``held_back``); not asha's trials never promoted
    stopped_before_first_report_why: tuple[str, ...]
    time_to_best_s: float | None  # when a trial with the trace's best final metric first completed its budget
    time_to_target_s: float | None  # when a trial first completed its budget within the tolerance of the best
    mean_first_feedback_s: float
    median_first_feedback_s: float
    max_first_feedback_s: float
    feedback_rate_per_h: float  # reports per hour over the run's first tenth
    makespan_s: float
    gpu_utilization: float
    overhead_fraction: float  # suspend/resume/migration time over useful training time
    preemptions: int
    migrations: int
    best_curve: list[tuple[float, float]]  # (time, best metric so far) at each improvement
    decisions: list[tuple[float, str, str, str]] = field(default_factory=list, repr=False)
    epochs: list[EpochRecord] | None = field(default=None, repr=False)

    def figures(self) -> dict[str, Any]:
        """The published figures, without the logs (nor the trials stopped before their first report)."""
        left_out = ("decisions", "epochs", "stopped_before_first_report", "stopped_before_first_report_why")
        return {k: v for k, v in asdict(self).items() if k not in left_out}


def simulate(
    trace: Trace,
    policy: SchedulingPolicy,
    *,
    gpus: int,
    nodes: int = 1,
    seed: int = 0,
    stopper: EarlyStopper | None = None,
    costs: SwitchCosts = SwitchCosts(),
    max_trials_per_gpu: int | None = None,
    target: Tolerance = Tolerance(0.01, relative=True),
    record: bool = False,
    changes: Iterable[NodeAdded | NodeRemoved | GpuAdded | GpuRemoved] = (),
) -> SimulationResult:
    """Replay ``trace`` with trials arriving in a random order drawn from ``seed``.

    ``changes``: nodes and GPUs that join or leave the cluster at their times."""
    layout = cluster_layout(gpus, nodes)
    arrivals = trace.shuffled(seed)
    curves = {curve.name: curve for curve in arrivals}
    executor = SimulatedExecutor(layout, costs, changes=changes, record_epochs=record)
    objective = Objective(trace.mode)
    scheduler = Scheduler(policy, objective=objective, stopper=stopper, max_trials_per_gpu=max_trials_per_gpu)
    log: list[tuple[float, str, str, str]] = []

    def listen(event: Event, decisions: list[Decision]) -> None:
        for decision in decisions:
            log.append((event.at, type(decision).__name__, decision.trial_id, getattr(decision, "gpu", "")))

    engine = Engine(scheduler, executor, [listen] if record else [])
    for curve in arrivals:
        engine.post(executor.submit(curve.name, curve, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    plugin_call(policy, "configure", executor.profile)  # as a session does: the engine's costs, once trials are known
    engine.run()

    accounts = executor.accounts
    makespan = executor.now()
    first = sorted(t.first_report_at for t in scheduler.trials.values() if t.first_report_at is not None)
    early = makespan / 10
    best_finals = trace.best_finals()
    best = best_finals[0].metrics[-1]
    on_target = [at for name, at in accounts.completed_at.items() if target.within(curves[name].metrics[-1], best)]
    on_best = [accounts.completed_at[t.name] for t in best_finals if t.name in accounts.completed_at]
    unreported = [t for t in scheduler.trials.values() if t.state is STOPPED and t.first_report_at is None]
    return SimulationResult(
        policy=policy.name,
        gpus=gpus,
        trials=len(arrivals),
        stopped_before_first_report=tuple(t.trial_id for t in unreported),
        stopped_before_first_report_why=tuple(dict.fromkeys(t.error for t in unreported if t.error)),
        time_to_best_s=min(on_best, default=None),
        time_to_target_s=min(on_target, default=None),
        mean_first_feedback_s=statistics.fmean(first) if first else math.nan,
        median_first_feedback_s=statistics.median(first) if first else math.nan,
        max_first_feedback_s=first[-1] if first else math.nan,
        # reports come in time order: those of the first tenth are a prefix
        feedback_rate_per_h=bisect_right(accounts.report_times, early) / (early / 3600) if early else 0.0,
        makespan_s=makespan,
        gpu_utilization=accounts.busy / (gpus * makespan) if makespan else 0.0,
        overhead_fraction=accounts.overhead / accounts.useful if accounts.useful else 0.0,
        preemptions=accounts.preemptions,
        migrations=accounts.migrations,
        best_curve=_best_curve(accounts.report_times, accounts.report_values, objective),
        decisions=log,
        epochs=executor.epochs,
    )


def _best_curve(times: list[float], values: list[float], objective: Objective) -> list[tuple[float, float]]:
    """(time, best metric reported so far) at each improvement: short, and exact as a step function."""
    curve: list[tuple[float, float]] = []
    best = -math.inf
    for at, value in sorted(zip(times, values)):
        score = objective.score(value)
        if score > best:
            best = score
            curve.append((round(at, 3), value))
    return curve
