"""Hermes: unmeasured trials first, then optimistic convergence-aware standings, ageing, cheap turns.

Hand-made situations drive the policy directly with Trial records; simulations on synthetic
traces check the whole loop on each difficulty (late crossing, misleading first epoch, noise,
divergence, epochs shorter than a switch, very long epochs).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.policies import make_policy
from hermes.policies.hermes import DEFERRED, NOISE_BINS, UNMEASURED, HermesPolicy, _rung_value
from hermes.policies.stats import expected_excess, normal_scores, probit, reservation_offset, reservation_offset_of
from hermes.sim.costs import SwitchCosts
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import Trace, TraceTrial, load_trace

STEP_SECONDS = 30.0
DATA = Path(__file__).resolve().parent.parent / "data"


class Clock:
    """Hands out GPU time so that hand-made trials look like they ran one at a time."""

    def __init__(self) -> None:
        self.now = 0.0


def trained(policy: HermesPolicy, clock: Clock, trial_id: str, seq: int, scores: list[float], budget: int = 50,
            seconds: float = STEP_SECONDS, params: dict[str, float] | None = None) -> Trial:
    """A trial that ran once from the start, reported ``scores`` at steps 1, 2, ... (``seconds`` each) and was suspended."""
    trial = Trial(trial_id, seq, budget, submitted_at=0.0, params=params or {})
    trial.begin_run("g0", clock.now)
    for step, score in enumerate(scores, 1):
        clock.now += seconds
        trial.record(step, score, score, clock.now)
        policy.observe(trial, clock.now)
    trial.move_to(TrialState.SUSPENDING)
    trial.end_run(clock.now)
    trial.move_to(TrialState.SUSPENDED)
    return trial


def population(policy: HermesPolicy, clock: Clock, finals: np.ndarray, first: np.ndarray, steps: int,
               deep: int = 25) -> list[Trial]:
    """Trials whose curves rise from ``first`` towards ``finals``; the first ``deep`` train ``steps`` steps, the rest 1."""
    trials = []
    for i, (low, high) in enumerate(zip(first, finals)):
        curve = [low] + [high - (high - low) * 0.5**k for k in range(1, steps)]
        trials.append(trained(policy, clock, f"t{i}", i, curve if i < deep else curve[:1]))
    return trials


# ---------------------------------------------------------------------- the parts


def test_registered_by_name_and_validates_settings() -> None:
    assert isinstance(make_policy("hermes", period=30.0), HermesPolicy)
    for bad in ({"optimism": -1.0}, {"ageing": -1.0}, {"min_trials": 2},
                {"rung_factor": 1.0}, {"switch_cost": -1.0}, {"period": 0.0}):
        with pytest.raises(ValueError):
            HermesPolicy(**bad)


def test_normal_scores_depend_only_on_the_order() -> None:
    values = np.array([3.0, -math.inf, 10.0, 0.5])
    assert np.allclose(normal_scores(values), normal_scores(1000 * values + 7))
    assert list(np.argsort(normal_scores(values))) == [1, 3, 0, 2]
    assert probit(np.array([0.5, 0.975, 0.001]))[1] == pytest.approx(1.959964, abs=1e-6)
    assert probit(np.array([0.001]))[0] == pytest.approx(-3.090232, abs=1e-6)


def test_unmeasured_trials_come_first() -> None:
    policy, clock = HermesPolicy(), Clock()
    measured = [trained(policy, clock, f"m{i}", i, [float(i)]) for i in range(5)]
    new = Trial("new", 9, 50, submitted_at=0.0)
    assert policy.priority(new, clock.now) == UNMEASURED
    assert all(policy.priority(t, clock.now) < UNMEASURED / 2 for t in measured)


def reported_once(policy: HermesPolicy, trial: Trial, seconds: float, now: float) -> None:
    """``trial`` ran alone from ``now`` and reported step 1 after ``seconds``."""
    trial.begin_run("g0", now)
    trial.record(1, 1.0, 1.0, now + seconds)
    policy.observe(trial, now + seconds)
    trial.move_to(TrialState.SUSPENDING)
    trial.end_run(now + seconds)
    trial.move_to(TrialState.SUSPENDED)


def hold_the_gpu(policy: HermesPolicy, known: float, start: float) -> None:
    """A trial, known to the policy at ``known``, holds the GPU from ``start``: so waiting ones age."""
    holder = Trial("holder", 42, 50, submitted_at=0.0)
    policy.priority(holder, known)
    holder.begin_run("g0", start)
    policy._refresh_budgets(start)


def widths_measured(policy: HermesPolicy, count: int = 30, seconds_per_width: float = 0.5) -> float:
    """``count`` trials of widths 10..100 reported once, each taking time in proportion to its width."""
    now = 0.0
    for i in range(count):
        width = 10 * (i % 10 + 1)
        reported_once(policy, Trial(f"m{i}", i, 50, submitted_at=0.0, params={"width": width}), seconds_per_width * width, now)
        now += seconds_per_width * width
    return now


def test_new_trials_go_shortest_predicted_first() -> None:
    """Once the first reports show that width sets the epoch length, the narrow new trials go first."""
    policy = HermesPolicy()
    now = widths_measured(policy)
    new = [Trial(f"w{width}", 100 + k, 50, submitted_at=0.0, params={"width": width}) for k, width in enumerate((90, 10, 50))]
    order = sorted(new, key=lambda t: -policy.priority(t, now))
    assert [t.trial_id for t in order] == ["w10", "w50", "w90"]
    assert min(policy.priority(t, now) for t in new) > UNMEASURED / 2  # still above every measured trial
    # a wide trial submitted long ago goes before a narrow one submitted after it would have reported
    old = Trial("old", 200, 50, submitted_at=now - 100.0, params={"width": 100})
    narrow = Trial("narrow", 201, 50, submitted_at=now, params={"width": 10})
    assert policy.priority(old, now) > policy.priority(narrow, now)
    # the order never depends on the time of asking (the core may sort waiting trials once)
    assert policy.priority(new[0], now) == policy.priority(new[0], now + 1e6)


def test_arrival_order_when_durations_do_not_follow_the_parameters() -> None:
    rng = np.random.default_rng(4)
    for settings, params in (({}, lambda i: {"lr": float(rng.uniform())}), ({"shortest_first": False}, lambda i: {"width": i})):
        policy, now = HermesPolicy(**settings), 0.0
        for i in range(30):
            seconds = float(rng.uniform(5, 50)) if "lr" in params(i) else 1.0 + i
            reported_once(policy, Trial(f"m{i}", i, 50, submitted_at=0.0, params=params(i)), seconds, now)
            now += seconds
        new = [Trial(f"n{i}", 100 + i, 50, submitted_at=0.0, params=params(30 - i)) for i in range(5)]
        assert len({policy.priority(t, now) for t in new}) == 1  # a tie: the core breaks it by arrival


def test_a_trial_that_ran_once_waits_since_its_submission() -> None:
    """After shortest-first first reports, second turns still go in arrival order (an unbiased sample)."""
    policy = HermesPolicy()
    now = widths_measured(policy)
    wide = Trial("wide", 40, 50, submitted_at=0.0, params={"width": 100})
    narrow = Trial("narrow", 41, 50, submitted_at=0.0, params={"width": 10})
    reported_once(policy, narrow, 5.0, now)  # shortest first: the later arrival reports first
    reported_once(policy, wide, 50.0, now + 5.0)
    hold_the_gpu(policy, now, now + 55.0)
    assert policy._age_rate > 0
    assert wide.idle_since > narrow.idle_since
    assert policy.priority(wide, now + 100.0) == policy.priority(narrow, now + 100.0)  # a tie: arrival order


def test_once_links_rank_the_trials_a_trial_that_ran_once_waits_since_its_run() -> None:
    """The first sweep's length is no credit: after the first links, ageing counts from a trial's last run."""
    rng = np.random.default_rng(0)
    policy, clock = HermesPolicy(), Clock()
    finals = rng.uniform(50, 90, 40)
    population(policy, clock, finals, finals / 2, steps=8)
    assert policy._predictors  # links are fitted: measured trials are ranked, no longer tied
    early = trained(policy, clock, "early", 40, [40.0])  # submitted at 0, like every trial here
    clock.now += 3 * STEP_SECONDS  # others ran meanwhile
    later = trained(policy, clock, "later", 41, [40.0])
    hold_the_gpu(policy, clock.now, clock.now)
    rate, then = policy._age_rate, clock.now + 100.0
    assert rate > 0
    for trial in (early, later):  # not since submission (0), which would credit each with the whole sweep
        assert trial.idle_since > 0
        assert policy.priority(trial, then) == pytest.approx(policy._priority[trial.trial_id] + (then - trial.idle_since) * rate)


def test_a_trial_converging_faster_than_its_peers_outranks_a_slow_one() -> None:
    """Once ranks are seen to persist, the trial that climbed above its peers goes first."""
    rng = np.random.default_rng(0)
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    finals = rng.uniform(50, 90, 40)
    population(policy, clock, finals, finals / 2, steps=8)
    # Both start level; "fast" then rises to near the top, "slow" barely moves.
    fast = trained(policy, clock, "fast", 40, [45.0, 80.0, 86.0, 88.0])
    slow = trained(policy, clock, "slow", 41, [45.0, 48.0, 50.0, 51.0])
    assert policy.priority(fast, clock.now) > policy.priority(slow, clock.now)


def test_a_stretch_is_valued_at_its_end_as_far_as_its_trend_stands_out_of_the_noise() -> None:
    """A rung's value is the stretch's mean moved towards the end of its line by ``1 - v / rise**2``."""
    rising = Trial("rising", 0, 50, submitted_at=0.0)
    flat = Trial("flat", 1, 50, submitted_at=0.0)
    for step, (up, level) in enumerate(zip([55, 58, 60, 70, 80, 90], [55, 58, 78, 77, 79, 78]), 3):
        rising.record(step, up, up, float(step))
        flat.record(step, level, level, float(step))
    assert _rung_value(rising, 4, 0.0) == pytest.approx(90.0)  # no noise: the line's end, where the curve is now
    assert _rung_value(rising, 4, math.inf) == pytest.approx(75.0)  # noise unknown: the mean
    # rise 15 (slope 10 over 1.5 steps from the centre), its variance noise * 1.5**2 / 5: half-way at noise 250
    assert _rung_value(rising, 4, 250.0) == pytest.approx(82.5)
    assert _rung_value(flat, 4, 1.0) == pytest.approx(78.0)  # a rise of 0.3 is within the noise: the mean
    rising.record(9, -math.inf, -math.inf, 9.0)
    assert _rung_value(rising, 4, 0.0) == -math.inf  # a diverged report ranks last, as before


def test_the_noise_of_reports_is_measured_through_the_bend_of_the_curves() -> None:
    """Reports scatter by 2 around curves that bend hard in their first steps: the pooled level is still 2**2."""
    rng = np.random.default_rng(7)
    for noise in (2.0, 0.0):
        policy, clock = HermesPolicy(), Clock()
        for i, (low, high) in enumerate(zip(rng.uniform(5, 45, 40), rng.uniform(50, 90, 40))):
            curve = [high - (high - low) * 0.5**k + rng.normal(0, noise) for k in range(16)]
            trained(policy, clock, f"t{i}", i, curve)
        if noise:
            assert 0.7 * noise**2 < policy._noise_variance() < 1.4 * noise**2
        else:
            assert policy._noise_variance() < 0.01  # the first steps' bend does not count as noise


def test_huge_scores_and_repeated_steps_leave_the_noise_level_readable() -> None:
    """A blowing-up trial's scores square past float range; a restore from an older checkpoint repeats steps."""
    policy = HermesPolicy()
    trial = Trial("t", 0, 50, submitted_at=0.0)
    trial.begin_run("g0", 0.0)
    for step, score in [(1, 1.0), (2, 1e200), (3, -1e200), (4, 1e200), (2, 5.0), (3, 6.0)]:
        trial.record(step, score, score, float(len(trial.steps) + 1))
        policy.observe(trial, float(len(trial.steps)))
    assert policy._noise_variance() == math.inf  # two scatters counted, fewer than a level needs
    assert sum(policy.state_dict()["noise_bins"].values()) == 2


