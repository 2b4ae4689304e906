"""What a launcher is, and what it may ask of the executor that hosts it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Protocol

from hermes.core.events import Event
from hermes.local.guard import Guard
from hermes.local.loop import EventLoop
from hermes.local.resources import Slot
from hermes.local.runs import LocalTrial, Run

# Ranks in the event loop: what a process said is read before its exit is handled.
CHANNEL, WORKER_CHANNEL, EXIT, WORKER_EXIT = 0, 1, 2, 3

# The command line of the script whose hermes.run drives this process's experiments, its file first (``python
# tune.py --scale 100``: /home/me/tune.py --scale 100), which their trials' processes see as sys.argv
# (hermes.trial.runner); empty where no script drives them (hermes run, a server, a notebook).
_driver_script: tuple[str, ...] = ()


def driver_script() -> tuple[str, ...]:
    """What a function trial's runner or warm worker is given after its own argument."""
    return _driver_script


def set_driver_script(script: tuple[str, ...]) -> tuple[str, ...]:
    """Set the script that drives the experiments run from now on; the one before it."""
    global _driver_script
    previous, _driver_script = _driver_script, tuple(script)
    return previous


class Host(Protocol):
    """The executor's side: its clock, loop, settings, events, and slot bookkeeping."""

    directory: Path
    cwd: str
    metric: str | None
    checkpoint_every: int
    loop: EventLoop
    guard: Guard  # told of every process group a launcher makes, and of each it collects

    @property
    def slots(self) -> dict[str, Slot]: ...

    def now(self) -> float: ...

    def metric_of(self, trial: LocalTrial) -> str | None:
        """The objective metric of the trial (its own setting, else the executor's)."""

    def checkpoint_every_of(self, trial: LocalTrial) -> int: ...

    def emit(self, event: Event) -> None:
        """Queue an event for ``next_events``."""

    def occupy(self, slot: Slot, trial: LocalTrial) -> None: ...

    def release(self, trial: LocalTrial, slot: Slot) -> None:
        """Free ``slot`` if the trial holds it and has not been placed on it anew."""

    def forget(self, run: Run) -> None:
        """The run is over: release its slot and, if its trial was moving, start it where it goes."""

    def report(self, run: Run, step: int, metrics: dict[str, float], checkpointed: bool) -> None:
        """A cooperative report: answer it now (catch-up, stop) or emit it and wait for ``settled``."""

    def fail(self, run: Run, error: str) -> None:
        """Kill the run for ``error``; its end is reported as a failure."""


class Launcher(ABC):
    """Runs one kind of trial; every call comes from the executor's thread."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @abstractmethod
    def launch(self, trial: LocalTrial, slot: Slot) -> None:
        """Start a run of ``trial`` on ``slot`` (held for it), from its checkpoint if it has one."""

    @abstractmethod
    def suspend(self, run: Run) -> None:
        """Have the running ``run`` give up its slot; TrialSuspended follows."""

    @abstractmethod
    def resume(self, trial: LocalTrial, slot: Slot) -> None:
        """Go on with a suspended trial on ``slot`` (held for it)."""

    @abstractmethod
    def stop(self, run: Run) -> None:
        """End the run for good."""

    @abstractmethod
    def answer(self, run: Run, word: str) -> None:
        """Tell a cooperative run blocked at a report what to do (protocol.CONTINUE, SUSPEND, STOP)."""

    @abstractmethod
    def kill(self, run: Run) -> None:
        """End the run at once, without a word to it."""

    @abstractmethod
    def runs(self) -> list[Run]:
        """Every run not yet over."""

    def lose_slot(self, slot: Slot) -> None:
        """``slot`` is gone: end at once, silently, whatever of this launcher ran there."""

    def close(self) -> None:
        """Kill everything it runs."""
