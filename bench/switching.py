"""How fast Hermes switches trials, and the calibration of the simulator's switch-cost model.

    python bench/switching.py [--repeats 20] [--megabytes 10,40] [--gpu] [--write]

A function trial holds a model and SGD momentum of ``--megabytes`` of state in all, and every
step is one small SGD step. The executor starts it, suspends it at a report and resumes it, again
and again, on the same slot (warm workers: from memory) or on the other slot (a migration: a
checkpoint written by one worker and read by the other), and for comparison with a process per
trial (``warm_workers: false``: checkpoint, exit, new process, import, restore). Each latency is
the time from the decision to the trial's next event, less one step's compute time (the median
step of the same trial run uninterrupted); a start is that of a second trial on a slot whose
worker already runs (a warm pool's steady state; a process per run starts a process anyway). Targets (issue 5): suspend + resume on the same slot
100 ms or less, migration 1 s or less.

Two state sizes give each path a latency and a bandwidth (a line through the medians). With
``--write`` the fit goes to ``hermes/sim/calibration.json``, which the simulator's cost model reads
(``hermes.sim.costs``); what this machine cannot measure (PCIe without a CUDA device, the network
on one machine) keeps the file's assumption and is listed as assumed.

With ``--gpu`` the trial's state lives on the first CUDA device and both slots are that device
(or the first two), so a suspend moves it to host memory over PCIe and empties torch's cache, as
it does in production. The suspend and resume lines then measure the device's bandwidth too.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
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
from hermes.local.resources import Slot, discover_gpus  # noqa: E402
from hermes.sim.costs import CALIBRATION, load_calibration  # noqa: E402

STEPS = 10_000  # budget: more than any run here takes


def trial(config: dict) -> None:
    """The benchmarked trial: a linear layer whose weights and momentum hold the state."""
    import torch

    from hermes import trial as api

    floats = int(config["megabytes"] * 2**20 / 4 / 2)  # weights and momentum, float32
    side = int(floats**0.5)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU slot shows its device, a CPU slot none
    torch.manual_seed(0)
    model = torch.nn.Linear(side, side, bias=False, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    state = api.Checkpoint(model=model, optimizer=optimizer)
    batch = torch.randn(4, side, device=device)
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


def slots_to_measure(gpu: bool) -> list[Slot]:
    """Two CPU slots of one thread, or two slots of the first two GPUs (twice the first if it is alone)."""
    if not gpu:
        return local_slots(cpu_slots=2, threads_per_slot=1)
    gpus = discover_gpus()
    if not gpus:
        raise SystemExit("--gpu: NVML finds no GPU")
    return local_slots(gpus=(gpus * 2)[:2])


def measure(warm: bool, megabytes: float, repeats: int, directory: Path, slots: list[Slot]) -> dict[str, float]:
    """Median seconds of a start, a suspend, a resume on the same slot and one on the other, less one step."""
    launch = TrialLaunch(STEPS, function="bench.switching:trial", config={"megabytes": megabytes}, warm=warm)
    with LocalExecutor(directory, slots=slots, metric="loss", cwd=ROOT) as executor:
        executor.submit("t", launch)
        executor.submit("u", launch)
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

        def switch(destination: str) -> tuple[float, float]:
            nonlocal report
            began = executor.now()
            executor.apply(Suspend("t"), began)
            executor.settled(report)
            suspended = _next(executor, TrialSuspended)
            resumed = executor.now()
            executor.apply(Resume("t", destination, migrated=destination != here), resumed)
            report = _next(executor, TrialReported)
            return suspended.at - began, report.at - resumed - step

        for destination in (there, here):  # warm-up: both slots' workers have started
            switch(destination)
        suspend, same, moved = [], [], []
        for _ in range(repeats):
            for destination, into in ((here, same), (there, moved)):
                paused, resumed = switch(destination)
                suspend.append(paused)
                into.append(resumed)
            here, there = there, here
        executor.apply(Suspend("t"), executor.now())  # a second trial starts on the slot's running worker
        executor.settled(report)
        _next(executor, TrialSuspended)
        began = executor.now()
        executor.apply(Start("u", here), began)
        started = _next(executor, TrialReported).at - began
        return {
            "step": step,
            "start": started - step,
            "suspend": statistics.median(suspend),
            "resume": statistics.median(same),
            "resume_other": statistics.median(moved),
        }


def device_bandwidth(megabytes: float, repeats: int) -> float | None:
    """MB/s of copying a trial's state from a CUDA device to host memory and back (None without one)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tensor = torch.empty(int(megabytes * 2**20 / 4), dtype=torch.float32, device="cuda")
    seconds = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        began = time.perf_counter()
        host = tensor.to("cpu")
        host.to("cuda")
        torch.cuda.synchronize()
        seconds.append((time.perf_counter() - began) / 2)
    return megabytes / statistics.median(seconds[1:])


