"""The trial state machine: the one table of legal transitions, and nothing outside it."""

from __future__ import annotations

import itertools

import pytest

from hermes.core.states import LEGAL_TRANSITIONS, TERMINAL_STATES, TrialState, check_transition
from hermes.core.trial import Trial
from hermes.errors import HermesError, IllegalTransition

LEGAL = sorted(
    ((source, target) for source, targets in LEGAL_TRANSITIONS.items() for target in targets),
    key=lambda pair: (pair[0].value, pair[1].value),
)
ILLEGAL = [
    (source, target)
    for source, target in itertools.product(TrialState, TrialState)
    if target not in LEGAL_TRANSITIONS[source]
]


def _name(pair: tuple[TrialState, TrialState]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def test_table_covers_every_state() -> None:
    assert set(LEGAL_TRANSITIONS) == set(TrialState)
    assert all(target in TrialState for targets in LEGAL_TRANSITIONS.values() for target in targets)


def test_legal_and_illegal_partition_all_pairs() -> None:
    assert len(LEGAL) + len(ILLEGAL) == len(TrialState) ** 2
    assert LEGAL and ILLEGAL


@pytest.mark.parametrize("pair", LEGAL, ids=_name)
def test_legal_transition_passes(pair: tuple[TrialState, TrialState]) -> None:
    source, target = pair
    check_transition("t", source, target)  # does not raise
    trial = Trial("t", 0, budget=3, submitted_at=0.0, state=source)
    trial.move_to(target)
    assert trial.state is target


@pytest.mark.parametrize("pair", ILLEGAL, ids=_name)
def test_illegal_transition_raises(pair: tuple[TrialState, TrialState]) -> None:
    source, target = pair
    with pytest.raises(IllegalTransition, match=f"from {source.value} to {target.value}"):
        check_transition("t", source, target)
    trial = Trial("t", 0, budget=3, submitted_at=0.0, state=source)
    with pytest.raises(IllegalTransition):
        trial.move_to(target)
    assert trial.state is source  # a refused move leaves the state as it was


def test_illegal_transition_is_a_hermes_error() -> None:
    with pytest.raises(HermesError):
        check_transition("t", TrialState.COMPLETED, TrialState.RUNNING)


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES, key=lambda s: s.value), ids=lambda s: s.value)
def test_terminal_states_have_no_exits(state: TrialState) -> None:
    assert state.is_terminal
    assert LEGAL_TRANSITIONS[state] == frozenset()
    assert not state.holds_gpu


def test_terminal_states_are_exactly_the_endings() -> None:
    assert TERMINAL_STATES == {TrialState.COMPLETED, TrialState.STOPPED, TrialState.FAILED}
    for state in set(TrialState) - TERMINAL_STATES:
        assert not state.is_terminal
        assert LEGAL_TRANSITIONS[state], f"{state.value} is not terminal but has no exit"


def test_only_running_and_suspending_hold_a_gpu() -> None:
    assert {state for state in TrialState if state.holds_gpu} == {TrialState.RUNNING, TrialState.SUSPENDING}


def test_every_state_is_reachable_from_pending() -> None:
    reached, frontier = {TrialState.PENDING}, [TrialState.PENDING]
    while frontier:
        for target in LEGAL_TRANSITIONS[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(TrialState)


def test_pending_cannot_be_suspended_or_complete_without_running() -> None:
    for target in (TrialState.SUSPENDING, TrialState.SUSPENDED, TrialState.COMPLETED):
        assert target not in LEGAL_TRANSITIONS[TrialState.PENDING]
