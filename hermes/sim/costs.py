"""What switching costs in simulated seconds.

Defaults are deliberately round estimates for a PyTorch trial that checkpoints and exits on
suspend and restarts on resume (process start and framework import dominate, as measured for
Gandiva-style restarts); the real-trial executor measures them and replaces these values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SwitchCosts:
    start: float = 1.5  # launch a trial: process start and framework import (paid by every policy)
    suspend: float = 0.5  # write the checkpoint and release the GPU
    resume: float = 1.5  # restart the process and load the checkpoint
    migration: float = 1.0  # extra, when a trial resumes on another node: copy its checkpoint there

    def __post_init__(self) -> None:
        for name in ("start", "suspend", "resume", "migration"):
            if getattr(self, name) < 0:
                raise ValueError(f"switch cost {name} must not be negative")