def test_a_trial_rising_through_its_stretch_outranks_a_flat_one_of_the_same_mean() -> None:
    """Clean curves: the stretch's trend is real, so the trial still rising at its rung is valued where it is now."""
    rng = np.random.default_rng(0)
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    finals = rng.uniform(50, 90, 40)
    population(policy, clock, finals, finals / 2, steps=8)
    rising = trained(policy, clock, "rising", 40, [45.0, 50.0, 55.0, 58.0, 64.0, 72.0, 80.0, 88.0])
    flat = trained(policy, clock, "flat", 41, [45.0, 50.0, 55.0, 58.0, 77.0, 77.0, 77.0, 77.0])
    assert policy.priority(rising, clock.now) > policy.priority(flat, clock.now)  # the stretch means were 76 and 77


def test_trust_in_early_ranks_is_learned_from_trials_that_went_further() -> None:
    """Step-1 ranks that predict later ranks (nasbench) spread priorities; ranks that do not (lcbench) do not."""
    rng = np.random.default_rng(1)
    finals = rng.uniform(50, 90, 60)
    spreads = {}
    for label, first in (("informative", finals / 2), ("misleading", rng.uniform(5, 45, 60))):
        policy, clock = HermesPolicy(ageing=0.0), Clock()
        trials = population(policy, clock, finals, first, steps=8)
        waiting_at_step_1 = [policy.priority(t, clock.now) for t in trials[25:]]
        spreads[label] = max(waiting_at_step_1) - min(waiting_at_step_1)
    assert spreads["informative"] > 1.5
    assert spreads["misleading"] < 0.5 * spreads["informative"]


