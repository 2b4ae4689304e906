"""Warm workers: each slot keeps one process (hermes/local/worker.py) that runs its function trials in turn.

The worker imports the trial's module (and torch) once; a trial runs in a thread of it. Trials of one
``worker_group`` share a slot's worker (a pool runs a group per experiment, ended with it). Suspended,
the trial *parks* there with its state in memory and resumes on that slot from memory. To resume on
another slot it first writes a checkpoint (a *spill*); it is spilled too when the host runs short
of memory, and its worker is replaced when the worker outgrows its memory limit. A worker that dies
fails only the trial it was running; the trials parked in it fall back to their last checkpoints
and silently catch up to the step the core knows.
"""

from __future__ import annotations

import errno
import functools
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.core.events import TrialExited, TrialSuspended
from hermes.errors import HOST_LIMIT_ERRNOS, STORAGE_LIMIT_ERRNOS, NoSpaceError
from hermes.local.handshake import Handshake
from hermes.local.launchers.base import (
    WORKER_CHANNEL,
    WORKER_EXIT,
    Launcher,
    driver_script,
)
from hermes.local.resources import Slot
from hermes.local.runs import LocalTrial, Run
from hermes.local.system import (
    exit_reason,
    file_problem,
    meminfo,
    new_run_tag,
    open_logs,
    prepare_child,
    resident_bytes,
    signal_run,
    slot_environment,
    tail,
)
from hermes.trial import protocol


@dataclass(slots=True, eq=False)
class Worker:
    """A warm worker process: runs one slot's function trials in turn."""

    slot: Slot
    group: str | None  # the trials' TrialLaunch.worker_group
    process: subprocess.Popen[bytes]
    pidfd: int
    channel: int | None  # read end of its messages
    log: Path  # its own stdout and stderr, after those of the slot's workers before it
    log_start: int  # where its own output starts in the log
    tag: str  # in its environment, and so its children's (hermes.local.guard.RUN_TAG)
    runs: dict[str, Run] = field(default_factory=dict)  # trial id -> its run in here: live, parked or ending
    buffer: bytes = b""
    retiring: bool = False  # over its memory limit: spill what it holds, then end it


