"""What a trial process and the local executor agree on: environment, files and messages.

Both sides import these names, so the protocol is written down once. The channel is a pair of
pipes whose descriptors the executor passes in ``HERMES_CHANNEL`` (``"<read fd>,<write fd>"``):
the trial writes one JSON object per line, the executor answers each report with one word per
line. Pipes need no listening socket or path, and the executor sees a dead trial as EOF and as
its process exit, so a crash can never leave either side waiting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hermes.errors import HermesError

ENV_TRIAL_ID = "HERMES_TRIAL_ID"
ENV_TRIAL_DIR = "HERMES_TRIAL_DIR"  # the trial's own directory: config, logs, checkpoints, outputs
ENV_CHANNEL = "HERMES_CHANNEL"
ENV_BUDGET = "HERMES_BUDGET"  # steps the trial trains when it is never stopped
ENV_METRIC = "HERMES_METRIC"  # name of the objective among the reported metrics; empty: any single one
ENV_CHECKPOINT_EVERY = "HERMES_CHECKPOINT_EVERY"  # also checkpoint at every multiple of this step; 0: never
ENV_THREADS = "HERMES_THREADS"  # CPU threads the trial may use
ENV_REPORTED_STEP = "HERMES_REPORTED_STEP"  # the last step of this trial the scheduler has recorded
ENV_WORKER_CHANNEL = "HERMES_WORKER_CHANNEL"  # a warm worker's fd for its messages
ENV_WORKER_OF = "HERMES_WORKER_OF"  # the executor directory a warm worker serves: whose it is, for ps and tests

MAX_STEP = 2**31 - 1  # the largest step: stores keep steps as 32-bit integers (PostgreSQL's INTEGER)

CONFIG_FILE = "config.json"
CHECKPOINTS_DIR = "checkpoints"  # holds committed checkpoints "step-<n>/" and the pointer file
LATEST_FILE = "latest"  # names the newest committed checkpoint; replaced atomically
META_FILE = "hermes.json"  # inside a checkpoint: {"step": n, "metrics": {...}} (metrics of step n)

# Trial -> executor message types. In a warm worker every message also carries "trial": its id.
REPORT = "report"  # {"type", "step", "metrics", "checkpointed"}; the trial then waits for an answer
SUSPENDED = "suspended"  # {"type", "step"}: the checkpoint of ``step`` is committed; the trial ends next
PARKED = "parked"  # {"type", "step"}: suspended with its state in memory (warm workers); waits for a command
ENDED = "ended"  # {"type", "outcome", "error"}: a warm worker's trial returned or raised; error: why it failed
LOOP_STOPPED = "loop_stopped"  # {"type"}: a thread the trial started ended with its StopExit: the rest must exit soon
MISUSED = "misused"  # {"type", "error"}: a ResumeError ends its process (it broke the protocol), or its function
# returned a value and never reported (``hermes.trial.runner.returned_unread``): the trial fails

# Executor -> trial answers to a report, and commands to a parked trial.
CONTINUE, SUSPEND, STOP = "continue", "suspend", "stop"
RESUME, SPILL = "resume", "spill"  # go on from memory; or write a checkpoint and end (SUSPENDED, ENDED)

# How a warm worker's trial ended.
OK, FAILED, STOPPED = "ok", "failed", "stopped"  # and SUSPENDED: it checkpointed and returned
# and MISUSED: a ResumeError ended it, or it returned a value unreported (error: why): no crash to run again, it would
# do the same
NO_SPACE = "no_space"  # its disk is full (error: the OSError): not the trial's fault, the run stops
EXIT_NO_SPACE = 75  # the same, as the exit code of a function trial's own process (sysexits' EX_TEMPFAIL)
HOST_LIMIT = "host_limit"  # its warm worker could not start its thread (error: why): the host's limit of processes
# (``ulimit -u``, a pids limit), not the trial's fault: the run stops, and a rerun continues it

# Executor -> warm worker commands, one JSON object per line.
START = "start"  # {"op", "trial", "function", "directory", "budget", "metric", "checkpoint_every", "reported_step"}
SAY = "say"  # {"op", "trial", "word"}: an answer to a report, or a command to a parked trial


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class DamagedCheckpoint(HermesError):
    """A checkpoint's files are there but cannot be read: its pointer or its metadata is damaged (cut short,
    edited by hand, replaced by something else). ``path``: the damaged file; ``reason``: what is wrong."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is damaged ({reason})")
        self.path = path
        self.reason = reason


def latest_checkpoint(trial_dir: Path) -> tuple[Path, int] | None:
    """The newest committed checkpoint of a trial and its step; None when it has none (DamagedCheckpoint
    when it has one that cannot be read)."""
    return published_checkpoint(trial_dir / CHECKPOINTS_DIR)


def published_checkpoint(root: Path) -> tuple[Path, int] | None:
    """The checkpoint that ``root``'s ``latest`` pointer names, and its step (the layout of a trial's
    ``checkpoints/`` and of a trial's folder in a Ray run's durable storage); None when there is none: no
    pointer, or it names a checkpoint that is gone (``missing_checkpoint`` says which). A pointer or a
    checkpoint's metadata that cannot be read raises DamagedCheckpoint, rather than a JSONDecodeError far
    from the file (or a checkpoint silently taken for none, and deleted by the next one)."""
    pointer = root / LATEST_FILE
    for _ in range(3):  # a checkpoint replaced meanwhile (a report reads while the trial commits): read again
        name = _pointer(pointer)
        if name is None:
            return None
        directory = root / name
        meta = directory / META_FILE
        try:
            text = meta.read_text()
        except FileNotFoundError:
            if not directory.is_dir():
                return None  # gone (deleted by hand): nothing to resume from
            if _pointer(pointer) != name:
                continue  # replaced by a newer one, then deleted, while we read
            raise DamagedCheckpoint(meta, "it is missing") from None
        except (OSError, UnicodeDecodeError) as error:
            raise DamagedCheckpoint(meta, _why(error)) from None
        if not text.strip():
            raise DamagedCheckpoint(meta, "it is empty")
        try:
            data = json.loads(text)
        except ValueError as error:
            raise DamagedCheckpoint(meta, f"it is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise DamagedCheckpoint(meta, f"it holds {type(data).__name__} JSON, not an object")
        step = data.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DamagedCheckpoint(meta, f"its step is {step!r}, not a whole number")
        return directory, step
    return None


def missing_checkpoint(trial_dir: Path) -> str:
    """Why a trial has no checkpoint, for a trial told that it has one: which file is not there."""
    root = trial_dir / CHECKPOINTS_DIR
    for path in (trial_dir, root, root / LATEST_FILE):
        if not path.exists():
            return f"there is no {path}"
    name = (root / LATEST_FILE).read_text(errors="replace").strip()
    return f"{root / LATEST_FILE} names {name}, which is not there"


def _pointer(pointer: Path) -> str | None:
    """The checkpoint name in a ``latest`` pointer; None when there is no pointer."""
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise DamagedCheckpoint(pointer, _why(error)) from None
    if not name or name in (".", "..") or "/" in name or "\0" in name:  # zeros: what a crash may leave
        raise DamagedCheckpoint(pointer, f"it names {name!r}, not a checkpoint")
    return name


def _why(error: Exception) -> str:
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)
