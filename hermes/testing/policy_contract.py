"""The policy and stopper contract suite: the determinism rule, checked on any policy or early stopper.

Importable from the package like ``hermes.testing.executor_conformance``, so that a policy or stopper
of one's own runs the very tests Hermes's own run. A test module imports the suite, then defines the
fixture ``policy_name``, ``stopper_name`` or both (after the import, which brings defaults that skip),
each a registered name or an import path ``module:Class``::

    import pytest

    from hermes.testing.policy_contract import *  # noqa: F401,F403

    @pytest.fixture
    def policy_name() -> str:
        return "mypackage.policies:ShortestFirst"

    @pytest.fixture
    def stopper_name() -> str:
        return "mypackage.stoppers:PatienceStopper"

Every test runs the same simulated experiment (60 mixed curves of 10 steps on 5 GPUs in two nodes)
through the real core. A policy is made as ``make_policy(name, period=30.0)`` and a stopper as
``make_stopper(name)``, with their defaults otherwise; a stopper is composed with the ``rr`` policy.

For a policy:

- ``priority`` is a number (not NaN) or None, for every unfinished trial at every event, ``turn_over`` True or False
  for every running trial of a time-sharing policy, and ``observe`` returns a ``Verdict``: the core refuses anything
  else as the policy's ``PluginError``;
- the same events give the same decisions;
- ``priority`` answers without changing the policy's state, or any later decision;
- a policy that promises a time-invariant order (``order_version``) gets from the core's cached
  order exactly what a full scan by priority gives;
- a ``state_dict`` round trip through JSON in the middle of a run changes no decision after it (its state is
  plain data that JSON holds).

For a stopper (which must stop some trial of that run, else the tests prove nothing):

- the same run gives the same decisions, whatever ran before it in the process;
- ``should_stop`` answers True or False, and asked again, without a new report, changes neither its state nor any
  later decision;
- a ``state_dict`` round trip through JSON in the middle of a run changes no decision after it.

What a plug-in raises, or an answer the core refuses, fails a test as an AssertionError with the plug-in's
``PluginError`` message.
"""

from __future__ import annotations

import json
from typing import Callable

import pytest

