"""The Ray engine on a real multi-node Ray cluster of this machine, side by side with the local engine.

    python bench/ray_engine.py [--nodes 3] [--gpus 2] [--trials 120] [--steps 4] [--sleep 0.05]

Starts a head and ``nodes`` worker nodes with ``gpus`` fake GPUs each (hermes/testing/ray_cluster.py),
then measures:

1. the same experiment (``trials`` short trials of ``steps`` steps, FIFO, so that every report is
   answered ``continue`` and times only the round trip) with ``engine: ray`` and with the local
   engine on as many CPU slots: scheduling throughput (reports per second of makespan),
   report-to-answer latency as the trials see it (p50, p99; bench/trials/stateful.py times each
   ``trial.report``), and the fraction of slot time lost to overhead
   (1 - trials x steps x sleep / (makespan x slots));
2. a suspended trial's resumption with 10 MB and 100 MB of state: on its own node (parked in
   memory) and on another node (spilled, carried through the object store, restored), from the
   Resume decision to its next report, minus the step's sleep; median of ``repeats``;
3. node loss: a worker node's raylet killed mid-run; detection (the kill to NodeRemoved in the
   core) and recovery (the kill to the moment every trial that ran there reported again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes.core.decisions import Resume, Start, Suspend  # noqa: E402
from hermes.core.events import NodeRemoved, TrialExited, TrialReported, TrialSuspended  # noqa: E402
from hermes.experiment import parse_spec  # noqa: E402
from hermes.local.launch import TrialLaunch  # noqa: E402
from hermes.ray.executor import RayExecutor  # noqa: E402
from hermes.session import ExperimentSession  # noqa: E402
from hermes.testing.ray_cluster import RayCluster  # noqa: E402


def spec(name: str, directory: Path, engine: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "trial": {"function": "bench.trials.stateful:train", "workdir": str(ROOT)},
        "search": {"sampler": "random", "trials": args.trials, "seed": 0,
                   "space": {"rate": {"type": "uniform", "low": 0.2, "high": 1.0},
                             "sleep": {"type": "choice", "values": [args.sleep]}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": args.steps},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": args.nodes * args.gpus},
        "storage": {"dir": str(directory / name), "checkpoint_every": args.steps, "allow_outside": True},
        "engine": engine,
        **extra,
    }


def experiment(name: str, document: dict[str, Any], listeners: list | None = None) -> tuple[ExperimentSession, float]:
    session = ExperimentSession(parse_spec(document), listeners=listeners)
    started = time.monotonic()
    session.run()
    return session, time.monotonic() - started


def throughput(engine: str, directory: Path, args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, float]:
    name = f"bench-{engine}"
    session, _ = experiment(name, spec(name, directory, engine, args, **extra))
    events = session.store.events(session.experiment_id)
    reports = [e for e in events if isinstance(e, TrialReported)]
    first = min(e.at for e in events if not isinstance(e, TrialReported) and hasattr(e, "trial_id"))
    makespan = max(e.at for e in events if isinstance(e, TrialExited)) - first
    latencies = []
    for result in (directory / name).rglob("result.json"):
        latencies += json.loads(result.read_text())["latencies"]
    latencies.sort()
    slots = args.nodes * args.gpus
    session.store.close()
    return {
        "reports/s": len(reports) / makespan,
        "p50 ms": 1e3 * latencies[len(latencies) // 2],
        "p99 ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "overhead": 1 - args.trials * args.steps * args.sleep / (makespan * slots),
        "makespan s": makespan,
    }


def resumptions(cluster: RayCluster, directory: Path, megabytes: int, repeats: int) -> dict[str, float]:
    """Median seconds from Resume to the next report, less a step, on the same node and across nodes."""
    from hermes.ray.executor import node_name

    first, second = (node_name(node.node_id) for node in cluster.nodes[1:3])
    sleep = 0.01
    timings: dict[str, list[float]] = {"same node": [], "other node": []}
    with RayExecutor(directory, storage_uri=(directory / "durable").as_uri(), metric="score") as executor:
        executor.next_events()
        for node in (first, second):  # warm both nodes' workers (their first start imports Python)
            warm = f"warm-{node}-{megabytes}"
            executor.submit(warm, TrialLaunch(1, function="bench.trials.stateful:train", cwd=str(ROOT)))
            executor.apply(Start(warm, f"{node}/gpu0"), executor.now())
            _until(executor, lambda e, warm=warm: isinstance(e, TrialExited) and e.trial_id == warm)
        trial = f"m{megabytes}"
        config = {"mb": megabytes, "sleep": sleep}
        launch = TrialLaunch(2 * repeats + 2, function="bench.trials.stateful:train", config=config, cwd=str(ROOT))
        executor.submit(trial, launch)
        executor.apply(Start(trial, f"{first}/gpu0"), executor.now())
        _until(executor, lambda e: isinstance(e, TrialReported), suspend=trial)
        place = first
        for index in range(2 * repeats):
            _until(executor, lambda e: isinstance(e, TrialSuspended))
            kind = "same node" if index % 2 == 0 else "other node"
            if kind == "other node":
                place = second if place == first else first
            decided = executor.now()
            executor.apply(Resume(trial, f"{place}/gpu0", migrated=kind == "other node"), decided)
            report = _until(executor, lambda e: isinstance(e, TrialReported), suspend=trial)
            timings[kind].append(report.at - decided - sleep)
        _until(executor, lambda e: isinstance(e, TrialSuspended))
    return {kind: statistics.median(values) for kind, values in timings.items()}


def _until(executor: RayExecutor, done: Any, *, suspend: str | None = None, settle: bool = True) -> Any:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for event in executor.next_events():
            if suspend is not None and isinstance(event, TrialReported) and event.trial_id == suspend:
                executor.apply(Suspend(suspend), executor.now())
            if done(event):
                if settle:
                    executor.settled(event)
                return event
            executor.settled(event)
    raise TimeoutError("the awaited event never came")


def node_loss(
    cluster: RayCluster, directory: Path, args: argparse.Namespace, extra: dict[str, Any]
) -> dict[str, float]:
    from hermes.ray.executor import node_name

    victim = cluster.nodes[-1]
    name = node_name(victim.node_id)
    seen: dict[str, Any] = {"lost": set()}

    def watch(event: Any, decisions: list) -> None:
        if isinstance(event, TrialReported) and "killed" not in seen and event.step >= 2:
            seen["lost"] = {t.trial_id for t in session.scheduler.trials.values()
                            if t.gpu is not None and t.gpu.startswith(name)}
            if seen["lost"]:
                seen["killed"] = cluster.kill_raylet(victim)
        elif isinstance(event, NodeRemoved):
            seen["removed"] = time.monotonic()
        elif isinstance(event, TrialReported) and "removed" in seen and event.trial_id in seen["lost"]:
            seen["lost"].discard(event.trial_id)
            if not seen["lost"]:
                seen["recovered"] = time.monotonic()

    document = spec("bench-loss", directory, "ray", argparse.Namespace(**{**vars(args), "trials": 12, "steps": 6,
                                                                            "sleep": 0.3}), **extra)
    document["storage"]["checkpoint_every"] = 2
    session = ExperimentSession(parse_spec(document), listeners=[watch])
    session.run()
    session.store.close()
    return {"detection s": seen["removed"] - seen["killed"], "recovery s": seen["recovered"] - seen["killed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--megabytes", default="10,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="throughput,migration,loss")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="hermes-ray-bench-"))
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with RayCluster(workers=args.nodes, gpus_per_node=args.gpus, env_overrides={"PYTHONPATH": pythonpath},
                    object_store_bytes=400 * 2**20) as cluster:
        cluster.connect()
        extra = {"ray": {"address": cluster.address}}
        print(f"{args.trials} trials x {args.steps} steps of {args.sleep} s, FIFO, "
              f"{args.nodes} nodes x {args.gpus} GPUs (Ray) vs {args.nodes * args.gpus} CPU slots (local)")
        if "throughput" in args.parts:
            rows = {"ray": throughput("ray", directory, args, extra), "local": throughput("local", directory, args, {})}
            keys = list(rows["ray"])
            print(f"{'engine':8}" + "".join(f"{key:>13}" for key in keys))
            for engine, row in rows.items():
                print(f"{engine:8}" + "".join(f"{row[key]:>13.3f}" for key in keys))
        for megabytes in (int(m) for m in args.megabytes.split(",")) if "migration" in args.parts else ():
            timing = resumptions(cluster, directory / f"move-{megabytes}", megabytes, args.repeats)
            print(f"resume with {megabytes} MB of state: " + ", ".join(f"{k} {v:.3f} s" for k, v in timing.items()))
        if "loss" in args.parts:
            loss = node_loss(cluster, directory, args, extra)
            print("node loss (raylet SIGKILL): " + ", ".join(f"{k} {v:.2f}" for k, v in loss.items()))


if __name__ == "__main__":
    main()
