"""What the local executor runs for one trial."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from hermes.errors import HermesError
from hermes.local.watchdog import TrialLimits

# Seconds of slot time a suspend and resume cost, by how a trial runs (bench/switching.py, docs/trials.md).
WARM_SWITCH_COST = 0.05  # a warm worker: about 1 ms on the same slot, 63 ms to migrate 10 MB (calibration.json)
PROCESS_SWITCH_COST = 3.2  # a process per run: checkpoint, exit, start Python, import torch, restore
SIGSTOP_SWITCH_COST = 0.01  # an unmodified program: stopped and continued in place


@dataclass(frozen=True, slots=True)
class TrialLaunch:
    """A function (``"package.module:function"``, called with ``config``) or a command (argv, its
    ``{param}`` placeholders already substituted).

    Functions and commands that use ``hermes.trial`` are *cooperative*: they checkpoint and exit
    when suspended, so they may resume on any GPU. With ``warm`` (the default), a function runs
    in its slot's warm worker (hermes/local/worker.py) instead of a process of its own: no start
    or import per trial, and a suspended trial keeps its state in memory. A command with a ``metric_pattern`` is an
    *unmodified* program: the executor reads its metrics from its stdout and stderr and suspends it with SIGSTOP;
    its memory stays resident, so it resumes on its own GPU only (where its process died, it starts again).
    """

    budget: int  # steps the trial trains when never stopped; hermes.trial.budget() in the trial
    function: str | None = None
    command: tuple[str, ...] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)  # JSON-serialisable; hermes.trial.config()
    metric_pattern: str | None = None  # regex over its output lines: the objective's group, optionally a ``step`` group
    cwd: str | None = None  # working directory; the executor's when None
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment variables
    warm: bool = True  # a function runs in a warm worker (a command never does)
    # Per-trial settings for an executor shared by several experiments (a pool); None: the executor's own.
    metric: str | None = None  # the objective among its metrics
    checkpoint_every: int | None = None  # steps between its checkpoints
    directory: str | None = None  # its config, logs and checkpoints (default: the executor's trials/<id>)
    worker_group: str | None = None  # whose warm workers it shares (a pool's experiment); None: the executor's
    limits: TrialLimits | None = None  # when it counts as hung (its spec's trial.timeout and trial.stall)
    ran: float = 0.0  # seconds it ran elsewhere (on other Ray nodes), which its trial.timeout counts too
    # where its durable checkpoints go under the Ray executor's storage URI (a pool's: its experiment's folder and
    # qualified id, so that other stores' experiments of the same id keep theirs apart); None: its trial id
    durable: str | None = None

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise HermesError(f"budget must be at least 1 step, got {self.budget}")
        try:
            json.dumps(dict(self.config))
        except (TypeError, ValueError) as error:
            raise HermesError(f"config must be JSON-serialisable: {error}") from None
        if (self.function is None) == (self.command is None):
            raise HermesError("a trial runs either a function or a command")
        if self.function is not None and not re.fullmatch(r"[\w.]+:\w+", self.function):
            raise HermesError(f"function must read 'package.module:function', got {self.function!r}")
        if self.command is not None:
            if isinstance(self.command, str) or not self.command:
                raise HermesError("command must be a non-empty sequence of arguments")
            object.__setattr__(self, "command", tuple(self.command))
        if self.metric_pattern is not None:
            if self.command is None:
                raise HermesError("metric_pattern applies to commands only")
            if not set(self.pattern.groupindex) - {"step"}:
                raise HermesError(f"metric_pattern needs a group for the objective: {self.metric_pattern!r}")

    @property
    def pattern(self) -> re.Pattern[str]:
        try:
            return re.compile(self.metric_pattern or "")
        except re.error as error:
            raise HermesError(f"invalid metric_pattern {self.metric_pattern!r}: {error}") from None

    @property
    def in_worker(self) -> bool:
        """Whether it runs in a warm worker: functions that need no environment of their own."""
        return self.warm and self.function is not None and not self.env

    @property
    def cooperative(self) -> bool:
        return self.metric_pattern is None

    @property
    def switch_cost(self) -> float:
        """What one suspend and resume of this trial typically costs, for the policy's profile."""
        if self.in_worker:
            return WARM_SWITCH_COST
        return PROCESS_SWITCH_COST if self.cooperative else SIGSTOP_SWITCH_COST

    @property
    def movable(self) -> bool:
        """Whether a suspended trial may resume on another GPU (TrialSubmitted.movable)."""
        return self.cooperative
