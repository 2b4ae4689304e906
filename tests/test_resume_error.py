"""A trial that registered a saver but restored nothing resumes from its checkpoint with a fresh state: it fails with
``ResumeError`` at its first report, saying to call ``restore()``, rather than train on silently from a step its state
never reached. The documented ways of resuming still go on. Real workers and processes, suspended and resumed from
their checkpoints; each trial module is written to the test's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_warm_trial_edges import LIMITS, module
from tests.test_warm_workers import until_ended

WARM = pytest.mark.parametrize("warm", [True, False], ids=["warm-worker", "process-per-run"])


def resumed_from_disk(tmp_path: Path, code: str, *, warm: bool) -> list[Event]:
    """Run a trial of ``code`` (budget 3) to its first report, suspend it there, resume it on the other slot from its
    checkpoint (a warm worker's trial is spilled), and return the events of that run."""
    function = module(tmp_path, "resumed", code)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(3, function=function, cwd=str(tmp_path), warm=warm))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        assert isinstance(report, TrialReported) and report.step == 1, report
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended), suspended
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())
        return until_ended(executor, 1)


def outcome(events: list[Event]) -> tuple[list[tuple[int, float]], list[TrialExited]]:
    return [(e.step, e.value) for e in events if isinstance(e, TrialReported)], [
        e for e in events if isinstance(e, TrialExited)]


FORGETS_RESTORE = """
    from hermes import trial


    def train(config):
        state = {"weight": 0.0}
        trial.Files(lambda d: (d / "w").write_text(str(state["weight"])),
                    lambda d: state.update(weight=float((d / "w").read_text())))  # registered, never restored
        for step in range(trial.start_step() + 1, trial.budget() + 1):
            state["weight"] += 1.0
            trial.report(step, score=state["weight"])
"""


@WARM
def test_a_trial_that_registered_a_saver_but_never_restored_it_fails_saying_so(tmp_path: Path, warm: bool) -> None:
    """It went on from step 2 with a fresh state (its score 1.0 again, not 2.0) and nothing said so: only a loop that
    started over at step 1 was caught."""
    reports, [exited] = outcome(resumed_from_disk(tmp_path, FORGETS_RESTORE, warm=warm))
    assert reports == []
    assert not exited.succeeded and "ResumeError" in (exited.error or "")
    assert "none of its checkpoint parts ('files') was restored" in (exited.error or "")
    assert "Call restore() before the first report" in (exited.error or "")


RESTORES_LATE = """
    from hermes import trial


    def train(config):
        state = {"weight": 0.0}
        saver = trial.Files(lambda d: (d / "w").write_text(str(state["weight"])),
                            lambda d: state.update(weight=float((d / "w").read_text())))
        start = trial.start_step()
        saver.restore()  # after other set-up, before the first report
        for step in range(start + 1, trial.budget() + 1):
            state["weight"] += 1.0
            trial.report(step, score=state["weight"])
"""

RESTORES_IN_ITS_LOOP = """
    from hermes import trial


    def train(config):
        state = {"weight": 0.0}
        saver = trial.Files(lambda d: (d / "w").write_text(str(state["weight"])),
                            lambda d: state.update(weight=float((d / "w").read_text())))
        for step in range(saver.restore() + 1, trial.budget() + 1):
            state["weight"] += 1.0
            trial.report(step, score=state["weight"])
"""

SAVES_NOTHING_AND_STARTS_OVER = """
    from hermes import trial


    def train(config):
        weight = 0.0
        for step in range(1, trial.budget() + 1):
            weight += 1.0
            trial.report(step, score=weight)
"""


@WARM
@pytest.mark.parametrize("code", [RESTORES_LATE, RESTORES_IN_ITS_LOOP, SAVES_NOTHING_AND_STARTS_OVER],
                         ids=["restores-late", "restores-in-its-loop", "no-saver-starts-over"])
def test_the_documented_ways_of_resuming_go_on(tmp_path: Path, warm: bool, code: str) -> None:
    reports, [exited] = outcome(resumed_from_disk(tmp_path, code, warm=warm))
    assert (exited.succeeded, exited.error) == (True, None)
    assert reports == [(2, 2.0), (3, 3.0)]  # the trial without a saver retrains step 1, answered at once