def test_rungs_double_from_the_first_report_and_end_at_the_budget() -> None:
    """A 12-step budget ends in a rung at 12; a budget that is a doubling gets no extra rung; a 1-step one has one."""
    policy, clock = HermesPolicy(), Clock()
    for name, budget in (("twelve", 12), ("eight", 8), ("one", 1)):
        trained(policy, clock, name, len(policy.state_dict()["trials"]), [50.0 + step for step in range(budget)],
                budget=budget)
    state = policy.state_dict()
    rungs = {name: len(values) for name, values in zip(state["trials"], state["values"])}
    assert rungs == {"twelve": 5, "eight": 4, "one": 1}  # steps 1, 2, 4, 8, 12; 1, 2, 4, 8; 1
    assert state["values"][0][-1] == pytest.approx(61.0)  # the last rung holds where the curve ends


def test_trust_is_learned_against_where_trials_stand_at_their_budget() -> None:
    """The last rung is the budget, not the last doubling below it: ranks that the stretch after step 8 of a
    12-step budget overturns earn no trust, ranks it confirms do."""
    rng = np.random.default_rng(2)
    early = rng.uniform(50, 90, 60)
    spreads = {}
    for label, finals in (("confirmed", early), ("overturned", rng.permutation(early))):
        policy, clock = HermesPolicy(ageing=0.0), Clock()
        trials = []
        for i, (level, final) in enumerate(zip(early, finals)):
            curve = [level - level / 2 * 0.5**k for k in range(8)]
            curve += [curve[-1] + (final - curve[-1]) * j / 4 for j in range(1, 5)]
            trials.append(trained(policy, clock, f"t{i}", i, curve if i < 25 else curve[:1], budget=12))
        waiting_at_step_1 = [policy.priority(t, clock.now) for t in trials[25:]]
        spreads[label] = max(waiting_at_step_1) - min(waiting_at_step_1)
    assert spreads["confirmed"] > 1.5
    assert spreads["overturned"] < 0.5 * spreads["confirmed"]


def test_where_a_first_report_tells_nothing_the_hyper_parameters_order_the_waiting_trials() -> None:
    """The final rank follows a learning rate, the first report is noise: once 25 trials went deeper, the waiting
    ones are ranked by what their learning rate predicts; without the prior (``prior=False``) they tie. Judged on
    the first ten waiting trials, which the last refit ranked: the five that report after it hold the prior's
    mean until the next refit, 5% more records later."""
    rng = np.random.default_rng(3)
    rates = rng.uniform(0.0, 1.0, 40)
    finals = 50 + 40 * rates + rng.normal(0, 2, 40)
    first = rng.uniform(5, 45, 40)
    spearman = {}
    for prior in (True, False):
        policy, clock = HermesPolicy(ageing=0.0, prior=prior), Clock()
        trials = []
        for i, (low, high) in enumerate(zip(first, finals)):
            curve = [low] + [high - (high - low) * 0.5**k for k in range(1, 8)]
            trials.append(trained(policy, clock, f"t{i}", i, curve if i < 25 else curve[:1], params={"lr": rates[i]}))
        waiting = np.array([policy.priority(t, clock.now) for t in trials[25:35]])
        spearman[prior] = (np.corrcoef(np.argsort(np.argsort(waiting)), np.argsort(np.argsort(finals[25:35])))[0, 1]
                           if waiting.std() > 0 else 0.0)
    assert spearman[True] > 0.8
    assert abs(spearman[False]) < 0.5


def test_where_deeper_standings_tell_little_the_hyper_parameters_weigh_in_there_too() -> None:
    """Curves start at a quality unrelated to the end and turn towards it late; where they end follows a
    learning rate. Trials that reported twice and wait at the second rung are ranked by what the learning rate
    predicts, which the predictor of that rung weighs in beside the two standings; without the prior they are
    ranked by their standings, which tell nearly nothing here."""
    rng = np.random.default_rng(3)
    rates = rng.uniform(0.0, 1.0, 60)
    early = rng.uniform(0.0, 30.0, 60)
    finals = 40 * rates + rng.normal(0, 2, 60)
    noise = rng.normal(0, 1, (60, 8))
    spearman, weight = {}, {}
    for prior in (True, False):
        # the early curves are unrelated to where they end, so the median rule would defer trials at random
        policy, clock = HermesPolicy(ageing=0.0, prior=prior, defer_behind=False), Clock()
        trials = []
        for i in range(60):
            curve = [early[i] + (finals[i] - early[i]) * (t / 7) ** 3 + noise[i, t] for t in range(8)]
            trials.append(trained(policy, clock, f"t{i}", i, curve if i < 30 else curve[:2], params={"lr": rates[i]}))
        waiting = np.array([policy.priority(t, clock.now) for t in trials[30:45]])
        spearman[prior] = np.corrcoef(np.argsort(np.argsort(waiting)), np.argsort(np.argsort(finals[30:45])))[0, 1]
        weight[prior] = policy.state_dict()["predictors"][1][3]  # the prior's weight at the second rung
    assert weight[True] > 0.5 and weight[False] == 0.0
    assert spearman[True] > 0.8
    assert spearman[False] < 0.6


def test_a_weak_prior_is_trusted_only_as_far_as_it_predicts() -> None:
    """The learning rate explains a quarter of the final rank's variance (correlation 0.52), the first report
    nothing: the prior is used, but the rung-0 prediction is no narrower than the learning rate allows."""
    rng = np.random.default_rng(5)
    rates = rng.uniform(0.0, 1.0, 60)
    finals = 50 + 10 * rates + rng.normal(0, 6, 60)
    first = rng.uniform(5, 45, 60)
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    for i, (low, high) in enumerate(zip(first, finals)):
        curve = [low] + [high - (high - low) * 0.5**k for k in range(1, 8)]
        trained(policy, clock, f"t{i}", i, curve if i < 40 else curve[:1], params={"lr": rates[i]})
    state = policy.state_dict()
    assert state["prior"], "the prior predicts held-out trials here, so it must be fitted"
    population_r = np.corrcoef(rates, finals)[0, 1]
    width = state["predictors"][0][2]
    assert width > 0.95 * math.sqrt(1 - population_r**2)  # a prior on the wrong scale claimed 0.76 for 0.85


