"""The local executor: trials on this machine's GPUs or CPU slots, under the execution contract.

Semantics follow the simulator (hermes/sim/executor.py): a cooperative trial suspends at its next
step boundary (its next report), and only then is it TrialSuspended, so its GPU is free. How a
trial runs is its launcher's business (``hermes.local.launchers``: warm workers, a process per
run, unmodified scripts); this facade keeps what is common: the trials and which slot each holds,
the report handshake (``hermes.local.handshake``), the switch timings, and the event loop
(``hermes.local.loop``). Everything runs in the engine's thread but ``wake``: a dying process is
seen at once through its pidfd and never leaves the executor waiting. Linux only.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import replace
from pathlib import Path

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
from hermes.errors import HOST_LIMIT_ERRNOS, STORAGE_LIMIT_ERRNOS, HermesError
from hermes.execution.contract import Executor
from hermes.local.guard import Guard
from hermes.local.launch import WARM_SWITCH_COST, TrialLaunch
from hermes.local.launchers import Launcher, ProcessLauncher, ScriptLauncher, WarmLauncher
from hermes.local.loop import EventLoop, checked_period, monotonic_clock
from hermes.local.resources import Slot, local_slots
from hermes.local.runs import LocalTrial, Run, SwitchTiming
from hermes.local.system import file_problem, meminfo, raise_open_file_limit, write_anew
from hermes.local.watchdog import TrialLimits, Watchdog
from hermes.trial import protocol
from hermes.trial.session import remove_checkpoints

SWITCHES_KEPT = 100_000  # the latest suspensions' timings a runner keeps (about 20 MB); it may run for days


class LocalExecutor(Executor[TrialLaunch]):
    """Runs trials as local processes; see the module docstring and docs/trials.md.

    ``directory`` holds ``trials/<trial_id>/`` (config, stdout.log, stderr.log, checkpoints and
    the trial's own outputs). ``metric`` names the objective among a cooperative trial's metrics (None: each
    report carries exactly one). ``period`` adds a PeriodElapsed every that many seconds.
    ``clock_offset`` continues the timeline of an experiment that is restarted.
    A trial parked in a warm worker is spilled to disk at once while the host has less than
    ``memory_reserve`` bytes available (default: a tenth of its memory); a worker whose resident
    memory exceeds ``worker_memory_limit`` bytes (default: the host's memory over the slots) is
    replaced once it runs nothing. ``limits``: when a trial counts as hung (``hermes.local.watchdog``);
    it is killed and fails.
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
        limits: TrialLimits | None = None,
    ) -> None:
        if not hasattr(os, "pidfd_open"):
            raise HermesError("the local executor needs Linux 5.3 or later (pidfd_open)")
        checked_period(period)
        raise_open_file_limit()
        if checkpoint_every < 0:
            raise HermesError(f"checkpoint_every must be 0 (off) or positive, got {checkpoint_every}")
        self.directory = Path(directory).resolve()
        self.slots = {slot.name: slot for slot in (slots if slots is not None else local_slots())}
        self.metric = metric
        self.checkpoint_every = checkpoint_every
        self.cwd = str(cwd or os.getcwd())
        self.switch_timings: deque[SwitchTiming] = deque(maxlen=SWITCHES_KEPT)  # for benchmarks; bounded for days
        self.profile = ExecutionProfile(switch_cost=WARM_SWITCH_COST)
        self._clock = monotonic_clock(clock_offset)
        self.watchdog = Watchdog(limits or TrialLimits())
        self.loop = EventLoop(period, self._clock, lambda gap: self.watchdog.paused(gap, self.now()))
        self.guard = Guard()
        total_memory = meminfo("MemTotal")
        self.launchers: dict[str, Launcher] = {
            "warm": WarmLauncher(
                self,
                memory_reserve=total_memory // 10 if memory_reserve is None else memory_reserve,
                worker_memory_limit=worker_memory_limit or total_memory // max(1, len(self.slots)),
            ),
            "process": ProcessLauncher(self),
            "script": ScriptLauncher(self),
        }
        self._trials: dict[str, LocalTrial] = {}
        self._occupied: dict[str, LocalTrial] = {}  # slot name -> the trial that holds it
        self._killed_done: dict[str, tuple[str, int | None]] = {}  # killed having lost nothing: why, suspended step
        self._closed = False
        nodes: dict[str, tuple[str, ...]] = {}
        for slot in self.slots.values():
            nodes[slot.node] = nodes.get(slot.node, ()) + (slot.name,)
        self._events: list[Event] = [NodeAdded(self.now(), node, gpus) for node, gpus in nodes.items()]

    # ------------------------------------------------------------------ the contract
    def now(self) -> float:
        return self._clock()

    def submit(
        self, trial_id: str, work: TrialLaunch, *, at: float | None = None, reported_step: int = 0
    ) -> TrialSubmitted:
        if not trial_id or trial_id.startswith(".") or not all(c.isalnum() or c in "._-" for c in trial_id):
            raise HermesError(f"trial id {trial_id!r} must be letters, digits, '.', '_' or '-'")
        if trial_id in self._trials:
            raise HermesError(f"trial {trial_id} submitted twice")
        if not self._trials or work.switch_cost > self.profile.switch_cost:
            self.profile = ExecutionProfile(switch_cost=work.switch_cost)  # the dearest of its trials
        self._trials[trial_id] = LocalTrial(
            trial_id=trial_id,
            launch=work,
            directory=Path(work.directory) if work.directory else self.directory / "trials" / trial_id,
            last_step=reported_step,
            checkpoint_step=reported_step,
        )
        return TrialSubmitted(self.now() if at is None else at, trial_id, work.budget, dict(work.config), work.movable)

    def apply(self, decision: Decision, at: float) -> None:
        trial = self._trials.get(decision.trial_id)
        if trial is None:
            raise HermesError(f"unknown trial {decision.trial_id}: submit it to the executor first")
        if isinstance(decision, Start):  # from scratch: forget any earlier attempt's checkpoints
            if trial.run is not None:
                raise HermesError(f"trial {trial.trial_id} already runs on {trial.run.slot.name}")
            remove_checkpoints(trial.directory / protocol.CHECKPOINTS_DIR)
            trial.last_step = trial.checkpoint_step = 0
            self.watchdog.started(trial.trial_id, self.now(), trial.launch.limits, trial.launch.ran)
            self._launch(trial, self._free_slot(trial, decision.gpu))
        elif isinstance(decision, Resume):
            self.watchdog.started(trial.trial_id, self.now(), trial.launch.limits, trial.launch.ran)
            self._resume(trial, decision)
        elif isinstance(decision, Suspend):
            self._suspend(trial)
        elif isinstance(decision, Stop):
            self._stop(trial)

    def settled(self, event: Event) -> None:
        """Answer the report that ``event`` is, now that the core has decided about it."""
        if not isinstance(event, TrialReported):
            return
        trial = self._trials.get(event.trial_id)
        run = trial.run if trial is not None else None
        if run is None:
            return
        answer = run.handshake.settle(event)
        if answer is None:
            return
        if answer == protocol.SUSPEND:
            trial.timing.suspend_delivered = self.now()
        self.watchdog.answered(trial.trial_id, self.now())
        self._launcher(trial).answer(run, answer)

    def next_events(self) -> list[Event]:
        """Wait until something happens or a wake; [] at once when nothing can report any more."""
        while not self._events:
            if not self._anything_reporting():
                return []
            woken = self.loop.wait(self.watchdog.deadline())
            self._kill_hung()
            if self.loop.tick():
                self._events.append(PeriodElapsed(self.now()))
            if woken:
                break
        events, self._events = self._events, []
        return events

    def idle(self) -> bool:
        return not self._events and not self._anything_reporting()

    def wake(self) -> None:
        self.loop.wake()

    def close(self) -> None:
        """Kill every trial's process group and release everything; pending events are dropped."""
        if self._closed:
            return
        self._closed = True
        for trial in self._trials.values():
            trial.destination = None  # nothing starts any more
        for launcher in self.launchers.values():
            launcher.close()
        self.guard.close()
        self._events.clear()
        self.loop.close()

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
            self.watchdog.stopped(holder.trial_id, self.now())
            holder.lost()
            if holder.destination is slot:
                holder.destination = None
        for launcher in self.launchers.values():
            launcher.lose_slot(slot)
        self._events.append(GpuRemoved(self.now(), gpu))

    def set_period(self, period: float | None) -> None:
        """Emit a PeriodElapsed every ``period`` seconds from now on (None: none), as ``period`` at construction."""
        self.loop.set_period(checked_period(period))

    def end_worker_group(self, group: str) -> list[str]:
        """End the warm workers of ``group`` (TrialLaunch.worker_group), whose trials have all ended, and forget
        those trials: a pool's experiment that ended, none of whose trials is decided about again. A server's pool
        runs thousands of experiments, and kept every trial of each (about a KB) for its life. Their events not
        yet taken go too (a stopped trial's last report, read as its worker ended): whoever took one would keep
        a trial forgotten here. Returns the trials forgotten, for a caller that keeps them too (a Ray node agent)."""
        self.launchers["warm"].end_group(group)
        ended = [trial_id for trial_id, trial in self._trials.items() if trial.launch.worker_group == group]
        for trial_id in ended:
            del self._trials[trial_id]
            self._killed_done.pop(trial_id, None)
            self.watchdog.stopped(trial_id, self.now(), ended=True)
        forgotten = set(ended)
        self._events = [event for event in self._events if getattr(event, "trial_id", None) not in forgotten]
        return ended

    def hand_over(self, trial_id: str) -> bool:
        """Let a suspended trial go to another executor (a Ray node agent's, on another node).

        True once nothing of it runs here: it is then forgotten, and its newest checkpoint in its
        directory is the caller's to carry. False while a trial parked in a warm worker is being
        spilled to that checkpoint: call again after ``next_events``. An unknown trial is True."""
        trial = self._trials.get(trial_id)
        if trial is None:
            return True
        run = trial.run
        if run is not None:
            if not (run.parked and run.worker is not None):
                raise HermesError(f"cannot hand over trial {trial_id}: it is not suspended with a checkpoint")
            self.launchers["warm"].spill(run)
            return False
        del self._trials[trial_id]
        self.watchdog.stopped(trial_id, self.now(), ended=True)  # what it runs elsewhere is counted there
        return True

    # ------------------------------------------------------------------ what launchers ask of it (launchers.Host)
    def metric_of(self, trial: LocalTrial) -> str | None:
        """The objective metric of ``trial``: its own setting, else the executor's."""
        return trial.launch.metric if trial.launch.metric is not None else self.metric

    def checkpoint_every_of(self, trial: LocalTrial) -> int:
        every = trial.launch.checkpoint_every
        return self.checkpoint_every if every is None else every

    def emit(self, event: Event) -> None:
        if isinstance(event, TrialExited) and event.trial_id in self._killed_done:
            event = self._lost_nothing(event)
        self._events.append(event)
        if isinstance(event, TrialReported):
            self.watchdog.reported(event.trial_id, event.at)
        elif isinstance(event, (TrialSuspended, TrialExited)):
            self.watchdog.stopped(event.trial_id, event.at, ended=isinstance(event, TrialExited))
            trial = self._trials[event.trial_id]
            if isinstance(event, TrialSuspended):  # the core falls back to this step from now on, as here: a
                trial.checkpoint_step = event.step  # parked trial's state lost later is caught up to it silently
            elif event.crashed:
                trial.lost()  # the core may run it again from its checkpoint

    def occupy(self, slot: Slot, trial: LocalTrial) -> None:
        self._occupied[slot.name] = trial

    def release(self, trial: LocalTrial, slot: Slot) -> None:
        if self._occupied.get(slot.name) is trial and trial.destination is not slot:
            del self._occupied[slot.name]

    def stay(self, trial: LocalTrial) -> None:
        """A move that failed (its spill raised): the trial does not start where it was to resume, and the
        slot held for it there is free again; its end is reported as a crash of the run the core resumed."""
        if trial.destination is not None:
            self._occupied.pop(trial.destination.name, None)
            trial.destination = None

    def forget(self, run: Run) -> None:
        trial = run.trial
        self.release(trial, run.slot)
        if trial.run is run:  # a new run may have begun while this one was ending
            trial.run = None
        if trial.destination is not None:
            destination, trial.destination = trial.destination, None
            self._launch(trial, destination)

    def report(self, run: Run, step: int, metrics: dict[str, float], checkpointed: bool) -> None:
        answer, event = run.handshake.report(step, metrics, checkpointed, self.now(), self.metric_of(run.trial))
        if answer is not None:
            self.watchdog.reported(run.trial.trial_id, self.now())  # a step caught up is a step too
            self._launcher(run.trial).answer(run, answer)
        else:
            self.emit(event)
            self.watchdog.awaiting(run.trial.trial_id, event.at)
            self.note_report(run.trial)

    def note_report(self, trial: LocalTrial) -> None:
        """A new report: the end of a resume, if one was being timed."""
        timing = trial.timing
        if timing is not None and timing.resume_decided is not None and timing.resumed is None:
            timing.resumed = self.now()

    def fail(self, run: Run, error: str) -> None:
        run.error = run.error or error
        self._launcher(run.trial).kill(run)

    # ------------------------------------------------------------------ decisions
    def _launcher(self, trial: LocalTrial) -> Launcher:
        launch = trial.launch
        return self.launchers["warm" if launch.in_worker else "process" if launch.cooperative else "script"]

    def _launch(self, trial: LocalTrial, slot: Slot) -> None:
        """Run the trial on ``slot`` (free, or held for it). A trial whose folder cannot be made (a file or a link
        loop where it goes), or whose config cannot be written (a FIFO or a folder where it goes), fails alone: the
        error stopped the executor, and a FIFO's open waited for a reader, in a pool every user's experiments."""
        try:
            trial.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._not_launched(trial, slot, error, f"cannot make its folder: {error.strerror}")
            return
        try:
            write_anew(trial.directory / protocol.CONFIG_FILE, json.dumps(dict(trial.launch.config)).encode())
        except OSError as error:
            self._not_launched(trial, slot, error, f"cannot write its config: {file_problem(error)}")
            return
        self.occupy(slot, trial)
        self._launcher(trial).launch(trial, slot)

    def _not_launched(self, trial: LocalTrial, slot: Slot, error: OSError, why: str) -> None:
        """The trial's files could not be made: it fails alone, for ``why``; a full disk or a host limit is the
        host's, not the trial's, and raised."""
        if error.errno in HOST_LIMIT_ERRNOS | STORAGE_LIMIT_ERRNOS:
            raise error
        self.release(trial, slot)
        self.emit(TrialExited(self.now(), trial.trial_id, False, why))

    def _free_slot(self, trial: LocalTrial, gpu: str) -> Slot:
        slot = self.slots.get(gpu)
        if slot is None:
            raise HermesError(f"unknown GPU {gpu}; this executor has {', '.join(self.slots)}")
        holder = self._occupied.get(gpu)
        if holder is not None and holder is not trial:
            raise HermesError(f"cannot run trial {trial.trial_id} on {gpu}: trial {holder.trial_id} holds it")
        return slot

    def _suspend(self, trial: LocalTrial) -> None:
        run = trial.run
        if run is None:  # it ended: its exit came in the batch of events that made the core suspend it
            return
        if run.paused or run.parked:
            raise HermesError(f"cannot suspend trial {trial.trial_id}: it is not running")
        trial.timing = SwitchTiming(trial.trial_id, self.now())
        self.switch_timings.append(trial.timing)
        self._launcher(trial).suspend(run)

    def _resume(self, trial: LocalTrial, decision: Resume) -> None:
        if trial.timing is not None and trial.timing.resume_decided is None:
            trial.timing.resume_decided = self.now()
            trial.timing.migrated = decision.migrated
        slot = self._free_slot(trial, decision.gpu)
        self.occupy(slot, trial)
        if trial.run is None:  # from its checkpoint; an unmodified program, whose stopped process died
            self._launch(trial, slot)  # with an earlier runner or its GPU, from its beginning (catching up)
        else:
            self._launcher(trial).resume(trial, slot)

    def _stop(self, trial: LocalTrial) -> None:
        run = trial.run
        if trial.destination is not None:  # it was moving: it stays where it is, and ends there
            self.stay(trial)
            if run is not None:  # still spilling: the core counts it as resumed, so its end is said once it has
                run.handshake.stop_requested = True
                return
        if run is None:
            return  # suspended with its checkpoint, or never started: nothing runs
        self._launcher(trial).stop(run)

    def _kill_hung(self) -> None:
        """Kill the trials the watchdog finds past a limit: each ends as failed, saying which, but one that reported
        its budget's last step or committed its suspension, which was only slow to exit (``_lost_nothing``)."""
        for trial_id, reason in self.watchdog.overdue(self.now()):
            trial = self._trials[trial_id]
            run = trial.run
            if run is not None and run.reporting and run.error is None:
                if run.suspended_step is not None or trial.last_step >= trial.launch.budget:
                    self._killed_done[trial_id] = (reason, run.suspended_step)
                self.fail(run, reason)

    def _lost_nothing(self, event: TrialExited) -> Event:
        """The end of a trial killed after its budget's last step: the crash after its last step that the core
        counts as completed (as Ray Tune ends a trial at its last iteration); after committing its suspension: that
        suspension. Ended otherwise meanwhile (stopped, say), as it ended."""
        reason, suspended_step = self._killed_done.pop(event.trial_id)
        if event.error != reason:
            return event
        if suspended_step is None:
            return replace(event, crashed=True)
        timing = self._trials[event.trial_id].timing
        if timing is not None:
            timing.suspended = event.at
        return TrialSuspended(event.at, event.trial_id, suspended_step)

    def _anything_reporting(self) -> bool:
        return any(run.reporting for launcher in self.launchers.values() for run in launcher.runs())
