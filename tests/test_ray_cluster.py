"""A real multi-node Ray cluster on this machine (hermes/testing/ray_cluster.py): nodes with fake GPUs,
a node joining mid-run, a node's raylet killed and seen dead within seconds, and nothing left behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from hermes.testing.ray_cluster import RayCluster  # noqa: E402

DETECTION_BOUND_S = 10.0  # measured 1.0-1.5 s with the cluster's health-check settings


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    cluster = RayCluster(workers=2, gpus_per_node=2)
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


def _session(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[3])