def test_a_search_smaller_than_twice_min_trials_still_learns_whom_to_trust() -> None:
    """16 trials, 8 of them trained deeper: too few for ``min_trials`` (20), enough for a link on half the search."""
    rng = np.random.default_rng(2)
    finals = rng.uniform(50, 90, 16)
    spreads = {}
    for label, first in (("informative", finals / 2), ("misleading", rng.uniform(5, 45, 16))):
        policy, clock = HermesPolicy(ageing=0.0), Clock()
        trials = population(policy, clock, finals, first, steps=8, deep=8)
        waiting_at_step_1 = [policy.priority(t, clock.now) for t in trials[8:]]
        spreads[label] = max(waiting_at_step_1) - min(waiting_at_step_1)
    assert spreads["informative"] > 1.0
    assert spreads["misleading"] < 0.1


def test_without_evidence_all_measured_trials_tie() -> None:
    """Before enough trials went deeper, nothing says step-1 ranks matter: ageing alone orders them, whatever
    their steps cost (so the first trials to go deeper, which fit the links, are not the cheap ones)."""
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    trials = [trained(policy, clock, f"t{i}", i, [float(i)], seconds=STEP_SECONDS * (1 + i % 7)) for i in range(30)]
    assert len({policy.priority(t, clock.now) for t in trials}) == 1


def test_a_dearer_trial_gets_less_optimism_once_ranks_carry_information() -> None:
    """Two trials with the same curve: the one whose steps cost five times as much ranks lower, since time to the
    best is GPU seconds; the cheap twin gets no more than the plain optimism; without ``cost_aware`` they tie."""
    rng = np.random.default_rng(0)
    finals = rng.uniform(50, 90, 40)
    priority = {}
    for cost_aware in (True, False):
        for seconds in (STEP_SECONDS / 5, STEP_SECONDS * 5):  # each twin in a search of its own, alike but for it
            policy, clock = HermesPolicy(ageing=0.0, cost_aware=cost_aware), Clock()
            population(policy, clock, finals, finals / 2, steps=8)
            twin = trained(policy, clock, "twin", 40, [45.0, 80.0], seconds=seconds)
            priority[cost_aware, seconds < STEP_SECONDS] = policy.priority(twin, clock.now)
    cheap_aware, dear_aware = priority[True, True], priority[True, False]
    cheap_blind, dear_blind = priority[False, True], priority[False, False]
    assert dear_aware < cheap_aware - 0.1
    assert cheap_aware <= cheap_blind  # never more optimism than ``optimism`` (a known trial pays its small price)
    assert dear_blind == pytest.approx(cheap_blind)


def test_reservation_offset_inverts_the_expected_excess() -> None:
    """The offset whose expected excess is ``e`` is found again, and a dearer opening lowers it."""
    offsets = np.array([-20.0, -3.0, -1.0, 0.0, 1.0, 2.5, 6.0])
    excesses = np.array([expected_excess(float(t)) for t in offsets])
    assert reservation_offset(excesses) == pytest.approx(offsets, abs=1e-3)
    assert np.all(np.diff(reservation_offset(np.linspace(1e-6, 30.0, 200))) < 0)


def test_one_reservation_offset_is_the_arrays_to_the_last_bit() -> None:
    """The scalar path that ranks one trial between refits gives what the array path gives at a refit."""
    grid = np.concatenate([np.geomspace(1e-40, 40.0, 3001), [0.0, 12.0, 13.0], np.linspace(0.0, 1.0, 77)])
    assert [reservation_offset_of(float(excess)) for excess in grid] == reservation_offset(grid).tolist()


def test_ageing_lifts_a_starved_trial_eventually() -> None:
    policy, clock = HermesPolicy(), Clock()
    rng = np.random.default_rng(2)
    finals = rng.uniform(50, 90, 40)
    trials = population(policy, clock, finals, finals / 2, steps=8)
    leader = max(trials, key=lambda t: policy.priority(t, clock.now))
    laggard = min(trials, key=lambda t: policy.priority(t, clock.now))
    leader.begin_run("g0", clock.now)  # the leader holds the only GPU, so it does not age
    policy._refresh_budgets(clock.now)
    assert policy.priority(laggard, clock.now) < policy.priority(leader, clock.now)
    later = clock.now + 1e3
    while policy.priority(laggard, later) <= policy.priority(leader, later):
        later *= 2
        assert later < 1e12, "the laggard never catches up"


def test_a_trial_clearly_behind_the_others_loses_the_benefit_of_the_doubt() -> None:
    """The median rule with 95% confidence, over at least ``min_trials`` others, judges a trial far behind the
    others at the same step: it is then ranked by its prediction, without optimism, and since that prediction is
    below the average too, it waits last. It still ages as every waiting trial does, so the order of waiting trials
    does not change with time and it is not starved; it is not stopped either. With fewer others than
    ``min_trials`` nobody is judged."""
    for defer, cost_aware in ((True, True), (True, False), (False, True)):
        policy, clock = HermesPolicy(defer_behind=defer, cost_aware=cost_aware), Clock()
        rng = np.random.default_rng(4)
        trials = [trained(policy, clock, f"t{i}", i, list(level + np.arange(4.0))) for i, level in
                  enumerate(rng.uniform(60, 80, 24))]
        laggard = trained(policy, clock, "laggard", 24, [5.0, 6.0, 7.0, 8.0])
        policy._refresh_budgets(clock.now)
        state = policy.state_dict()
        now = clock.now  # the laggard has just run: it has not aged yet
        later = now + 2 * DEFERRED * max(1.0, 1.0 / max(policy._age_rate, 1e-9))
        assert policy.priority(laggard, now) < min(policy.priority(t, now) for t in trials)
        if defer:  # it waits last: behind every trial not so judged, even after waiting far longer than them
            unjudged = [t for t in trials if t.trial_id not in state["judged_behind"]]
            waited = now + 1e3 * max(1.0, 1.0 / max(policy._age_rate, 1e-9))
            assert policy.priority(laggard, waited) < min(policy.priority(t, now) for t in unjudged)
        assert policy.priority(laggard, later) > max(policy.priority(t, now) for t in trials)  # they just ran
        gaps = [policy.priority(laggard, at) - policy.priority(trials[0], at) for at in (now, later)]
        assert gaps[0] == pytest.approx(gaps[1])  # everyone ages alike: the order does not change with time
        assert ("laggard" in state["judged_behind"]) is defer
        optimistic, predicted = state["priority"]["laggard"], state["prediction"]["laggard"]
        assert predicted < 0  # the prediction agrees with the judgement
        assert policy.priority(laggard, now) == (min(optimistic, predicted) - DEFERRED if defer else optimistic)
        if not cost_aware:  # the optimism is exactly one width (the frontier's: it is at the horizon): gone
            assert optimistic - predicted == pytest.approx(state["frontier"][2])
        upper_half = sorted(trials, key=lambda t: t.scores[-1])[12:]
        assert not {t.trial_id for t in upper_half} & set(state["judged_behind"])
    few, clock = HermesPolicy(), Clock()
    for i, level in enumerate(np.random.default_rng(4).uniform(60, 80, 18)):
        trained(few, clock, f"t{i}", i, list(level + np.arange(4.0)))
    trained(few, clock, "laggard", 18, [5.0, 6.0, 7.0, 8.0])
    assert few.state_dict()["judged_behind"] == []


