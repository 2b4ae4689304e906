"""The trial life cycle: one enum and one table of legal moves."""

from __future__ import annotations

from enum import Enum

from hermes.errors import IllegalTransition


class TrialState(str, Enum):
    PENDING = "pending"  # submitted, never ran
    RUNNING = "running"  # holds a GPU
    SUSPENDING = "suspending"  # asked to checkpoint and yield its GPU; still holds it
    SUSPENDED = "suspended"  # checkpointed, holds no GPU, resumable anywhere
    COMPLETED = "completed"  # trained its whole budget
    STOPPED = "stopped"  # ended early by the scheduler (early stopping or end of the experiment)
    FAILED = "failed"  # crashed or diverged

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def holds_gpu(self) -> bool:
        return self in (TrialState.RUNNING, TrialState.SUSPENDING)


TERMINAL_STATES = frozenset({TrialState.COMPLETED, TrialState.STOPPED, TrialState.FAILED})

_ENDINGS = {TrialState.COMPLETED, TrialState.STOPPED, TrialState.FAILED}

LEGAL_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    TrialState.PENDING: frozenset({TrialState.RUNNING, TrialState.STOPPED}),
    TrialState.RUNNING: frozenset({TrialState.SUSPENDING, TrialState.SUSPENDED, *_ENDINGS}),
    # A suspending trial may still finish, crash or be stopped before its checkpoint lands.
    TrialState.SUSPENDING: frozenset({TrialState.SUSPENDED, *_ENDINGS}),
    TrialState.SUSPENDED: frozenset({TrialState.RUNNING, TrialState.STOPPED, TrialState.FAILED}),
    TrialState.COMPLETED: frozenset(),
    TrialState.STOPPED: frozenset(),
    TrialState.FAILED: frozenset(),
}


def check_transition(trial_id: str, current: TrialState, target: TrialState) -> None:
    """Raise IllegalTransition unless the table allows ``current -> target``."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise IllegalTransition(f"trial {trial_id}: cannot go from {current.value} to {target.value}")
