"""What the local engine asks of Linux: process groups that die with their parent, memory readings,
environments pinned to a slot. Linux only (prctl, /proc, sched_setaffinity)."""

from __future__ import annotations

import ctypes
import os
import signal
import time
import uuid
from pathlib import Path

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


def tail(path: Path, offset: int) -> str:
    """The end of a log from ``offset`` on, for an error message: its last lines, the first of them whole."""
    with open(path, "rb") as log:
        start = max(offset, log.seek(0, os.SEEK_END) - _STDERR_TAIL)
        log.seek(start)
        text = log.read()
    if start > offset:  # cut inside a line, most likely: start at the next one (if the text holds one)
        text = text.partition(b"\n")[2] or text
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
