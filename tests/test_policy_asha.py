"""ASHA and Hyperband as scheduling policies: pause at rungs, promote the top third, start new trials otherwise."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.policies import Verdict, make_policy
from hermes.policies.asha import NEW_TRIAL, AshaPolicy, HyperbandPolicy
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace


def reported(policy: AshaPolicy, trial: Trial, scores: list[float]) -> list[Verdict]:
    """Report ``scores`` at the trial's next steps; return the verdicts."""
    verdicts = []
    for score in scores:
        step = trial.step + 1
        trial.record(step, score, score, float(step))
        verdicts.append(policy.observe(trial, float(step)))
    return verdicts


def at_first_rung(policy: AshaPolicy, trial_id: str, seq: int, score: float, budget: int = 50) -> Trial:
    trial = Trial(trial_id, seq, budget, submitted_at=0.0)
    assert reported(policy, trial, [score]) == [Verdict.PAUSE]
    return trial


def test_registered_by_name_and_validates_settings() -> None:
    assert isinstance(make_policy("asha"), AshaPolicy)
    assert isinstance(make_policy("hyperband"), HyperbandPolicy)
    with pytest.raises(ValueError):
        AshaPolicy(reduction_factor=1)
    with pytest.raises(ValueError):
        AshaPolicy(min_steps=0)


def test_rungs_grow_by_the_reduction_factor_up_to_the_budget() -> None:
    policy = AshaPolicy()
    assert policy.rung_steps(Trial("t", 0, 50, 0.0)) == [1, 3, 9, 27, 50]
    assert policy.rung_steps(Trial("t", 0, 1, 0.0)) == [1]
    assert AshaPolicy(reduction_factor=4, min_steps=2).rung_steps(Trial("t", 0, 40, 0.0)) == [2, 8, 32, 40]


def test_a_trial_pauses_at_each_rung_and_ends_at_its_budget() -> None:
    policy = AshaPolicy()
    trial = Trial("t", 0, 10, submitted_at=0.0)
    verdicts = reported(policy, trial, [float(s) for s in range(1, 11)])
    paused_at = [step for step, verdict in enumerate(verdicts, 1) if verdict is Verdict.PAUSE]
    assert paused_at == [1, 3, 9]


def test_a_diverged_trial_is_never_promoted() -> None:
    """Five trials reported NaN (the core's score: -inf) and one a number: ranked among the worst, a diverged trial
    was promoted while fewer than the top third were strictly better, so all five trained to their budget."""
    policy = AshaPolicy()
    diverged = []
    for i in range(5):
        trial = Trial(f"d{i}", i, 50, submitted_at=0.0)
        trial.record(1, float("nan"), float("-inf"), 1.0)
        assert policy.observe(trial, 1.0) is Verdict.PAUSE
        diverged.append(trial)
    sound = at_first_rung(policy, "s", 5, 0.9)
    assert [policy.priority(trial, 2.0) for trial in diverged] == [None] * 5
    assert policy.priority(sound, 2.0) is not None


def test_only_the_top_third_of_a_rung_is_promotable() -> None:
    policy = AshaPolicy()
    trials = [at_first_rung(policy, f"t{i}", i, float(i)) for i in range(9)]
    priorities = [policy.priority(t, 10.0) for t in trials]
    assert priorities[:6] == [None] * 6
    assert all(p is not None and p > NEW_TRIAL for p in priorities[6:])
    assert priorities[8] > priorities[7] > priorities[6]  # the best is promoted first
    assert policy.priority(Trial("new", 9, 50, 0.0), 10.0) == NEW_TRIAL  # new trials only when nothing is promotable


