"""The executor conformance suite on the Ray executor, on a real Ray cluster: a head and one worker
node with two (fake) GPUs, shared by the module; trials are tests/trials/curve.py in warm workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from hermes.local.launch import TrialLaunch  # noqa: E402
from hermes.ray.executor import RayExecutor, node_name  # noqa: E402
from hermes.testing.executor_conformance import *  # noqa: E402,F401,F403
from hermes.testing.executor_conformance import ExecutorHarness  # noqa: E402
from hermes.testing.ray_cluster import RayCluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=1, gpus_per_node=2, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:
        cluster.connect()
        yield cluster
    assert not cluster.pids()


class RayHarness(ExecutorHarness):
    def __init__(self, cluster: RayCluster) -> None:
        node = node_name(cluster.nodes[1].node_id)
        self.gpus = (f"{node}/gpu0", f"{node}/gpu1")

    def executor(self, directory: Path) -> RayExecutor:
        return RayExecutor(directory, storage_uri=(directory / "durable").as_uri(), metric="score")

    def work(self, steps: int, *, rate: float = 0.5, seconds: float = 0.05, crash_at: int | None = None) -> TrialLaunch:
        config: dict[str, Any] = {"rate": rate, "sleep": seconds}
        if crash_at is not None:
            config |= {"crash": "raise", "crash_step": crash_at}
        return TrialLaunch(steps, function="tests.trials.curve:train", config=config, cwd=str(ROOT))

    def remove_gpu(self, executor: Any, gpu: str) -> None:
        executor.remove_gpu(gpu)


@pytest.fixture
def harness(cluster: RayCluster) -> ExecutorHarness:
    return RayHarness(cluster)
