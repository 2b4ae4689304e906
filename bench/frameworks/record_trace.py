"""Record the real workload of ``compare.py`` as a simulator trace: every configuration trained to its end.

    python bench/frameworks/record_trace.py --out my_digits.csv [--trials 40] [--epochs 24] [--force]

Trains ``workload.configurations(trials)`` for ``epochs`` epochs each, two at a time as in
``compare.py`` (2 slots of one torch thread), and writes the trace format of ``hermes.sim.trace``:
validation accuracy (max) and seconds per epoch, with the hyper-parameters as ``param_`` columns and
the size of what a checkpoint holds (model, optimizer and RNG states) as ``state_mb``, which sets what
a switch costs in the simulator.
The simulator then replays the comparison's search in a second, so a policy change can be judged
on the real workload before the half-hour run of ``compare.py`` (``bench/policy_panel.py`` includes
the trace).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from multiprocessing import Pool
from pathlib import Path

if not __package__:  # run as a script: make `bench` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.frameworks.systems import SLOTS  # noqa: E402

Row = tuple[int, int, float, float]


def train(job: tuple[int, int, int]) -> tuple[list[Row], float]:
    """(trial, epoch, accuracy, seconds) of configuration ``index`` of ``configurations(trials)``, and the
    MB its checkpoint holds once trained."""
    import torch

    from bench.frameworks.workload import Trainer, configurations

    index, trials, epochs = job
    trainer = Trainer(configurations(trials)[index])
    rows = [(index, epoch + 1, *trainer.train_epoch()) for epoch in range(epochs)]
    state = io.BytesIO()
    torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "rng": torch.get_rng_state()}, state)
    return rows, state.tell() / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--out", type=Path, required=True,
                        help="the CSV to write (the shipped data/digits_mlp.csv is replaced only with --force)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args()
    if args.out.exists() and not args.force:
        parser.error(f"--out {args.out} exists: give another path, or --force to replace it")
    from bench.frameworks.workload import SPACE, configurations  # torch, seconds to import: after the checks

    configs = configurations(args.trials)
    names = list(SPACE)
    with Pool(SLOTS) as pool, args.out.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["trial", "epoch", "metric", "seconds", "state_mb", *(f"param_{name}" for name in names)])
        for rows, state_mb in pool.imap(train, [(index, args.trials, args.epochs) for index in range(args.trials)]):
            for index, epoch, accuracy, seconds in rows:
                params = [configs[index][name] for name in names]
                writer.writerow([index, epoch, f"{accuracy:.6f}", f"{seconds:.4f}", f"{state_mb:.4f}", *params])
    print(f"{args.out}: {args.trials} trials x {args.epochs} epochs")


if __name__ == "__main__":
    main()
