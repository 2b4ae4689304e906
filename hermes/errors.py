"""One root error class, so callers can catch everything Hermes raises on purpose."""

from __future__ import annotations

import errno
import shlex
import threading
from pathlib import Path

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # what a full disk, or a full quota, raises
# What a trial's checkpoint or folder meets where its storage, not the trial, is at fault: a full disk or quota, a
# file-size limit (ulimit -f), a read-only file system; the run stops as for a full disk
STORAGE_LIMIT_ERRNOS = NO_SPACE_ERRNOS | {errno.EFBIG, errno.EROFS}
# What a host out of open files (ulimit -n), processes (a pids limit) or memory raises where a process or a pipe is made
HOST_LIMIT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def start_thread(thread: threading.Thread) -> None:
    """Start one of Hermes's own threads. Where the host has none to give (each thread counts as a process: ``ulimit
    -u``, a container's pids limit), OSError EAGAIN, as a fork meets there (``HOST_LIMIT_ERRNOS``), in place of
    Python's RuntimeError "can't start new thread": the host's limit, which interrupts the run, not a bug or a
    trial's crash."""
    try:
        thread.start()
    except RuntimeError as error:
        if "can't start new thread" not in str(error):  # a thread started twice is a bug, not the host's limit
            raise
        raise OSError(errno.EAGAIN, f"{error} ({thread.name})") from error


def install_extra(extra: str) -> str:
    """The command that installs one of Hermes's extras: from the checkout it runs from (Hermes is not on PyPI, where
    "hermes-hpo[...]" would fetch whatever holds that name), or from any checkout."""
    checkout = Path(__file__).resolve().parent.parent
    where = str(checkout) if (checkout / "pyproject.toml").is_file() else "<a Hermes checkout>"
    return f"pip install {shlex.quote(f'{where}[{extra}]')}"


class HermesError(Exception):
    """Root of every error Hermes raises deliberately."""


class TraceError(HermesError):
    """A learning-curve trace file is malformed; the message names the file and line."""


class SpecError(HermesError):
    """An experiment specification is invalid; the message names the field.

    ``problems``: each problem as (dotted field path, what is wrong), for callers that place them (the server's 422).
    """

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class NoSpaceError(HermesError):
    """A disk that Hermes or a trial writes to is full. Not the experiment's fault: the run stops,
    recorded as interrupted, and running it again once there is room continues it."""


class HostLimit(HermesError):
    """The host ran out of open files, processes or memory for a trial's process or pipes. Not the trial's fault:
    the run stops, recorded as interrupted, and running it again once the limit is raised continues it."""


class ClusterLost(HermesError):
    """The Ray cluster's head is gone. Not the experiment's fault either: the run stops, recorded as
    interrupted, and running it again once the cluster is back continues it."""


class IllegalTransition(HermesError):
    """A trial was asked to move between two states that the state table does not connect."""
