"""The Ray engine on a cluster laid out as deploy/kuberay/raycluster.yaml lays it out: a head started with no Ray CPU
(``num-cpus 0``: no Ray work there) and, at first, worker nodes without GPUs (KubeRay's autoscaler removed the idle GPU
workers). With CPU slots no trial may run on the head; with GPUs, Hermes must ask the autoscaler for GPU nodes, or
``hermes run`` waits for ever (Ray sees no demand of trials waiting in Hermes's queue).

The test cluster runs no autoscaler (``--no-monitor``), so the request is read back where the autoscaler would read it:
its standing request in the GCS's key-value store (``request_resources`` of autoscaler v1, Ray's default).
"""

from __future__ import annotations

import json
import logging
import os
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hermes.core.decisions import Decision, Start
from hermes.core.events import Event, NodeAdded, TrialReported
from hermes.core.states import TrialState
from hermes.experiment import parse_spec
from hermes.local.launch import TrialLaunch
from hermes.pool import PoolSession, stored_form
from hermes.ray.executor import RayExecutor, node_name
from hermes.session import ExperimentSession
from hermes.store import ExperimentStatus, SqlStore
from hermes.testing.ray_cluster import RayCluster, RayNode
from tests.test_pool import running, submit
from tests.test_run import wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=0, cpus_per_node=0, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:  # a head with no Ray CPU, as KubeRay's with num-cpus: "0"
        cluster.cpus_per_node = 1
        cluster.add_node(num_gpus=0)  # a worker with a Ray CPU and no GPU
        cluster.connect()
        yield cluster
    assert not cluster.pids()


def requested_bundles() -> list[dict] | None:
    """The autoscaler's standing request (``ray.autoscaler.sdk.request_resources``); None: none was ever made."""
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    request = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return None if request is None else json.loads(request)


def events_until(
    executor: RayExecutor, done: Callable[[list[Event]], bool], timeout: float = 30.0, *, answer: bool = False
) -> list[Event]:
    """The executor's events until ``done`` holds of them (the executor's period makes it answer while none come);
    ``answer``: each answered as the engine does once the core has decided (a report: "continue")."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while not done(events):
        assert time.monotonic() < deadline, events
        new = executor.next_events()
        for event in new if answer else ():
            executor.settled(event)
        events += new
    return events


def trial(rate: float) -> TrialLaunch:
    return TrialLaunch(4, function="tests.trials.curve:train", config={"rate": rate, "sleep": 0.01}, cwd=str(ROOT))


def worker_nodes(cluster: RayCluster) -> set[str]:
    return {node_name(node.node_id) for node in cluster.nodes if not node.head}


def test_cpu_slots_skip_a_head_with_no_ray_cpu(cluster: RayCluster, tmp_path: Path) -> None:
    """``gpus: none``: trials ran on the KubeRay head too, which its ``num-cpus: 0`` keeps free of Ray work."""
    executor = RayExecutor(tmp_path, storage_uri=str(tmp_path / "ckpt"), metric="score", cpu_slots=1, period=0.2)
    try:
        added = [e for e in events_until(executor, lambda events: any(isinstance(e, NodeAdded) for e in events))
                 if isinstance(e, NodeAdded)]
        added += [e for e in executor.next_events() if isinstance(e, NodeAdded)]  # any other node's, ready by now
    finally:
        executor.close()
    head = node_name(cluster.nodes[0].node_id)
    assert {event.node for event in added} == worker_nodes(cluster), (head, added)
    assert all(gpu.startswith(tuple(worker_nodes(cluster))) for event in added for gpu in event.gpus)


def test_trials_waiting_for_a_gpu_ask_the_autoscaler_and_withdraw(
    cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No node has a GPU (KubeRay's autoscaler removed the idle GPU workers): ``hermes run`` waited for ever, asking
    Ray for nothing, and told the user to run on CPU slots. It asks the autoscaler for a GPU per trial, says so, and
    withdraws the request when it ends or once a GPU node has joined."""
    with caplog.at_level(logging.WARNING, logger="hermes.ray"):
        executor = RayExecutor(tmp_path / "a", storage_uri=str(tmp_path / "ckpt"), metric="score", period=0.2)
        try:
            executor.submit("a", trial(0.1))
            executor.submit("b", trial(0.2))
            events_until(executor, lambda _: requested_bundles() == [{"GPU": 1}, {"GPU": 1}], timeout=10)
        finally:
            executor.close()
    assert requested_bundles() == []  # withdrawn as the run ended
    notes = [record.getMessage() for record in caplog.records if "waiting for a Ray node with GPUs" in record.getMessage()]
    assert len(notes) == 1 and "the cluster has none yet" in notes[0], notes
    assert "asked Ray's autoscaler for 2 GPU(s)" in notes[0], notes
    assert notes[0].index("autoscaler") < notes[0].index("gpus: none"), notes  # CPU slots last, not the first remedy

    executor = RayExecutor(tmp_path / "b", storage_uri=str(tmp_path / "ckpt"), metric="score", period=0.2)
    try:
        executor.submit("c", trial(0.3))
        events_until(executor, lambda _: requested_bundles() == [{"GPU": 1}], timeout=10)
        gpu_node: RayNode = cluster.add_node(num_gpus=1)  # what the autoscaler would add
        added = events_until(executor, lambda events: any(isinstance(e, NodeAdded) for e in events), timeout=60)
        assert [e.node for e in added if isinstance(e, NodeAdded)] == [node_name(gpu_node.node_id)]
        assert requested_bundles() == []  # withdrawn once a GPU node is there, the run still going
    finally:
        executor.close()


