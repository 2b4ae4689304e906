"""The guard: ends what a dead executor's trials leave behind.

Every trial process and every warm worker leads a process group of its own and dies with the
executor's process (``PR_SET_PDEATHSIG``, hermes.local.system). Its children do not: the signal is
not inherited, so a data loader's workers, the ranks ``torchrun`` starts or a shell pipeline's
commands outlived a runner killed with SIGKILL, holding GPU memory and writing into the trial's
directory while a restarted runner resumed the trial. The executor tells the guard, a small
process in a session of its own, each group it makes and each it collects, through a pipe; when
the pipe closes (the executor ended, however it ended), the guard kills every group still open,
and every process that carries the tag of one of the executor's runs in its environment (``RUN_TAG``):
one that left its group (``torchrun`` starts each rank in a session of its own) is found so.

A group's id cannot be taken by another process while any member of the group lives, so a group
that is still open when the pipe closes is the executor's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Collection

RUN_TAG = "HERMES_RUN_TAG"  # in the environment of each process a run starts, and so of its descendants


class Guard:
    """The executor's side: ``watch`` a group once made, ``forget`` it once its leader is collected."""

    def __init__(self) -> None:
        # Run as a script, not a module: it needs no import of hermes, and starts in milliseconds.
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            start_new_session=True,  # outside every group it kills, and untouched by the terminal's signals
        )

    def watch(self, group: int, tag: str) -> None:
        self._say(f"+{group} {tag}")

    def forget(self, group: int) -> None:
        self._say(f"-{group}")

    def close(self) -> None:
        """Let the guard end (killing what is still open), and collect it."""
        try:
            self._process.stdin.close()
        except BrokenPipeError:
            pass
        self._process.wait()

    def _say(self, line: str) -> None:
        try:
            self._process.stdin.write(f"{line}\n".encode())
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError):  # killed (an operator's kill -9): the groups die with their leaders
            pass


def tagged(tags: Collection[str]) -> list[int]:
    """The processes whose environment carries one of ``tags``: a run's processes wherever they went (a session or
    a group of their own), unless they cleared their environment. /proc/<pid>/environ is the environment a
    process was started with, readable for one's own processes."""
    marker = f"\0{RUN_TAG}=".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                environment = b"\0" + file.read()
        except OSError:  # gone, or another user's
            continue
        start = environment.find(marker)
        if start >= 0:
            start += len(marker)
            end = environment.find(b"\0", start)
            if environment[start:end if end >= 0 else None].decode(errors="replace") in tags:
                found.append(int(name))
    return found


def main() -> None:
    """Read ``+group tag``/``-group`` lines until the executor's end of the pipe closes; then kill what is open, and
    every process of the executor's runs that left its group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends it
    groups: set[int] = set()
    tags: set[str] = set()  # of every run: the processes of a collected one that outlived it were killed then
    for line in sys.stdin.buffer:
        group, _, tag = line[1:].strip().partition(b" ")
        if line.startswith(b"+"):
            groups.add(int(group))
            tags.add(tag.decode())
        else:
            groups.discard(int(group))
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # every member gone already
    for pid in tagged(tags):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    main()
