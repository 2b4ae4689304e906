"""A bad Ray node, on a real cluster (hermes/testing/ray_cluster.py; a head and one worker node with a fake GPU):
a node that lacks the trial's workdir, and one that joins mid-run without the storage.uri mount. Each bad node
sees an empty tmpfs at the hidden path, in a mount namespace of its own (``unshare -m``), as a host without that
shared volume mounted. The node there from the start hides a folder of the module's, in which each test that uses
it puts what the node must not see; the node that joins mid-run is killed when its test ends."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import Event, NodeAdded, TrialExited, TrialReported, TrialSuspended
from hermes.local.launch import TrialLaunch
from hermes.ray.executor import RayExecutor, node_name
from hermes.testing import ray_cluster
from hermes.testing.ray_cluster import RayCluster, RayNode

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a node with a path hidden needs unshare -m as root"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=1, gpus_per_node=1, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:
        cluster.connect()
        yield cluster
    assert not cluster.pids()


def add_bad_node(cluster: RayCluster, hidden: Path) -> RayNode:
    """Add a worker node that sees an empty tmpfs at ``hidden``."""
    popen = subprocess.Popen

    def unshared(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        mount = f"mount -t tmpfs none {shlex.quote(str(hidden))} && exec {shlex.join(command)}"
        return popen(["unshare", "-m", "--propagation", "private", "sh", "-c", mount], **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_cluster.subprocess, "Popen", unshared)
        return cluster.add_node()


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``bad_node`` sees empty."""
    return tmp_path_factory.mktemp("volume")


@pytest.fixture(scope="module")
def bad_node(cluster: RayCluster, hidden: Path) -> RayNode:
    """A worker node there from the start that sees an empty tmpfs at ``hidden``, shared by the module's tests (a node
    takes seconds to start): what it lacks is what a test puts under ``hidden``. The cluster's end ends it."""
    return add_bad_node(cluster, hidden)


@pytest.fixture
def joining_bad_node(cluster: RayCluster) -> Iterator[Callable[[Path], RayNode]]:
    """Adds a worker node that sees an empty tmpfs at the path it is given; killed at the end of the test."""
    added: list[RayNode] = []

    def add(hidden: Path) -> RayNode:
        added.append(add_bad_node(cluster, hidden))
        return added[-1]

    yield add
    for node in added:
        cluster.kill_node(node)
        cluster.wait_alive(node, alive=False)


def events_until(executor: RayExecutor, done: Callable[[Event], bool],
                 decide: Callable[[Event], list] = lambda event: []) -> list[Event]:
    """The executor's events until one satisfies ``done``, playing the core's part (``decide``, settled reports)."""
    seen: list[Event] = []
    deadline = time.monotonic() + 30
    while not seen or not done(seen[-1]):
        assert time.monotonic() < deadline, seen
        for event in executor.next_events():
            seen.append(event)
            for decision in decide(event):
                executor.apply(decision, executor.now())
            executor.settled(event)
            if done(event):
                break
    return seen


def curve(budget: int, cwd: Path) -> TrialLaunch:
    return TrialLaunch(budget, function="tests.trials.curve:train", config={"rate": 0.5, "sleep": 0.05},
                       cwd=str(cwd))


