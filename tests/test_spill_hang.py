"""A parked trial spilled to move to another slot whose function never returns once its spill is committed (its main
thread waits for ever on what its suspended loop thread was to give it): its worker exits after the grace a process
of its own has (``EXIT_GRACE``), and the trial goes on from its checkpoint. Real workers, a real executor."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start
from hermes.core.events import Event, TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.watchdog import EXIT_GRACE
from tests.test_warm_trial_edges import THREADED, park

# The threaded trial, whose main thread, once its loop thread was suspended, waits for ever (as on a queue it fed)
HANGS_AFTER_ITS_SPILL = THREADED.replace(
    """        if config["report_after"]:""",
    """        if state["step"] < trial.budget():
            threading.Event().wait()
        if config.get("report_after"):""")


def events_until_ended(executor: LocalExecutor, trial_id: str) -> list[Event]:
    """The executor's events until ``trial_id`` has ended, every report answered 'continue'."""
    events: list[Event] = []
    while not any(isinstance(event, TrialExited) and event.trial_id == trial_id for event in events):
        for event in executor.next_events():
            events.append(event)
            executor.settled(event)
    return events


@pytest.mark.timeout(EXIT_GRACE + 60)
def test_a_spilled_trial_whose_function_never_returns_ends_with_its_worker_and_moves_on(tmp_path: Path) -> None:
    """Before, the move waited for ever on the spilled trial's end: the experiment hung (parked trials are not
    watched, and a trial that reported once has no step to be found stalled by)."""
    (tmp_path / "hangs.py").write_text(textwrap.dedent(HANGS_AFTER_ITS_SPILL))
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score") as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id in ("a", "b"):  # both parked in cpu0's worker
            executor.submit(trial_id, TrialLaunch(3, function="hangs:train", cwd=str(tmp_path)))
            executor.apply(Start(trial_id, "local/cpu0"), executor.now())
            park(executor, trial_id)
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # spilled on cpu0: it hangs there
        moved = events_until_ended(executor, "a")
        assert [(e.trial_id, e.step) for e in moved if isinstance(e, TrialReported)] == [("a", 2), ("a", 3)]
        assert [(e.succeeded, e.error) for e in moved if isinstance(e, TrialExited)] == [(True, None)]
        executor.apply(Resume("b", "local/cpu0"), executor.now())  # from its checkpoint: its worker is gone
        resumed = events_until_ended(executor, "b")
        assert [(e.trial_id, e.step) for e in resumed if isinstance(e, TrialReported)] == [("b", 2), ("b", 3)]
        assert [(e.succeeded, e.error) for e in resumed if isinstance(e, TrialExited)] == [(True, None)]
    notice = f"did not return within {EXIT_GRACE:g}s of committing its suspension"
    assert (tmp_path / "run" / "trials" / "a" / "stderr.log").read_text().count(notice) == 1
    assert (tmp_path / "run" / "workers" / "local-cpu0.log").read_text().count(notice) == 1
