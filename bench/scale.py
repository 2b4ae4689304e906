"""Scale: 10,000 trials on 1,000 GPUs (125 nodes of 8), simulated with the real core.

Prints the simulation's wall time and the mean time the core spends per scheduling decision.
Targets: 10 s or less in all, 1 ms or less per decision. Run: python bench/scale.py [--policy NAME]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from hermes.cli import policy_name, positive_int
from hermes.core.scheduler import Scheduler
from hermes.errors import TraceError
from hermes.policies import make_policy
from hermes.sim.simulate import simulate
from hermes.sim.trace import Trace, load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
GPUS_PER_NODE = 8


def resampled(trace: Trace, trials: int, seed: int) -> Trace:
    """``trials`` curves drawn with replacement from a real trace, renamed to stay unique."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(trace.trials), trials)
    curves = tuple(trace.trials[i].__class__(str(n), trace.trials[i].metrics, trace.trials[i].seconds,
                                             trace.trials[i].diverged, trace.trials[i].params)
                   for n, i in enumerate(picks))
    return Trace(f"{trace.path} x{trials}", trace.mode, curves)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", type=policy_name, default="hermes")
    parser.add_argument("--trials", type=positive_int, default=10_000)
    parser.add_argument("--gpus", type=positive_int, default=1_000)
    parser.add_argument("--trace", default=str(DATA / "lcbench_189908.csv"))
    parser.add_argument("--mode", choices=("max", "min"), default="max")
    args = parser.parse_args()
    try:
        trace = resampled(load_trace(args.trace, args.mode), args.trials, seed=0)
    except TraceError as error:
        parser.error(f"argument --trace: {error}")
    nodes = max(args.gpus // GPUS_PER_NODE, 1)  # fewer than 8 GPUs are one node, not none (a traceback)

    core_seconds = 0.0
    decisions = 0
    handle = Scheduler.handle

    def timed_handle(self: Scheduler, event):  # measures the core alone, inside the real run
        nonlocal core_seconds, decisions
        started = time.perf_counter()
        out = handle(self, event)
        core_seconds += time.perf_counter() - started
        decisions += len(out)
        return out

    Scheduler.handle = timed_handle  # type: ignore[method-assign]
    started = time.perf_counter()
    result = simulate(trace, make_policy(args.policy), gpus=args.gpus, nodes=nodes, seed=0)
    wall = time.perf_counter() - started
    Scheduler.handle = handle  # type: ignore[method-assign]

    print(f"{args.trials} trials on {args.gpus} GPUs ({nodes} nodes), policy {args.policy}")
    print(f"simulated makespan      {result.makespan_s / 3600:10.1f} h")
    print(f"simulation wall time    {wall:10.2f} s   (target <= 10 s: {wall / 10:.2f} of budget)")
    print(f"decisions               {decisions:10d}")
    print(f"core time per decision  {core_seconds / max(decisions, 1) * 1e3:10.3f} ms (target <= 1 ms: "
          f"{core_seconds / max(decisions, 1) * 1e3:.2f} of budget)")


if __name__ == "__main__":
    main()
