"""The ``hermes`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from contextlib import (
    AbstractContextManager,
    contextmanager,
    nullcontext,
    redirect_stdout,
    suppress,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from hermes.errors import ClusterLost, HermesError, HostLimit, NoSpaceError, install_extra
from hermes.server.config import MAX_ACTIVE, ServerConfig

if TYPE_CHECKING:
    from hermes.core.decisions import Decision
    from hermes.core.events import Event
    from hermes.core.trial import Trial
    from hermes.experiment import ExperimentSpec
    from hermes.server.client import Client
    from hermes.session import ExperimentSession, Listener
    from hermes.sim.trace import Trace
    from hermes.store import ExperimentRecord, ExperimentStatus, ExperimentStore

GPUS_PER_NODE = 8  # default node size when --nodes is not given, like a DGX-class server
# What stopped a run for its storage (hermes.errors.STORAGE_LIMIT_ERRNOS), and what lifts it
STORAGE_LIMITS = {
    errno.ENOSPC: ("no space left", "free some space"),
    errno.EDQUOT: ("disk quota exceeded", "free some space, or have the quota raised"),
    errno.EFBIG: ("a file reached the file-size limit", "raise the file-size limit (`ulimit -f unlimited`)"),
    errno.EROFS: ("read-only file system", "make it writable again (remount it read-write)"),
}
UNKNOWN_STORAGE_LIMIT = ("no space left, or a storage limit", "free some space, or lift the limit")
# What lifts a limit of the host that stopped a run (hermes.errors.HOST_LIMIT_ERRNOS), open files aside
HOST_LIMITS = {
    errno.ENFILE: "raise the system's limit of open files (`sysctl fs.file-max`)",
    errno.EAGAIN: "raise the limit of processes (`ulimit -u`, or a container's pids limit)",
    errno.ENOMEM: "free some memory",
}
OPEN_FILES_PER_TRIAL = 5  # what a paused program holds of the runner's (hermes.local.system.raise_open_file_limit)
# `hermes results --format`: here, not in hermes.report.results, whose import to build the parser took most of a
# second (the store's modules), in which a `hermes run` could not take SIGTERM yet (``_terminations_as_ctrl_c``)
RESULT_FORMATS = ("table", "csv", "json")
TABLE_TOP = 10  # trials `hermes results` shows in its table unless --top says; csv and json give every one


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hermes", description="Hermes: a preemptive GPU scheduler that makes hyper-parameter searches finish sooner."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run(commands)
    _add_simulate(commands)
    _add_status(commands)
    _add_list(commands)
    _add_results(commands)
    _add_plot(commands)
    _add_trace(commands)
    _add_server(commands)
    _add_submit(commands)
    _add_cancel(commands)
    args = parser.parse_args(argv)
    # `run` drops an output it cannot write and goes on; the others have nothing but their output to give
    if sys.stdout is None:  # closed (`>&-`): what it prints goes nowhere, as Python's print does then
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    output = nullcontext() if args.handler is _run else redirect_stdout(_OutputStream(sys.stdout))
    try:
        with output:
            _choose_server(args)
            code = args.handler(args)
            sys.stdout.flush()  # a reader that went away shows here at the latest, inside the try
        return code
    except HermesError as error:
        print(f"hermes: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (`hermes status | head`): stop quietly, as Python's docs
        # advise, with stdout sent to devnull so that the interpreter's last flush has nowhere to fail.
        _stdout_to_devnull()
        return 1
    except _OutputUnwritable as error:  # a full disk under `hermes results > file`: said as `--out` says it
        _stdout_to_devnull()
        with suppress(OSError):  # stderr may be on that disk too
            print(f"hermes: error: cannot write the output: {error.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a command interrupted, or a second Ctrl-C while `run` said it was interrupted
        return 130


class _OutputUnwritable(OSError):
    """Stdout could not be written (not a closed pipe): told apart from the OSErrors of the command's own work."""


class _OutputStream:
    """Stdout, whose write errors other than a closed pipe's are raised as _OutputUnwritable."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with self._unwritable_said():
            return self._stream.write(text)

    def flush(self) -> None:
        with self._unwritable_said():
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @staticmethod
    @contextmanager
    def _unwritable_said() -> Iterator[None]:
        try:
            yield
        except (BrokenPipeError, _OutputUnwritable):
            raise
        except OSError as error:
            raise _OutputUnwritable(error.errno, error.strerror) from error


def _stdout_to_devnull() -> None:
    """Send stdout to /dev/null, which takes the lines still buffered, so that no later flush fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="run an HPO experiment on this machine (GPUs, or CPU slots), or continue it",
        description="Run the experiment a YAML spec describes; run it again to continue after a crash.",
    )
    run.add_argument("spec", help="experiment spec (YAML)")
    run.add_argument("--name", help="the experiment's name, in place of the spec's (to run one spec twice)")
    run.add_argument("--no-live", action="store_true", help="no live view; print a line per finished trial")
    run.add_argument("--top", type=positive_int, default=5, metavar="N", help="trials in the final leaderboard (default 5)")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    with _terminations_as_ctrl_c() as terminations:
        try:
            return _run_taking(args, terminations)
        except KeyboardInterrupt:  # outside its set-up and its run: as it showed the results, say
            return 128 + (terminations.received or signal.SIGINT)


