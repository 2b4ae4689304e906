"""The executor conformance suite: the execution contract, checked on any engine.

Like Optuna's ``optuna.testing.pytest_storages``, it is importable from the package so that every
engine runs the same tests. An engine's test module defines a ``harness`` fixture that returns
an ``ExecutorHarness`` for it, and imports the tests::

    from hermes.testing.executor_conformance import *  # noqa: F401,F403

    @pytest.fixture
    def harness() -> ExecutorHarness:
        return MyEngineHarness()

Every test drives the executor the way the core does (a decision, then ``settled`` for each
report) and feeds everything through ``ContractMonitor``, so each event sequence is also checked
against the contract's table. A trial's work reports ``score(rate, step)`` at every step.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable

import pytest

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuRemoved,
    NodeAdded,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.execution.contract import ContractMonitor, Executor
from hermes.execution.engine import Engine
from hermes.policies import make_policy

__all__ = [
    "ExecutorHarness",
    "score",
    "test_membership_comes_first",
    "test_a_trial_reports_every_step_with_its_metrics_then_exits",
    "test_suspend_and_resume_on_the_same_gpu_keep_progress",
    "test_suspend_and_resume_on_another_gpu_keep_progress",
    "test_a_suspend_decided_before_the_core_saw_the_trials_exit_is_moot",
    "test_stop_while_running_ends_the_trial",
    "test_stop_while_parked_emits_nothing",
    "test_stop_while_suspending_ends_with_one_event",
    "test_a_crash_fails_the_trial_with_a_reason",
    "test_a_crash_after_a_resume_falls_back_to_the_suspended_step",
    "test_a_gpu_removed_under_a_running_trial",
    "test_wake_before_next_events_returns_promptly",
    "test_wake_from_another_thread_unblocks_next_events",
    "test_catch_up_reports_are_not_emitted",
    "test_a_whole_experiment_through_the_engine",
]


def score(rate: float, step: int) -> float:
    """What a conformance trial reports at ``step``."""
    return 1.0 - math.exp(-rate * step)


class ExecutorHarness(ABC):
    """How the suite makes an engine's executor and its trials."""

    gpus: tuple[str, ...]  # the GPUs of the executor's one node; at least two
    blocks: bool = True  # next_events waits in real time (False for a simulator)
    checkpoints: bool = True  # a suspended trial is saved: it may resume on another GPU, or after a restart
    precision: float = 1e-12  # how exactly reported values come back (a script prints them rounded)
    timeout: float = 60.0  # wall seconds a test may wait for events
    crashes: bool = True  # a crash is ``crashed`` (False for a simulated divergence, which would only repeat)
    deciding_step_seconds: float = 0.05
    """Seconds of each step where a test decides at a report and the decision must land before the next report. A
    trial that waits for the answer to its report does with short steps; an unmodified program prints on without
    waiting, so its steps must outlast the test process being descheduled on a loaded machine."""

    @abstractmethod
    def executor(self, directory: Path) -> Executor:
        """A fresh executor with the GPUs ``gpus`` on one node, keeping its files under ``directory``."""

    @abstractmethod
    def work(self, steps: int, *, rate: float = 0.5, seconds: float = 0.05, crash_at: int | None = None) -> Any:
        """A trial of ``steps`` steps of ``seconds`` each reporting ``score(rate, step)``; with
        ``crash_at`` it dies (a crash, not a clean exit) during that step."""

    @abstractmethod
    def remove_gpu(self, executor: Executor, gpu: str) -> None:
        """Take ``gpu`` away from the executor as a failure would."""


