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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hermes.core.decisions import Start, Stop
from hermes.core.events import Event, NodeAdded, TrialExited, TrialReported
from hermes.local.launch import TrialLaunch
from hermes.ray.executor import RayExecutor, node_name
from hermes.testing.ray_cluster import RayCluster, RayNode

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


def test_the_gpus_asked_for_are_those_of_trials_that_may_still_run(cluster: RayCluster, tmp_path: Path) -> None:
    """The GPU node goes (the autoscaler removed it, a spot node was reclaimed) while trial c runs there, after a
    completed and b was stopped: Hermes asked for a GPU per trial it was ever given, 3 for the one trial left to run.
    Last in this module: its GPU node dies."""
    alive = cluster.alive()
    gpu_node = next((node for node in cluster.nodes if node.num_gpus > 0 and alive.get(node.node_id)), None)
    if gpu_node is None:
        gpu_node = cluster.add_node(num_gpus=1)
        cluster.wait_alive(gpu_node)
    executor = RayExecutor(tmp_path / "run", storage_uri=str(tmp_path / "ckpt"), metric="score", period=0.2)
    try:
        executor.submit("a", trial(0.1))
        executor.submit("b", trial(0.2))
        executor.submit("c", TrialLaunch(1000, function="tests.trials.curve:train", config={"sleep": 0.05},
                                         cwd=str(ROOT)))
        [added] = [e for e in events_until(executor, lambda events: any(isinstance(e, NodeAdded) for e in events))
                   if isinstance(e, NodeAdded)]
        executor.apply(Start("a", added.gpus[0]), executor.now())
        [exited] = [e for e in events_until(executor, lambda events: any(isinstance(e, TrialExited) for e in events),
                                            answer=True) if isinstance(e, TrialExited)]
        assert exited.succeeded, exited
        executor.apply(Stop("b"), executor.now())  # waiting: the core counts it stopped at once
        executor.apply(Start("c", added.gpus[0]), executor.now())
        events_until(executor, lambda events: any(isinstance(e, TrialReported) for e in events), answer=True)
        cluster.kill_node(gpu_node)
        events_until(executor, lambda _: bool(requested_bundles()), answer=True)
        assert requested_bundles() == [{"GPU": 1}]  # for c alone
    finally:
        executor.close()
    assert requested_bundles() == []
