"""Several policies on one trace, averaged over random arrival orders, side by side."""

from __future__ import annotations

import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermes.plugins import importable_from
from hermes.policies import make_policy, make_stopper
from hermes.sim.costs import SwitchCosts
from hermes.sim.simulate import SimulationResult, Tolerance, simulate
from hermes.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class Setting:
    """Everything but the policy and the seed that defines one simulated run."""

    gpus: int
    nodes: int = 1
    period: float | None = None  # None: each policy's default
    stopper: str | None = None
    costs: SwitchCosts = SwitchCosts()
    target: Tolerance = Tolerance(0.01, relative=True)
    plugins_from: Path | None = None  # a folder that policies and stoppers of one's own (module:Class) import from


# The figures a speed-up is given for: each seed's is kept (Summary.per_seed) to pair the seeds.
RATIO_FIGURES = ("time_to_best_s", "time_to_target_s", "mean_first_feedback_s")


@dataclass(frozen=True, slots=True)
class Summary:
    """One policy's figures averaged over seeds (time to best: over the seeds where it was reached)."""

    policy: str
    seeds: int
    best_reached: int  # seeds in which a trial with the best final metric was fully trained
    target_reached: int
    time_to_best_s: float
    time_to_target_s: float
    mean_first_feedback_s: float
    makespan_s: float
    gpu_utilization: float
    overhead_fraction: float
    preemptions: float
    migrations: float
    stopped_before_first_report: float  # trials per seed stopped before their first report
    per_seed: dict[str, dict[int, float | None]] = field(default_factory=dict, repr=False, compare=False)

    def figures(self) -> dict[str, Any]:
        """The figures, without each seed's."""
        return {k: v for k, v in asdict(self).items() if k != "per_seed"}

    def speedup(self, baseline: Summary, figure: str) -> float:
        """The baseline's mean over this policy's, over the seeds where both got there (NaN: no such seed), as
        bench/policy_panel.py: the means over each one's own seeds set a policy's few lucky seeds against all
        of the baseline's (ASHA 1.56x FIFO to target on digits_mlp, 1.10x in the same seeds)."""
        mine, theirs = self.per_seed[figure], baseline.per_seed[figure]
        pairs = [(theirs[seed], value) for seed, value in mine.items() if _got(value) and _got(theirs.get(seed))]
        if not pairs:
            return math.nan
        own = statistics.fmean(value for _, value in pairs)
        return statistics.fmean(value for value, _ in pairs) / own if own else math.nan


def run_one(trace: Trace, policy: str, seed: int, setting: Setting) -> SimulationResult:
    params: dict[str, Any] = {} if setting.period is None else {"period": setting.period}
    with importable_from(setting.plugins_from):
        scheduling = make_policy(policy, **params)
        stopper = make_stopper(setting.stopper) if setting.stopper else None
    return simulate(
        trace,
        scheduling,
        gpus=setting.gpus,
        nodes=setting.nodes,
        seed=seed,
        stopper=stopper,
        costs=setting.costs,
        target=setting.target,
    )


_worker_trace: Trace | None = None  # each worker process receives the trace once, not with every job


def _init_worker(trace: Trace) -> None:
    global _worker_trace
    _worker_trace = trace


def _run_job(job: tuple[str, int, Setting]) -> SimulationResult:
    return run_one(_worker_trace, *job)  # type: ignore[arg-type]


def compare(
    trace: Trace, policies: Sequence[str], seeds: Sequence[int], setting: Setting, *, workers: int = 1
) -> list[Summary]:
    """Run every policy on every seed and summarise each policy, named ``policy+stopper`` where ``setting``
    composes a stopper with every policy (as bench/policy_panel.py names them): the baseline is no plain FIFO then."""
    jobs = [(policy, seed, setting) for policy in policies for seed in seeds]
    if workers > 1:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(trace,)) as pool:
            results = list(pool.map(_run_job, jobs))
    else:
        results = [run_one(trace, *job) for job in jobs]
    by_policy: dict[str, dict[int, SimulationResult]] = {policy: {} for policy in policies}
    for (policy, seed, _), result in zip(jobs, results):
        by_policy[policy][seed] = result
    composed = f"+{setting.stopper}" if setting.stopper else ""
    return [summarise(policy + composed, runs) for policy, runs in by_policy.items()]


