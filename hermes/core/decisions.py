"""Decisions: what the core asks an executor to do, as verbs. The core never acts itself.

Like events, decisions are values that nothing modifies (not frozen only because that is cheaper).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Start:
    """Launch a pending trial from scratch on ``gpu``."""

    trial_id: str
    gpu: str


@dataclass(slots=True)
class Suspend:
    """Checkpoint the trial at its next step boundary and free its GPU; answer with TrialSuspended."""

    trial_id: str


@dataclass(slots=True)
class Resume:
    """Restart a suspended trial from its checkpoint on ``gpu``; ``migrated`` when that is not its last GPU."""

    trial_id: str
    gpu: str
    migrated: bool = False


@dataclass(slots=True)
class Stop:
    """End the trial for good; a suspended trial just drops its checkpoint."""

    trial_id: str


Decision = Start | Suspend | Resume | Stop
