"""Running trials on this machine: its GPUs, or CPU slots when it has none."""

from __future__ import annotations

from hermes.local.executor import LocalExecutor
from hermes.local.launch import TrialLaunch
from hermes.local.resources import Slot, discover_gpus, local_slots
from hermes.local.runs import SwitchTiming

__all__ = ["LocalExecutor", "Slot", "SwitchTiming", "TrialLaunch", "discover_gpus", "local_slots"]
