"""A real multi-node Ray cluster on this machine (hermes/testing/ray_cluster.py): nodes with fake GPUs,
a node joining mid-run, a node's raylet killed and seen dead within seconds, and nothing left behind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from hermes.testing.ray_cluster import RayCluster  # noqa: E402

DETECTION_BOUND_S = 10.0  # measured 1.0-1.5 s with the cluster's health-check settings


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    # The nodes' workers import hermes and bench from this checkout, as the driver does.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=2, gpus_per_node=2, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:
        cluster.connect()
        yield cluster


def test_nodes_are_alive_with_their_gpus(cluster: RayCluster) -> None:
    nodes = {node["NodeID"]: node for node in ray.nodes()}
    assert len(cluster.nodes) == 3
    for node in cluster.nodes:
        assert nodes[node.node_id]["Alive"]
        assert nodes[node.node_id]["Resources"].get("GPU", 0) == node.num_gpus
    assert ray.cluster_resources()["GPU"] == 4
    print(f"\ncluster memory (PSS): {cluster.memory() / 2**20:.0f} MiB for {len(cluster.nodes)} nodes")


def test_an_actor_on_a_fake_gpu_runs_on_its_node(cluster: RayCluster) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_gpus=1, num_cpus=0)
    class Probe:
        def where(self) -> tuple[str, list[int]]:
            return ray.get_runtime_context().get_node_id(), [int(i) for i in ray.get_gpu_ids()]

    target = cluster.nodes[2]
    probe = Probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target.node_id, soft=False)).remote()
    node_id, gpus = ray.get(probe.where.remote(), timeout=60)
    ray.kill(probe)
    assert node_id == target.node_id
    assert len(gpus) == 1 and 0 <= gpus[0] < target.num_gpus


def test_state_an_actor_returns_outlives_it(cluster: RayCluster) -> None:
    """Why a migrating trial's state is a return value (owned by the caller): the source actor exits
    once its trial is handed over, and a returned object stays readable. (An object the actor
    ``ray.put`` itself is owned by it and lost with it, as Ray's ownership model says; how soon a
    reader sees that after a kill varies, so it is not asserted here.)"""
    import numpy
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class Source:
        def returned(self) -> numpy.ndarray:
            return numpy.ones(2**18)  # 2 MiB: in the node's object store, not inlined in the reply

    pinned = NodeAffinitySchedulingStrategy(cluster.nodes[2].node_id, soft=False)
    source = Source.options(scheduling_strategy=pinned).remote()
    returned = source.returned.remote()
    ray.wait([returned], timeout=60)
    ray.kill(source)
    deadline = time.monotonic() + 60  # the kill is asynchronous: a call sent at once may still be answered
    while True:
        try:
            ray.get(source.returned.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            break  # the actor is gone
        assert time.monotonic() < deadline, "a killed actor still answers after 60 s"
        time.sleep(0.1)
    assert ray.get(returned, timeout=30).sum() == 2**18


def test_a_trial_state_moves_between_nodes(cluster: RayCluster, tmp_path: Path) -> None:
    """bench/ray_transfer.py's two ways, at a small size: through the object store, and through
    checkpoint storage (uploaded on one node, downloaded and loaded on another)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from bench.ray_transfer import Trial

    actor = ray.remote(num_cpus=0, num_gpus=1)(Trial)
    source, destination = (
        actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(
            str(tmp_path / node.name)
        )
        for node in cluster.nodes[1:3]
    )
    expected = ray.get(source.make.remote(1), timeout=60)
    assert ray.get(destination.take.remote(source.hand_over.remote()), timeout=60) == expected
    uri = f"file://{tmp_path / 'storage'}"
    ray.get(source.spill.remote(uri, "t1", 1), timeout=60)
    assert ray.get(destination.unspill.remote(uri, "t1"), timeout=60) == expected
    for handle in (source, destination):
        ray.kill(handle)


def test_a_node_joining_is_seen(cluster: RayCluster) -> None:
    started = time.monotonic()
    node = cluster.add_node(num_gpus=1)
    seen = cluster.wait_alive(node, timeout=30)
    print(f"\nnode joined: ray start + registration {seen - started:.2f} s")
    deadline = time.monotonic() + 10
    while ray.cluster_resources().get("GPU") != 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.cluster_resources()["GPU"] == 5


def test_a_killed_raylet_is_detected_dead_quickly(cluster: RayCluster) -> None:
    node = cluster.nodes[1]
    killed = cluster.kill_raylet(node)
    dead = cluster.wait_alive(node, alive=False, timeout=DETECTION_BOUND_S)
    print(f"\nraylet SIGKILL -> node dead in ray.nodes(): {dead - killed:.2f} s")
    assert dead - killed < DETECTION_BOUND_S
    assert all(cluster.alive()[other.node_id] for other in cluster.nodes if other is not node)
    # The node's other processes (agents, workers) see their raylet gone and exit by themselves.
    deadline = time.monotonic() + 10
    while any(_session(pid) == node.session for pid in cluster.pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_session(pid) == node.session for pid in cluster.pids())


def test_teardown_leaves_no_process(cluster: RayCluster) -> None:
    assert cluster.pids()
    assert cluster.stop() == set()
    assert not cluster.root.exists()
    assert os.environ.get("RAY_AUTH_TOKEN") != cluster.token  # the driver's environment is put back


def _session(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[3])
