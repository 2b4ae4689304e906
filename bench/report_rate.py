"""Wall time per report: 300 tiny trials (a few instant steps each) on 2 CPU slots, through `hermes run`.

The trials do no work, so what is measured is Hermes itself: recording every event durably
(SQLite, WAL, synchronous=FULL), the core, the report handshake and starting trials in warm
workers. Printed: reports, wall time in all and per report, time to the first report, the
runner's CPU time per report. Target: at most 20 ms of wall time per report.
With --profile, the runner's 25 most expensive functions (cumulative time) follow.
Run: python bench/report_rate.py [--trials 300] [--steps 5] [--slots 2] [--policy hermes] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from hermes.experiment import parse_spec
from hermes.session import ExperimentSession

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 20.0


def spec_for(args: argparse.Namespace, storage: Path) -> dict:
    return {
        "name": "report-rate",
        "trial": {"function": "trials.curve:train", "workdir": str(ROOT / "tests")},
        "search": {
            "trials": args.trials,
            "space": {"rate": {"type": "uniform", "low": 0.1, "high": 1.0}, "sleep": {"type": "choice", "values": [0]}},
        },
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": args.steps},
        "policy": {"name": args.policy, **({} if args.period is None else {"period": args.period})},
        "resources": {"gpus": "none", "cpu_slots": args.slots},
        "storage": {"dir": str(storage), "checkpoint_every": args.checkpoint_every},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--policy", default="hermes")
    parser.add_argument("--period", type=float, help="seconds of a turn (default: the policy's own; hermes learns it)")
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-report-rate-") as directory:
        storage = Path(directory) / "runs"
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        session = ExperimentSession(parse_spec(spec_for(args, storage), source="report-rate"))
        session.run()
        if profile is not None:
            profile.disable()
        wall, cpu = time.perf_counter() - wall_started, time.process_time() - cpu_started
        metrics = session.store.metrics(session.experiment_id)
        session.store.close()
    reports = len(metrics)
    first = min(record.at for record in metrics)
    print(f"{args.trials} trials x {args.steps} steps on {args.slots} CPU slots, policy {args.policy}")
    print(f"reports                 {reports:10d}")
    print(f"wall time               {wall:10.2f} s")
    print(f"wall time per report    {wall / reports * 1000:10.2f} ms   (target <= {TARGET_MS:g} ms)")
    print(f"first report after      {first:10.2f} s")
    print(f"runner CPU per report   {cpu / reports * 1000:10.2f} ms")
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
