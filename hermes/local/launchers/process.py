"""A process per run: cooperative trials (``hermes.trial``) and unmodified scripts.

A cooperative process talks over two pipes (its reports out, the answers in); suspended, it
checkpoints and exits, and resumes as a new process anywhere. An unmodified program's metrics are
read from its stdout and stderr with the launch's regex; suspended, its process group is SIGSTOPped, and it
resumes with SIGCONT on its own slot. Each process has its own group, so suspend and kill reach
its children too, and a pidfd, so its exit is seen at once.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from re import _constants, _parser
from typing import Any

import regex

from hermes.core.events import TrialExited, TrialSuspended
from hermes.errors import HOST_LIMIT_ERRNOS, NO_SPACE_ERRNOS, STORAGE_LIMIT_ERRNOS, HermesError, NoSpaceError
from hermes.local.launchers.base import CHANNEL, EXIT, Launcher, driver_script
from hermes.local.resources import Slot
from hermes.local.handshake import Handshake
from hermes.local.watchdog import SUSPENSION_COMMITTED, TOLD_TO_STOP
from hermes.local.runs import LocalTrial, Output, Run
from hermes.local.system import (
    exit_reason,
    file_problem,
    new_run_tag,
    open_logs,
    open_regular,
    prepare_child,
    signal_run,
    slot_environment,
    tail,
    wait_stopped,
)
from hermes.trial import protocol

MAX_LINE = 1 << 20  # bytes of a line kept: of a longer one (a progress bar drawn without \r or \n), the last ones
# characters at the end of a line that trial.metrics_regex searches: a search's time grows with the square, or a higher
# power, of what it searches for many patterns, and the runner waits for it (a 60 KB line of progress dots took 19 s
# with .*?x; a pattern led by one repeat is tried once, ``_search``); a line of metrics is shorter, per-class lists
# and ids of misclassified samples included (1,024 cut those, and a later class's accuracy was read as the epoch's)
SEARCHED = 16_384
# seconds that searching one line with trial.metrics_regex may take: a sane pattern takes milliseconds, or a second
# at most where it is quadratic on SEARCHED characters (.*?(?P<step>\d+)/3 on a line of digits: 0.8 s here, past 1 s
# on a loaded machine); one that backtracks without end ((a|a)+ on a line of 40 a's) is stopped there and its trial
# fails, where re held the GIL for hours and froze the runner, or a server's API for every user
SEARCH_LIMIT = 2.0
_GLOBAL_FLAGS = re.compile(r"(?:\(\?[aiLmsux]+\))*")  # a pattern's leading flags: (?i), (?x)(?a)
_CATEGORIES = {  # a class's categories as a pattern writes them
    _constants.CATEGORY_DIGIT: r"\d", _constants.CATEGORY_NOT_DIGIT: r"\D",
    _constants.CATEGORY_SPACE: r"\s", _constants.CATEGORY_NOT_SPACE: r"\S",
    _constants.CATEGORY_WORD: r"\w", _constants.CATEGORY_NOT_WORD: r"\W",
}
_SEGMENT = re.compile(rb"[^\r\n]*[\r\n]")  # a segment of output with the byte that ends it
# a group's pattern that reads a whole number as Python prints it: 1e-05, nan, -inf; not a sentence's last point (0.25.)
NUMBER = r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)\b)"
GROUPED_NUMBER = r"[-+]?[\d,.]*\d(?:[eE][-+]?\d+)?"  # ...and one with thousands separators: 1,000.00
_GOES_ON = re.compile(r"[eE][-+]?\d|\.?\d")  # what, right after a number, makes it part of a longer one
# right before a group, what makes its number part of a longer one: digits, a point, an exponent's start (5 of 1e-5);
# not a point after a letter or another point, which ends a word or leads to the number (epoch.12, Accuracy.....0.6)
_BEGUN = re.compile(r"(?:\d\.?(?:[eE][-+]?)?|(?<![\w.])\.)\Z")
_SIGN = re.compile(r"(?<![\w.])[-+]\Z")  # ...or a sign, which starts a number (not the - of a range: 3-5)
_REST = re.compile(r"\d*(?:\.\d*)?(?:[eE][-+]?\d+)?")  # the rest of a number that goes on
_INTEGER = re.compile(r"[-+]?\d{1,3}(?:,\d{3})*")  # a whole number that thousands separators may go on
# its thousands that go on: groups of three digits, then not another field of a comma-separated line (3,150,0.5)
_THOUSANDS = re.compile(r"(?:,\d{3})+(?!\d|,\d)(?:\.\d*)?(?:[eE][-+]?\d+)?")
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][-+]?\d+)?")  # a number with thousands separators


class ProcessLauncher(Launcher):
    """Cooperative trials, a process per run."""

    # A message of hermes.trial is kept whole, however many metrics it reports, as a warm worker's is: the trial
    # waits for the answer to each report, so a run has at most one report to hold.
    line_limit: int | None = None

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self._live: list[Run] = []  # processes not yet reaped
        self._misused: dict[Run, str] = {}  # the ResumeError that ended a run (protocol.MISUSED)

    # ------------------------------------------------------------------ decisions
    def launch(self, trial: LocalTrial, slot: Slot) -> None:
        launch = trial.launch
        host = self.host
        tag = new_run_tag()
        env = self._environment(trial, slot, tag)
        try:
            stdout_log, stderr_log = open_logs(trial.directory)
        except OSError as error:  # a FIFO or a folder where a log goes: the trial's, which fails alone
            if error.errno in HOST_LIMIT_ERRNOS | STORAGE_LIMIT_ERRNOS:
                raise
            host.release(trial, slot)
            host.emit(TrialExited(host.now(), trial.trial_id, False, f"cannot open its log: {file_problem(error)}"))
            return
        offset = os.fstat(stderr_log.fileno()).st_size
        child_fds: tuple[int, ...] = ()
        parent_fds: tuple[int, ...] = ()
        if launch.cooperative:
            answers_read, answers_write = os.pipe()
            messages_read, messages_write = os.pipe()
            child_fds, parent_fds = (answers_read, messages_write), (messages_read, answers_write)
            env[protocol.ENV_CHANNEL] = f"{answers_read},{messages_write}"
        if launch.function:
            argv = [sys.executable, "-m", "hermes.trial.runner", launch.function, *driver_script()]
        else:  # imported here: hermes.experiment loads pydantic, which a warm worker, importing this module, never uses
            from hermes.experiment.command import with_trial_dir

            argv = with_trial_dir(launch.command, str(trial.directory))  # the folder HERMES_TRIAL_DIR names
        try:
            process = subprocess.Popen(
                argv,
                cwd=launch.cwd or host.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout_log if launch.cooperative else subprocess.PIPE,
                stderr=stderr_log if launch.cooperative else subprocess.PIPE,
                pass_fds=child_fds,
                start_new_session=True,  # its own process group: suspend and kill reach its children too
                preexec_fn=functools.partial(prepare_child, os.getpid(), slot.cpus),
            )
        except OSError as error:
            stdout_log.close()
            stderr_log.close()
            for fd in parent_fds:
                os.close(fd)
            if error.errno in HOST_LIMIT_ERRNOS:  # the host's limit (ulimit -n), not the trial's: failing it lost it
                raise
            host.release(trial, slot)
            host.emit(TrialExited(host.now(), trial.trial_id, False, f"cannot start {argv[0]}: {error}"))
            return
        finally:
            for fd in child_fds:
                os.close(fd)
        host.guard.watch(process.pid, tag)
        answers = None
        if launch.cooperative:
            stdout_log.close()
            stderr_log.close()
            outputs = [Output(messages_read)]
            answers = answers_write
            os.set_blocking(answers, False)
        else:
            outputs = [Output(process.stdout.fileno(), process.stdout, stdout_log),
                       Output(process.stderr.fileno(), process.stderr, stderr_log)]
        run = Run(trial, slot, Handshake(trial), process, os.pidfd_open(process.pid), outputs, answers, offset, tag=tag)
        for output in outputs:
            os.set_blocking(output.fd, False)
            host.loop.register(output.fd, CHANNEL, self._readable, (run, output))
        host.loop.register(run.pidfd, EXIT, self._reap, run)
        self._live.append(run)
        trial.run = run

    def suspend(self, run: Run) -> None:
        run.handshake.suspend_requested = True  # told when its next report is answered

    def resume(self, trial: LocalTrial, slot: Slot) -> None:
        self.launch(trial, slot)  # from its checkpoint, anywhere

    def stop(self, run: Run) -> None:
        run.handshake.stop_requested = True
        if run.handshake.awaiting is None:
            self.kill(run)
        # else: it is answered "stop" at its report, and ends cleanly

    def answer(self, run: Run, word: str) -> None:
        try:
            os.write(run.answers, f"{word}\n".encode())
        except BlockingIOError:
            self.host.fail(run, "protocol error: the trial does not read the answers to its reports")
        except BrokenPipeError:
            pass  # it died; its exit is on its way

    def kill(self, run: Run) -> None:
        signal_run(run.process.pid, run.process.returncode, run.tag)

    def runs(self) -> list[Run]:
        return list(self._live)

    def lose_slot(self, slot: Slot) -> None:
        for run in [run for run in self._live if run.slot is slot]:
            run.silent = True
            self.kill(run)
            run.process.wait()
            self._close(run)

    def close(self) -> None:
        for run in list(self._live):
            self.kill(run)
            run.process.wait()
            self._close(run)

    # ------------------------------------------------------------------ what its processes say
    def _readable(self, source: tuple[Run, Output]) -> None:
        run, output = source
        if output.fd is not None:  # not closed by an earlier handler of the same wait
            self._read(run, output)

    def _read(self, run: Run, output: Output) -> bool:
        """Read what is available from one of the run's pipes; False once nothing more is (now or ever)."""
        try:
            chunk = os.read(output.fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            self._end_output(run, output)
            return False
        if output.log is not None:
            _log(run, output, chunk)
        for line in _lines(output, chunk, self.line_limit):
            self._line(run, output, line)
        return True

    def _end_output(self, run: Run, output: Output) -> None:
        """Nothing more comes of the pipe: its last line without a newline, and what ``_ended`` holds, are said."""
        self._close_output(output)
        if output.buffer:  # a last line without a newline
            line, output.buffer = _kept(output.buffer, self.line_limit), b""
            self._line(run, output, line)
        self._ended(run, output)

    def _drain(self, run: Run) -> None:
        for output in run.outputs:
            while output.fd is not None and self._read(run, output):
                pass

    def _line(self, run: Run, output: Output, line: bytes) -> None:
        if run.error is not None:
            return
        try:
            self._parse(run, output, line)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            self.host.fail(run, f"protocol error: {error!r}")

    def _ended(self, run: Run, output: Output) -> None:
        """The pipe ended (its process and children are gone, or closed it): nothing more comes of it."""

    def _parse(self, run: Run, output: Output, line: bytes) -> None:
        message = json.loads(line)
        if message["type"] == protocol.REPORT:
            metrics = {str(name): float(value) for name, value in message["metrics"].items()}
            self.host.report(run, int(message["step"]), metrics, bool(message["checkpointed"]))
        elif message["type"] == protocol.SUSPENDED:
            run.suspended_step = int(message["step"])
            self.host.watchdog.exiting(run.trial.trial_id, self.host.now())
        elif message["type"] == protocol.LOOP_STOPPED:  # its main thread may wait for ever on that loop: it must exit
            self.host.watchdog.exiting(run.trial.trial_id, self.host.now(), TOLD_TO_STOP)
        elif message["type"] == protocol.MISUSED:  # said as how its run ends
            self._misused.setdefault(run, str(message["error"]))
        else:
            raise ValueError(f"unknown message type {message['type']!r}")

    def _reap(self, run: Run) -> None:
        """The run's main process exited: end its group, collect what it said, report the outcome."""
        if run not in self._live:
            return  # collected already, in the same wait (its slot was lost)
        self.kill(run)  # leftover children; the leader is not reaped yet, so its group id is still ours
        code = run.process.wait()
        self._drain(run)
        for output in run.outputs:  # a child it left, killed but not gone yet, holds the pipe open: its end is now
            if output.fd is not None:
                self._end_output(run, output)
        misused = self._misused.get(run)
        self._close(run)
        trial, host = run.trial, self.host
        now = host.now()
        if run.silent:
            return
        if run.trained:
            host.emit(TrialExited(now, trial.trial_id, True))
        elif run.handshake.suspend_requested and run.suspended_step is not None and code == 0:
            trial.timing.suspended = now
            host.emit(TrialSuspended(now, trial.trial_id, run.suspended_step))
        elif run.handshake.stop_requested:
            if run.error is not None:  # killed (it lingered after its stop, say): no failure, but its log says why
                _note(trial, f"hermes: trial {trial.trial_id} was killed ({run.error}); it ends stopped\n")
            host.emit(TrialExited(now, trial.trial_id, False, "stopped"))
        elif run.error is not None:
            if run.suspended_step is not None and run.error.endswith(SUSPENSION_COMMITTED):
                # it lingered after committing its suspension, which the executor counts: its log says so, as a warm
                # worker's trial's does
                _note(trial, f"hermes: trial {trial.trial_id} was killed ({run.error}: a thread that is no daemon, or "
                             "a child process it waits for, kept it alive); it goes on from that checkpoint\n")
            host.emit(TrialExited(now, trial.trial_id, False, run.error))
        elif code == 0 and run.misread is not None and not trial.last_step:
            host.emit(TrialExited(now, trial.trial_id, False, f"ended without a report: lines matched "
                                  f"trial.metrics_regex, but {run.misread}"))
        elif code == 0:
            host.emit(TrialExited(now, trial.trial_id, True))
        elif code == protocol.EXIT_NO_SPACE and trial.launch.function is not None:
            # its stderr.log may be on the disk it found full: then it holds no reason
            reason = tail(trial.directory / "stderr.log", run.stderr_offset) or (
                "a file of it could not be written: no space left, or a limit, on the device holding "
                f"{trial.directory}")
            raise NoSpaceError(f"trial {trial.trial_id}: {reason}")
        elif misused is not None:  # it would fail the same way run again: no crash to run again
            host.emit(TrialExited(now, trial.trial_id, False, misused))
        else:
            log = tail(trial.directory / "stderr.log", run.stderr_offset)
            reason = f"{exit_reason(code)}: {log}" if log else exit_reason(code)
            host.emit(TrialExited(now, trial.trial_id, False, reason, crashed=True))

    def _close_output(self, output: Output) -> None:
        self.host.loop.unregister(output.fd)
        if output.pipe is None:
            os.close(output.fd)
        else:
            output.pipe.close()
        output.fd = None

    def _close(self, run: Run) -> None:
        loop = self.host.loop
        for output in run.outputs:
            if output.fd is not None:
                self._close_output(output)
            if output.log is not None:
                output.log.close()
        if run.answers is not None:
            os.close(run.answers)
            run.answers = None
        loop.unregister(run.pidfd)
        os.close(run.pidfd)
        self.host.guard.forget(run.process.pid)  # collected: its group id may be anyone's now
        self._live.remove(run)
        self._misused.pop(run, None)
        self.host.forget(run)

    def _environment(self, trial: LocalTrial, slot: Slot, tag: str) -> dict[str, str]:
        host = self.host
        return {
            **slot_environment(slot, tag),
            **trial.launch.env,
            protocol.ENV_TRIAL_ID: trial.trial_id,
            protocol.ENV_TRIAL_DIR: str(trial.directory),
            protocol.ENV_BUDGET: str(trial.launch.budget),
            protocol.ENV_METRIC: host.metric_of(trial) or "",
            protocol.ENV_CHECKPOINT_EVERY: str(host.checkpoint_every_of(trial)),
            protocol.ENV_REPORTED_STEP: str(trial.last_step),
        }


@dataclass(frozen=True, slots=True)
class _Reading:
    """What a segment of an unmodified program's output reports."""

    step: int | None  # None: the pattern has no step group, so it is the next step
    objective: float
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class _Line:
    """A line as far as it is read: the report it shows, and how many values its objective showed in turn (each
    segment of a line redrawn with \\r shows one)."""

    reading: _Reading
    values: int = 1

    def redrawn(self, reading: _Reading) -> _Line:
        """The line once its next segment that matches shows ``reading``."""
        last, new = self.reading.objective, reading.objective
        changed = new != last and not (math.isnan(new) and math.isnan(last))
        return _Line(reading, self.values + changed)


class ScriptLauncher(ProcessLauncher):
    """Unmodified programs: metrics from stdout, SIGSTOP and SIGCONT in place."""

    line_limit = MAX_LINE  # of a longer line only its end is read: a metrics line is never that long

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self._shown: dict[Output, _Line] = {}  # per pipe: what a line redrawn with \r shows so far
        # runs that reported a line redrawn over several values of its objective without a step group: how many
        self._merged: dict[Run, int] = {}

    def suspend(self, run: Run) -> None:
        """SIGSTOP the process group, then report what it printed before stopping and that it is suspended."""
        trial, host = run.trial, self.host
        if not signal_run(run.process.pid, run.process.returncode, run.tag, signal.SIGSTOP):
            return  # it exited first: its exit is reported instead
        trial.timing.suspend_delivered = host.now()
        if not wait_stopped(run.process.pid):
            return
        self._drain(run)
        run.paused = True
        host.release(trial, run.slot)
        trial.timing.suspended = host.now()
        host.emit(TrialSuspended(trial.timing.suspended, trial.trial_id, trial.last_step))

    def resume(self, trial: LocalTrial, slot: Slot) -> None:
        run = trial.run
        if slot is not run.slot:
            raise HermesError(f"unmodified trial {trial.trial_id} cannot move from {run.slot.name} to {slot.name}")
        run.paused = False
        signal_run(run.process.pid, run.process.returncode, run.tag, signal.SIGCONT)  # killed while stopped: its exit
        held, run.held = run.held, []                                                   # is reported as usual
        for reading in held:
            self._report(run, reading)

    def stop(self, run: Run) -> None:
        if run.paused:
            run.silent = True  # the core already counts it as stopped
        run.handshake.stop_requested = True
        self.kill(run)

    def _parse(self, run: Run, output: Output, line: bytes) -> None:
        """A segment that matches the pattern is a report when its objective and step are numbers.

        A line redrawn in place (Keras' progress line, a tqdm bar: segments ended by \\r) shows its latest
        numbers last, so the report of a line is its last segment that matches: one ended by \\r is held until
        the line ends (\\n, or its pipe), or until a segment of another step replaces it (a bar that never
        prints \\n reports each step as the next one shows)."""
        redrawn = line.endswith(b"\r")
        reading = self._reading(run, line.rstrip(b"\r\n").decode(errors="replace"))
        shown = self._shown.pop(output, None)
        if shown is not None and reading is None and redrawn:
            self._shown[output] = shown  # another segment of the same line, which says nothing: still shown
            return
        if shown is not None and (reading is None or reading.step != shown.reading.step):
            self._report_line(run, shown)  # the line ended, or moved on to another step: what it showed is that
            shown = None                   # step's
        if reading is None:
            return
        current = _Line(reading) if shown is None else shown.redrawn(reading)
        if redrawn:
            self._shown[output] = current
        else:
            self._report_line(run, current)

    def _ended(self, run: Run, output: Output) -> None:
        shown = self._shown.pop(output, None)
        if shown is not None:  # a line redrawn to the end, never ended by \n
            self._report_line(run, shown)

    def _close(self, run: Run) -> None:
        # said at its end, where the line is known to be its one report: a Keras line an epoch shows several too
        values = self._merged.pop(run, None)
        if values is not None and run.reports == 1 and _exited_before_budget(run):
            trial = run.trial
            metric = self.host.metric_of(trial) or "the objective"
            _note(trial, f"hermes: trial {trial.trial_id}: its only report (of budget.steps {trial.launch.budget}) is "
                         f"the last of {values} values of {metric} that a line redrawn with \\r showed in turn: "
                         "without a step group in trial.metrics_regex, a line is one step (one epoch's batches: "
                         "nothing is wrong). If the line shows one epoch after another (a tqdm bar over the epochs), "
                         "print the epoch in it (set_postfix(epoch=epoch + 1, ...)) and read it with a step group "
                         "(epoch=(?P<step>\\d+))\n")
        for output in run.outputs:
            self._shown.pop(output, None)
        super()._close(run)

    def _reading(self, run: Run, text: str) -> _Reading | None:
        """What a segment reports, if it matches the pattern and its objective and step are numbers; other
        groups are recorded when they are numbers too, and left out when not (a phase's name, say)."""
        pattern = run.trial.launch.pattern
        start = max(0, len(text) - SEARCHED)  # of a longer line, only its end is searched
        if start and not run.cut:  # said once: a report read from a cut line may be another than the program meant
            run.cut = True
            _log(run, run.outputs[-1], f"hermes: trial {run.trial.trial_id}: a line of {len(text)} characters was "
                                       f"searched in its last {SEARCHED} only (trial.metrics_regex reads the metrics "
                                       "at the end of a long line)\n".encode())
        try:
            match = _search(pattern, text, start)
        except regex.error as error:  # a pattern the spec check passed that regex reads otherwise: its trial alone
            self.host.fail(run, f"trial.metrics_regex cannot be searched: {error}")
            return None
        except TimeoutError:
            self.host.fail(run, f"trial.metrics_regex took over its limit of {SEARCH_LIMIT:g} s to search one line "
                                f"(of {len(text)} characters; a sane pattern takes milliseconds): it backtracks "
                                "without end, likely through nested repeats such as (a+)+ or (a|a)+ that match the "
                                "same text in many ways; repeat each part once (a+), and make what follows a repeat "
                                "unable to match what it matches")
            return None
        if match is None:
            return None
        trial, host = run.trial, self.host
        groups = {name: found for name, found in match.groupdict().items() if found is not None}
        metrics = {name: number for name, found in groups.items() if name != "step"
                   for number in [_number(found)] if number is not None}
        name = "value" if "value" in groups else host.metric_of(trial) or ""
        if name not in groups:
            return None  # the objective's group is optional in the pattern and did not match: not a report
        for group, found in groups.items():  # [\d.]+ reads 1e-05 as 1, \D* eats the - of -190: not what it printed
            begun = _begun(found, text, match.start(group))
            printed = begun or _printed(found, text, match.end(group), group in _commas_after(pattern))
            if printed is not None:
                cut = begun is not None and match.start(group) == start > 0  # by the searched end's start
                host.fail(run, f"trial.metrics_regex's group {group!r} read {found!r} {_in(text, start)}, where the "
                               f"number {_misread(group, printed, begun is not None, cut)}")
                return None
        if name not in metrics:
            why = f"its group {name!r} read {groups[name]!r}, not a number, {_in(text, start)}"
            if run.misread is None:  # said while it runs too: a program that goes on so never reports
                _log(run, run.outputs[-1], f"hermes: trial {trial.trial_id}: a line that matched trial.metrics_regex "
                                           f"is no report: {why}\n".encode())
            run.misread = run.misread or why
            return None
        step = _whole(groups["step"]) if "step" in groups else None
        if "step" in groups and step is None:
            run.misread = run.misread or (f"its group 'step' read {groups['step']!r}, not a whole number, "
                                          f"{_in(text, start)}")
            return None
        if step is not None and step < 1:
            run.misread = run.misread or (f"its group 'step' read {groups['step']!r} {_in(text, start)}: steps count "
                                          "from 1, as budget.steps does (print epoch + 1)")
            return None
        if step is not None and step > protocol.MAX_STEP:
            host.fail(run, f"trial.metrics_regex's group 'step' read {step} {_in(text, start)}: steps count epochs "
                           f"or iterations, at most {protocol.MAX_STEP} (a timestamp is no step)")
            return None
        return _Reading(step, metrics[name], metrics)

    def _report_line(self, run: Run, line: _Line) -> None:
        """Record what a line showed last; without a step group, one that showed several values is said at the
        run's end if it was the run's one report (a bar over all the epochs reads as one step)."""
        if line.reading.step is None and line.values > 1:
            self._merged[run] = line.values
        self._report(run, line.reading)

    def _report(self, run: Run, reading: _Reading) -> None:
        """Record a segment's report: of its step, or without a step group of the next one."""
        if run.error is not None:
            return
        if run.paused:  # printed by a process that escaped SIGSTOP (it cleared its environment): the core takes no
            run.held.append(reading)  # report of a suspended trial, so it is reported when the run resumes
            return
        trial, host = run.trial, self.host
        objective, metrics = reading.objective, reading.metrics
        step = reading.step if reading.step is not None else run.reports + 1
        run.reports += 1
        if step > trial.launch.budget:  # it trains on past budget.steps, which it cannot be told: it ends here
            if not trial.last_step and reading.step is not None:  # nothing to rank it by: it counts iterations
                host.fail(run, f"its first report was step {step}, past budget.steps {trial.launch.budget}: steps "
                               "count up to the budget (epochs, say), not iterations")
            elif not run.trained:
                run.trained = True
                self.kill(run)
        elif step > trial.last_step:
            host.emit(trial.reported(step, objective, metrics, False, host.now()))
            host.note_report(trial)
        else:  # a repeated step, or one caught up by a run started again from the beginning: known already
            host.watchdog.reported(trial.trial_id, host.now())  # but a step all the same


def _lines(output: Output, chunk: bytes, limit: int | None) -> list[bytes]:
    """The segments that ``chunk`` completes, each with the byte that ends it: a newline, or a carriage return (a
    progress line redrawn in place; ``ScriptLauncher._parse`` reads it as part of its line). The rest of ``chunk``
    waits in ``output.buffer`` for the next read.

    Only the new chunk is searched for line ends, and the partial segment grows in place, so a segment costs time
    in proportion to its length (adding each chunk to a copy of the whole line and splitting that again took
    quadratic time: seconds for a line of megabytes). Of a segment longer than ``limit`` only its last ``limit``
    bytes are kept: its end is what a report would be (a metrics line is never that long), and the memory stays
    bounded. None: segments are kept whole."""
    buffer = output.buffer
    if not isinstance(buffer, bytearray):
        buffer = output.buffer = bytearray(buffer)
    end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
    if end < 0:
        buffer += chunk
        if limit is not None and len(buffer) > 2 * limit:  # trimmed once it has grown by limit: amortised, a
            del buffer[:-limit]                             # constant per byte
        return []
    lines = _SEGMENT.findall(chunk, 0, end + 1)
    if buffer:
        buffer += lines[0]
        lines[0] = _kept(buffer, limit)
    output.buffer = bytearray(chunk[end + 1:])
    return lines


def _log(run: Run, output: Output, data: bytes) -> None:
    """Add to the log of one of the run's pipes."""
    try:
        output.log.write(data)
        output.log.flush()
    except OSError as error:  # a full disk: say which log, by its path (opened from a descriptor, its name is that)
        if error.errno in NO_SPACE_ERRNOS:
            log = run.trial.directory / ("stderr.log" if output is run.outputs[-1] else "stdout.log")
            raise NoSpaceError(f"trial {run.trial.trial_id}: {log}: {error.strerror}") from None
        raise


def _note(trial: LocalTrial, text: str) -> None:
    """Add a word of Hermes's to the trial's stderr.log, where its run has ended, on a line of its own (a progress bar
    on stderr leaves its last line open); on a full disk, or where the log is no regular file (a FIFO), it is lost."""
    with contextlib.suppress(OSError):
        fd = open_regular(trial.directory / "stderr.log", os.O_RDWR | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "a", encoding="utf-8") as log:
            size = os.fstat(fd).st_size
            log.write(("\n" if size and os.pread(fd, 1, size - 1) != b"\n" else "") + text)


def _exited_before_budget(run: Run) -> bool:
    """Whether the run's program exited by itself, as a success, before it reported budget.steps: not stopped, nor
    failed, nor killed past its budget."""
    return (run.process.returncode == 0 and not run.silent and not run.trained and run.error is None
            and not run.handshake.stop_requested and run.trial.last_step < run.trial.launch.budget)


def _kept(segment: bytes | bytearray, limit: int | None) -> bytes:
    """What is read of a segment: its last ``limit`` bytes, or all of it."""
    return bytes(segment if limit is None else segment[-limit:])


def _number(text: str) -> float | None:
    """A group's text as a number: as Python reads it, or written with thousands separators (1,000.5)."""
    try:
        return float(text.replace(",", "") if _GROUPED.fullmatch(text) else text)
    except ValueError:
        return None


def _whole(text: str) -> int | None:
    """A step group's text as a whole number: written as one, or as an integral float (Hugging Face's ``'epoch':
    1.0``); None for another."""
    number = _number(text)
    return int(number) if number is not None and number.is_integer() else None


def _printed(found: str, text: str, at: int, separated: bool) -> str | None:
    """The number the program printed where a group read only its start, ``found``, up to ``at`` in ``text``: an
    exponent, more digits or thousands go on after it (``[\\d.]+`` reads 1e-05 as 1, 1,000.00 as 1). None where
    ``found`` is a number printed whole, or what goes on leaves its value as it is (``\\d+`` reads 1 of 1.0).
    ``separated``: the pattern writes a comma right after the group, which is then its separator, not thousands."""
    number = _number(found)
    if number is None:
        return None
    thousands = _THOUSANDS.match(text, at) if _INTEGER.fullmatch(found) and not separated else None
    if thousands is not None:
        return found + thousands.group()
    if not _GOES_ON.match(text, at):
        return None
    printed = found + _REST.match(text, at).group()
    return None if _number(printed) == number else printed


def _begun(found: str, text: str, at: int) -> str | None:
    """The number the program printed, up to where a group read its end, ``found``, from ``at`` in ``text``: digits,
    a point or an exponent's start, or a sign, go before it (``.*(?P<x>[\\d.]+)`` reads 5 of 0.25, ``\\D*`` eats the
    - of -190). None where ``found`` is a number that begins there, or what goes before leaves its value as it is (the
    + of +5)."""
    number = _number(found)
    if number is None:
        return None
    begun = _BEGUN.search(text, max(0, at - 3), at)
    if begun is None and found[0] not in "+-":
        begun = _SIGN.search(text, max(0, at - 1), at)
    if begun is None:
        return None
    start = begun.start()
    while start > 0 and (text[start - 1].isdigit() or text[start - 1] in ".,"):
        start -= 1
    printed = text[start:at] + found
    return None if _number(printed) == number else printed


def _misread(group: str, printed: str, begun: bool, at_cut: bool) -> str:
    """Why a group that read part of the number ``printed`` is wrong, and what reads it: said after "where the
    number". ``begun``: the number began before the group; ``at_cut``: before the end of a long line searched."""
    if at_cut:
        return (f"begins before the last {SEARCHED} characters of the line, all of a longer line that is searched: "
                "print the metrics at the end of their line, or on a line of their own")
    where = "begins before it (a .* or \\D* before the group took its start: make it lazy, .*?)" if begun else "goes on"
    if group == "step" and _GROUPED.fullmatch(printed):  # read whole, it would be a step far past any budget
        comma = "" if begun else ", or write the comma in the pattern right after the group if it separates fields"
        return (f"{where} ({printed}): a step written with thousands counts iterations, not the epochs budget.steps "
                f"counts; leave the step group out, and each matching line is the next step{comma}")
    whole = GROUPED_NUMBER if _GROUPED.fullmatch(printed) else NUMBER
    return f"{where}: read it whole, with (?P<{group}>{whole})"


def _search(pattern: re.Pattern[str], text: str, start: int) -> regex.Match[str] | None:
    """What ``pattern.search(text, start)`` finds, searched by the ``regex`` package with the GIL released and
    TimeoutError past SEARCH_LIMIT seconds (re cannot be stopped, and holds the GIL while it backtracks), in one
    search: a timed match per place to try cost microseconds each, and as many GIL hand-overs, beside busy threads
    long enough to fail a sound pattern on a long line (``_matcher``)."""
    if _lead_class(pattern) == "." and "\n" not in text:  # its one place to start: the search's own is slower
        return _plain(pattern).match(text, start, timeout=SEARCH_LIMIT, concurrent=True)
    return _matcher(pattern).search(text, start, timeout=SEARCH_LIMIT, concurrent=True)


@functools.lru_cache(maxsize=64)
def _plain(pattern: re.Pattern[str]) -> regex.Pattern[str]:
    """trial.metrics_regex compiled by ``regex`` as it is (which the spec checks it with too)."""
    return regex.compile(pattern.pattern)


@functools.lru_cache(maxsize=64)
def _matcher(pattern: re.Pattern[str]) -> regex.Pattern[str]:
    """trial.metrics_regex compiled by ``regex`` (which the spec checks it with too), tried in fewer places where it is
    led by a repeat of one character's class (``.*?``, ``.+``, ``(?P<step>\\d+)``, ``\\D*``): a match that starts right
    after a character the class takes would start one earlier too (the lead takes that character as well, and the
    rest matches as it did), so the first match starts where the search starts (``\\G``) or after a character the
    class does not take, and the pattern is guarded so: once, for ``.*?`` (a line holds no newline), where a search
    tries every place, each time to the line's end."""
    lead = _lead_class(pattern)
    if lead is None:
        return _plain(pattern)
    flags = _GLOBAL_FLAGS.match(pattern.pattern).group()  # they must lead it still, read as regex reads them
    body = pattern.pattern[len(flags):]
    end = "\n" if pattern.flags & re.VERBOSE else ""  # a comment at the pattern's end would take in the group's )
    return regex.compile(rf"{flags}(?:\G|(?<!{lead}))(?:{body}{end})")


@functools.lru_cache(maxsize=64)
def _lead_class(pattern: re.Pattern[str]) -> str | None:
    """The class (as ``regex`` reads it) of the repeat that leads ``pattern``, for ``_matcher``; None where it has no
    such lead, or refers back to a group's text (``(?P=step)``), which a match that starts earlier may change."""
    parsed = _parser.parse(pattern.pattern, pattern.flags)
    items, pending = parsed.data, [parsed]
    while pending:
        for op, argument in pending.pop().data:
            if op in (_constants.GROUPREF, _constants.GROUPREF_EXISTS):
                return None
            pending.extend(_sequences(argument))
    while items and items[0][0] == _constants.SUBPATTERN and items[0][1][1:3] == (0, 0):  # a group with no flags
        items = items[0][1][3].data
    if not items or items[0][0] not in (_constants.MAX_REPEAT, _constants.MIN_REPEAT):
        return None
    _, most, repeated = items[0][1]
    if most != _constants.MAXREPEAT or len(repeated.data) != 1:
        return None
    return _class_source(*repeated.data[0])


def _class_source(op: Any, argument: Any) -> str | None:
    """One parsed character class as a pattern's text, each character as its code point; None for any other item."""
    if op is _constants.ANY:
        return "."
    if op is _constants.LITERAL:
        return f"[{_code(argument)}]"
    if op is _constants.NOT_LITERAL:
        return f"[^{_code(argument)}]"
    if op is not _constants.IN:
        return None
    parts = []
    for item, value in argument:
        if item is _constants.NEGATE:
            parts.append("^")
        elif item is _constants.LITERAL:
            parts.append(_code(value))
        elif item is _constants.RANGE:
            parts.append(f"{_code(value[0])}-{_code(value[1])}")
        elif item is _constants.CATEGORY and value in _CATEGORIES:
            parts.append(_CATEGORIES[value])
        else:
            return None
    return f"[{''.join(parts)}]"


def _code(character: int) -> str:
    return f"\\U{character:08x}"


@functools.lru_cache(maxsize=64)
def _commas_after(pattern: re.Pattern[str]) -> frozenset[str]:
    """The named groups that ``pattern`` follows with a comma of its own (``(?P<step>\\d+),``): the pattern says that
    comma separates fields, so ``(?P<step>\\d+),(?P<value>\\d+)`` reads ``1,873`` as step 1, not thousands."""
    names = {number: name for name, number in pattern.groupindex.items()}
    found = set()
    pending = [_parser.parse(pattern.pattern, pattern.flags)]
    while pending:  # each sequence of the pattern, nested ones too
        items = pending.pop().data
        for (op, argument), following in zip(items, [*items[1:], None]):
            if op == _constants.SUBPATTERN and argument[0] in names and following == (_constants.LITERAL, ord(",")):
                found.add(names[argument[0]])
            pending.extend(_sequences(argument))
    return frozenset(found)


def _sequences(argument: Any) -> list[_parser.SubPattern]:
    """The sequences that a parsed item's argument holds (a group's, a repeat's, each alternative of a branch)."""
    if isinstance(argument, _parser.SubPattern):
        return [argument]
    if isinstance(argument, (tuple, list)):
        return [sequence for part in argument for sequence in _sequences(part)]
    return []


def _in(line: str, start: int) -> str:
    """Where a match's groups read what they read: the line, or its end that was searched, from ``start``."""
    if not start:
        return f"in the line {line.strip()!r}"
    return f"in the last {len(line) - start} characters of a line of {len(line)}, {line[start:].strip()!r}"
