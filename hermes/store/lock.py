"""What a runner holds in its storage directory: the lock that makes it the only runner there,
and a little disk space kept in reserve.

One runner per storage directory: an exclusive lock on ``hermes.lock`` next to ``hermes.db``.

The lock is ``flock(2)`` on an open file: the kernel releases it when its holder ends, however it
ends (``kill -9`` included), so a stale lock file never blocks the next run. The file holds the
holder's pid and command line, so that a refused runner can say who holds the directory, and
readers (``hermes status``) can tell a running experiment from one whose runner died.

One session per experiment folder too (``ExperimentLock``): ``<storage.dir>/<name>/hermes.lock``, where its trials
keep their files; a pool runs a spec from a store of its own, so the storage dir's lock did not keep it apart from a
``hermes run`` of the same spec.

The reserve, ``hermes.reserve``, is a file of RESERVE_BYTES that the runner deletes when the disk
is full, to make room for recording how the run ended.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from hermes.errors import NO_SPACE_ERRNOS, HermesError, NoSpaceError
from hermes.store.base import StoreError, StoreUnavailable

LOCK_FILE = "hermes.lock"
RESERVE_FILE = "hermes.reserve"
RESERVE_BYTES = 1 << 20  # a few SQLite pages and a WAL frame are what the last status needs
READER_RETRIES = 20  # tries 10 ms apart before a held lock counts as a runner's


class StorageInUse(StoreError):
    """Another runner holds the storage directory, or the experiment's folder."""


