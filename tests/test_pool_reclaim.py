"""GPUs a pool takes back: where they go (the pool core, event by event), and what ``hermes status`` shows of them.

A preemption asked of a trial cannot be called back (the executor contract): the GPU it frees must serve the
experiment it was taken for, even when another GPU frees first. And an experiment's status lists the GPUs its core
holds, never one the pool took back and another experiment runs on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.decisions import Decision, Resume, Start
from hermes.core.events import (
    GpuReclaimed,
    NodeAdded,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.pool import PoolScheduler
from hermes.core.scheduler import Scheduler
from hermes.experiment import parse_spec
from hermes.policies import make_policy
from hermes.report import STORE_FILE
from hermes.report.status import experiment_status
from hermes.store import ExperimentStatus, SqlStore


def verbs(decisions: list[Decision]) -> list[tuple[str, str, str | None]]:
    return [(type(d).__name__, d.trial_id, getattr(d, "gpu", None)) for d in decisions]


def fifo_experiment(pool: PoolScheduler, key: str, trials: int, budget: int, at: float) -> list[Decision]:
    decisions = pool.add_experiment(key, Scheduler(make_policy("fifo")), at=at)
    for i in range(trials):
        decisions += pool.tell(key, TrialSubmitted(at, f"t{i}", budget))
    return decisions + pool.tell(key, SubmissionsClosed(at))


def test_a_preempted_gpu_goes_to_the_newcomer_it_was_taken_for_when_another_gpu_frees_first() -> None:
    pool = PoolScheduler()
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    assert verbs(fifo_experiment(pool, "a", 3, 10, 0.0)) == [("Start", "a.t0", "g0"), ("Start", "a.t1", "g1")]
    for step in range(1, 10):
        pool.handle(TrialReported(step, "a.t0", step, 0.1))
        pool.handle(TrialReported(step, "a.t1", step, 0.1))
    assert verbs(fifo_experiment(pool, "b", 1, 10, 9.5)) == [("Suspend", "a.t1", None)]  # its share: one GPU
    pool.handle(TrialReported(10.0, "a.t0", 10, 1.0))
    # a.t0 completes before a.t1 reaches its next step: a GPU is on its way to b already, so a refills g0
    assert verbs(pool.handle(TrialExited(10.1, "a.t0", True))) == [("Start", "a.t2", "g0")]
    # and the GPU a.t1 leaves goes to b, as its preemption was for: not straight back to a.t1
    assert verbs(pool.handle(TrialSuspended(10.3, "a.t1", 9))) == [("Start", "b.t0", "g1")]
    assert pool.holder == {"g0": "a", "g1": "b"}


def test_a_gpu_taken_back_for_a_deficit_serves_it_when_the_victims_other_gpu_frees_first() -> None:
    pool = PoolScheduler(quantum=1.0)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1", "g2")))
    fifo_experiment(pool, "a", 4, 20, 0.0)
    assert verbs(fifo_experiment(pool, "b", 4, 20, 0.0)) == [("Suspend", "a.t2", None)]  # 1.5 GPUs each
    for trial_id in ("a.t0", "a.t1", "a.t2"):
        pool.handle(TrialReported(1.0, trial_id, 1, 0.1))
    # b, a GPU second behind its share, is owed more than the quantum: a's lowest trial on a GPU yields too
    assert verbs(pool.handle(TrialSuspended(1.0, "a.t2", 1))) == [("Start", "b.t0", "g2"), ("Suspend", "a.t1", None)]
    assert verbs(pool.handle(TrialExited(1.5, "a.t0", True))) == [("Resume", "a.t2", "g0")]
    assert verbs(pool.handle(TrialSuspended(2.0, "a.t1", 2))) == [("Start", "b.t1", "g1")]
    assert pool.holder == {"g0": "a", "g1": "b", "g2": "b"}


SPEC = parse_spec(
    {
        "name": "toy",
        "trial": {"function": "examples.digits.train:train"},
        "search": {"trials": 3, "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}}},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 10},
        "policy": {"name": "fifo"},
    }
).model_dump(mode="json")


def test_status_of_a_pool_experiment_lists_only_the_gpus_its_core_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded as a pool records (every event each experiment handled, with its decisions), the status of
    each experiment agrees with its core after every call: a GPU the pool took back leaves its list when it is
    free at once, else when its trial suspends or exits."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    ids = {key: store.submit_experiment("toy", SPEC, owner) for key, owner in (("a", "alice"), ("b", "bob"))}
    for experiment_id in ids.values():
        store.set_status(experiment_id, ExperimentStatus.RUNNING)
    pool = PoolScheduler()
    schedulers = {key: Scheduler(make_policy("fifo")) for key in ids}

    def call(decisions: list[Decision]) -> list[Decision]:
        for routed in pool.routed:
            store.append_event(ids[routed.experiment], routed.event, routed.decisions)
        for key, scheduler in schedulers.items():
            status = experiment_status(store, store.experiment(ids[key]))
            cluster = scheduler.cluster
            held = {gpu: cluster.node_of(gpu).occupant[gpu] for gpu in cluster.gpu_node}
            assert {gpu: run.trial_id if run else None for gpu, run in status.gpus.items()} == {
                gpu: trial.trial_id if trial else None for gpu, trial in held.items()
            }, key
        return decisions

    def add(key: str, trials: int, at: float) -> None:
        call(pool.add_experiment(key, schedulers[key], at=at))
        for i in range(trials):
            call(pool.tell(key, TrialSubmitted(at, f"t{i}", 10 if key == "a" else 3)))
        call(pool.tell(key, SubmissionsClosed(at)))

    try:
        call(pool.handle(NodeAdded(0.0, "local", ("local/cpu0", "local/cpu1"))))
        add("a", 3, 0.0)
        for step in range(1, 10):
            call(pool.handle(TrialReported(step, "a.t0", step, 0.1)))
            call(pool.handle(TrialReported(step, "a.t1", step, 0.1)))
        add("b", 1, 9.5)  # the pool takes local/cpu1 back from a: a.t1 is to suspend
        call(pool.handle(TrialReported(10.0, "a.t0", 10, 1.0)))
        call(pool.handle(TrialExited(10.1, "a.t0", True)))
        assert any(
            isinstance(d, Start) and d.trial_id == "b.t0" for d in call(pool.handle(TrialSuspended(10.3, "a.t1", 9)))
        )
        assert main(["status", str(tmp_path), "--experiment", "alice/toy"]) == 0
        shown = capsys.readouterr().out
        assert "GPUs        1 of 1 busy" in shown and "local/cpu1" not in shown  # bob's now
        for step in range(1, 4):
            call(pool.handle(TrialReported(10 + step, "b.t0", step, 0.1)))
            call(pool.handle(TrialReported(10 + step, "a.t2", step, 0.1)))
        assert any(
            isinstance(d, Resume) and d.trial_id == "a.t1" for d in call(pool.handle(TrialExited(13.1, "b.t0", True)))
        )  # b ended: its GPU comes back to a
        call(pool.handle(TrialReported(14.0, "a.t1", 10, 0.1)))
        call(pool.handle(TrialExited(14.1, "a.t1", True)))  # nothing waits: the pool takes its free GPU back
        assert [(type(routed.event), routed.experiment) for routed in pool.routed][-1] == (GpuReclaimed, "a")
        assert list(experiment_status(store, store.experiment(ids["a"])).gpus) == ["local/cpu0"]
        for step in range(4, 11):
            call(pool.handle(TrialReported(10 + step, "a.t2", step, 0.1)))
        call(pool.handle(TrialExited(20.1, "a.t2", True)))
    finally:
        store.close()
