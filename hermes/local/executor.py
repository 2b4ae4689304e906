"""The local executor: one process per trial on this machine's GPUs or CPU slots.

Semantics follow the simulator (hermes/sim/executor.py): a cooperative trial suspends at its next
step boundary (its next report), checkpoints and exits, and only then is it TrialSuspended, so
its GPU is free; it resumes, anywhere, by starting a new process that restores the checkpoint.
An unmodified program is suspended at once with SIGSTOP and resumed with SIGCONT on its own GPU.

Everything runs in the engine's thread: ``next_events`` waits with one selector on every trial's
channel (or stdout) and on a pidfd per process, so a dying trial is seen at once and never
leaves the executor waiting. Linux only (pidfd, /proc, sched_setaffinity).
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping

import hermes
from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import Event, PeriodElapsed, TrialExited, TrialReported, TrialSubmitted, TrialSuspended
from hermes.engine import Executor
from hermes.errors import HermesError
from hermes.local.launch import TrialLaunch
from hermes.local.resources import Slot, local_slots
from hermes.trial import protocol

_CHANNEL, _EXIT = 0, 1  # what a selector key watches; channels are read before exits
_PR_SET_PDEATHSIG = 1  # prctl option, from <linux/prctl.h>
_STDERR_TAIL = 2000  # characters of stderr quoted in a crashed trial's error


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
    last_step: int = 0
    run: _Run | None = None
    timing: SwitchTiming | None = None  # the switch in progress


@dataclass(slots=True, eq=False)
class _Run:
    """One process of a trial, from launch until it is reaped."""

    trial: _Trial
    slot: Slot
    process: subprocess.Popen[bytes]
    pidfd: int
    channel: int | None  # read end of its messages (cooperative) or of its stdout (unmodified)
    answers: int | None  # write end of the answers to its reports (cooperative)
    stdout_log: IO[bytes] | None  # unmodified: its stdout is copied here
    stderr_offset: int  # where this run's stderr starts in stderr.log
    buffer: bytes = b""  # a partial line
    awaiting: TrialReported | None = None  # its report that waits for an answer
    suspend_requested: bool = False
    stop_requested: bool = False
    suspended_step: int | None = None  # its checkpoint of this step is committed
    paused: bool = False  # SIGSTOPped
    silent: bool = False  # stopped while paused: the core expects no event
    error: str | None = None  # why the executor killed it

    @property
    def reporting(self) -> bool:
        """Whether an event from this process may still come."""
        return not self.paused and not self.silent


class LocalExecutor(Executor):
    """Runs trials as local processes; see the module docstring and docs/trials.md.

    ``directory`` holds ``trials/<trial_id>/`` (config, stdout.log, stderr.log, checkpoints and
    the trial's own outputs). ``metric`` names the objective among a cooperative trial's metrics (None: each
    report carries exactly one). ``period`` adds a PeriodElapsed every that many seconds.
    ``clock_offset`` continues the timeline of an experiment that is restarted.
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
        self.switch_timings: list[SwitchTiming] = []
        # Every metric of each report, beyond the objective the event carries, until a listener pops it.
        self.reported_metrics: dict[tuple[str, int], dict[str, float]] = {}
        self._started = time.monotonic() - clock_offset
        self._next_period = self.now() + period if period is not None else None
        self._trials: dict[str, _Trial] = {}
        self._live: list[_Run] = []  # processes not yet reaped
        self._occupied: dict[str, _Run] = {}  # slot name -> the run using it
        self._events: list[Event] = []
        self._selector = selectors.DefaultSelector()

    @property
    def resources(self) -> dict[str, tuple[str, ...]]:
        """Node -> its GPU (slot) names, for NodeAdded."""
        nodes: dict[str, tuple[str, ...]] = {}
        for slot in self.slots.values():
            nodes[slot.node] = nodes.get(slot.node, ()) + (slot.name,)
        return nodes

    def now(self) -> float:
        return time.monotonic() - self._started

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
        self._trials[trial_id] = _Trial(trial_id, launch, self.directory / "trials" / trial_id, reported_step)
        return TrialSubmitted(
            self.now() if at is None else at, trial_id, launch.budget, dict(launch.config), launch.movable
        )

    # ------------------------------------------------------------------ decisions in
    def apply(self, decision: Decision, at: float) -> None:
        trial = self._trials.get(decision.trial_id)
        if trial is None:
            raise HermesError(f"unknown trial {decision.trial_id}: submit it to the executor first")
        if isinstance(decision, Start):  # from scratch: forget any earlier attempt's checkpoints
            shutil.rmtree(trial.directory / protocol.CHECKPOINTS_DIR, ignore_errors=True)
            trial.last_step = 0
            self._launch(trial, decision.gpu)
        elif isinstance(decision, Resume):
            self._resume(trial, decision)
        elif isinstance(decision, Suspend):
            self._suspend(trial)
        elif isinstance(decision, Stop):
            self._stop(trial)

    def _launch(self, trial: _Trial, gpu: str) -> None:
        slot = self._free_slot(trial, gpu)
        if trial.run is not None:
            raise HermesError(f"trial {trial.trial_id} already has a process on {trial.run.slot.name}")
        launch = trial.launch
        trial.directory.mkdir(parents=True, exist_ok=True)
        (trial.directory / protocol.CONFIG_FILE).write_text(json.dumps(dict(launch.config)))
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
        self._occupied[slot.name] = run
        self._live.append(run)
        trial.run = run

    def _free_slot(self, trial: _Trial, gpu: str) -> Slot:
        slot = self.slots.get(gpu)
        if slot is None:
            raise HermesError(f"unknown GPU {gpu}; this executor has {', '.join(self.slots)}")
        holder = self._occupied.get(gpu)
        if holder is not None:
            raise HermesError(f"cannot run trial {trial.trial_id} on {gpu}: trial {holder.trial.trial_id} holds it")
        return slot

    def _environment(self, trial: _Trial, slot: Slot) -> dict[str, str]:
        threads = str(slot.threads)
        python_path = [path for path in (_hermes_source(), os.environ.get("PYTHONPATH")) if path]
        return {
            **os.environ,
            **trial.launch.env,
            protocol.ENV_TRIAL_ID: trial.trial_id,
            protocol.ENV_TRIAL_DIR: str(trial.directory),
            protocol.ENV_BUDGET: str(trial.launch.budget),
            protocol.ENV_METRIC: self.metric or "",
            protocol.ENV_CHECKPOINT_EVERY: str(self.checkpoint_every),
            protocol.ENV_REPORTED_STEP: str(trial.last_step),
            protocol.ENV_THREADS: threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "CUDA_VISIBLE_DEVICES": slot.visible_devices,
            "PYTHONUNBUFFERED": "1",  # an unmodified Python script's metrics arrive as it prints them
            "PYTHONPATH": os.pathsep.join(python_path),
        }

    def _suspend(self, trial: _Trial) -> None:
        run = trial.run
        if run is None or run.paused:
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
        del self._occupied[run.slot.name]
        trial.timing.suspended = self.now()
        self._events.append(TrialSuspended(trial.timing.suspended, trial.trial_id, trial.last_step))

    def _resume(self, trial: _Trial, decision: Resume) -> None:
        if trial.timing is not None and trial.timing.resume_decided is None:
            trial.timing.resume_decided = self.now()
            trial.timing.migrated = decision.migrated
        if trial.launch.cooperative:
            self._launch(trial, decision.gpu)
            return
        run = trial.run
        if run is None:  # e.g. the executor was restarted: the stopped process died with it
            self._events.append(TrialExited(self.now(), trial.trial_id, False, "its stopped process is gone"))
            return
        if decision.gpu != run.slot.name:
            raise HermesError(f"unmodified trial {trial.trial_id} cannot move from {run.slot.name} to {decision.gpu}")
        self._occupied[self._free_slot(trial, decision.gpu).name] = run
        run.paused = False
        try:
            os.killpg(run.process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed while stopped; its exit is reported as usual

    def _stop(self, trial: _Trial) -> None:
        run = trial.run
        if run is None:
            return  # suspended with its checkpoint, or never started: nothing runs
        if run.paused:
            run.silent = True  # the core already counts it as stopped
            self._kill(run)
            return
        run.stop_requested = True
        if run.awaiting is None:
            self._kill(run)
        # else: it is answered "stop" once its report is settled, and exits cleanly

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
            if not any(run.reporting for run in self._live):
                return []
            timeout = None if self._next_period is None else max(0.0, self._next_period - self.now())
            ready = self._selector.select(timeout)
            for key, _ in sorted(ready, key=lambda item: item[0].data[1]):
                run, kind = key.data
                if kind == _CHANNEL and run.channel is not None:
                    self._read(run)
                elif kind == _EXIT:
                    self._reap(run)
            if self._next_period is not None and self.now() >= self._next_period:
                self._events.append(PeriodElapsed(self.now()))
                while self._next_period <= self.now():
                    self._next_period += self.period
        events, self._events = self._events, []
        return events

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
            run.awaiting = self._report(run, int(message["step"]), value, metrics, bool(message["checkpointed"]))
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
        event = TrialReported(self.now(), trial.trial_id, step, value, checkpointed)
        self._events.append(event)
        self.reported_metrics[(trial.trial_id, step)] = dict(metrics)
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
        reason = f"exit code {code}"
        if code < 0:
            reason += f" ({signal.Signals(-code).name})"
        with open(run.trial.directory / "stderr.log", "rb") as log:
            log.seek(max(run.stderr_offset, log.seek(0, os.SEEK_END) - _STDERR_TAIL))
            tail = log.read().decode(errors="replace").strip()
        return f"{reason}: {tail}" if tail else reason

    def _fail(self, run: _Run, error: str) -> None:
        run.error = run.error or error
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
        if self._occupied.get(run.slot.name) is run:
            del self._occupied[run.slot.name]
        run.trial.run = None

    def shutdown(self) -> None:
        """Kill every trial's process group and release everything; pending events are dropped."""
        for run in list(self._live):
            self._kill(run)
            run.process.wait()
            self._close(run)
        self._events.clear()
        self._selector.close()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


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
