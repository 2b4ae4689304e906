"""A trial's own files under ``trial_dir()/checkpoints/`` (a trial that works in its folder, as Ray Tune's do, and
keeps its best model in ``checkpoints/best/``) are never Hermes's to delete: a checkpoint's commit, a ``Start`` from
scratch and a download from a storage URI delete only what Hermes wrote there. Real workers, real processes, a real
store; each trial module is written to the test's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import TrialExited, TrialReported, TrialSuspended
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.ray.storage import CheckpointStore
from hermes.trial import Files, protocol
from hermes.trial.session import Session, bind
from tests.test_warm_trial_edges import LIMITS, module
from tests.test_warm_workers import until_ended

KEEPS_ITS_BEST = """
    import json
    import os

    from hermes import trial


    def train(config):
        os.chdir(trial.trial_dir())
        state = {"step": 0}
        saver = trial.Files(lambda d: (d / "s.json").write_text(json.dumps(state)),
                            lambda d: state.update(json.loads((d / "s.json").read_text())))
        for step in range(saver.restore() + 1, trial.budget() + 1):
            if step == 1:  # the trial's own folder and file, made once
                os.makedirs("checkpoints/best", exist_ok=True)
                with open("checkpoints/best/model.txt", "w") as best:
                    best.write("best of step 1")
                with open("checkpoints/notes.txt", "w") as notes:
                    notes.write("mine")
            state["step"] = step
            trial.report(step, score=float(step), best=float(os.path.exists("checkpoints/best/model.txt")))
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm-worker", "process-per-run"])
def test_a_trials_own_folder_under_checkpoints_outlives_every_checkpoint(tmp_path: Path, warm: bool) -> None:
    """Each commit deleted every folder under checkpoints/ but its own: the trial's best model went at its next
    report. Suspended and resumed from its checkpoint on the other slot, it still finds it."""
    function = module(tmp_path, "keeps_its_best", KEEPS_ITS_BEST)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", limits=LIMITS,
                       checkpoint_every=1) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(4, function=function, cwd=str(tmp_path), warm=warm))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        for _ in range(2):
            [report] = executor.next_events()
            assert isinstance(report, TrialReported), report
            if report.step == 2:
                executor.apply(Suspend("a"), executor.now())
            executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended), suspended
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # from its checkpoint
        events = until_ended(executor, 1)
    assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]
    assert [(e.step, e.metrics["best"]) for e in events if isinstance(e, TrialReported)] == [(3, 1.0), (4, 1.0)]
    checkpoints = tmp_path / "run" / "trials" / "a" / protocol.CHECKPOINTS_DIR
    assert (checkpoints / "best" / "model.txt").read_text() == "best of step 1"
    assert (checkpoints / "notes.txt").read_text() == "mine"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best", "latest", "notes.txt", "step-4"]


ASKS_WHERE_IT_STARTS = """
    from hermes import trial


    def train(config):
        trial.Files(lambda d: None, lambda d: None)
        for step in range(trial.start_step() + 1, trial.budget() + 1):
            trial.report(step, score=float(step))
"""


def test_a_start_from_scratch_deletes_hermess_checkpoints_only(tmp_path: Path) -> None:
    """A Start deleted the whole of checkpoints/, the trial's own folder in it too."""
    function = module(tmp_path, "asks_where_it_starts", ASKS_WHERE_IT_STARTS)
    checkpoints = tmp_path / "run" / "trials" / "a" / protocol.CHECKPOINTS_DIR
    for name in ("step-5", ".tmp-step-6", ".tmp-download-7", "best"):
        (checkpoints / name).mkdir(parents=True)
    (checkpoints / "step-5" / protocol.META_FILE).write_text('{"step": 5}')
    (checkpoints / protocol.LATEST_FILE).write_text("step-5")
    (checkpoints / "best" / "model.txt").write_text("mine")
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS,
                       checkpoint_every=1) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(2, function=function, cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        events = until_ended(executor, 1)
    assert [e.step for e in events if isinstance(e, TrialReported)] == [1, 2]  # from scratch, not from step 5
    assert (checkpoints / "best" / "model.txt").read_text() == "mine"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best", "latest", "step-2"]


def test_a_start_from_scratch_leaves_no_checkpoints_folder_of_hermess_alone(tmp_path: Path) -> None:
    """With nothing of the trial's own in it, checkpoints/ goes, as before: the trial has never checkpointed."""
    function = module(tmp_path, "asks_where_it_starts", ASKS_WHERE_IT_STARTS)
    checkpoints = tmp_path / "run" / "trials" / "a" / protocol.CHECKPOINTS_DIR
    (checkpoints / "step-5").mkdir(parents=True)
    (checkpoints / "step-5" / protocol.META_FILE).write_text('{"step": 5}')
    (checkpoints / protocol.LATEST_FILE).write_text("step-5")
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(1, function=function, cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        events = until_ended(executor, 1)
    assert [e.step for e in events if isinstance(e, TrialReported)] == [1]
    assert not checkpoints.exists()


def test_a_download_from_a_storage_uri_keeps_the_trials_own_folder(tmp_path: Path) -> None:
    """A checkpoint fetched from a storage URI (a trial resumed on a Ray node) deleted every other folder under its
    checkpoints/ but the new one; now only Hermes's older checkpoints and temporary folders go."""
    source = tmp_path / "node-a" / "t1"
    source.mkdir(parents=True)
    (source / protocol.CONFIG_FILE).write_text("{}")
    session = Session("t1", source, channel=None, budget=10, metric=None, checkpoint_every=0)  # type: ignore[arg-type]
    bind(session)
    try:
        Files(lambda directory: (directory / "w.bin").write_bytes(b"w"), lambda directory: None)
        session.save(4)
    finally:
        bind(None)
    store = CheckpointStore(f"file://{tmp_path / 'bucket'}")
    assert store.upload_latest("t1", source) == 4

    checkpoints = tmp_path / "node-b" / "t1" / protocol.CHECKPOINTS_DIR
    for name in ("step-2", ".tmp-step-3", "best"):
        (checkpoints / name).mkdir(parents=True)
    (checkpoints / "best" / "model.txt").write_text("mine")
    assert store.download("t1", checkpoints.parent) == 4
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best", "latest", "step-4"]
    assert (checkpoints / "best" / "model.txt").read_text() == "mine"
    assert (checkpoints / "step-4" / "files" / "w.bin").read_bytes() == b"w"
