"""A FIFO put where a parked warm trial's log goes: that trial fails at its next print, naming the file, and the
trials beside it in the same worker go on.

A warm worker closes a parked trial's logs and reopens them at its next print, with a plain open under the lock that
every print, park and end of its trials takes: the open of a FIFO waited for a reader, so the trial held its slot
for ever and the worker's other trials froze with it. Real executor, warm worker and FIFO; a hard timeout, as the old
code hung.
"""

from __future__ import annotations

import os
import stat
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.local import LocalExecutor, TrialLaunch, local_slots

E = TypeVar("E", bound=Event)

PRINTS = """
    import os

    from hermes import trial


    def train(config):
        print("before its park", flush=True)
        trial.report(1, score=1.0, pid=float(os.getpid()))
        print("after its resume", flush=True)  # its log, closed while it parked, is opened again
        trial.report(2, score=2.0, pid=float(os.getpid()))
"""


def events_of(executor: LocalExecutor) -> Iterator[Event]:
    """The executor's events, one by one, as they come."""
    while True:
        events = executor.next_events()
        assert events or not executor.idle(), "nothing runs: no event can come"
        yield from events


def next_of(executor: LocalExecutor, events: Iterator[Event], kind: type[E]) -> E:
    """The next event of ``kind``, left for the caller to settle (those before it are settled here)."""
    for event in events:
        if isinstance(event, kind):
            return event
        executor.settled(event)
    raise AssertionError("unreachable: the events never end")


def park(executor: LocalExecutor, events: Iterator[Event], trial_id: str) -> TrialReported:
    """Start the trial on the one slot and park it in the worker at its first report: that report."""
    executor.apply(Start(trial_id, "local/cpu0"), executor.now())
    report = next_of(executor, events, TrialReported)
    executor.apply(Suspend(trial_id), executor.now())  # answered at its report
    executor.settled(report)
    assert next_of(executor, events, TrialSuspended).trial_id == trial_id
    return report


@pytest.mark.timeout(30)
def test_a_parked_trial_whose_log_became_a_fifo_fails_alone_at_its_next_print(tmp_path: Path) -> None:
    (tmp_path / "prints.py").write_text(textwrap.dedent(PRINTS))
    launch = TrialLaunch(2, function="prints:train", cwd=str(tmp_path))
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        events = events_of(executor)
        for trial_id in ("swapped", "beside"):
            executor.submit(trial_id, launch)
        first = {trial_id: park(executor, events, trial_id) for trial_id in ("swapped", "beside")}  # one worker
        fifo = executor.directory / "trials" / "swapped" / "stdout.log"
        os.remove(fifo)
        os.mkfifo(fifo)
        executor.apply(Resume("swapped", "local/cpu0"), executor.now())
        failed = next_of(executor, events, TrialExited)
        executor.apply(Resume("beside", "local/cpu0"), executor.now())
        second = next_of(executor, events, TrialReported)
        executor.settled(second)
        ended = next_of(executor, events, TrialExited)
    assert (failed.trial_id, failed.succeeded, failed.error) == (
        "swapped", False, f"cannot open its log: {fifo}: not a regular file")
    assert (ended.trial_id, ended.succeeded, ended.error) == ("beside", True, None)
    assert second.metrics["pid"] == first["beside"].metrics["pid"] == first["swapped"].metrics["pid"]  # one worker
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # left as it was
    beside = (executor.directory / "trials" / "beside" / "stdout.log").read_text()
    assert beside == "before its park\nafter its resume\n"
