"""The local executor: one process per trial on this machine's GPUs or CPU slots.

Semantics follow the simulator (hermes/sim/executor.py): a cooperative trial suspends at its next
step boundary (its next report), and only then is it TrialSuspended, so its GPU is free.

- A function trial runs in its slot's *warm worker* (hermes/local/worker.py), a process that
  outlives its trials. Suspended, the trial parks there with its state in memory and resumes on
  that slot from memory. To resume on another slot, it first writes a checkpoint (a *spill*); it
  is spilled too when the host runs short of memory, and its worker is replaced when the worker
  outgrows its memory limit. A worker that dies fails only the trial it was running; the trials
  parked in it fall back to their last checkpoints and silently catch up to the step the
  scheduler knows.
- A command trial that uses ``hermes.trial`` checkpoints and exits when suspended, and resumes,
  anywhere, as a new process that restores the checkpoint.
- An unmodified program is suspended at once with SIGSTOP and resumed with SIGCONT on its own GPU.

Everything runs in the engine's thread: ``next_events`` waits with one selector on every trial's
channel (or stdout), every worker's channel and a pidfd per process, so a dying process is seen
at once and never leaves the executor waiting. Linux only (pidfd, /proc, sched_setaffinity).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Mapping

import hermes
from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuRemoved,
    NodeAdded,
    PeriodElapsed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError
from hermes.execution.contract import Executor
from hermes.local.launch import WARM_SWITCH_COST, TrialLaunch
from hermes.local.resources import Slot, local_slots
from hermes.trial import protocol

# What a selector key watches; channels are read before exits.
_CHANNEL, _WORKER_CHANNEL, _EXIT, _WORKER_EXIT, _WAKE = 0, 1, 2, 3, 4
_PR_SET_PDEATHSIG = 1  # prctl option, from <linux/prctl.h>
_STDERR_TAIL = 2000  # characters of stderr quoted in a crashed trial's error
_PAGE = os.sysconf("SC_PAGE_SIZE")


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


@dataclass(slots=True, eq=False)
class _Trial:
    trial_id: str
    launch: TrialLaunch
    directory: Path
    last_step: int = 0  # the last step the scheduler knows; a report up to it is a catch-up
    checkpoint_step: int = 0  # the last step reported with a durable checkpoint
    run: _Run | None = None
    destination: Slot | None = None  # held for it while its run spills, to start there next
    timing: SwitchTiming | None = None  # the switch in progress


@dataclass(slots=True, eq=False)
class _Worker:
    """A warm worker process (hermes/local/worker.py): runs one slot's function trials in turn."""

    slot: Slot
    process: subprocess.Popen[bytes]
    pidfd: int
    channel: int | None  # read end of its messages
    log: Path  # its own stdout and stderr
    runs: dict[str, _Run] = field(default_factory=dict)  # trial id -> its run in here: live, parked or ending
    buffer: bytes = b""
    retiring: bool = False  # over its memory limit: spill what it holds, then end it


@dataclass(slots=True, eq=False)
class _Run:
    """One attempt of a trial: a process from launch until it is reaped, or a thread of a warm
    worker from its start until it ends."""

    trial: _Trial
    slot: Slot
    process: subprocess.Popen[bytes] | None = None
    pidfd: int = -1
    channel: int | None = None  # read end of its messages (cooperative) or of its stdout (unmodified)
    answers: int | None = None  # write end of the answers to its reports (cooperative)
    stdout_log: IO[bytes] | None = None  # unmodified: its stdout is copied here
    stderr_offset: int = 0  # where this run's stderr starts in stderr.log
    worker: _Worker | None = None  # the warm worker it runs in, instead of a process
    buffer: bytes = b""  # a partial line
    awaiting: TrialReported | None = None  # its report that waits for an answer
    suspend_requested: bool = False
    stop_requested: bool = False
    suspended_step: int | None = None  # its checkpoint of this step is committed
    paused: bool = False  # SIGSTOPped
    parked: bool = False  # suspended in its worker with its state in memory
    spilling: bool = False  # parked and told to write its checkpoint and end
    silent: bool = False  # stopped while paused or parked: the core expects no event
    error: str | None = None  # why the executor killed it

    @property
    def reporting(self) -> bool:
        """Whether an event from this run may still come."""
        return not self.paused and not self.silent and (not self.parked or self.spilling)


