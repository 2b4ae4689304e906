"""A warm worker: one long-lived process per slot that runs function trials, one after another.

``python -m hermes.local.worker package.module [SCRIPT ARGV...]`` imports the trial's module (and with it the
framework; ``SCRIPT ARGV...`` as hermes.trial.runner takes them) and initialises the device once; then it runs each
trial the executor starts in a thread of its own. A suspended trial *parks*: its thread waits inside ``report`` with the model,
optimizer, data position and everything else in memory, so a resume on this slot costs no start,
no import and no disk read. Only one trial computes at a time: the executor starts or resumes a
trial on a slot only once the previous one has parked or ended.

Commands come on stdin and messages go out on fd ``protocol.ENV_WORKER_CHANNEL``, one JSON object per
line (hermes/trial/protocol.py). A trial's exception ends only that trial; a crash of the process
(a segfault, the out-of-memory killer) ends the worker, and the executor replaces it. So does a trial whose
function has not returned ``EXIT_GRACE`` seconds after its spill committed its checkpoint, or after a thread it started
ended with its StopExit (its main thread waits on what that suspended or stopped loop was to give it, say), though not
after a stop alone (its final save or evaluation takes what it takes): a thread cannot be
ended, and the executor waits for that end to move the trial or to end it, so the worker exits, as a process of its
own lingering so long is killed.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import io
import json
import os
import queue
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, TextIO

from hermes.errors import STORAGE_LIMIT_ERRNOS, start_thread
from hermes.local.system import NotRegularFile, open_regular
from hermes.local.watchdog import EXIT_GRACE
from hermes.trial import protocol
from hermes.trial.checkpoint import reseed_rng
from hermes.trial.runner import returned_unread, set_trial_argv
from hermes.trial.session import (
    ResumeError,
    Session,
    StopExit,
    SuspendExit,
    bind,
    follow_threads,
    release_device_cache,
    trial_of_thread,
    work_for,
)

LINGERED_EXIT_CODE = 3  # the worker's, when a trial's function did not return after its spill or loop's stop (its log)
# What left a trial only to return, whose function does not, and what becomes of it once its worker exits for it
SPILL_COMMITTED = ("committing its suspension", "the trial goes on from that checkpoint")
TOLD_TO_STOP = ("its loop thread being stopped", "the trial ends stopped")  # protocol.LOOP_STOPPED


class _Outbox:
    """The worker's one message pipe, shared by its trials' threads."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "wb")
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = protocol.encode(message)
        with self._lock:
            self._file.write(data)
            self._file.flush()


class _TrialChannel:
    """A trial's channel inside the worker: messages tagged with its id; words from the command loop."""

    def __init__(self, trial_id: str, outbox: _Outbox, on_park: Callable[[str], None],
                 on_last_word: Callable[[_TrialChannel, tuple[str, str]], None]) -> None:
        self.trial_id = trial_id
        self.words: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.suspended = False  # it said its checkpoint is committed: its run ends suspended, however it returns
        self.ended = False  # its run's end was said
        self.exit_timer: threading.Timer | None = None  # at its commit or loop's stop: fires unless it returns
        self.no_timer: str | None = None  # why its exit timer could not start: its run ends for the host's limit
        self._outbox = outbox
        self._on_park = on_park
        self._on_last_word = on_last_word

    def send(self, message: dict[str, Any]) -> None:
        if message["type"] == protocol.LOOP_STOPPED:  # a loop thread it started ended with its StopExit
            self._on_last_word(self, TOLD_TO_STOP)
            return
        if message["type"] == protocol.PARKED:  # sent by one of the trial's threads, which now waits
            self._on_park(self.trial_id)
        self._outbox.send({**message, "trial": self.trial_id})
        if message["type"] == protocol.SUSPENDED:
            self.suspended = True
            self._on_last_word(self, SPILL_COMMITTED)

    def receive(self) -> str:
        return self.words.get()


