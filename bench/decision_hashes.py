"""Decision-log hashes: prove that a refactoring changed no scheduling decision.

Runs every policy on the paper traces (1, 4 and 16 GPUs), the scale run (hermes, 10,000 trials on
1,000 GPUs) and dynamic clusters (nodes and GPUs that join and leave mid-run), and prints one
SHA-256 per run over its decision log and figures. Save the output before a change and compare
after it:

    python bench/decision_hashes.py > before.txt   # on the old commit
    python bench/decision_hashes.py | diff before.txt -
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale import resampled  # noqa: E402
from hermes.core.events import GpuAdded, GpuRemoved, NodeAdded, NodeRemoved, SubmissionsClosed  # noqa: E402
from hermes.core.scheduler import Objective, Scheduler  # noqa: E402
from hermes.execution.engine import Engine  # noqa: E402
from hermes.policies import POLICIES, make_policy  # noqa: E402
from hermes.sim.simulate import simulate  # noqa: E402
from hermes.sim.trace import load_trace  # noqa: E402
from hermes.sim.executor import SimulatedExecutor  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data"
TRACES = {"nasbench": ("nasbench_nlp_wt2.csv", "min"), "lcbench": ("lcbench_189908.csv", "max")}


def digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def paper_runs(quick: bool) -> dict[str, str]:
    hashes = {}
    for label, (file, mode) in TRACES.items():
        trace = load_trace(DATA / file, mode)
        for policy in sorted(POLICIES):
            for gpus in (4,) if quick else (1, 4, 16):
                result = simulate(trace, make_policy(policy), gpus=gpus, nodes=max(1, gpus // 8), seed=1, record=True)
                hashes[f"paper {label} {policy} {gpus} gpus"] = digest([result.decisions, result.figures()])
    return hashes


def scale_run() -> dict[str, str]:
    trace = resampled(load_trace(DATA / "lcbench_189908.csv", "max"), 10_000, seed=0)
    result = simulate(trace, make_policy("hermes"), gpus=1_000, nodes=125, seed=0, record=True)
    return {"scale hermes 10000x1000": digest([result.decisions, result.figures()])}


def dynamic_run(policy: str) -> str:
    """Four nodes of two GPUs; a node dies, a GPU leaves, a node and a GPU join, all mid-run."""
    trace = load_trace(DATA / "lcbench_189908.csv", "max")
    arrivals = trace.shuffled(3)[:120]
    layout = {f"n{i}": (f"n{i}/g0", f"n{i}/g1") for i in range(4)}
    changes: list = [
        NodeRemoved(300.0, "n1"),
        GpuRemoved(600.0, "n2/g1"),
        NodeAdded(900.0, "n4", ("n4/g0", "n4/g1")),
        GpuAdded(1200.0, "n0", "n0/g2"),
    ]
    executor = SimulatedExecutor(layout, changes=changes)
    scheduler = Scheduler(make_policy(policy), objective=Objective(trace.mode))
    log: list[tuple] = []
    engine = Engine(scheduler, executor, [lambda e, ds: log.extend((e.at, repr(d)) for d in ds)])
    for curve in arrivals:
        engine.post(executor.submit(curve.name, curve, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    return digest(log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 GPUs only, no scale run")
    args = parser.parse_args()
    hashes = paper_runs(args.quick)
    if not args.quick:
        hashes |= scale_run()
    for policy in sorted(POLICIES):
        hashes[f"dynamic {policy}"] = dynamic_run(policy)
    for name, value in hashes.items():
        print(f"{value}  {name}")


if __name__ == "__main__":
    main()
