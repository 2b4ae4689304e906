"""Trials on a real CUDA device: each GPU slot pins one device, a parked trial hands the device's
memory to the next trial, and a trial resumes bitwise-exactly on its own slot (from host memory)
and on another (through a checkpoint on disk).

Skipped where NVML finds no GPU or torch sees no CUDA device; CI has none, so these run on a
machine lent with one (the closing notes say when and where they last passed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.resources import discover_gpus
from hermes.trial import protocol

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (discover_gpus() and torch.cuda.is_available()), reason="no CUDA device (NVML and torch must both see one)"
)

TESTS = Path(__file__).resolve().parent
BUDGET = 6
MEGABYTES = 256.0  # each trial's weights and momentum


def launch(seed: int) -> TrialLaunch:
    return TrialLaunch(BUDGET, function="trials.gpu:train", config={"seed": seed, "megabytes": MEGABYTES},
                       cwd=str(TESTS))


class Driver:
    """Drives an executor by hand: answers 'continue' to every report until the event a test waits for.

    Events of other trials are kept: the one waited for next may have come already."""

    def __init__(self, executor: LocalExecutor) -> None:
        self.executor = executor
        self.log: list[Event] = []  # every event, in order
        self._pending: list[Event] = []  # received, not yet looked at
        self._kept: list[Event] = []  # looked at, waited for by nobody yet (reports are answered, never kept)

    def until(self, kind: type, trial_id: str) -> Event:
        for event in self._kept:
            if isinstance(event, kind) and event.trial_id == trial_id:
                self._kept.remove(event)
                return event
        while True:
            if not self._pending:
                self._pending = list(self.executor.next_events())
                if not self._pending:
                    raise AssertionError(f"{trial_id} never sent {kind.__name__}")
            event = self._pending.pop(0)
            self.log.append(event)
            if isinstance(event, kind) and event.trial_id == trial_id:
                return event
            if isinstance(event, TrialReported):
                self.executor.settled(event)
            elif hasattr(event, "trial_id"):
                self._kept.append(event)


def losses(log: list[Event], trial_id: str) -> list[float]:
    return [event.metrics["loss"] for event in log if isinstance(event, TrialReported) and event.trial_id == trial_id]


def uninterrupted(tmp_path: Path, seed: int) -> list[float]:
    slot = local_slots()[0]
    with LocalExecutor(tmp_path / "reference", slots=[slot], metric="loss") as executor:
        drive = Driver(executor)
        executor.submit("ref", launch(seed))
        executor.apply(Start("ref", slot.name), executor.now())
        drive.until(TrialExited, "ref")
    return losses(drive.log, "ref")


def test_each_gpu_slot_pins_one_device(tmp_path: Path) -> None:
    slots = local_slots()
    assert [slot.visible_devices for slot in slots] == discover_gpus()
    assert all(slot.name.startswith("local/gpu") for slot in slots)
    trials = {slot.name.replace("/", "-"): slot for slot in slots}  # one trial per slot, named after it
    with LocalExecutor(tmp_path, slots=slots, metric="loss") as executor:
        drive = Driver(executor)
        for trial_id, slot in trials.items():
            executor.submit(trial_id, launch(1))
            executor.apply(Start(trial_id, slot.name), executor.now())
        for trial_id in trials:
            drive.until(TrialExited, trial_id)
    reported = [event for event in drive.log if isinstance(event, TrialReported)]
    assert len(reported) == BUDGET * len(slots)
    assert {event.metrics["devices"] for event in reported} == {1.0}
    assert len({tuple(losses(drive.log, trial_id)) for trial_id in trials}) == 1  # the same seed trains alike on every device


def test_a_parked_trial_leaves_the_device_to_the_next_and_resumes_exactly(tmp_path: Path) -> None:
    slot = local_slots()[0]
    with LocalExecutor(tmp_path / "run", slots=[slot], metric="loss") as executor:
        drive = Driver(executor)
        executor.submit("a", launch(1))
        executor.submit("b", launch(2))
        executor.apply(Start("a", slot.name), executor.now())
        report = drive.until(TrialReported, "a")
        alone = report.metrics["allocated_mb"]
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        drive.until(TrialSuspended, "a")
        executor.apply(Start("b", slot.name), executor.now())  # in the same worker process, beside parked a
        drive.until(TrialExited, "b")
        executor.apply(Resume("a", slot.name), executor.now())
        drive.until(TrialExited, "a")
    beside = [event.metrics["allocated_mb"] for event in drive.log if isinstance(event, TrialReported) and event.trial_id == "b"]
    assert alone >= 0.9 * MEGABYTES
    assert max(beside) < alone + MEGABYTES / 2  # a's weights and momentum were not on the device meanwhile
    assert losses(drive.log, "a") == uninterrupted(tmp_path, seed=1)


def test_a_trial_migrates_between_slots_through_a_checkpoint_and_resumes_exactly(tmp_path: Path) -> None:
    gpu = discover_gpus()[0]
    here, there = local_slots(gpus=[gpu, gpu])  # two slots of one device: the move goes through the disk all the same
    with LocalExecutor(tmp_path / "run", slots=[here, there], metric="loss") as executor:
        drive = Driver(executor)
        executor.submit("a", launch(3))
        executor.apply(Start("a", here.name), executor.now())
        report = drive.until(TrialReported, "a")
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        drive.until(TrialSuspended, "a")
        executor.apply(Resume("a", there.name, migrated=True), executor.now())
        drive.until(TrialExited, "a")
    assert losses(drive.log, "a") == uninterrupted(tmp_path, seed=3)
    assert (tmp_path / "run" / "trials" / "a" / protocol.CHECKPOINTS_DIR).is_dir()  # the move went through one
