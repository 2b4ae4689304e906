"""What the local engine asks of Linux: process groups that die with their parent, memory readings,
environments pinned to a slot. Linux only (prctl, /proc, sched_setaffinity)."""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import stat
import time
import uuid
from pathlib import Path
from typing import BinaryIO

OPEN_FILES_WANTED = 1 << 16  # as soft limit: far above what thousands of paused trials hold, not a million to scan

import hermes
from hermes.errors import HermesError
from hermes.local.guard import RUN_TAG, tagged
from hermes.local.resources import Slot
from hermes.trial import protocol

_PR_SET_PDEATHSIG = 1  # prctl option, from <linux/prctl.h>
_STDERR_TAIL = 2000  # characters of stderr quoted in a crashed trial's error
_PAGE = os.sysconf("SC_PAGE_SIZE")


def slot_environment(slot: Slot, tag: str) -> dict[str, str]:
    """The environment of a run's process on ``slot``: its threads, its GPU, this hermes importable, and the run's
    tag (``new_run_tag``), which its descendants inherit."""
    threads = str(slot.threads)
    return {
        **os.environ,
        protocol.ENV_THREADS: threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "CUDA_VISIBLE_DEVICES": slot.visible_devices,
        "PYTHONUNBUFFERED": "1",  # an unmodified Python script's metrics arrive as it prints them
        "PYTHONPATH": trial_python_path(),
        RUN_TAG: tag,
    }


def trial_python_path() -> str:
    """The PYTHONPATH of a run's process: this checkout's hermes (``hermes_source``), then this process's own."""
    return os.pathsep.join(path for path in (hermes_source(), os.environ.get("PYTHONPATH")) if path)


def hermes_source() -> str | None:
    """The directory that makes this hermes importable in a trial, for a source checkout only: an
    installed hermes lives in site-packages, which must not leak into a trial's other interpreter."""
    root = Path(hermes.__file__).resolve().parent.parent
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def new_run_tag() -> str:
    """A tag for the environment of a run's processes (``RUN_TAG``), unique to it."""
    return uuid.uuid4().hex


def prepare_child(parent: int, cpus: frozenset[int] | tuple[int, ...] | None) -> None:
    """In the child, before exec: be killed if the executor's process dies (even by SIGKILL), so a
    crashed runner leaves no trial behind to race the one a restarted runner resumes; and keep to the
    slot's CPUs (CPU slots only), set before the program starts so that every process it starts keeps
    to them too (set from the parent after the start, the program's first children could escape it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died between the fork and the prctl: no signal will come
        os._exit(1)
    if cpus:
        os.sched_setaffinity(0, cpus)


def signal_run(group: int, returncode: int | None, tag: str, signum: int = signal.SIGKILL) -> bool:
    """Send ``signum`` to a run's processes: its process group, only while its leader is unreaped (``returncode``
    None, so the group id cannot belong to anyone else), and those that left the group (they carry its ``tag``:
    ``torchrun``'s ranks, in sessions of their own). False when the group's leader is gone."""
    leader = returncode is None
    if leader:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            leader = False
    for pid in tagged({tag}):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
    return leader


def meminfo(field: str) -> int:
    """A line of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise HermesError(f"/proc/meminfo has no {field}")


def resident_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def exit_reason(code: int) -> str:
    return f"exit code {code}" + (f" ({signal.Signals(-code).name})" if code < 0 else "")


class NotRegularFile(OSError):
    """Where Hermes keeps a file of a trial's (its config, its logs), something else is: a FIFO, whose open waits for
    its other end (and the engine's thread with it: in a pool, every user's trials), a directory, a device."""

    def __init__(self, path: Path) -> None:
        super().__init__(None, "not a regular file", str(path))

    def __str__(self) -> str:
        return file_problem(self)


def file_problem(error: OSError) -> str:
    """What a trial's error says of a file it could not have: the file, then why."""
    return f"{error.filename}: {error.strerror}" if error.filename and error.strerror else error.strerror or str(error)


def open_regular(path: Path, flags: int) -> int:
    """A descriptor of the regular file at ``path`` (``os.open``'s ``flags``, a link followed), opened without
    waiting: NotRegularFile where something else is there. Blocking once open, as a log passed to a program must be."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as error:
        if error.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO (or a socket) no one reads, a directory
            raise NotRegularFile(path) from None
        if error.errno == errno.EAGAIN:  # another process's lease on it: no host limit, as EAGAIN is elsewhere
            raise OSError(errno.EBUSY, "held by another process's lease", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_anew(path: Path, data: bytes) -> None:
    """Make ``path`` a regular file that holds ``data``: written beside it, then renamed over it, so that nothing
    there is opened (a FIFO's open waits for a reader), a link there is replaced rather than written through, and a
    crash leaves the old file or the new one whole. A FIFO, a directory or a device there is kept: NotRegularFile."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise NotRegularFile(path)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)  # one a crash left, or anything else there: made anew, never opened
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def open_logs(directory: Path) -> tuple[BinaryIO, BinaryIO]:
    """The trial's ``stdout.log`` and ``stderr.log`` in ``directory``, to add to (made if missing), opened without
    waiting: NotRegularFile where either is something else (``open_regular``)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    stdout = os.fdopen(open_regular(directory / "stdout.log", flags), "ab")
    try:
        return stdout, os.fdopen(open_regular(directory / "stderr.log", flags), "ab")
    except BaseException:
        stdout.close()
        raise


def tail(path: Path, offset: int) -> str:
    """The end of a log from ``offset`` on, for an error message: its last lines, the first of them whole. Empty
    where it is no regular file (a FIFO: reading it would wait for a writer) or cannot be read.

    A trial's own log (its ``stderr.log``) is quoted without the lines Hermes wrote there (``hermes: trial 0 keeps no
    checkpoint ...``, written by its session or its executor): no cause of its end, they read as one ("exit code -9
    (SIGKILL): hermes: trial 0 ..." blamed Hermes for what killed it). A warm worker's log is quoted whole: its note
    that a trial's function did not return says why the worker, and the trial it ran, died."""
    try:
        log = os.fdopen(open_regular(path, os.O_RDONLY), "rb")
    except OSError:
        return ""
    with log:
        start = max(offset, log.seek(0, os.SEEK_END) - _STDERR_TAIL)
        log.seek(start)
        text = log.read()
    if start > offset:  # cut inside a line, most likely: start at the next one (if the text holds one)
        text = text.partition(b"\n")[2] or text
    if path.name == "stderr.log":
        text = b"".join(line for line in text.splitlines(keepends=True) if not line.startswith(b"hermes: trial "))
    return text.decode(errors="replace").strip()


def wait_stopped(pid: int, patience: float = 5.0) -> bool:
    """Wait until the process is stopped (True) or has exited (False).

    SIGSTOP is asynchronous; a process in uninterruptible sleep stops only when it leaves it, so
    after ``patience`` seconds it is taken as stopped.
    """
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return False
        if state in ("T", "t"):
            return True
        if state in ("Z", "X"):
            return False
        time.sleep(0.001)
    return True


def raise_open_file_limit() -> None:
    """Raise this process's soft limit of open files up to its hard limit (at most OPEN_FILES_WANTED), as Ray does: a
    paused unmodified program holds five descriptors of the runner (its two logs, two pipes, a pidfd), and the usual
    soft limit of 1024 stopped a run of 250 of them, most paused after their first report."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
