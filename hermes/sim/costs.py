"""What switching costs in simulated seconds: a model of the trial's state size and the device.

A switch moves a trial's state. What that costs is a fixed latency plus the state's size over the
bandwidth of the path it takes, so the model has one latency and one bandwidth per path:

- suspend: the state leaves the device for host memory (PCIe on a GPU; nothing to copy on a CPU slot);
- resume on the same GPU: it comes back from host memory (warm workers park trials in memory);
- resume on another GPU of the node: the old worker spills it to disk and the new one reads it back;
- resume on another node: the spill also crosses the network.

Two named profiles, ``SwitchCosts.profile("warm")`` (the default: trials in warm workers) and
``SwitchCosts.profile("process")`` (a process per run: every switch checkpoints to disk, exits,
starts Python, imports the framework and restores), take their figures from
``calibration.json`` next to this module, which ``bench/switching.py --write`` measures and
writes. Where a figure was not measured (PCIe without a GPU, the network on one machine), the
file says so and holds the assumption used. Built-in values, the same measurements, stand in when
the file is absent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

CALIBRATION = Path(__file__).with_name("calibration.json")

_BUILT_IN: dict[str, dict[str, float]] = {
    # bench/switching.py on 2 CPU slots (10 MB, calibration.json): suspend + resume 1.2 ms, migration 63 ms;
    # PCIe 4.0 x16 pageable copies (about 12 GB/s) and 10 GbE are assumptions, not measurements.
    "warm": {"start": 0.05, "suspend": 0.0002, "resume": 0.0001, "spill": 0.01, "spill_mb_s": 400.0,
             "migration": 0.1, "network_mb_s": 1250.0, "device_mb_s": 12000.0},
    # a process per run (bench/real_example.py, bench/switching.py): start and resume about 3 s, suspend 0.2 s
    "process": {"start": 3.0, "suspend": 0.2, "resume": 3.0, "spill": 0.0, "spill_mb_s": math.inf,
                "migration": 1.0, "network_mb_s": 1250.0, "device_mb_s": 12000.0},
}

DEFAULT_STATE_MB = 100.0
"""State of a trial whose trace gives none: about 8 million float32 parameters with two optimizer
buffers (a mid-sized CNN under Adam). An assumption, stated so that it can be overridden per trace."""


def load_calibration(path: Path = CALIBRATION) -> dict[str, dict[str, float]]:
    """The profiles of ``path`` (``null`` is an infinite bandwidth), else the built-in ones."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {name: dict(values) for name, values in _BUILT_IN.items()}
    return {
        name: {key: math.inf if value is None else float(value) for key, value in profile["costs"].items()}
        for name, profile in document["profiles"].items()
    }


_CALIBRATED = load_calibration()
_WARM = _CALIBRATED["warm"]


@dataclass(frozen=True, slots=True)
class SwitchCosts:
    """Latencies in seconds and bandwidths in MB/s (``math.inf``: the path costs no time per MB)."""

    start: float = _WARM["start"]  # launch a trial (paid by every policy)
    suspend: float = _WARM["suspend"]  # fixed part of a suspend
    resume: float = _WARM["resume"]  # fixed part of a resume on the GPU it left
    migration: float = _WARM["migration"]  # extra fixed part when it resumes on another node
    spill: float = _WARM["spill"]  # extra fixed part when it resumes on another GPU: write and read a checkpoint
    spill_mb_s: float = _WARM["spill_mb_s"]  # a spill's write and read, per MB of state
    network_mb_s: float = _WARM["network_mb_s"]  # copying a spilled state to another node
    device_mb_s: float = _WARM["device_mb_s"]  # copying the state between the device and host memory
    state_mb: float = DEFAULT_STATE_MB  # state of a trial whose trace gives none

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not value >= 0 or (item.name.endswith("_mb_s") and value == 0):
                raise ValueError(f"switch cost {item.name} must be {'> 0' if item.name.endswith('_mb_s') else '>= 0'}")
        if math.isinf(self.state_mb):
            raise ValueError("switch cost state_mb must be finite")

    @classmethod
    def profile(cls, name: str, **overrides: float) -> SwitchCosts:
        """A named profile of the calibration (``warm`` or ``process``), with fields overridden."""
        try:
            values = _CALIBRATED[name]
        except KeyError:
            raise ValueError(f"unknown switch-cost profile {name!r}; choose one of {', '.join(_CALIBRATED)}") from None
        return cls(**{**values, **overrides})

    def with_state(self, state_mb: float) -> SwitchCosts:
        return replace(self, state_mb=state_mb)

    def suspend_cost(self, state_mb: float | None = None) -> float:
        """Seconds from a suspend at a step boundary to the released device."""
        return self.suspend + self._mb(state_mb) / self.device_mb_s

    def resume_cost(self, state_mb: float | None = None, *, other_gpu: bool = False, other_node: bool = False) -> float:
        """Seconds from a resume to the trial training again; ``other_node`` implies ``other_gpu``."""
        state = self._mb(state_mb)
        cost = self.resume + state / self.device_mb_s
        if other_gpu or other_node:
            cost += self.spill + state / self.spill_mb_s
        if other_node:
            cost += self.migration + state / self.network_mb_s
        return cost

    def migration_cost(self, state_mb: float | None = None) -> float:
        """What a resume on another GPU of the node adds to one on the GPU the trial left: the spill."""
        return self.resume_cost(state_mb, other_gpu=True) - self.resume_cost(state_mb)

    def switch_cost(self, state_mb: float | None = None) -> float:
        """A time-sharing switch on one GPU: suspend and resume there (what a scheduler prices a turn at)."""
        return self.suspend_cost(state_mb) + self.resume_cost(state_mb)

    def to_dict(self) -> dict[str, Any]:
        return {item.name: (None if math.isinf(v := getattr(self, item.name)) else v) for item in fields(self)}

    def _mb(self, state_mb: float | None) -> float:
        return self.state_mb if state_mb is None else state_mb


PROFILES = tuple(_CALIBRATED)