class Driver:
    """Plays the core's part: applies decisions, settles reports, checks everything with the monitor."""

    def __init__(self, executor: Executor, harness: ExecutorHarness) -> None:
        self.executor = executor
        self.harness = harness
        self.monitor = ContractMonitor()
        self.events: list[Event] = []

    def submit(self, trial_id: str, work: Any, reported_step: int = 0) -> TrialSubmitted:
        submitted = self.executor.submit(trial_id, work, reported_step=reported_step)
        self.monitor.observe(submitted)
        return submitted

    def apply(self, decision: Decision) -> None:
        self.monitor.decided(decision)
        self.executor.apply(decision, self.executor.now())

    def until(
        self, done: Callable[[Event], bool], on_report: Callable[[TrialReported], list[Decision]] = lambda e: []
    ) -> list[Event]:
        """Events until one satisfies ``done`` (that one included); ``on_report`` decides about each report."""
        seen: list[Event] = []
        deadline = time.monotonic() + self.harness.timeout
        while time.monotonic() < deadline:
            batch = self.executor.next_events()
            if not batch and self.executor.idle():
                break
            for event in batch:
                self.monitor.observe(event)
                seen.append(event)
                self.events.append(event)
                if isinstance(event, TrialReported):
                    for decision in on_report(event):
                        self.apply(decision)
                self.executor.settled(event)
                if done(event):
                    return seen
        raise AssertionError(f"the awaited event never came; got {[type(e).__name__ for e in seen]}")

    def quiet(self) -> list[Event]:
        """Everything until the executor has nothing left that could report."""
        seen: list[Event] = []
        deadline = time.monotonic() + self.harness.timeout
        while not self.executor.idle():
            assert time.monotonic() < deadline, "the executor never went idle"
            for event in self.executor.next_events():
                self.monitor.observe(event)
                seen.append(event)
                self.executor.settled(event)
        return seen

    def start_membership(self) -> list[NodeAdded]:
        first = self.executor.next_events()
        for event in first:
            self.monitor.observe(event)
        return [event for event in first if isinstance(event, NodeAdded)]


def _driver(harness: ExecutorHarness, directory: Path) -> Driver:
    driver = Driver(harness.executor(directory), harness)
    driver.start_membership()
    return driver


def _reports(events: list[Event], trial_id: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events if isinstance(e, TrialReported) and e.trial_id == trial_id]


def _is(kind: type, trial_id: str) -> Callable[[Event], bool]:
    return lambda event: isinstance(event, kind) and getattr(event, "trial_id", None) == trial_id


def _assert_reports(reports: list[tuple[int, float]], rate: float, steps: range, harness: ExecutorHarness) -> None:
    """Exactly these steps, each once and in order, with the values the trial computes."""
    assert [step for step, _ in reports] == list(steps)
    assert [value for _, value in reports] == pytest.approx([score(rate, s) for s in steps], abs=harness.precision)


# ---------------------------------------------------------------------------------------- the tests
def test_membership_comes_first(harness: ExecutorHarness, tmp_path: Path) -> None:
    with harness.executor(tmp_path) as executor:
        driver = Driver(executor, harness)
        nodes = driver.start_membership()
        assert [gpu for node in nodes for gpu in node.gpus] == list(harness.gpus)


def test_a_trial_reports_every_step_with_its_metrics_then_exits(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(4, rate=0.3))
        driver.apply(Start("a", harness.gpus[0]))
        events = driver.until(_is(TrialExited, "a"))
        _assert_reports(_reports(events, "a"), 0.3, range(1, 5), harness)
        assert events[-1].succeeded
        for event in events[:-1]:
            assert event.metrics is None or event.value in event.metrics.values()
        assert driver.quiet() == []


def _suspend_and_resume(harness: ExecutorHarness, tmp_path: Path, resume_on: str) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(5, rate=0.4, seconds=harness.deciding_step_seconds))
        driver.apply(Start("a", harness.gpus[0]))
        events = driver.until(_is(TrialSuspended, "a"), lambda e: [Suspend("a")] if e.step == 2 else [])
        assert events[-1].step == 2 and _reports(events, "a")[-1][0] == 2
        driver.apply(Resume("a", resume_on, migrated=resume_on != harness.gpus[0]))
        events += driver.until(_is(TrialExited, "a"))
        assert events[-1].succeeded
        _assert_reports(_reports(events, "a"), 0.4, range(1, 6), harness)  # no step lost or repeated


def test_suspend_and_resume_on_the_same_gpu_keep_progress(harness: ExecutorHarness, tmp_path: Path) -> None:
    _suspend_and_resume(harness, tmp_path, harness.gpus[0])


def test_suspend_and_resume_on_another_gpu_keep_progress(harness: ExecutorHarness, tmp_path: Path) -> None:
    if not harness.checkpoints:
        pytest.skip("this launch mode keeps a suspended trial on its own GPU")
    _suspend_and_resume(harness, tmp_path, harness.gpus[1])


