"""How fast Hermes switches trials: suspend + resume on one slot, and migration to another.

    python bench/switching.py [--repeats 20] [--megabytes 10]

A function trial holds a model and SGD momentum of ``--megabytes`` of state in all, and every
step is one small SGD step. The executor suspends it at a report and resumes it, again and again,
on the same slot (warm workers: from memory) or on the other slot (a migration: a checkpoint
written by one worker and read by the other), and for comparison with a process per trial
(``warm_workers: false``: checkpoint, exit, new process, import, restore). Each latency is the time
from the decision to the trial's next report, less one step's compute time (the median step of
the same trial run uninterrupted). Targets (issue 5): suspend + resume on the same slot 100 ms or
less, migration 1 s or less. The overhead on a real workload is measured by
``bench/frameworks/compare.py`` (fraction of slot time spent training).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes.core.decisions import Resume, Start, Suspend  # noqa: E402
from hermes.core.events import TrialReported, TrialSuspended  # noqa: E402
from hermes.local import LocalExecutor, TrialLaunch, local_slots  # noqa: E402

STEPS = 10_000  # budget: more than any run here takes


def trial(config: dict) -> None:
    """The benchmarked trial: a linear layer whose weights and momentum hold the state."""
    import torch

    from hermes import trial as api

    floats = int(config["megabytes"] * 2**20 / 4 / 2)  # weights and momentum, float32
    side = int(floats**0.5)
    torch.manual_seed(0)
    model = torch.nn.Linear(side, side, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    state = api.Checkpoint(model=model, optimizer=optimizer)
    batch = torch.randn(4, side)
    for step in range(state.restore() + 1, api.budget() + 1):
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        api.report(step, loss=float(step))


def _next(executor: LocalExecutor, kind: type) -> object:
    while True:
        for event in executor.next_events():
            if isinstance(event, kind):
                return event


def measure(warm: bool, megabytes: float, repeats: int, directory: Path) -> dict[str, float]:
    """Median seconds of a same-slot suspend+resume and of a migration, less one step."""
    launch = TrialLaunch(STEPS, function="bench.switching:trial", config={"megabytes": megabytes}, warm=warm)
    slots = local_slots(cpu_slots=2, threads_per_slot=1)
    with LocalExecutor(directory, slots=slots, metric="loss", cwd=ROOT) as executor:
        executor.submit("t", launch)
        here, there = (slot.name for slot in slots)
        executor.apply(Start("t", here), executor.now())
        report = _next(executor, TrialReported)
        steps = []
        for _ in range(20):  # uninterrupted steps: what a step costs
            executor.settled(report)
            previous = report.at
            report = _next(executor, TrialReported)
            steps.append(report.at - previous)
        step = statistics.median(steps)

        def switch(destination: str) -> float:
            nonlocal report
            began = executor.now()
            executor.apply(Suspend("t"), began)
            executor.settled(report)
            _next(executor, TrialSuspended)
            executor.apply(Resume("t", destination, migrated=destination != here), executor.now())
            report = _next(executor, TrialReported)
            return report.at - began - step

        for destination in (there, here):  # warm-up: both slots' workers have started
            switch(destination)
        same, moved = [], []
        for _ in range(repeats):
            same.append(switch(here))
            moved.append(switch(there))
            here, there = there, here
        return {"step": step, "same_slot": statistics.median(same), "migration": statistics.median(moved)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="switches of each kind (default 20)")
    parser.add_argument("--megabytes", type=float, default=10.0, help="trial state in MB (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        warm = measure(True, args.megabytes, args.repeats, Path(directory) / "warm")
        cold = measure(False, args.megabytes, max(3, args.repeats // 5), Path(directory) / "cold")
    print(f"switch latency, {args.megabytes:g} MB of trial state, median of {args.repeats} (less one step):")
    print(f"{'':28}{'warm workers':>14}{'process/trial':>15}{'ratio':>8}  target")
    for key, label, target in (("same_slot", "suspend + resume, same slot", "<= 100 ms"),
                               ("migration", "migration to another slot", "<= 1 s")):
        print(f"{label:28}{warm[key] * 1000:>11.1f} ms{cold[key] * 1000:>12.1f} ms{cold[key] / warm[key]:>7.1f}x  {target}")
    print(f"(one step: {warm['step'] * 1000:.1f} ms warm, {cold['step'] * 1000:.1f} ms process)")


if __name__ == "__main__":
    main()
