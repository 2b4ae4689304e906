"""A trial whose function never returns once it has nothing left to do but return (its main thread waits for ever on
what its loop thread was to give it): a parked trial spilled to move to another slot once its spill is committed, or
a trial told to stop. Its worker exits after the grace a process of its own has (``EXIT_GRACE``): the spilled trial
goes on from its checkpoint, the stopped one ends stopped, and the trials parked in the worker go on from theirs.
Real workers, a real executor."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start, Stop
from hermes.core.events import Event, TrialExited, TrialReported
from hermes.core.states import TrialState
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_run import hermes, load_view, spec_of, write_spec
from tests.test_warm_trial_edges import THREADED, park

GRACE = 0.5  # the workers' EXIT_GRACE here, set by the trial module they import, where the product's is 30 s

# The threaded trial, whose main thread, once its loop thread was suspended or stopped before its budget's end, waits
# for ever (as on a queue it fed), unless its config says it does not
HANGS = f"""
    import sys

    sys.modules["__main__"].EXIT_GRACE = {GRACE}  # in the warm worker (hermes.local.worker) that imports this
""" + THREADED.replace(
    """        if config["report_after"]:""",
    """        if state["step"] < trial.budget() and config.get("hangs", True):
            threading.Event().wait()
        if config.get("report_after"):""")


def hanging_executor(directory: Path) -> LocalExecutor:
    """An executor of two CPU slots, past its NodeAdded, whose trials may run ``hangs:train``."""
    (directory / "hangs.py").write_text(textwrap.dedent(HANGS))
    executor = LocalExecutor(directory / "run", slots=local_slots(cpu_slots=2), metric="score")
    executor.next_events()  # the node's NodeAdded
    return executor


def events_until_ended(executor: LocalExecutor, trial_id: str) -> list[Event]:
    """The executor's events until ``trial_id`` has ended, every report answered 'continue'."""
    events: list[Event] = []
    while not any(isinstance(event, TrialExited) and event.trial_id == trial_id for event in events):
        for event in executor.next_events():
            events.append(event)
            executor.settled(event)
    return events


def notices(directory: Path, trial_id: str, told: str) -> tuple[int, int]:
    """How often the trial's stderr.log, and cpu0's worker's log, say its worker exited for it."""
    notice = f"did not return within {GRACE:g}s of {told}"
    logs = (directory / "run" / "trials" / trial_id / "stderr.log", directory / "run" / "workers" / "local-cpu0.log")
    return logs[0].read_text().count(notice), logs[1].read_text().count(notice)


def resumed_from_its_checkpoint(executor: LocalExecutor, trial_id: str, gpu: str) -> None:
    """Resume ``trial_id``, which was parked in a worker that exited, and see it train its last two steps."""
    executor.apply(Resume(trial_id, gpu), executor.now())
    events = events_until_ended(executor, trial_id)
    assert [(e.trial_id, e.step) for e in events if isinstance(e, TrialReported)] == [(trial_id, 2), (trial_id, 3)]
    assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]


@pytest.mark.timeout(30)
def test_a_spilled_trial_whose_function_never_returns_ends_with_its_worker_and_moves_on(tmp_path: Path) -> None:
    """Before, the move waited for ever on the spilled trial's end: the experiment hung (parked trials are not
    watched, and a trial that reported once has no step to be found stalled by)."""
    with hanging_executor(tmp_path) as executor:
        for trial_id in ("a", "b"):  # both parked in cpu0's worker
            executor.submit(trial_id, TrialLaunch(3, function="hangs:train", cwd=str(tmp_path)))
            executor.apply(Start(trial_id, "local/cpu0"), executor.now())
            park(executor, trial_id)
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # spilled on cpu0: it hangs there
        moved = events_until_ended(executor, "a")
        assert [(e.trial_id, e.step) for e in moved if isinstance(e, TrialReported)] == [("a", 2), ("a", 3)]
        assert [(e.succeeded, e.error) for e in moved if isinstance(e, TrialExited)] == [(True, None)]
        resumed_from_its_checkpoint(executor, "b", "local/cpu0")  # its worker is gone
    assert notices(tmp_path, "a", "committing its suspension") == (1, 1)