def test_a_suspend_decided_before_the_core_saw_the_trials_exit_is_moot(
    harness: ExecutorHarness, tmp_path: Path
) -> None:
    """A batch of events holds a period's end and then the trial's exit: the core suspends the trial at the first
    and learns of its end at the second, and the engine applies the decisions after the batch, once the trial has
    exited. The executor raised ("cannot suspend trial a: it is not running"), which ended the whole run."""
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(2))
        driver.apply(Start("a", harness.gpus[0]))

        def decide_at_the_first_report(event: TrialReported) -> list[Decision]:
            if event.step == 1:
                driver.monitor.decided(Suspend("a"))  # decided before its exit came, as at a period's end ...
            return []

        assert driver.until(_is(TrialExited, "a"), decide_at_the_first_report)[-1].succeeded
        driver.executor.apply(Suspend("a"), driver.executor.now())  # ... and applied once the trial is gone
        assert driver.quiet() == []


def test_stop_while_running_ends_the_trial(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(6, seconds=harness.deciding_step_seconds))
        driver.apply(Start("a", harness.gpus[0]))
        events = driver.until(_is(TrialExited, "a"), lambda e: [Stop("a")] if e.step == 1 else [])
        assert [step for step, _ in _reports(events, "a")] == [1]
        assert not events[-1].succeeded
        assert driver.quiet() == []


def test_stop_while_parked_emits_nothing(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(6))
        driver.apply(Start("a", harness.gpus[0]))
        driver.until(_is(TrialSuspended, "a"), lambda e: [Suspend("a")] if e.step == 1 else [])
        driver.apply(Stop("a"))
        assert driver.quiet() == []  # the monitor would have raised at any event; none came at all
        # the GPU is free again: another trial runs there
        driver.submit("b", harness.work(1))
        driver.apply(Start("b", harness.gpus[0]))
        assert driver.until(_is(TrialExited, "b"))[-1].succeeded


def test_stop_while_suspending_ends_with_one_event(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(6, seconds=harness.deciding_step_seconds))
        driver.apply(Start("a", harness.gpus[0]))
        driver.until(_is(TrialReported, "a"), lambda e: [Suspend("a")])  # settled: it is told to suspend
        driver.apply(Stop("a"))
        ending = driver.until(lambda e: isinstance(e, (TrialSuspended, TrialExited)) and e.trial_id == "a")
        assert [step for step, _ in _reports(ending, "a")] == []
        assert driver.quiet() == []


def test_a_crash_fails_the_trial_with_a_reason(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(4, crash_at=2))
        driver.submit("b", harness.work(2))
        driver.apply(Start("a", harness.gpus[0]))
        events = driver.until(_is(TrialExited, "a"))
        assert [step for step, _ in _reports(events, "a")] == [1]
        assert not events[-1].succeeded and events[-1].error and events[-1].crashed is harness.crashes
        driver.apply(Start("b", harness.gpus[0]))  # the GPU still works
        assert driver.until(_is(TrialExited, "b"))[-1].succeeded
        if harness.crashes:  # the core may run it again from its checkpoint: it catches up there, and crashes again
            driver.apply(Resume("a", harness.gpus[1]))
            events = driver.until(_is(TrialExited, "a"))
            assert [step for step, _ in _reports(events, "a")] in ([], [1])  # [1]: no checkpoint of step 1
            assert not events[-1].succeeded and events[-1].crashed


def test_a_crash_after_a_resume_falls_back_to_the_suspended_step(harness: ExecutorHarness, tmp_path: Path) -> None:
    """A suspension is the core's fallback from then on, whether the engine keeps the trial in memory, in a
    stopped process or on disk: after a crash of the resumed run, the next run catches up to it silently."""
    if not harness.crashes:
        pytest.skip("a simulated divergence is not run again")
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(4, seconds=harness.deciding_step_seconds, crash_at=3))
        driver.apply(Start("a", harness.gpus[0]))
        driver.until(_is(TrialSuspended, "a"), lambda e: [Suspend("a")] if e.step == 2 else [])
        driver.apply(Resume("a", harness.gpus[0]))
        crashed = driver.until(_is(TrialExited, "a"))
        assert _reports(crashed, "a") == [] and crashed[-1].crashed
        driver.apply(Resume("a", harness.gpus[0]))  # from step 2, as the core counts it
        again = driver.until(_is(TrialExited, "a"))
        assert _reports(again, "a") == [] and again[-1].crashed  # steps 1 and 2 caught up, then step 3 crashed


