"""Scheduling policies and early stoppers, chosen by name."""

from __future__ import annotations

from typing import Any

from hermes.policies.asha import AshaPolicy, HyperbandPolicy
from hermes.policies.base import EarlyStopper, SchedulingPolicy, Verdict
from hermes.policies.fifo import FifoPolicy
from hermes.policies.hermes import HermesPolicy
from hermes.policies.rr import RoundRobinPolicy
from hermes.policies.slaq import SlaqPolicy
from hermes.policies.stopping import AshaStopper, MedianStopper

POLICIES: dict[str, type[SchedulingPolicy]] = {
    policy.name: policy for policy in (FifoPolicy, RoundRobinPolicy, SlaqPolicy, AshaPolicy, HyperbandPolicy, HermesPolicy)
}
STOPPERS: dict[str, type[EarlyStopper]] = {stopper.name: stopper for stopper in (AshaStopper, MedianStopper)}


def make_policy(name: str, **params: Any) -> SchedulingPolicy:
    try:
        return POLICIES[name](**params)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def make_stopper(name: str, **params: Any) -> EarlyStopper:
    try:
        return STOPPERS[name](**params)
    except KeyError:
        raise ValueError(f"unknown early stopper {name!r}; choose one of {', '.join(STOPPERS)}") from None


__all__ = ["EarlyStopper", "SchedulingPolicy", "Verdict", "POLICIES", "STOPPERS", "make_policy", "make_stopper"]