def test_a_node_without_the_trials_workdir_crashes_its_run_which_goes_on_elsewhere_from_its_checkpoint(
    cluster: RayCluster, bad_node: RayNode, hidden: Path, tmp_path: Path
) -> None:
    """Starting its warm worker there raised (no such folder): the trial failed for good, with the steps it had
    made, as if its spec were wrong; on one machine it is the spec's mistake, here the node's."""
    workdir = hidden / "workdir" / "code"  # on the bad node the volume is there, empty
    workdir.mkdir(parents=True)
    good = node_name(cluster.nodes[1].node_id)
    bad = node_name(bad_node.node_id)
    executor = RayExecutor(tmp_path / "run", storage_uri=(tmp_path / "durable").as_uri(), metric="score",
                           checkpoint_every=1)
    with executor:
        executor.next_events()  # the nodes
        executor.submit("a", curve(20, workdir))
        executor.apply(Start("a", f"{good}/gpu0"), executor.now())
        first = events_until(executor, lambda e: isinstance(e, TrialSuspended),
                             lambda e: [Suspend("a")] if isinstance(e, TrialReported) and e.step == 2 else [])
        suspended = first[-1].step
        assert 2 <= suspended < 20, first
        executor.apply(Resume("a", f"{bad}/gpu0", migrated=True), executor.now())
        crashed = events_until(executor, lambda e: isinstance(e, TrialExited))[-1]
        executor.apply(Resume("a", f"{good}/gpu0", migrated=True), executor.now())  # the core's run again
        again = events_until(executor, lambda e: isinstance(e, TrialExited))
    assert crashed.crashed and not crashed.succeeded, crashed
    assert crashed.error.startswith(f"Ray node {bad}: cannot start its warm worker: [Errno 2]"), crashed.error
    assert [e.step for e in again if isinstance(e, TrialReported)] == list(range(suspended + 1, 21))
    assert again[-1].succeeded


def test_a_node_joining_mid_run_without_storage_is_left_out_and_the_run_goes_on(
    cluster: RayCluster, joining_bad_node: Callable[[Path], RayNode], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its agent refused to start (storage.uri not shared with it), which ended the whole running experiment,
    recorded failed, and every rerun while that node was in the cluster."""
    durable = tmp_path / "durable"
    durable.mkdir()
    good = node_name(cluster.nodes[1].node_id)
    executor = RayExecutor(tmp_path / "run", storage_uri=durable.as_uri(), metric="score")
    with executor, caplog.at_level(logging.WARNING, logger="hermes.ray"):
        executor.next_events()  # the nodes
        executor.submit("a", curve(8, tmp_path))
        executor.apply(Start("a", f"{good}/gpu0"), executor.now())
        bad = node_name(joining_bad_node(durable).node_id)  # joins while the trial runs
        events = events_until(executor, lambda e: isinstance(e, TrialExited))
        deadline = time.monotonic() + 30
        while not any(f"Ray node {bad}" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "the node that joined was never told of"
            executor.next_events()
    assert events[-1].succeeded and [e.step for e in events if isinstance(e, TrialReported)] == list(range(1, 9))
    warnings = [record.getMessage() for record in caplog.records if f"Ray node {bad}" in record.getMessage()]
    expected = (f"Hermes could not start on Ray node {bad}: storage.uri {durable.as_uri()} is not shared with Ray node "
                f"{bad}: every node must see the same checkpoints (a shared file system or s3://...); it runs no "
                "trial, the run goes on on the other nodes")
    assert warnings == [expected], warnings


def test_a_node_there_at_the_start_without_storage_is_left_out_and_the_run_goes_on(
    cluster: RayCluster, bad_node: RayNode, hidden: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Left out when it joined mid-run, the same node stopped every run (a rerun, say) that began while it was in the
    cluster, though the others could run it."""
    durable = hidden / "durable"
    durable.mkdir()
    good = node_name(cluster.nodes[1].node_id)
    bad = node_name(bad_node.node_id)
    with caplog.at_level(logging.WARNING, logger="hermes.ray"):
        executor = RayExecutor(tmp_path / "run", storage_uri=durable.as_uri(), metric="score")
        with executor:
            joined = {event.node for event in executor.next_events() if isinstance(event, NodeAdded)}
            executor.submit("a", curve(4, tmp_path))
            executor.apply(Start("a", f"{good}/gpu0"), executor.now())
            events = events_until(executor, lambda e: isinstance(e, TrialExited))
    assert good in joined and bad not in joined, joined
    assert events[-1].succeeded and [e.step for e in events if isinstance(e, TrialReported)] == [1, 2, 3, 4]
    warnings = [record.getMessage() for record in caplog.records if f"Ray node {bad}" in record.getMessage()]
    assert warnings == [f"Hermes could not start on Ray node {bad}: storage.uri {durable.as_uri()} is not shared with "
                        f"Ray node {bad}: every node must see the same checkpoints (a shared file system or s3://...); "
                        "it runs no trial, the run goes on on the other nodes"], warnings
