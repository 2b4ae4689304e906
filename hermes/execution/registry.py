"""Engines by the name a spec gives in ``engine:``; each is imported only when an experiment uses it."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError
from hermes.execution.contract import Executor

if TYPE_CHECKING:
    from hermes.experiment.spec import ExperimentSpec

ENGINES: dict[str, str] = {
    "local": "hermes.local.engine:LocalEngine",
    "ray": "hermes.ray.engine:RayEngine",
}


class ExecutionEngine(ABC):
    """What a session needs of an engine: its profile, the work for a configuration, an executor.

    Made from the spec before anything is written to the store, so a spec the engine cannot run
    (a GPU this machine lacks) leaves no experiment behind."""

    starts_at_once = False  # its executor is built in moments: an interrupt meanwhile waits until it is (``run``)

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self.workdir = str(spec.workdir)  # where trials run, resolved once

    @abstractmethod
    def profile(self) -> ExecutionProfile:
        """The switch cost of the spec's trials on this engine, for ``SchedulingPolicy.configure``."""

    @abstractmethod
    def capacity(self) -> int:
        """The GPUs (or slots) it expects to run on: samplers that learn keep a few trials per GPU in flight."""

    @abstractmethod
    def work(self, params: Mapping[str, Any]) -> Any:
        """What the executor runs for a trial with these hyper-parameters."""

    @abstractmethod
    def executor(self, directory: Path, clock_offset: float) -> Executor:
        """A new executor whose clock continues from ``clock_offset`` (a restarted experiment's time)."""

    def close(self) -> None:
        """Release what the engine holds beyond its executors (a Ray instance of the run's own); the session's
        last call."""


def make_engine(spec: ExperimentSpec) -> ExecutionEngine:
    try:
        module, _, name = ENGINES[spec.engine].partition(":")
    except KeyError:
        raise HermesError(f"engine: {spec.engine!r} is not available; choose one of {', '.join(ENGINES)}") from None
    return getattr(importlib.import_module(module), name)(spec)
