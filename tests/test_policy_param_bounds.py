"""A policy's parameters bound what a report may cost the scheduler, which on a shared server is every user's.

``rung_factor: 1.000001`` passed the only check (> 1) and gave a 4-step trial 1.4 million rungs, each recorded
and refitted in the pool's one thread: another user's 1-step experiment waited 40 s instead of 1 s. SLAQ's
``window`` had no ceiling, and its fit read the trial's whole history at every report: quadratic in the reports
even at the default window. Each bound is refused by the constructor, and so by the spec (a field error) and by
``hermes run`` (exit 2) before anything runs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from hermes.core.trial import Trial
from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.policies.hermes import MIN_RUNG_FACTOR, HermesPolicy
from hermes.policies.slaq import MAX_WINDOW, SlaqPolicy, predicted_gain
from hermes.trial.protocol import MAX_STEP
from tests.test_run import hermes, spec_of, write_spec


def reported(policy: HermesPolicy | SlaqPolicy, trial: Trial, steps: range, score: float = 1.0) -> None:
    """``trial`` reports ``score`` at each of ``steps``, one GPU second each, and ``policy`` observes it."""
    for step in steps:
        trial.record(step, score, score, float(step))
        policy.observe(trial, float(step))


def running(trial_id: str, budget: int) -> Trial:
    trial = Trial(trial_id, 0, budget, submitted_at=0.0)
    trial.begin_run("g0", 0.0)
    return trial


def test_a_rung_factor_finer_than_the_floor_is_refused_naming_the_field() -> None:
    for factor in (1.000001, 1.01, math.nextafter(MIN_RUNG_FACTOR, 0.0)):
        with pytest.raises(ValueError, match=f"rung_factor must be at least {MIN_RUNG_FACTOR}"):
            HermesPolicy(rung_factor=factor)
    spec = spec_of("fine", policy={"name": "hermes", "params": {"rung_factor": 1.000001}})
    with pytest.raises(SpecError, match="policy.params: policy hermes: rung_factor must be at least"):
        parse_spec(spec)


def test_hermes_run_refuses_a_fine_rung_factor_before_anything_runs(tmp_path: Path) -> None:
    path = write_spec(tmp_path, spec_of("fine", policy={"name": "hermes", "params": {"rung_factor": 1.000001}}))
    refused = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "policy.params: policy hermes: rung_factor must be at least" in refused.stderr
    assert not (tmp_path / "runs").exists()


def test_the_finest_rung_factor_keeps_a_trial_of_the_largest_budget_to_a_few_hundred_rungs() -> None:
    """Rungs at ``rung_factor**k`` steps: log(2**31) / log(1.1) of them, recorded in one report that skips them all."""
    policy = HermesPolicy(rung_factor=MIN_RUNG_FACTOR)
    trial = running("deep", MAX_STEP)
    started = time.perf_counter()
    reported(policy, trial, range(1, 2))
    reported(policy, trial, range(MAX_STEP, MAX_STEP + 1))
    assert time.perf_counter() - started < 2.0
    (values,) = policy.state_dict()["values"]
    assert len(values) == math.ceil(math.log(MAX_STEP) / math.log(MIN_RUNG_FACTOR)) + 1 <= 227


def test_a_slaq_window_past_the_ceiling_is_refused_naming_the_field(tmp_path: Path) -> None:
    SlaqPolicy(window=MAX_WINDOW)
    for window in (MAX_WINDOW + 1, 10**9):
        with pytest.raises(ValueError, match=f"window must hold 3 to {MAX_WINDOW} reports, got {window}"):
            SlaqPolicy(window=window)
    with pytest.raises(SpecError, match="policy.params: policy slaq: window must hold 3 to"):
        parse_spec(spec_of("wide", policy={"name": "slaq", "params": {"window": 10**9}}))


def test_a_slaq_report_costs_the_same_however_long_the_history() -> None:
    """The last 1,000 of 15,000 reports cost about what the first 1,000 did (reading the whole history at each
    report, they cost 10 times more), and the gain is the fit of the last ``window`` finite reports as before."""
    policy = SlaqPolicy(window=20)
    trial = running("long", 20_000)
    timings = []
    for chunk in (range(1, 1_001), range(1_001, 14_001), range(14_001, 15_001)):
        started = time.perf_counter()
        for step in chunk:
            score = math.nan if step % 7 == 0 else 1.0 - 1.0 / math.sqrt(step)  # a NaN now and then is skipped
            trial.record(step, score, score, float(step))
            policy.observe(trial, float(step))
        timings.append(time.perf_counter() - started)
    first, _, last = timings
    assert last < 3 * first, timings
    horizon = min(policy.period / (trial.report_gpu_time[-1] / trial.step), trial.budget - trial.step)
    finite = [score for score in trial.scores if math.isfinite(score)]
    gain = predicted_gain(trial.steps, trial.scores, horizon, window=20)
    assert gain > 0
    assert policy.priority(trial, 15_000.0) == gain / (max(finite) - min(finite))