def test_a_trial_behind_where_standings_anti_predict_still_goes_first() -> None:
    """Curves that cross: the order at the first step is the reverse of the order at the fourth, where the horizon
    is. The median rule judges a slow starter behind at its second step, as it judges some of the final leaders,
    but its prediction, which the links learned from the crossing curves, still puts it first: it does not wait
    last, since the prediction disagrees with the judgement."""
    policy, clock = HermesPolicy(), Clock()
    rng = np.random.default_rng(5)
    levels = rng.uniform(20, 80, 24)
    trials = [trained(policy, clock, f"t{i}", i, [level, level + rng.normal(0, 5), 100 - level, 101 - level])
              for i, level in enumerate(levels)]
    slow = trained(policy, clock, "slow", 24, [5.0, 6.0])
    policy._refit()
    policy._refresh_budgets(clock.now)
    state = policy.state_dict()
    assert state["predictors"][1][1] < 0  # a low standing at the first step predicts a high one at the horizon
    assert "slow" in state["judged_behind"]
    priority = policy.priority(slow, clock.now)  # it has just run: no ageing yet
    assert priority == min(state["priority"]["slow"], state["prediction"]["slow"])
    assert priority > max(policy.priority(t, clock.now) for t in trials)


def test_a_judgement_is_revised_once_the_trial_is_clearly_ahead_of_the_median() -> None:
    """A judgement is revised only on evidence as strong as the one that made it: a slow starter judged behind
    whose best rises above the others' median with 95% confidence is no longer judged, and gets its optimism back;
    one that only climbs to the median stays judged."""
    policy, clock = HermesPolicy(cost_aware=False), Clock()
    rng = np.random.default_rng(6)
    for i, level in enumerate(rng.uniform(60, 80, 24)):
        trained(policy, clock, f"t{i}", i, list(level + np.arange(8.0)))
    judged_after_step_2 = {}
    for seq, (name, later) in enumerate((("riser", 100.0), ("middling", 72.0)), 24):
        trial = Trial(name, seq, 50, submitted_at=0.0)
        trial.begin_run("g0", clock.now)
        for step, score in enumerate([5.0, 6.0] + [later + step for step in range(6)], 1):
            clock.now += STEP_SECONDS
            trial.record(step, score, score, clock.now)
            policy.observe(trial, clock.now)
            if step == 2:
                judged_after_step_2[name] = name in policy.state_dict()["judged_behind"]
    state = policy.state_dict()
    assert judged_after_step_2 == {"riser": True, "middling": True}
    assert "riser" not in state["judged_behind"] and "middling" in state["judged_behind"]
    assert state["priority"]["riser"] > state["prediction"]["riser"]  # its optimism is back


def test_no_switch_when_it_costs_more_than_finishing() -> None:
    """With steps far shorter than a switch, a turn is never over: the trial runs to its end."""
    policy = HermesPolicy(period=1.0)
    trial = Trial("tiny", 0, 50, submitted_at=0.0)
    trial.begin_run("g0", 0.0)
    now = 1.5
    for step in range(1, 40):
        now += 0.1
        trial.record(step, float(step), float(step), now)
        policy.observe(trial, now)
        assert not policy.turn_over(trial, now)


def test_turns_end_at_rungs_and_after_the_period() -> None:
    policy, clock = HermesPolicy(period=60.0), Clock()
    for i in range(3):
        trained(policy, clock, f"other{i}", i, [1.0])
    trial = Trial("t", 9, 100, submitted_at=0.0)
    trial.begin_run("g0", clock.now)
    clock.now += STEP_SECONDS
    trial.record(1, 1.0, 1.0, clock.now)
    policy.observe(trial, clock.now)
    assert policy.turn_over(trial, clock.now)  # its first report: let unmeasured trials have the GPU
    for step in (2, 3):
        suspend_and_resume(trial, clock.now)
        clock.now += STEP_SECONDS
        trial.record(step, float(step), float(step), clock.now)
        policy.observe(trial, clock.now)
        assert policy.turn_over(trial, clock.now) == (step == 2)  # rung 1 is step 2; step 3 is no rung
    turn = policy.switch_cost / policy.overhead_budget  # a turn lasts this long (more than the period here)
    assert not policy.turn_over(trial, trial.running_since + turn - 1.0)
    assert policy.turn_over(trial, trial.running_since + turn)


def test_without_a_period_a_turn_lasts_one_of_the_trials_own_reports() -> None:
    policy, clock = HermesPolicy(switch_cost=0.1), Clock()  # a switch is cheap: price / budget is 5 s
    for i in range(3):
        trained(policy, clock, f"other{i}", i, [1.0])
    trial = Trial("t", 9, 100, submitted_at=0.0)
    trial.begin_run("g0", clock.now)
    for step in (1, 2, 3):
        clock.now += STEP_SECONDS
        trial.record(step, float(step), float(step), clock.now)
        policy.observe(trial, clock.now)
        suspend_and_resume(trial, clock.now)
    assert not policy.turn_over(trial, trial.running_since + STEP_SECONDS - 1.0)  # step 4 is no rung
    assert policy.turn_over(trial, trial.running_since + STEP_SECONDS)


def test_the_switch_price_is_learned_from_observed_switches() -> None:
    """Told that switches are free, the policy prices them at what a process per run was seen to cost."""
    costs = SwitchCosts.profile("process")
    policy = HermesPolicy(switch_cost=0.0)
    simulate(synthetic_trace(40, 12, seed=3, kind="mixed", epoch_seconds=(5.0, 20.0)), policy, gpus=2, costs=costs)
    state = policy.state_dict()
    total, count = state["switch_seen"]
    assert count > 0 and total / count == pytest.approx(costs.switch_cost(), rel=0.15)  # epochs vary a little
    assert state["switch_price"] == pytest.approx(total / (count + 1))  # the prior of 0 counts as one switch


