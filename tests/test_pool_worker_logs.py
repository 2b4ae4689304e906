"""A pooled experiment's empty worker logs go when it ends, those a server killed while it ran left too.

Real executors and warm workers running ``tests/trials/curve.py``: the first pool closes with its experiments still
running (as a server killed with ``kill -9`` leaves its logs), the second, on fewer slots, runs one of them to its end.
"""

from __future__ import annotations

from pathlib import Path

from hermes.core.decisions import Start
from hermes.core.events import TrialExited
from hermes.local import LocalExecutor, TrialLaunch, local_slots

TESTS = Path(__file__).resolve().parent


def finish(executor: LocalExecutor, trial_id: str, group: str, slot: str, tmp_path: Path) -> None:
    """Run a one-step curve trial of ``group`` on ``slot`` to its end."""
    executor.submit(trial_id, TrialLaunch(1, function="trials.curve:train", config={"sleep": 0.01}, cwd=str(TESTS),
                                          worker_group=group, directory=str(tmp_path / group / trial_id)))
    executor.apply(Start(trial_id, slot), executor.now())
    while True:
        for event in executor.next_events():
            executor.settled(event)
            if isinstance(event, TrialExited):
                assert event.succeeded, event
                return


def test_an_ended_experiment_takes_the_empty_worker_logs_a_killed_pool_left(tmp_path: Path) -> None:
    with LocalExecutor(tmp_path / "pool", slots=local_slots(cpu_slots=2), metric="score") as before:
        first, second = before.slots
        finish(before, "a", "e1", second, tmp_path)
        finish(before, "b", "e10", second, tmp_path)
    logs = tmp_path / "pool" / "workers"
    left = {log.name for log in logs.iterdir()}
    assert left == {f"e1-{second.replace('/', '-')}.log", f"e10-{second.replace('/', '-')}.log"}
    with LocalExecutor(tmp_path / "pool", slots=local_slots(cpu_slots=1), metric="score") as after:
        assert list(after.slots) == [first]  # e1's slot before is gone
        finish(after, "c", "e1", first, tmp_path)
        after.end_worker_group("e1")
        assert {log.name for log in logs.iterdir()} == {f"e10-{second.replace('/', '-')}.log"}  # e10 runs on
