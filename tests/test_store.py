"""Store conformance suite (run on every backend), the codec, the GPU timeline, and durability under kill -9."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuReclaimed,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    SubmissionsClosed,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.execution.engine import Engine
from hermes.errors import HermesError
from hermes.policies import make_policy
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.synthetic import synthetic_trace
from hermes.store import (
    DecisionRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    Run,
    SqlStore,
    StoreError,
    TrialRecord,
    build_runs,
)
from hermes.store.codec import from_dict, to_dict
from hermes.recovery import replay
from hermes.store.recorder import StoreRecorder

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"name": "exp", "search": {"trials": 4, "space": {"lr": {"type": "uniform", "low": 0.0, "high": 1.0}}}}

SAMPLES: list[Event | Decision] = [
    TrialSubmitted(0.0, "t0", 30, {"lr": 0.01, "optimizer": "adam", "layers": 2}, movable=False),
    TrialReported(1.5, "t0", 3, 0.875, checkpointed=True),
    TrialReported(1.5, "t0", 4, float("inf")),
    TrialSuspended(2.0, "t0", 3),
    TrialExited(3.0, "t0", False, "CUDA out of memory"),
    TrialExited(3.0, "t1", True),
    NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")),
    NodeRemoved(4.0, "n0"),
    GpuAdded(5.0, "n1", "n1/g0"),
    GpuRemoved(6.0, "n1/g0"),
    GpuReclaimed(6.5, "n1/g1", preempt=True),
    PeriodElapsed(7.0),
    SubmissionsClosed(8.0),
    SubmissionsReopened(8.5),
    ExperimentCancelled(9.0, "its budget of time or GPU hours is spent"),
    Start("t0", "n0/g0"),
    Suspend("t0"),
    Resume("t0", "n0/g1", migrated=True),
    Stop("t0"),
]


# ---------------------------------------------------------------------- codec
def test_samples_cover_every_event_and_decision_type() -> None:
    assert {type(item) for item in SAMPLES} == {*typing.get_args(Event), *typing.get_args(Decision)}


@pytest.mark.parametrize("item", SAMPLES, ids=lambda item: type(item).__name__)
def test_codec_round_trips(item: Event | Decision) -> None:
    data = to_dict(item)
    assert data["type"] == type(item).__name__
    assert from_dict(data) == item
    assert all(not isinstance(value, tuple) for value in data.values())  # JSON has no tuples


@pytest.mark.parametrize("item", SAMPLES, ids=lambda item: type(item).__name__)
def test_the_stored_form_leaves_out_defaults_and_round_trips(item: Event | Decision) -> None:
    data = to_dict(item, defaults=False)
    assert from_dict(data) == item


def test_a_store_keeps_no_field_at_its_default_so_an_older_hermes_reads_it(tmp_path: Path) -> None:
    """A field added since (``TrialExited.crashed``) was written into every exit, false included: an older Hermes
    then called the whole store damaged ("unexpected keyword argument 'crashed'")."""
    store = SqlStore(f"sqlite:///{tmp_path}/hermes.db")
    experiment = store.create_or_open_experiment("old-readers", {"name": "old-readers"})
    store.claim_writer(experiment, "test")
    exited = TrialExited(1.0, "t0", True)
    store.append_event(experiment, exited)
    with sqlite3.connect(tmp_path / "hermes.db") as connection:
        [(data,)] = connection.execute("SELECT data FROM events").fetchall()
    assert json.loads(data) == {"type": "TrialExited", "at": 1.0, "trial_id": "t0", "succeeded": True}
    assert store.events(experiment) == [exited]
    store.close()


def test_codec_rejects_what_it_does_not_know() -> None:
    with pytest.raises(HermesError, match="not an event or a decision type"):
        from_dict({"type": "Migrate", "trial_id": "t0"})
    with pytest.raises(HermesError, match="cannot decode Start"):
        from_dict({"type": "Start", "trial_id": "t0", "node": "n0"})
    with pytest.raises(HermesError, match="cannot encode"):
        to_dict(TrialRecord("t0", {}, TrialState.PENDING, 1, 0.0))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- conformance suite
@pytest.fixture(params=["sqlite-file", "sqlite-memory", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExperimentStore]:
    if request.param == "postgresql":  # a fresh database on a throwaway server (tests/conftest.py)
        url = request.getfixturevalue("postgres").new_database()
    else:
        url = f"sqlite:///{tmp_path}/runs/hermes.db" if request.param == "sqlite-file" else "sqlite://"
    store = SqlStore(url)
    yield store
    store.close()


def test_reopening_an_experiment_returns_its_id(store: ExperimentStore) -> None:
    first = store.create_or_open_experiment("exp", SPEC)
    other = store.create_or_open_experiment("other", SPEC)
    assert store.create_or_open_experiment("exp", dict(reversed(SPEC.items()))) == first != other
    record = store.experiment(first)
    assert (record.name, record.spec, record.status) == ("exp", SPEC, ExperimentStatus.RUNNING)
    assert [e.name for e in store.experiments()] == ["exp", "other"]


def test_reopening_with_another_spec_names_the_differences(store: ExperimentStore) -> None:
    store.create_or_open_experiment("exp", SPEC)
    changed = {**SPEC, "search": {**SPEC["search"], "trials": 8}, "budget": {"steps": 3}}
    with pytest.raises(StoreError, match=r"'exp' already exists .* \(differs in search.trials, budget\)"):
        store.create_or_open_experiment("exp", changed)


def test_a_refusal_names_only_the_differences_that_may_not_change(store: ExperimentStore) -> None:
    """A refusal that listed an allowed change too (search.trials) asked the user to undo it."""
    store.create_or_open_experiment("exp", SPEC)
    changed = {**SPEC, "search": {**SPEC["search"], "trials": 8}, "budget": {"steps": 3}}
    with pytest.raises(StoreError, match=r"'exp' already exists .* \(differs in budget\); give it a new name"):
        store.create_or_open_experiment("exp", changed, may_change=("search.trials",))
    assert store.experiment(store.create_or_open_experiment("exp", SPEC)).spec == SPEC  # nothing was written


def test_a_refusal_shows_what_the_store_holds_so_that_the_experiment_can_continue(store: ExperimentStore) -> None:
    """A spec file an older Hermes read as YAML 1.1 (1e-4 as text, yes as true): the refusal named the field and
    offered only a new name, which starts over, where giving the values as stored continues the experiment."""
    space = {"wd": {"type": "choice", "values": ["1e-4", "1e-3"]}, "flag": {"type": "choice", "values": [True, False]}}
    spec = {**SPEC, "search": {**SPEC["search"], "space": space}}
    store.create_or_open_experiment("exp", spec)
    read_anew = {**spec, "search": {**spec["search"], "space": {
        "wd": {"type": "choice", "values": [0.0001, 0.001]}, "flag": {"type": "choice", "values": ["yes", "no"]}}}}
    with pytest.raises(StoreError) as refused:
        store.create_or_open_experiment("exp", read_anew)
    assert ('its store holds search.space.wd.values: ["1e-4", "1e-3"] (now [0.0001, 0.001]); '
            'search.space.flag.values: [true, false] (now ["yes", "no"]): a spec that gives those, as Hermes reads them '
            'now, continues it') in str(refused.value)
    assert store.create_or_open_experiment("exp", spec) == 1  # given as stored, it goes on
    widths = {"type": "choice", "values": list(range(40))}
    long = {**spec, "search": {**spec["search"], "space": {"width": widths}}}
    store.create_or_open_experiment("long", long)
    one_more = {**long, "search": {**long["search"], "space": {"width": {**widths, "values": [*range(39), 99]}}}}
    with pytest.raises(StoreError) as refused:  # the first item that differs, not two equal cut-off lists
        store.create_or_open_experiment("long", one_more)
    assert "its store holds search.space.width.values[39]: 39 (now 99)" in str(refused.value)
    with pytest.raises(StoreError) as refused:  # a value more: the first index that differs
        store.create_or_open_experiment("long", {**long, "search": {**long["search"], "space": {
            "width": {**widths, "values": [*range(41)]}}}})
    assert "its store holds search.space.width.values[40]: nothing (now 40)" in str(refused.value)
    configs = [{"lr": 0.1, "note": "x" * 90}, {"lr": 0.01, "dropout": 0.1, "note": "y" * 90}]
    store.create_or_open_experiment("configs", {**SPEC, "search": {"sampler": "list", "configs": configs}})
    edited = [configs[0], {**configs[1], "dropout": 0.2}]
    with pytest.raises(StoreError) as refused:  # into a long mapping in a list, to its key that differs
        store.create_or_open_experiment("configs", {**SPEC, "search": {"sampler": "list", "configs": edited}})
    assert "its store holds search.configs[1].dropout: 0.1 (now 0.2)" in str(refused.value)
    dotted = {**SPEC, "env": {"a": {"b": [0] * 40}, "a.b": [7] * 40}}  # a key holding a dot beside a nested one
    store.create_or_open_experiment("dotted", dotted)
    with pytest.raises(StoreError, match="differs in env.a.b"):  # a refusal still, not a traceback
        store.create_or_open_experiment("dotted", {**dotted, "env": {"a": {"b": [1] * 40}, "a.b": [7] * 40}})
    reordered = {**spec, "search": {**spec["search"], "space": dict(reversed(space.items()))}}
    with pytest.raises(StoreError) as refused:  # no value to show for an order
        store.create_or_open_experiment("exp", reordered)
    assert "its store holds" not in str(refused.value) and "nothing" not in str(refused.value)


def test_reordered_parameters_are_another_experiment(store: ExperimentStore) -> None:
    """The random searcher draws in space order: the same parameters reordered would not replay the log."""
    space = {"lr": {"type": "uniform", "low": 0.0, "high": 1.0}, "x": {"type": "int", "low": 1, "high": 3}}
    spec = {**SPEC, "search": {**SPEC["search"], "space": space}}
    first = store.create_or_open_experiment("exp", spec)
    reordered = {**spec, "search": {"space": dict(reversed(space.items())), "trials": 8}}  # search's keys reordered too
    with pytest.raises(StoreError, match=r"\(differs in search.space \(the order of its parameters\)\); give"):
        store.create_or_open_experiment("exp", reordered, may_change=("search.trials",))
    assert store.create_or_open_experiment("exp", {**spec, "search": {"space": space, "trials": 8}},
                                           may_change=("search.trials",)) == first


def test_status(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.set_status(experiment, ExperimentStatus.FINISHED)
    assert store.experiment(experiment).status is ExperimentStatus.FINISHED
    store.create_or_open_experiment("exp", SPEC)
    assert store.experiment(experiment).status is ExperimentStatus.FINISHED  # reopening leaves it to the runner


def test_pool_experiments_are_queued_with_owner_and_weight(store: ExperimentStore) -> None:
    ran = store.create_or_open_experiment("ran", SPEC)  # by hermes run: no owner
    queued = store.submit_experiment("queued", SPEC, owner="ann", weight=2.0)
    record = store.experiment(queued)
    assert (record.name, record.spec, record.status, record.owner, record.weight) == (
        "queued", SPEC, ExperimentStatus.QUEUED, "ann", 2.0
    )
    assert not record.cancel_requested and record.error is None
    assert store.experiment(ran).owner is None and store.experiment(ran).weight == 1.0
    assert [e.name for e in store.experiments(status=ExperimentStatus.QUEUED)] == ["queued"]
    both = [ExperimentStatus.QUEUED, ExperimentStatus.RUNNING]
    assert [e.name for e in store.experiments(status=both)] == ["ran", "queued"]
    with pytest.raises(StoreError, match=r"'queued' exists already in .* \(of ann\)"):
        store.submit_experiment("queued", SPEC, owner="ann")
    with pytest.raises(StoreError, match="'ran' exists already"):  # a pool's without owner shares hermes run's names
        store.submit_experiment("ran", SPEC)
    # names are per owner: bob's and hermes run's "queued" are experiments of their own
    bobs = store.submit_experiment("queued", SPEC, owner="bob")
    runners = store.create_or_open_experiment("queued", SPEC)
    assert len({queued, bobs, runners}) == 3
    assert [(e.name, e.owner, e.full_name) for e in store.experiments()][-3:] == [
        ("queued", "ann", "ann/queued"), ("queued", "bob", "bob/queued"), ("queued", None, "queued")]
    with pytest.raises(StoreError, match="cannot hold a '/'"):
        store.submit_experiment("other", SPEC, owner="ann/x")


def test_weights_cancellations_and_errors(store: ExperimentStore) -> None:
    experiment = store.submit_experiment("exp", SPEC, owner="ann")
    store.set_weight(experiment, 0.5)
    store.request_cancel(experiment)
    store.request_cancel(experiment)
    record = store.experiment(experiment)
    assert (record.weight, record.cancel_requested, record.owner) == (0.5, True, "ann")
    for weight in (0, -1.0, float("nan"), float("inf"), True, 1e308, 1e-9):
        with pytest.raises(StoreError, match="a weight must be a number from 1e-06 to 1e"):
            store.set_weight(experiment, weight)
    store.set_status(experiment, ExperimentStatus.FAILED, error="trial.workdir: /nowhere does not exist")
    store.set_status(experiment, ExperimentStatus.FAILED)  # keeps the reason
    assert store.experiment(experiment).error == "trial.workdir: /nowhere does not exist"
    plain = store.create_or_open_experiment("plain", SPEC)
    store.set_status(plain, ExperimentStatus.FAILED, error="boom")
    assert (store.experiment(plain).error, store.experiment(plain).owner) == ("boom", None)
    assert (store.experiment(experiment).gpu_seconds_used, store.experiment(experiment).gpu_seconds_owed) == (0, 0)
    store.save_accounts({experiment: (12.5, 20.0), plain: (1.0, 0.5)})
    store.save_accounts({experiment: (13.5, 21.0)})
    assert (store.experiment(experiment).gpu_seconds_used, store.experiment(experiment).gpu_seconds_owed) == (13.5, 21)
    assert (store.experiment(plain).gpu_seconds_used, store.experiment(plain).weight) == (1.0, 1.0)
    with pytest.raises(StoreError, match="no experiment with id 99"):
        store.save_accounts({99: (1.0, 1.0)})
    assert store.owner_weights() == {}
    store.set_owner_weight("bob", 3.0)
    store.set_owner_weight("ann", 1.5)
    store.set_owner_weight("bob", 2.0)
    assert store.owner_weights() == {"ann": 1.5, "bob": 2.0}


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.experiment(99),
        lambda s: s.set_status(99, ExperimentStatus.FAILED),
        lambda s: s.append_event(99, PeriodElapsed(0.0)),
        lambda s: s.events(99),
        lambda s: s.decisions(99),
        lambda s: s.trials(99),
        lambda s: s.metrics(99),
        lambda s: s.record_metrics(99, "t0", 1, 0.0, {"loss": 1.0}),
        lambda s: s.upsert_trial(99, TrialRecord("t0", {}, TrialState.PENDING, 1, 0.0)),
        lambda s: s.set_weight(99, 2.0),
        lambda s: s.request_cancel(99),
    ],
)
def test_unknown_experiments_raise(store: ExperimentStore, call: typing.Callable[[ExperimentStore], object]) -> None:
    with pytest.raises(StoreError, match="no experiment with id 99"):
        call(store)


def test_event_log_keeps_every_event_in_order_with_its_decisions(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    other = store.create_or_open_experiment("other", SPEC)
    events = [item for item in SAMPLES if not isinstance(item, (Start, Suspend, Resume, Stop))]
    sequence = [store.append_event(experiment, event) for event in events]
    assert sequence == list(range(1, len(events) + 1))
    assert store.append_event(experiment, PeriodElapsed(9.0), [Suspend("t0"), Start("t1", "g0")]) == len(events) + 1
    assert store.append_event(other, PeriodElapsed(0.0)) == 1  # each experiment has its own sequence
    assert store.events(experiment) == [*events, PeriodElapsed(9.0)]
    assert store.decisions(experiment) == [
        DecisionRecord(len(events) + 1, 9.0, Suspend("t0")),
        DecisionRecord(len(events) + 1, 9.0, Start("t1", "g0")),
    ]
    assert store.events(other) == [PeriodElapsed(0.0)] and store.decisions(other) == []


def test_the_latest_event_time_is_the_latest_of_any_experiments_last_event(store: ExperimentStore) -> None:
    assert store.latest_event_at() == 0.0
    first = store.create_or_open_experiment("exp", SPEC)
    second = store.create_or_open_experiment("other", SPEC)
    for at in (1.0, 7.5, 9.0):
        store.append_event(first, PeriodElapsed(at))
    store.append_event(second, PeriodElapsed(4.0))
    assert store.latest_event_at() == 9.0
    store.append_event(second, PeriodElapsed(12.25))  # a pool's clock: its experiments share it
    assert store.latest_event_at() == 12.25


def test_non_finite_values_survive(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.append_event(experiment, TrialReported(1.0, "t0", 1, float("nan")))
    store.record_metrics(experiment, "t0", 1, 1.0, {"loss": float("nan"), "accuracy": float("-inf")})
    (event,) = store.events(experiment)
    assert isinstance(event, TrialReported) and math.isnan(event.value)
    (metrics,) = store.metrics(experiment)
    assert math.isnan(metrics.values["loss"]) and metrics.values["accuracy"] == -math.inf


def test_trials_upsert_in_insertion_order(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    pending = [TrialRecord(f"t{i}", {"lr": i / 10}, TrialState.PENDING, 30, 0.0) for i in range(3)]
    for trial in reversed(pending):
        store.upsert_trial(experiment, trial)
    running = TrialRecord(
        "t1", {"lr": 0.1}, TrialState.RUNNING, 30, 0.0, step=4, checkpoint_step=3, gpu="n0/g1", started_at=1.0
    )
    failed = TrialRecord(
        "t0", {"lr": 0.0}, TrialState.FAILED, 30, 0.0, step=1, error="OOM", started_at=1.0, ended_at=2.0
    )
    store.upsert_trial(experiment, running)
    store.upsert_trial(experiment, failed)
    assert store.trials(experiment) == [pending[2], running, failed]
    assert store.trials(store.create_or_open_experiment("other", SPEC)) == []


def test_metrics_keep_each_step_once_in_report_order(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    reports = [("t0", 1, 1.0, 0.5), ("t1", 1, 1.5, 0.4), ("t0", 2, 2.0, 0.6), ("t0", 2, 3.0, 0.61)]  # a re-report
    for trial_id, step, at, accuracy in reports:
        store.record_metrics(experiment, trial_id, step, at, {"accuracy": accuracy, "loss": 1 - accuracy})
    everything = store.metrics(experiment)
    assert [(m.trial_id, m.step, m.at, m.values["accuracy"]) for m in everything] == reports[:3]
    store.record_event(experiment, TrialReported(4.0, "t1", 1, 0.45, metrics={"accuracy": 0.45}), [], [])
    assert len(store.metrics(experiment, "t1")) == 1 and len(store.events(experiment)) == 1
    assert store.metrics(experiment, "t1") == [MetricRecord("t1", 1, 1.5, {"accuracy": 0.4, "loss": 0.6})]
    with pytest.raises(StoreError, match="metrics must be numbers"):
        store.record_metrics(experiment, "t0", 3, 4.0, {"phase": "train"})  # type: ignore[dict-item]


def test_only_the_latest_claimant_of_an_experiment_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/hermes.db"
    first, second, reader = SqlStore(url), SqlStore(url), SqlStore(url)
    try:
        experiment = first.create_or_open_experiment("exp", SPEC)
        first.claim_writer(experiment, "pid 1 on here (`hermes run a.yaml`)")
        first.append_event(experiment, PeriodElapsed(1.0))
        second.claim_writer(experiment, "pid 2 on here (`hermes run b.yaml`)")
        for write in (
            lambda: first.append_event(experiment, PeriodElapsed(2.0)),
            lambda: first.record_event(experiment, TrialReported(2.0, "t0", 1, 0.5), [], []),
            lambda: first.set_status(experiment, ExperimentStatus.FAILED),
            lambda: reader.record_metrics(experiment, "t0", 1, 2.0, {"loss": 1.0}),  # one that never claimed
        ):
            with pytest.raises(StoreError, match=r"has another writer now \(pid 2 on here"):
                write()
        second.append_event(experiment, PeriodElapsed(3.0))
        assert [event.at for event in reader.events(experiment)] == [1.0, 3.0]
        assert reader.experiment(experiment).status is ExperimentStatus.RUNNING and not reader.metrics(experiment)
    finally:
        for store in (first, second, reader):
            store.close()


def test_a_store_made_before_the_metrics_key_gets_it_keeping_first_reports(tmp_path: Path) -> None:
    path = tmp_path / "hermes.db"
    SqlStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as connection:  # as an older Hermes left it: no key, a step stored twice
        connection.execute("DROP INDEX metrics_once_per_step")
        connection.execute("INSERT INTO experiments (name, spec, created_at, status) VALUES ('exp', '{}', 0, 'running')")
        for at, value in ((1.0, 0.5), (2.0, 0.6), (3.0, 0.7)):
            connection.execute("INSERT INTO metrics (experiment_id, trial_id, step, at, metric_values) "
                               f"VALUES (1, 't0', {1 if at < 3 else 2}, {at}, '{{\"loss\": {value}}}')")
    store = SqlStore(f"sqlite:///{path}")
    try:
        assert [(m.step, m.at) for m in store.metrics(1)] == [(1, 1.0), (2, 3.0)]
        store.record_metrics(1, "t0", 2, 4.0, {"loss": 0.0})
        assert len(store.metrics(1)) == 2
    finally:
        store.close()
    with sqlite3.connect(path) as connection, pytest.raises(sqlite3.IntegrityError):
        connection.execute("INSERT INTO metrics (experiment_id, trial_id, step, at, metric_values) "
                           "VALUES (1, 't0', 1, 5.0, '{}')")


def test_a_pool_experiment_stored_before_names_were_per_owner_still_holds_its_name(tmp_path: Path) -> None:
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    try:
        old = store.submit_experiment("digits", SPEC, owner="ann")
        with sqlite3.connect(path) as connection:  # as an older Hermes keyed it: by its name alone
            connection.execute("UPDATE experiments SET name = 'digits' WHERE id = ?", (old,))
        assert (store.experiment(old).name, store.experiment(old).owner) == ("digits", "ann")
        with pytest.raises(StoreError, match="'digits' exists already"):  # its runs/digits is ann's still
            store.submit_experiment("digits", SPEC, owner="ann")
        bobs = store.submit_experiment("digits", SPEC, owner="bob")
        assert [e.full_name for e in store.experiments()] == ["ann/digits", "bob/digits"] and bobs != old
    finally:
        store.close()


def test_records_read_are_copies(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.upsert_trial(experiment, TrialRecord("t0", {"lr": 0.1}, TrialState.PENDING, 3, 0.0))
    store.record_metrics(experiment, "t0", 1, 1.0, {"loss": 1.0})
    store.trials(experiment)[0].params["lr"] = 99
    store.metrics(experiment)[0].values["loss"] = 99
    store.experiment(experiment).spec["name"] = "changed"
    assert store.trials(experiment)[0].params == {"lr": 0.1}
    assert store.metrics(experiment)[0].values == {"loss": 1.0}
    assert store.experiment(experiment).spec == SPEC


def test_concurrent_writers_lose_nothing(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    errors: list[BaseException] = []

    def report(trial_id: str) -> None:
        try:
            for step in range(1, 26):
                store.record_metrics(experiment, trial_id, step, float(step), {"loss": 1 / step})
                store.upsert_trial(experiment, TrialRecord(trial_id, {}, TrialState.RUNNING, 25, 0.0, step=step))
        except BaseException as error:  # surfaced below: a thread's exception would vanish
            errors.append(error)

    threads = [threading.Thread(target=report, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for step in range(50):
        store.append_event(experiment, PeriodElapsed(float(step)))
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.metrics(experiment)) == 100 and len(store.events(experiment)) == 50
    assert all(trial.step == 25 for trial in store.trials(experiment))
    for i in range(4):
        assert [m.step for m in store.metrics(experiment, f"t{i}")] == list(range(1, 26))


def test_an_interrupt_lands_between_batches_and_leaves_the_store_writable(tmp_path: Path) -> None:
    """A Ctrl-C or SIGTERM while the engine loop handles a batch (``Engine.interrupt``, as the runner's signal
    handler asks for it) is raised once the batch is recorded, not inside the store's transaction: the batch is in
    the log whole, and the store takes the runner's next write (the interrupted status) at once. Raised inside the
    transaction, it left SQLite's write lock with a connection nobody closed, and that write waited out the 60 s
    busy timeout, then failed."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    experiment = store.create_or_open_experiment("sim", SPEC)
    store.claim_writer(experiment, "test")
    trace = synthetic_trace(4, 6, seed=3, epoch_seconds=(5.0, 20.0))
    executor = SimulatedExecutor({"n0": ("n0/g0",)})
    scheduler = Scheduler(make_policy("fifo"), objective=Objective(trace.mode))
    handled: list[Event] = []

    def interrupt_midway(event: Event, _decisions: list[Decision]) -> None:
        handled.append(event)
        if isinstance(event, TrialReported) and event.step == 3:
            engine.interrupt(KeyboardInterrupt())

    engine = Engine(scheduler, executor, [StoreRecorder(store, experiment, scheduler), interrupt_midway])
    for curve in trace.trials:
        executor.submit(curve.name, curve)
        engine.post(TrialSubmitted(0.0, curve.name, curve.epochs, {}))
    engine.post(SubmissionsClosed(0.0))
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert list(store.events(experiment)) == handled  # up to the end of the interrupted batch, all recorded
    assert handled[-1].step == 3 and not scheduler.finished  # and no batch after it
    store.set_status(experiment, ExperimentStatus.INTERRUPTED)
    assert store.experiment(experiment).status is ExperimentStatus.INTERRUPTED
    store.close()


