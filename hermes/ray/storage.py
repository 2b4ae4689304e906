"""Durable checkpoints on a storage URI, so a trial can resume on any node of a Ray cluster.

A trial writes its checkpoints locally (``<trial_dir>/checkpoints/step-<n>/``, hermes/trial/session.py);
the node that runs it uploads each one to ``<uri>/<trial_id>/`` (``uri``: the experiment's own,
``experiment_uri``; a pool's trials go to ``<uri>/<TrialLaunch.durable>/``) and the node that resumes it downloads
the newest into its own trial directory, where ``Saver.restore`` reads it unchanged.
The URI is anything fsspec opens: ``file:///...`` or a plain path on a shared mount (NFS, a
ReadWriteMany volume), ``s3://bucket/prefix`` (s3fs), ``gs://bucket/prefix`` (gcsfs).

Publication is the local code's, adapted to object stores, which cannot rename a directory
atomically: a checkpoint is uploaded under a name never used before (``step-<n>-<random>``),
which no reader looks at, and only then published by replacing the pointer object ``latest``
(a single PUT on an object store, a rename on a file system). A crash or a lost node mid-upload
leaves the previous checkpoint published and intact. So a report counts as checkpointed only once
``upload`` has returned; the Ray engine must not say ``checkpointed=True`` before.

Symbolic links in a checkpoint (a saver's copy of a Hugging Face snapshot, made with ``copytree(symlinks=True)``)
come back as the links they were, as on one machine: an object store keeps no links, so they travel in an object of
the checkpoint's own (``LINKS_FILE``), made links again by ``download``. A link to a file outside the checkpoint
travels as that file, which the node that resumes it may not have.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import shutil
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hermes.errors import HermesError
from hermes.trial import protocol
from hermes.trial.session import _sync, _sync_tree, remove_checkpoints

EXPERIMENT_MARK = ".hermes-experiment"  # in an experiment's folder of a storage URI: made by this Hermes, not before
SHARED_MARK = ".hermes-run-"  # a driver's object for its nodes' agents to find (``mark_shared``)
LINKS_FILE = ".hermes-links.json"  # in an uploaded checkpoint: its symbolic links, path -> target


def experiment_uri(uri: str, created_at: float, continued: bool) -> str:
    """Where an experiment's durable checkpoints go under ``uri`` (``<storage.uri>/<name>``, or a pool's storage URI):
    a folder named after its creation time in its store (UTC), so that experiments of the same name (or a pool's of
    the same id) in other stores never touch each other's: one's start deleted the other's, and a rerun restored the
    other's state. The folder is marked as the experiment starts; an experiment ``continued`` (its store has events)
    without that mark was made before these folders, and keeps its checkpoints in ``uri`` itself."""
    stamp = datetime.fromtimestamp(created_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    store = CheckpointStore(f"{uri.rstrip('/')}/{stamp}")
    mark = f"{store.root}/{EXPERIMENT_MARK}"
    if store.fs.exists(mark):
        return store.uri
    if continued:
        return uri
    if store._local:
        store.fs.makedirs(store.root, exist_ok=True)
    store.fs.pipe_file(mark, f"created {stamp}\n".encode())
    return store.uri


def checked_store(uri: str, setting: str) -> CheckpointStore:
    """The checkpoint store at ``uri``, once an object was written, read back and deleted there; else a
    HermesError naming ``setting``. Unchecked, a missing filesystem package (``s3://`` without s3fs) failed on
    the nodes alone, where no one saw it, and a path that cannot be written lost every upload."""
    try:
        store = CheckpointStore(uri)
    except Exception as error:  # "Install s3fs to access S3", "Protocol not known: x", ConnectionRefusedError (ftp)
        raise HermesError(f"{setting}: {uri!r} cannot be opened: {str(error) or type(error).__name__}") from None
    try:
        store.probe()
    except Exception as error:  # whatever the filesystem raises: OSError, botocore's NoCredentialsError, ...
        raise HermesError(f"{setting}: cannot write checkpoints to {uri!r}: {type(error).__name__}: {error}"
                          ) from None
    return store


class CheckpointStore:
    """The checkpoints of every trial of an experiment, under one storage URI.

    One node at a time uploads or downloads a trial's checkpoints: the one running it, then the one
    resuming it (an upload deletes the checkpoint it replaces, which a concurrent download may be reading).
    """

    def __init__(self, uri: str, **storage_options: Any) -> None:
        import fsspec

        self.uri = uri
        if uri.startswith("file://"):  # fsspec takes its path as it is: ``file:///mnt/a%20b`` was ``a%20b``
            parsed = urllib.parse.urlparse(uri)
            if parsed.netloc not in ("", "localhost"):  # its path alone was used: file://mnt/x wrote to /x
                raise ValueError(f"a file URI has no host; did you mean file:///{uri[len('file://'):]}?")
            uri = urllib.parse.unquote(parsed.path)
        self.fs, self.root = fsspec.core.url_to_fs(uri, **storage_options)
        self.root = self.root.rstrip("/")
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol
        self._local = bool({"file", "local"} & set(protocols))  # a local disk or a shared mount

    def probe(self) -> None:
        """Write an object of its own under the root, read it back and delete it; raise whatever fails."""
        path = f"{self.root}/.hermes-probe-{secrets.token_hex(4)}"
        data = secrets.token_bytes(16)
        if self._local:
            self.fs.makedirs(self.root, exist_ok=True)
        self.fs.pipe_file(path, data)
        try:
            if self.fs.cat_file(path) != data:
                raise OSError(f"{path} read back other bytes than were written")
        finally:
            self.fs.rm(path)

    def mark_shared(self) -> str:
        """Write an object of this run's own under the root, for each node's agent to look for (``sees``); its
        name. A path that each node reads as a folder of its own (its local disk, not a shared mount) passed
        every node's own check, and a trial that resumed on another node started again from its beginning."""
        name = f"{SHARED_MARK}{secrets.token_hex(8)}"
        if self._local:
            self.fs.makedirs(self.root, exist_ok=True)
        self.fs.pipe_file(f"{self.root}/{name}", name.encode())
        return name

    def sees(self, name: str) -> bool:
        """Whether the object ``mark_shared`` wrote, by the name it gave, is here."""
        try:
            return self.fs.cat_file(f"{self.root}/{name}") == name.encode()
        except FileNotFoundError:
            return False

    def unmark_shared(self, name: str) -> None:
        """Delete what ``mark_shared`` wrote; gone already (the storage replaced, say) is fine."""
        try:
            self.fs.rm(f"{self.root}/{name}")
        except OSError:
            pass

    def upload(self, trial_id: str, checkpoint: Path) -> int:
        """Upload a committed local checkpoint (a ``step-<n>`` directory), publish it as the trial's
        newest and return its step; then delete the trial's older remote checkpoints."""
        step = int(json.loads((checkpoint / protocol.META_FILE).read_text())["step"])
        name = f"step-{step}-{secrets.token_hex(4)}"
        target = f"{self._trial(trial_id)}/{name}"
        files, links = checkpoint_contents(checkpoint)
        remote = [f"{target}/{path.relative_to(checkpoint).as_posix()}" for path in files]
        for parent in sorted({posixpath.dirname(path) for path in remote}):
            self.fs.makedirs(parent, exist_ok=True)
        self.fs.put([str(path) for path in files], remote)
        if links:
            self.fs.pipe_file(f"{target}/{LINKS_FILE}", json.dumps(links).encode())
        if self._local:
            _sync_tree(Path(target))
        self._publish(trial_id, name)
        self.fs.invalidate_cache(self._trial(trial_id))  # object stores' listings are cached (s3fs, gcsfs)
        for entry in self.fs.ls(self._trial(trial_id), detail=False):
            entry_name = posixpath.basename(entry.rstrip("/"))
            if entry_name.startswith(("step-", f"{protocol.LATEST_FILE}.tmp-")) and entry_name != name:
                self.fs.rm(entry, recursive=True)  # older ones, and what uploads that never completed left
        return step

    def upload_latest(self, trial_id: str, trial_dir: Path) -> int | None:
        """Upload the trial's newest committed local checkpoint; its step, or None when it has none."""
        latest = protocol.latest_checkpoint(trial_dir)
        return None if latest is None else self.upload(trial_id, latest[0])

    def latest(self, trial_id: str) -> tuple[str, int] | None:
        """The name and step of the trial's newest published checkpoint; None when it has none."""
        try:
            name = self.fs.cat_file(f"{self._trial(trial_id)}/{protocol.LATEST_FILE}").decode().strip()
            meta = json.loads(self.fs.cat_file(f"{self._trial(trial_id)}/{name}/{protocol.META_FILE}"))
        except FileNotFoundError:
            return None
        return name, int(meta["step"])

    def download(self, trial_id: str, trial_dir: Path) -> int | None:
        """Fetch the trial's newest published checkpoint into ``trial_dir`` and commit it there as the
        local code does (temporary name, rename, pointer), so ``Saver.restore`` finds it; return its
        step, or None when there is none (the trial starts fresh)."""
        latest = self.latest(trial_id)
        if latest is None:
            return None
        name, step = latest
        source = f"{self._trial(trial_id)}/{name}"
        root = trial_dir / protocol.CHECKPOINTS_DIR
        root.mkdir(parents=True, exist_ok=True)
        temporary = root / f".tmp-download-{step}"
        shutil.rmtree(temporary, ignore_errors=True)
        self.fs.invalidate_cache(source)
        remote = [path for path in self.fs.find(source) if not path.endswith("/")]
        local = [temporary / posixpath.relpath(path, source) for path in remote]
        for path in local:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.fs.get(remote, [str(path) for path in local])
        _make_links(temporary)
        _sync_tree(temporary)
        final = root / f"step-{step}"
        shutil.rmtree(final, ignore_errors=True)
        temporary.rename(final)
        pointer = root / f"{protocol.LATEST_FILE}.tmp"
        pointer.write_text(final.name)
        _sync(pointer)
        os.replace(pointer, root / protocol.LATEST_FILE)
        _sync(root)
        remove_checkpoints(root, keep=final)
        return step

    def delete(self, trial_id: str) -> None:
        """Remove every remote checkpoint of a trial (a ``Start`` runs it from scratch)."""
        if self.fs.exists(self._trial(trial_id)):
            self.fs.rm(self._trial(trial_id), recursive=True)

    def _trial(self, trial_id: str) -> str:
        return f"{self.root}/{trial_id}"

    def _publish(self, trial_id: str, name: str) -> None:
        """Point ``latest`` at ``name``: a rename on a file system, one whole-object PUT on an object
        store (readers see the old object or the new one, never a part)."""
        pointer = f"{self._trial(trial_id)}/{protocol.LATEST_FILE}"
        if not self._local:
            self.fs.pipe_file(pointer, name.encode())
            return
        temporary = Path(f"{pointer}.tmp-{secrets.token_hex(4)}")
        temporary.write_text(name)
        _sync(temporary)
        _sync(temporary.parent)
        os.replace(temporary, pointer)
        _sync(temporary.parent)


def checkpoint_contents(checkpoint: Path) -> tuple[list[Path], dict[str, str]]:
    """What an upload of ``checkpoint`` (or a hand-over between live nodes, ``hermes.ray.agent``) carries: its files, and its links (path -> target, as ``os.readlink`` says),
    but for a link to a file outside it, carried as that file."""
    files, links = [], {}
    inside = checkpoint.resolve()
    for path in sorted(checkpoint.rglob("*")):  # not into a linked directory
        if path.is_symlink() and not (path.is_file() and not path.resolve().is_relative_to(inside)):
            links[path.relative_to(checkpoint).as_posix()] = os.readlink(path)
        elif path.is_file():
            files.append(path)
    return files, links


def _make_links(checkpoint: Path) -> None:
    """Make the links a downloaded ``checkpoint`` lists in its ``LINKS_FILE`` (none: an upload without links)."""
    listed = checkpoint / LINKS_FILE
    if not listed.exists():
        return
    make_links(checkpoint, json.loads(listed.read_text()))
    listed.unlink()


def make_links(checkpoint: Path, links: dict[str, str]) -> None:
    """Make again the links ``checkpoint_contents`` found in a checkpoint (path -> target) in ``checkpoint``."""
    for name, target in links.items():
        link = checkpoint / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
