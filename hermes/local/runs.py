"""What the local executor keeps per trial and per run, shared by its launchers."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hermes.local.handshake import Handshake, TrialProgress
from hermes.local.launch import TrialLaunch
from hermes.local.resources import Slot

if TYPE_CHECKING:
    from hermes.local.launchers.warm import Worker


@dataclass(slots=True)
class SwitchTiming:
    """One suspend/resume cycle of a trial, in executor seconds; None where it has not happened."""

    trial_id: str
    suspend_decided: float  # the Suspend decision reached the executor
    suspend_delivered: float | None = None  # the trial was told: its report answered, or SIGSTOP sent
    suspended: float | None = None  # TrialSuspended: checkpoint committed and process gone (or stopped)
    resume_decided: float | None = None
    resumed: float | None = None  # its first report after the resume
    migrated: bool = False

    @property
    def suspend_latency(self) -> float | None:
        """Checkpoint and exit: from telling the trial to its GPU being free."""
        if self.suspended is None or self.suspend_delivered is None:
            return None
        return self.suspended - self.suspend_delivered

    @property
    def resume_latency(self) -> float | None:
        """Restart, restore and one step: from the Resume decision to the next report."""
        if self.resumed is None or self.resume_decided is None:
            return None
        return self.resumed - self.resume_decided


@dataclass(slots=True, eq=False, kw_only=True)
class LocalTrial(TrialProgress):
    launch: TrialLaunch
    directory: Path
    run: Run | None = None
    destination: Slot | None = None  # held for it while its run spills, to start there next
    timing: SwitchTiming | None = None  # the switch in progress

    def lost(self) -> None:
        """Its run died. An unmodified program starts again from its beginning: every line up to the last step
        the core knows is caught up, not reported again with other numbers."""
        if self.launch.movable:
            TrialProgress.lost(self)


@dataclass(slots=True, eq=False)
class Output:
    """A pipe a process's lines come out of: a cooperative trial's messages, or an unmodified program's stdout
    or stderr (its metrics may come on either: ``print``, or ``logging``), copied to ``log`` as they come."""

    fd: int | None  # the read end; None once closed
    pipe: IO[bytes] | None = None  # the file object that owns ``fd``, if one does
    log: IO[bytes] | None = None
    buffer: bytes = b""  # a partial line


@dataclass(slots=True, eq=False)
class Run:
    """One attempt of a trial: a process from launch until it is reaped, or a thread of a warm
    worker from its start until it ends."""

    trial: LocalTrial
    slot: Slot
    handshake: Handshake
    process: subprocess.Popen[bytes] | None = None
    pidfd: int = -1
    outputs: list[Output] = field(default_factory=list)  # its messages (cooperative), or its stdout and stderr
    answers: int | None = None  # write end of the answers to its reports (cooperative)
    stderr_offset: int = 0  # where this run's stderr starts in stderr.log
    worker: Worker | None = None  # the warm worker it runs in, instead of a process
    reports: int = 0  # unmodified: the lines read as reports, new or caught up (the step, without a step group)
    misread: str | None = None  # unmodified: why the last line that matched its pattern was no report
    cut: bool = False  # unmodified: a line longer than the searched end was read (said once in its stderr.log)
    trained: bool = False  # unmodified: it printed a step past its budget, so it was ended there, completed
    suspended_step: int | None = None  # its checkpoint of this step is committed
    paused: bool = False  # SIGSTOPped
    parked: bool = False  # suspended in its worker with its state in memory
    spilling: bool = False  # parked and told to write its checkpoint and end
    silent: bool = False  # stopped while paused or parked, or lost with its GPU: the core expects no event
    error: str | None = None  # why the executor killed it
    tag: str = ""  # in its processes' environment (hermes.local.guard.RUN_TAG): those that left its group carry it
    held: list[Any] = field(default_factory=list)  # unmodified: reports read while it was paused, made at its resume

    @property
    def reporting(self) -> bool:
        """Whether an event from this run may still come."""
        return not self.paused and not self.silent and (not self.parked or self.spilling)
