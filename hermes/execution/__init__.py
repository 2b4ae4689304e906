"""The shells' side of the core: the execution contract every engine implements, and the engine loop."""

from __future__ import annotations

from hermes.execution.contract import ANSWERS, ContractMonitor, ContractViolation, Executor, Phase
from hermes.execution.engine import DecisionListener, Engine

__all__ = ["ANSWERS", "ContractMonitor", "ContractViolation", "DecisionListener", "Engine", "Executor", "Phase"]