def test_a_gpu_removed_under_a_running_trial(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor:
        movable = driver.submit("a", harness.work(50, seconds=0.2)).movable
        driver.submit("b", harness.work(2))
        driver.apply(Start("a", harness.gpus[1]))
        before = driver.until(_is(TrialReported, "a"))
        harness.remove_gpu(driver.executor, harness.gpus[1])
        removed = driver.until(lambda e: isinstance(e, GpuRemoved))
        assert removed[-1].gpu == harness.gpus[1]
        assert driver.quiet() == []  # nothing more about the lost run (the monitor checks each event)
        # the trial falls back to its checkpoint (none: step 0) and runs elsewhere from there; a program that
        # keeps none starts again from its beginning, and the steps it reported are caught up, not reported again
        driver.apply(Resume("a", harness.gpus[0], migrated=True))
        events = driver.until(_is(TrialReported, "a"), lambda e: [Stop("a")])
        last = max(step for step, _ in _reports(before + removed, "a"))
        assert events[-1].step == (1 if movable else last + 1)
        driver.until(_is(TrialExited, "a"))


def test_wake_before_next_events_returns_promptly(harness: ExecutorHarness, tmp_path: Path) -> None:
    driver = _driver(harness, tmp_path)
    with driver.executor as executor:
        driver.submit("slow", harness.work(2, seconds=30.0))
        driver.apply(Start("slow", harness.gpus[0]))
        clock, wall = executor.now(), time.monotonic()
        executor.wake()
        events = executor.next_events()
        assert not [e for e in events if isinstance(e, TrialReported)]  # the report is 30 s away
        assert time.monotonic() - wall < 5.0 and executor.now() - clock < 5.0
        assert not executor.idle()
        driver.apply(Stop("slow"))


def test_wake_from_another_thread_unblocks_next_events(harness: ExecutorHarness, tmp_path: Path) -> None:
    if not harness.blocks:
        pytest.skip("this executor never blocks")
    driver = _driver(harness, tmp_path)
    with driver.executor as executor:
        driver.submit("slow", harness.work(2, seconds=5.0))
        driver.apply(Start("slow", harness.gpus[0]))
        # Whatever starting it said, or else its first report after 5 s, which then waits unanswered: either
        # way no report can come during the wait below.
        executor.next_events()
        waker = threading.Timer(0.3, executor.wake)
        started = time.monotonic()
        waker.start()
        events = executor.next_events()
        assert 0.2 < time.monotonic() - started < 5.0
        assert not [e for e in events if isinstance(e, TrialReported)]
        driver.apply(Stop("slow"))


def test_catch_up_reports_are_not_emitted(harness: ExecutorHarness, tmp_path: Path) -> None:
    """Resumed from an older checkpoint (a program that keeps none: from its beginning), a trial emits only the
    steps past those the core knows."""
    driver = _driver(harness, tmp_path)
    with driver.executor:
        driver.submit("a", harness.work(4, rate=0.6), reported_step=2)
        driver.monitor.trials["a"].step = 2  # the core knows two steps of it already
        driver.apply(Resume("a", harness.gpus[0]))
        events = driver.until(_is(TrialExited, "a"))
        _assert_reports(_reports(events, "a"), 0.6, range(3, 5), harness)


def test_a_whole_experiment_through_the_engine(harness: ExecutorHarness, tmp_path: Path) -> None:
    """Three trials time-share two GPUs under round robin, every event checked against the contract."""
    rates = {"a": 0.2, "b": 0.5, "c": 0.9}
    with harness.executor(tmp_path) as executor:
        scheduler = Scheduler(make_policy("rr", period=0.1), objective=Objective("max"))
        monitor = ContractMonitor()
        engine = Engine(scheduler, executor, [monitor])
        for trial_id, rate in rates.items():
            engine.post(executor.submit(trial_id, harness.work(4, rate=rate, seconds=0.1)))
        engine.post(SubmissionsClosed(executor.now()))
        engine.run()
    for trial_id, rate in rates.items():
        trial = scheduler.trials[trial_id]
        assert trial.state is TrialState.COMPLETED
        _assert_reports(list(zip(trial.steps, trial.values)), rate, range(1, 5), harness)
    assert any(name == "Suspend" for _, name in monitor.history)
