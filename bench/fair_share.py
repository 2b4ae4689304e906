"""Fair share: how GPU time is split between experiments of different weights on one simulated pool.

Two experiments (the shipped LCBench trace and the NAS-Bench trace, or synthetic ones with
``--synthetic``) share one pool; for each pair of weights and each policy, prints each
experiment's share of the GPU seconds used while both could use the whole pool, next to the
share its weight asks for, and the share a lone experiment gets. Run:

    python bench/fair_share.py [--gpus 8] [--weights 1:1,1:2,1:3] [--policies hermes,rr,fifo]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes.sim.pool import PoolExperiment, simulate_pool  # noqa: E402
from hermes.sim.synthetic import synthetic_trace  # noqa: E402
from hermes.sim.trace import Trace, load_trace  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data"


def traces(synthetic: bool) -> tuple[Trace, Trace]:
    if synthetic:
        return synthetic_trace(120, 20, seed=1), synthetic_trace(120, 20, seed=2, mode="min")
    return load_trace(DATA / "lcbench_189908.csv", "max"), load_trace(DATA / "nasbench_nlp_wt2.csv", "min")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--weights", default="1:1,1:2,1:3", help="comma-separated a:b pairs")
    parser.add_argument("--policies", default="hermes,rr,fifo")
    parser.add_argument("--synthetic", action="store_true", help="synthetic traces instead of the shipped ones")
    args = parser.parse_args()
    first, second = traces(args.synthetic)
    print(f"{args.gpus} GPUs; experiment a: {Path(first.path).name}, b: {Path(second.path).name}")
    print("policy  weights  share a (asked)   share b (asked)   contested h  makespan h  preemptions  wall s")
    for policy in args.policies.split(","):
        for pair in args.weights.split(","):
            weight_a, weight_b = (float(part) for part in pair.split(":"))
            started = time.perf_counter()
            result = simulate_pool(
                [
                    PoolExperiment("a", first, policy, weight_a, seed=1),
                    PoolExperiment("b", second, policy, weight_b, seed=1),
                ],
                gpus=args.gpus,
            )
            shares = result.contested_shares()
            asked_a = weight_a / (weight_a + weight_b)
            print(
                f"{policy:7} {pair:8} {shares['a']:.4f} ({asked_a:.4f})   {shares['b']:.4f} ({1 - asked_a:.4f})   "
                f"{result.contested_s / 3600:11.2f}  {result.makespan_s / 3600:10.2f}  {result.preemptions:11d}  "
                f"{time.perf_counter() - started:6.1f}"
            )
        alone = simulate_pool([PoolExperiment("a", first, policy, seed=1)], gpus=args.gpus)
        whole = alone.contested_gpu_seconds["a"] / (args.gpus * alone.contested_s) if alone.contested_s else 0.0
        print(f"{policy:7} alone    {whole:.4f} of the pool while it could use all of it")


if __name__ == "__main__":
    main()
