"""A pool on Ray keeps each experiment's durable checkpoints in a folder of its own under the storage URI.

Two servers' pools (two stores) sharing one Ray cluster and one ``--storage-uri``, as docs/ray.md suggests, or one
whose database was made anew beside the old checkpoints: every store's first experiment is ``e1``, and its trials'
checkpoints were all ``<uri>/e1.0``. One server's experiment overwrote the other's, whose interrupted trial then
resumed from it: it ran no step, and was recorded completed with the other user's results. On a real two-node
cluster (a head and a worker, a CPU slot each), shared by the module; the trials are tests/trials/curve.py, whose
``total`` only an exact resumption from its own checkpoints gets right, and whose ``pids`` say it resumed.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hermes.core.states import TrialState  # noqa: E402
from hermes.experiment import parse_spec  # noqa: E402
from hermes.experiment.spec import ResourcesSpec  # noqa: E402
from hermes.pool import PoolSession, stored_form  # noqa: E402
from hermes.ray.storage import EXPERIMENT_MARK  # noqa: E402
from hermes.store import ExperimentStatus, SqlStore  # noqa: E402
from hermes.testing.ray_cluster import RayCluster  # noqa: E402
from tests.test_run import score, spec_of, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 6
TIMEOUT = 90.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=1, gpus_per_node=0, cpus_per_node=1, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:
        cluster.connect()
        yield cluster
    assert not cluster.pids()


def submit(store: SqlStore, name: str, rate: float, sleep: float) -> int:
    """One curve trial of ``rate``, a checkpoint every 2 steps."""
    spec = spec_of(name, search={"sampler": "list", "configs": [{"rate": rate, "sleep": sleep}]},
                   budget={"steps": BUDGET}, policy={"name": "fifo"})
    return store.submit_experiment(name, stored_form(parse_spec(spec)), owner="ann")


def pool_of(cluster: RayCluster, store: SqlStore, directory: Path, shared: Path) -> PoolSession:
    return PoolSession(store, directory, engine="ray", ray_address=cluster.address, storage_uri=str(shared),
                       resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)


def run_until(pool: PoolSession, condition: Callable[[], object], what: str) -> None:
    """Run the pool until ``condition()`` holds, then stop it (its experiments stay open in the store)."""
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        wait_for(condition, TIMEOUT, what)
    finally:
        pool.stop()
        runner.join(TIMEOUT)
    assert not runner.is_alive()


def checkpointed(store: SqlStore, experiment_id: int) -> bool:
    """Its trial reported a step past a durable checkpoint (uploaded before its report reached the core)."""
    return max((metric.step for metric in store.metrics(experiment_id)), default=0) >= 3


def finished(store: SqlStore, experiment_id: int) -> bool:
    return store.experiment(experiment_id).status is ExperimentStatus.FINISHED


def result(directory: Path, name: str) -> dict:
    return json.loads((directory / "runs" / name / "trials" / "0" / "result.json").read_text())


def exact_total(rate: float) -> float:
    return sum(score(rate, step) for step in range(1, BUDGET + 1))


def test_two_stores_sharing_a_storage_uri_keep_their_own_checkpoints(cluster: RayCluster, tmp_path: Path) -> None:
    """Store A's experiment 1 is interrupted after a checkpoint; store B's experiment 1 runs to its end on the same
    URI; A's, continued, resumes from its own checkpoint and ends with its own exact total."""
    shared = tmp_path / "shared"
    ann, bob = tmp_path / "ann", tmp_path / "bob"
    ann.mkdir(), bob.mkdir()
    store_a, store_b = SqlStore(f"sqlite:///{ann}/pool.db"), SqlStore(f"sqlite:///{bob}/pool.db")
    a = submit(store_a, "mine", 0.3, 0.3)
    b = submit(store_b, "theirs", 0.9, 0.02)
    assert a == b == 1
    run_until(pool_of(cluster, store_a, ann, shared), lambda: checkpointed(store_a, a), "a checkpoint of A's trial")
    assert store_a.experiment(a).status is ExperimentStatus.INTERRUPTED
    run_until(pool_of(cluster, store_b, bob, shared), lambda: finished(store_b, b), "B's experiment to finish")
    run_until(pool_of(cluster, store_a, ann, shared), lambda: finished(store_a, a), "A's experiment to finish")

    (trial,) = store_a.trials(a)
    assert trial.state is TrialState.COMPLETED
    mine, theirs = result(ann, "mine"), result(bob, "theirs")
    assert mine["total"] == pytest.approx(exact_total(0.3))  # B's state, taken from B's checkpoint: 4.6
    assert mine["step"] == BUDGET and len(mine["pids"]) >= 2  # resumed from a checkpoint, not from its start
    assert store_a.metrics(a)[-1].values["total"] == pytest.approx(exact_total(0.3))
    assert theirs["total"] == pytest.approx(exact_total(0.9))
    folders = {shared / path.relative_to(shared).parts[0] for path in shared.rglob("state.json")}
    assert len(folders) == 2 and all((folder / EXPERIMENT_MARK).exists() for folder in folders)
    assert not (shared / "e1.0").exists()
    store_a.close()
    store_b.close()


def test_an_experiment_that_ran_before_the_folders_keeps_finding_its_checkpoints(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """A pool experiment of a Hermes before these folders (events in its store, its checkpoints at ``<uri>/e1.0``,
    no folder of its own) resumes from them."""
    shared = tmp_path / "shared"
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment = submit(store, "old", 0.5, 0.3)
    run_until(pool_of(cluster, store, tmp_path, shared), lambda: checkpointed(store, experiment), "a checkpoint")
    (folder,) = [path for path in shared.iterdir() if (path / EXPERIMENT_MARK).exists()]
    shutil.move(folder / "e1.0", shared / "e1.0")  # where that Hermes kept them
    shutil.rmtree(folder)
    run_until(pool_of(cluster, store, tmp_path, shared), lambda: finished(store, experiment), "it to finish")

    old = result(tmp_path, "old")
    assert old["total"] == pytest.approx(exact_total(0.5))
    assert len(old["pids"]) >= 2  # resumed from <uri>/e1.0, not started again
    assert not [path for path in shared.iterdir() if (path / EXPERIMENT_MARK).exists()]  # no new folder made
    store.close()