from hermes.core.decisions import Decision, Stop
from hermes.core.events import Event, SubmissionsClosed
from hermes.core.policy import (
    EarlyStopper,
    PluginError,
    SchedulingPolicy,
    checked_migration_penalty,
    checked_priority,
    checked_should_stop,
    checked_turn_over,
    plugin_call,
    plugin_state,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import RUNNING
from hermes.execution.engine import Engine
from hermes.policies import make_policy, make_stopper
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.synthetic import synthetic_trace

__all__ = [
    "policy_name",
    "stopper_name",
    "test_priority_and_observe_answer_what_the_core_takes",
    "test_the_same_events_give_the_same_decisions",
    "test_priority_does_not_change_state",
    "test_a_time_invariant_order_equals_a_full_scan",
    "test_a_state_dict_round_trip_mid_run_changes_no_decision",
    "test_a_stopper_gives_the_same_decisions_for_the_same_run",
    "test_should_stop_asked_again_changes_nothing",
    "test_a_stopper_state_dict_round_trip_mid_run_changes_no_decision",
]

LAYOUT = {"n0": ("n0/g0", "n0/g1"), "n1": ("n1/g0", "n1/g1", "n1/g2")}
PERIOD = 30.0
STOPPER_POLICY = "rr"  # the policy every stopper is composed with: it time-shares, and stops nothing itself
Listener = Callable[[Scheduler, Event, list[Decision]], None]


@pytest.fixture
def policy_name() -> str:
    """Overridden by the importing module; without it, the policy tests do not apply."""
    pytest.skip("no policy_name fixture: define one to run the policy tests")


@pytest.fixture
def stopper_name() -> str:
    """Overridden by the importing module; without it, the stopper tests do not apply."""
    pytest.skip("no stopper_name fixture: define one to run the stopper tests")


def fresh_policy(name: str, executor: SimulatedExecutor) -> SchedulingPolicy:
    """The policy as a session makes it: from its name, then told the engine's costs."""
    policy = make_policy(name, period=PERIOD)
    plugin_call(policy, "configure", executor.profile)
    return policy


def run(name: str, listener: Listener | None = None, *, stopper: str | None = None, seed: int = 4) -> list[str]:
    """One simulation of 60 mixed curves on 5 GPUs in two nodes under policy ``name`` (and ``stopper``);
    its decision log, one line per decision with the event it answers (its number, kind and time). A plug-in that
    raises, or answers what the core refuses, fails it as the suite's other failures: an AssertionError that says
    what went wrong (its ``PluginError``)."""
    try:
        return _simulated(name, listener, stopper, seed)
    except PluginError as error:
        raise AssertionError(str(error)) from error


def _simulated(name: str, listener: Listener | None, stopper: str | None, seed: int) -> list[str]:
    trace = synthetic_trace(60, 10, seed=seed, kind="mixed", epoch_seconds=(5.0, 40.0), diverge_fraction=0.1)
    executor = SimulatedExecutor(LAYOUT)
    scheduler = Scheduler(
        fresh_policy(name, executor),
        objective=Objective(trace.mode),
        stopper=make_stopper(stopper) if stopper is not None else None,
    )
    log: list[str] = []
    events = 0

    def listen(event: Event, decisions: list[Decision]) -> None:
        nonlocal events
        events += 1
        log.extend(f"event {events} ({type(event).__name__} at {event.at:.6f}): {decision!r}" for decision in decisions)
        if listener is not None:
            listener(scheduler, event, decisions)

    engine = Engine(scheduler, executor, [listen])
    for curve in trace.shuffled(seed):
        engine.post(executor.submit(curve.name, curve, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    assert scheduler.finished, f"the run ended after {events} events with trials unfinished"
    return log


def assert_same_decisions(got: list[str], expected: list[str], what: str, *, swapped_after: int | None = None) -> None:
    """Fail naming the first decision that differs and the event it answers: pytest does not rewrite the asserts
    of an imported module, and two logs of thousands of lines compared bare said nothing. ``swapped_after``: the
    event after which a state_dict round trip took place; a difference up to it is the run's own."""
    if got == expected:
        return
    index = next((i for i, pair in enumerate(zip(got, expected)) if pair[0] != pair[1]), min(len(got), len(expected)))

    def line(log: list[str]) -> str:
        return log[index] if index < len(log) else "no decision: the log ends here"

    event = min(int(log[index].split()[1]) for log in (got, expected) if index < len(log))
    before = swapped_after is not None and event <= swapped_after
    raise AssertionError(f"{what}: decision {index + 1} of {len(expected)} differs first"
                         + (f" (at event {event}, before the round trip: the run itself differs)" if before else "")
                         + f"\n  expected: {line(expected)}\n  got:      {line(got)}")


def stops(log: list[str]) -> int:
    """How many ``Stop`` decisions a log holds."""
    return sum(f" {Stop.__name__}(" in line for line in log)


def _state(owner: SchedulingPolicy | EarlyStopper) -> str:
    """A state as JSON holds it, keys sorted so that two equal states compare equal."""
    return json.dumps(plugin_state(owner), sort_keys=True)


def _count_events(name: str, *, stopper: str | None = None) -> tuple[list[str], int]:
    """The uninterrupted run's log and how many events it handled."""
    total = 0

    def count(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        nonlocal total
        total += 1

    return run(name, count, stopper=stopper), total


# ---------------------------------------------------------------------------------------- policies
def test_priority_and_observe_answer_what_the_core_takes(policy_name: str) -> None:
    """Asked of every unfinished trial at every event, ``priority`` answers a number that is not NaN, or None, and
    ``migration_penalty`` one of at least 0; asked of every running trial, ``turn_over`` (of a time-sharing policy:
    the core asks no other) answers True or False; the run's reports get ``Verdict``s from ``observe``. The core
    would fail the experiment on any other answer."""

    def ask_everything(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        policy = scheduler.policy
        for trial in scheduler.trials.values():
            if not trial.state.is_terminal:
                checked_priority(policy, trial, event.at)
                checked_migration_penalty(policy, trial, event.at)
            if policy.time_sharing and trial.state is RUNNING and not trial.stop_requested:
                checked_turn_over(policy, trial, event.at)

    run(policy_name, ask_everything)


def test_the_same_events_give_the_same_decisions(policy_name: str) -> None:
    first = run(policy_name)
    assert len(first) >= 60, f"{len(first)} decisions: every one of the 60 trials must start"
    assert_same_decisions(run(policy_name), first, "the same run again gave other decisions")
    assert run(policy_name, seed=5) != first, "another run gave the same decisions: the log proves nothing"


def test_priority_does_not_change_state(policy_name: str) -> None:
    def ask_everything(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        before = _state(scheduler.policy)
        for trial in scheduler.trials.values():
            if not trial.state.is_terminal:
                scheduler.policy.priority(trial, event.at)
                scheduler.policy.priority(trial, event.at + 1000.0)
                scheduler.policy.migration_penalty(trial, event.at)
        assert _state(scheduler.policy) == before, (f"priority or migration_penalty changed the state at {event.at}: "
                                                    f"{type(event).__name__}")

    assert_same_decisions(run(policy_name, ask_everything), run(policy_name),
                          "priority and migration_penalty asked of every trial at every event changed a later decision")


def test_a_time_invariant_order_equals_a_full_scan(policy_name: str) -> None:
    if not make_policy(policy_name, period=PERIOD).time_sharing:
        pytest.skip("without time-sharing no trial waits on a node: the core keeps them unplaced, and places the "
                    "best first")
    compared = 0

    def compare(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        nonlocal compared
        policy = scheduler.policy
        for node_scheduler in scheduler.node_schedulers.values():
            cached = [trial.trial_id for _, trial in node_scheduler.ranked_waiting(event.at, 1 << 20)]
            scan = sorted(
                (
                    (-priority, trial.seq, trial.trial_id)
                    for trial in node_scheduler.node.members.values()
                    if trial.waiting
                    and (trial.movable or trial.last_gpu is None)
                    and (priority := policy.priority(trial, event.at)) is not None
                ),
            )
            scanned = [trial_id for _, _, trial_id in scan]
            if cached != scanned:
                version = policy.order_version
                ranked = (
                    f"order_version {version!r} promises that the relative order of waiting trials changes only when "
                    "the policy bumps it, but the order the core cached (sorted when it last moved)"
                    if version is not None
                    else "the core's own scan (order_version None), asked at the same time,"
                )
                raise AssertionError(
                    f"{type(event).__name__} at {event.at:.6f}, node {node_scheduler.node.name}: {ranked} differs "
                    f"from a full scan by priority now\n  core's order: {cached}\n  full scan:    {scanned}"
                )
            compared += bool(cached)

    run(policy_name, compare)
    assert compared > 20


def test_a_state_dict_round_trip_mid_run_changes_no_decision(policy_name: str) -> None:
    uninterrupted, total = _count_events(policy_name)
    events = 0

    def swap_halfway(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        nonlocal events
        events += 1
        if events == total // 2:
            fresh = fresh_policy(policy_name, SimulatedExecutor(LAYOUT))
            scheduler.restore_policy(fresh, plugin_state(scheduler.policy))

    assert_same_decisions(run(policy_name, swap_halfway), uninterrupted,
                          f"a state_dict round trip after event {total // 2}", swapped_after=total // 2)
    assert events == total, f"{events} events after the round trip, {total} without it"


# ---------------------------------------------------------------------------------------- stoppers
def test_a_stopper_gives_the_same_decisions_for_the_same_run(stopper_name: str) -> None:
    first = run(STOPPER_POLICY, stopper=stopper_name)
    assert stops(first) > stops(run(STOPPER_POLICY)), "the stopper stopped no trial: this run proves nothing"
    other = run(STOPPER_POLICY, stopper=stopper_name, seed=5)  # another run in between: nothing may carry over
    assert_same_decisions(run(STOPPER_POLICY, stopper=stopper_name), first, "the same run again gave other decisions")
    assert_same_decisions(run(STOPPER_POLICY, stopper=stopper_name, seed=5), other,
                          "the same run (seed 5) again gave other decisions")


def test_should_stop_asked_again_changes_nothing(stopper_name: str) -> None:
    """The core asks once per report, and takes True or False alone; asking again without a new report (a policy
    that consults the stopper, a replay) must neither record anything nor change a later verdict."""
    asked = 0

    def ask_everything(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        nonlocal asked
        stopper = scheduler.stopper
        assert stopper is not None
        before = _state(stopper)
        for trial in scheduler.trials.values():
            # each trial whose every report the stopper was told: the core tells it nothing once it stops a trial
            if trial.steps and not trial.stop_requested:
                checked_should_stop(stopper, trial)
                asked += 1
        assert _state(stopper) == before, f"should_stop changed the state at {event.at}: {type(event).__name__}"

    uninterrupted = run(STOPPER_POLICY, stopper=stopper_name)
    assert stops(uninterrupted) > stops(run(STOPPER_POLICY)), "the stopper stopped no trial: this run proves nothing"
    assert_same_decisions(run(STOPPER_POLICY, ask_everything, stopper=stopper_name), uninterrupted,
                          "should_stop asked again of every trial at every event changed a later decision")
    assert asked > 1000, f"should_stop was asked again only {asked} times"


def test_a_stopper_state_dict_round_trip_mid_run_changes_no_decision(stopper_name: str) -> None:
    uninterrupted, total = _count_events(STOPPER_POLICY, stopper=stopper_name)
    events = stopped_after = 0

    def swap_halfway(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> None:
        nonlocal events, stopped_after
        events += 1
        if events > total // 2:
            stopped_after += sum(isinstance(decision, Stop) for decision in decisions)
        elif events == total // 2:
            assert scheduler.stopper is not None
            fresh = make_stopper(stopper_name)
            plugin_call(fresh, "load_state_dict", plugin_state(scheduler.stopper))
            scheduler.stopper = fresh  # the core holds its stopper there, and nowhere else

    assert_same_decisions(run(STOPPER_POLICY, swap_halfway, stopper=stopper_name), uninterrupted,
                          f"a state_dict round trip after event {total // 2}", swapped_after=total // 2)
    assert events == total, f"{events} events after the round trip, {total} without it"
    assert stopped_after > 0, "no trial was stopped after the round trip: this run proves nothing"
