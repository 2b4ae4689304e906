"""`hermes trace` on stores that recorded a search: the epochs as the search trained them, whatever policy ran it."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from hermes.core.events import SubmissionsClosed
from hermes.core.scheduler import Objective, Scheduler
from hermes.execution.engine import Engine
from hermes.experiment import parse_spec
from hermes.policies import make_policy
from hermes.report import ExperimentView, pick_experiment
from hermes.report.trace import experiment_trace
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import Trace, TraceTrial, load_trace, write_trace
from hermes.store import SqlStore
from hermes.store.recorder import StoreRecorder
from hermes.testing.recorded import experiment_spec

PROCESS = SwitchCosts.profile("process")  # a process per run: every start or resume costs 2 to 3 s


def traced(store: SqlStore, name: str, curves: tuple[TraceTrial, ...], policy: str, *,
           spec: dict[str, object] | None = None, **params: float) -> Trace:
    """``curves`` trained under ``policy`` on two simulated GPUs, recorded as a runner records, then traced back;
    ``spec``: the experiment's (default: a function's)."""
    experiment_id = store.create_or_open_experiment(name, spec or experiment_spec(name, len(curves), 8))
    scheduler = Scheduler(make_policy(policy, **params), objective=Objective("max"))
    executor = SimulatedExecutor({"n0": ("n0/g0", "n0/g1")}, PROCESS)
    engine = Engine(scheduler, executor, [StoreRecorder(store, experiment_id, scheduler)])
    for curve in curves:
        engine.post(executor.submit(curve.name, curve))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    recorded = experiment_trace(ExperimentView.load(store, pick_experiment(store, name)))
    assert recorded.left_out == 0
    return recorded.trace


def test_epochs_do_not_depend_on_the_policy_that_recorded_them(tmp_path: Path) -> None:
    """Each run's time from its start was spread over its epochs: a process start or a restore, which the
    simulator charges again, made FIFO's epochs 15-30% too long here and round robin's, restarted every turn,
    longer still, so a replay judged every policy on a search slower than the one that ran."""
    source = synthetic_trace(6, 8, seed=2, epoch_seconds=(1.0, 2.0))
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    for policy, params in (("fifo", {}), ("rr", {"period": 6.0})):
        trace = traced(store, policy, source.trials, policy, **params)
        assert [t.name for t in trace.trials] == [t.name for t in source.trials]
        for curve, trial in zip(source.trials, trace.trials):
            assert trial.metrics == curve.metrics and not trial.diverged
            # epochs jitter 5% either way: a run's first epoch is the mean of the others, 10.5% off at most
            assert trial.seconds == pytest.approx(curve.seconds, rel=0.11), (policy, curve.name)
        assert sum(map(sum, (t.seconds for t in trace.trials))) == pytest.approx(
            sum(map(sum, (t.seconds for t in source.trials))), rel=0.02)


def test_a_report_without_a_finite_value_gives_its_time_to_the_next(tmp_path: Path) -> None:
    """A trial that reported NaN once, then trained on and completed, was cut there as diverged, silently,
    which lost its later epochs and its final metric (the search's best, in the case reported). Its
    epochs are kept: the NaN report's time goes to the next report that has a value. Where none follows,
    the trial diverged there."""
    curves = (
        TraceTrial("recovers", (0.2, math.nan, 0.6, 0.8), (1.0, 1.0, 1.0, 1.0), False, {}),
        TraceTrial("ends-on-nan", (0.3, 0.5, math.nan, math.nan), (1.0, 1.0, 1.0, 1.0), False, {}),
        TraceTrial("clean", (0.1, 0.4), (1.0, 1.0), False, {}),
    )
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    trials = {trial.name: trial for trial in traced(store, "nan", curves, "fifo").trials}
    assert trials["recovers"].metrics == (0.2, 0.6, 0.8) and not trials["recovers"].diverged
    assert trials["recovers"].seconds == pytest.approx((1.0, 2.0, 1.0))
    assert trials["ends-on-nan"].metrics == (0.3, 0.5) and trials["ends-on-nan"].diverged
    assert trials["ends-on-nan"].seconds == pytest.approx((1.0, 1.0, 2.0))
    assert trials["clean"].metrics == (0.1, 0.4) and trials["clean"].seconds == pytest.approx((1.0, 1.0))


def test_an_unmodified_programs_trials_are_traced_as_not_movable(tmp_path: Path) -> None:
    """A command read with trial.metrics_regex is an unmodified program: a run submits its trials movable=False and
    SIGSTOPs them in place, so they never migrate. Its trace did not say so, and its replay migrated them (4 times,
    with 22.9% overhead, on a search that ran with none): the trace marks them movable 0."""
    source = synthetic_trace(6, 8, seed=2, epoch_seconds=(1.0, 2.0))
    pinned = tuple(replace(curve, movable=False) for curve in source.trials)
    spec = parse_spec({
        "name": "printer",
        "trial": {"command": "python print_metrics.py --lr {lr}",
                  "metrics_regex": r"epoch (?P<step>\d+) accuracy (?P<value>[\d.]+)"},
        "search": {"trials": len(pinned), "space": {"lr": {"type": "loguniform", "low": 0.01, "high": 1.0}}},
        "metric": {"name": "accuracy", "mode": "max"},
        "budget": {"steps": 8},
    }).model_dump(mode="json")
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    trace = traced(store, "printer", pinned, "fifo", spec=spec)
    assert [trial.movable for trial in trace.trials] == [False] * len(pinned)
    assert all(trial.movable for trial in traced(store, "function", source.trials, "fifo").trials)
    path = tmp_path / "printer.csv"
    write_trace(trace, path)
    assert path.read_text().partition("\n")[0].endswith(",movable")
    replayed = load_trace(path, "max")
    assert replayed.trials == trace.trials
    as_movable = replace(replayed, trials=tuple(replace(trial, movable=True) for trial in replayed.trials))
    assert simulate(as_movable, make_policy("hermes"), gpus=2, seed=2).migrations > 0  # what the replay did
    assert simulate(replayed, make_policy("hermes"), gpus=2, seed=2).migrations == 0