SIMULATED_LAYOUT = {"n0": ("n0/g0", "n0/g1"), "n1": ("n1/g0",)}


def rr_core() -> Scheduler:
    return Scheduler(make_policy("rr", period=15.0))


def record_simulated_run(store: ExperimentStore) -> int:
    """An experiment of 8 synthetic trials time-shared by round robin on 3 GPUs in 2 nodes, recorded in ``store``."""
    trace = synthetic_trace(8, 6, seed=3, epoch_seconds=(5.0, 20.0))
    experiment = store.create_or_open_experiment("sim", SPEC)
    executor = SimulatedExecutor(SIMULATED_LAYOUT)
    engine = Engine(rr_core(), executor, [lambda event, decisions: store.append_event(experiment, event, decisions)])
    for i, curve in enumerate(trace.trials):
        executor.submit(curve.name, curve)
        engine.post(TrialSubmitted(0.0, curve.name, curve.epochs, {"index": i}))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    return experiment


def test_replaying_the_log_rebuilds_the_core(store: ExperimentStore) -> None:
    """Record a simulated experiment, replay its events into a fresh core: the same decisions come out."""
    experiment = record_simulated_run(store)
    replayed = rr_core()
    again = [
        (seq, decision) for seq, event in enumerate(store.events(experiment), 1) for decision in replayed.handle(event)
    ]
    assert again == [(record.event_seq, record.decision) for record in store.decisions(experiment)]
    assert replayed.finished
    assert any(isinstance(record.decision, Suspend) for record in store.decisions(experiment))  # it time-shared

    runs = store.runs(experiment)
    assert len(runs) == sum(isinstance(r.decision, (Start, Resume)) for r in store.decisions(experiment))
    assert all(run.ended_at is not None and run.ended_at >= run.started_at for run in runs)
    for gpu in {run.gpu for run in runs}:
        on_gpu = sorted((run.started_at, run.ended_at) for run in runs if run.gpu == gpu)
        assert all(
            end <= start for (_, end), (start, _) in zip(on_gpu, on_gpu[1:], strict=False)
        )  # one trial at a time
    assert {run.ended_by for run in runs} <= {"suspended", "completed"}


