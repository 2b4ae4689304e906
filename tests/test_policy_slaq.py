"""SLAQ: turns go to the trials predicted to improve most, new trials first."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from hermes.core.trial import Trial
from hermes.policies import make_policy
from hermes.policies.slaq import SlaqPolicy, predicted_gain
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace

SECONDS_PER_STEP = 10.0


def observed(policy: SlaqPolicy, trial_id: str, seq: int, scores: list[float], budget: int = 100) -> Trial:
    """A trial that reported ``scores`` at steps 1, 2, ..., each step taking 10 GPU seconds."""
    trial = Trial(trial_id, seq, budget, submitted_at=0.0)
    trial.running_since = 0.0
    for step, score in enumerate(scores, 1):
        trial.record(step, score, score, now=step * SECONDS_PER_STEP)
        policy.observe(trial, step * SECONDS_PER_STEP)
    return trial


def test_registered_by_name() -> None:
    assert isinstance(make_policy("slaq", period=30.0), SlaqPolicy)


def test_prefers_a_fast_improving_trial_over_a_flat_one() -> None:
    policy = SlaqPolicy()
    fast = observed(policy, "fast", 1, [20.0, 35.0, 46.0, 54.0, 60.0])
    flat = observed(policy, "flat", 0, [50.0, 50.4, 50.6, 50.7, 50.75])
    assert policy.priority(fast, 100.0) > policy.priority(flat, 100.0) >= 0.0


def test_unmeasured_trials_first_then_trials_with_one_report() -> None:
    policy = SlaqPolicy()
    fast = observed(policy, "fast", 0, [20.0, 35.0, 46.0, 54.0, 60.0])
    once = observed(policy, "once", 1, [10.0])
    new = Trial("new", 2, 100, submitted_at=0.0)
    assert policy.priority(new, 50.0) == math.inf
    assert policy.priority(once, 50.0) == policy.prior > policy.priority(fast, 50.0)


def test_a_plateau_predicts_less_than_a_climb_and_no_gain_beyond_the_budget() -> None:
    steps = [1, 2, 3, 4, 5, 6]
    climbing = [10.0, 30.0, 42.0, 50.0, 55.0, 58.0]
    assert predicted_gain(steps, climbing, 6, window=20) > predicted_gain(steps, [58.0] * 6, 6, window=20) == 0.0
    policy = SlaqPolicy()
    done = observed(policy, "done", 0, climbing, budget=6)
    assert policy.priority(done, 60.0) == 0.0


def test_gain_is_normalised_by_the_spread_of_scores() -> None:
    """The same curve shape on a ten times larger scale gets the same priority."""
    small, large = SlaqPolicy(), SlaqPolicy()
    scores = [20.0, 35.0, 46.0, 54.0, 60.0]
    a = observed(small, "a", 0, scores)
    b = observed(large, "b", 0, [10 * s for s in scores])
    assert small.priority(a, 50.0) == pytest.approx(large.priority(b, 50.0))


def test_state_round_trips_through_json() -> None:
    policy = SlaqPolicy(period=30.0)
    trials = [
        observed(policy, "fast", 0, [20.0, 35.0, 46.0, 54.0, 60.0]),
        observed(policy, "flat", 1, [50.0, 50.4, 50.6, 50.7]),
        observed(policy, "two", 2, [40.0, 45.0]),
        observed(policy, "once", 3, [10.0]),
        Trial("new", 4, 100, submitted_at=0.0),
    ]
    restored = SlaqPolicy(period=30.0)
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert [restored.priority(t, 60.0) for t in trials] == [policy.priority(t, 60.0) for t in trials]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_simulation_completes_every_trial(mode: str) -> None:
    trace = synthetic_trace(24, 15, seed=3, mode=mode, epoch_seconds=(5.0, 30.0))
    result = simulate(trace, SlaqPolicy(period=60.0), gpus=3, seed=1, record=True)
    trained = Counter(epoch.trial_id for epoch in result.epochs)
    assert trained == {trial.name: trial.epochs for trial in trace.trials}
    assert not [d for d in result.decisions if d[1] == "Stop"]
    assert result.preemptions > 0
    assert result.time_to_best_s is not None