class _TrialStreams(io.TextIOBase):
    """sys.stdout or sys.stderr of the worker: what a trial's threads print (its own, those it started, its tasks
    in a thread pool: ``trial_of_thread``) goes to that trial's log; the rest to the worker's. It answers what
    programs ask of a process's stream (``buffer``, ``encoding``, ``fileno``, ``reconfigure``)."""

    def __init__(self, fallback: TextIO, name: str) -> None:
        self._fallback = fallback
        self._name = name
        self._bytes = _TrialBytes(self)
        self._paths: dict[str, Path] = {}  # the log of each trial that runs, by its id
        self._files: dict[str, TextIO] = {}  # those open now
        self._lock = threading.RLock()  # a trial's threads write while it parks or ends, which closes its file
        os.register_at_fork(after_in_child=self._unlock)  # a process forked while another thread wrote

    def _unlock(self) -> None:
        self._lock = threading.RLock()

    def open_for(self, trial_id: str, directory: Path) -> None:
        """Open the trial's log, before taking the lock that every print of the worker's threads takes."""
        path = directory / self._name
        file = _open_log(path)
        with self._lock:
            self._paths[trial_id] = path
            self._files[trial_id] = file

    def rest(self, trial_id: str) -> None:
        """Close the log of a trial that parks, reopened at its next line: a worker holds hundreds of parked
        trials, and two open files each ran out of descriptors (EMFILE)."""
        with self._lock:
            file = self._files.pop(trial_id, None)
            if file is not None:
                file.close()

    def close_for(self, trial_id: str) -> None:
        with self._lock:
            self._paths.pop(trial_id, None)
            self.rest(trial_id)

    def _target(self) -> TextIO:
        """Where the calling thread's text goes. A parked trial's log is reopened here, under the lock, so without
        waiting (``_open_log``): where it became a FIFO meanwhile, the print raises NotRegularFile, and the trial
        fails."""
        trial_id = trial_of_thread()
        if trial_id not in self._paths:  # a thread of the worker's, or of a trial that ended
            return self._fallback
        file = self._files.get(trial_id)
        if file is None:
            file = self._files[trial_id] = _open_log(self._paths[trial_id])
        return file

    def write(self, text: str) -> int:
        with self._lock:
            return self._target().write(text)

    def flush(self) -> None:
        with self._lock:
            self._target().flush()

    def write_bytes(self, data: bytes) -> int:
        """``sys.stdout.buffer.write``: after the text written before it, in the same log."""
        with self._lock:
            target = self._target()
            target.flush()
            written = target.buffer.write(data)
            target.buffer.flush()
            return written

    @property
    def buffer(self) -> _TrialBytes:
        return self._bytes

    @property
    def encoding(self) -> str:
        with self._lock:
            return self._target().encoding

    @property
    def errors(self) -> str | None:
        with self._lock:
            return self._target().errors

    def fileno(self) -> int:
        """The worker's own stream's: what is written to the descriptor (C code, ``faulthandler``) goes to the worker's
        log, as every output that bypasses Python does."""
        return self._fallback.fileno()

    def reconfigure(
        self,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        line_buffering: bool | None = None,
        write_through: bool | None = None,
    ) -> None:
        """Accepted, and nothing to change: a trial's log is written line by line and takes any text (what cannot be
        encoded is escaped)."""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False


class _TrialBytes(io.BufferedIOBase):
    """The ``buffer`` of a ``_TrialStreams``: bytes go to the log its text goes to from the calling thread."""

    def __init__(self, text: _TrialStreams) -> None:
        self._text = text

    def write(self, data: bytes) -> int:  # type: ignore[override]
        return self._text.write_bytes(data)

    def flush(self) -> None:
        self._text.flush()

    def fileno(self) -> int:
        return self._text.fileno()

    def writable(self) -> bool:
        return True