class WarmLauncher(Launcher):
    """``memory_reserve``: bytes of host memory below which a parked trial is spilled at once;
    ``worker_memory_limit``: resident bytes above which a worker is replaced once it runs nothing (measured when one
    of its trials parks or ends)."""

    def __init__(self, host: Any, memory_reserve: int, worker_memory_limit: int) -> None:
        super().__init__(host)
        self.memory_reserve = memory_reserve
        self.worker_memory_limit = worker_memory_limit
        self._workers: dict[tuple[str, str | None], Worker] = {}  # (slot name, group) -> its warm worker
        # (a retiring one is not here)
        self._retiring: list[Worker] = []
        self._closing = False  # the run stops: an end that would stop it again is dropped (``_ended``)

    # ------------------------------------------------------------------ decisions
    def launch(self, trial: LocalTrial, slot: Slot) -> None:
        launch = trial.launch
        group = launch.worker_group
        try:  # made here, so that one that is no regular file fails the trial: the worker's open of a FIFO waits
            stdout_log, stderr_log = open_logs(trial.directory)
        except OSError as error:
            if error.errno in HOST_LIMIT_ERRNOS | STORAGE_LIMIT_ERRNOS:
                raise
            self.host.release(trial, slot)
            self.host.emit(TrialExited(self.host.now(), trial.trial_id, False,
                                       f"cannot open its log: {file_problem(error)}"))
            return
        with stdout_log, stderr_log:
            offset = os.fstat(stderr_log.fileno()).st_size
        # Every slot's worker warms up while this one starts; a group's (a pool's experiment, which may
        # hold few of the slots) only where it runs, so it takes no memory, nor a CUDA context, elsewhere.
        for other in self.host.slots.values() if group is None else [slot]:
            if (other.name, group) not in self._workers:
                try:
                    self._spawn(other, group, launch.function, launch.cwd)
                except OSError as error:  # its workdir gone, say: the trial's, not the executor's
                    if error.errno in HOST_LIMIT_ERRNOS:
                        raise
                    if other is slot:
                        self.host.release(trial, slot)
                        self.host.emit(TrialExited(self.host.now(), trial.trial_id, False,
                                                   f"cannot start its warm worker: {error}"))
                        return
        worker = self._workers[slot.name, group]
        run = Run(trial, slot, Handshake(trial), stderr_offset=offset, worker=worker)
        trial.run = worker.runs[trial.trial_id] = run
        self._command(
            worker,
            {
                "op": protocol.START,
                "trial": trial.trial_id,
                "function": launch.function,
                "directory": str(trial.directory),
                "budget": launch.budget,
                "metric": self.host.metric_of(trial) or "",
                "checkpoint_every": self.host.checkpoint_every_of(trial),
                "reported_step": trial.last_step,
            },
        )

    def suspend(self, run: Run) -> None:
        run.handshake.suspend_requested = True  # told when its next report is answered

    def resume(self, trial: LocalTrial, slot: Slot) -> None:
        run = trial.run
        if run is None:  # it was spilled, or its worker died: from its checkpoint
            self.launch(trial, slot)
        elif run.worker.slot is slot and not (run.spilling or run.worker.retiring):
            run.parked = run.handshake.suspend_requested = False  # on its own slot: straight on from memory
            self._say(run, protocol.RESUME)
        else:  # elsewhere: spill it to disk there, then start it here
            trial.destination = slot
            self.spill(run)

    def stop(self, run: Run) -> None:
        if run.parked:
            run.silent = True  # the core already counts it as stopped
            if not run.spilling:
                self._say(run, protocol.STOP)
        else:
            run.handshake.stop_requested = True  # answered "stop" at the report it waits on, or at its next one
        if _only_stopped(run.worker):
            self._kill(run.worker)  # it ends now, not at its next report; the slot's next trial starts a new one

    def answer(self, run: Run, word: str) -> None:
        self._say(run, word)

    def kill(self, run: Run) -> None:
        self._kill(run.worker)

    @staticmethod
    def _kill(worker: Worker) -> None:
        signal_run(worker.process.pid, worker.process.returncode, worker.tag)

    def runs(self) -> list[Run]:
        return [run for worker in [*self._workers.values(), *self._retiring] for run in worker.runs.values()]

    def lose_slot(self, slot: Slot) -> None:
        for worker in [worker for worker in self._workers.values() if worker.slot is slot]:
            for run in worker.runs.values():
                run.silent = run.silent or not run.parked
            self._end(worker)

    def end_group(self, group: str) -> None:
        """End the workers of ``group`` (a pool's experiment that ended): what they still hold goes unsaid. Then their
        logs go where empty (nearly always): a server's pool kept one per experiment and slot for its life. One with
        output stays: it may tell of a crash. Only once every worker of the group, ended here or before, has exited (one
        still exiting, or a retiring one's successor, may write to a log it shares) and none starts again. Every log of
        the group's name goes, not only those of workers started here: a server killed while the experiment ran left
        those of slots it never uses again (a GPU taken out, say). The ``-`` keeps ``e1`` from taking ``e10``'s."""
        for worker in [*self._workers.values(), *self._retiring]:
            if worker.group == group:
                for run in worker.runs.values():
                    run.silent = True
                self._end(worker)
        for log in (self.host.directory / "workers").glob(f"{glob.escape(group)}-*.log"):
            try:
                if log.stat().st_size == 0:
                    log.unlink()
            except FileNotFoundError:
                pass  # removed by hand

    def close(self) -> None:
        self._closing = True
        for worker in [*self._workers.values(), *self._retiring]:
            self._end(worker)

    # ------------------------------------------------------------------ workers
    def _spawn(self, slot: Slot, group: str | None, function: str, cwd: str | None) -> Worker:
        """Start the slot's warm worker; it imports the trial's module while the command waits in its stdin."""
        host = self.host
        name = slot.name.replace("/", "-") if group is None else f"{group}-{slot.name.replace('/', '-')}"
        log = host.directory / "workers" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        messages_read, messages_write = os.pipe()
        tag = new_run_tag()
        env = {
            **slot_environment(slot, tag),
            protocol.ENV_WORKER_CHANNEL: str(messages_write),
            protocol.ENV_WORKER_OF: str(host.directory),
        }
        try:
            with open(log, "ab") as output:
                log_start = output.tell()
                process = subprocess.Popen(
                    [sys.executable, "-m", "hermes.local.worker", function.partition(":")[0], *driver_script()],
                    cwd=cwd or host.cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=output,
                    stderr=output,
                    pass_fds=(messages_write,),
                    start_new_session=True,
                    preexec_fn=functools.partial(prepare_child, os.getpid(), slot.cpus),
                )
        except OSError:
            os.close(messages_read)
            raise
        finally:
            os.close(messages_write)
        host.guard.watch(process.pid, tag)
        os.set_blocking(messages_read, False)
        worker = Worker(slot, group, process, os.pidfd_open(process.pid), messages_read, log, log_start, tag)
        host.loop.register(messages_read, WORKER_CHANNEL, self._drain, worker)
        host.loop.register(worker.pidfd, WORKER_EXIT, self._exited, worker)
        self._workers[slot.name, group] = worker
        return worker

    def _command(self, worker: Worker, command: dict[str, Any]) -> None:
        try:
            worker.process.stdin.write((json.dumps(command) + "\n").encode())
            worker.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died; its exit is on its way

    def _say(self, run: Run, word: str) -> None:
        self._command(run.worker, {"op": protocol.SAY, "trial": run.trial.trial_id, "word": word})

    def spill(self, run: Run) -> None:
        """Have a parked trial write its checkpoint and end, to resume from disk (here or on another node)."""
        if not run.spilling:
            run.spilling = True
            self._say(run, protocol.SPILL)

    def _message(self, worker: Worker, message: dict[str, Any]) -> None:
        run = worker.runs[message["trial"]]
        kind = message["type"]
        if kind == protocol.PARKED:
            self._parked(run, int(message["step"]))
        elif kind == protocol.ENDED:
            self._ended(run, message["outcome"], message.get("error"))
        elif kind == protocol.REPORT:
            metrics = {str(name): float(value) for name, value in message["metrics"].items()}
            self.host.report(run, int(message["step"]), metrics, bool(message["checkpointed"]))
        elif kind == protocol.SUSPENDED:
            run.suspended_step = int(message["step"])
        else:
            raise ValueError(f"unknown message type {kind!r}")

    def _parked(self, run: Run, step: int) -> None:
        """The trial suspended into memory: its slot is free. Spill it if memory is short; end it if it was stopped."""
        trial, worker, host = run.trial, run.worker, self.host
        run.parked = True
        host.release(trial, run.slot)
        trial.timing.suspended = host.now()
        host.emit(TrialSuspended(trial.timing.suspended, trial.trial_id, step))
        if run.handshake.stop_requested:  # stopped while it suspended: the core counts it as stopped from here on
            self.stop(run)
        elif self._outgrown(worker):
            self._retire(worker)
        elif meminfo("MemAvailable") < self.memory_reserve:
            self.spill(run)

    def _outgrown(self, worker: Worker) -> bool:
        """Whether ``worker``, the live one of its slot, holds more than ``worker_memory_limit``: measured when a trial
        parks or ends in it (a worker whose trials only end would outgrow it unseen)."""
        live = self._workers.get((worker.slot.name, worker.group)) is worker  # not retiring, not collected
        return live and resident_bytes(worker.process.pid) > self.worker_memory_limit

    def _retire(self, worker: Worker) -> None:
        """Replace a worker that grew too big: spill its parked trials, end it once it holds none."""
        if worker.retiring:
            return
        worker.retiring = True
        del self._workers[worker.slot.name, worker.group]
        self._retiring.append(worker)
        for run in worker.runs.values():
            if run.parked:
                self.spill(run)
        self._end_retired(worker)

    def _end_retired(self, worker: Worker) -> None:
        if worker.retiring and not worker.runs:
            self._kill(worker)

    def _ended(self, run: Run, outcome: str, error: str | None) -> None:
        """A worker's trial thread returned: report how, or start it where it is to resume."""
        trial, worker, host = run.trial, run.worker, self.host
        del worker.runs[trial.trial_id]
        if run.spilling and outcome != protocol.SUSPENDED:  # its spill failed: it cannot move where it resumes
            host.stay(trial)
        host.forget(run)
        now = host.now()
        if run.silent:
            pass
        elif outcome == protocol.SUSPENDED and run.spilling and not run.handshake.stop_requested:
            pass  # on disk now, as the core believes it suspended (or resumed elsewhere, where it starts now)
        elif run.handshake.stop_requested:
            host.emit(TrialExited(now, trial.trial_id, False, "stopped"))
        elif run.error is not None:
            host.emit(TrialExited(now, trial.trial_id, False, run.error))
        elif outcome in (protocol.NO_SPACE, protocol.HOST_LIMIT) and self._closing:
            pass  # said as the run stops (for this very limit, often): a rerun continues it; the close goes on
        elif outcome == protocol.NO_SPACE:
            raise NoSpaceError(f"trial {trial.trial_id}: {error}")
        elif outcome == protocol.HOST_LIMIT:  # as a fork that fails for it: the run stops, and a rerun continues it
            raise OSError(errno.EAGAIN, f"trial {trial.trial_id}: {error}")
        elif outcome == protocol.OK:
            host.emit(TrialExited(now, trial.trial_id, True))
        elif outcome == protocol.MISUSED:  # it would fail the same way run again: no crash to run again
            host.emit(TrialExited(now, trial.trial_id, False, error))
        else:
            log = tail(trial.directory / "stderr.log", run.stderr_offset)
            reason = error or f"the trial ended: {outcome}"
            host.emit(TrialExited(now, trial.trial_id, False, f"{reason}: {log}" if log else reason, crashed=True))
        if self._outgrown(worker):
            self._retire(worker)
        else:
            self._end_retired(worker)

    def _end(self, worker: Worker) -> None:
        """Kill the worker and collect it now."""
        self._kill(worker)
        worker.process.wait()
        self._exited(worker)

    def _exited(self, worker: Worker) -> None:
        """The worker died: fail the trial it was running; the parked ones go back to their checkpoints."""
        if worker.pidfd < 0:
            return  # collected already, in the same wait
        self._kill(worker)  # leftover children
        code = worker.process.wait()
        self.host.guard.forget(worker.process.pid)  # collected: its group id may be anyone's now
        if self._workers.get((worker.slot.name, worker.group)) is worker:
            del self._workers[worker.slot.name, worker.group]
        if worker in self._retiring:
            self._retiring.remove(worker)
        self._drain(worker)  # what it said before it died (a trial may have ended)
        loop, host = self.host.loop, self.host
        loop.unregister(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = -1
        if worker.channel is not None:
            loop.unregister(worker.channel)
            os.close(worker.channel)
            worker.channel = None
        try:
            worker.process.stdin.close()
        except BrokenPipeError:
            pass  # commands it never read: it is dead
        for run in list(worker.runs.values()):
            del worker.runs[run.trial.trial_id]
            if run.handshake.stop_requested and not run.silent:
                host.emit(TrialExited(host.now(), run.trial.trial_id, False, "stopped"))
            elif not (run.parked or run.silent):
                said = tail(worker.log, worker.log_start)
                reason = run.error or f"its worker died, {exit_reason(code)}" + (f": {said}" if said else "")
                host.emit(TrialExited(host.now(), run.trial.trial_id, False, reason, crashed=run.error is None))
            host.forget(run)

    def _drain(self, worker: Worker) -> None:
        while worker.channel is not None:
            try:
                chunk = os.read(worker.channel, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._lines(worker, chunk)

    def _lines(self, worker: Worker, chunk: bytes) -> None:
        *lines, worker.buffer = (worker.buffer + chunk).split(b"\n")
        for line in lines:
            try:
                self._message(worker, json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                for run in worker.runs.values():  # a broken worker fails the trial it was running
                    if not run.parked:
                        run.error = run.error or f"protocol error: {error!r}"
                self._kill(worker)
                return


def _only_stopped(worker: Worker) -> bool:
    """Whether killing ``worker`` ends a stopped trial now, in the middle of its step, and loses nothing: one of its
    runs computes with a stop requested (no report of it waits for an answer, which would end it cleanly), and every
    other run it holds is stopped too and writes no checkpoint. A parked trial that lives on keeps the worker: the
    stopped one is answered "stop" at its next report instead."""
    runs = worker.runs.values()
    computing = any(run.handshake.stop_requested and not run.parked and run.handshake.awaiting is None for run in runs)
    return computing and all(
        (run.silent and not run.spilling) or (run.handshake.stop_requested and not run.parked) for run in runs
    )
