"""What one periodic checkpoint costs: a trial's commit (write, fsync, rename, publish) per state size.

    python bench/checkpoint_cost.py [--sizes 1,10,100] [--repeats 5] [--dir PATH]

``checkpoint_every`` (steps between checkpoints, default 1) trades this cost, paid every
``checkpoint_every`` steps, against the steps a crash makes a trial train again. The figures go in
docs/trials.md; run it on the disk that will hold the runs (``--dir``), since fsync is the disk's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes.trial.session import Session  # noqa: E402


def commit_seconds(directory: Path, state_mb: float, repeats: int) -> list[float]:
    """Seconds per committed checkpoint of ``state_mb`` MB, as a trial's ``save`` commits it."""
    payload = os.urandom(int(state_mb * 1e6))
    saver = SimpleNamespace(save=lambda target: (target / "state.bin").write_bytes(payload))  # as a Files saver writes
    trial = SimpleNamespace(directory=directory, savers={"files": saver})
    times = []
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        Session.save(trial, step)  # the method alone: it reads only the directory and the savers
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,100", help="state sizes in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)  # the disk that will hold the runs, before they do
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for size in (float(s) for s in args.sizes.split(",")):
            times = commit_seconds(Path(root) / f"{size:g}mb", size, args.repeats)
            print(f"{size:>6g} MB: median {statistics.median(times) * 1e3:8.1f} ms, max {max(times) * 1e3:8.1f} ms "
                  f"({size / statistics.median(times):.0f} MB/s)")


if __name__ == "__main__":
    main()
