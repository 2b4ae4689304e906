"""What it costs to carry a trial's state between two Ray nodes: a migration's transfer.

    python bench/ray_transfer.py [--megabytes 10,100] [--repeats 5]

Starts a real three-node Ray cluster on this machine (hermes/testing/ray_cluster.py) and two actors
pinned to different worker nodes, each holding a dict of NumPy arrays. The source hands its state
to the destination, which copies it into memory of its own (as a restore into a model would):

- ``object store, caller-owned``: the source *returns* the state from a method call; the return
  value is owned by the caller (the driver), so it survives the source actor's exit, and is
  passed by reference to the destination, whose raylet pulls it from the source node.
- ``object store, source-owned``: the source ``ray.put``s the state itself and hands over the
  reference: the same transfer, but the object dies with the source actor (OwnerDiedError), so a
  suspended trial's actor could not exit until the destination has fetched it.
- ``storage (file://)``: the source commits a checkpoint through the trial API's own code
  (Session.save: files fsync'ed, pointer) and uploads it with CheckpointStore; the destination
  downloads and loads it. Durable: survives the loss of both nodes.

Each figure is the median wall time from the driver's request to the destination's answer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes.testing.ray_cluster import RayCluster  # noqa: E402

ARRAYS = 8  # the state is this many float32 arrays of equal size, like a model's layers


class Trial:
    """A trial's side of a migration: it holds state, hands it over or takes it in."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.state: dict[str, Any] = {}

    def make(self, megabytes: int) -> float:
        import numpy

        count = megabytes * 2**20 // 4 // ARRAYS
        rng = numpy.random.default_rng(megabytes)
        self.state = {f"layer{i}": rng.standard_normal(count, dtype=numpy.float32) for i in range(ARRAYS)}
        return _checksum(self.state)

    def hand_over(self) -> dict[str, Any]:
        return self.state  # a return value: stored in this node's object store, owned by the caller

    def put_own(self) -> list[Any]:
        import ray

        return [ray.put(self.state)]  # owned by this actor; a list, so Ray passes the reference itself

    def take(self, state: dict[str, Any]) -> float:
        import numpy

        self.state = {key: numpy.array(value) for key, value in state.items()}  # out of the read-only store
        return _checksum(self.state)

    def take_reference(self, references: list[Any]) -> float:
        import ray

        return self.take(ray.get(references[0]))

    def spill(self, uri: str, trial_id: str, step: int) -> None:
        """Commit a checkpoint as a trial does and upload it."""
        import numpy

        from hermes.ray.storage import CheckpointStore
        from hermes.trial import Files
        from hermes.trial.session import Session, bind

        trial_dir = self.directory / trial_id
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "config.json").write_text("{}")
        channel: Any = None  # nothing is reported: the session only commits the checkpoint
        session = Session(trial_id, trial_dir, channel, budget=step, metric=None, checkpoint_every=0)
        bind(session)
        try:
            Files(lambda directory: numpy.savez(directory / "state.npz", **self.state), lambda directory: None)
            session.save(step)
        finally:
            bind(None)
        CheckpointStore(uri).upload_latest(trial_id, trial_dir)

    def unspill(self, uri: str, trial_id: str) -> float:
        """Download the newest checkpoint and load it, as a trial resuming on this node does."""
        import numpy

        from hermes.ray.storage import CheckpointStore
        from hermes.trial import protocol

        trial_dir = self.directory / trial_id
        CheckpointStore(uri).download(trial_id, trial_dir)
        checkpoint, _ = protocol.latest_checkpoint(trial_dir)  # type: ignore[misc]
        with numpy.load(checkpoint / "files" / "state.npz") as archive:
            self.state = {key: archive[key] for key in archive.files}
        return _checksum(self.state)


def _checksum(state: dict[str, Any]) -> float:
    return float(sum(value[::4096].sum() for value in state.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", default="10,100", help="sizes of state to carry, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(size) for size in args.megabytes.split(",")]

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    scratch = Path(tempfile.mkdtemp(prefix="hr-bench-", dir="/tmp"))
    # The nodes' workers import hermes and this module from this checkout, as the driver does.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    object_store = max(3 * max(sizes), 100) * 2**20
    with RayCluster(workers=2, gpus_per_node=1, object_store_bytes=object_store, env_overrides={"PYTHONPATH": pythonpath}) as cluster:
        cluster.connect()
        actor = ray.remote(num_cpus=0, num_gpus=1)(Trial)
        source, destination = (
            actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(
                str(scratch / node.name)
            )
            for node in cluster.nodes[1:3]
        )
        uri = f"file://{scratch / 'storage'}"
        print(f"{len(cluster.nodes)} nodes; source on {cluster.nodes[1].name}, destination on {cluster.nodes[2].name}")
        peak = 0
        print(f"{'method':<30} {'MB':>5} {'median s':>9} {'min s':>7} {'MB/s':>7}")
        for megabytes in sizes:
            expected = ray.get(source.make.remote(megabytes))

            def caller_owned() -> float:
                return ray.get(destination.take.remote(source.hand_over.remote()))

            def source_owned() -> float:
                return ray.get(destination.take_reference.remote(ray.get(source.put_own.remote())))

            def through_storage() -> float:
                ray.get(source.spill.remote(uri, "t1", 1))
                return ray.get(destination.unspill.remote(uri, "t1"))

            methods = {
                "object store, caller-owned": caller_owned,
                "object store, source-owned": source_owned,
                "storage (file://)": through_storage,
            }
            for method, transfer in methods.items():
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    checksum = transfer()
                    times.append(time.perf_counter() - started)
                    assert checksum == expected, (method, checksum, expected)
                median = statistics.median(times)
                print(f"{method:<30} {megabytes:>5} {median:>9.3f} {min(times):>7.3f} {megabytes / median:>7.0f}")
                peak = max(peak, cluster.memory())
        print(f"cluster memory (PSS, driver excluded), highest after a method: {peak / 2**20:.0f} MiB")
        left = cluster.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    assert not left, f"processes left: {left}"


if __name__ == "__main__":
    main()
