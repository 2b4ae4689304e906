"""A trial that breaks the protocol (a ``ResumeError``: resumed, it did not restore its checkpoint) fails at once, as
run again it would do the same; and a trial of its own process that lingers after committing its suspension is killed
saying so in its stderr.log, as a warm worker's trial is. Real processes, a real executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start
from hermes.core.events import TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots, watchdog
from tests.test_stop_grace import ended
from tests.test_warm_trial_edges import LIMITS, module, park

# Resumed, it goes on from the checkpoint's step but never restores its state (a fresh one)
FORGETS_TO_RESTORE = """
    from hermes import trial


    def train(config):
        state = {"total": 0}
        trial.Files(lambda directory: (directory / "total").write_text(str(state["total"])), lambda directory: None)
        for step in range(trial.start_step() + 1, trial.budget() + 1):
            state["total"] += 1
            trial.report(step, score=state["total"])
"""

# A thread that is no daemon keeps its first run's process alive after its suspension's SuspendExit ended the main
# thread
LINGERS = """
    import threading

    from hermes import trial


    def train(config):
        if trial.start_step() == 0:
            threading.Thread(target=threading.Event().wait).start()
        for step in range(trial.start_step() + 1, trial.budget() + 1):
            trial.report(step, score=step)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("warm", [False, True], ids=["own-process", "warm-worker"])
def test_a_resumed_trial_that_does_not_restore_fails_at_once_as_no_crash(tmp_path: Path, warm: bool) -> None:
    """Its ResumeError was a crash like any other: run again from its checkpoint trial.max_failures times, to fail
    the same way each time, where the docs say protocol misuse fails the trial at once."""
    function = module(tmp_path, "forgets", FORGETS_TO_RESTORE)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(3, function=function, cwd=str(tmp_path), warm=warm))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        park(executor, "a")  # its checkpoint of step 1 is committed once its process exits, or it is spilled
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())
        [exited] = [e for e in ended(executor, "a") if isinstance(e, TrialExited)]
    assert (exited.succeeded, exited.crashed) == (False, False), exited
    assert exited.error is not None and exited.error.startswith(
        "ResumeError: trial a resumed from its checkpoint of step 1, but none of its checkpoint parts ('files') was "
        "restored"), exited.error
    assert "ResumeError" in (tmp_path / "run" / "trials" / "a" / "stderr.log").read_text()  # with its traceback


@pytest.mark.timeout(30)
def test_a_trial_of_its_own_process_killed_for_lingering_after_its_suspension_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trial: {warm_workers: false}``: it was killed 30 s after each suspension with nothing said anywhere, where a
    warm worker's trial's stderr.log says why its worker exited."""
    monkeypatch.setattr(watchdog, "EXIT_GRACE", 0.5)  # the watchdog runs in this process, the runner's
    function = module(tmp_path, "lingers", LINGERS)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(3, function=function, cwd=str(tmp_path), warm=False))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        park(executor, "a")  # the executor counts it suspended, killed or not
        executor.apply(Resume("a", "local/cpu0"), executor.now())
        events = ended(executor, "a")
    assert [e.step for e in events if isinstance(e, TrialReported)] == [2, 3]  # on from its suspension's step
    assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]
    assert (tmp_path / "run" / "trials" / "a" / "stderr.log").read_text() == (
        "hermes: trial a was killed (it did not exit within 0.5s of committing its suspension: a thread that is no "
        "daemon, or a child process it waits for, kept it alive); it goes on from that checkpoint\n")
