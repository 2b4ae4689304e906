"""A store older than a trial's checkpoint (a backup put back, say) lacks the steps between its record and the
checkpoint for good: the trial goes on from its checkpoint and reports only the checkpoint's step again. It did so
without a word, leaving holes in the learning curves; now its stderr names the steps missing. A checkpoint just ahead
of the store, as a runner that died between the two leaves it, says nothing. Real trial processes and checkpoints:
a first executor trains the trial and commits its checkpoints, a second resumes it where a store would have it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start
from hermes.core.events import TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_warm_trial_edges import LIMITS, module
from tests.test_warm_workers import until_ended

TRAIN = """
    from hermes import trial


    def train(config):
        state = {"step": 0}
        saver = trial.Files(lambda d: (d / "step").write_text(str(state["step"])),
                            lambda d: state.update(step=int((d / "step").read_text())))
        for step in range(saver.restore() + 1, trial.budget() + 1):
            state["step"] = step
            trial.report(step, score=step / 10)
"""


def launch(folder: Path, budget: int) -> TrialLaunch:
    return TrialLaunch(budget, function=module(folder, "counting", TRAIN), cwd=str(folder), warm=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """By ``checkpoint_every`` (1, 3): the folder of an executor whose trial "a" trained 6 steps, its last
    checkpoint of step 6."""
    folders = {}
    for every in (1, 3):
        folder = tmp_path_factory.mktemp(f"every-{every}")
        with LocalExecutor(folder / "run", slots=local_slots(cpu_slots=1), metric="score", checkpoint_every=every,
                           limits=LIMITS) as executor:
            executor.next_events()  # the node's NodeAdded
            executor.submit("a", launch(folder, 6))
            executor.apply(Start("a", "local/cpu0"), executor.now())
            [exited] = [e for e in until_ended(executor, 1) if isinstance(e, TrialExited)]
            assert exited.succeeded, exited
        folders[every] = folder
    return folders


def resumed(trained: dict[int, Path], tmp_path: Path, *, every: int, reported_step: int) -> tuple[list[int], str]:
    """Resume trial "a" (budget 8) from its checkpoint of step 6, the store holding its steps up to
    ``reported_step`` (``Trial.catch_up_step``, what a runner submits it with); the steps it reported, and what its
    stderr says."""
    shutil.copytree(trained[every], tmp_path, dirs_exist_ok=True)
    stderr = tmp_path / "run" / "trials" / "a" / "stderr.log"
    before = stderr.read_text()
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", checkpoint_every=every,
                       limits=LIMITS) as executor:
        executor.next_events()
        executor.submit("a", launch(tmp_path, 8), reported_step=reported_step)
        executor.apply(Resume("a", "local/cpu0"), executor.now())
        events = until_ended(executor, 1)
    assert next(e for e in events if isinstance(e, TrialExited)).succeeded, events
    return [e.step for e in events if isinstance(e, TrialReported)], stderr.read_text()[len(before):]


@pytest.mark.parametrize(
    ("every", "reported_step", "said"),
    [
        (1, 2, ("its checkpoint is of step 6, but the store holds none of its steps from 3 on (its last checkpoint "
                "there is of step 2, and one is taken at every step): steps 3 to 5 are missing from the store for "
                "good, a hole in its learning curve, as the trial goes on from its checkpoint and reports step 6 "
                "alone again. The store is older than its checkpoints: was it restored from a backup?")),
        (1, 4, ("its checkpoint is of step 6, but the store holds none of its steps from 5 on (its last checkpoint "
                "there is of step 4, and one is taken at every step): step 5 is missing from the store for good, a "
                "hole")),
        (3, 1, ("its checkpoint is of step 6, but the store holds none of its steps from 3 on (its last checkpoint "
                "there is of step 1, and one is taken every 3 steps): steps 3 to 5 are missing from the store for "
                "good (step 2 may be too), a hole")),
    ],
    ids=["every-step", "one-step", "every-3"],
)
def test_a_store_older_than_the_checkpoint_names_the_steps_it_lacks(
    trained: dict[int, Path], tmp_path: Path, every: int, reported_step: int, said: str
) -> None:
    steps, stderr = resumed(trained, tmp_path, every=every, reported_step=reported_step)
    assert steps == [6, 7, 8]  # what is reported is as before: the checkpoint's step again, then on from it
    assert stderr.startswith(f"hermes: trial a: {said}"), stderr


@pytest.mark.parametrize(("every", "reported_step"), [(1, 5), (3, 3), (3, 4)],
                         ids=["every-step", "every-3", "suspended"])
def test_a_checkpoint_just_ahead_of_the_store_says_nothing(
    trained: dict[int, Path], tmp_path: Path, every: int, reported_step: int
) -> None:
    """The runner died between the checkpoint and its record: the store holds every step before the checkpoint (with
    a checkpoint every 3 steps and its last recorded of step 3, or of a suspension at 4, it may hold 4 and 5)."""
    steps, stderr = resumed(trained, tmp_path, every=every, reported_step=reported_step)
    assert steps == [6, 7, 8]
    assert "missing" not in stderr, stderr