def test_migrations_are_priced_apart_and_learned_as_a_turn_ends_on_a_free_gpu() -> None:
    """Resumes on another GPU spill the trial's state (1 GB here: about 6 s, against 0.17 s for a switch on one GPU):
    the policy learns what they cost apart from other switches, and prices a turn with them as often as they come."""
    costs = SwitchCosts().with_state(1000.0)
    policy = HermesPolicy()
    trace = synthetic_trace(40, 12, seed=3, kind="mixed", epoch_seconds=(20.0, 60.0))
    result = simulate(trace, policy, gpus=4, costs=costs)
    state = policy.state_dict()
    migrated, count = state["migration_seen"]
    assert count > 10 and migrated / count == pytest.approx(costs.switch_cost() + costs.migration_cost(), rel=0.1)
    assert state["migration_price"] == pytest.approx(costs.migration_cost(), rel=0.1)
    share = result.migrations / result.preemptions
    assert state["turn_price"] == pytest.approx(state["switch_price"] + share * state["migration_price"], rel=0.2)


@pytest.mark.parametrize("gpus", [2, 4])
def test_trials_of_large_state_are_not_slower_to_the_best_than_fifo(gpus: int) -> None:
    """Six trials of 1 GB, epochs of 1-3 s: a migration (6.4 s) costs more than most runs. Priced at a switch on one
    GPU (0.17 s), the sweep's resumes and the turns after it migrated, and hermes was 0.84x FIFO to the best at 2 GPUs
    and 0.73x at 4 over these 20 arrival orders (1.01x and 1.01x now)."""
    trials = tuple(
        TraceTrial(f"t{i}", tuple(1 - (1 - rate) ** epoch for epoch in range(1, 11)), (seconds,) * 10, False, {},
                   state_mb=1000.0)
        for i, (rate, seconds) in enumerate([(0.1, 2.0), (0.5, 1.0), (0.3, 3.0), (0.05, 1.5), (0.8, 2.5), (0.2, 1.0)])
    )
    trace = Trace("large-state", "max", trials)
    runs = [(simulate(trace, make_policy("fifo"), gpus=gpus, seed=seed),
             simulate(trace, HermesPolicy(), gpus=gpus, seed=seed)) for seed in range(20)]
    fifo = sum(f.time_to_best_s for f, _ in runs)
    hermes = sum(h.time_to_best_s for _, h in runs)
    assert fifo / hermes >= 0.95
    assert sum(h.mean_first_feedback_s for _, h in runs) < sum(f.mean_first_feedback_s for f, _ in runs) / 2


@pytest.mark.parametrize("first", [[-1.0, -1e18, -1e36], [0.01, 0.06, 0.11]], ids=["diverged", "float-precision"])
def test_an_odd_first_scatter_does_not_skew_the_search_s_noise(first: list[float]) -> None:
    """The noise bins count from the search's first scatter (so that no metric scale moves an edge); bounded to 2**100
    either side of it, a diverged first trial put every later scatter in the lowest bin (noise 1e41 too high, trends
    weighed at 0 for the rest of the search) and one at float precision put them in the highest (40x too low)."""
    rng = random.Random(0)

    def scatter(policy: HermesPolicy, scores: list[float]) -> None:
        trial = Trial("t", 0, 100, submitted_at=0.0)
        trial.steps, trial.scores = [1, 2, 3], scores
        policy._measure_noise(trial)

    ordinary = [[0.3 + rng.gauss(0, 0.05) for _ in range(3)] for _ in range(60)]
    plain, odd = HermesPolicy(), HermesPolicy()
    scatter(odd, first)
    for scores in ordinary:
        scatter(plain, scores)
        scatter(odd, scores)
    assert odd._noise_variance() == pytest.approx(plain._noise_variance(), rel=0.2)  # a bin is 19% wide


def test_a_state_saved_before_migrations_were_priced_apart_loads_and_decides_as_before() -> None:
    """States saved before stop 49 have no migration prices and count noise bins from 1: they load as they were."""
    policy = HermesPolicy()
    simulate(synthetic_trace(30, 12, seed=3, kind="mixed", epoch_seconds=(5.0, 20.0)), policy, gpus=2)
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    anchor = state["noise_anchor"]
    old = {key: value for key, value in state.items()
           if key not in ("migrations_seen", "migration_seen", "migration_price", "turn_price", "noise_anchor")}
    shift = NOISE_BINS * math.log2(anchor)  # the old bins counted from 1
    old["noise_bins"] = {str(int(key) + math.floor(shift)): count for key, count in state["noise_bins"].items()}
    restored = HermesPolicy()
    restored.load_state_dict(old)
    assert restored._noise_anchor == 1.0
    assert restored._noise_variance() == pytest.approx(policy._noise_variance(), rel=0.2)  # a bin is 19% wide
    assert restored._migration_seen == [0.0, 0] and restored._turn_price == state["switch_price"]
    waiting = Trial("w", 99, 12, submitted_at=0.0)
    assert restored.priority(waiting, 500.0) == policy.priority(waiting, 500.0)


def suspend_and_resume(trial: Trial, now: float) -> None:
    trial.move_to(TrialState.SUSPENDING)
    trial.end_run(now)
    trial.move_to(TrialState.SUSPENDED)
    trial.begin_run("g0", now)


def test_state_with_a_fitted_duration_model_round_trips_through_json() -> None:
    policy = HermesPolicy()
    now = widths_measured(policy)
    waiting = [Trial(f"w{k}", 100 + k, 50, submitted_at=0.0, params={"width": 5 + 7 * k}) for k in range(10)]
    before = [policy.priority(t, now) for t in waiting]
    restored = HermesPolicy()
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict(), allow_nan=False)))
    assert [restored.priority(t, now) for t in waiting] == before
    later = Trial("later", 200, 50, submitted_at=now, params={"width": 33})
    assert restored.priority(later, now) == policy.priority(later, now)
    assert restored.state_dict() == policy.state_dict()


def test_a_state_saved_when_the_prior_was_rung_0s_second_standing_loads_into_the_same_model() -> None:
    """States saved before the prior had a weight of its own kept it in rung 0's ``before`` slot (three numbers
    per predictor); a restart from one restores the same predictors and ranking."""
    rng = np.random.default_rng(5)
    rates = rng.uniform(0.0, 1.0, 60)
    finals = 50 + 40 * rates + rng.normal(0, 2, 60)
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    trials = [trained(policy, clock, f"t{i}", i, [rng.uniform(5, 45), finals[i]] if i < 40 else [rng.uniform(5, 45)],
                      params={"lr": rates[i]}) for i in range(60)]
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    (now, before, width, prior, rise), = state["predictors"]  # the horizon is the second rung: one predictor
    assert prior != 0.0 and before == 0.0 and rise == 0.0
    state["predictors"] = [[now, prior, width]]
    restored = HermesPolicy(ageing=0.0)
    restored.load_state_dict(state)
    assert [restored.priority(t, clock.now) for t in trials] == [policy.priority(t, clock.now) for t in trials]
    assert restored.state_dict() == policy.state_dict()


