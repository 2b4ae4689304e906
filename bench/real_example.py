"""Hermes against FIFO on the real digits example, side by side in one run.

Both policies run the same trials (same seeded configurations) on the same CPU slots, one after
the other, through `hermes run`'s runner. Printed per policy: mean time to first feedback, time to
best (when the configuration with the best final accuracy finishes its budget), time to target
(a trial finishes within 0.5 accuracy points of that best), makespan, and for the time-sharing
policy the measured suspend and resume latencies and the overhead fraction; then the ratios.
Run: python bench/real_example.py [--trials 16] [--epochs 20] [--policies fifo,hermes]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from hermes.experiment import parse_spec
from hermes.session import ExperimentSession

ROOT = Path(__file__).resolve().parent.parent
TARGET_POINTS = 0.005  # accuracy is reported in [0, 1]: 0.5 points


@dataclass
class Outcome:
    policy: str
    first_feedback: dict[str, float]  # trial -> time of its first report
    completed: dict[str, tuple[float, float]]  # trial -> (time it finished its budget, final accuracy)
    makespan: float
    suspend_latencies: list[float]
    resume_latencies: list[float]  # restart to first report, less one step
    overhead: float  # seconds of slot time spent switching
    busy: float  # seconds of slot time held by trials


def spec_for(policy: str, args: argparse.Namespace, storage: Path) -> dict:
    spec = yaml.safe_load((ROOT / "examples" / "digits" / "experiment.yaml").read_text())
    spec["name"] = f"bench-{policy}"
    spec["trial"]["workdir"] = str(ROOT)
    spec["search"]["trials"] = args.trials
    spec["search"]["space"]["copies"] = {"type": "choice", "values": [args.copies]}
    spec["budget"]["steps"] = args.epochs
    spec["policy"] = {"name": policy, "period": args.period} if policy == "rr" else {"name": policy}  # defaults
    spec["resources"] = {"gpus": "none", "cpu_slots": args.slots, "threads_per_slot": 1}
    spec["storage"] = {"dir": str(storage), "checkpoint_every": args.epochs}
    return spec


def run(policy: str, args: argparse.Namespace, storage: Path) -> Outcome:
    runner = ExperimentSession(parse_spec(spec_for(policy, args, storage), source=f"bench-{policy}"))
    runner.run()
    store, experiment = runner.store, runner.experiment_id
    first: dict[str, float] = {}
    steps: dict[str, list[float]] = {}
    for record in store.metrics(experiment):
        first.setdefault(record.trial_id, record.at)
        steps.setdefault(record.trial_id, []).append(record.at)
    completed = {
        trial_id: (trial.idle_since, trial.values[-1])
        for trial_id, trial in runner.scheduler.trials.items()
        if trial.state.value == "completed"
    }
    timings = runner.executor.switch_timings
    switches: dict[str, list[float]] = {}
    for timing in timings:
        switches.setdefault(timing.trial_id, []).append(timing.suspend_decided)
    step_time = {  # between consecutive reports of one uninterrupted run
        trial: statistics.median(
            [b - a for a, b in zip(times, times[1:]) if not any(a <= at < b for at in switches.get(trial, []))] or [0.0]
        )
        for trial, times in steps.items()
    }
    suspends = [t.suspend_latency for t in timings if t.suspend_latency is not None]
    resumes = [t.resume_latency - step_time[t.trial_id] for t in timings if t.resume_latency is not None]
    busy = sum(trial.gpu_time for trial in runner.scheduler.trials.values())
    makespan = max(at for at, _ in completed.values()) if completed else 0.0
    store.close()
    return Outcome(policy, first, completed, makespan, suspends, resumes, sum(suspends) + sum(resumes), busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--copies", type=int, default=14, help="enlarge the digits training set this many times")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--period", type=float, default=4.0, help="round robin's period (hermes learns its own)")
    parser.add_argument("--policies", default="fifo,hermes")
    args = parser.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        outcomes = {policy: run(policy, args, Path(scratch) / policy) for policy in policies}

    finals = {t: final for o in outcomes.values() for t, (_, final) in o.completed.items()}
    best_trial = max(finals, key=finals.get)
    best = finals[best_trial]
    print(f"\n{args.trials} trials x {args.epochs} epochs on {args.slots} CPU slots; best final accuracy "
          f"{best:.4f} (trial {best_trial}); target: within {TARGET_POINTS * 100:.1f} points")
    header = f"{'policy':<8}{'1st feedback s':>16}{'to best s':>11}{'to target s':>13}{'makespan s':>12}" \
             f"{'suspend s':>11}{'resume s':>10}{'overhead':>10}"
    print(header + "\n" + "-" * len(header))
    figures = {}
    for policy, o in outcomes.items():
        to_best = o.completed.get(best_trial, (None,))[0]
        on_target = [at for at, final in o.completed.values() if final >= best - TARGET_POINTS]
        to_target = min(on_target) if on_target else None
        feedback = statistics.fmean(o.first_feedback.values())
        figures[policy] = (feedback, to_best, to_target)
        useful = o.busy - o.overhead
        print(f"{policy:<8}{feedback:>16.1f}{_s(to_best):>11}{_s(to_target):>13}{o.makespan:>12.1f}"
              f"{_s(statistics.median(o.suspend_latencies) if o.suspend_latencies else None, 3):>11}"
              f"{_s(statistics.median(o.resume_latencies) if o.resume_latencies else None, 3):>10}"
              f"{(o.overhead / useful if useful else 0.0):>10.1%}")
    if "fifo" in figures:
        for policy, (feedback, to_best, to_target) in figures.items():
            if policy == "fifo":
                continue
            base = figures["fifo"]
            print(f"{policy} vs fifo: first feedback {base[0] / feedback:.2f}x sooner, time to best "
                  f"{_ratio(base[1], to_best)}, time to target {_ratio(base[2], to_target)}")


def _s(value: float | None, digits: int = 1) -> str:
    return "never" if value is None else f"{value:.{digits}f}"


def _ratio(base: float | None, mine: float | None) -> str:
    return "n/a" if base is None or mine is None else f"{base / mine:.2f}x sooner"


if __name__ == "__main__":
    main()