def _run_taking(args: argparse.Namespace, terminations: _Terminations) -> int:
    """`hermes run`, with SIGTERM and SIGHUP taken as Ctrl-C (``terminations``)."""
    from contextlib import closing

    again = f"hermes run {_shell_word(args.spec)}" + (f" --name {_shell_word(args.name)}" if args.name is not None else "")
    try:
        with _interrupts_unwrapped(terminations):
            with _ctrl_c_noted(terminations):  # where pydantic builds the spec's model classes, and checks it
                from rich.console import Console

                from hermes.experiment import load_spec
                from hermes.live import LiveView
                from hermes.report import ExperimentView, every_trial_failed, printable
                from hermes.report.results import format_results, standings
                from hermes.session import (
                    ExperimentSession,
                    Terminated,
                    interrupts_between_batches,
                )
                from hermes.store import StoreUnavailable

                spec = load_spec(args.spec, args.name)
            session = ExperimentSession(spec)  # Ray's start holds Ctrl-C back under Python's own handler alone
    except KeyboardInterrupt:  # nothing ran yet; an experiment its store made is recorded interrupted
        print("interrupted before the experiment started", file=sys.stderr)
        return 128 + (terminations.received or signal.SIGINT)
    except NoSpaceError as error:  # not even its runner lock could be written
        what, fix = _storage_limit(error)
        print(f"hermes: error: {what}: {error}\n{fix}, then run `{again}`", file=sys.stderr)
        return 2
    try:
        if terminations.received:  # a library of the set-up took the interrupt for an error, and let that go
            raise KeyboardInterrupt
        console = Console(emoji=False)  # a trial's error or a metric that says :x: is text, not an emoji
        # A terminal that redraws: not a file or a pipe (FORCE_COLOR made Rich call them terminals, and filled logs
        # with frames), nor TERM=dumb (Emacs' shell, where Rich draws nothing until the end)
        if args.no_live or not (sys.stdout.isatty() and console.is_interactive):
            session.listeners.append(_progress_printer(session))
            view = nullcontext()
        else:
            console.file = _DroppedWhenUnwritable(sys.stdout, sys.stderr)  # its terminal may go, SIGHUP ignored
            clock = lambda: session.executor.now() if session.executor else 0.0  # noqa: E731
            view = LiveView(spec.name, spec.metric.name, spec.metric.mode, session.scheduler, clock, console,
                            budget=session.budget, in_flight=session.searcher.max_pending)
            session.listeners += [view, _progress_printer(  # above the view: what its table cannot say
                session, lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
                only_errors=True)]
    except KeyboardInterrupt:  # between its set-up and its run: nothing ran, and it is said as after its run
        session.abandon()
        print(f"interrupted: run `{again}` again to continue", file=sys.stderr)
        return 128 + (terminations.received or signal.SIGINT)
    started = False  # session.run() was called, which records how the run ended
    try:
        with interrupts_between_batches(session, hangups=terminations.hangups), view:
            started = True
            outcome = session.run()
    except KeyboardInterrupt as interrupt:
        if not started:  # as the run's signal handlers or the live view started: nothing ran, nor recorded it
            session.abandon()
        ended = _ended_status(session)
        if ended is None:
            print(f"interrupted: run `{again}` again to continue", file=sys.stderr)
        else:  # it came as the run wrote its end, which went first: nothing is left to continue
            results = f"hermes results {shlex.quote(str(session.storage))} --experiment {shlex.quote(spec.name)}"
            print(f"interrupted as it ended: {spec.name} is {ended.value}; `{results}` shows its trials",
                  file=sys.stderr)
        # the signal itself: Ray's wait makes a plain KeyboardInterrupt of a Terminated, and ``terminations`` took
        # one that came as the run's handlers were put in place or taken out
        signum = session.interrupted_by or terminations.received or (
            signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
        return 128 + signum
    except NoSpaceError as error:
        what, fix = _storage_limit(error)
        print(f"hermes: error: {what}: {error}\ninterrupted: {fix}, then run `{again}` again to continue",
              file=sys.stderr)
        return 2
    except StoreUnavailable as error:
        print(f"hermes: error: the store {error}\ninterrupted: run `{again}` again to continue once it can be "
              "written", file=sys.stderr)
        return 2
    except ClusterLost as error:
        print(f"hermes: error: {error}\ninterrupted: run `{again}` again to continue once the cluster is back",
              file=sys.stderr)
        return 2
    except HostLimit as error:
        rename = f"hermes run {_shell_word(args.spec)} --name {shlex.quote(f'{spec.name}-2')}"
        print(f"hermes: error: this machine ran out of what a trial needs: {error}\ninterrupted: "
              f"{_host_limit_fix(error, session)}, then run `{again}` again to continue; or lower search.max_pending "
              f"in {args.spec}, for fewer trials under way, and run it as a new experiment (`{rename}`): a rerun of "
              "this one may not change it", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hermes run spec.yaml | head`: the reader went away
        print(f"interrupted: its output was closed; run `{again}` again to continue", file=sys.stderr)
        raise
    with closing(session.store) as store:
        experiment = store.experiment(outcome.experiment_id)
        report = ExperimentView.load(store, experiment)
        why = f": {session.ended_by}" if session.ended_by and session.failure is None else ""
        if not outcome.ran and (spent := _spent_before(store, experiment, spec)):
            why = f": {spent}"
    with _unwritable_output_dropped():
        print(f"{spec.name}: {outcome.status.value}{' (continued)' if outcome.resumed else ''}{why}; "
              f"store {session.storage / 'hermes.db'}")
        print(format_results(report, standings(report)[: args.top], "table"), flush=True)
    error = session.failure or every_trial_failed(report.trials)
    if error is None:
        return 0
    # a spec, a script or a searcher that cannot work: said where CI looks, the exit code
    print(f"hermes: error: {printable(error)}", file=sys.stderr)
    if not outcome.ran:  # the error of its last run, not of the code as it is now
        rename = f"hermes run {_shell_word(args.spec)} --name {shlex.quote(f'{spec.name}-2')}"
        more = "" if session.failure else ", or raise search.trials to add trials to this one"  # not past its failure
        print(f"{spec.name} had already ended, so nothing ran: this error is its earlier run's, and an ended "
              f"experiment's failed trials are not run again; to run changed code, run it as a new experiment "
              f"(`{rename}`){more}", file=sys.stderr)
    return 1


def _shell_word(text: str) -> str:
    """``text`` quoted as one word that bash reads back as the same bytes. An argument that holds bytes that are not
    UTF-8 (which Python holds as lone surrogates, "\\udcff") in bash's ``$'...'`` form, each such byte as ``\\xff``:
    quoted as text, the command printed to run it again named no file. Anything else as ``shlex.quote`` quotes it."""
    if not any(_undecoded(character) for character in text):
        return shlex.quote(text)
    escaped = []
    for character in text:
        if _undecoded(character) or not character.isprintable():
            escaped += [f"\\x{byte:02x}" for byte in os.fsencode(character)]
        else:
            escaped.append("\\" + character if character in "\\'" else character)
    return f"$'{''.join(escaped)}'"


def _undecoded(character: str) -> bool:
    """Whether ``character`` is a byte that was not UTF-8, as ``os.fsdecode`` holds it."""
    return "\udc80" <= character <= "\udcff"


def _spent_before(store: ExperimentStore, experiment: ExperimentRecord, spec: ExperimentSpec) -> str | None:
    """Why an experiment that had ended, which this rerun did not run, ended before its searcher did, as its log says,
    and what lets it go on: its spent budget of time or GPU hours, which a larger trial budget leaves spent."""
    from hermes.report.status import ended_by
    from hermes.session import BUDGET_SPENT

    reason = ended_by(experiment, store.events(experiment.experiment_id))
    if reason != BUDGET_SPENT:
        return reason
    budgets = " or ".join(f"search.{name}" for name in ("max_time", "max_gpu_hours")
                          if getattr(spec.search, name) is not None)
    return f"{reason}, so nothing ran: raise {budgets or 'it'} to run more"


@dataclasses.dataclass
class _Terminations:
    """The signals ``_terminations_as_ctrl_c`` takes: SIGTERM, and SIGHUP where ``hangups``; the first that came (or
    Ctrl-C, while the run reads its spec: ``_ctrl_c_noted``)."""

    hangups: bool
    received: int | None = None


@contextmanager
def _terminations_as_ctrl_c() -> Iterator[_Terminations]:
    """SIGTERM, and SIGHUP (its terminal or SSH session closed) where it would end the process (under nohup it is
    ignored, and stays so), raise KeyboardInterrupt where they come, as Ctrl-C does: so `hermes run` takes them from
    its start, its imports included, until its engine loop takes them between batches (``interrupts_between_batches``),
    and after. Left to their default, they ended the process as it set up, in the middle of the store's first write
    (a hot journal beside a store with no tables), and said and recorded nothing: an exception rolls that write back,
    and an experiment already made is recorded interrupted, as for Ctrl-C. A second one ends the process."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield _Terminations(hangups=False)
        return
    terminations = _Terminations(hangups=signal.getsignal(signal.SIGHUP) is signal.SIG_DFL)
    terminals = [fd for fd in (1, 2) if os.isatty(fd)]  # known now: a hung-up terminal answers no question

    def interrupt(signum: int, _frame: Any) -> None:
        terminations.received = terminations.received or signum
        signal.signal(signum, signal.SIG_DFL)
        if signum == signal.SIGHUP:  # what is said of it goes nowhere, not to an error (EIO) from the closed terminal
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in terminals:
                os.dup2(devnull, fd)
            os.close(devnull)
        raise KeyboardInterrupt

    handled = [signal.SIGTERM] + [signal.SIGHUP] * terminations.hangups
    previous = {signum: signal.signal(signum, interrupt) for signum in handled}
    try:
        yield terminations
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def _interrupts_unwrapped(terminations: _Terminations) -> Iterator[None]:
    """An exception raised after an interrupt (``terminations``) raised as KeyboardInterrupt: a library it interrupted
    may make an error of its own of it (pydantic, building a model class as a module is imported, raises SchemaError,
    which chains nothing), which was a traceback and exit code 1 where the run was interrupted."""
    try:
        yield
    except Exception as error:
        if terminations.received is None:
            raise
        raise KeyboardInterrupt from error


@contextmanager
def _ctrl_c_noted(terminations: _Terminations) -> Iterator[None]:
    """Ctrl-C noted in ``terminations`` as it raises KeyboardInterrupt, where Python's own handler has it: so that
    ``_interrupts_unwrapped`` knows it came, whatever a library made of it."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        terminations.received = terminations.received or signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _ended_status(session: ExperimentSession) -> ExperimentStatus | None:
    """The experiment's status where the store has it ended (``is_final``); None where it does not, or cannot say."""
    try:
        status = session.store.experiment(session.experiment_id).status
    except HermesError:
        return None
    return status if status.is_final else None


def _host_limit_fix(error: HostLimit, session: ExperimentSession) -> str:
    """What lifts the limit of the host that stopped the run (``HOST_LIMITS``). Out of open files, a limit that holds
    every trial that may be under way, by the numbers of this run: its limit, already raised to its hard limit
    (``raise_open_file_limit``), did not."""
    import resource

    number = getattr(error.__cause__, "errno", None)  # of the OSError it comes from
    if number != errno.EMFILE:
        return HOST_LIMITS.get(number, "raise the limit it names")
    limit, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    trials = session.searcher.max_pending or session.spec.search.trials
    needed = max(2 * limit, limit + OPEN_FILES_PER_TRIAL * (trials or 0))
    wanted = 1 << (needed - 1).bit_length()  # a round number
    under_way = f", for up to {trials} trials under way" if trials else ""
    past_hard = (f"; past its hard limit, {hard}, only as root or in /etc/security/limits.conf"
                 if hard != resource.RLIM_INFINITY and wanted > hard else "")
    return (f"raise the limit (`ulimit -n` for open files) from {limit} to {wanted} or so{under_way} (`ulimit -n "
            f"{wanted}` in the shell that runs it{past_hard})")


def _storage_limit(error: NoSpaceError) -> tuple[str, str]:
    """What stopped the run, and its fix (``STORAGE_LIMITS``): the errno of the OSError under ``error`` where one is
    chained (a file of the runner's own), else the first that its text says ("[Errno 27]", or "File too large"): a
    trial's comes from its process as text. A full store says so in its own words."""
    from hermes.store import StoreFull

    cause = error.__cause__
    if isinstance(cause, OSError) and cause.errno in STORAGE_LIMITS:
        return STORAGE_LIMITS[cause.errno]
    if isinstance(error, StoreFull):
        return STORAGE_LIMITS[errno.ENOSPC]
    text = str(error)
    said = {
        text.find(marker): number
        for number in STORAGE_LIMITS
        for marker in (f"[Errno {number}]", os.strerror(number))
        if marker in text
    }
    return STORAGE_LIMITS[said[min(said)]] if said else UNKNOWN_STORAGE_LIMIT


def _again(trial: Trial) -> str:
    """Where a crashed trial's next run starts: a program that keeps its state in its process (not movable) starts
    over and catches up the steps it reported; another resumes from the last checkpoint it saved, and catches up to
    the step the core knows. That step is not said to be where it resumes: a trial parked in its warm worker's
    memory counts as checkpointed there, and one that saved none retrains from its beginning."""
    if not trial.step:
        return "it runs again from its beginning"
    if not trial.movable:
        return f"it starts again from its beginning, catching up to step {trial.step}"
    return f"it runs again from its last saved checkpoint (or its beginning), catching up to step {trial.step}"


@contextmanager
def _unwritable_output_dropped(stderr: Any = None) -> Iterator[None]:
    """What the block prints, dropped where stdout cannot be written (a full disk under its file, a terminal gone
    while SIGHUP is ignored: EIO), and all that follows: stdout goes to /dev/null, which takes the lines still
    buffered too, and that is said once on ``stderr`` (default: sys.stderr). The run goes on, its store has it all;
    the error of a line stopped the experiment ("no space left: a file"). A reader gone (BrokenPipeError:
    `hermes run | head`) still stops it."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        _stdout_to_devnull()
        with suppress(OSError):  # stderr may be on that disk, or that terminal, too
            print(f"hermes: warning: its output cannot be written ({error.strerror}): what it prints there is "
                  "dropped from here on, and the experiment goes on", file=stderr or sys.stderr, flush=True)


class _DroppedWhenUnwritable:
    """The live view's stdout, each write in ``_unwritable_output_dropped``: Rich writes from its refresh thread and
    as the view stops, where no `with` of the run reaches (a traceback and exit code 1 for an experiment that
    finished). ``stderr``: the real one, taken before the view redirects sys.stderr to the console it draws on."""

    def __init__(self, stream: Any, stderr: Any) -> None:
        self._stream, self._stderr = stream, stderr

    def write(self, text: str) -> int:
        with _unwritable_output_dropped(self._stderr):
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with _unwritable_output_dropped(self._stderr):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _SaidAtFlush:
    """A listener (``listen``) whose lines (``lines``, which it fills) are said at its ``flush``: the engine flushes
    its listeners in their order once a batch went through them, the store's recorder first (its commit). Said at
    once, a line came before the commit: a trial said completed that a kill -9 then left running in the store, and
    its rerun said completed again."""

    def __init__(self, listen: Listener, lines: list[str], say: Callable[[str], None]) -> None:
        self._listen, self._lines, self._say = listen, lines, say

    def __call__(self, event: Event, decisions: list[Decision]) -> None:
        self._listen(event, decisions)

    def flush(self) -> None:
        lines = self._lines[:]
        self._lines.clear()
        for line in lines:
            with _unwritable_output_dropped():
                self._say(line)


def _progress_printer(session: ExperimentSession, say: Callable[[str], None] | None = None,
                      only_errors: bool = False) -> _SaidAtFlush:
    """Without a terminal: one line per trial that ends, for logs and CI. An error shows as its reason and its
    exception (``summarise_error``): a program that logs to stderr says much before it; its control characters
    escaped (``printable``), which a terminal would obey. With the live view (``only_errors``, said through ``say``,
    above the view): the crashes and failures, which its table cannot say. Each line once the store has what it says
    (``_SaidAtFlush``)."""
    from hermes.core.decisions import Stop
    from hermes.core.events import (
        GpuAdded,
        GpuRemoved,
        NodeAdded,
        NodeRemoved,
        TrialExited,
        TrialSuspended,
    )
    from hermes.report import printable, summarise_error

    lines: list[str] = []  # said at the flush
    present: set[str] = set()  # the nodes and GPUs of this run (a continued run's log names the last one's, gone)

    def ended(trial: Trial, at: float) -> None:
        # its last report, not the core's step: a crash sets that back to its checkpoint's, behind the reports
        step = trial.steps[-1] if trial.steps else 0
        value = f", {session.spec.metric.name} {trial.values[-1]:.4g}" if trial.values else ""
        error = f" ({printable(summarise_error(trial.error, width=120))})" if trial.error else ""
        if only_errors and not trial.error:
            return
        where = f"at step {step}" if step else "before its first report"  # a trial a budget ended unstarted
        lines.append(f"[{at:8.1f}s] trial {trial.trial_id} {trial.state.value} {where}{value}{error}")

    def show(event: Event, decisions: list[Decision]) -> None:
        if isinstance(event, NodeAdded):
            present.update([event.node, *event.gpus])
        elif isinstance(event, GpuAdded):
            present.add(event.gpu)
        elif isinstance(event, (NodeRemoved, GpuRemoved)):  # a node (a Ray node, say) or a GPU of this run is gone
            lost = event.node if isinstance(event, NodeRemoved) else event.gpu
            if lost in present:
                present.discard(lost)
                kind = "node" if isinstance(event, NodeRemoved) else "GPU"
                lines.append(f"[{event.at:8.1f}s] {kind} {lost} lost: what ran there resumes elsewhere from its last "
                             "checkpoint")
        elif isinstance(event, TrialExited):
            trial = session.scheduler.trials[event.trial_id]
            if not trial.state.is_terminal:  # it crashed, and runs again
                reason = printable(summarise_error(event.error or "no reason given", width=120))
                lines.append(f"[{event.at:8.1f}s] trial {trial.trial_id} crashed ({reason}); crash {trial.crashes} "
                             f"of trial.max_failures {session.scheduler.max_failures}, {_again(trial)}")
            else:
                ended(trial, event.at)
        elif isinstance(event, TrialSuspended):  # stopped as it was suspending (its Stop came before): it ends here
            trial = session.scheduler.trials[event.trial_id]
            if trial.state.is_terminal:
                ended(trial, event.at)
        for decision in decisions:  # a waiting or suspended trial stopped ends now: no exit of its own follows
            if isinstance(decision, Stop) and getattr(event, "trial_id", None) != decision.trial_id:
                trial = session.scheduler.trials[decision.trial_id]
                if trial.state.is_terminal:
                    ended(trial, event.at)

    return _SaidAtFlush(show, lines, say or (lambda line: print(line, flush=True)))


COMPARED_SEEDS = 10  # seeds --compare averages over unless --seeds says
UNREPORTED_SHOWN = 10  # trials named in the line of those stopped before their first report


def _add_simulate(commands: argparse._SubParsersAction) -> None:
    from hermes.policies import POLICIES, STOPPERS
    from hermes.sim.costs import PROFILES

    sim = commands.add_parser(
        "simulate",
        help="replay a recorded learning-curve trace under a scheduling policy",
        description="Replay a learning-curve trace in simulated time with the real scheduling core.",
    )
    sim.add_argument("--trace", required=True,
                     help="CSV with header trial,epoch,metric,seconds[,param_*][,state_mb][,movable]; or the storage "
                          "dir of a run, whose experiment is replayed (see `hermes trace`)")
    sim.add_argument("--experiment", help="with a storage dir: the experiment (default: the newest in the store)")
    sim.add_argument("--mode", choices=("max", "min"),
                     help="direction in which the metric improves (a CSV needs it; a stored experiment knows it)")
    sim.add_argument("--gpus", required=True, type=positive_int, help="GPUs of the simulated cluster")
    sim.add_argument("--nodes", type=positive_int, help=f"default: one node per {GPUS_PER_NODE} GPUs")
    sim.add_argument("--policy",
                     help=f"{', '.join(POLICIES)} (default hermes), or a policy of your own as module:Class, looked "
                          "for in the current folder first")
    sim.add_argument("--stopper", help=f"optional early stopping: {', '.join(STOPPERS)}, or module:Class")
    sim.add_argument("--period", type=_positive_period, help="scheduling period in seconds (default: the policy's)")
    sim.add_argument("--seed", type=_non_negative_int, default=0,
                     help="seed of the random arrival order (with --compare: the first of --seeds)")
    sim.add_argument("--costs", default="warm", choices=PROFILES,
                     help="switch-cost profile: warm workers (default) or a process per run (hermes/sim/calibration.json)")
    sim.add_argument("--state-mb", type=_size,
                     help="state size of trials whose trace gives none, or that kept no checkpoint (default 100)")
    sim.add_argument("--target-tolerance", default="1%",
                     help="time to target: within this of the best final metric, absolute (0.5) or relative (2%%); "
                          "default %(default)s")
    sim.add_argument("--json", action="store_true",
                     help="print the figures as one JSON object (with --compare: a list, an object per policy)")
    sim.add_argument("--compare", help="comma-separated policies to compare, e.g. fifo,rr,slaq,hermes")
    sim.add_argument("--seeds", type=positive_int,
                     help=f"with --compare: how many seeds to average over, from --seed on (default {COMPARED_SEEDS})")
    sim.add_argument("--workers", type=positive_int, help="with --compare: processes to use (default 1)")
    sim.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from hermes.policies import policy_class, stopper_class
    from hermes.sim.compare import Setting, compare, format_table, run_one
    from hermes.sim.costs import SwitchCosts
    from hermes.sim.simulate import Tolerance
    from hermes.sim.trace import load_trace

    if Path(args.trace).is_dir():
        trace = _stored_trace(argparse.Namespace(dir=args.trace, experiment=args.experiment, server=None))
        if args.state_mb is not None:  # for the trials that kept no checkpoint to size their state by
            trace = dataclasses.replace(trace, trials=tuple(
                trial if trial.state_mb is not None else dataclasses.replace(trial, state_mb=args.state_mb)
                for trial in trace.trials))
        if args.mode is not None and args.mode != trace.mode:
            raise HermesError(f"--mode {args.mode}: the experiment's metric improves the other way ({trace.mode})")
    elif args.mode is None:
        if not Path(args.trace).exists():  # the path's mistake first: naming --mode sent the user the wrong way
            raise HermesError(f"{args.trace}: cannot open: no such file or storage dir")
        raise HermesError(f"--mode max or min: in which direction the metric of {args.trace} improves")
    else:
        trace = load_trace(args.trace, args.mode, state_mb=args.state_mb)
    period = {} if args.period is None else {"period": args.period}  # what run_one builds each policy with
    policy = args.policy or "hermes"
    if not args.compare:
        _loadable(policy_class, policy, f"--policy {policy}", **period)
    if args.stopper is not None:
        _loadable(stopper_class, args.stopper, f"--stopper {args.stopper}")
    _refuse_what_has_no_effect(args)
    nodes = args.nodes or math.ceil(args.gpus / GPUS_PER_NODE)
    if nodes > args.gpus:
        raise HermesError(f"--nodes {nodes}: more nodes than the {args.gpus} GPUs (each node needs one)")
    try:
        setting = Setting(
            gpus=args.gpus, nodes=nodes, period=args.period, stopper=args.stopper,
            costs=SwitchCosts.profile(args.costs), target=Tolerance.parse(args.target_tolerance),
            plugins_from=Path.cwd(),
        )
    except ValueError as error:
        raise HermesError(str(error)) from None
    if args.compare:
        policies = [name.strip() for name in args.compare.split(",") if name.strip()]
        if not policies:
            raise HermesError(f"--compare {args.compare!r}: no policy")
        for name in policies:
            _loadable(policy_class, name, f"--compare {args.compare!r}", **period)
        twice = next((name for i, name in enumerate(policies) if name in policies[:i]), None)
        if twice:  # its runs would merge into one row that counts each seed twice
            raise HermesError(f"--compare {args.compare!r}: policy {twice!r} is named twice")
        count = args.seeds or COMPARED_SEEDS
        seeds = range(args.seed, args.seed + count)
        summaries = compare(trace, policies, seeds, setting, workers=args.workers or 1)
        if args.json:
            _print_json([_nan_as_null(s.figures()) for s in summaries])
        else:
            first = f" from {args.seed}" if args.seed else ""
            print(f"{trace.path}: {len(trace.trials)} trials, {args.gpus} GPUs on {nodes} node(s), "
                  f"{count} seeds{first}")
            print(format_table(summaries))
        return 0
    result = run_one(trace, policy, args.seed, setting)
    figures: dict[str, Any] = {}
    for key, value in result.figures().items():
        figures[key] = value
        if key == "trials":  # and those the policy never ran, which a real run ends "before its first report"
            figures["stopped_before_first_report"] = list(result.stopped_before_first_report)
            figures["stopped_before_first_report_why"] = list(result.stopped_before_first_report_why)
    if args.json:
        _print_json(_nan_as_null(figures))
    else:
        for key, value in figures.items():
            if key == "stopped_before_first_report":
                shown = ", ".join(value[:UNREPORTED_SHOWN]) + (", ..." if len(value) > UNREPORTED_SHOWN else "")
                print(f"{key:>27}: {len(value)}{f' ({shown})' if value else ''}")
            elif key == "stopped_before_first_report_why":
                for why in value:
                    print(f"{'why':>27}: {why}")
            elif key != "best_curve":
                print(f"{key:>27}: {value}")
    return 0


def _refuse_what_has_no_effect(args: argparse.Namespace) -> None:
    """Options that would change nothing: the user meant something else (``--seeds`` for one run asked for an
    average, and got seed 0)."""
    if args.compare and args.policy is not None:
        raise HermesError(f"--policy {args.policy}: --compare names the policies; add it there")
    if not args.compare:
        given = [option for option, value in (("--seeds", args.seeds), ("--workers", args.workers))
                 if value is not None]
        if given:
            raise HermesError(f"{' and '.join(given)}: only with --compare (a single run is of --seed {args.seed})")
    if args.experiment is not None and not Path(args.trace).is_dir():
        raise HermesError(f"--experiment {args.experiment}: only with a storage dir as --trace, not a CSV")


def _loadable(load: Callable[[str], type], name: str, option: str, **params: Any) -> None:
    """Load and build it once, with the arguments the simulator gives it, so that a class that cannot be
    built (abstract, wanting other arguments, or failing in its constructor) is refused now, as `hermes run` refuses
    it, not in a traceback.
    A class of one's own is looked for in the current folder first (``Setting.plugins_from``)."""
    from hermes.plugins import construct, importable_from

    with importable_from(Path.cwd()):
        try:
            cls = load(name)
        except ValueError as error:  # it cannot be loaded, and says why
            raise HermesError(f"{option}: {error}") from None
        try:
            construct(cls, params)  # as run_one builds it: a parameter's annotated type is checked
        except (TypeError, ValueError) as error:  # abstract, or a wrong argument
            raise HermesError(f"{option}: {error}") from None
        except Exception as error:  # noqa: BLE001 - the constructor's own failure (a file it reads is missing)
            raise HermesError(f"{option}: {cls.__name__}.__init__() raised {type(error).__name__}: {error}") from None


def _nan_as_null(figures: dict[str, Any]) -> dict[str, Any]:
    """A figure that no run produced is NaN (time to best where no seed reached the best); JSON says null."""
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in figures.items()}


