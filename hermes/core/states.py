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
        return self in HOLDING_GPU


# The members under plain names, for the core's hot paths: with Python 3.11, ``TrialState.RUNNING``
# goes through ``EnumType.__getattr__`` and costs about as much as a function call.
PENDING = TrialState.PENDING
RUNNING = TrialState.RUNNING
SUSPENDING = TrialState.SUSPENDING
SUSPENDED = TrialState.SUSPENDED
COMPLETED = TrialState.COMPLETED
STOPPED = TrialState.STOPPED
FAILED = TrialState.FAILED

TERMINAL_STATES = frozenset({COMPLETED, STOPPED, FAILED})
HOLDING_GPU = frozenset({RUNNING, SUSPENDING})

# The moves of one run's life. A rerun with a larger budget runs again the trials the experiment's end stopped, out of
# STOPPED (``Trial.run_again``).
LEGAL_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    PENDING: frozenset({RUNNING, STOPPED}),
    RUNNING: frozenset({SUSPENDING, SUSPENDED, *TERMINAL_STATES}),
    # A suspending trial may still finish, crash or be stopped before its checkpoint lands.
    SUSPENDING: frozenset({SUSPENDED, *TERMINAL_STATES}),
    SUSPENDED: frozenset({RUNNING, STOPPED, FAILED}),
    COMPLETED: frozenset(),
    STOPPED: frozenset(),
    FAILED: frozenset(),
}


def check_transition(trial_id: str, current: TrialState, target: TrialState) -> None:
    """Raise IllegalTransition unless the table allows ``current -> target``."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise IllegalTransition(f"trial {trial_id}: cannot go from {current.value} to {target.value}")
