"""Scheduling policies and early stoppers, chosen by name.

The registry names each plug-in's class by import path and imports it only when it is made, so
importing the core or this package loads no plug-in (nor numpy) that an experiment does not use.
A name that holds a colon is itself an import path (``mypackage.policies:ShortestFirst``): a policy
of one's own needs no registration.
"""

from __future__ import annotations

from typing import Any

from hermes.core.policy import EarlyStopper, ExecutionProfile, SchedulingPolicy, Verdict
from hermes.plugins import construct, load_class

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
    """ValueError, saying why, for a name that is neither registered nor a loadable subclass."""
    return _load(POLICIES, name, "policy", SchedulingPolicy)


def stopper_class(name: str) -> type[EarlyStopper]:
    return _load(STOPPERS, name, "early stopper", EarlyStopper)


def make_policy(name: str, **params: Any) -> SchedulingPolicy:
    """TypeError for a parameter of the wrong type (``hermes.plugins.construct``), ValueError out of range."""
    return construct(policy_class(name), params)


def make_stopper(name: str, **params: Any) -> EarlyStopper:
    return construct(stopper_class(name), params)


def _load(registry: dict[str, str], name: str, kind: str, base: type) -> Any:
    path = registry.get(name) or (name if ":" in name else None)
    if path is None:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(registry)}, or give a class of your "
                         "own as module:Class")
    try:
        return load_class(path, base)
    except ValueError as error:
        raise ValueError(f"{kind} {name!r}: {error}") from None


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
