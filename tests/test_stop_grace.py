"""A trial told to stop whose function does not return (its loop thread ended with its StopExit, the main thread waits
for ever on what it was to give it) is killed ``EXIT_GRACE`` seconds after that loop ended, in a process of its own as
in a warm worker (tests/test_spill_hang.py), and ends stopped, while a stopped trial's own slow final save is not cut;
and a thread that ``report`` ends (StopExit, SuspendExit) ends quietly, as the main thread does, with no traceback in
the trial's stderr.log. Real runs, a real store."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import hermes
from hermes.core.decisions import Resume, Start, Stop, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.core.states import TrialState
from hermes.local import LocalExecutor, TrialLaunch, local_slots, watchdog
from tests.test_run import spec_of
from tests.test_spill_hang import WAITS_FOR_ITS_LOOP  # its loop in a thread, whose end the main thread waits for
from tests.test_warm_trial_edges import LIMITS, THREADED, park

GRACE = 0.5  # the runner's EXIT_GRACE here, where the product's is 30 s



@pytest.mark.timeout(30)
def test_a_stopped_trial_of_its_own_process_that_never_returns_is_killed_and_ends_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trial: {warm_workers: false}``: the median rule stops the second trial at its first report. Its process was
    given a grace only after committing a suspension, never after a stop: the experiment never finished."""
    monkeypatch.setattr(watchdog, "EXIT_GRACE", GRACE)  # the watchdog runs in this process, the runner's
    monkeypatch.chdir(tmp_path)
    (tmp_path / "waits.py").write_text(textwrap.dedent(WAITS_FOR_ITS_LOOP))
    median = {"name": "median", "params": {"grace_steps": 0, "min_trials": 1, "confidence": 0.5}}
    spec = spec_of(
        "stopped-lingers",
        trial={"function": "waits:train", "workdir": str(tmp_path), "warm_workers": False},
        search={"sampler": "list", "configs": [{"quality": 1.0}, {"quality": 0.0}]},
        budget={"steps": 3},
        policy={"name": "fifo", "stopper": median},
        resources={"gpus": "none", "cpu_slots": 1},
    )
    result = hermes.run(spec)
    assert sorted((trial.params["quality"], trial.state, trial.steps) for trial in result.trials) == [
        (0.0, TrialState.STOPPED.value, 1), (1.0, TrialState.COMPLETED.value, 3)]
    [stopped] = [trial for trial in result.trials if trial.state == TrialState.STOPPED.value]
    log = (stopped.directory / "stderr.log").read_text()
    killed = f"was killed (it did not exit within {GRACE:g}s of its loop thread being stopped); it ends stopped"
    assert killed in log, log
    assert "Traceback" not in log, log  # its loop thread ended with its StopExit, quietly


def ended(executor: LocalExecutor, trial_id: str) -> list[Event]:
    """The executor's events until ``trial_id`` has suspended or ended, every report answered 'continue'."""
    events: list[Event] = []
    while not any(isinstance(e, (TrialExited, TrialSuspended)) and e.trial_id == trial_id for e in events):
        for event in executor.next_events():
            events.append(event)
            executor.settled(event)
    return events


@pytest.mark.timeout(30)
@pytest.mark.parametrize("warm", [False, True], ids=["own-process", "warm-worker"])
@pytest.mark.parametrize("told", ["stop", "suspend"])
def test_a_loop_thread_that_report_ends_leaves_no_traceback(tmp_path: Path, warm: bool, told: str) -> None:
    """Python's threading.excepthook is silent for exactly SystemExit: a StopExit or a SuspendExit (a SystemExit of
    its own) that ended a trial's loop thread, the way such a thread ends, was printed to its stderr.log as
    'Exception in thread ...' with a traceback. Told to suspend, a trial of a warm worker parks, and its loop thread
    ends once it is spilled to move."""
    (tmp_path / "threaded.py").write_text(textwrap.dedent(THREADED))
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("t", TrialLaunch(3, function="threaded:train", config={"report_after": False},
                                          cwd=str(tmp_path), warm=warm))
        executor.apply(Start("t", "local/cpu0"), executor.now())
        if told == "suspend" and warm:
            park(executor, "t")
            executor.apply(Resume("t", "local/cpu1", migrated=True), executor.now())  # spilled on cpu0
            [moved] = executor.next_events()
            assert isinstance(moved, TrialReported) and moved.step == 2, moved
            executor.settled(moved)
            events = ended(executor, "t")
            assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]
        else:
            [report] = executor.next_events()
            assert isinstance(report, TrialReported) and report.step == 1, report
            executor.apply(Stop("t") if told == "stop" else Suspend("t"), executor.now())
            executor.settled(report)
            [end] = ended(executor, "t")
            assert isinstance(end, TrialSuspended if told == "suspend" else TrialExited), end
            if told == "stop":
                assert (end.succeeded, end.error) == (False, "stopped"), end
    log = (tmp_path / "run" / "trials" / "t" / "stderr.log").read_text()
    assert "Traceback" not in log and "Exit" not in log, log


# Stopped at a report, it saves for longer than the grace in its own (main) thread: work a user's code asked for
SAVES_SLOWLY_WHEN_STOPPED = """
    import sys
    import time

    from hermes import trial

    sys.modules["__main__"].EXIT_GRACE = {grace}  # in a warm worker (hermes.local.worker) that imports this


    def train(config):
        try:
            for step in range(1, trial.budget() + 1):
                trial.report(step, score=config["quality"] * step)
        except trial.StopExit:
            time.sleep({slow})  # a final save or evaluation
            (trial.trial_dir() / "final.txt").write_text("saved")
            raise
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("warm", [False, True], ids=["own-process", "warm-worker"])
def test_a_stopped_trial_whose_own_code_saves_slowly_is_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    """The grace after a stop is for a main thread that waits for ever on a loop thread its StopExit ended. Armed by
    every stop, it killed a stopped trial's final save in its own thread 30 s later, and the save was lost."""
    monkeypatch.setattr(watchdog, "EXIT_GRACE", GRACE)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slow.py").write_text(textwrap.dedent(SAVES_SLOWLY_WHEN_STOPPED.format(grace=GRACE, slow=4 * GRACE)))
    median = {"name": "median", "params": {"grace_steps": 0, "min_trials": 1, "confidence": 0.5}}
    spec = spec_of(
        "stopped-saves",
        trial={"function": "slow:train", "workdir": str(tmp_path), "warm_workers": warm},
        search={"sampler": "list", "configs": [{"quality": 1.0}, {"quality": 0.0}]},
        budget={"steps": 3},
        policy={"name": "fifo", "stopper": median},
        resources={"gpus": "none", "cpu_slots": 1},
    )
    result = hermes.run(spec)
    [stopped] = [trial for trial in result.trials if trial.state == TrialState.STOPPED.value]
    assert (stopped.directory / "final.txt").read_text() == "saved"
    assert "did not" not in (stopped.directory / "stderr.log").read_text()
