"""The live view's cost (hermes.live): what it takes from the engine's thread, and from the run.

1. A real core on 8 GPUs driven through real events (submissions, reports, exits), as tests/test_live.py drives
   its scenarios, to 1,000 and 10,000 trials (most ended, 8 running, 100 pending), the view listening from the
   start: the median time of a snapshot (``_take``, on the engine's thread, after each report) and of a frame
   (what Rich's refresh thread does 4 times a second: render the view into a 120x50 terminal).
2. A simulated run (the real engine, the simulated executor, policy hermes) of 3,000 trials of 10 epochs on
   16 GPUs, as fast as the core goes: reports per second without the view and with it (inside ``with view:``,
   Rich's refresh thread drawing into a terminal that is a buffer), per second of the process's CPU time (both
   threads: under one GIL, what the view takes the engine waits for; unlike wall time, it does not depend on what
   else the machine runs).

The view takes a snapshot at most every 0.2 s and draws 4 frames a second: both cost the run in proportion.
Run: python bench/live_view.py  (under a minute)
"""

from __future__ import annotations

import io
import statistics
import time

from rich.console import Console
from rich.live_render import LiveRender

from hermes.core.decisions import Start
from hermes.core.events import (
    Event,
    NodeAdded,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.execution.engine import Engine
from hermes.live import LiveView
from hermes.policies import make_policy
from hermes.policies.fifo import FifoPolicy
from hermes.search.budget import Budget
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.simulate import cluster_layout
from hermes.sim.synthetic import synthetic_trace

GPUS = tuple(f"gpu{index}" for index in range(8))
STEPS = 5
PENDING = 100
SAMPLES = 100


class Driven:
    """A core fed by hand, every event also given to the view (as the engine does)."""

    def __init__(self) -> None:
        self.scheduler = Scheduler(FifoPolicy(), objective=Objective("max"))
        self.now = 0.0
        self.view: LiveView | None = None
        self.running: list[str] = []  # holding a GPU, in the order they started

    def __call__(self, event: Event) -> None:
        self.now = event.at
        decisions = self.scheduler.handle(event)
        self.running += [decision.trial_id for decision in decisions if isinstance(decision, Start)]
        if self.view is not None:
            self.view(event, decisions)

    def report(self, trial_id: str) -> None:
        """One more step of a running trial, half a second after the last event; at its budget, it exits."""
        trial = self.scheduler.trials[trial_id]
        step = trial.step + 1
        self(TrialReported(self.now + 0.5, trial_id, step, (int(trial_id) * 7919 % 1000) / 1000 + step / 100))
        if step == trial.budget:
            self.running.remove(trial_id)
            self(TrialExited(self.now, trial_id, True))


def driven(trials: int) -> tuple[Driven, Console]:
    """``trials`` trials, all but the pending and the running ones ended."""
    run = Driven()
    console = Console(width=120, height=50, file=io.StringIO(), color_system=None)
    run.view = LiveView("bench", "score", "max", run.scheduler, lambda: run.now, console, budget=Budget(trials))
    run(NodeAdded(0.0, "node", GPUS))
    run.view._take()
    for index in range(trials):
        run(TrialSubmitted(0.0, f"{index:05d}", STEPS))
    while len(run.scheduler.trials) - run.scheduler.unfinished + PENDING + len(GPUS) < trials:
        for trial_id in list(run.running):
            run.report(trial_id)
    return run, console


def view_costs(trials: int) -> tuple[float, float]:
    """Median milliseconds of a snapshot and of a frame, one report apart each (the median: the garbage
    collector's pauses, whoever they fall on, aside)."""
    run, console = driven(trials)
    view = run.view
    assert view is not None
    snapshots, frames = [], []
    for sample in range(SAMPLES):
        run.report(run.running[sample % len(run.running)])
        started = time.perf_counter()
        view._take()
        snapshots.append(time.perf_counter() - started)
        if sample % 5 == 0:
            started = time.perf_counter()
            console.print(LiveRender(view))
            frames.append(time.perf_counter() - started)
    return statistics.median(snapshots) * 1000, statistics.median(frames) * 1000


def report_rate(with_view: bool, trials: int = 3000, epochs: int = 10, gpus: int = 16) -> float:
    """Reports per second of CPU time of a simulated run, with the live view or without it."""
    trace = synthetic_trace(trials, epochs, seed=0, epoch_seconds=(10.0, 60.0))
    executor = SimulatedExecutor(cluster_layout(gpus))
    scheduler = Scheduler(make_policy("hermes"), objective=Objective(trace.mode))
    console = Console(width=120, height=50, file=io.StringIO(), force_terminal=True, color_system=None)
    view = LiveView("bench", "score", trace.mode, scheduler, executor.now, console, budget=Budget(trials))
    engine = Engine(scheduler, executor, [view] if with_view else [])
    for curve in trace.shuffled(0):
        engine.post(executor.submit(curve.name, curve, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    scheduler.policy.configure(executor.profile)
    started = time.process_time()
    if with_view:
        with view:
            engine.run()
    else:
        engine.run()
    return len(executor.accounts.report_times) / (time.process_time() - started)


def main() -> None:
    for trials in (1_000, 10_000):
        snapshot, frame = view_costs(trials)
        print(f"{trials:6d} trials: snapshot {snapshot:8.2f} ms   frame {frame:8.2f} ms")
    without, with_view = report_rate(False), report_rate(True)
    print(f"simulated run of 3,000 trials, reports per CPU second: {without:8.0f} without the view, "
          f"{with_view:8.0f} with it ({with_view / without:.0%})")


if __name__ == "__main__":
    main()
