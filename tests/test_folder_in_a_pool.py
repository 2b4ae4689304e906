"""Two experiments of one pool whose folders coincide: the one taken up second fails alone, naming the first, which
goes on. Within one process a later session of a folder took the lock over from any earlier one (for a pool started
again after its predecessor stopped), so a live pool's two experiments wrote one folder's trials.

Through a server: one user's experiment name linked, in their area, to the folder of another of their experiments
(the area check resolves the link, which stays inside the area). Through ``hermes pool``: two owners' experiments of
one name with one absolute storage.dir. Real pools, real trial processes (tests/trials/curve.py), real stores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore
from hermes.store.lock import LOCK_FILE, holder
from tests.test_pool import pool_spec, running, status, submit
from tests.test_run import wait_for

TIMEOUT = 30
SLOTS = ResourcesSpec(gpus="none", cpu_slots=2)


def long_spec(name: str, **sections: Any) -> dict[str, Any]:
    """Two trials of 400 steps of 0.05 s: running until cancelled."""
    return pool_spec(name, 2, 0.05, budget=400, **sections)


@pytest.mark.parametrize("how", ["linked", "absolute"])
def test_an_experiment_whose_folder_a_running_one_of_the_pool_holds_fails_naming_it(tmp_path: Path, how: str) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=SLOTS, poll=0.1)
    if how == "linked":  # ann/second's folder is a link to ann/first's
        first_id = submit(store, long_spec("first"))
        second_spec, owner, folder = long_spec("second"), "ann", tmp_path / "runs" / "first"
    else:  # ann/same and bob/same, both in /.../shared/same
        storage = {"dir": str(tmp_path / "shared"), "checkpoint_every": 2}
        first_id = submit(store, long_spec("same", storage=storage))
        second_spec, owner, folder = long_spec("same", storage=storage), "bob", tmp_path / "shared" / "same"
    with running(pool) as runner:
        wait_for(lambda: store.metrics(first_id), TIMEOUT, "the first experiment to report")
        if how == "linked":
            (tmp_path / "runs" / "second").symlink_to(folder)
        second_id = submit(store, second_spec, owner=owner)
        wait_for(lambda: status(store, second_id) is not ExperimentStatus.QUEUED, TIMEOUT, "the pool to take it up")
        refused = store.experiment(second_id)
        assert refused.status is ExperimentStatus.FAILED, refused
        first_name = "first" if how == "linked" else "same"
        assert refused.error == (
            f"the experiment folder {folder if how == 'absolute' else tmp_path / 'runs' / 'second'} is in use by "
            f"experiment {first_name!r}, which this process (pid {os.getpid()}) runs too: its trials "
            "keep their files there; one experiment per folder: give this one another name or storage.dir, or run "
            "it once that one has ended"), refused.error
        assert not store.trials(second_id) and status(store, first_id) is ExperimentStatus.RUNNING
        assert holder(folder / LOCK_FILE)["experiment"] == first_name  # type: ignore[index]
        reported = len(store.metrics(first_id))
        wait_for(lambda: len(store.metrics(first_id)) > reported + 2, TIMEOUT, "the first to go on reporting")
        store.request_cancel(first_id)
        wait_for(lambda: status(store, first_id) is ExperimentStatus.CANCELLED, TIMEOUT, "the first's cancel")
        assert runner.is_alive()
    assert holder(folder / LOCK_FILE) is None
    store.close()


def test_a_pool_started_again_in_the_process_takes_the_folders_over_from_the_stopped_ones_sessions(
    tmp_path: Path,
) -> None:
    """A server starts its pool again after an error; the stopped pool's sessions, which hold their folders, live on
    (here: the stopped pool is kept) and no longer run, so the new pool's take the folders over."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    stopped = PoolSession(store, tmp_path, resources=SLOTS, poll=0.1)
    experiment_id = submit(store, long_spec("again"))
    folder = tmp_path / "runs" / "again"
    with running(stopped):
        wait_for(lambda: store.metrics(experiment_id), TIMEOUT, "the experiment to report")
    assert status(store, experiment_id) is ExperimentStatus.INTERRUPTED
    assert holder(folder / LOCK_FILE) is not None  # held by the stopped pool's session, kept alive here
    again = PoolSession(store, tmp_path, resources=SLOTS, poll=0.1)
    with running(again) as runner:
        reported = len(store.metrics(experiment_id))
        wait_for(lambda: len(store.metrics(experiment_id)) > reported + 2, TIMEOUT, "the new pool to run it")
        assert status(store, experiment_id) is ExperimentStatus.RUNNING and runner.is_alive()
        store.request_cancel(experiment_id)
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.CANCELLED, TIMEOUT, "its cancel")
    assert stopped.members  # the stopped pool's sessions were there all along
    store.close()