@pytest.mark.timeout(30)
def test_a_trial_stopped_at_a_report_whose_function_never_returns_ends_stopped_with_its_worker(tmp_path: Path) -> None:
    """An early stopper's stop, answered at the trial's report: its loop thread ended, its main thread waited for ever,
    and the executor waited for ever on its end (its slot held, the experiment never finished)."""
    with hanging_executor(tmp_path) as executor:
        for trial_id in ("a", "b"):
            executor.submit(trial_id, TrialLaunch(3, function="hangs:train", cwd=str(tmp_path)))
        executor.apply(Start("b", "local/cpu0"), executor.now())
        park(executor, "b")  # in cpu0's worker, where a then runs
        executor.apply(Start("a", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        assert isinstance(report, TrialReported) and (report.trial_id, report.step) == ("a", 1), report
        executor.apply(Stop("a"), executor.now())
        executor.settled(report)  # answered "stop"
        stopped = events_until_ended(executor, "a")
        assert [(e.succeeded, e.error, e.crashed) for e in stopped if isinstance(e, TrialExited)] == [
            (False, "stopped", False)]  # not failed: the core does not run it again
        resumed_from_its_checkpoint(executor, "b", "local/cpu0")
    assert notices(tmp_path, "a", "its loop thread being stopped") == (1, 1)


@pytest.mark.timeout(30)
def test_a_trial_stopped_while_parked_whose_function_never_returns_ends_its_worker(tmp_path: Path) -> None:
    """The core counts a trial stopped while parked as stopped at once, and its thread read the stop: its function,
    which did not return, held the worker, with all the trial's state, for the rest of the experiment (a worker
    retired for its memory was never ended)."""
    with hanging_executor(tmp_path) as executor:
        for trial_id, hangs in (("a", True), ("b", False)):  # both parked in cpu0's worker
            executor.submit(trial_id, TrialLaunch(3, function="hangs:train", config={"hangs": hangs},
                                                  cwd=str(tmp_path)))
            executor.apply(Start(trial_id, "local/cpu0"), executor.now())
            park(executor, trial_id)
        executor.apply(Stop("a"), executor.now())
        executor.apply(Resume("b", "local/cpu1", migrated=True), executor.now())  # spilled, meanwhile, to go on
        events = events_until_ended(executor, "b")
        assert [(e.trial_id, e.step) for e in events if isinstance(e, TrialReported)] == [("b", 2), ("b", 3)]
        # none of a: the core counts it stopped already
        assert [(e.trial_id, e.succeeded) for e in events if isinstance(e, TrialExited)] == [("b", True)]
        deadline = time.monotonic() + GRACE + 10
        while notices(tmp_path, "a", "its loop thread being stopped") != (1, 1):
            assert time.monotonic() < deadline, "the stopped trial's worker did not exit"
            time.sleep(0.05)


# Its loop in a thread, whose end the main thread waits for: a stopped loop never gets there
WAITS_FOR_ITS_LOOP = f"""
    import sys
    import threading

    from hermes import trial

    sys.modules["__main__"].EXIT_GRACE = {GRACE}  # in the warm worker (hermes.local.worker) that imports this


    def train(config):
        trained = threading.Event()

        def loop():
            for step in range(1, trial.budget() + 1):
                trial.report(step, score=config["quality"] * step)
            trained.set()

        threading.Thread(target=loop).start()
        trained.wait()
"""


def test_an_experiment_whose_early_stopper_stops_a_trial_that_never_returns_finishes(tmp_path: Path) -> None:
    """``hermes run``: the median rule stops the second trial at its first report; the experiment never finished."""
    (tmp_path / "waits.py").write_text(textwrap.dedent(WAITS_FOR_ITS_LOOP))
    median = {"name": "median", "params": {"grace_steps": 0, "min_trials": 1, "confidence": 0.5}}
    spec = spec_of(
        "stopped-hangs",
        trial={"function": "waits:train", "workdir": str(tmp_path)},
        search={"sampler": "list", "configs": [{"quality": 1.0}, {"quality": 0.0}]},
        budget={"steps": 3},
        policy={"name": "fifo", "stopper": median},
        resources={"gpus": "none", "cpu_slots": 1},
    )
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path, timeout=30)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    view, _ = load_view(tmp_path / "runs")
    assert sorted((trial.params["quality"], trial.state, trial.step) for trial in view.trials) == [
        (0.0, TrialState.STOPPED, 1), (1.0, TrialState.COMPLETED, 3)]