def _open_log(path: Path) -> TextIO:
    """A trial's log, which takes any text as Python's stderr does: a lone surrogate (a file name that is not UTF-8,
    from os.listdir) written escaped, where strict UTF-8 failed the traceback that says why the trial failed.

    Opened without waiting: NotRegularFile where a FIFO (or a folder, a device) is there, put after the executor's
    check or while the trial was parked. The open of a FIFO waited for a reader, holding the worker's log lock: its
    other trials' prints, parks and ends waited with it, and the trial held its slot for ever."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return open(fd, "a", buffering=1, errors="backslashreplace")


class Worker:
    """``home``: the working directory each trial starts in (the worker's at its start)."""

    def __init__(self, outbox: _Outbox, stdout: _TrialStreams, stderr: _TrialStreams, home: str) -> None:
        self.outbox = outbox
        self.stdout, self.stderr = stdout, stderr
        self.home = home
        self.channels: dict[str, _TrialChannel] = {}
        self._ending = threading.Lock()  # a run's end is said, or the worker exits for one that lingers: not both

    def serve(self, commands: TextIO) -> None:
        """Follow the executor's commands until it closes stdin."""
        for line in commands:
            command = json.loads(line)
            if command["op"] == protocol.START:
                self.start(command)
            elif command["op"] == protocol.SAY and command["trial"] in self.channels:
                self.channels[command["trial"]].words.put(command["word"])

    def start(self, command: dict[str, Any]) -> None:
        trial_id = command["trial"]
        channel = self.channels[trial_id] = _TrialChannel(trial_id, self.outbox, self._rest_streams,
                                                          self._await_return)
        thread = threading.Thread(target=self._run, args=(channel, command), name=f"trial-{trial_id}", daemon=True)
        try:
            start_thread(thread)
        except OSError as error:  # no thread to be had: the host's limit, not the trial's crash (nor the worker's)
            del self.channels[trial_id]
            self.outbox.send({"type": protocol.ENDED, "trial": trial_id, "outcome": protocol.HOST_LIMIT,
                              "error": f"its warm worker cannot start its thread: {error.strerror}"})

    def _rest_streams(self, trial_id: str) -> None:
        for stream in (self.stdout, self.stderr):
            try:
                stream.rest(trial_id)
            except OSError:
                pass  # a full disk: what could not be written is lost, the trial is not

    def _await_return(self, channel: _TrialChannel, why: tuple[str, str]) -> None:
        """Its spill committed its checkpoint, or a loop thread it started ended with its StopExit: all its function
        has left to do is return, within ``EXIT_GRACE``. Timed from the first such word."""
        if channel.exit_timer is not None:
            return
        timer = threading.Timer(EXIT_GRACE, self._exit_for_lingering, (channel, why))
        timer.name, timer.daemon = f"exit-timer-{channel.trial_id}", True
        try:
            start_thread(timer)
        except OSError as error:  # no thread to be had: the host's limit, as for the trial's own thread (``start``)
            channel.no_timer = f"its warm worker cannot start its exit timer: {error.strerror}"
            return
        channel.exit_timer = timer

    def _exit_for_lingering(self, channel: _TrialChannel, why: tuple[str, str]) -> None:
        """Its function did not return in time: exit, as the executor kills a trial's process that lingers. The
        executor takes it as any death of a worker: the spilled trial goes on from its committed checkpoint, the
        stopped one ends stopped, those parked here go on from theirs, and one computing here fails. Said once, in
        the trial's stderr.log and in the worker's log, whose tail the failed one's error carries."""
        told, fate = why
        notice = (f"hermes: trial {channel.trial_id} did not return within {EXIT_GRACE:g}s of {told}, and a thread "
                  f"cannot be ended: its warm worker exits; {fate}, and the trials parked in the worker go on from "
                  "their checkpoints\n")
        with self._ending:
            if channel.ended:
                return
            try:
                print(notice, end="", file=sys.stderr, flush=True)  # this thread works for the trial: its log
                os.write(sys.__stderr__.fileno(), notice.encode())
            finally:
                os._exit(LINGERED_EXIT_CODE)

    def _run(self, channel: _TrialChannel, command: dict[str, Any]) -> None:
        """The trial's thread: set up its session, call its function, say how it ended.

        The executor waits for that last message, so it goes out whatever happens: a full disk that cannot take the
        trial's logs, or a failure in ending it (its exception goes to the worker's log)."""
        outcome, error = protocol.FAILED, "its warm worker failed in ending it (the worker's log says why)"
        try:
            outcome, error = self._outcome(channel, command)
            _free_what_it_left()
        finally:
            message = {"type": protocol.ENDED, "trial": channel.trial_id, "outcome": outcome, "error": _clean(error)}
            with self._ending:
                if channel.exit_timer is not None:
                    channel.exit_timer.cancel()
                self.outbox.send(message)
                channel.ended = True

    def _outcome(self, channel: _TrialChannel, command: dict[str, Any]) -> tuple[str, str | None]:
        """Run the trial and close its logs: how it ended, and why it failed."""
        directory = Path(command["directory"])
        outcome, error = protocol.OK, None
        work_for(channel.trial_id)  # this thread, and those it starts: what they print goes to the trial's logs
        try:
            self.stdout.open_for(channel.trial_id, directory)
            self.stderr.open_for(channel.trial_id, directory)
            # As a process of its own starts: not where the worker's previous trial left its directory and generators
            os.chdir(self.home)
            reseed_rng()
            unreported = _call(channel, command, directory)
            if unreported is not None:  # it would end the same way run again: no crash to run again
                outcome, error = protocol.MISUSED, unreported
        except NotRegularFile as exception:  # its log, at its start or at a print after it parked: it fails alone
            outcome, error = protocol.FAILED, f"cannot open its log: {exception}"
        except SuspendExit:
            outcome = protocol.SUSPENDED
        except StopExit:
            outcome = protocol.STOPPED
        except SystemExit as exit:  # sys.exit() in the trial: its code says how it went
            code = _exit_code(exit.code)
            if code != 0:
                outcome, error = protocol.FAILED, f"exit code {code}"
        except BaseException as exception:
            if isinstance(exception, OSError) and exception.errno in STORAGE_LIMIT_ERRNOS:
                outcome, error = protocol.NO_SPACE, str(exception)
            elif isinstance(exception, ResumeError):  # run again, it would do the same: no crash to run again
                outcome, error = protocol.MISUSED, f"{type(exception).__name__}: {_said(exception)}"
            else:
                outcome, error = protocol.FAILED, f"uncaught {type(exception).__name__}: {_said(exception)}"
            try:  # its traceback goes to its stderr.log, as in a process of its own
                traceback.print_exc()
            except OSError:
                pass  # no log to read it from: the error says what it can
        finally:
            bind(None)
            for stream in (self.stdout, self.stderr):
                try:
                    stream.close_for(channel.trial_id)
                except OSError:
                    pass  # a full disk: what could not be written is lost, the trial's outcome is not
            del self.channels[channel.trial_id]
        if channel.suspended:  # however the function ended then: a thread of it that was suspended ends quietly
            outcome, error = protocol.SUSPENDED, None
        if channel.no_timer is not None:  # the run stops for the host's limit; a rerun continues the trial
            outcome, error = protocol.HOST_LIMIT, channel.no_timer
        return outcome, error


def _said(exception: BaseException) -> str:
    """The exception's text, or what Python's traceback writes where its ``__str__`` raises."""
    try:
        return str(exception)
    except Exception:  # a bug of the trial's exception class: the trial fails all the same
        return "<exception str() failed>"


def _clean(error: str | None) -> str | None:
    """An error's text in UTF-8 the executor can store and print: a lone surrogate escaped (``\\udcff``), as the
    traceback in a trial's own process writes it to its stderr.log."""
    return None if error is None else error.encode("utf-8", "backslashreplace").decode("utf-8")


def _call(channel: _TrialChannel, command: dict[str, Any], directory: Path) -> str | None:
    """Run the trial's function in a session of its own, which ends with this call: the trial's model and optimizer,
    which the session holds through its savers, are freed with it. Why the trial fails where its function returned a
    value and it never reported (``returned_unread``)."""
    session = Session(
        channel.trial_id,
        directory,
        channel,
        budget=int(command["budget"]),
        metric=command["metric"] or None,
        checkpoint_every=int(command["checkpoint_every"]),
        reported_step=int(command["reported_step"]),
        in_worker=True,
    )
    bind(session)
    function = _function(command["function"])
    return returned_unread(function, function(session.config), session, int(command["reported_step"]))


def _free_what_it_left() -> None:
    """A trial's run ended (completed, failed, stopped, or spilled to go on elsewhere): free now what its code left in
    reference cycles, and torch's CUDA cache, before the next trial starts here. Numpy's and torch's memory never
    prompts Python's cyclic collector, so its model would stay, on the GPU too, until the collector happened to run;
    the worker's memory limit (worker_memory_limit) is measured after this."""
    gc.collect()
    release_device_cache()


def _exit_code(code: object) -> int:
    """The exit code ``sys.exit(code)`` gives a process of its own: None is 0, an int itself, and anything else
    (``sys.exit("dataset not found")``) is written to its stderr, and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    try:
        print(code, file=sys.stderr)  # the trial's stderr.log: the thread works for the trial
    except OSError:
        pass  # no log to read it from: the exit code says what it can
    return 1


def _function(reference: str) -> Callable[[dict[str, Any]], Any]:
    module_name, _, function_name = reference.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def _warm_up(module_name: str, script: list[str]) -> None:
    """Import the trials' module (and so their framework), with the command line it would have run with in place of
    the worker's (``set_trial_argv``), limit torch's threads to the slot's share, and create the CUDA context now
    rather than in the first trial."""
    if module_name:
        set_trial_argv(module_name, script)
        importlib.import_module(module_name)
    torch = sys.modules.get("torch")
    if torch is None:
        return
    threads = os.environ.get(protocol.ENV_THREADS)
    if threads:
        torch.set_num_threads(int(threads))
    if torch.cuda.is_available():
        torch.cuda.init()


def _signal_handlers_stay_the_workers() -> None:
    """``signal.signal`` in a trial's thread installs nothing and says so on the trial's stderr, where Python refuses
    it (a handler is the main thread's, and the worker's). It would never be called: Hermes sends a trial no signal
    but SIGKILL (it suspends it at a report, its checkpoint committed), and a trial's handler that exits would end
    the worker and the trials parked in it."""
    install = signal.signal

    def install_unless_in_a_trial(signum: int, handler: Any) -> Any:
        if trial_of_thread() is None:  # the worker's own threads: its main thread, say, importing the module
            return install(signum, handler)
        previous = signal.getsignal(signum)  # and an unknown signal raises ValueError, as signal.signal does
        name = getattr(signum, "name", signum)
        print(f"hermes: signal.signal({name}, ...) is ignored: a trial in a warm worker runs in a thread, and Hermes "
              "sends it no signal (trial: {warm_workers: false} runs it in a process of its own)",
              file=sys.stderr, flush=True)
        return previous

    signal.signal = install_unless_in_a_trial  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    faulthandler.enable()  # a segfault leaves its stack in the worker's log
    home = os.getcwd()
    sys.path.insert(0, home)
    outbox = _Outbox(int(os.environ[protocol.ENV_WORKER_CHANNEL]))
    stdout, stderr = _TrialStreams(sys.stdout, "stdout.log"), _TrialStreams(sys.stderr, "stderr.log")
    sys.stdout, sys.stderr = stdout, stderr
    follow_threads()
    _signal_handlers_stay_the_workers()
    commands = _commands_apart()
    module_name, *script = argv or [""]
    _warm_up(module_name, script)
    gc.collect()
    gc.freeze()  # the imports live as long as the worker: the collection after each trial skips them
    Worker(outbox, stdout, stderr, home).serve(commands)


def _commands_apart() -> TextIO:
    """The executor's commands on a descriptor of their own, with /dev/null as stdin.

    The command loop blocks in a read of its file, holding that file's lock. A trial's process forked
    meanwhile (a DataLoader's workers: multiprocessing closes ``sys.stdin`` in every child it forks)
    would wait for ever on that lock, held by a thread it does not have; and a program the trial runs
    would read the commands meant for the worker."""
    commands = os.fdopen(os.dup(sys.stdin.fileno()), "r", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, sys.stdin.fileno())
    os.close(null)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115  (for the process's life)
    return commands


if __name__ == "__main__":
    main(sys.argv[1:])