def test_state_round_trips_through_json() -> None:
    rng = np.random.default_rng(3)
    policy, clock = HermesPolicy(), Clock()
    finals = rng.uniform(50, 90, 40)
    trials = population(policy, clock, finals, finals / 2, steps=8)
    trials.append(trained(policy, clock, "diverged", 99, [10.0, -math.inf]))
    trials.append(Trial("new", 100, 50, submitted_at=0.0))
    restored = HermesPolicy()
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict(), allow_nan=False)))
    assert [restored.priority(t, clock.now) for t in trials] == [policy.priority(t, clock.now) for t in trials]
    assert restored.state_dict() == policy.state_dict()


# ---------------------------------------------------------------------- whole simulations


def check_run(trace: Trace, gpus: int = 4, seed: int = 0, **settings) -> tuple:
    result = simulate(trace, HermesPolicy(**settings), gpus=gpus, seed=seed, record=True)
    epochs = Counter(epoch.trial_id for epoch in result.epochs)
    assert epochs == {t.name: t.epochs for t in trace.trials}  # every trial trained to its end (or divergence)
    assert not [d for d in result.decisions if d[1] == "Stop"]  # Hermes stops no trial
    assert result.time_to_best_s is not None
    return result


@pytest.mark.parametrize(
    ("kind", "diverge"), [("crossing", 0.0), ("misleading_first", 0.0), ("noisy", 0.0), ("mixed", 0.2)]
)
def test_every_difficulty_ends_with_the_best_trained_and_every_trial_done(kind: str, diverge: float) -> None:
    trace = synthetic_trace(60, 20, seed=5, kind=kind, epoch_seconds=(10.0, 60.0), diverge_fraction=diverge)
    hermes = check_run(trace)
    fifo = simulate(trace, make_policy("fifo"), gpus=4, seed=0)
    assert hermes.mean_first_feedback_s < fifo.mean_first_feedback_s / 5
    assert hermes.overhead_fraction < 0.03


def test_beats_fifo_and_round_robin_where_early_ranks_mislead() -> None:
    """Misleading first epochs (as in lcbench): Hermes learns not to trust them and still finds the best fast."""
    trace = synthetic_trace(80, 24, seed=7, kind="misleading_first", epoch_seconds=(10.0, 60.0))
    hermes = [check_run(trace, seed=seed).time_to_best_s for seed in range(3)]
    fifo = [simulate(trace, make_policy("fifo"), gpus=4, seed=seed).time_to_best_s for seed in range(3)]
    rr = [simulate(trace, make_policy("rr"), gpus=4, seed=seed).time_to_best_s for seed in range(3)]
    assert sum(hermes) < sum(fifo) / 1.5
    assert sum(hermes) < sum(rr) / 2


def test_from_the_third_rung_a_trial_still_climbing_outranks_one_that_flattened() -> None:
    """Saturating curves whose rate hides their asymptote: from the third rung on the latest change is the rise
    of the value, ranked among the trials at the rung (the change of standing only into the second rung). Two
    trials level at step 4, one still climbing and one flat since step 2, are told apart by it; a state saved
    before the rise existed (four numbers per predictor) loads with a rise weight of 0, the model it was saved
    with."""
    rng = np.random.default_rng(0)
    policy, clock = HermesPolicy(ageing=0.0), Clock()
    rates = rng.uniform(1.0, 12.0, 60)
    ceilings = rng.uniform(50.0, 90.0, 60)

    def curve(ceiling: float, rate: float) -> list[float]:
        return [ceiling * (1.0 - math.exp(-step / rate)) for step in range(1, 17)]

    for i in range(60):
        scores = curve(ceilings[i], rates[i])
        trained(policy, clock, f"t{i}", i, scores if i < 30 else scores[:4], budget=16)
    level = 55.0 * (1.0 - math.exp(-4.0))
    flat = trained(policy, clock, "flat", 60, curve(55.0, 1.0)[:4], budget=16)
    climbing = trained(policy, clock, "climbing", 61, curve(level / (1.0 - math.exp(-0.4)), 10.0)[:4], budget=16)
    assert climbing.scores[-1] == pytest.approx(flat.scores[-1])
    policy._refit()
    state = policy.state_dict()
    (_, before_1, _, _, rise_1), (_, before_2, _, _, rise_2) = state["predictors"][1:3]
    assert before_1 != 0.0 and rise_1 == 0.0  # into the second rung: the change of standing
    assert before_2 == 0.0 and rise_2 > 0.3  # deeper: the rise, which these curves make telling
    assert policy._prediction["climbing"] > policy._prediction["flat"] + 1.0
    old = json.loads(json.dumps(state, allow_nan=False))
    old["predictors"] = [predictor[:4] for predictor in old["predictors"]]
    old["frontier"] = old["frontier"][:4]
    restored = HermesPolicy(ageing=0.0)
    restored.load_state_dict(old)
    assert all(predictor.rise == 0.0 for predictor in restored._predictors)


def test_where_curves_cross_the_rise_finds_the_slow_starter_that_ends_best() -> None:
    """Synthetic crossing curves (the better a trial, the slower it rises): the trials still climbing when the
    others have flattened end best, and the rise says so. Six traces and arrival orders, 4 GPUs: time to best
    over FIFO at least 1.6x in the mean and above 0.6x in every order (the change of standing at every rung: 1.44x,
    and 0.50x in one order). Not above 1x in every order: since resumes stay on their GPU (stop 49) one of these six
    is at 0.74x, and over 20 further orders both that policy and the one before have orders at 0.2x."""
    ratios = []
    for seed in range(6):
        trace = synthetic_trace(200, 50, seed=seed, kind="crossing")
        hermes = simulate(trace, make_policy("hermes"), gpus=4, seed=seed).time_to_best_s
        fifo = simulate(trace, make_policy("fifo"), gpus=4, seed=seed).time_to_best_s
        ratios.append(fifo / hermes)
    assert sum(ratios) / len(ratios) > 1.6, ratios
    assert min(ratios) > 0.6, ratios


