"""Policy sweep: how the scheduling policies compare on the shipped traces and on synthetic ones.

Every policy replays the same random arrival orders (seeds 0..K-1) with the default switch
costs. For each trace the table gives, averaged over seeds: in how many seeds the final-best
trial was fully trained, the time until then (over the seeds where it was), the mean time to
first feedback, each as a speed-up over FIFO (FIFO's mean over the policy's, over the seeds where
both got there, as `hermes simulate --compare`), and the time-sharing overhead.

Synthetic traces vary what makes scheduling hard (see ``hermes.sim.synthetic``: curves that
cross late, a misleading first epoch, noise, diverging trials) and how long an epoch takes
relative to the switch costs (tiny epochs, where a switch costs more than an epoch; long ones).
Hermes's settings can be overridden to study them: ``--set optimism=1.5``.

Run: python bench/policy_sweep.py [--suite real|synthetic|all] [--seeds 10] [--gpus 4]
     [--policies fifo,rr,slaq,asha,hyperband,hermes] [--set NAME=VALUE ...] [--workers N]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from hermes.cli import listed, policy_name, positive_int
from hermes.policies import POLICIES, make_policy
from hermes.sim.compare import Summary, summarise
from hermes.sim.simulate import SimulationResult, simulate
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import Trace, load_trace

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data")
REAL = (("nasbench_nlp_wt2.csv", "min"), ("lcbench_189908.csv", "max"))
SYNTHETIC = (
    # (label, trials, epochs, kind, epoch seconds, diverge fraction, trace seed, size-quality correlation)
    ("saturating", 200, 50, "saturating", (10.0, 60.0), 0.0, 1, None),
    ("crossing", 200, 50, "crossing", (10.0, 60.0), 0.0, 2, None),
    ("misleading", 200, 50, "misleading_first", (10.0, 60.0), 0.0, 3, None),
    ("noisy", 200, 50, "noisy", (10.0, 60.0), 0.0, 4, None),
    ("mixed+diverge", 200, 50, "mixed", (10.0, 60.0), 0.1, 5, None),
    ("mixed tiny", 200, 50, "mixed", (0.1, 0.5), 0.0, 6, None),
    ("mixed short", 200, 30, "mixed", (1.0, 3.0), 0.0, 7, None),
    ("mixed long", 100, 20, "mixed", (1800.0, 7200.0), 0.05, 8, None),
    # a width sets the epoch time; bigger trials are better (as in both shipped traces) or worse
    ("mixed, bigger is better", 200, 50, "mixed", (10.0, 60.0), 0.0, 9, 0.6),
    ("mixed, bigger is worse", 200, 50, "mixed", (10.0, 60.0), 0.0, 10, -0.6),
)
DEFAULT_POLICIES = ("fifo", "rr", "slaq", "asha", "hyperband", "hermes")


def _run(job: tuple[Trace, str, int, int, dict[str, Any]]) -> SimulationResult:
    trace, policy, seed, gpus, params = job
    return simulate(trace, make_policy(policy, **params), gpus=gpus, seed=seed)


def sweep(
    trace: Trace, policies: list[str], seeds: int, gpus: int, hermes: dict[str, Any], workers: int
) -> list[Summary]:
    """Each policy's runs summarised as `hermes simulate --compare` does, so that its speed-ups pair the seeds."""
    jobs = [(trace, p, s, gpus, hermes if p == "hermes" else {}) for p in policies for s in range(seeds)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_run, jobs, chunksize=1))
    else:
        results = [_run(job) for job in jobs]
    return [summarise(policy, dict(enumerate(results[i * seeds : (i + 1) * seeds])))
            for i, policy in enumerate(policies)]


def table(title: str, rows: list[Summary]) -> str:
    fifo = next((r for r in rows if r.policy == "fifo"), None)

    def ratio(row: Summary, figure: str, spec: str) -> str:
        speedup = row.speedup(fifo, figure) if fifo else math.nan
        return f"{speedup:{spec}}x" if not math.isnan(speedup) else "      - "

    header = (
        f"{'policy':<10}{'best':>6}{'to best h':>11}{'vs fifo':>9}{'1st fb h':>10}{'vs fifo':>9}"
        f"{'overhead':>10}{'preempt':>9}"
    )
    lines = [f"== {title}", header]
    for r in rows:
        lines.append(
            f"{r.policy:<10}{f'{r.best_reached}/{r.seeds}':>6}{r.time_to_best_s / 3600:>11.3f}"
            f"{ratio(r, 'time_to_best_s', '7.2f'):>9}{r.mean_first_feedback_s / 3600:>10.3f}"
            f"{ratio(r, 'mean_first_feedback_s', '7.1f'):>9}{r.overhead_fraction:>10.2%}{r.preemptions:>9.0f}"
        )
    return "\n".join(lines)


def traces(suite: str) -> list[tuple[str, Trace]]:
    found = []
    if suite in ("real", "all"):
        found += [(file, load_trace(os.path.join(DATA, file), mode)) for file, mode in REAL]
    if suite in ("synthetic", "all"):
        for label, trials, epochs, kind, seconds, diverge, seed, size_quality in SYNTHETIC:
            trace = synthetic_trace(trials, epochs, seed=seed, kind=kind, epoch_seconds=seconds,
                                    diverge_fraction=diverge, size_quality=size_quality)
            found.append((f"synthetic {label}: {trials} x {epochs} epochs of {seconds[0]:g}-{seconds[1]:g} s", trace))
    return found


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _setting(text: str) -> tuple[str, Any]:
    """An argparse type: ``NAME=VALUE``, a hermes setting."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE, got {text!r}")
    return name, _value(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("real", "synthetic", "all"), default="real")
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--gpus", type=positive_int, default=4)
    parser.add_argument("--policies", type=listed(policy_name),
                        default=[p for p in DEFAULT_POLICIES if p in POLICIES])
    parser.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                        help="a hermes setting")
    parser.add_argument("--only", help="run only traces whose title contains this text")
    parser.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    hermes, policies = dict(args.set), args.policies
    if hermes:  # built once here, so that a setting hermes does not take is one line, not a worker's traceback
        if "hermes" not in policies:
            parser.error("argument --set: only hermes takes settings, and --policies leaves it out")
        try:
            make_policy("hermes", **hermes)
        except (TypeError, ValueError) as error:
            parser.error(f"argument --set: {error}")
    chosen = [(title, trace) for title, trace in traces(args.suite) if not args.only or args.only in title]
    if not chosen:
        parser.error(f"argument --only: no trace of the {args.suite} suite has {args.only!r} in its title")
    started = time.perf_counter()
    for title, trace in chosen:
        rows = sweep(trace, policies, args.seeds, args.gpus, hermes, args.workers)
        print(table(f"{title} ({len(trace.trials)} trials, {args.gpus} GPUs, {args.seeds} seeds)", rows), flush=True)
    print(f"(wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