def test_a_log_whose_decisions_contradict_its_events_is_refused_with_where(store: ExperimentStore) -> None:
    """Two trials given the same GPU: the replay stops at that event and says which, instead of running on."""
    experiment = store.create_or_open_experiment("sim", SPEC)
    store.append_event(experiment, NodeAdded(0.0, "n0", ("n0/g0",)))
    store.append_event(experiment, TrialSubmitted(0.0, "a", 3, {}), [Start("a", "n0/g0")])
    store.append_event(experiment, TrialSubmitted(0.0, "b", 3, {}), [Start("b", "n0/g0")])
    followed: list[Event] = []
    with pytest.raises(HermesError, match=r"does not replay: event 3 of 3 \(TrialSubmitted\): trial b \(pending\) "
                                          r"given GPU n0/g0, which trial a holds"):
        replay(store, experiment, Scheduler(make_policy("hermes")), lambda event, _: followed.append(event))
    assert len(followed) == 2


def test_a_log_that_another_policy_wrote_replays_into_the_state_it_describes(store: ExperimentStore) -> None:
    """A log written by an older Hermes, whose policy decided otherwise, is replayed with the decisions it holds:
    the core reaches the state the old core had at any point of the log, and decides on its own from there."""
    experiment = record_simulated_run(store)
    events = store.events(experiment)
    decided: dict[int, list[Decision]] = {}
    for record in store.decisions(experiment):
        decided.setdefault(record.event_seq, []).append(record.decision)

    deciding_anew = Scheduler(make_policy("hermes"))
    with pytest.raises(HermesError, match="suspended while running"):  # left to decide, the new policy contradicts
        for event in events:  # what the log says happened next
            deciding_anew.handle(event)

    def state(core: Scheduler) -> tuple[object, ...]:
        trials = {t.trial_id: (t.state, t.gpu, t.step, t.checkpoint_step, t.steps, t.starts, t.migrations,
                               t.gpu_time, t.running_since, t.stop_requested) for t in core.trials.values()}
        return trials, core.busy, core.unfinished, core.submissions_open, core.finished

    for cut in (len(events) // 3, 2 * len(events) // 3, len(events)):
        old, new = rr_core(), Scheduler(make_policy("hermes"))
        for seq, event in enumerate(events[:cut], 1):
            old.handle(event)
            new.replay(event, decided.get(seq, []))
        assert state(new) == state(old), cut
    assert new.finished and all(trial.state is TrialState.COMPLETED for trial in new.trials.values())

    new = Scheduler(make_policy("hermes"))
    for seq, event in enumerate(events[: len(events) // 2], 1):
        new.replay(event, decided.get(seq, []))
    now = events[len(events) // 2 - 1].at
    running = {trial.trial_id for trial in new.trials.values() if trial.state is TrialState.RUNNING}
    assert running
    for node in SIMULATED_LAYOUT:  # a restarted runner: the old nodes are lost, and its own come
        new.handle(NodeRemoved(now, node))
    assert all(trial.waiting or trial.state.is_terminal for trial in new.trials.values())
    restarted = new.handle(NodeAdded(now, "m0", ("m0/g0", "m0/g1")))
    assert [type(decision) for decision in restarted] == [Resume, Resume]  # the policy chooses, among the runs cut off
    assert {decision.trial_id for decision in restarted} <= {t.trial_id for t in new.trials.values() if t.starts}


def test_server_experiments_are_queued_owned_weighted_and_cancellable(store: ExperimentStore) -> None:
    own = store.submit_experiment("mine", SPEC, "alice", weight=2.5)
    record = store.experiment(own)
    assert (record.status, record.owner, record.weight, record.cancel_requested) == (
        ExperimentStatus.QUEUED, "alice", 2.5, False)
    with pytest.raises(StoreError, match="exists already"):
        store.submit_experiment("mine", SPEC, "alice")
    store.set_weight(own, 0.5)
    store.request_cancel(own)
    record = store.experiment(own)
    assert (record.weight, record.cancel_requested) == (0.5, True)
    for weight in (0, -1, float("nan"), float("inf"), True, 1e7):
        with pytest.raises(StoreError, match="a weight must be a number"):
            store.set_weight(own, weight)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        store.request_cancel(own + 1)
    plain = store.create_or_open_experiment("run", SPEC)  # `hermes run`'s: no owner
    assert (store.experiment(plain).owner, store.experiment(plain).weight) == (None, 1.0)
    store.set_status(own, ExperimentStatus.CANCELLED)
    assert store.experiment(own).status.is_final and not ExperimentStatus.QUEUED.is_final


def test_cursor_reads_return_what_was_added_after(store: ExperimentStore) -> None:
    experiment = store.create_or_open_experiment("exp", SPEC)
    for step in range(1, 6):
        store.append_event(experiment, TrialReported(float(step), "t0", step, 0.1 * step), [Suspend("t0")] * (step % 2))
        store.record_metrics(experiment, "t0", step, float(step), {"loss": 1 / step})
    assert [seq for seq, _ in store.events_after(experiment, 0)] == [1, 2, 3, 4, 5]
    assert [(seq, e.step) for seq, e in store.events_after(experiment, 2, limit=2)] == [(3, 3), (4, 4)]
    assert [r.event_seq for r in store.decisions_after(experiment, 1)] == [3, 5]
    assert [r.event_seq for r in store.decisions_after(experiment, 0, upto=3)] == [1, 3]
    reports = store.metrics_after(experiment, 0)
    assert [r.step for _, r in reports] == [1, 2, 3, 4, 5]
    cursors = [cursor for cursor, _ in reports]
    assert cursors == sorted(cursors) and len(set(cursors)) == 5
    assert [r.step for _, r in store.metrics_after(experiment, cursors[2], limit=1)] == [4]
    assert store.metrics_after(experiment, cursors[-1]) == []
    for step in range(1, 4):  # a second trial's reports, between the first's
        store.record_metrics(experiment, "t1", step, 5.0 + step, {"loss": 1 / step})
        store.record_metrics(experiment, "t0", 5 + step, 5.0 + step, {"loss": 1 / (5 + step)})
    t1 = [(cursor, r) for cursor, r in store.metrics_after(experiment, 0) if r.trial_id == "t1"]
    assert [r.step for _, r in t1] == [1, 2, 3]
    assert store.metrics_after(experiment, 0, trial_id="t1") == t1  # the same cursors as read unfiltered
    assert store.metrics_after(experiment, 0, limit=1, trial_id="t1") == t1[:1]
    assert store.metrics_after(experiment, t1[-1][0], trial_id="t1") == []  # t0 reported after it


def test_a_store_from_before_the_server_gains_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as connection:  # the experiments table as it was
        connection.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, name VARCHAR(255) NOT NULL UNIQUE, "
                           "spec TEXT NOT NULL, created_at FLOAT NOT NULL, status VARCHAR(32) NOT NULL)")
        connection.execute("""INSERT INTO experiments VALUES (1, 'old', '{}', 0.0, 'finished')""")
    reader = SqlStore.open_read_only(path)  # a report reads it as it is
    assert [(e.name, e.owner, e.weight) for e in reader.experiments()] == [("old", None, 1.0)]
    reader.close()
    store = SqlStore(f"sqlite:///{path}")
    assert store.experiment(1).weight == 1.0 and store.experiment(1).cancel_requested is False
    store.set_weight(1, 3.0)
    assert store.experiment(1).weight == 3.0
    store.close()


def test_runs_follow_starts_yields_and_losses() -> None:
    events: list[Event] = [
        NodeAdded(0.0, "n0", ("g0",)),  # 1
        GpuAdded(0.0, "n0", "g1"),  # 2
        TrialSubmitted(0.0, "a", 9),  # 3: Start a on g0
        TrialSubmitted(0.0, "b", 9),  # 4: Start b on g1
        PeriodElapsed(10.0),  # 5: Suspend a
        TrialSuspended(11.0, "a", 2),  # 6: Resume a on g0 at once (same time as its release)
        PeriodElapsed(20.0),  # 7: Stop b
        TrialExited(21.0, "b", True),  # 8
        NodeRemoved(30.0, "n0"),  # 9: a is lost with its node
    ]
    decisions = [
        DecisionRecord(3, 0.0, Start("a", "g0")),
        DecisionRecord(4, 0.0, Start("b", "g1")),
        DecisionRecord(5, 10.0, Suspend("a")),
        DecisionRecord(6, 11.0, Resume("a", "g0")),
        DecisionRecord(7, 20.0, Stop("b")),
    ]
    assert build_runs(events, decisions) == [
        Run(
            "a", "g0", 0.0, resumed=False, migrated=False, yield_requested_at=10.0, ended_at=11.0, ended_by="suspended"
        ),
        Run("b", "g1", 0.0, resumed=False, migrated=False, yield_requested_at=20.0, ended_at=21.0, ended_by="stopped"),
        Run("a", "g0", 11.0, resumed=True, migrated=False, ended_at=30.0, ended_by="lost"),
    ]


# ---------------------------------------------------------------------- file-backed SQLite only
def test_file_store_uses_wal_and_survives_reopening(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/deep/er/hermes.db"
    store = SqlStore(url)
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.append_event(experiment, NodeAdded(0.0, "n0", ("g0",)), [])
    store.close()
    with sqlite3.connect(tmp_path / "deep/er/hermes.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    reopened = SqlStore(url)
    assert reopened.create_or_open_experiment("exp", SPEC) == experiment
    assert reopened.events(experiment) == [NodeAdded(0.0, "n0", ("g0",))]
    reopened.close()


WRITER = """
import sys
from hermes.core.events import TrialReported
from hermes.core.decisions import Suspend
from hermes.store import SqlStore

store = SqlStore(sys.argv[1])
experiment = store.create_or_open_experiment(sys.argv[2], {"name": sys.argv[2]})
for i in range(1, int(sys.argv[3]) + 1):
    seq = store.append_event(experiment, TrialReported(float(i), "t0", i, i / 7), [Suspend("t0")] * (i % 3))
    print(seq, flush=True)
"""


def expected_event(i: int) -> TrialReported:
    return TrialReported(float(i), "t0", i, i / 7)


def writer(url: str, name: str, count: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, url, name, str(count)], stdout=subprocess.PIPE, text=True, env=env
    )


def test_a_store_older_than_the_pool_settings_opens_read_only(tmp_path: Path) -> None:
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.close()
    with sqlite3.connect(path) as connection:  # as a store written before the table existed
        connection.execute("DROP TABLE experiment_settings")
    reader = SqlStore.open_read_only(path)
    try:
        record = reader.experiment(experiment)
        assert (record.name, record.owner, record.weight, record.cancel_requested) == ("exp", None, 1.0, False)
        assert [e.name for e in reader.experiments(status=ExperimentStatus.RUNNING)] == ["exp"]
    finally:
        reader.close()


def test_committed_events_survive_kill_9(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/hermes.db"
    process = writer(url, "exp", 1_000_000)
    assert process.stdout is not None
    confirmed = 0
    while confirmed < 200:  # kill it mid-stream, well into its writing loop
        confirmed = int(process.stdout.readline())
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()

    store = SqlStore(url)
    experiment = store.create_or_open_experiment("exp", {"name": "exp"})
    events = store.events(experiment)
    assert len(events) >= confirmed  # nothing acknowledged is lost
    assert events == [expected_event(i) for i in range(1, len(events) + 1)]  # intact, in order, no gap
    assert [(r.event_seq, r.decision) for r in store.decisions(experiment)] == [
        (i, Suspend("t0")) for i in range(1, len(events) + 1) for _ in range(i % 3)
    ]  # each event's decisions committed with it
    store.append_event(experiment, expected_event(len(events) + 1))  # and the log goes on
    store.close()


def test_processes_share_one_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/hermes.db"
    processes = [writer(url, f"exp{i}", 60) for i in range(3)]
    for process in processes:
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0 and out.split()[-1] == "60"
    store = SqlStore(url)
    for i in range(3):
        assert store.events(store.create_or_open_experiment(f"exp{i}", {"name": f"exp{i}"})) == [
            expected_event(j) for j in range(1, 61)
        ]
    store.close()


# ---------------------------------------------------------------------- damaged records
STATES = ", ".join(sorted(state.value for state in TrialState))
DAMAGE = [  # (statement, the record and what is wrong with it)
    ("UPDATE events SET data = '{\"trial\": ' WHERE seq = (SELECT MAX(seq) FROM events WHERE type = 'TrialReported')",
     "table events, row with experiment_id 1, seq 3: column data is not valid JSON (Expecting value"),
    ("UPDATE decisions SET data = '[1]' WHERE event_seq = 2",
     "table decisions, row with experiment_id 1, event_seq 2, position 0: column data holds list JSON, not dict"),
    ("UPDATE metrics SET metric_values = '{\"score\": \"abc\"}' WHERE id = 1",
     "table metrics, row with experiment_id 1, id 1: column metric_values holds 'abc' for metric 'score', not a number"),
    ("UPDATE trials SET state = 'exploded' WHERE trial_id = 'a'",
     f"table trials, row with experiment_id 1, trial_id 'a': column state holds 'exploded', not one of {STATES}"),
    ("UPDATE trials SET budget = 'x' WHERE trial_id = 'a'",  # SQLite keeps text in an integer column
     "table trials, row with experiment_id 1, trial_id 'a': column budget holds 'x', not a whole number"),
    ("UPDATE trials SET started_at = 'soon' WHERE trial_id = 'a'",
     "table trials, row with experiment_id 1, trial_id 'a': column started_at holds 'soon', not a number"),
]


@pytest.mark.parametrize(("statement", "record"), DAMAGE,
                         ids=["event", "decision", "metrics", "trial", "trial-budget", "trial-time"])
def test_a_damaged_record_is_named_where_it_is_read_and_stops_a_replay_before_it_begins(
    tmp_path: Path, statement: str, record: str
) -> None:
    """What ``hermes status`` says of a damaged record (``hermes.report.integrity``), the store says as it reads
    it: a rerun stops before it replays anything (not with a traceback, nor at the end of a run whose results
    then cannot be read), and leaves the experiment as it was."""
    database = tmp_path / "runs" / "hermes.db"
    store = SqlStore(f"sqlite:///{database}")
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.append_event(experiment, NodeAdded(0.0, "n0", ("n0/g0",)))
    running = TrialRecord("a", {"lr": 0.1}, TrialState.RUNNING, 3, 0.0, gpu="n0/g0", started_at=0.0)
    store.record_events(experiment, [
        (TrialSubmitted(0.0, "a", 3, {"lr": 0.1}), [Start("a", "n0/g0")], [running]),
        (TrialReported(1.0, "a", 1, 0.5, metrics={"score": 0.5}), [], [replace(running, step=1)]),
    ])
    store.close()
    with sqlite3.connect(database) as connection:
        connection.execute(statement)
    connection.close()
    before = database.read_bytes()

    store = SqlStore(f"sqlite:///{database}")
    try:
        read = {"events": store.events, "decisions": store.decisions, "metrics": store.metrics,
                "trials": store.trials}[record.split()[1].rstrip(",")]
        with pytest.raises(StoreError) as raised:
            read(experiment)
        assert str(raised.value).startswith(f"{database} has a damaged record: {record}"), raised.value
        assert raised.value.record.startswith(record)  # type: ignore[attr-defined]

        followed: list[Event] = []
        with pytest.raises(HermesError) as raised:
            replay(store, experiment, rr_core(), lambda event, _: followed.append(event))
        assert str(raised.value).startswith(f"{database} has a damaged record: {record}"), raised.value
        assert str(raised.value).endswith("; the experiment cannot continue from it, and was left as it was")
        assert followed == []  # nothing replayed, so nothing runs
    finally:
        store.close()
    assert database.read_bytes() == before


def test_a_reserve_that_cannot_be_deleted_is_left_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A storage dir made immutable (``chattr +i``) or read-only while the runner ran: the experiment has run, so
    giving back the reserve must not end it with a traceback (and exit code 1)."""
    import errno

    from hermes.store.lock import RESERVE_FILE, SpaceReserve

    reserve = SpaceReserve(tmp_path)
    reserve.acquire()
    assert (tmp_path / RESERVE_FILE).stat().st_size > 0

    def refused(path: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(Path, "unlink", refused)
    reserve.release()
    assert capsys.readouterr().err == (
        f"hermes: warning: cannot delete the space reserve {tmp_path / RESERVE_FILE} (Operation not permitted); "
        "delete it by hand\n"
    )
    monkeypatch.undo()
    reserve.release()
    assert not (tmp_path / RESERVE_FILE).exists()