def test_a_small_search_finds_the_best_sooner_than_fifo_and_round_robin() -> None:
    """16 trials drawn from shipped traces, 4 GPUs: with links on half the search Hermes learns enough to
    beat FIFO and round robin (with links that needed 20 trials it was round robin, slower than FIFO)."""
    for name, mode in (("nasbench_nlp_wt2", "min"), ("lcbench_189908", "max")):
        full = load_trace(DATA / f"{name}.csv", mode)
        totals = Counter()
        for seed in range(6):
            trace = Trace(full.path, mode, tuple(random.Random(seed).sample(full.trials, 16)))
            for policy in ("hermes", "fifo", "rr"):
                result = simulate(trace, make_policy(policy), gpus=4, seed=seed, costs=SwitchCosts.profile("warm"))
                totals[policy] += result.time_to_best_s
        assert totals["hermes"] < totals["fifo"] / 1.4, (name, totals)
        assert totals["hermes"] < totals["rr"] / 1.8, (name, totals)


def test_no_switch_when_a_whole_trial_costs_less_than_a_switch() -> None:
    """A process per run: a switch costs more than training the rest of any trial, so none is preempted."""
    trace = synthetic_trace(40, 30, seed=8, kind="mixed", epoch_seconds=(0.01, 0.05))
    result = simulate(trace, HermesPolicy(), gpus=4, seed=0, costs=SwitchCosts.profile("process"))
    assert result.preemptions == 0
    assert result.overhead_fraction == 0.0


def test_first_reports_time_shared_when_the_rest_of_a_trial_costs_more_than_a_switch() -> None:
    """Epochs about as long as a process-per-run switch: the sweep of first reports still pays off."""
    trace = synthetic_trace(60, 30, seed=8, kind="mixed", epoch_seconds=(1.0, 3.0))
    costs = SwitchCosts.profile("process")
    hermes = simulate(trace, HermesPolicy(), gpus=4, seed=0, costs=costs)
    fifo = simulate(trace, make_policy("fifo"), gpus=4, seed=0, costs=costs)
    assert hermes.preemptions > 0
    assert hermes.mean_first_feedback_s < fifo.mean_first_feedback_s / 5


def test_very_long_epochs_share_the_gpus() -> None:
    trace = synthetic_trace(20, 8, seed=9, kind="mixed", epoch_seconds=(3600.0, 7200.0))
    result = check_run(trace, gpus=2)
    fifo = simulate(trace, make_policy("fifo"), gpus=2, seed=0)
    assert result.mean_first_feedback_s < fifo.mean_first_feedback_s / 3
    assert result.time_to_best_s < fifo.makespan_s


def test_metric_scale_and_direction_do_not_change_decisions() -> None:
    trace = synthetic_trace(30, 12, seed=10, kind="mixed", epoch_seconds=(5.0, 20.0))
    rescaled = Trace("rescaled", "min", tuple(
        TraceTrial(t.name, tuple(-1000.0 * m + 3.0 for m in t.metrics), t.seconds, t.diverged, t.params)
        for t in trace.trials
    ))
    logs = [simulate(tr, HermesPolicy(), gpus=2, seed=1, record=True).decisions for tr in (trace, rescaled)]
    assert logs[0] == logs[1]


def test_same_seed_same_decisions() -> None:
    trace = synthetic_trace(30, 12, seed=11, kind="mixed", epoch_seconds=(5.0, 20.0))
    logs = [simulate(trace, HermesPolicy(), gpus=3, nodes=3, seed=4, record=True).decisions for _ in range(2)]
    assert logs[0] == logs[1]


def test_first_feedback_comes_sooner_when_a_parameter_sets_the_epoch_length() -> None:
    """The first sweep goes shortest-first once a "width" is seen to set the epoch time (bigger trials also being better)."""
    trace = synthetic_trace(80, 12, seed=12, kind="mixed", epoch_seconds=(10.0, 200.0), size_quality=0.6)
    for seed in range(3):
        hermes = check_run(trace, seed=seed)
        arrival = simulate(trace, HermesPolicy(shortest_first=False), gpus=4, seed=seed)
        rr = simulate(trace, make_policy("rr"), gpus=4, seed=seed)
        assert hermes.mean_first_feedback_s < 0.95 * arrival.mean_first_feedback_s
        assert hermes.mean_first_feedback_s < 0.85 * rr.mean_first_feedback_s


def test_a_replayed_log_owes_its_duration_fits_and_then_predicts_as_the_live_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trials that arrive one at a time, each after the others reported, refit the first-report durations at
    every arrival. Recovery replays a log without ranking, so nothing reads those fits: made at once, they cost
    a fit over every trial so far per trial (13 s to replay 8,000 trials). Owed until read, replay makes none,
    and the policy then predicts exactly as the live one did."""
    from hermes.core.decisions import Start
    from hermes.core.events import NodeAdded, TrialExited, TrialReported, TrialSubmitted
    from hermes.core.scheduler import Scheduler
    from hermes.policies import hermes as hermes_policy
    from hermes.policies.duration import DurationModel

    fits: list[int] = []

    class Counted(DurationModel):  # the real model; only its fits are counted
        def fit(self, items, seconds):  # type: ignore[no-untyped-def]
            fits.append(len(items))
            return super().fit(items, seconds)

    monkeypatch.setattr(hermes_policy, "DurationModel", Counted)
    live = Scheduler(make_policy("hermes"))
    log = [(event := NodeAdded(0.0, "n", ("n/g0",)), live.handle(event))]
    now = 0.0
    for index in range(60):
        width = 2 ** (index % 5)  # a wider model takes longer: a duration the hyper-parameters tell
        submitted = TrialSubmitted(now, str(index), 1, {"width": width, "lr": 0.1 * (index % 7 + 1)})
        log.append((submitted, live.handle(submitted)))
        assert any(isinstance(d, Start) for d in log[-1][1])
        now += width
        for event in (TrialReported(now, str(index), 1, random.Random(index).random()),
                      TrialExited(now, str(index), True)):
            log.append((event, live.handle(event)))
    live_fits = len(fits)
    assert live_fits > 40  # one per arrival, once the model has enough first reports to try
    fits.clear()
    replayed = Scheduler(make_policy("hermes"))
    for event, decisions in log:
        replayed.replay(event, decisions)
    assert fits == []
    newcomer = {"width": 8, "lr": 0.3}
    replayed.handle(TrialSubmitted(now, "new", 1, newcomer))
    assert fits == [60]  # one fit, on every first report, made when the newcomer's prediction is read
    live.handle(TrialSubmitted(now, "new", 1, newcomer))
    trial = live.trials["new"]
    assert replayed.policy.priority(replayed.trials["new"], now) == live.policy.priority(trial, now)
    assert live.policy._predicted == replayed.policy._predicted  # noqa: SLF001
