"""The digits example through a pool session (what `hermes server` runs), side by side: its function trials in
warm workers of their experiment's own (the default), and as a process per run (`trial.warm_workers: false`).

Both runs submit the same spec (same seeded configurations, hermes with every default) to a fresh store and pool on
the same CPU slots, one after the other. Printed per run: mean and last time to first feedback, suspensions, the
experiment's makespan (its first event to its last), the best final accuracy; then the ratios.
Run: python bench/pool_workers.py [--trials 16] [--epochs 20] [--slots 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from hermes.core.decisions import Suspend
from hermes.experiment import parse_spec
from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 900.0


@dataclass
class Outcome:
    workers: str
    first_feedback: list[float]  # per trial: its first report, from the experiment's first event
    suspensions: int
    makespan: float
    best: float


def run(warm: bool, args: argparse.Namespace, directory: Path) -> Outcome:
    spec = yaml.safe_load((ROOT / "examples" / "digits" / "experiment.yaml").read_text())
    spec["name"] = "pool-warm" if warm else "pool-process"
    spec["trial"] |= {"workdir": str(ROOT), "warm_workers": warm}
    spec["search"]["trials"] = args.trials
    spec["budget"]["steps"] = args.epochs
    spec["storage"] = {"dir": str(directory / "runs"), "checkpoint_every": args.epochs}
    store = SqlStore(f"sqlite:///{directory}/pool.db")
    experiment = PoolSession.submit(store, parse_spec(spec, source=spec["name"]), owner="bench")
    pool = PoolSession(store, directory, resources=ResourcesSpec(gpus="none", cpu_slots=args.slots), poll=0.1)
    runner = threading.Thread(target=pool.run)
    runner.start()
    deadline = time.monotonic() + TIMEOUT
    try:
        while store.experiment(experiment).status is not ExperimentStatus.FINISHED:
            if time.monotonic() > deadline or not runner.is_alive():
                raise RuntimeError(f"{spec['name']} did not finish: {store.experiment(experiment).status}")
            time.sleep(0.2)
    finally:
        pool.stop()
        runner.join()
    events = store.events(experiment)
    start = events[0].at
    first: dict[str, float] = {}
    for record in store.metrics(experiment):
        first.setdefault(record.trial_id, record.at - start)
    finals = [record.values["accuracy"] for record in store.metrics(experiment) if record.step == args.epochs]
    outcome = Outcome(
        "warm workers" if warm else "process per run",
        list(first.values()),
        sum(isinstance(record.decision, Suspend) for record in store.decisions(experiment)),
        events[-1].at - start,
        max(finals, default=float("nan")),
    )
    store.close()
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    outcomes = []
    for warm in (True, False):
        with tempfile.TemporaryDirectory(prefix="hermes-pool-bench-") as directory:
            outcomes.append(run(warm, args, Path(directory)))
    print(f"digits example in a pool: {args.trials} trials x {args.epochs} epochs on {args.slots} CPU slots, hermes")
    print(f"{'workers':<16} {'mean 1st fb s':>13} {'last 1st fb s':>13} {'suspensions':>11} {'makespan s':>10} "
          f"{'best':>7}")
    for o in outcomes:
        print(f"{o.workers:<16} {statistics.fmean(o.first_feedback):13.1f} {max(o.first_feedback):13.1f} "
              f"{o.suspensions:11d} {o.makespan:10.1f} {o.best:7.4f}")
    warm, process = outcomes
    print(f"warm workers over a process per run: first feedback "
          f"{statistics.fmean(process.first_feedback) / statistics.fmean(warm.first_feedback):.2f}x sooner, "
          f"makespan {process.makespan / warm.makespan:.2f}x shorter")


if __name__ == "__main__":
    main()