def test_promotions_count_against_the_top_and_deeper_rungs_go_first() -> None:
    policy = AshaPolicy()
    trials = [at_first_rung(policy, f"t{i}", i, float(i)) for i in range(6)]
    best, second = trials[5], trials[4]
    training = Trial("training", 20, 50, submitted_at=0.0)  # on its way to its first rung
    core = {trial.trial_id: trial for trial in [*trials, training]}
    policy.attach(core)
    assert policy.priority(second, 10.0) is not None and policy.priority(best, 10.0) is not None
    assert reported(policy, best, [10.0, 11.0]) == [Verdict.CONTINUE, Verdict.PAUSE]  # promoted to rung 3
    # Rung 3 holds one trial: not enough for a top third, so nothing goes on from there while others train
    assert policy.priority(best, 10.0) is None
    training.move_to(TrialState.STOPPED)  # every trial paused or ended, but more may come: a new one is asked for
    assert policy.priority(best, 10.0) is None
    policy.submissions_closed(True)  # none comes: the search is spent, and its best goes on all the same
    assert policy.priority(best, 10.0) == 3.0 and policy.priority(second, 10.0) is not None
    core.pop("training")
    policy.submissions_closed(False)
    others = [at_first_rung(policy, f"u{i}", 10 + i, 0.0) for i in range(3)]  # 9 at rung 1: top 3
    core["more"] = Trial("more", 30, 50, submitted_at=0.0)
    assert policy.priority(second, 10.0) is not None
    assert all(policy.priority(t, 10.0) is None for t in others)
    third = trials[3]
    assert policy.priority(third, 10.0) is not None
    for trial in (second, third):
        reported(policy, trial, [9.0, 9.5])
    assert policy.priority(best, 10.0) > policy.priority(Trial("new", 99, 50, 0.0), 10.0)  # top of three at rung 3
    assert policy.priority(best, 10.0) > max(policy.priority(t, 10.0) or 0.0 for t in trials[:5])


def test_hyperband_assigns_brackets_round_robin_with_later_first_rungs() -> None:
    policy = HyperbandPolicy()
    trials = [Trial(f"t{i}", i, 50, 0.0) for i in range(8)]
    assert [policy.bracket(t) for t in trials] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [policy.rung_steps(t)[0] for t in trials[:4]] == [1, 3, 9, 27]


def test_state_round_trips_through_json() -> None:
    policy = HyperbandPolicy()
    trials = [Trial(f"t{i}", i, 30, 0.0) for i in range(12)]
    for i, trial in enumerate(trials):
        reported(policy, trial, [float((i * 7) % 5 + s) for s in range(1 + i % 4)])
    restored = HyperbandPolicy()
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict(), allow_nan=False)))
    assert [restored.priority(t, 1.0) for t in trials] == [policy.priority(t, 1.0) for t in trials]


@pytest.mark.parametrize("name", ["asha", "hyperband"])
def test_simulation_trains_trials_only_to_rungs(name: str) -> None:
    trace = synthetic_trace(60, 27, seed=4, kind="saturating", epoch_seconds=(5.0, 20.0))
    policy = make_policy(name)
    result = simulate(trace, policy, gpus=4, seed=2, record=True)
    trained = Counter(epoch.trial_id for epoch in result.epochs)
    budgets = {t.name: t.epochs for t in trace.trials}
    probe = {t.name: Trial(t.name, i, t.epochs, 0.0) for i, t in enumerate(trace.shuffled(2))}
    for trial_id, epochs in trained.items():
        assert epochs in policy.rung_steps(probe[trial_id])  # paused only at rungs
    finished = [t for t, e in trained.items() if e == budgets[t]]
    assert 0 < len(finished) <= len(trace.trials) // 3
    assert len(trained) == len(trace.trials)  # every trial started before the experiment ended
    assert result.overhead_fraction < 0.05


@pytest.mark.parametrize("name", ["asha", "hyperband"])
def test_a_small_search_trains_the_best_of_its_last_rung_to_the_end(name: str) -> None:
    """5 trials, 9 steps, factor 3: rung 3 holds 2 scores, too few to promote a third of, and the search ended with
    no trial past step 3. Once every trial is paused or ended, the best of such a rung goes on, deepest first."""
    trace = synthetic_trace(5, 9, seed=1, kind="saturating", epoch_seconds=(5.0, 20.0))
    result = simulate(trace, make_policy(name), gpus=2, seed=0, record=True)
    trained = Counter(epoch.trial_id for epoch in result.epochs)
    assert 9 in trained.values(), trained


def test_asha_misses_a_best_trial_that_starts_badly() -> None:
    """The reason Hermes learns how far to trust early ranks: ASHA cuts at its first rung for good."""
    trace = synthetic_trace(60, 27, seed=6, kind="misleading_first", epoch_seconds=(5.0, 20.0))
    results = [simulate(trace, make_policy("asha"), gpus=4, seed=s).time_to_best_s for s in range(4)]
    assert None in results