def summarise(policy: str, by_seed: Mapping[int, SimulationResult]) -> Summary:
    """``policy``'s runs, by seed, summarised."""
    runs = list(by_seed.values())

    def mean(values: list[float | None]) -> float:
        present = [v for v in values if _got(v)]
        return statistics.fmean(present) if present else math.nan

    return Summary(
        policy=policy,
        seeds=len(runs),
        best_reached=sum(r.time_to_best_s is not None for r in runs),
        target_reached=sum(r.time_to_target_s is not None for r in runs),
        time_to_best_s=mean([r.time_to_best_s for r in runs]),
        time_to_target_s=mean([r.time_to_target_s for r in runs]),
        mean_first_feedback_s=mean([r.mean_first_feedback_s for r in runs]),
        makespan_s=mean([r.makespan_s for r in runs]),
        gpu_utilization=mean([r.gpu_utilization for r in runs]),
        overhead_fraction=mean([r.overhead_fraction for r in runs]),
        preemptions=mean([r.preemptions for r in runs]),
        migrations=mean([r.migrations for r in runs]),
        stopped_before_first_report=mean([len(r.stopped_before_first_report) for r in runs]),
        per_seed={figure: {seed: getattr(r, figure) for seed, r in by_seed.items()} for figure in RATIO_FIGURES},
    )


def _got(value: float | None) -> bool:
    """Whether a seed has the figure: None where the target was never reached, NaN where no trial reported."""
    return value is not None and not math.isnan(value)


def format_table(summaries: list[Summary], baseline: str = "fifo") -> str:
    """A plain-text table with each policy's speed-ups over ``baseline`` (when it is in the table, alone or with a
    stopper composed: ``fifo+median``); times in hours, minutes or seconds, whichever the longest makespan reads
    best in. Notes under it say what ``x`` and ``target`` are, and which policies left trials without a report."""
    named = {s.policy: s for s in summaries}
    base = named.get(baseline) or next((s for s in summaries if s.policy.partition("+")[0] == baseline), None)
    longest = max((s.makespan_s for s in summaries if math.isfinite(s.makespan_s)), default=0.0)
    unit, scale = ("h", 3600.0) if longest >= 2 * 3600 else ("min", 60.0) if longest >= 120 else ("s", 1.0)
    name = max(10, *(len(s.policy) + 2 for s in summaries))
    header = (
        f"{'policy':<{name}}{'best':>7}{f'to best {unit}':>13}{'x':>7}{f'to target {unit}':>15}{'x':>7}{'target':>8}"
        f"{f'1st feedback {unit}':>18}{'x':>8}{f'makespan {unit}':>14}{'util':>7}{'overhead':>10}{'preempt':>9}"
        f"{'migrate':>9}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        ratio = (lambda figure: s.speedup(base, figure)) if base else (lambda figure: math.nan)
        lines.append(
            f"{s.policy:<{name}}{f'{s.best_reached}/{s.seeds}':>7}{_cell(s.time_to_best_s / scale, '13.2f')}"
            f"{_cell(ratio('time_to_best_s'), '7.2f', '-')}{_cell(s.time_to_target_s / scale, '15.2f')}"
            f"{_cell(ratio('time_to_target_s'), '7.2f', '-')}{f'{s.target_reached}/{s.seeds}':>8}"
            f"{_cell(s.mean_first_feedback_s / scale, '18.3f')}{_cell(ratio('mean_first_feedback_s'), '8.1f', '-')}"
            f"{s.makespan_s / scale:>14.1f}{s.gpu_utilization:>7.1%}{s.overhead_fraction:>10.2%}"
            f"{s.preemptions:>9.0f}{s.migrations:>9.0f}"
        )
    lines.append("best, target: the seeds in which the policy fully trained a best trial, a trial on target")
    if base:
        lines.append(f"x: {base.policy}'s mean over the policy's, over the seeds where both got there")
    if base and base.policy != baseline:
        stopper = base.policy.partition("+")[2]
        lines.append(f"+{stopper}: with the {stopper} early stopper composed, {baseline} too: x is no speed-up over "
                     f"plain {baseline}")
    lines += [f"{s.policy}: {s.stopped_before_first_report:.3g} trial(s) per seed stopped before the first report; "
              "its 1st feedback is over the others" for s in summaries if s.stopped_before_first_report]
    return "\n".join(lines)


def _cell(value: float, spec: str, missing: str = "never") -> str:
    """``value`` right-aligned as ``spec`` says; NaN (no seed got there, so no time and no ratio) as ``missing``,
    the word the published tables use."""
    width = spec.partition(".")[0]
    return f"{missing:>{width}}" if math.isnan(value) else f"{value:>{spec}}"
