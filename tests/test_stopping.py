"""Early stoppers: ASHA rungs and the median rule, by hand and in simulation."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hermes.core.trial import Trial
from hermes.policies import make_stopper
from hermes.core.policy import EarlyStopper
from hermes.policies.rr import RoundRobinPolicy
from hermes.policies.stopping import AshaStopper, MedianStopper
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace


def report(stopper: EarlyStopper, trial: Trial, step: int, score: float) -> bool:
    """Record a report as the core does, then ask the stopper."""
    trial.record(step, score, score, now=float(step))
    return stopper.should_stop(trial)


def trial(name: str, seq: int = 0) -> Trial:
    return Trial(name, seq, budget=100, submitted_at=0.0)


def test_registered_by_name() -> None:
    assert isinstance(make_stopper("asha", reduction_factor=4), AshaStopper)
    assert isinstance(make_stopper("median"), MedianStopper)


# ASHA.


def test_asha_keeps_the_top_third_of_a_rung_and_stops_the_rest() -> None:
    stopper = AshaStopper()  # rungs at steps 1, 3, 9, ...
    scores = [3.0, 1.0, 2.0, 9.0, 0.0, 8.0, 7.0, 0.5, 10.0]
    stopped = {score for score in scores if report(stopper, trial(str(score)), 1, score)}
    # 3 and 1 pass an emptier rung; later, only trials in the top third of the rung so far go on.
    assert stopped == {2.0, 0.0, 7.0, 0.5}
    assert not stopped & set(sorted(scores)[-3:])  # the rung's final top third all went on


def test_asha_judges_only_at_rungs_and_at_the_highest_rung_a_report_skipped_to() -> None:
    stopper = AshaStopper(min_steps=1, reduction_factor=2)  # rungs at steps 1, 2, 4, 8
    leader, laggard = trial("leader"), trial("laggard", 1)
    assert not report(stopper, leader, 4, 50.0)  # skipped to rung 4, alone there
    assert not report(stopper, laggard, 1, 5.0)
    assert not report(stopper, laggard, 2, 8.0)
    assert not report(stopper, laggard, 3, 1.0)  # not a rung: not judged, not recorded
    assert report(stopper, laggard, 5, 20.0)  # rung 4 holds 20 and 50: only the top half goes on
    assert stopper.state_dict()["rungs"] == [[5.0], [8.0], [20.0, 50.0]]


def test_asha_state_round_trips_through_json() -> None:
    stopper = AshaStopper()
    trials = [trial(str(i), i) for i in range(8)]
    for i, t in enumerate(trials[:5]):
        report(stopper, t, 1, float(i))
    restored = AshaStopper()
    restored.load_state_dict(json.loads(json.dumps(stopper.state_dict())))
    decisions = []
    for i, t in enumerate(trials):
        twin = trial(t.trial_id, i)  # the same history, for the restored copy
        for step, score in zip(t.steps, t.scores):
            twin.record(step, score, score, now=float(step))
        decisions.append((report(restored, twin, 3, 10.0 - i), report(stopper, t, 3, 10.0 - i)))
    assert decisions == [(False, False)] * 2 + [(True, True)] * 6  # falling scores: each below the best so far


# Median rule.


def test_median_stops_a_clearly_bad_trial_and_not_a_good_one() -> None:
    stopper = MedianStopper()  # grace 1 step, at least 3 others
    for i, offset in enumerate([0.0, 2.0, 4.0, 6.0]):
        peer = trial(f"peer{i}", i)
        assert not any(report(stopper, peer, step, 50.0 + offset + 5 * step) for step in range(1, 6))
    good, bad = trial("good", 4), trial("bad", 5)
    assert not report(stopper, bad, 1, 10.0)  # within the grace period
    assert report(stopper, bad, 2, 12.0)
    assert not any(report(stopper, good, step, 55.0 + 5 * step) for step in range(1, 6))


def test_median_needs_enough_other_trials_at_the_step() -> None:
    stopper = MedianStopper(grace_steps=0, min_trials=3)
    for i in range(2):
        report(stopper, trial(f"peer{i}", i), 1, 90.0)
    assert not report(stopper, trial("bad", 2), 1, 10.0)  # only two others at step 1
    assert report(stopper, trial("worse", 3), 1, 5.0)  # now three


def test_median_judges_its_best_against_running_averages() -> None:
    """A trial that peaked above the median of the others' averages goes on despite a bad last report."""
    stopper = MedianStopper(grace_steps=0)
    for i in range(3):
        peer = trial(f"peer{i}", i)
        report(stopper, peer, 1, 40.0)
        report(stopper, peer, 2, 80.0)  # running average 60 at step 2
    spiky = trial("spiky", 3)
    assert not report(stopper, spiky, 1, 70.0)
    assert not report(stopper, spiky, 2, 20.0)


def test_median_state_round_trips_through_json() -> None:
    stopper = MedianStopper()
    peers = [trial(f"peer{i}", i) for i in range(4)]  # each worse than the one before
    for i, peer in enumerate(peers):
        for step in (1, 2):
            report(stopper, peer, step, 10.0 * (3 - i) + step)
    restored = MedianStopper()
    restored.load_state_dict(json.loads(json.dumps(stopper.state_dict())))
    assert restored.state_dict() == stopper.state_dict()
    decisions = []
    for i, peer in enumerate(peers):
        twin = trial(peer.trial_id, i)
        for step, score in zip(peer.steps, peer.scores):
            twin.record(step, score, score, now=float(step))
        score = 10.0 * (3 - i) + 3
        decisions.append((report(restored, twin, 3, score), report(stopper, peer, 3, score)))
    assert decisions == [(False, False)] * 3 + [(True, True)]  # the last is the first judged against three


# In simulation.


@pytest.mark.parametrize("stopper", [AshaStopper(), MedianStopper()], ids=lambda s: s.name)
def test_simulation_with_a_stopper_ends_every_trial(stopper: EarlyStopper) -> None:
    trace = synthetic_trace(30, 27, seed=5, kind="saturating", epoch_seconds=(5.0, 20.0))
    result = simulate(trace, RoundRobinPolicy(period=40.0), gpus=3, seed=2, stopper=stopper, record=True)
    trained = Counter(epoch.trial_id for epoch in result.epochs)
    stopped = {d[2] for d in result.decisions if d[1] == "Stop"}
    assert stopped
    for t in trace.trials:  # each trial either ran its whole budget or was stopped short of it
        assert (trained[t.name] == t.epochs) != (t.name in stopped), t.name
