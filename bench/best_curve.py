"""Best metric found as a function of time, per policy, on the shipped traces: one PNG per trace.

Each policy replays the same arrival orders (seeds 0..K-1); the plot shows, for every policy, the
best metric reported so far against simulated hours, the median over seeds from when every seed has
reported (from each run's ``best_curve``). Run: python bench/best_curve.py [--seeds 5] [--gpus 4] [--out bench/out]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from hermes.cli import positive_int
from hermes.sim.compare import Setting, run_one
from hermes.sim.trace import load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
TRACES = (("nasbench_nlp_wt2.csv", "min", "validation loss"), ("lcbench_189908.csv", "max", "validation accuracy %"))
POLICIES = ("fifo", "rr", "slaq", "asha", "hyperband", "hermes")


def _steps(grid: np.ndarray, curve: list[tuple[float, float]]) -> np.ndarray:
    """The best-so-far step function sampled at ``grid`` (NaN before the first report)."""
    times = np.array([t for t, _ in curve])
    values = np.array([v for _, v in curve])
    index = np.searchsorted(times, grid, side="right") - 1
    return np.where(index >= 0, values[np.maximum(index, 0)], np.nan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--gpus", type=positive_int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    args = parser.parse_args()
    from matplotlib.figure import Figure

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: cannot make {args.out}: {error.strerror}")
    for file, mode, label in TRACES:
        trace = load_trace(DATA / file, mode)
        figure = Figure(figsize=(8, 4.5), layout="constrained")
        axes = figure.add_subplot()
        for policy in POLICIES:
            runs = [run_one(trace, policy, seed, Setting(gpus=args.gpus)) for seed in range(args.seeds)]
            end = max(r.makespan_s for r in runs)
            grid = np.geomspace(60.0, end, 400)
            curves = [_steps(grid, r.best_curve) for r in runs]
            reported = ~np.isnan(curves).any(axis=0)  # a median over the seeds that reported so far could worsen
            median = np.median(np.asarray(curves)[:, reported], axis=0)
            axes.plot(grid[reported] / 3600, median, label=policy, linewidth=2.5 if policy == "hermes" else 1.2)
        axes.set_xscale("log")
        axes.set_xlabel(f"simulated hours ({args.gpus} GPUs)")
        axes.set_ylabel(f"best {label} so far")
        axes.set_title(f"{file}: median over {args.seeds} arrival orders")
        axes.legend()
        path = Path(args.out) / f"best_curve_{file.removesuffix('.csv')}.png"
        figure.savefig(path, dpi=110)
        print(path)


if __name__ == "__main__":
    main()