class LocalExecutor(Executor[TrialLaunch]):
    """Runs trials as local processes; see the module docstring and docs/trials.md.

    ``directory`` holds ``trials/<trial_id>/`` (config, stdout.log, stderr.log, checkpoints and
    the trial's own outputs). ``metric`` names the objective among a cooperative trial's metrics (None: each
    report carries exactly one). ``period`` adds a PeriodElapsed every that many seconds.
    ``clock_offset`` continues the timeline of an experiment that is restarted.
    A trial parked in a warm worker is spilled to disk at once while the host has less than
    ``memory_reserve`` bytes available (default: a tenth of its memory); a worker whose resident
    memory exceeds ``worker_memory_limit`` bytes (default: the host's memory over the slots) is
    replaced once it runs nothing.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        slots: list[Slot] | None = None,
        metric: str | None = None,
        period: float | None = None,
        checkpoint_every: int = 0,
        clock_offset: float = 0.0,
        cwd: str | Path | None = None,
        memory_reserve: int | None = None,
        worker_memory_limit: int | None = None,
    ) -> None:
        if not hasattr(os, "pidfd_open"):
            raise HermesError("the local executor needs Linux 5.3 or later (pidfd_open)")
        if period is not None and not period > 0:
            raise HermesError(f"period must be positive, got {period}")
        if checkpoint_every < 0:
            raise HermesError(f"checkpoint_every must be 0 (off) or positive, got {checkpoint_every}")
        self.directory = Path(directory).resolve()
        self.slots = {slot.name: slot for slot in (slots if slots is not None else local_slots())}
        self.metric = metric
        self.period = period
        self.checkpoint_every = checkpoint_every
        self.cwd = str(cwd or os.getcwd())
        total_memory = _meminfo("MemTotal")
        self.memory_reserve = total_memory // 10 if memory_reserve is None else memory_reserve
        self.worker_memory_limit = worker_memory_limit or total_memory // max(1, len(self.slots))
        self.switch_timings: list[SwitchTiming] = []
        self.profile = ExecutionProfile(switch_cost=WARM_SWITCH_COST)
        self._started = time.monotonic() - clock_offset
        self._next_period = self.now() + period if period is not None else None
        self._trials: dict[str, _Trial] = {}
        self._live: list[_Run] = []  # processes not yet reaped
        self._workers: dict[str, _Worker] = {}  # slot name -> its warm worker (a retiring one is not here)
        self._retiring: list[_Worker] = []
        self._occupied: dict[str, _Trial] = {}  # slot name -> the trial that holds it
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        for fd in (self._wake_read, self._wake_write):
            os.set_blocking(fd, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, (None, _WAKE))
        self._closed = False
        nodes: dict[str, tuple[str, ...]] = {}
        for slot in self.slots.values():
            nodes[slot.node] = nodes.get(slot.node, ()) + (slot.name,)
        self._events: list[Event] = [NodeAdded(self.now(), node, gpus) for node, gpus in nodes.items()]

    def now(self) -> float:
        return time.monotonic() - self._started

    def wake(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except (BlockingIOError, OSError):
            pass  # a byte is pending already, or the executor is closed: next_events returns anyway

    def idle(self) -> bool:
        return not self._events and not self._anything_reporting()

    def remove_gpu(self, gpu: str) -> None:
        """Take ``gpu`` out of service at once (a failed device, or an operator draining it).

        Whatever runs there is killed without a word (GpuRemoved tells the core), and a warm
        worker of that slot goes with the trials parked in it: they fall back to their checkpoints.
        """
        slot = self.slots.pop(gpu, None)
        if slot is None:
            raise HermesError(f"unknown GPU {gpu}; this executor has {', '.join(self.slots)}")
        holder = self._occupied.pop(gpu, None)
        if holder is not None:
            holder.last_step = holder.checkpoint_step  # the core falls it back to its checkpoint
            if holder.destination is slot:
                holder.destination = None
            elif holder.run is not None and holder.run.slot is slot:
                holder.run.silent = True
                if holder.run.worker is None:  # done with it now, so the trial can start anew at once
                    self._kill(holder.run)
                    holder.run.process.wait()
                    self._close(holder.run)
        worker = self._workers.get(gpu)
        if worker is not None:
            self._kill_worker(worker)
            worker.process.wait()
            self._worker_exited(worker)
        self._events.append(GpuRemoved(self.now(), gpu))

    def submit(
        self, trial_id: str, launch: TrialLaunch, at: float | None = None, *, reported_step: int = 0
    ) -> TrialSubmitted:
        """Register what to run for ``trial_id``; return the event that tells the scheduler about it.

        ``reported_step``: the last step of the trial the scheduler knows, when a restarted runner
        registers a trial that already ran."""
        if not trial_id or trial_id.startswith(".") or not all(c.isalnum() or c in "._-" for c in trial_id):
            raise HermesError(f"trial id {trial_id!r} must be letters, digits, '.', '_' or '-'")
        if trial_id in self._trials:
            raise HermesError(f"trial {trial_id} submitted twice")
        if not self._trials or launch.switch_cost > self.profile.switch_cost:
            self.profile = ExecutionProfile(switch_cost=launch.switch_cost)  # the dearest of its trials
        self._trials[trial_id] = _Trial(
            trial_id, launch, self.directory / "trials" / trial_id, reported_step, checkpoint_step=reported_step
        )
        return TrialSubmitted(
            self.now() if at is None else at, trial_id, launch.budget, dict(launch.config), launch.movable
        )

    # ------------------------------------------------------------------ decisions in
    def apply(self, decision: Decision, at: float) -> None:
        trial = self._trials.get(decision.trial_id)
        if trial is None:
            raise HermesError(f"unknown trial {decision.trial_id}: submit it to the executor first")
        if isinstance(decision, Start):  # from scratch: forget any earlier attempt's checkpoints
            if trial.run is not None:
                raise HermesError(f"trial {trial.trial_id} already runs on {trial.run.slot.name}")
            shutil.rmtree(trial.directory / protocol.CHECKPOINTS_DIR, ignore_errors=True)
            trial.last_step = trial.checkpoint_step = 0
            self._launch(trial, self._free_slot(trial, decision.gpu))
        elif isinstance(decision, Resume):
            self._resume(trial, decision)
        elif isinstance(decision, Suspend):
            self._suspend(trial)
        elif isinstance(decision, Stop):
            self._stop(trial)

    def _launch(self, trial: _Trial, slot: Slot) -> None:
        """Run the trial on ``slot`` (free, or held for it): in the slot's warm worker, or as a process."""
        launch = trial.launch
        trial.directory.mkdir(parents=True, exist_ok=True)
        (trial.directory / protocol.CONFIG_FILE).write_text(json.dumps(dict(launch.config)))
        self._occupied[slot.name] = trial
        if launch.in_worker:
            for other in self.slots.values():  # every slot's worker warms up while this one starts
                if other.name not in self._workers:
                    self._spawn_worker(other, launch)
            worker = self._workers[slot.name]
            stderr = trial.directory / "stderr.log"
            offset = stderr.stat().st_size if stderr.exists() else 0
            run = trial.run = worker.runs[trial.trial_id] = _Run(trial, slot, stderr_offset=offset, worker=worker)
            self._command(
                worker,
                {
                    "op": protocol.START,
                    "trial": trial.trial_id,
                    "function": launch.function,
                    "directory": str(trial.directory),
                    "budget": launch.budget,
                    "metric": self.metric or "",
                    "checkpoint_every": self.checkpoint_every,
                    "reported_step": trial.last_step,
                },
            )
            return
        env = self._environment(trial, slot)
        stdout_log = open(trial.directory / "stdout.log", "ab")
        stderr_log = open(trial.directory / "stderr.log", "ab")
        stderr_offset = os.fstat(stderr_log.fileno()).st_size
        child_fds: tuple[int, ...] = ()
        parent_fds: tuple[int, ...] = ()
        if launch.cooperative:
            answers_read, answers_write = os.pipe()
            messages_read, messages_write = os.pipe()
            child_fds, parent_fds = (answers_read, messages_write), (messages_read, answers_write)
            env[protocol.ENV_CHANNEL] = f"{answers_read},{messages_write}"
        argv = (
            [sys.executable, "-m", "hermes.trial.runner", launch.function] if launch.function else list(launch.command)
        )
        try:
            process = subprocess.Popen(
                argv,
                cwd=launch.cwd or self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout_log if launch.cooperative else subprocess.PIPE,
                stderr=stderr_log,
                pass_fds=child_fds,
                start_new_session=True,  # its own process group: suspend and kill reach its children too
                preexec_fn=functools.partial(_die_with_parent, os.getpid()),
            )
        except OSError as error:
            stdout_log.close()
            for fd in parent_fds:
                os.close(fd)
            del self._occupied[slot.name]
            self._events.append(TrialExited(self.now(), trial.trial_id, False, f"cannot start {argv[0]}: {error}"))
            return
        finally:
            for fd in child_fds:
                os.close(fd)
            stderr_log.close()
        if slot.cpus:
            try:
                os.sched_setaffinity(process.pid, slot.cpus)
            except ProcessLookupError:
                pass  # already gone; its exit is reported as usual
        if launch.cooperative:
            stdout_log.close()
            channel, answers, copy = messages_read, answers_write, None
            os.set_blocking(answers, False)
        else:
            channel, answers, copy = process.stdout.fileno(), None, stdout_log
        os.set_blocking(channel, False)
        run = _Run(trial, slot, process, os.pidfd_open(process.pid), channel, answers, copy, stderr_offset)
        self._selector.register(run.channel, selectors.EVENT_READ, (run, _CHANNEL))
        self._selector.register(run.pidfd, selectors.EVENT_READ, (run, _EXIT))
        self._live.append(run)
        trial.run = run

    def _free_slot(self, trial: _Trial, gpu: str) -> Slot:
        slot = self.slots.get(gpu)
        if slot is None:
            raise HermesError(f"unknown GPU {gpu}; this executor has {', '.join(self.slots)}")
        holder = self._occupied.get(gpu)
        if holder is not None and holder is not trial:
            raise HermesError(f"cannot run trial {trial.trial_id} on {gpu}: trial {holder.trial_id} holds it")
        return slot

    def _release(self, trial: _Trial, slot: Slot) -> None:
        """Free ``slot`` if the trial holds it and has not been placed on it anew."""
        if self._occupied.get(slot.name) is trial and trial.destination is not slot:
            del self._occupied[slot.name]

    def _environment(self, trial: _Trial, slot: Slot) -> dict[str, str]:
        return {
            **self._slot_environment(slot),
            **trial.launch.env,
            protocol.ENV_TRIAL_ID: trial.trial_id,
            protocol.ENV_TRIAL_DIR: str(trial.directory),
            protocol.ENV_BUDGET: str(trial.launch.budget),
            protocol.ENV_METRIC: self.metric or "",
            protocol.ENV_CHECKPOINT_EVERY: str(self.checkpoint_every),
            protocol.ENV_REPORTED_STEP: str(trial.last_step),
        }

    def _slot_environment(self, slot: Slot) -> dict[str, str]:
        threads = str(slot.threads)
        python_path = [path for path in (_hermes_source(), os.environ.get("PYTHONPATH")) if path]
        return {
            **os.environ,
            protocol.ENV_THREADS: threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "CUDA_VISIBLE_DEVICES": slot.visible_devices,
            "PYTHONUNBUFFERED": "1",  # an unmodified Python script's metrics arrive as it prints them
            "PYTHONPATH": os.pathsep.join(python_path),
        }

    # ------------------------------------------------------------------ warm workers
    def _spawn_worker(self, slot: Slot, launch: TrialLaunch) -> _Worker:
        """Start the slot's warm worker; it imports the trial's module while the command waits in its stdin."""
        log = self.directory / "workers" / f"{slot.name.replace('/', '-')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        messages_read, messages_write = os.pipe()
        env = {
            **self._slot_environment(slot),
            protocol.ENV_WORKER_CHANNEL: str(messages_write),
            protocol.ENV_WORKER_OF: str(self.directory),
        }
        module = launch.function.partition(":")[0]
        with open(log, "ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "hermes.local.worker", module],
                cwd=launch.cwd or self.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=output,
                pass_fds=(messages_write,),
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, os.getpid()),
            )
        os.close(messages_write)
        if slot.cpus:
            try:
                os.sched_setaffinity(process.pid, slot.cpus)
            except ProcessLookupError:
                pass
        os.set_blocking(messages_read, False)
        worker = _Worker(slot, process, os.pidfd_open(process.pid), messages_read, log)
        self._selector.register(messages_read, selectors.EVENT_READ, (worker, _WORKER_CHANNEL))
        self._selector.register(worker.pidfd, selectors.EVENT_READ, (worker, _WORKER_EXIT))
        self._workers[slot.name] = worker
        return worker

    def _command(self, worker: _Worker, command: dict[str, Any]) -> None:
        try:
            worker.process.stdin.write((json.dumps(command) + "\n").encode())
            worker.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died; its exit is on its way

    def _say(self, run: _Run, word: str) -> None:
        self._command(run.worker, {"op": protocol.SAY, "trial": run.trial.trial_id, "word": word})

    def _spill(self, run: _Run) -> None:
        """Have a parked trial write its checkpoint and end, to resume from disk."""
        if not run.spilling:
            run.spilling = True
            self._say(run, protocol.SPILL)

    def _worker_message(self, worker: _Worker, message: dict[str, Any]) -> None:
        run = worker.runs[message["trial"]]
        kind = message["type"]
        if kind == protocol.PARKED:
            self._parked(run, int(message["step"]))
        elif kind == protocol.ENDED:
            self._ended(run, message["outcome"], message.get("error"))
        else:
            self._message(run, message)

    def _parked(self, run: _Run, step: int) -> None:
        """The trial suspended into memory: its slot is free. Spill it if memory is short."""
        trial, worker = run.trial, run.worker
        run.parked = True
        self._release(trial, run.slot)
        trial.timing.suspended = self.now()
        self._events.append(TrialSuspended(trial.timing.suspended, trial.trial_id, step))
        if _resident_bytes(worker.process.pid) > self.worker_memory_limit:
            self._retire(worker)
        elif _meminfo("MemAvailable") < self.memory_reserve:
            self._spill(run)

    def _retire(self, worker: _Worker) -> None:
        """Replace a worker that grew too big: spill its parked trials, end it once it holds none."""
        if worker.retiring:
            return
        worker.retiring = True
        del self._workers[worker.slot.name]
        self._retiring.append(worker)
        for run in worker.runs.values():
            if run.parked:
                self._spill(run)
        self._end_retired(worker)

    def _end_retired(self, worker: _Worker) -> None:
        if worker.retiring and not worker.runs:
            self._kill_worker(worker)

    def _ended(self, run: _Run, outcome: str, error: str | None) -> None:
        """A worker's trial thread returned: report how, or start it where it is to resume."""
        trial, worker = run.trial, run.worker
        del worker.runs[trial.trial_id]
        self._forget(run)
        now = self.now()
        if run.silent:
            pass
        elif outcome == protocol.SUSPENDED and run.spilling:
            pass  # on disk now, as the scheduler believes it suspended
        elif run.stop_requested:
            self._events.append(TrialExited(now, trial.trial_id, False, "stopped"))
        elif run.error is not None:
            self._events.append(TrialExited(now, trial.trial_id, False, run.error))
        elif outcome == protocol.OK:
            self._events.append(TrialExited(now, trial.trial_id, True))
        else:
            tail = _tail(trial.directory / "stderr.log", run.stderr_offset)
            reason = error or f"the trial ended: {outcome}"
            self._events.append(TrialExited(now, trial.trial_id, False, f"{reason}: {tail}" if tail else reason))
        self._end_retired(worker)

    def _forget(self, run: _Run) -> None:
        """The run is over: release its slot and, if it was moving, start the trial where it goes."""
        trial = run.trial
        self._release(trial, run.slot)
        if trial.run is run:
            trial.run = None
        if trial.destination is not None:
            destination, trial.destination = trial.destination, None
            self._launch(trial, destination)

    def _worker_exited(self, worker: _Worker) -> None:
        """The worker died: fail the trial it was running; the parked ones go back to their checkpoints."""
        self._kill_worker(worker)  # leftover children
        code = worker.process.wait()
        if self._workers.get(worker.slot.name) is worker:
            del self._workers[worker.slot.name]
        if worker in self._retiring:
            self._retiring.remove(worker)
        self._drain_worker(worker)  # what it said before it died (a trial may have ended)
        self._selector.unregister(worker.pidfd)
        os.close(worker.pidfd)
        if worker.channel is not None:
            self._selector.unregister(worker.channel)
            os.close(worker.channel)
            worker.channel = None
        try:
            worker.process.stdin.close()
        except BrokenPipeError:
            pass  # commands it never read: it is dead
        for run in list(worker.runs.values()):
            del worker.runs[run.trial.trial_id]
            if not (run.parked or run.silent):
                reason = run.error or f"its worker died, {_exit_reason(code)}: {_tail(worker.log, 0)}"
                self._events.append(TrialExited(self.now(), run.trial.trial_id, False, reason))
            self._forget(run)

    def _drain_worker(self, worker: _Worker) -> None:
        while worker.channel is not None:
            try:
                chunk = os.read(worker.channel, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._worker_lines(worker, chunk)

    def _worker_lines(self, worker: _Worker, chunk: bytes) -> None:
        *lines, worker.buffer = (worker.buffer + chunk).split(b"\n")
        for line in lines:
            try:
                self._worker_message(worker, json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                for run in worker.runs.values():  # a broken worker fails the trial it was running
                    if not run.parked:
                        run.error = run.error or f"protocol error: {error!r}"
                self._kill_worker(worker)
                return

    def _kill_worker(self, worker: _Worker) -> None:
        if worker.process.returncode is None:
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _suspend(self, trial: _Trial) -> None:
        run = trial.run
        if run is None or run.paused or run.parked:
            raise HermesError(f"cannot suspend trial {trial.trial_id}: it is not running")
        trial.timing = SwitchTiming(trial.trial_id, self.now())
        self.switch_timings.append(trial.timing)
        if trial.launch.cooperative:
            run.suspend_requested = True  # told when its next report is answered
        else:
            self._pause(run)

    def _pause(self, run: _Run) -> None:
        """SIGSTOP the process group, then report what it printed before stopping and that it is suspended."""
        trial = run.trial
        try:
            os.killpg(run.process.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return  # it exited first: its exit is reported instead
        trial.timing.suspend_delivered = self.now()
        if not _wait_stopped(run.process.pid):
            return
        self._drain(run)
        run.paused = True
        self._release(trial, run.slot)
        trial.timing.suspended = self.now()
        self._events.append(TrialSuspended(trial.timing.suspended, trial.trial_id, trial.last_step))

    def _resume(self, trial: _Trial, decision: Resume) -> None:
        if trial.timing is not None and trial.timing.resume_decided is None:
            trial.timing.resume_decided = self.now()
            trial.timing.migrated = decision.migrated
        slot = self._free_slot(trial, decision.gpu)
        run = trial.run
        if trial.launch.in_worker and run is not None:
            if run.worker.slot is slot and not (run.spilling or run.worker.retiring):
                run.parked = run.suspend_requested = False  # on its own slot: straight on from memory
                self._occupied[slot.name] = trial
                self._say(run, protocol.RESUME)
            else:  # elsewhere: spill it to disk there, then start it here
                self._occupied[slot.name] = trial
                trial.destination = slot
                self._spill(run)
            return
        if trial.launch.cooperative:
            self._launch(trial, slot)
            return
        if run is None:  # e.g. the executor was restarted: the stopped process died with it
            self._events.append(TrialExited(self.now(), trial.trial_id, False, "its stopped process is gone"))
            return
        if slot is not run.slot:
            raise HermesError(f"unmodified trial {trial.trial_id} cannot move from {run.slot.name} to {decision.gpu}")
        self._occupied[slot.name] = trial
        run.paused = False
        try:
            os.killpg(run.process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed while stopped; its exit is reported as usual

    def _stop(self, trial: _Trial) -> None:
        if trial.destination is not None:  # it was moving: it stays where it is, and ends there
            self._occupied.pop(trial.destination.name, None)
            trial.destination = None
        run = trial.run
        if run is None:
            return  # suspended with its checkpoint, or never started: nothing runs
        if run.paused or run.parked:
            run.silent = True  # the core already counts it as stopped
            if run.paused:
                self._kill(run)
            elif not run.spilling:
                self._say(run, protocol.STOP)
            return
        run.stop_requested = True
        if run.awaiting is None and run.worker is None:
            self._kill(run)
        # else: it is answered "stop" at its next report, and ends cleanly

    def settled(self, event: Event) -> None:
        """Answer the report that ``event`` is, now that the core has decided about it."""
        if not isinstance(event, TrialReported):
            return
        trial = self._trials.get(event.trial_id)
        run = trial.run if trial is not None else None
        if run is None or run.awaiting is not event:
            return
        run.awaiting = None
        if run.stop_requested:
            answer = protocol.STOP
        elif run.suspend_requested:
            answer = protocol.SUSPEND
            run.trial.timing.suspend_delivered = self.now()
        else:
            answer = protocol.CONTINUE
        self._answer(run, answer)

    def _answer(self, run: _Run, answer: str) -> None:
        if run.worker is not None:
            self._say(run, answer)
            return
        try:
            os.write(run.answers, f"{answer}\n".encode())
        except BlockingIOError:
            self._fail(run, "protocol error: the trial does not read the answers to its reports")
        except BrokenPipeError:
            pass  # it died; its exit is on its way

    # ------------------------------------------------------------------ events out
    def next_events(self) -> list[Event]:
        """Wait until something happens; [] only when no process can report anything any more."""
        while not self._events:
            if not self._anything_reporting():
                return []
            timeout = None if self._next_period is None else max(0.0, self._next_period - self.now())
            ready = self._selector.select(timeout)
            woken = False
            for key, _ in sorted(ready, key=lambda item: item[0].data[1]):
                source, kind = key.data
                if kind == _WAKE:
                    woken = self._drain_wakes()
                elif kind == _CHANNEL and source.channel is not None:
                    self._read(source)
                elif kind == _WORKER_CHANNEL:
                    self._drain_worker(source)
                elif kind == _EXIT:
                    self._reap(source)
                elif kind == _WORKER_EXIT:
                    self._worker_exited(source)
            if self._next_period is not None and self.now() >= self._next_period:
                self._events.append(PeriodElapsed(self.now()))
                while self._next_period <= self.now():
                    self._next_period += self.period
            if woken:
                break
        events, self._events = self._events, []
        return events

    def _drain_wakes(self) -> bool:
        try:
            while os.read(self._wake_read, 1 << 10):
                pass
        except BlockingIOError:
            pass
        return True

    def _anything_reporting(self) -> bool:
        workers = [*self._workers.values(), *self._retiring]
        runs = [*self._live, *(run for worker in workers for run in worker.runs.values())]
        return any(run.reporting for run in runs)

    def _read(self, run: _Run) -> bool:
        """Read what is available from the run's channel; False once nothing more is (now or ever)."""
        try:
            chunk = os.read(run.channel, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            self._selector.unregister(run.channel)
            if run.stdout_log is None:
                os.close(run.channel)
            else:
                run.process.stdout.close()
            run.channel = None
            if run.buffer:  # a last line without a newline
                self._line(run, run.buffer)
                run.buffer = b""
            return False
        if run.stdout_log is not None:
            run.stdout_log.write(chunk)
            run.stdout_log.flush()
        *lines, run.buffer = (run.buffer + chunk).split(b"\n")
        for line in lines:
            self._line(run, line)
        return True

    def _drain(self, run: _Run) -> None:
        while run.channel is not None and self._read(run):
            pass

    def _line(self, run: _Run, line: bytes) -> None:
        if run.error is not None:
            return
        try:
            if run.trial.launch.cooperative:
                self._message(run, json.loads(line))
            else:
                self._parse_stdout(run, line.decode(errors="replace"))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            self._fail(run, f"protocol error: {error!r}")

    def _message(self, run: _Run, message: dict[str, Any]) -> None:
        if message["type"] == protocol.REPORT:
            metrics = {str(name): float(value) for name, value in message["metrics"].items()}
            if self.metric is not None:
                if self.metric not in metrics:
                    raise ValueError(f"report of step {message['step']} lacks the objective metric {self.metric!r}")
                value = metrics[self.metric]
            elif len(metrics) == 1:
                value = next(iter(metrics.values()))
            else:
                raise ValueError("several metrics reported but the executor names no objective metric")
            step = int(message["step"])
            if run.stop_requested:
                self._answer(run, protocol.STOP)
            elif step <= run.trial.last_step:  # catching up from an older checkpoint: known already
                self._answer(run, protocol.CONTINUE)
            else:
                run.awaiting = self._report(run, step, value, metrics, bool(message["checkpointed"]))
        elif message["type"] == protocol.SUSPENDED:
            run.suspended_step = int(message["step"])
        else:
            raise ValueError(f"unknown message type {message['type']!r}")

    def _parse_stdout(self, run: _Run, line: str) -> None:
        match = run.trial.launch.pattern.search(line)
        if match is None:
            return
        groups = {name: text for name, text in match.groupdict().items() if text is not None}
        try:
            metrics = {name: float(text) for name, text in groups.items() if name != "step"}
            step = int(groups["step"]) if "step" in groups else run.trial.last_step + 1
        except ValueError:
            return  # not a number after all: not a report
        if step > run.trial.last_step:  # a repeated or earlier step is not a new report
            self._report(run, step, metrics["value"], metrics, checkpointed=False)

    def _report(
        self, run: _Run, step: int, value: float, metrics: Mapping[str, float], checkpointed: bool
    ) -> TrialReported:
        trial = run.trial
        if step <= trial.last_step:
            raise ValueError(f"reported step {step} after step {trial.last_step}")
        trial.last_step = step
        if checkpointed:
            trial.checkpoint_step = step
        event = TrialReported(self.now(), trial.trial_id, step, value, checkpointed, dict(metrics))
        self._events.append(event)
        if trial.timing is not None and trial.timing.resume_decided is not None and trial.timing.resumed is None:
            trial.timing.resumed = event.at
        return event

    def _reap(self, run: _Run) -> None:
        """The run's main process exited: end its group, collect what it said, report the outcome."""
        self._kill(run)  # leftover children; the leader is not reaped yet, so its group id is still ours
        code = run.process.wait()
        self._drain(run)
        self._close(run)
        trial = run.trial
        now = self.now()
        if run.silent:
            return
        if run.suspend_requested and run.suspended_step is not None and code == 0:
            trial.timing.suspended = now
            self._events.append(TrialSuspended(now, trial.trial_id, run.suspended_step))
        elif run.stop_requested:
            self._events.append(TrialExited(now, trial.trial_id, False, "stopped"))
        elif run.error is not None:
            self._events.append(TrialExited(now, trial.trial_id, False, run.error))
        elif code == 0:
            self._events.append(TrialExited(now, trial.trial_id, True))
        else:
            self._events.append(TrialExited(now, trial.trial_id, False, self._crash_message(run, code)))

    def _crash_message(self, run: _Run, code: int) -> str:
        tail = _tail(run.trial.directory / "stderr.log", run.stderr_offset)
        return f"{_exit_reason(code)}: {tail}" if tail else _exit_reason(code)

    def _fail(self, run: _Run, error: str) -> None:
        run.error = run.error or error
        if run.worker is not None:
            self._kill_worker(run.worker)
        else:
            self._kill(run)

    def _kill(self, run: _Run) -> None:
        """SIGKILL the run's process group (stopped members too). Only while its leader is unreaped,
        so the group id cannot belong to anyone else."""
        if run.process.returncode is None:
            try:
                os.killpg(run.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self, run: _Run) -> None:
        if run.channel is not None:
            self._selector.unregister(run.channel)
            if run.stdout_log is None:
                os.close(run.channel)
            else:
                run.process.stdout.close()
        if run.answers is not None:
            os.close(run.answers)
        if run.stdout_log is not None:
            run.stdout_log.close()
        self._selector.unregister(run.pidfd)
        os.close(run.pidfd)
        run.channel = run.answers = None
        self._live.remove(run)
        self._release(run.trial, run.slot)
        if run.trial.run is run:  # a new run may have begun while this one was being reaped
            run.trial.run = None

    def close(self) -> None:
        """Kill every trial's process group and release everything; pending events are dropped."""
        if self._closed:
            return
        self._closed = True
        for run in list(self._live):
            self._kill(run)
            run.process.wait()
            self._close(run)
        for trial in self._trials.values():
            trial.destination = None  # nothing starts any more
        for worker in [*self._workers.values(), *self._retiring]:
            self._kill_worker(worker)
            worker.process.wait()
            self._worker_exited(worker)
        self._events.clear()
        self._selector.close()
        os.close(self._wake_read)
        os.close(self._wake_write)


def _hermes_source() -> str | None:
    """The directory that makes this hermes importable in a trial, for a source checkout only: an
    installed hermes lives in site-packages, which must not leak into a trial's other interpreter."""
    root = Path(hermes.__file__).resolve().parent.parent
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: be killed if the executor's process dies (even by SIGKILL), so a
    crashed runner leaves no trial behind to race the one a restarted runner resumes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died between the fork and the prctl: no signal will come
        os._exit(1)


def _meminfo(field: str) -> int:
    """A line of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise HermesError(f"/proc/meminfo has no {field}")


def _resident_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _exit_reason(code: int) -> str:
    return f"exit code {code}" + (f" ({signal.Signals(-code).name})" if code < 0 else "")


def _tail(path: Path, offset: int) -> str:
    """The end of a log from ``offset`` on, for an error message."""
    with open(path, "rb") as log:
        log.seek(max(offset, log.seek(0, os.SEEK_END) - _STDERR_TAIL))
        return log.read().decode(errors="replace").strip()


def _wait_stopped(pid: int, patience: float = 5.0) -> bool:
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
