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

# Executor -> trial answers to a report, and commands to a parked trial.
CONTINUE, SUSPEND, STOP = "continue", "suspend", "stop"
RESUME, SPILL = "resume", "spill"  # go on from memory; or write a checkpoint and end (SUSPENDED, ENDED)

# How a warm worker's trial ended.
OK, FAILED, STOPPED = "ok", "failed", "stopped"  # and SUSPENDED: it checkpointed and returned
NO_SPACE = "no_space"  # its disk is full (error: the OSError): not the trial's fault, the run stops
EXIT_NO_SPACE = 75  # the same, as the exit code of a function trial's own process (sysexits' EX_TEMPFAIL)

# Executor -> warm worker commands, one JSON object per line.
START = "start"  # {"op", "trial", "function", "directory", "budget", "metric", "checkpoint_every", "reported_step"}
SAY = "say"  # {"op", "trial", "word"}: an answer to a report, or a command to a parked trial


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def latest_checkpoint(trial_dir: Path) -> tuple[Path, int] | None:
    """The newest committed checkpoint of a trial and its step; None when it has none."""
    return published_checkpoint(trial_dir / CHECKPOINTS_DIR)


def published_checkpoint(root: Path) -> tuple[Path, int] | None:
    """The checkpoint that ``root``'s ``latest`` pointer names, and its step (the layout of a trial's
    ``checkpoints/`` and of a trial's folder in a Ray run's durable storage); None when there is none."""
    try:
        directory = root / (root / LATEST_FILE).read_text().strip()
        meta = json.loads((directory / META_FILE).read_text())
    except FileNotFoundError:
        return None
    return directory, int(meta["step"])
