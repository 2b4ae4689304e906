"""Checkpoints on a storage URI (hermes/ray/storage.py), with file:// URIs and a plain path standing
for a shared mount: what one node uploads another downloads and restores unchanged, and an upload
that breaks off leaves the previous checkpoint published."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hermes.errors import HermesError
from hermes.ray.storage import (
    EXPERIMENT_MARK,
    CheckpointStore,
    checked_store,
    experiment_uri,
)
from hermes.trial import Files, protocol
from hermes.trial.session import Session, bind


def _trial_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / protocol.CONFIG_FILE).write_text(json.dumps({"lr": 0.1}))
    return path


def _session(trial_dir: Path) -> Session:
    return Session("t1", trial_dir, channel=None, budget=10, metric=None, checkpoint_every=0)  # type: ignore[arg-type]


def _checkpoint(trial_dir: Path, step: int, payload: bytes) -> None:
    """Commit a checkpoint of ``step`` through the trial API's own code (Session.save)."""

    def save(directory: Path) -> None:
        (directory / "nested").mkdir()
        (directory / "nested" / "weights.bin").write_bytes(payload)
        (directory / "notes.txt").write_text(f"step {step}")

    session = _session(trial_dir)
    bind(session)
    try:
        Files(save, lambda directory: None)
        session.save(step, {"accuracy": step / 10})
    finally:
        bind(None)


def _restore(trial_dir: Path) -> tuple[int, bytes]:
    """What a trial resuming in ``trial_dir`` restores: its step and its payload."""
    loaded: list[bytes] = []
    session = _session(trial_dir)
    bind(session)
    try:
        saver = Files(lambda _: None, lambda directory: loaded.append((directory / "nested" / "weights.bin").read_bytes()))
        step = saver.restore()
    finally:
        bind(None)
    return step, loaded[0]