class RunnerLock:
    """Held from ``acquire`` until ``release`` (or the end of the process)."""

    def __init__(self, directory: str | Path, experiment: str = "") -> None:
        self.path = Path(directory) / LOCK_FILE
        self.who = {
            "pid": os.getpid(), "host": socket.gethostname(), "command": _command(), "experiment": experiment,
            "since": time.time(),
        }
        self._file: BinaryIO | None = None  # closed when collected, too: the lock never outlives its holder

    def acquire(self) -> RunnerLock:
        """Take the lock at once, or raise StorageInUse naming the process that holds it; StoreUnavailable (or
        NoSpaceError) where the storage dir cannot be written: another user's, or a read-only mount."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            file = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), "r+b", buffering=0)
        except OSError as error:
            raise self._cannot_write(error) from None
        try:
            _lock(file.fileno())
            file.truncate(0)
            file.write(json.dumps(self.who).encode())
        except BlockingIOError:
            file.close()
            raise StorageInUse(self._in_use(holder(self.path))) from None
        except OSError as error:  # a full disk, say: its holder cannot be named
            file.close()
            raise self._cannot_write(error) from None
        except BaseException:  # a Ctrl-C between taking the lock and naming its holder too: else it stays held
            file.close()
            raise
        self._file = file
        return self

    def _cannot_write(self, error: OSError) -> HermesError:
        """Why the runner cannot write its lock, in one line: a full disk as a full disk is said everywhere, else the
        storage dir and the reason (permission denied, read-only file system), before anything was written."""
        if error.errno in NO_SPACE_ERRNOS:
            return NoSpaceError(f"{self.path}: {error.strerror}")
        reason = (error.strerror or str(error)).lower() + (f": {error.filename}" if error.filename else "")
        return StoreUnavailable(f"{self._folder} {self.path.parent} cannot be written ({reason}); {self._writable}")

    _folder = "the storage dir"
    _writable = "give storage.dir a folder this user can write"

    def _in_use(self, who: dict[str, Any] | None) -> str:
        return (f"{self.path.parent} is in use by another runner, {describe(who)}; "
                "one runner per storage directory: wait for it to end, stop it, or use another storage.dir")

    def note_clock(self, at: float) -> None:
        """Say that the experiment's clock reads ``at`` now, so that a report can tell its time while it runs
        (``clock_now``), between the events that carry it. Written in one piece, longer than what it replaces."""
        if self._file is not None:
            self._note(self.who | {"clock": [time.time(), at]})

    def _note(self, who: dict[str, Any]) -> None:
        """Write ``who`` in one piece over what the file held."""
        assert self._file is not None
        data = json.dumps(who).encode()
        os.pwrite(self._file.fileno(), data, 0)
        self._file.truncate(len(data))

    @property
    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is not None:
            self._file.truncate(0)  # no holder any more; the file stays, so that no racer locks a deleted one
            self._file.close()  # which releases the lock
            self._file = None

    def __enter__(self) -> RunnerLock:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


class PoolLock(RunnerLock):
    """A pool's hold on its folder (``<directory>/pool``): one pool per folder. Refused, it names the folder's
    option, not storage.dir: a pool has none, and runs no one experiment."""

    _folder = "the pool's folder"
    _writable = ("give the pool a folder this user can write (`hermes server --root`, `python -m hermes.pool "
                 "--dir`)")

    def _in_use(self, who: dict[str, Any] | None) -> str:
        return (f"{self.path.parent} is in use by another pool, {describe(who)}; one pool per folder: stop it, or "
                "give this one another folder (`hermes server --root`, `python -m hermes.pool --dir`)")


class ExperimentLock(RunnerLock):
    """One session per experiment folder, ``hermes run``'s or a pool's, from ``acquire`` until ``release``.

    Within one process, a later session of the folder takes the lock over from an earlier one that is no longer
    ``live``: the sessions of a pool that stopped live on until collected (a server starts its pool again after an
    error, in the same process), and would have failed every experiment the new pool took up. A live one keeps it:
    two experiments of one pool whose folders coincide (a user's link from one name's folder to another's, say), or
    a pool's and a ``hermes.run`` of one process, wrote each other's trial folders. ``live``: whether the session
    that holds the lock still runs; a lock without it is taken over."""

    def __init__(self, directory: str | Path, experiment: str = "", live: Callable[[], bool] | None = None) -> None:
        super().__init__(directory, experiment)
        self._live = live

    @property
    def live(self) -> bool:
        """Held by a session that still runs."""
        return self._file is not None and self._live is not None and self._live()

    def acquire(self) -> ExperimentLock:
        with _held_lock:
            known = _identity(self.path)
            earlier = _held_here.get(known) if known is not None else None
            if earlier is not None and earlier.live:
                raise StorageInUse(self._in_use_here(earlier.who))
            if earlier is not None and earlier._file is not None:
                self._file, earlier._file = earlier._file, None
                self._note(self.who)
            else:
                super().acquire()
            assert self._file is not None
            stat = os.fstat(self._file.fileno())
            _held_here[stat.st_dev, stat.st_ino] = self
        return self

    def release(self) -> None:
        with _held_lock:
            super().release()

    def _in_use(self, who: dict[str, Any] | None) -> str:
        return (f"the experiment folder {self.path.parent} is in use by another runner, {describe(who)}: its trials "
                "keep their files there; one runner per experiment folder: wait for it to end, stop it, or give the "
                "experiment another name or storage.dir")

    def _in_use_here(self, who: dict[str, Any]) -> str:
        return (f"the experiment folder {self.path.parent} is in use by experiment {who['experiment']!r}, which this "
                f"process (pid {who['pid']}) runs too: its trials keep their files there; one experiment per folder: "
                "give this one another name or storage.dir, or run it once that one has ended")


_held_here: weakref.WeakValueDictionary[tuple[int, int], ExperimentLock] = weakref.WeakValueDictionary()
_held_lock = threading.Lock()  # guards _held_here, and a takeover against the release of what it takes over


def _identity(path: Path) -> tuple[int, int] | None:
    """The lock file's device and inode, the same by whichever path its folder is reached; None where there is none
    yet."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class SpaceReserve:
    """Disk space set aside while a runner runs, given back when the disk is full (``release``)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / RESERVE_FILE

    def acquire(self) -> None:
        """Take the space; on a disk that has not even that much left, go without."""
        try:
            with open(self.path, "wb") as file:
                os.posix_fallocate(file.fileno(), 0, RESERVE_BYTES)
        except OSError:
            self.release()

    def release(self) -> None:
        """Give the space back. A reserve that cannot be deleted (a storage dir made read-only or immutable
        meanwhile) is left with a warning: the experiment has run, and losing its outcome to this would be
        worse than leaving 1 MiB behind."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as error:
            print(f"hermes: warning: cannot delete the space reserve {self.path} ({error.strerror or error}); "
                  "delete it by hand", file=sys.stderr, flush=True)


def clock_now(who: dict[str, Any]) -> float | None:
    """The time on the experiment's clock now, by what its runner (``holder``) noted; None where it noted none."""
    clock = who.get("clock")
    if not (isinstance(clock, list) and len(clock) == 2 and all(isinstance(x, (int, float)) for x in clock)):
        return None
    wall, at = clock
    return at + max(0.0, time.time() - wall)


def holder(path: str | Path) -> dict[str, Any] | None:
    """Who holds the lock file at ``path`` now, or None when nobody does (never taken, or its holder
    ended). Opens the file read-only and writes nothing, so a report may ask."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: by a runner
            data = os.pread(fd, 1 << 16, 0)
            try:
                return dict(json.loads(data))
            except (ValueError, TypeError):  # it is between taking the lock and writing its name
                return {}
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken


def _lock(fd: int) -> None:
    """LOCK_EX, or BlockingIOError; a reader (``holder``) holds the lock for microseconds, so wait that out."""
    for _ in range(READER_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.01)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def describe(who: dict[str, Any] | None) -> str:
    if not who:
        return "a process that is starting"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who.get("since", 0)))
    experiment = f" running experiment {who['experiment']!r}" if who.get("experiment") else ""
    return f"pid {who.get('pid')} on {who.get('host')}{experiment} (`{who.get('command')}`, since {since})"


def _command() -> str:
    """This process's command line as typed, e.g. ``hermes run spec.yaml``."""
    try:
        words = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        return " ".join(word.decode(errors="replace") for word in words)
    except OSError:
        return " ".join([sys.executable, *sys.argv])
