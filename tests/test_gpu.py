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


def until(executor: LocalExecutor, kind: type, trial_id: str, log: list[Event]) -> Event:
    """Answer 'continue' to every report until ``trial_id`` sends an event of ``kind``; all events go to ``log``."""
    while events := executor.next_events():
        for event in events:
            log.append(event)
            if isinstance(event, kind) and event.trial_id == trial_id:
                return event
            executor.settled(event)
    raise AssertionError(f"{trial_id} never sent {kind.__name__}")


def losses(log: list[Event], trial_id: str) -> list[float]:
    return [event.metrics["loss"] for event in log if isinstance(event, TrialReported) and event.trial_id == trial_id]


def uninterrupted(tmp_path: Path, seed: int) -> list[float]:
    log: list[Event] = []
    slot = local_slots()[0]
    with LocalExecutor(tmp_path / "reference", slots=[slot], metric="loss") as executor:
        executor.submit("ref", launch(seed))
        executor.apply(Start("ref", slot.name), executor.now())
        until(executor, TrialExited, "ref", log)
    return losses(log, "ref")


def test_each_gpu_slot_pins_one_device(tmp_path: Path) -> None:
    slots = local_slots()
    assert [slot.visible_devices for slot in slots] == discover_gpus()
    assert all(slot.name.startswith("local/gpu") for slot in slots)
    log: list[Event] = []
    with LocalExecutor(tmp_path, slots=slots, metric="loss") as executor:
        for slot in slots:
            executor.submit(slot.name.replace("/", "-"), launch(1))
        for slot in slots:
            executor.apply(Start(slot.name.replace("/", "-"), slot.name), executor.now())
        for slot in slots:
            until(executor, TrialExited, slot.name.replace("/", "-"), log)
    reported = [event for event in log if isinstance(event, TrialReported)]
    assert len(reported) == BUDGET * len(slots)
    assert {event.metrics["devices"] for event in reported} == {1.0}
    assert {tuple(losses(log, slot.name.replace("/", "-"))) for slot in slots} == {tuple(losses(log, "local-gpu0"))}


def test_a_parked_trial_leaves_the_device_to_the_next_and_resumes_exactly(tmp_path: Path) -> None:
    slot = local_slots()[0]
    log: list[Event] = []
    with LocalExecutor(tmp_path / "run", slots=[slot], metric="loss") as executor:
        executor.submit("a", launch(1))
        executor.submit("b", launch(2))
        executor.apply(Start("a", slot.name), executor.now())
        report = until(executor, TrialReported, "a", log)
        alone = report.metrics["allocated_mb"]
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        until(executor, TrialSuspended, "a", log)
        executor.apply(Start("b", slot.name), executor.now())  # in the same worker process, beside parked a
        until(executor, TrialExited, "b", log)
        executor.apply(Resume("a", slot.name), executor.now())
        until(executor, TrialExited, "a", log)
    beside = [event.metrics["allocated_mb"] for event in log if isinstance(event, TrialReported) and event.trial_id == "b"]
    assert alone >= 0.9 * MEGABYTES
    assert max(beside) < alone + MEGABYTES / 2  # a's weights and momentum were not on the device meanwhile
    assert losses(log, "a") == uninterrupted(tmp_path, seed=1)


def test_a_trial_migrates_between_slots_through_a_checkpoint_and_resumes_exactly(tmp_path: Path) -> None:
    gpu = discover_gpus()[0]
    here, there = local_slots(gpus=[gpu, gpu])  # two slots of one device: the move goes through the disk all the same
    log: list[Event] = []
    with LocalExecutor(tmp_path / "run", slots=[here, there], metric="loss") as executor:
        executor.submit("a", launch(3))
        executor.apply(Start("a", here.name), executor.now())
        report = until(executor, TrialReported, "a", log)
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        until(executor, TrialSuspended, "a", log)
        executor.apply(Resume("a", there.name, migrated=True), executor.now())
        until(executor, TrialExited, "a", log)
    assert losses(log, "a") == uninterrupted(tmp_path, seed=3)
    assert (tmp_path / "run" / "trials" / "a").is_dir()
