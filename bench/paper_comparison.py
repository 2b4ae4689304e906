"""The paper's comparison on the shipped traces: hermes against the baselines, side by side.

For each trace and cluster size, every policy replays the same random arrival orders (seeds
0..K-1) with the default switch costs, and the script prints each policy's averages and
hermes's speed-up over every other policy in time to best, time to target and mean time to
first feedback. Run: python bench/paper_comparison.py [--seeds 10] [--gpus 1,4,16]
"""

from __future__ import annotations

import argparse
import math
import os
import time

from hermes.cli import listed, policy_name, positive_int
from hermes.policies import POLICIES
from hermes.sim.compare import Setting, Summary, compare, format_table
from hermes.sim.trace import load_trace

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "data")
TRACES = (("nasbench_nlp_wt2.csv", "min"), ("lcbench_189908.csv", "max"))
BASELINES = ("fifo", "rr", "slaq", "asha", "hyperband")
FIGURES = (("time_to_best_s", "time to best"), ("time_to_target_s", "time to target"),
           ("mean_first_feedback_s", "first feedback"))


def ratios(summaries: list[Summary]) -> str:
    by_name = {s.policy: s for s in summaries}
    hermes = by_name["hermes"]
    lines = []
    for baseline in (name for name in BASELINES if name in by_name):
        other = by_name[baseline]
        parts = []
        for figure, label in FIGURES:
            ratio = hermes.speedup(other, figure)
            parts.append(f"{label} {ratio:6.2f}x" if not math.isnan(ratio) else f"{label}    n/a")
        lines.append(f"  hermes vs {baseline:<9} " + "   ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--gpus", type=listed(positive_int), default=[1, 4, 16])
    parser.add_argument("--policies", type=listed(policy_name),
                        default=[p for p in (*BASELINES, "hermes") if p in POLICIES])
    parser.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    policies = args.policies
    started = time.perf_counter()
    for file, mode in TRACES:
        trace = load_trace(os.path.join(DATA, file), mode)
        for gpus in args.gpus:
            summaries = compare(trace, policies, range(args.seeds), Setting(gpus=gpus), workers=args.workers)
            print(f"\n== {file}: {len(trace.trials)} trials, {gpus} GPU(s), {args.seeds} seeds "
                  f"(time to target: within 1% of the best final metric)")
            print(format_table(summaries))
            if "hermes" in policies:
                print(ratios(summaries))
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
