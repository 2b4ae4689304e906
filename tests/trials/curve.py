"""A function trial with a synthetic learning curve, resumable from its checkpoints.

Config (every key optional):

- ``rate``: how fast the curve rises towards 1 (``score = 1 - exp(-rate * step)``);
- ``sleep``: seconds of "training" per step;
- ``crash``: ``"none"``, ``"raise"`` (an exception at step ``crash_step``), ``"exit3"``
  (``sys.exit(3)`` there) or ``"hard"`` (``os._exit(7)``: the whole process ends at once, a warm
  worker with it), to test failing trials; ``crash_runs``: only the first runs that reach that step crash
  (default: all), to test a trial run again after a crash;
- ``leak_mb``: megabytes the trial allocates and never frees at every step, to test memory limits;
- ``report``: ``"ok"``, ``"nan"`` (reports NaN as the objective), ``"unnamed"`` (reports a
  metric that is not the spec's), ``"iterations"`` (counts its steps in hundreds, iterations as it were) or
  ``"never"`` (trains and returns without a report), to test bad reports;
- ``hang_after``: the trial sleeps for good after reporting this step (0: before its first
  report), to test hung trials;
- ``ballast_kb``: kilobytes of filler written into every checkpoint, to fill a small disk;
  ``ballast_error``: ``"runtime"`` says a failed checkpoint write as torch.save does, a RuntimeError;
- ``hold_save``: a step whose checkpoint waits, half written, until a test lets it go: the trial
  creates ``saving-<step>`` in its directory and waits for ``go-<step>`` there.
- ``stateless``: true keeps no checkpoint of its state (no saver): after a resume it starts over;
- ``implicit_steps``: true reports without a step (``trial.report(score=...)``: the next one).

Its state is a small JSON file saved with ``trial.Files``: the running sum of the scores, which a
correct resume continues exactly, and the pid of every process that worked on it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hermes import trial


_leaked: list[bytearray] = []  # what leak_mb allocates, never freed


def score(rate: float, step: int) -> float:
    return 1.0 - math.exp(-rate * step)


def train(config: dict[str, Any]) -> None:
    rate = float(config.get("rate", 0.5))
    sleep = float(config.get("sleep", 0.05))
    crash = str(config.get("crash", "none"))
    crash_step = int(config.get("crash_step", 2))
    crash_runs = int(config.get("crash_runs", 1 << 30))
    report = str(config.get("report", "ok"))
    hold_save = int(config.get("hold_save", 0))
    leak_mb = int(config.get("leak_mb", 0))
    ballast_kb = int(config.get("ballast_kb", 0))
    hang_after = int(config.get("hang_after", -1))
    state: dict[str, Any] = {"total": 0.0, "pids": [], "step": 0}

    def save(directory: Path) -> None:
        try:
            (directory / "state.json").write_text(json.dumps(state))
            if ballast_kb:
                (directory / "ballast").write_bytes(bytes(1024 * ballast_kb))
        except OSError as error:
            if config.get("ballast_error") != "runtime":
                raise
            raise RuntimeError(f"[enforce fail at inline_container.cc] unexpected pos ({error})") from None
        if state["step"] == hold_save:
            (trial.trial_dir() / f"saving-{hold_save}").touch()
            while not (trial.trial_dir() / f"go-{hold_save}").exists():
                time.sleep(0.005)

    def load(directory: Path) -> None:
        state.update(json.loads((directory / "state.json").read_text()))

    start = 0 if config.get("stateless") else trial.Files(save, load).restore()
    state["pids"].append(os.getpid())
    for step in range(start + 1, trial.budget() + 1):
        if step == hang_after + 1:
            time.sleep(3600)
        time.sleep(sleep)
        if step == crash_step and crash != "none":
            crashes = trial.trial_dir() / "crashes"
            crashed = int(crashes.read_text()) if crashes.exists() else 0
            crashes.write_text(str(crashed + 1))
            if crashed >= crash_runs:
                crash = "none"
        if step == crash_step and crash == "raise":
            print(f"about to fail at step {step}", file=sys.stderr)
            raise RuntimeError(f"synthetic failure at step {step}")
        if step == crash_step and crash == "exit3":
            print(f"giving up at step {step} with exit code 3", file=sys.stderr, flush=True)
            sys.exit(3)
        if step == crash_step and crash == "hard":
            os._exit(7)
        if leak_mb:
            _leaked.append(bytearray(os.urandom(1024)) * (leak_mb * 1024))
        value = score(rate, step)
        state["total"] += value
        state["step"] = step
        if report == "nan":
            trial.report(step, score=math.nan, total=state["total"])
        elif report == "unnamed":
            trial.report(step, accuracy=value, loss=1.0 - value)
        elif report == "iterations":
            trial.report(100 * step, score=value, total=state["total"])
        elif config.get("implicit_steps"):
            trial.report(score=value, total=state["total"])
        elif report != "never":
            trial.report(step, score=value, total=state["total"])
    (trial.trial_dir() / "result.json").write_text(json.dumps(state))
