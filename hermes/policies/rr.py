"""Round robin: time-sharing with equal turns and no priority (Gandiva-like time-slicing)."""

from __future__ import annotations

from hermes.core.trial import Trial
from hermes.core.policy import SchedulingPolicy


class RoundRobinPolicy(SchedulingPolicy):
    name = "rr"
    order_version = 0  # a waiting trial's priority, -idle_since, never changes while it waits

    def priority(self, trial: Trial, now: float) -> float:
        """The trial that has waited longest goes next; a running trial ranks as having just arrived."""
        return -(now if trial.running_since is not None else trial.idle_since)
