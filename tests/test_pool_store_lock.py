"""One pool per store. A second pool on a store that a pool holds (``python -m hermes.pool`` with another
``--dir``, a server with another ``--root`` but the same ``--database``) is refused at its start, naming the
first: the two took each other's experiments, and wrote one trial's folder from both. And an experiment whose
writer claim another store object took leaves the pool alone: the error stopped every user's experiments.

Real pools, real trial processes (tests/trials/curve.py), real SQLite files and a throwaway PostgreSQL server.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.core.states import TrialState
from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore
from hermes.store.lock import StorageInUse, holder
from hermes.store.sql import POOL_LOCK_SUFFIX
from tests.test_pool import check_completed, pool_spec, running, status, submit
from tests.test_run import environment, wait_for

TIMEOUT = 30
SLOTS = ResourcesSpec(gpus="none", cpu_slots=2)


def refusal(command: list[str], cwd: Path) -> str:
    """The one line a refused pool or server prints (exit 2); the test fails if it starts instead."""
    ended = subprocess.run(command, check=False, cwd=cwd, env=environment(), capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert ended.returncode == 2, ended.stderr
    assert "Traceback" not in ended.stderr and ended.stderr.count("\n") == 1, ended.stderr
    return ended.stderr


def test_a_second_pool_or_server_on_a_sqlite_store_a_pool_holds_is_refused_naming_it(tmp_path: Path) -> None:
    database = tmp_path / "srv" / "hermes.db"
    store = SqlStore(f"sqlite:///{database}")
    pool = PoolSession(store, tmp_path / "srv", resources=SLOTS, poll=0.1)
    (tmp_path / "pool2").mkdir()
    first = submit(store, pool_spec("first", 2, 0.05))
    with running(pool):
        wait_for(lambda: status(store, first) is ExperimentStatus.FINISHED, TIMEOUT, "the first pool to run it")
        queued = submit(store, pool_spec("queued", 1, 0.05))
        held_by = f"is in use by another pool, pid {os.getpid()} on {socket.gethostname()} (`"
        pool_refused = refusal([sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{database}",
                                "--dir", str(tmp_path / "pool2"), "--cpu-slots", "1"], tmp_path)
        assert pool_refused.startswith(f"hermes: error: the store {database} {held_by}"), pool_refused
        assert "one pool per store" in pool_refused
        server_refused = refusal([sys.executable, "-m", "hermes.cli", "server", "--root", str(tmp_path / "srv2"),
                                  "--database", f"sqlite:///{database}", "--port", "0"], tmp_path)
        assert server_refused.startswith(f"hermes: error: the store {database} {held_by}"), server_refused
        wait_for(lambda: status(store, queued) is ExperimentStatus.FINISHED, TIMEOUT, "the first pool to run it")
    assert holder(database.with_name(database.name + POOL_LOCK_SUFFIX)) is None  # a pool that stopped holds none
    for experiment_id in (first, queued):  # run by the first pool alone, to the end
        check_completed(store, tmp_path / "srv", experiment_id, store.experiment(experiment_id).spec["search"]
                        ["trials"], 5)
    store.close()


def test_a_second_pool_on_a_postgresql_store_a_pool_holds_is_refused_naming_it(tmp_path: Path, postgres) -> None:
    url = postgres.new_database()
    store, other = SqlStore(url), SqlStore(url)
    PoolSession(store, tmp_path / "first").claim()  # as a server does at its start, before its pool runs
    refused = refusal([sys.executable, "-m", "hermes.pool", "--store", url, "--dir", str(tmp_path)], tmp_path)
    assert refused.startswith(f"hermes: error: the store {other.url} is in use by another pool, hermes pool: pid "
                              f"{os.getpid()} on {socket.gethostname()} (its PostgreSQL session from "), refused
    second = PoolSession(other, tmp_path / "second")
    with pytest.raises(StorageInUse, match="in use by another pool"):
        second.claim()
    assert holder(tmp_path / "second" / "pool" / "hermes.lock") is None  # the refused pool holds its folder no more
    store.close()  # the first's session ends, as when its process ends
    second.claim()
    other.close()


def test_an_experiment_another_writer_took_leaves_the_pool_which_goes_on(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path}/pool.db"
    store = SqlStore(url)
    pool = PoolSession(store, tmp_path, resources=SLOTS, poll=0.1)
    taken = submit(store, pool_spec("taken", 2, 0.1, budget=200))
    with caplog.at_level(logging.INFO, logger="hermes.pool"), running(pool) as runner:
        wait_for(lambda: store.metrics(taken), TIMEOUT, "the experiment to report")
        SqlStore(url).claim_writer(taken, "pid 1 on elsewhere")
        logged = len(store.events(taken))
        wait_for(lambda: all(member.record.experiment_id != taken for member in list(pool.members.values())),
                 TIMEOUT, "the experiment to leave the pool")
        after = submit(store, pool_spec("after", 2, 0.05))
        wait_for(lambda: status(store, after) is ExperimentStatus.FINISHED, TIMEOUT, "the pool to go on")
        assert runner.is_alive()
    check_completed(store, tmp_path, after, 2, 5)
    assert len(store.events(taken)) == logged and status(store, taken) is ExperimentStatus.RUNNING  # its new writer's
    assert f"experiment ann/taken leaves this pool, its trials here stop: experiment {taken} in {url} has another " \
           "writer now (pid 1 on elsewhere)" in caplog.text
    assert "experiment ann/taken left this pool" in caplog.text
    store.close()


# ---------------------------------------------------------------------- what a pool keeps of an ended experiment
def test_the_executor_forgets_the_trials_of_every_experiment_that_ended(tmp_path: Path) -> None:
    """A server's pool kept every trial of every experiment it ran in its executor (about a KB each), and their
    keys in its core, for its life. An experiment cancelled while its trials wait for a GPU ends in the call that
    stops them: the stops are carried out before the executor forgets those trials (else they found none)."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=SLOTS, poll=0.1)
    finished = submit(store, pool_spec("finished", 3, 0.02, budget=3))
    with running(pool) as runner:
        wait_for(lambda: status(store, finished) is ExperimentStatus.FINISHED, TIMEOUT, "the first to finish")
        hog = submit(store, pool_spec("hog", 2, 0.1, budget=200))
        wait_for(lambda: {trial.state for trial in store.trials(hog)} == {TrialState.RUNNING}, TIMEOUT,
                 "the hog to run on both slots")
        waiting = submit(store, pool_spec("waiting", 2, 0.02))
        wait_for(lambda: status(store, waiting) is ExperimentStatus.RUNNING, TIMEOUT, "the pool to take it up")
        store.request_cancel(waiting)  # its trials wait: the pool owes it a slot, short of preempting for it
        wait_for(lambda: status(store, waiting) is ExperimentStatus.CANCELLED, TIMEOUT, "the waiting one's cancel")
        assert {trial.state for trial in store.trials(waiting)} == {TrialState.STOPPED}
        store.request_cancel(hog)
        wait_for(lambda: status(store, hog) is ExperimentStatus.CANCELLED, TIMEOUT, "the hog's cancel")
        wait_for(lambda: not pool.executor._trials, 5, "the executor to forget the ended experiments' trials")
        assert not pool.executor.watchdog._watches and pool.scheduler.finished_experiments == []
        after = submit(store, pool_spec("after", 2, 0.02, budget=3))
        wait_for(lambda: status(store, after) is ExperimentStatus.FINISHED, TIMEOUT, "the pool to go on")
        wait_for(lambda: not pool.executor._trials, 5, "the executor to forget its trials too")
        assert runner.is_alive()
    check_completed(store, tmp_path, after, 2, 3)
    store.close()
