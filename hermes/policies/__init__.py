"""Scheduling policies and early stoppers, chosen by name.

The registry names each plug-in's class by import path and imports it only when it is made, so
importing the core or this package loads no plug-in (nor numpy) that an experiment does not use.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes.core.policy import EarlyStopper, ExecutionProfile, SchedulingPolicy, Verdict

POLICIES: dict[str, str] = {
    "fifo": "hermes.policies.fifo:FifoPolicy",
    "rr": "hermes.policies.rr:RoundRobinPolicy",
    "slaq": "hermes.policies.slaq:SlaqPolicy",
    "asha": "hermes.policies.asha:AshaPolicy",
    "hyperband": "hermes.policies.asha:HyperbandPolicy",
    "hermes": "hermes.policies.hermes:HermesPolicy",
}
STOPPERS: dict[str, str] = {
    "asha": "hermes.policies.stopping:AshaStopper",
    "median": "hermes.policies.stopping:MedianStopper",
}


def policy_class(name: str) -> type[SchedulingPolicy]:
    return _load(POLICIES, name, "policy")


def stopper_class(name: str) -> type[EarlyStopper]:
    return _load(STOPPERS, name, "early stopper")


def make_policy(name: str, **params: Any) -> SchedulingPolicy:
    return policy_class(name)(**params)


def make_stopper(name: str, **params: Any) -> EarlyStopper:
    return stopper_class(name)(**params)


def _load(registry: dict[str, str], name: str, kind: str) -> Any:
    try:
        module, _, attribute = registry[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(registry)}") from None
    return getattr(importlib.import_module(module), attribute)


__all__ = [
    "EarlyStopper",
    "ExecutionProfile",
    "SchedulingPolicy",
    "Verdict",
    "POLICIES",
    "STOPPERS",
    "make_policy",
    "make_stopper",
    "policy_class",
    "stopper_class",
]
