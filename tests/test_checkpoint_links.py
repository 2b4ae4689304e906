"""Symbolic links in a checkpoint moved through a storage URI (hermes/ray/storage.py) come back as links, as a
checkpoint kept on one machine does: a saver's copy of a Hugging Face snapshot (``copytree(symlinks=True)``), whose
links point at its blobs, or nowhere. No Ray: the store's upload and download, through the trial API's own saving."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hermes.ray.storage import LINKS_FILE, CheckpointStore
from hermes.trial import Files, protocol
from hermes.trial.session import Session, bind


@pytest.fixture(params=["file", "path", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """A file:// URI, a plain path (a shared mount), and an in-memory store standing for an object store."""
    root = tmp_path / "bucket" / "exp1"
    return CheckpointStore({"file": f"file://{root}", "path": str(root), "memory": f"memory://{root}"}[request.param])


def _save(trial_dir: Path, step: int, save: Callable[[Path], object]) -> None:
    """Commit a checkpoint of ``step`` through Session.save, with one saver."""
    trial_dir.mkdir(parents=True)
    (trial_dir / protocol.CONFIG_FILE).write_text("{}")
    session = Session("t1", trial_dir, channel=None, budget=10, metric=None, checkpoint_every=0)  # type: ignore[arg-type]
    bind(session)
    try:
        Files(save, lambda directory: None)
        session.save(step)
    finally:
        bind(None)


def test_links_in_a_checkpoint_come_back_as_links(store: CheckpointStore, tmp_path: Path) -> None:
    """Before, the links to files inside came back as copies, and a dangling link or one to a directory not at all."""
    outside = tmp_path / "dataset.bin"
    outside.write_bytes(b"outside")

    def save(directory: Path) -> None:
        (directory / "blobs").mkdir()
        (directory / "blobs" / "abc").write_bytes(b"weights")
        (directory / "snapshot").mkdir()
        (directory / "snapshot" / "model.bin").symlink_to("../blobs/abc")
        (directory / "snapshot" / "gone.bin").symlink_to("../blobs/never-fetched")
        (directory / "current").symlink_to("snapshot")
        (directory / "data.bin").symlink_to(outside)  # outside the checkpoint: the node resuming may lack it

    source, destination = tmp_path / "node-a" / "t1", tmp_path / "node-b" / "t1"
    _save(source, 4, save)
    assert store.upload_latest("t1", source) == 4
    assert store.download("t1", destination) == 4
    checkpoint, _ = protocol.latest_checkpoint(destination)  # type: ignore[misc]
    part = checkpoint / "files"
    links = {path.relative_to(part).as_posix(): os.readlink(path) for path in part.rglob("*") if path.is_symlink()}
    assert links == {"snapshot/model.bin": "../blobs/abc", "snapshot/gone.bin": "../blobs/never-fetched",
                     "current": "snapshot"}
    assert (part / "current" / "model.bin").read_bytes() == b"weights"
    assert not (part / "data.bin").is_symlink() and (part / "data.bin").read_bytes() == b"outside"
    assert not (checkpoint / LINKS_FILE).exists()


def test_a_checkpoint_without_links_uploads_no_list_of_them(store: CheckpointStore, tmp_path: Path) -> None:
    _save(tmp_path / "a" / "t1", 2, lambda directory: (directory / "w.bin").write_bytes(b"w"))
    store.upload_latest("t1", tmp_path / "a" / "t1")
    name, _ = store.latest("t1")  # type: ignore[misc]
    assert not store.fs.exists(f"{store.root}/t1/{name}/{LINKS_FILE}")


def test_a_trial_handed_between_live_ray_nodes_keeps_its_links(tmp_path: Path) -> None:
    """Between live nodes a checkpoint travels in Ray's object store (``NodeAgent._state``, ``write_state``), not
    through the storage URI: its links arrived as copies, and its dangling links not at all."""
    from hermes.ray.agent import NodeAgent, write_state

    agent = NodeAgent("left", str(tmp_path / "left"), "score", 0, str(tmp_path / "durable"), cpu_slots=1)
    try:
        left = agent.local.directory / "trials" / "a" / "checkpoints"
        files = {"hermes.json": b'{"step": 3}', "weights.bin": b"w", "snapshot/config.json": b"{}"}
        write_state({"step": 3, "files": files,
                     "links": {"latest.bin": "weights.bin", "snapshot/model.bin": "../blobs/gone"}}, left)
        state = agent._state("a")
    finally:
        agent.close()
    assert state is not None and state["links"] == {"latest.bin": "weights.bin", "snapshot/model.bin": "../blobs/gone"}
    assert set(state["files"]) == {"hermes.json", "weights.bin", "snapshot/config.json"}
    arrived = tmp_path / "right" / "checkpoints"
    write_state(state, arrived)
    final = arrived / "step-3"
    assert os.readlink(final / "latest.bin") == "weights.bin" and (final / "latest.bin").read_bytes() == b"w"
    assert os.readlink(final / "snapshot" / "model.bin") == "../blobs/gone"
