"""The executor conformance suite on every engine here: the simulator and each local launch mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.trace import TraceTrial
from hermes.testing.executor_conformance import *  # noqa: F401,F403
from hermes.testing.executor_conformance import ExecutorHarness, score

PRINTER = str(Path(__file__).parent / "trials" / "printer.py")
PRINTED = r"step (?P<step>\d+) loss \S+ score (?P<value>\S+)"


class SimulatorHarness(ExecutorHarness):
    gpus = ("n0/g0", "n0/g1")
    blocks = False
    crashes = False  # a crash in a trace is a divergence

    def executor(self, directory: Path) -> SimulatedExecutor:
        return SimulatedExecutor({"n0": self.gpus})

    def work(self, steps: int, *, rate: float = 0.5, seconds: float = 0.05, crash_at: int | None = None) -> TraceTrial:
        last = steps if crash_at is None else crash_at - 1
        epochs = steps if crash_at is None else crash_at  # the crashing epoch costs its time, and gives nothing
        metrics = tuple(score(rate, step) for step in range(1, last + 1))
        return TraceTrial(f"curve-{rate}", metrics, (seconds,) * epochs, crash_at is not None, {"rate": rate})

    def remove_gpu(self, executor: Any, gpu: str) -> None:
        executor.remove_gpu(gpu)


class LocalHarness(ExecutorHarness):
    """Two CPU slots; trials are tests/trials/curve.py as a function (warm or not) or printer.py as a script."""

    gpus = ("local/cpu0", "local/cpu1")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.checkpoints = mode != "script"
        self.precision = 1e-4 if mode == "script" else 1e-12
        self.deciding_step_seconds = 0.3 if mode == "script" else 0.05

    def executor(self, directory: Path) -> LocalExecutor:
        return LocalExecutor(directory, slots=local_slots(cpu_slots=2, threads_per_slot=1), metric="score")

    def work(self, steps: int, *, rate: float = 0.5, seconds: float = 0.05, crash_at: int | None = None) -> TrialLaunch:
        if self.mode == "script":
            command = [sys.executable, PRINTER, "--steps", str(steps), "--rate", str(rate), "--sleep", str(seconds)]
            if crash_at is not None:
                command += ["--crash-at", str(crash_at)]
            return TrialLaunch(steps, command=tuple(command), metric_pattern=PRINTED)
        config = {"rate": rate, "sleep": seconds}
        if crash_at is not None:
            config |= {"crash": "raise", "crash_step": crash_at}
        return TrialLaunch(steps, function="tests.trials.curve:train", config=config, warm=self.mode == "warm")

    def remove_gpu(self, executor: Any, gpu: str) -> None:
        executor.remove_gpu(gpu)


@pytest.fixture(params=["simulator", "warm", "process", "script"])
def harness(request: pytest.FixtureRequest) -> ExecutorHarness:
    return SimulatorHarness() if request.param == "simulator" else LocalHarness(request.param)