def _print_json(value: Any) -> None:
    """Print standard JSON, as strict parsers reject NaN and Infinity: a figure that overflowed is an error."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise HermesError("--json: a figure is not a finite number (an overflow?), which JSON cannot hold") from None
    print(text)


def _add_storage_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("dir", nargs="?", help="storage dir of a run (storage.dir in its spec), holding hermes.db")
    command.add_argument("--experiment",
                         help="experiment name, or OWNER/NAME for a pool's (default: the newest in the store)")
    _add_server_arguments(command, "read the experiment from a Hermes server instead of a storage dir")


def _add_server_arguments(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument("--server", metavar="URL", help=f"{what} (default: $HERMES_SERVER)")
    command.add_argument("--token", help="API token (default: $HERMES_TOKEN)")


def _choose_server(args: argparse.Namespace) -> None:
    """``--server``, else ``$HERMES_SERVER`` unless a storage dir is named: the dir on the command line wins over
    the environment's default (``hermes list runs`` listed the server's experiments, and ``plot`` drew them in
    runs/). A dir and ``--server`` together are refused: which one was meant is not for us to guess."""
    if not hasattr(args, "server"):
        return
    named = getattr(args, "dir", None)
    if args.server and named is not None:
        raise HermesError(f"give a storage dir ({named}) or --server ({args.server}), not both")
    if args.server is None and named is None:
        args.server = os.environ.get("HERMES_SERVER")


@contextmanager
def _reading(args: argparse.Namespace) -> Iterator[Any]:
    """The store a report reads: a storage dir's, read-only, or a server's through its API."""
    from contextlib import closing

    if args.server:
        from hermes.server.client import Client, RemoteStore

        yield RemoteStore(Client(args.server, args.token))
        return
    if args.dir is None:
        raise HermesError("give the storage dir of a run, or --server URL")
    from hermes.report import open_store

    with _naming_damage(args.dir), closing(open_store(args.dir)) as store:
        yield store


def _add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status",
        help="show an experiment's progress, best trial and GPU assignments",
        description="Summarise a stored experiment: trials by state, best trial, who runs on which GPU.",
    )
    _add_storage_arguments(status)
    status.set_defaults(handler=_status)


def _runner_lock(args: argparse.Namespace) -> Path | None:
    """The storage dir's runner lock (``hermes.store.lock``); None for a server's store: its runner is the server."""
    from hermes.store.lock import LOCK_FILE

    return None if args.server else Path(args.dir) / LOCK_FILE


def _status(args: argparse.Namespace) -> int:
    from hermes.report import pick_experiment
    from hermes.report.status import experiment_status, format_status

    with _reading(args) as store:
        text = format_status(experiment_status(store, pick_experiment(store, args.experiment), _runner_lock(args)))
    print(text)
    return 0


def _add_list(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser(
        "list",
        help="list the experiments of a store or a server, a line each",
        description="One line per experiment, oldest first: id, name, owner, status, trials by state, best value.",
    )
    listing.add_argument("dir", nargs="?", help="storage dir of a run (storage.dir in its spec), holding hermes.db")
    _add_server_arguments(listing, "list the experiments you may see on a Hermes server instead")
    listing.set_defaults(handler=_list)


def _list(args: argparse.Namespace) -> int:
    from hermes.report.status import format_experiments

    with _reading(args) as store:
        print(format_experiments(store, _runner_lock(args)))
    return 0


def _add_results(commands: argparse._SubParsersAction) -> None:
    results = commands.add_parser(
        "results",
        help="rank an experiment's trials by the best metric each reported",
        description="The leaderboard of a stored experiment: trials ranked by their best reported metric.",
    )
    _add_storage_arguments(results)
    results.add_argument("--top", type=positive_int, metavar="N",
                         help=f"how many trials (default: {TABLE_TOP} in the table, every trial in csv and json)")
    results.add_argument("--format", choices=RESULT_FORMATS, default="table", help="csv and json are for programs")
    results.set_defaults(handler=_results)


def _results(args: argparse.Namespace) -> int:
    from hermes.report import ExperimentView, pick_experiment
    from hermes.report.results import format_results, standings

    with _reading(args) as store:
        view = ExperimentView.load(store, pick_experiment(store, args.experiment), _runner_lock(args))
        top = args.top or (TABLE_TOP if args.format == "table" else None)  # an export that dropped trials misled
        text = format_results(view, standings(view)[:top], args.format, _experiment_dir(args, view.experiment),
                              _runner_lock(args))
    print(text)
    return 0


def _experiment_dir(args: argparse.Namespace, experiment: ExperimentRecord) -> Path | None:
    """Where the experiment's trials keep their files on this machine (``<storage.dir>/<name>``); None through a
    server. `hermes run` keeps them beside the store it writes, in the storage dir read; a pool's experiment in its
    spec's storage.dir, wherever that is (a server stores it resolved). A relative one is relative to the pool's
    folder, which the store does not say: the storage dir read stands in for it (never `hermes run`'s place there,
    which may hold another experiment of the name: its checkpoints are not this one's)."""
    if args.server:
        return None
    if experiment.owner is None:
        return Path(args.dir).resolve() / experiment.name
    storage = experiment.spec.get("storage")
    written = storage.get("dir", "runs") if isinstance(storage, dict) else "runs"
    if not isinstance(written, str):
        return None
    return Path(args.dir).resolve() / written / experiment.name  # an absolute one stays as it is


def _add_plot(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw an experiment's learning curves and GPU timeline as PNG files",
        description="Write PNG plots of a stored experiment: learning curves and the GPU timeline.",
    )
    _add_storage_arguments(plot)
    plot.add_argument("--out", help="folder for the PNG files (default: DIR/plots, or ./plots with --server)")
    plot.set_defaults(handler=_plot)


def _plot(args: argparse.Namespace) -> int:
    from hermes.report import ExperimentView, pick_experiment
    from hermes.report.plot import plot_experiment

    out = Path(args.out).expanduser() if args.out else Path(args.dir or ".") / "plots"
    with _reading(args) as store:
        view = ExperimentView.load(store, pick_experiment(store, args.experiment), _runner_lock(args))
        try:
            paths = plot_experiment(view, out, store.events(view.experiment.experiment_id))
        except OSError as error:
            raise HermesError(f"cannot write the plots into {out}: {error.strerror or error}") from None
    for path in paths:
        print(path)
    return 0


def _add_trace(commands: argparse._SubParsersAction) -> None:
    trace = commands.add_parser(
        "trace",
        help="write an experiment's learning curves as a trace the simulator replays",
        description="Write a stored experiment's finished trials as a learning-curve trace (CSV): an epoch per "
                    "report, with the seconds it took. `hermes simulate --trace FILE` replays it under any policy, "
                    "and bench/policy_panel.py --traces FILE:MODE judges every policy on it.",
    )
    _add_storage_arguments(trace)
    trace.add_argument("--out", help="the CSV file to write (default: standard output)")
    trace.set_defaults(handler=_trace)


def _trace(args: argparse.Namespace) -> int:
    from hermes.sim.trace import write_trace

    trace = _stored_trace(args)
    try:
        write_trace(trace, Path(args.out).expanduser() if args.out else sys.stdout)
    except OSError as error:
        if args.out is None:
            raise  # stdout: a closed pipe is main's to handle
        raise HermesError(f"--out {args.out}: cannot write it: {error.strerror or error}") from None
    return 0


def _stored_trace(args: argparse.Namespace) -> Trace:
    """The trace of the experiment that ``args`` name (a storage dir, or a server, and ``--experiment``);
    the trials it leaves out are counted on stderr."""
    from hermes.report import ExperimentView, pick_experiment
    from hermes.report.trace import experiment_trace

    with _reading(args) as store:
        view = ExperimentView.load(store, pick_experiment(store, args.experiment))
        recorded = experiment_trace(view, _experiment_dir(args, view.experiment))
    if not recorded.trace.trials:
        final = view.experiment.status.is_final  # it never will have one: no "yet"
        raise HermesError(f"experiment {recorded.trace.path!r} has no finished trial to replay{'' if final else ' yet'}"
                          + (f" ({recorded.left_out} stopped early or not finished)" if recorded.left_out else ""))
    if recorded.left_out:
        print(f"{recorded.left_out} trials left out: stopped early or not finished, so their curves are unknown",
              file=sys.stderr)
    return recorded.trace


def _add_server(commands: argparse._SubParsersAction) -> None:
    server = commands.add_parser(
        "server",
        help="serve the REST API and the web dashboard to a team, and run its experiments",
        description="Run the Hermes server (FastAPI on uvicorn), or manage its users: "
                    "`hermes server add-user NAME` prints the new user's token.",
    )
    _add_server_places(server, quiet=False)
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    server.add_argument("--port", type=_port, default=8600, help="port to listen on (default 8600; 0: any free one)")
    server.add_argument("--cpu-slots", type=positive_int, metavar="N",
                        help="run trials on N CPU slots instead of the GPUs (default: the GPUs, else one slot; "
                             "on Ray: N per node)")
    server.add_argument("--ray", metavar="ADDRESS",
                        help="run trials on every node of this Ray cluster (auto: the one this machine belongs to); "
                             "the users' areas must be a shared mount on every node")
    server.add_argument("--storage-uri", metavar="URI",
                        help="on Ray, where durable checkpoints go (default: ROOT/pool/checkpoints)")
    server.add_argument("--root-path", type=_root_path, default="", metavar="PATH",
                        help="the path a reverse proxy serves the server under, e.g. /hermes (for /docs's Try it "
                             "out; the dashboard works under any path without it)")
    server.add_argument("--max-experiments", type=positive_int, default=MAX_ACTIVE, metavar="N",
                        help="experiments a user may have queued, running or interrupted at once; a submission "
                             f"past them is refused (default {MAX_ACTIVE})")
    actions = server.add_subparsers(dest="action", metavar="{add-user,add-token,tokens,revoke-token}")
    add_user = actions.add_parser("add-user", help="create a user and print their first token")
    _add_server_places(add_user, quiet=True)
    add_user.add_argument("name")
    add_user.add_argument("--admin", action="store_true", help="may see and control every experiment")
    add_token = actions.add_parser("add-token", help="print another token for a user")
    _add_server_places(add_token, quiet=True)
    add_token.add_argument("name")
    add_token.add_argument("--label", default="", help="what the token is for")
    tokens = actions.add_parser("tokens", help="list the users' tokens: id, label, age (never the tokens)")
    _add_server_places(tokens, quiet=True)
    tokens.add_argument("name", nargs="?", help="only this user's")
    revoke = actions.add_parser(
        "revoke-token", help="revoke tokens of a user at once, on the running server too",
        description="Revoke a user's tokens: each TOKEN is a token id from `hermes server tokens` (4 of its hex "
                    "digits are enough when they are unique) or a leaked token itself. Their experiments stay.",
    )
    _add_server_places(revoke, quiet=True)
    revoke.add_argument("name")
    revoke.add_argument("token", nargs="*", help="token ids, or tokens")
    revoke.add_argument("--all", action="store_true", help="every token of the user (someone who left)")
    server.set_defaults(handler=_server)


def _add_server_places(parser: argparse.ArgumentParser, quiet: bool) -> None:
    """--root and --database, before or after add-user; quiet: no default, which would undo a value given before."""
    unset = {"default": argparse.SUPPRESS} if quiet else {}
    parser.add_argument("--root", **(unset or {"default": "hermes-server"}),
                        help="folder of the database and the users' areas (default: hermes-server)")
    parser.add_argument("--database", metavar="URL", **unset,
                        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db (default: SQLite in ROOT)")


def _server(args: argparse.Namespace) -> int:
    try:  # the application (FastAPI, the pool) only to serve: an account command needs the store alone
        from hermes.server.auth import Accounts, TokenInfo, token_id

        if args.action is None:
            from hermes.server.app import serve
    except ImportError as error:
        raise HermesError(f"the server needs its extra: {install_extra('server')} ({error})") from None

    config = ServerConfig(root=Path(args.root), database=args.database)
    if args.action in (None, "add-user"):  # the commands that make a server's places
        _opened(lambda: _make_places(config, args.database), args.database)
    if args.action is None:
        config = dataclasses.replace(config, ray_address=args.ray, storage_uri=args.storage_uri,
                                     max_active=args.max_experiments)
        if args.cpu_slots:
            from hermes.experiment.spec import ResourcesSpec

            config = dataclasses.replace(config, resources=ResourcesSpec(gpus="none", cpu_slots=args.cpu_slots))
        _opened(lambda: serve(config, args.host, args.port, args.root_path), args.database)
        return 0
    if args.action == "revoke-token" and bool(args.token) == args.all:
        raise HermesError("hermes server revoke-token: name the tokens to revoke, or give --all (not both)")
    if args.action != "add-user" and args.database is None and not (config.root / "hermes.db").is_file():
        raise HermesError(f"--root {args.root}: no server there (no hermes.db): `hermes server --root {args.root} "
                          "add-user NAME` makes one")
    accounts = _opened(lambda: Accounts(config.database_url), args.database)
    try:
        if args.action == "tokens":
            _print_tokens(_opened(lambda: accounts.tokens(args.name), args.database))
            return 0
        if args.action == "revoke-token":
            revoked = _opened(lambda: accounts.revoke(args.name, None if args.all else args.token), args.database)
            print(f"revoked {len(revoked)} token(s) of {args.name}{': ' if revoked else ''}{', '.join(revoked)}")
            return 0
        if args.action == "add-user":
            token = _opened(lambda: accounts.add_user(args.name, admin=args.admin), args.database)
            print(f"{args.name}'s area, where every file their specs name must lie: {config.area(args.name)}")
        else:
            token = _opened(lambda: accounts.add_token(args.name, args.label), args.database)
    finally:
        accounts.close()
    print(f"token for {args.name} (shown once; the server keeps only its hash; id {token_id(token)}):\n{token}")
    return 0


def _opened(open_: Callable[[], Any], database: str | None) -> Any:
    """``open_()``, with a database that SQLAlchemy or its driver refuses (its URL, or a write: a read-only store)
    named as a HermesError, not a traceback that holds the SQL and the tokens' digests."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return open_()
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise HermesError(f"--database {database or 'sqlite (in --root)'}: cannot use it: {reason}") from None


def _make_places(config: ServerConfig, database: str | None) -> None:
    """The root, and a SQLite database's folder, made now: one that cannot be (a file on its way, a read-only disk)
    is named in one line, where the first module to make it gave a traceback."""
    from sqlalchemy import make_url

    places = [(f"--root {config.root}", config.root)]
    url = make_url(config.database_url)
    if database and url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        folder = Path(url.database).parent
        places.append((f"--database {database}: its folder {folder}", folder))
    for named, folder in places:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise HermesError(f"{named}: cannot make the folder: {error.strerror or error}") from None


def _print_tokens(tokens: list[TokenInfo]) -> None:
    from hermes.report import format_table

    rows = [(info.user + (" (admin)" if info.admin else ""), info.token_id, info.label,
             time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created_at))) for info in tokens]
    print(format_table(("user", "token id", "label", "created"), rows) if rows else "no tokens")


def _add_submit(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser(
        "submit",
        help="submit an experiment spec to a Hermes server",
        description="Send a YAML spec to a Hermes server, which queues and runs it. The spec is read in your area "
                    "on the server as if it lay there where it lies below the current folder, so relative paths "
                    "work as they do here when your area holds what this folder holds.",
    )
    submit.add_argument("spec", help="experiment spec (YAML)")
    submit.add_argument("--name",
                        help="the experiment's name, in place of the spec's (each user's are unique on a server)")
    submit.add_argument("--weight", type=float, default=1.0, help="share of the GPU pool against other experiments")
    _add_server_arguments(submit, "the server")
    submit.set_defaults(handler=_submit)


def _client(args: argparse.Namespace) -> Client:
    """The API client of the server a command names (``--server``, ``--token``)."""
    from hermes.server.client import Client

    if not args.server:
        raise HermesError("give the server: --server URL or $HERMES_SERVER")
    return Client(args.server, args.token)


def _submit(args: argparse.Namespace) -> int:
    from hermes.experiment.spec import read_spec

    client = _client(args)
    spec = read_spec(args.spec)  # as hermes run reads it: the same numbers, and its errors (a SpecError)
    if args.name is not None:
        spec["name"] = args.name
    # Your area on the server mirrors the folder you submit from: the spec is read there as it lies here.
    here = Path.cwd()
    folder = Path(os.path.abspath(args.spec)).parent
    experiment = client.submit(
        spec, args.weight, folder.relative_to(here).as_posix() if folder.is_relative_to(here) else ""
    )
    print(f"submitted {experiment['name']} as experiment {experiment['id']} ({experiment['status']}) "
          f"to {args.server.rstrip('/')}")
    return 0


def _add_cancel(commands: argparse._SubParsersAction) -> None:
    cancel = commands.add_parser(
        "cancel",
        help="cancel an experiment on a Hermes server",
        description="Ask a Hermes server to stop an experiment's trials and end it (recorded cancelled); a queued "
                    "experiment never starts. Each trial keeps what it reported and its checkpoints.",
    )
    cancel.add_argument("experiment", help="the experiment's name (an admin may need OWNER/NAME)")
    _add_server_arguments(cancel, "the server")
    cancel.set_defaults(handler=_cancel)


def _cancel(args: argparse.Namespace) -> int:
    experiment = _client(args).cancel(args.experiment)
    print(f"cancelling {experiment['name']} (experiment {experiment['id']}, {experiment['status']}) on "
          f"{args.server.rstrip('/')}: its trials stop, then it is recorded cancelled")
    return 0


def _naming_damage(directory: str) -> AbstractContextManager[None]:
    """A report that fails on a damaged record of the store says which record (hermes.report.integrity)."""
    from hermes.report import STORE_FILE
    from hermes.report.integrity import naming_damage

    return naming_damage(Path(directory) / STORE_FILE)


def number_type(convert: Callable[[str], Any], accepts: Callable[[Any], bool], wording: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, and refuse what it cannot read or ``accepts`` does not, in words (the
    benchmarks' options read numbers with it too)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {wording}, got {text!r}")
        return value

    return parse


def _whole_as_int(text: str) -> int | float:
    """A number, an int where it is whole: ``--period 5`` is what a spec's ``period: 5`` is to a policy whose
    period is annotated int, which refuses a float 5.0 (``hermes.plugins.construct``)."""
    value = float(text)
    return int(value) if value.is_integer() else value


_positive_period = number_type(_whole_as_int, lambda value: 0 < value < math.inf, "a positive number")
_size = number_type(float, lambda value: 0 <= value < math.inf, "a number >= 0")
positive_int = number_type(int, lambda value: value >= 1, "a positive whole number")


def listed(parse: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: a comma-separated list, each item read by ``parse``, each named once."""

    def parse_all(text: str) -> list[Any]:
        return list(dict.fromkeys(parse(item) for item in text.split(",")))

    return parse_all


def policy_name(name: str) -> str:
    """An argparse type for the benchmarks: a policy that loads, refused in one line rather than in every worker."""
    from hermes.policies import policy_class

    try:
        policy_class(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name

_non_negative_int = number_type(int, lambda value: value >= 0, "a whole number >= 0")
_port = number_type(int, lambda value: 0 <= value <= 65535, "a port number, 0 to 65535")


def _root_path(text: str) -> str:
    """A URL path without its trailing slash: the one uvicorn and FastAPI take as ``root_path``."""
    if text and not text.startswith("/") or any(mark in text for mark in "?# "):
        raise argparse.ArgumentTypeError(f"must be a path that starts with /, such as /hermes, got {text!r}")
    return text.rstrip("/")


if __name__ == "__main__":
    sys.exit(main())