@pytest.fixture(params=["file", "path"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """The same store through a file:// URI and through a plain path (a shared mount)."""
    root = tmp_path / "bucket" / "exp1"
    return CheckpointStore(f"file://{root}" if request.param == "file" else str(root))


def test_what_one_node_uploads_another_restores(store: CheckpointStore, tmp_path: Path) -> None:
    source = _trial_dir(tmp_path / "node-a" / "t1")
    payload = bytes(range(256)) * 4096
    _checkpoint(source, 3, payload)
    assert store.upload_latest("t1", source) == 3
    name, step = store.latest("t1")  # type: ignore[misc]
    assert step == 3 and name.startswith("step-3-")

    destination = _trial_dir(tmp_path / "node-b" / "t1")
    assert store.download("t1", destination) == 3
    assert _restore(destination) == (3, payload)
    checkpoint, _ = protocol.latest_checkpoint(destination)  # type: ignore[misc]
    assert json.loads((checkpoint / protocol.META_FILE).read_text()) == {"step": 3, "metrics": {"accuracy": 0.3},
                                                                            "parts": ["files"]}


def test_a_newer_upload_replaces_the_older(store: CheckpointStore, tmp_path: Path) -> None:
    source = _trial_dir(tmp_path / "a" / "t1")
    destination = _trial_dir(tmp_path / "b" / "t1")
    _checkpoint(source, 2, b"two")
    store.upload_latest("t1", source)
    store.download("t1", destination)
    _checkpoint(source, 5, b"five")
    store.upload_latest("t1", source)
    assert store.download("t1", destination) == 5
    assert _restore(destination) == (5, b"five")
    assert sorted(p.name for p in (destination / protocol.CHECKPOINTS_DIR).iterdir()) == ["latest", "step-5"]
    remote = sorted(Path(p).name for p in store.fs.ls(f"{store.root}/t1", detail=False))
    assert len(remote) == 2 and remote[0] == "latest" and remote[1].startswith("step-5-")


def test_nothing_uploaded_means_a_fresh_start(store: CheckpointStore, tmp_path: Path) -> None:
    empty = _trial_dir(tmp_path / "a" / "t1")
    assert store.upload_latest("t1", empty) is None
    assert store.latest("t1") is None
    assert store.download("t1", _trial_dir(tmp_path / "b" / "t1")) is None


def test_an_upload_broken_off_leaves_the_previous_checkpoint(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _trial_dir(tmp_path / "a" / "t1")
    _checkpoint(source, 2, b"two")
    store.upload_latest("t1", source)
    _checkpoint(source, 4, b"four")

    put: Callable[..., None] = store.fs.put

    def put_one_then_fail(lpaths: list[str], rpaths: list[str]) -> None:
        put(lpaths[:1], rpaths[:1])
        raise OSError("connection reset")  # the node dies mid-upload

    monkeypatch.setattr(store.fs, "put", put_one_then_fail)
    with pytest.raises(OSError):
        store.upload_latest("t1", source)
    monkeypatch.undo()
    assert store.latest("t1")[1] == 2  # type: ignore[index]
    destination = _trial_dir(tmp_path / "b" / "t1")
    assert store.download("t1", destination) == 2 and _restore(destination) == (2, b"two")

    _checkpoint(source, 5, b"five")
    assert store.upload_latest("t1", source) == 5
    remote = sorted(Path(p).name for p in store.fs.ls(f"{store.root}/t1", detail=False))
    assert len(remote) == 2 and remote[1].startswith("step-5-")  # the torn upload is gone too


def test_delete_forgets_a_trial(store: CheckpointStore, tmp_path: Path) -> None:
    source = _trial_dir(tmp_path / "a" / "t1")
    _checkpoint(source, 1, b"one")
    store.upload_latest("t1", source)
    store.delete("t1")
    assert store.latest("t1") is None
    store.delete("t1")  # nothing left: no error


def test_each_experiment_of_a_name_has_a_folder_of_its_own_and_older_ones_keep_theirs(tmp_path: Path) -> None:
    """Under ``<storage.uri>/<name>``: a folder named after the experiment's creation in its store, the same at every
    rerun; an experiment continued without one was made before such folders and keeps its checkpoints where they
    are (``<storage.uri>/<name>/<trial>``), so that its rerun finds them."""
    uri = str(tmp_path / "shared" / "digits")
    ann = experiment_uri(uri, 1796000000.25, continued=False)
    assert ann == f"{uri}/20261130T005320.250000Z" and (Path(ann) / EXPERIMENT_MARK).is_file()
    assert experiment_uri(uri, 1796000000.25, continued=True) == ann  # a rerun, or one after the head restarted
    assert experiment_uri(f"file://{uri}", 1796000000.25, continued=True) == f"file://{ann}"
    bob = experiment_uri(uri, 1796000001.5, continued=False)
    assert bob != ann
    older = experiment_uri(uri, 1795000000.0, continued=True)  # its store has events, and no folder was made
    assert older == uri and not (Path(uri) / "20261118T110640.000000Z").exists()


def test_a_file_uri_with_a_host_cannot_be_opened() -> None:
    """``file://mnt/x`` names the host ``mnt`` (a pool's --storage-uri too): its path alone, /x, was used."""
    with pytest.raises(HermesError, match=r"^setting: 'file://mnt/x' cannot be opened: a file URI has no host; did "
                                          r"you mean file:///mnt/x\?$"):
        checked_store("file://mnt/x", "setting")


def test_the_storage_does_not_need_ray() -> None:
    """Ray is imported only where the Ray engine runs; checkpoint storage is fsspec alone."""
    code = "import sys, hermes.ray.storage; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_the_core_the_local_engine_and_the_simulator_never_import_ray() -> None:
    modules = "hermes.session, hermes.cli, hermes.core.scheduler, hermes.local, hermes.sim, hermes.execution.registry"
    code = f"import sys, {modules}; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