THREADS_TRIAL = """
    import os

    from hermes import trial


    def train(config):
        trial.report(1, score=1.0, threads=float(os.environ["OMP_NUM_THREADS"]))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs more cores than the node's one Ray CPU")
def test_gpu_slots_use_the_nodes_ray_cpus_not_every_core_of_the_host(cluster: RayCluster, tmp_path: Path) -> None:
    """A KubeRay GPU pod (cpu: 30, Ray's CPU resource 30) sees every core of a 128-core host: its 4 GPU slots each got
    32 threads. Here a node of one Ray CPU and one GPU on a host of more cores: its slot's trial gets one thread."""
    gpu_nodes = [node for node in cluster.nodes if node.num_gpus > 0] or [cluster.add_node(num_gpus=1)]
    node = node_name(gpu_nodes[0].node_id)
    (tmp_path / "threads_trial.py").write_text(textwrap.dedent(THREADS_TRIAL))
    executor = RayExecutor(tmp_path / "run", storage_uri=str(tmp_path / "ckpt"), metric="score", period=0.2)
    try:
        executor.submit("t", TrialLaunch(1, function="threads_trial:train", cwd=str(tmp_path)))
        executor.apply(Start("t", f"{node}/gpu0"), executor.now())
        reports = [e for e in events_until(executor, lambda events: any(isinstance(e, TrialReported) for e in events))
                   if isinstance(e, TrialReported)]
    finally:
        executor.close()
    assert reports[0].metrics["threads"] == 1.0, reports


def alive_gpu_node(cluster: RayCluster) -> RayNode:
    """The cluster's GPU node, added if none is alive (an earlier test killed it, or ran alone)."""
    alive = cluster.alive()
    gpu_node = next((node for node in cluster.nodes if node.num_gpus > 0 and alive.get(node.node_id)), None)
    if gpu_node is None:
        gpu_node = cluster.add_node(num_gpus=1)
        cluster.wait_alive(gpu_node)
    return gpu_node


def three_ends_spec(cluster: RayCluster, name: str) -> dict:
    """Trials run one after another on the one GPU: 0 completes, 1 crashes short of its budget and fails (no run
    again), 2 reports its step 1 (checkpointed) and trains on for an hour."""
    configs = [{"rate": 0.5, "sleep": 0.01, "crash": crash, "crash_step": 2, "hang_after": hang_after}
               for crash, hang_after in (("none", -1), ("raise", -1), ("none", 1))]
    return {
        "name": name,
        "trial": {"function": "trials.curve:train", "workdir": str(ROOT / "tests"), "max_failures": 0},
        "search": {"sampler": "list", "configs": configs},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 4},
        "policy": {"name": "fifo"},
        "engine": "ray",
        "ray": {"address": cluster.address},
        "storage": {"dir": "runs", "checkpoint_every": 1},
    }


