"""What switching costs in simulated seconds.

Defaults are the costs measured with the local executor on the digits example
(bench/real_example.py, a PyTorch trial on one CPU thread): a cooperative suspend (checkpoint and
process exit) took 0.13-0.3 s, and a start or resume (new process, torch import, checkpoint load)
2.3-4.7 s before the first step. Cross-node migration adds a checkpoint copy, estimated at 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SwitchCosts:
    start: float = 3.0  # launch a trial: process start and framework import (paid by every policy)
    suspend: float = 0.2  # write the checkpoint and release the GPU
    resume: float = 3.0  # restart the process and load the checkpoint
    migration: float = 1.0  # extra, when a trial resumes on another node: copy its checkpoint there

    def __post_init__(self) -> None:
        for name in ("start", "suspend", "resume", "migration"):
            if getattr(self, name) < 0:
                raise ValueError(f"switch cost {name} must not be negative")
