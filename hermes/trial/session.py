"""The trial side of the channel: one ``Session`` per trial, created from its environment in a trial
process, or by a warm worker (hermes/local/worker.py) for each trial it runs in a thread."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import operator
import os
import re
import resource
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
import threading
import traceback
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from hermes.errors import STORAGE_LIMIT_ERRNOS, HermesError
from hermes.trial import protocol

if TYPE_CHECKING:
    from hermes.trial.checkpoint import Saver


class SuspendExit(SystemExit):
    """The scheduler suspended the trial; its checkpoint is committed and the process now ends.

    A SystemExit (exit code 0), so ``finally`` blocks run and ``except Exception`` does not swallow it.
    """

    def __init__(self) -> None:
        super().__init__(0)


class StopExit(SystemExit):
    """The scheduler stopped the trial for good; the process now ends."""

    def __init__(self) -> None:
        super().__init__(0)


class BudgetExit(SystemExit):
    """The trial reported a step past its budget: it has trained the whole of it, and ends here, completed
    (as Ray Tune's ``training_iteration`` stop ends a trial right after that iteration)."""

    def __init__(self) -> None:
        super().__init__(0)


class ResumeError(HermesError):
    """A resumed trial did not continue from its checkpoint: it registered savers but restored none, or reported a
    step its checkpoint already holds."""


class Channel(Protocol):
    """How a session talks to its executor: messages out, one word back per report or park."""

    def send(self, message: dict[str, Any]) -> None: ...

    def receive(self) -> str: ...


class PipeChannel:
    """A trial process's pair of pipes (protocol.ENV_CHANNEL)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        for fd in (read_fd, write_fd):
            if not _is_pipe(fd):  # a wrapper ran this script and closed them (subprocess closes what it can)
                raise HermesError(
                    f"hermes.trial's channel, descriptors {read_fd} and {write_fd} of {protocol.ENV_CHANNEL}, was not "
                    "inherited by this process: a program that runs this script must pass them on "
                    f"(subprocess.run(..., pass_fds=({read_fd}, {write_fd})), or close_fds=False)"
                )
        for fd in (read_fd, write_fd):  # programs the trial runs must not hold the channel open
            os.set_inheritable(fd, False)
        self._answers = os.fdopen(read_fd, "rb")
        self._messages = os.fdopen(write_fd, "wb")

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._messages.write(protocol.encode(message))
            self._messages.flush()
        except BrokenPipeError:
            raise HermesError("the executor closed the channel") from None

    def receive(self) -> str:
        return self._answers.readline().decode().strip()


NO_CHANNEL = (
    f"hermes.trial cannot report: this process has no channel to the scheduler ({protocol.ENV_CHANNEL} is not set). A "
    "command with trial.metrics_regex is an unmodified program: it reports by printing lines that its pattern "
    "matches; drop trial.metrics_regex to report through hermes.trial"
)


class NoChannel:
    """An unmodified program's (no protocol.ENV_CHANNEL): it may read its config, budget and directory through
    hermes.trial, but it reports by printing, so a report fails saying so."""

    def send(self, message: dict[str, Any]) -> None:
        raise HermesError(NO_CHANNEL)

    def receive(self) -> str:
        raise HermesError(NO_CHANNEL)


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:  # closed
        return False


class Session:
    """A trial's link to its executor: its identity, its config, its checkpoints and its channel.

    ``in_worker``: the trial runs in a warm worker's thread. Suspended, it then *parks*: its whole
    state stays in memory and ``report`` blocks until the executor says resume (go on, nothing read
    from disk), spill (checkpoint and end, to resume elsewhere) or stop.
    """

    def __init__(
        self,
        trial_id: str,
        directory: Path,
        channel: Channel,
        *,
        budget: int,
        metric: str | None,
        checkpoint_every: int,
        reported_step: int | None = None,
        in_worker: bool = False,
    ) -> None:
        self.trial_id = trial_id
        self.directory = directory
        self.budget = budget
        self.metric = metric
        self.checkpoint_every = checkpoint_every
        self.in_worker = in_worker
        self.config: dict[str, Any] = json.loads((directory / protocol.CONFIG_FILE).read_text())
        latest = self._checkpoint(reported_step or 0)
        self.start_step = latest[1] if latest is not None else 0
        self._known_step = max(reported_step or 0, self.start_step)  # what the scheduler holds, once reported again
        self._asked_start = False  # whether the trial asked start_step(): then its loop goes on from there
        self._restored = False  # a saver has restored its part of the checkpoint
        self._left_out: set[str] = set()  # metrics that were no numbers, said once
        self.last_step = self.start_step
        self.savers: dict[str, Saver] = {}
        self.parked_rng: dict[str, Any] | None = None  # the trial's random generators while it is parked
        self.parked_cwd: str | None = None  # and its working directory
        self.suspended = False  # its suspension is committed and said: this run is over, for each of its threads
        self._channel = channel
        _quiet_ends_of_threads()
        if latest is not None and reported_step is not None and self.start_step > reported_step:
            self._say_steps_missing(reported_step)
            self._report_again(latest[0])

    def _checkpoint(self, reported_step: int) -> tuple[Path, int] | None:
        """The checkpoint to resume from. One that is damaged is moved aside, never deleted (its state may be
        sound and worth recovering by hand); one that is gone, or was moved aside, leaves nothing to resume
        from, so the trial retrains from scratch, and says so on its stderr: the scheduler holds its steps up
        to ``reported_step`` already, and its executor answers them at once without recording them again.
        Failing the trial instead would lose it (a failed trial never runs again), and running it again
        would only meet the same file."""
        try:
            latest = protocol.latest_checkpoint(self.directory)
        except protocol.DamagedCheckpoint as damage:
            self._retrain(damage, reported_step)
            return None
        if latest is None and reported_step > 0:
            root = self.directory / protocol.CHECKPOINTS_DIR
            if not root.exists():  # never written, or deleted: nothing tells them apart
                what = ("it has no checkpoint on disk: none was written (a trial parked in its worker's memory when "
                        "its run ended writes none), or they were deleted")
            elif _first_commit_cut_short(root):
                what = "none of its checkpoints was committed: the write of its first was cut short (a crash, a kill)"
            else:
                what = "its checkpoint is gone"
            self._warn(f"it resumes at step {reported_step}, but {what} ({protocol.missing_checkpoint(self.directory)});"
                       " it retrains from scratch" + self._again(reported_step))
        return latest

    def _retrain(self, damage: protocol.DamagedCheckpoint, known_step: int) -> None:
        aside = self._set_aside(damage)
        self._warn(f"its checkpoint {damage.path} is damaged ({damage.reason}); its checkpoints were moved to "
                   f"{aside} (delete them once you no longer need them), and it retrains from scratch"
                   + self._again(known_step))

    def unreadable(self, damage: protocol.DamagedCheckpoint) -> None:
        """A saver could not read its part of the checkpoint the trial resumes from (a file cut short by a
        crash): as a damaged checkpoint found at the start (``_checkpoint``), it is set aside and the trial
        retrains from scratch; retrying would only meet the same file, and used up its crash retries. Every
        part is checked before one is loaded (``Saver.restore``), but a saver created after another restored
        finds its part damaged once that one's state is in the trial: this run cannot retrain, so it ends, and the
        next one (as after a crash) finds the checkpoint set aside."""
        if self._restored:
            aside = self._set_aside(damage)
            raise HermesError(f"{damage}, and another part of it, restored already, is in the trial: its checkpoints "
                              f"were moved to {aside}, and this run ends; its next run retrains from scratch "
                              "(as after a crash: trial.max_failures). Create every saver before restoring any, and "
                              "a damaged part is found before any is restored") from None
        self._retrain(damage, self._known_step)
        self.start_step = self.last_step = 0

    def note_restored(self) -> None:
        self._restored = True

    def _set_aside(self, damage: protocol.DamagedCheckpoint) -> Path:
        """Move the trial's damaged checkpoints out of the way (a new checkpoint would delete them): to
        ``checkpoints.damaged``, or ``checkpoints.damaged-2``... where that is taken. Only Hermes's names move
        (``remove_checkpoints``): the trial's own files there (its best model) stay where it looks for them."""
        root = self.directory / protocol.CHECKPOINTS_DIR
        for attempt in range(1, 1000):
            aside = root.with_name(f"{root.name}.damaged" + (f"-{attempt}" if attempt > 1 else ""))
            if aside.exists():
                continue
            try:
                aside.mkdir()
                for entry in root.iterdir():
                    if _OWN_FOLDER.fullmatch(entry.name) or entry.name in _OWN_POINTERS:
                        entry.rename(aside / entry.name)
            except OSError as error:
                raise HermesError(f"{damage}, and it cannot be moved aside ({error.strerror or error}): delete {root} "
                                  "to retrain the trial from scratch, and run the experiment again") from None
            with contextlib.suppress(OSError):  # where nothing of the trial's own is left
                root.rmdir()
            return aside
        raise HermesError(f"{damage}: delete {root} to retrain the trial from scratch")

    @staticmethod
    def _again(step: int) -> str:
        return f" (its steps up to {step} are trained again, not recorded again)" if step > 0 else ""

    def _warn(self, text: str) -> None:
        print(f"hermes: trial {self.trial_id}: {text}", file=sys.stderr, flush=True)

    def _say_steps_missing(self, reported_step: int) -> None:
        """Say which steps the store lacks for good when the checkpoint is further ahead of it than a runner that died
        between the two leaves: a store older than the checkpoints (a restored backup). Only the checkpoint's step is
        reported again, so the steps in between stay holes in the learning curve, which nothing else would tell.
        The store holds no step from ``first_missing`` on: that step's checkpoint, once recorded, would have moved
        ``reported_step`` (the store's last checkpoint of the trial, or a later step) up to it. Without periodic
        checkpoints (suspensions' alone) nothing bounds how far the store got, so nothing is said."""
        if self.checkpoint_every < 1:
            return
        first_missing = (reported_step // self.checkpoint_every + 1) * self.checkpoint_every
        if self.start_step <= first_missing:
            return
        last_missing = self.start_step - 1
        missing = f"{_steps(first_missing, last_missing)} {'are' if last_missing > first_missing else 'is'}"
        maybe = (f" ({_steps(reported_step + 1, first_missing - 1)} may be too)"
                 if first_missing > reported_step + 1 else "")
        recorded = f"its last checkpoint there is of step {reported_step}" if reported_step else (
            "it has no checkpoint of it")
        every = "at every step" if self.checkpoint_every == 1 else f"every {self.checkpoint_every} steps"
        self._warn(f"its checkpoint is of step {self.start_step}, but the store holds none of its steps from "
                   f"{first_missing} on ({recorded}, and one is taken {every}): {missing} missing from the store for "
                   f"good{maybe}, a hole in its learning curve, as the trial goes on from its checkpoint and reports "
                   f"step {self.start_step} alone again. The store is older than its checkpoints: was it restored "
                   "from a backup?")

    def _report_again(self, checkpoint: Path) -> None:
        """The checkpoint is ahead of what the scheduler recorded (its runner died between the two):
        report that step again from the metrics kept in the checkpoint, so none is lost."""
        metrics = json.loads((checkpoint / protocol.META_FILE).read_text()).get("metrics")
        if metrics:
            self._send({"type": protocol.REPORT, "step": self.start_step, "metrics": metrics, "checkpointed": True})
            self._obey(self.start_step, checkpointed=True, metrics=metrics)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Session:
        """The session of a trial process, from what its executor set. Without a channel it is an unmodified
        program (a command with trial.metrics_regex): its config, budget and directory are known all the same,
        and only reporting fails (it keeps no checkpoints and has nothing to resume from)."""
        try:
            trial_id, directory = environ[protocol.ENV_TRIAL_ID], Path(environ[protocol.ENV_TRIAL_DIR])
            budget, metric = int(environ[protocol.ENV_BUDGET]), environ.get(protocol.ENV_METRIC) or None
            if protocol.ENV_CHANNEL not in environ:
                return cls(trial_id, directory, NoChannel(), budget=budget, metric=metric, checkpoint_every=0)
            read_fd, write_fd = (int(fd) for fd in environ[protocol.ENV_CHANNEL].split(","))
            _say_misuse_that_ends_it()
            return cls(
                trial_id,
                directory,
                PipeChannel(read_fd, write_fd),
                budget=budget,
                metric=metric,
                checkpoint_every=int(environ.get(protocol.ENV_CHECKPOINT_EVERY) or 0),
                reported_step=int(environ[protocol.ENV_REPORTED_STEP]) if protocol.ENV_REPORTED_STEP in environ else None,
            )
        except KeyError as missing:
            raise HermesError(
                f"hermes.trial needs {missing} from a Hermes executor; run this trial through one"
            ) from None

    def register(self, saver: Saver) -> None:
        if saver.name in self.savers:
            raise HermesError(f"a checkpoint part named {saver.name!r} is already registered")
        self.savers[saver.name] = saver

    def step_to_go_on_from(self) -> int:
        """``trial.start_step()``: the checkpoint's step. A trial that asks goes on from there."""
        self._asked_start = True
        return self.start_step

    def next_step(self) -> int:
        """The step a report that names none is of: the previous one plus one. The first report since a
        resume from disk of a trial with no saver that never asked ``start_step()`` is of step 1: it has
        nothing to go on from, so its loop began again."""
        if self.last_step == self.start_step > 0 and not self.savers and not self._asked_start:
            return 1
        return self.last_step + 1

    def report(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Send the metrics of ``step``, wait for the scheduler's answer and obey it."""
        self._check_channel()
        if self.suspended:  # another of its threads was suspended (a thread's SuspendExit ends only that thread)
            raise SuspendExit
        try:
            if isinstance(step, bool):
                raise TypeError
            step = operator.index(step)  # an int, or numpy's or torch's integers
        except TypeError:
            raise TypeError(f"step must be an int, got {type(step).__name__}") from None
        if step < 1:
            raise ValueError(f"step {step}: steps count from 1, as budget.steps does (a loop from 0 reports epoch + 1)")
        if step > protocol.MAX_STEP:
            raise ValueError(f"step {step}: steps count epochs or iterations, at most {protocol.MAX_STEP}")
        if step > self.budget:
            if self.last_step == self._known_step == 0:  # nothing to rank it by: it would end as if it never reported
                raise ValueError(f"its first report was step {step}, past budget.steps {self.budget}: steps count up "
                                 "to the budget (epochs, say), not iterations")
            self._warn(f"it reported step {step}, past its budget of {self.budget} steps: that report is not "
                       "recorded and the trial ends here, completed (loop up to trial.budget())")
            self._prepare_exit()
            raise BudgetExit
        if step <= self.last_step:
            if not self.last_step == self.start_step > 0:  # not the first report since a resume
                raise ValueError(f"step {step} must exceed the previous step {self.last_step}")
            if self.savers:
                raise ResumeError(
                    f"trial {self.trial_id} reported step {step}, but it resumed from its checkpoint of step "
                    f"{self.start_step}: the training loop started over instead of continuing. Restore and go on "
                    "from the checkpoint's step: loop `for epoch in range(state.restore(), trial.budget())` "
                    "(docs/trials.md)"
                )
            self._start_over(step)
        if self.last_step == self.start_step > 0 and self.savers and not self._restored:
            raise ResumeError(
                f"trial {self.trial_id} resumed from its checkpoint of step {self.start_step}, but none of its "
                f"checkpoint parts ({', '.join(map(repr, self.savers))}) was restored: it would go on from a fresh "
                "state. Call restore() before the first report: loop `for epoch in range(state.restore(), "
                "trial.budget())` (docs/trials.md)"
            )
        if self.last_step == self.start_step:  # the first report of this run: a part left unrestored stays so
            for saver in self.savers.values():
                saver.forget_check()
        if not metrics:
            raise ValueError("report() needs at least one metric")
        if self.metric is None and len(metrics) > 1:
            raise ValueError("several metrics reported but the experiment names no objective metric")
        if self.metric is not None and self.metric not in metrics:
            raise ValueError(
                f"report() must include the objective metric {self.metric!r} (metric.name in the spec); it "
                f"reported {', '.join(map(repr, metrics))}"
            )
        values = self._numbers(metrics)
        checkpointed = self.checkpoint_every > 0 and step % self.checkpoint_every == 0
        if checkpointed:
            self.save(step, values)
        self.last_step = step
        self._send({"type": protocol.REPORT, "step": step, "metrics": values, "checkpointed": checkpointed})
        self._obey(step, checkpointed=checkpointed, metrics=values)

    def _check_channel(self) -> None:
        """Refuse a report this process has no channel of its own for, before its step or budget is judged (an
        unmodified program's report past its budget has no channel first of all). A process forked from the
        trial's shares the trial's pipes: the answers would reach either process, and the trial's steps and
        checkpoints would not learn of the child's report."""
        if isinstance(self._channel, NoChannel):
            raise HermesError(NO_CHANNEL)
        if _forked_from is not None:
            raise HermesError(f"trial {self.trial_id}: report() was called in a process forked from the trial's "
                              f"(pid {_forked_from}), which shares its channel: report from the trial's own process "
                              "(hand it the child's results, through a multiprocessing.Queue, say)")

    def _numbers(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """The metrics as the store keeps them, floats. The objective must be one; another metric that is no number
        (a phase's name, a path) is left out, said once per name on its stderr, as a program's output is read."""
        objective = self.metric if self.metric is not None else next(iter(metrics))
        values = {}
        for name, value in metrics.items():
            number = _float(value)
            if isinstance(number, float):
                values[name] = number
            elif name == objective and _is_text(value):
                raise TypeError(f"metric {name!r} must be a number, got {number} (text: report the number, "
                                "float(text))")
            elif name == objective:
                raise TypeError(f"metric {name!r} must be a number, got {number}")
            elif name not in self._left_out:
                self._left_out.add(name)
                self._warn(f"its metric {name!r} is left out: the store keeps numbers, it reported {number}")
        return values

    def _start_over(self, step: int) -> None:
        """A trial with no checkpoint of its state (no saver) began again after a resume or a crash: it retrains from
        scratch, as Ray Tune's function trials without checkpoints do. Its steps up to the resumed one
        are known to the scheduler already, and its executor answers them at once."""
        print(
            f"hermes: trial {self.trial_id} keeps no checkpoint of its state (trial.Checkpoint or trial.Files), "
            f"so this run of it, which was to go on after step {self.start_step} (a resume, or a run again after a "
            f"crash), starts over from step {step}, retraining what it had trained; register its model and optimizer "
            "to go on where it stopped (docs/trials.md)",
            file=sys.stderr,
            flush=True,
        )
        self.start_step, self.last_step = 0, step - 1

    def _obey(self, step: int, *, checkpointed: bool, metrics: Mapping[str, float]) -> None:
        """Wait for the answer to the report of ``step`` and do what it says."""
        answer = self._channel.receive()
        if answer == protocol.SUSPEND and self.in_worker:
            answer = self._park(step)
        if answer in (protocol.SUSPEND, protocol.SPILL):
            if not checkpointed:
                self.save(step, metrics)
            self._send({"type": protocol.SUSPENDED, "step": step})
            self.suspended = True
            self._prepare_exit()
            raise SuspendExit
        if answer == protocol.STOP:
            self._prepare_exit()
            raise StopExit
        if answer not in (protocol.CONTINUE, protocol.RESUME):
            raise HermesError(f"the executor closed the channel or answered {answer!r}")

    def _park(self, step: int) -> str:
        """Suspended in a warm worker: keep everything in memory, give the device back, and wait.

        Other trials run in this process meanwhile, so the global random generators and the working directory are
        saved here and put back on resume (a spilled checkpoint takes the generators from here too).
        """
        from hermes.trial.checkpoint import capture_rng, restore_rng

        self.parked_rng, self.parked_cwd = capture_rng(), _current_folder()
        for saver in self.savers.values():
            saver.offload()
        release_device_cache()
        global _computing
        if _computing is self:
            _computing = None  # another trial computes meanwhile
        self._send({"type": protocol.PARKED, "step": step})
        command = self._channel.receive()
        if command == protocol.RESUME:  # a spill or a stop does not compute: another trial may, meanwhile
            _computing = self
            for saver in self.savers.values():
                saver.reload()
            restore_rng(self.parked_rng)
            if self.parked_cwd is not None:
                with contextlib.suppress(OSError):  # removed meanwhile: it stays where the other trial left it
                    os.chdir(self.parked_cwd)
            self.parked_rng = self.parked_cwd = None
        return command

    def _prepare_exit(self) -> None:
        if not self.in_worker:  # a worker lives on after its trial
            fast_exit()

    def save(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        """Commit a checkpoint of ``step``: written under a temporary name, renamed, then published
        by atomically replacing the pointer file, so a crash at any moment leaves the previous
        checkpoint intact and never a torn one. Each step reaches the disk (fsync) before the next
        one names it, so this holds after a power loss too, not only after a process crash. The
        fsyncs that do not depend on each other run at once: the disk takes them in one flush."""
        root = self.directory / protocol.CHECKPOINTS_DIR
        root.mkdir(parents=True, exist_ok=True)
        temporary = root / f".tmp-step-{step}"
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
        try:
            for name, saver in self.savers.items():
                (temporary / name).mkdir()
                saver.save(temporary / name)
            (temporary / protocol.META_FILE).write_text(json.dumps(
                {"step": step, "metrics": dict(metrics or {}), "parts": list(self.savers)}))
            _sync_tree(temporary)  # what the savers wrote, and the names of it
        except Exception as error:
            # measured before the partial checkpoint's room is given back
            full, too_large = _out_of_room(root), _file_at_size_limit(temporary)
            # the room comes back once nothing holds its files open: torch.save's writer, a local of the frames
            # that raised, held a deleted file's blocks until the exception was gone (its traceback, printed to a
            # log on that disk meanwhile, ended after its first line)
            cause: BaseException | None = error
            while cause is not None:
                traceback.clear_frames(cause.__traceback__)
                cause = cause.__cause__ or cause.__context__
            shutil.rmtree(temporary, ignore_errors=True)
            # torch.save says RuntimeError, numpy an OSError without errno: a full disk or a file-size limit is no
            # crash of the trial (its retries would be used up), it interrupts the run, which continues once lifted
            if too_large is not None:
                raise OSError(errno.EFBIG, f"the checkpoint of step {step} reached the file-size limit of "
                                           f"{too_large[1]} bytes (ulimit -f)", str(too_large[0])) from error
            if isinstance(error, OSError) and error.errno in STORAGE_LIMIT_ERRNOS:
                raise
            if full:
                raise OSError(errno.ENOSPC, f"no space left on the device for the checkpoint of step {step} "
                                            f"({type(error).__name__}: {error})") from error
            raise
        final = root / f"step-{step}"
        shutil.rmtree(final, ignore_errors=True)  # written but never published by a run that crashed
        temporary.rename(final)
        pointer = root / f"{protocol.LATEST_FILE}.tmp"
        pointer.write_text(final.name)
        _sync_all([pointer, root])  # the pointer's content; the renamed checkpoint and the pointer's name
        os.replace(pointer, root / protocol.LATEST_FILE)
        _sync(root)
        remove_checkpoints(root, keep=final)

    def _send(self, message: dict[str, Any]) -> None:
        self._channel.send(message)


_OWN_FOLDER = re.compile(r"(\.tmp-)?step-\d+|\.tmp-download-\d+")  # what Hermes writes in a checkpoints/ folder
_OWN_POINTERS = (protocol.LATEST_FILE, f"{protocol.LATEST_FILE}.tmp")  # and the pointer to its newest


def _first_commit_cut_short(root: Path) -> bool:
    """Whether ``root``, a trial's ``checkpoints/`` with none to resume from, holds what a crash during the commit of
    its first checkpoint leaves: the pointer's temporary file, or a temporary folder and no committed one (a
    ``latest`` deleted by hand leaves its ``step-<n>``)."""
    try:
        names = [entry.name for entry in root.iterdir()]
    except OSError:  # no folder (a file there), or unreadable: nothing tells
        return False
    if protocol.LATEST_FILE in names:  # it names a checkpoint that is gone
        return False
    return f"{protocol.LATEST_FILE}.tmp" in names or (any(re.fullmatch(r"\.tmp-step-\d+", name) for name in names)
                                                      and not any(re.fullmatch(r"step-\d+", name) for name in names))


def remove_checkpoints(root: Path, keep: Path | None = None) -> None:
    """Delete the checkpoints in ``root`` (a trial's ``checkpoints/``) but ``keep``: Hermes's ``step-<n>`` folders and
    the temporary ones they are written in (``.tmp-step-<n>``, ``.tmp-download-<n>``); with no ``keep`` (the trial runs
    from scratch), its ``latest`` pointer too, and ``root`` where nothing else is left. Anything else there is the
    trial's own (a folder of its best model, say, made by a trial that works in ``trial_dir()``): never deleted."""
    try:
        entries = list(root.iterdir())
    except OSError:  # none yet, or unreadable: nothing this could delete
        return
    for entry in entries:
        if entry != keep and _OWN_FOLDER.fullmatch(entry.name) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
    if keep is None:
        with contextlib.suppress(OSError):  # rmdir: the trial's own files are there
            for name in _OWN_POINTERS:
                (root / name).unlink(missing_ok=True)
            root.rmdir()


FULL_BELOW = 1 << 20  # bytes left to users under which a file system counts as full


def _out_of_room(path: Path) -> bool:
    """Whether the file system of ``path`` is full (less than a megabyte left to users), as a failed write finds
    it: the partial file it left holds the rest."""
    try:
        status = os.statvfs(path)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < FULL_BELOW


def _file_at_size_limit(directory: Path) -> tuple[Path, int] | None:
    """A file under ``directory`` as large as this process's file-size limit (ulimit -f) allows, and that limit:
    a write past it fails (EFBIG, SIGXFSZ being ignored), which torch.save says as a RuntimeError."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    for path in directory.rglob("*"):
        try:
            if path.is_file() and path.stat().st_size >= limit:
                return path, limit
        except OSError:
            continue
    return None


def _sync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _tree(directory: Path) -> list[Path]:
    """Every file and directory under ``directory``, itself included; not its symbolic links (a saver's copy of a
    Hugging Face snapshot, whose links may point outside the checkpoint or nowhere): opening one would sync its
    target, or fail, and the link itself is synced with its directory's entries."""
    paths = []
    for parent, _, files in os.walk(directory):
        paths += [Path(parent), *(Path(parent) / name for name in files if not os.path.islink(Path(parent) / name))]
    return paths


def _sync_tree(directory: Path) -> None:
    """Flush every file and directory under ``directory``, and it."""
    _sync_all(_tree(directory))


def _sync_all(paths: list[Path]) -> None:
    """Flush them all, at once: fsyncs issued together share the disk's flushes (a journal commit),
    so several cost about as much as one. Where no thread can be started (a limit of processes: ``ulimit -u``, a pids
    limit), one after another in the calling thread: slower, but a limit of the host's is no crash of the trial (one
    that crashed so at each checkpoint failed for good)."""
    global _syncing
    if len(paths) == 1:
        _sync(paths[0])
        return
    if _syncing is None:
        _syncing = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hermes-fsync")
    try:
        syncs = [_syncing.submit(_sync, path) for path in paths]
    except RuntimeError:  # "can't start new thread": those submitted run when a thread of the pool can, if ever
        for path in paths:
            _sync(path)
        return
    for done in syncs:
        done.result()


_syncing: ThreadPoolExecutor | None = None


def fast_exit() -> None:
    """Prepare a quick interpreter exit: the GPU is free only once the process is gone.

    With torch loaded, the garbage collections at interpreter shutdown take most of a second;
    frozen objects are skipped by them. Objects freed by reference counting (files held by
    modules, say) are still closed; only cycles' ``__del__`` may not run, which Python never
    promises at exit anyway.
    """
    gc.freeze()


def release_device_cache() -> None:
    """Hand the memory that a parked or ended trial's tensors left in torch's CUDA cache back to the device (torch is
    never imported here: a trial that did not import it has none)."""
    import sys

    if sys.modules.get("torch") is None:
        return
    import torch  # imported by the trial: one half done in another thread is waited for (it has no ``cuda`` yet)

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_forked_from: int | None = None  # in a process forked from one that imported hermes.trial: its parent's pid


def _note_fork() -> None:
    global _forked_from
    _forked_from = os.getppid()


os.register_at_fork(after_in_child=_note_fork)  # a multiprocessing "fork" child, a process of os.fork()

_current: Session | None = None
_running: dict[str, Session] = {}  # in a warm worker, its trials that run (computing or parked), by id
_computing: Session | None = None  # in a warm worker, the trial that computes now (one at a time)
_TRIAL = "hermes_trial"  # the attribute of a thread (threading.Thread) that names the trial it works for


def current() -> Session:
    """This trial's session: in a warm worker, that of the trial the calling thread works for (the one it runs, or the
    one whose thread started it) or, in a thread no trial started, of the trial that computes; else the process's,
    created on first use from the environment the executor set."""
    trial_id = trial_of_thread()
    if trial_id is not None:
        session = _running.get(trial_id)
        if session is None:
            raise HermesError(f"trial {trial_id} has ended: a thread it started calls hermes.trial after it; join the "
                              "threads a trial starts before its function returns")
        return session
    if _computing is not None:
        return _computing
    global _current
    if _current is None:
        _current = Session.from_environment()
    return _current


def trial_of_thread() -> str | None:
    """The id of the trial the calling thread works for (``work_for``); None outside a warm worker's trials."""
    return getattr(threading.current_thread(), _TRIAL, None)


def work_for(trial_id: str | None) -> None:
    """The calling thread works for ``trial_id`` (None: for no trial), and so do the threads it starts from now on
    (``follow_threads``)."""
    setattr(threading.current_thread(), _TRIAL, trial_id)


def bind(session: Session | None) -> None:
    """Make ``session`` the one of the calling thread (a warm worker's trial thread, whose trial starts computing), of
    the threads it starts, and of the worker's other threads while it computes; None: the calling thread's trial
    ended."""
    global _computing
    if session is None:
        ended = _running.pop(trial_of_thread() or "", None)
        if _computing is ended:  # not another trial, which may compute while this one ends (a spill, a stop)
            _computing = None
        work_for(None)
        return
    work_for(session.trial_id)
    _running[session.trial_id] = _computing = session


def follow_threads() -> None:
    """In a warm worker: a thread started by a trial's thread works for that trial, and a thread pool's task for the
    trial whose thread submitted it (a pool may outlive the trial that made it), so that ``current`` and the
    trial's output (hermes/local/worker.py) reach that trial whatever the worker's other trials do meanwhile.
    Threads do not inherit context variables, and a pool's threads serve whoever submits, hence the two hooks."""
    start, submit = threading.Thread.start, ThreadPoolExecutor.submit

    def start_for_its_trial(thread: threading.Thread) -> None:
        setattr(thread, _TRIAL, trial_of_thread())
        start(thread)

    def submit_for_its_trial(pool: ThreadPoolExecutor, function: Callable[..., Any], /, *args: Any,
                             **kwargs: Any) -> Future[Any]:
        return submit(pool, _working_for(trial_of_thread(), function), *args, **kwargs)

    threading.Thread.start = start_for_its_trial  # type: ignore[method-assign]
    ThreadPoolExecutor.submit = submit_for_its_trial  # type: ignore[method-assign]


def _quiet_ends_of_threads() -> None:
    """A thread that ``report`` ended (a trial's loop in a thread of its own, suspended, stopped, or past its budget)
    ends quietly, as the main thread does: Python's ``threading.excepthook`` is silent for exactly ``SystemExit``, and
    wrote these, its subclasses, with a traceback into the trial's stderr.log. Anything else goes to the hook that was
    there. Installed by the process's first session, in a process of its own as in a warm worker."""
    global _threads_end_quietly
    if _threads_end_quietly:
        return
    _threads_end_quietly = True
    previous = threading.excepthook

    def quiet_for_trial_ends(args: threading.ExceptHookArgs) -> None:
        if not issubclass(args.exc_type, (SuspendExit, StopExit, BudgetExit)):
            previous(args)
        elif issubclass(args.exc_type, StopExit):
            _say_loop_stopped()

    threading.excepthook = quiet_for_trial_ends


_threads_end_quietly = False  # _quiet_ends_of_threads has installed its hook


def _say_misuse_that_ends_it() -> None:
    """In a trial's own process: a ``ResumeError`` that ends it (uncaught in its main thread) is told to the executor
    (protocol.MISUSED), which fails the trial at once, as a warm worker does: run again from its checkpoint, it would
    do the same, where a crash is run again trial.max_failures times. Installed once, by its first session."""
    global _misuse_said
    if _misuse_said:
        return
    _misuse_said = True
    previous = sys.excepthook

    def say_misuse(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if issubclass(kind, ResumeError) and _current is not None:
            with contextlib.suppress(HermesError):  # no executor to tell: its end says the rest
                _current._send({"type": protocol.MISUSED, "error": f"{kind.__name__}: {error}"})
        previous(kind, error, trace)

    sys.excepthook = say_misuse


_misuse_said = False  # _say_misuse_that_ends_it has installed its hook


def _say_loop_stopped() -> None:
    """A thread the trial started ended with its StopExit (called in that thread): say so, and the executor gives the
    rest of the trial ``EXIT_GRACE`` to return, since its main thread may wait for ever on what that loop was to give
    it. Only then: a stopped trial's own final save or evaluation, in its main thread, takes what it takes."""
    trial_id = trial_of_thread()
    session = _running.get(trial_id) if trial_id is not None else _computing or _current
    if session is not None:
        try:
            session._channel.send({"type": protocol.LOOP_STOPPED})
        except (HermesError, OSError):
            pass  # no executor to tell: its end is on its way


def _working_for(trial_id: str | None, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, called by a thread that works for ``trial_id`` meanwhile."""

    def call(*args: Any, **kwargs: Any) -> Any:
        before = trial_of_thread()
        work_for(trial_id)
        try:
            return function(*args, **kwargs)
        finally:
            work_for(before)

    return call


def _steps(first: int, last: int) -> str:
    """``first`` to ``last`` in words: "step 3", "steps 3 to 8"."""
    return f"steps {first} to {last}" if last > first else f"step {first}"


def _float(value: Any) -> float | str:
    """A metric as the store keeps it: a float (a Python or numpy number, a one-element tensor); for one that is
    none, what it is, for its error or note. Not a bool (Python's, numpy's, a tensor of them): float() makes True 1.0,
    which would rank a yes-or-no as a score; nor text (``_is_text``), which float() reads too ("0.5", " 1e3 ",
    "1_000", "inf": not "0,95"), a formatted log value taken for a number; nor a complex number (numpy's: float()
    drops its imaginary part); nor one that float() cannot make (an int of 10**400: OverflowError; a meta tensor:
    RuntimeError)."""
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, bool) or dtype in ("bool", "torch.bool") or "complex" in dtype or _is_text(value):
        return _shown(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return _shown(value)
    except (OverflowError, RuntimeError) as error:
        return f"{_shown(value)} ({error})"


def _is_text(value: Any) -> bool:
    """Python's or numpy's text or bytes (``np.str_``, an array of strings), and what float() reads as bytes."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)  # numpy's; torch's dtypes have none
    return isinstance(value, (str, bytes, bytearray, memoryview)) or kind in ("U", "S")


def _shown(value: Any) -> str:
    """Its type and the start of its repr (where repr fails, an int of over 4300 digits say, its type alone)."""
    try:
        return f"{type(value).__name__} {value!r:.80}"
    except Exception:  # noqa: BLE001 - a repr may raise anything (a trial's class, a tensor after a CUDA error)
        return type(value).__name__


def _current_folder() -> str | None:
    """The working directory, None where it was removed (a trial that left a TemporaryDirectory it chdir'ed into)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None