def run_in_thread(session: ExperimentSession) -> threading.Thread:
    runner = threading.Thread(target=session.run, daemon=True)
    runner.start()
    return runner


def test_the_gpus_asked_for_are_those_of_trials_that_may_still_run(cluster: RayCluster, tmp_path: Path) -> None:
    """Trial 0 completed and trial 1 failed, short of its budget, when the GPU node goes (the autoscaler removed it, a
    spot node was reclaimed) while trial 2 runs there: Hermes asked for a GPU for trial 1 too. Cancelled, and rerun
    with a larger budget, which runs trial 2 again: the rerun is given every trial of the log, and asked for a GPU
    for each, finished or not (a rerun of a 200-trial search with 190 done asked for 200). Its GPU node dies."""
    gpu_node = alive_gpu_node(cluster)
    spec = three_ends_spec(cluster, "asks")
    reported = threading.Event()

    def on_trial_2_report(event: Event, _decisions: list[Decision]) -> None:
        if isinstance(event, TrialReported) and event.trial_id == "2":
            reported.set()

    first = ExperimentSession(parse_spec(spec, base_dir=tmp_path), listeners=[on_trial_2_report])
    runner = run_in_thread(first)
    try:
        assert reported.wait(60)
        trials = first.scheduler.trials
        assert (trials["0"].state, trials["1"].state) == (TrialState.COMPLETED, TrialState.FAILED)
        cluster.kill_node(gpu_node)
        wait_for(requested_bundles, 30, "a request of GPUs")
        assert requested_bundles() == [{"GPU": 1}]  # for trial 2 alone
    finally:
        first.cancel("enough")
        runner.join(60)
    assert first.store.experiment(first.experiment_id).status is ExperimentStatus.CANCELLED
    assert requested_bundles() == []

    spec["search"]["max_time"] = 3600
    rerun = ExperimentSession(parse_spec(spec, base_dir=tmp_path))
    runner = run_in_thread(rerun)
    try:
        wait_for(requested_bundles, 30, "a request of GPUs")
        assert requested_bundles() == [{"GPU": 1}]  # for trial 2 alone, which the larger budget runs again
    finally:
        rerun.cancel("enough")
        runner.join(60)
    assert len(rerun.scheduler.trials) == 3  # the log's: none new
    assert requested_bundles() == []
    first.store.close()
    rerun.store.close()


def test_a_pool_asks_for_the_gpus_of_trials_that_may_still_run(cluster: RayCluster, tmp_path: Path) -> None:
    """The same in the server's pool, whose loop is its own: as the GPU node goes, and in a pool started again
    (after a crash, a restart), which is given every trial of the experiments it continues. Its GPU node dies."""
    gpu_node = alive_gpu_node(cluster)
    spec = three_ends_spec(cluster, "pooled")
    del spec["engine"], spec["ray"]  # the pool's
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment = submit(store, stored_form(parse_spec(spec, base_dir=tmp_path)))
    with running(PoolSession(store, tmp_path, engine="ray", ray_address=cluster.address, poll=0.1)):
        wait_for(lambda: store.metrics(experiment, "2"), 60, "a report of trial 2")
        assert [trial.state for trial in store.trials(experiment)][:2] == [TrialState.COMPLETED, TrialState.FAILED]
        cluster.kill_node(gpu_node)
        wait_for(requested_bundles, 30, "a request of GPUs")
        assert requested_bundles() == [{"GPU": 1}]  # for trial 2 alone
    assert requested_bundles() == []
    with running(PoolSession(store, tmp_path, engine="ray", ray_address=cluster.address, poll=0.1)):
        wait_for(requested_bundles, 30, "a request of GPUs")
        assert requested_bundles() == [{"GPU": 1}]
    assert store.experiment(experiment).status is ExperimentStatus.INTERRUPTED
    store.close()
