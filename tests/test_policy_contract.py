"""The policy and stopper contract (``hermes.testing.policy_contract``) on every registered policy and stopper."""

from __future__ import annotations

import ast
import random
import re

import pytest

from hermes.core.policy import SchedulingPolicy, Verdict
from hermes.core.trial import Trial
from hermes.policies import POLICIES, STOPPERS
from hermes.testing.policy_contract import *  # noqa: F401,F403


@pytest.fixture(params=sorted(POLICIES))
def policy_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(STOPPERS))
def stopper_name(request: pytest.FixtureRequest) -> str:
    return request.param


class Unseeded(SchedulingPolicy):
    """Breaks the determinism rule: its priorities are unseeded random numbers."""

    def priority(self, trial: Trial, now: float) -> float:
        return random.random()


class Forgetful(SchedulingPolicy):
    """Breaks the round trip: it learns from reports, and its ``state_dict`` keeps none of it."""

    def __init__(self, period: float = 60.0) -> None:
        super().__init__(period)
        self.seen: dict[str, float] = {}

    def priority(self, trial: Trial, now: float) -> float:
        return self.seen.get(trial.trial_id, 0.0)

    def observe(self, trial: Trial, now: float) -> Verdict:
        self.seen[trial.trial_id] = -len(self.seen) - trial.step
        return Verdict.CONTINUE


class BrokenPromise(SchedulingPolicy):
    """Promises a time-invariant order (``order_version``), yet odd trials climb as time passes."""

    order_version = 0

    def priority(self, trial: Trial, now: float) -> float:
        return (trial.seq % 2) * now - 100 * trial.step


def test_a_broken_order_promise_is_told_with_both_orders() -> None:
    """The suite failed such a policy with a bare "at 22.323177: TrialReported": it says now what ``order_version``
    promises, and the order the core cached beside the full scan's."""
    ids = r"\[('\d+'(, )?)+\]"
    with pytest.raises(AssertionError, match=rf"^TrialReported at [\d.]+, node n\d: order_version 0 promises that the "
                                             r"relative order of waiting trials changes only when the policy bumps it, "
                                             rf".*\n  core's order: {ids}\n  full scan:    {ids}$") as caught:
        test_a_time_invariant_order_equals_a_full_scan(f"{__name__}:BrokenPromise")
    cached, scanned = (ast.literal_eval(order) for order in re.findall(r": +(\[.*\])$", str(caught.value), re.M))
    assert sorted(cached) == sorted(scanned) and cached != scanned  # the same trials, in another order


def test_a_broken_policy_is_told_which_decision_differed_first() -> None:
    """The suite failed a policy that breaks the rule with a bare AssertionError: pytest does not rewrite the
    asserts of the imported suite, so nothing said which decision differed, or after which event."""
    first_differs = r"decision \d+ of \d+ differs first\n  expected: event (\d+) \(\w+ at [\d.]+\): \w+\(.*\n  got: "
    with pytest.raises(AssertionError, match="the same run again gave other decisions: " + first_differs):
        test_the_same_events_give_the_same_decisions(f"{__name__}:Unseeded")
    with pytest.raises(AssertionError, match=r"a state_dict round trip after event (\d+): " + first_differs) as caught:
        test_a_state_dict_round_trip_mid_run_changes_no_decision(f"{__name__}:Forgetful")
    swapped, differs = re.search(r"after event (\d+): .*\n  expected: event (\d+)", str(caught.value)).groups()
    assert int(differs) > int(swapped) and "before the round trip" not in str(caught.value)
    with pytest.raises(AssertionError, match=r"\(at event \d+, before the round trip: the run itself differs\)"):
        test_a_state_dict_round_trip_mid_run_changes_no_decision(f"{__name__}:Unseeded")