def line(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Latency and bandwidth of a path from the medians at two or more sizes (inf: no growth with size)."""
    slope = statistics.linear_regression(sizes, seconds).slope if len(set(sizes)) > 1 else 0.0
    if slope <= 0:
        return max(statistics.fmean(seconds), 0.0), math.inf
    return max(statistics.fmean(seconds) - slope * statistics.fmean(sizes), 0.0), 1.0 / slope


def calibration(sizes: list[float], warm: list[dict[str, float]], cold: list[dict[str, float]],
                device_mb_s: float | None, slots: list[Slot]) -> dict:
    """The cost model's profiles from the measurements, in the format ``hermes.sim.costs`` reads.

    On GPU slots a warm suspend and resume copy the state over PCIe, so their fixed parts are the
    intercepts of their lines and the device's bandwidth comes from their slopes."""
    previous = load_calibration()
    spill, spill_mb_s = line(sizes, [m["resume_other"] - m["resume"] for m in warm])
    on_device = {}
    if slots[0].visible_devices:
        (suspend, suspend_mb_s), (resume, resume_mb_s) = (line(sizes, [m[key] for m in warm]) for key in ("suspend", "resume"))
        if suspend_mb_s < math.inf and resume_mb_s < math.inf:
            device_mb_s = 2 / (1 / suspend_mb_s + 1 / resume_mb_s)
        on_device = {"suspend": suspend, "resume": resume}
        described = f"2 slots on the GPUs {', '.join(sorted({slot.visible_devices for slot in slots}))}"
    else:
        described = "2 CPU slots, one thread each"

    def costs(measured: list[dict[str, float]], prior: dict[str, float], extra: dict[str, float]) -> dict:
        values = {key: max(statistics.fmean(m[key] for m in measured), 0.0) for key in ("start", "suspend", "resume")}
        values |= extra
        values |= {key: prior[key] for key in ("migration", "network_mb_s")}
        values["device_mb_s"] = device_mb_s or prior["device_mb_s"]
        return {key: None if math.isinf(value) else round(value, 6) for key, value in values.items()}

    assumed = ["migration", "network_mb_s"] + ([] if device_mb_s else ["device_mb_s"])
    process_spill = {"spill": 0.0, "spill_mb_s": math.inf}  # a process per run checkpoints at every suspend
    return {
        "about": "switch-cost model of hermes.sim.costs, written by bench/switching.py --write; "
                 "latencies in s, bandwidths in MB/s (null: no cost per MB)",
        "measured": {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {platform.system()}",
                     "slots": described, "state_mb": sizes},
        "profiles": {
            "warm": {"costs": costs(warm, previous["warm"], {"spill": spill, "spill_mb_s": spill_mb_s} | on_device),
                     "assumed": assumed},
            "process": {"costs": costs(cold, previous["process"], process_spill), "assumed": assumed},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="switches of each kind (default 20)")
    parser.add_argument("--megabytes", default="10,40", help="trial state sizes in MB (default 10,40)")
    parser.add_argument("--gpu", action="store_true", help="keep the trial's state on a CUDA device (slots on the GPUs)")
    parser.add_argument("--write", action="store_true", help=f"write the fitted model to {CALIBRATION.name}")
    parser.add_argument("--output", type=Path, default=CALIBRATION, help=f"where --write writes (default {CALIBRATION.name})")
    args = parser.parse_args()
    sizes = [float(size) for size in args.megabytes.split(",")]
    slots = slots_to_measure(args.gpu)
    warm, cold = [], []
    with tempfile.TemporaryDirectory() as directory:
        for size in sizes:
            warm.append(measure(True, size, args.repeats, Path(directory) / f"warm{size:g}", slots))
            cold.append(measure(False, size, max(3, args.repeats // 5), Path(directory) / f"cold{size:g}", slots))
    print(f"switch latency, median of {args.repeats} (less one step):")
    print(f"{'':34}{'warm workers':>14}{'process/trial':>15}{'ratio':>8}  target")
    for size, hot, slow in zip(sizes, warm, cold):
        for key, label, target in (("same_slot", "suspend + resume, same slot", "<= 100 ms"),
                                   ("migration", "migration to another slot", "<= 1 s")):
            resume = "resume" if key == "same_slot" else "resume_other"
            fast, dear = hot["suspend"] + hot[resume], slow["suspend"] + slow[resume]
            print(f"{f'{size:g} MB, {label}':34}{fast * 1000:>11.1f} ms{dear * 1000:>12.1f} ms{dear / fast:>7.1f}x  {target}")
        print(f"{f'{size:g} MB, start':34}{hot['start'] * 1000:>11.1f} ms{slow['start'] * 1000:>12.1f} ms")
        print(f"(one step at {size:g} MB: {hot['step'] * 1000:.1f} ms warm, {slow['step'] * 1000:.1f} ms process)")
    device = device_bandwidth(max(sizes), args.repeats)
    print("device <-> host copy: " + (f"{device:.0f} MB/s" if device else "no CUDA device (the calibration keeps its assumption)"))
    result = calibration(sizes, warm, cold, device, slots)
    print(json.dumps(result["profiles"], indent=1))
    if args.write:
        args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"written: {args.output}")


if __name__ == "__main__":
    main()
