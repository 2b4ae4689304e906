"""The traditional cluster manager: each trial holds its GPU to completion, in arrival order."""

from __future__ import annotations

from hermes.core.trial import Trial
from hermes.core.policy import SchedulingPolicy


class FifoPolicy(SchedulingPolicy):
    name = "fifo"
    time_sharing = False
    order_version = 0  # a waiting trial's priority, -seq, never changes

    def priority(self, trial: Trial, now: float) -> float:
        return -trial.seq
