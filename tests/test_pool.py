"""The pool session: many experiments from one store on one local engine, with real trial processes.

As in tests/test_run.py, nothing of ours is mocked: the trials are tests/trials/curve.py run as
processes on CPU slots, the store is a SQLite file, and the kill is a real SIGKILL of a real pool
process (``python -m hermes.pool``), whose trials die with it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import (
    ExperimentCancelled,
    GpuReclaimed,
    NodeAdded,
    PeriodElapsed,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState
from hermes.experiment import ExperimentSpec, parse_spec
from hermes.experiment.spec import ResourcesSpec
from hermes.policies import make_policy
from hermes.pool import PoolSession, stored_form
from hermes.report import ExperimentView
from hermes.session import ExperimentSession
from hermes.store import ExperimentRecord, ExperimentStatus, SqlStore, TrialRecord
from tests.test_run import (
    PRINTED,
    RATE,
    TESTS,
    TOLD_SEARCHER,
    count_reports,
    environment,
    score,
    search,
    spec_of,
    trial_processes,
    wait_for,
)

TIMEOUT = 90


def pool_spec(
    name: str, trials: int, sleep: float, budget: int = 5, max_time: float | None = None, **sections: Any
) -> dict[str, Any]:
    searching = search(trials, 1, sleep) | ({"max_time": max_time} if max_time is not None else {})
    spec = spec_of(name, search=searching, budget={"steps": budget}, **sections)
    return stored_form(parse_spec(spec))  # as a pool stores it


@contextmanager
def running(pool: PoolSession) -> Iterator[threading.Thread]:
    """The pool's loop in a thread of its own for the block; stopped and joined after it, however it ends."""
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        yield runner
    finally:
        pool.stop()
        runner.join(TIMEOUT)


def submit(store: SqlStore, spec: dict[str, Any], owner: str = "ann", weight: float = 1.0) -> int:
    return store.submit_experiment(spec["name"], spec, owner=owner, weight=weight)


def status(store: SqlStore, experiment_id: int) -> ExperimentStatus:
    return store.experiment(experiment_id).status


def check_completed(store: SqlStore, tmp_path: Path, experiment_id: int, trials: int, budget: int) -> None:
    """Every trial completed with every step reported, its state carried across every suspension."""
    record = store.experiment(experiment_id)
    assert record.status is ExperimentStatus.FINISHED
    stored = store.trials(experiment_id)
    assert len(stored) == trials
    steps: dict[str, set[int]] = {}
    for metric in store.metrics(experiment_id):
        steps.setdefault(metric.trial_id, set()).add(metric.step)
    for trial in stored:
        assert trial.state is TrialState.COMPLETED, f"{record.name} trial {trial.trial_id}: {trial.error}"
        assert steps[trial.trial_id] == set(range(1, budget + 1))
        result = json.loads((tmp_path / "runs" / record.name / "trials" / trial.trial_id / "result.json").read_text())
        assert result["total"] == pytest.approx(sum(score(trial.params["rate"], s) for s in range(1, budget + 1)))


def replays_to_the_same_decisions(store: SqlStore, experiment_id: int) -> None:
    """The experiment's log alone rebuilds its core, which decides again what it decided: grants and reclaims are
    events of its own log."""
    stored = [record.decision for record in store.decisions(experiment_id)]
    core = Scheduler(make_policy("rr", period=0.5))
    assert [decision for event in store.events(experiment_id) for decision in core.handle(event)] == stored


# ---------------------------------------------------------------------- in-process: submissions, weights, cancels
def test_a_pool_runs_experiments_submitted_while_it_runs_and_cancels_on_request(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    first = submit(store, pool_spec("first", 4, 0.05), weight=1.0)
    never = submit(store, pool_spec("never", 2, 0.05))
    store.request_cancel(never)  # before the pool looks: a queued experiment's cancellation
    with running(pool) as runner:
        wait_for(lambda: status(store, first) is ExperimentStatus.RUNNING, TIMEOUT, "the pool to take up the first")
        second = submit(store, pool_spec("second", 4, 0.05), owner="bob", weight=3.0)
        doomed = submit(store, pool_spec("doomed", 6, 0.2, budget=50))
        wait_for(lambda: store.metrics(doomed), TIMEOUT, "the doomed experiment to report")
        store.set_weight(second, 2.0)
        store.set_owner_weight("bob", 2.0)
        wait_for(lambda: pool.scheduler.owner_weights.get("bob") == 2.0, TIMEOUT, "the owner's weight to apply")
        shares = {share.name: share for share in pool.shares()}
        assert shares["doomed"].owner == "ann" and 0 < shares["doomed"].share <= 2
        assert sum(share.gpus for share in shares.values()) <= 2
        store.request_cancel(doomed)
        wait_for(lambda: status(store, doomed) is ExperimentStatus.CANCELLED, TIMEOUT, "the cancellation")
        wait_for(lambda: {status(store, first), status(store, second)} == {ExperimentStatus.FINISHED}, TIMEOUT,
                 "both experiments to finish")
        # Once the pool's clock has run past the budget below, the budget can only hold if it counts from
        # the experiment's start.
        wait_for(lambda: pool.executor.now() > 2.5, TIMEOUT, "the pool's clock to pass the time budget")
        late = submit(store, pool_spec("late", 20, 0.2, budget=50, max_time=2.0))
        wait_for(lambda: status(store, late) is ExperimentStatus.FINISHED, TIMEOUT, "the time budget to end it")
        broken = store.submit_experiment("broken", {**pool_spec("broken", 2, 0.05), "trial": {"function": "x:y",
                                                                                               "workdir": "/nowhere"}})
        raw = store.submit_experiment("raw", spec_of("raw"))  # defaults left out: not as a pool stores it
        wait_for(lambda: status(store, never) is ExperimentStatus.CANCELLED, TIMEOUT, "a queued cancellation")
        wait_for(lambda: status(store, raw) is ExperimentStatus.FAILED, TIMEOUT, "the raw spec to fail")
        wait_for(lambda: status(store, broken) is ExperimentStatus.FAILED, TIMEOUT, "the broken spec to fail")
    assert not runner.is_alive()
    for experiment_id in (first, second):
        check_completed(store, tmp_path, experiment_id, 4, 5)
        replays_to_the_same_decisions(store, experiment_id)
        events = store.events(experiment_id)
        assert any(isinstance(event, NodeAdded) for event in events)  # GPUs came as grants of the pool
    assert "trial.workdir" in (store.experiment(broken).error or "")
    assert "PoolSession.submit" in (store.experiment(raw).error or "")
    late_trials = store.trials(late)
    assert len(store.metrics(late)) >= 4 and any(trial.state is TrialState.STOPPED for trial in late_trials)
    assert all(trial.state.is_terminal for trial in late_trials)
    assert store.metrics(never) == [] and store.events(never) == []
    cancelled = store.trials(doomed)
    assert cancelled and all(trial.state in (TrialState.STOPPED, TrialState.COMPLETED) for trial in cancelled)
    assert any(trial.state is TrialState.STOPPED for trial in cancelled)
    # The experiments shared the slots: the pool took GPUs back from one for another.
    reclaims = sum(isinstance(e, GpuReclaimed) for x in (first, second, doomed) for e in store.events(x))
    assert reclaims > 0
    store.close()


def test_a_pools_learning_searcher_is_asked_where_the_log_holds_its_submissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As under `hermes run` (tests/test_run.py): a searcher whose proposals say what it was told when asked
    replays from the pool's log, as a restarted pool replays it, although trials of a batch end together."""
    (tmp_path / "told_searcher.py").write_text(TOLD_SEARCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = pool_spec("told", 16, 0.0, budget=2, policy={"name": "fifo"},
                     resources={"gpus": "none", "cpu_slots": 4})
    spec["search"] |= {"sampler": "told_searcher:Told", "max_pending": 4}
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=4), poll=0.1)
    told = submit(store, spec)
    with running(pool) as runner:
        wait_for(lambda: status(store, told) is ExperimentStatus.FINISHED, TIMEOUT, "the experiment to finish")
    assert len({trial.params["rate"] for trial in store.trials(told)}) > 8
    session = ExperimentSession(parse_spec(spec), store=store, experiment_id=told)
    session.replay()
    assert session.out_of_step is None, session.out_of_step
    store.close()


def test_a_pool_takes_up_a_search_of_thousands_of_trials(tmp_path: Path) -> None:
    """Its submissions were told to the pool's core one call deeper each: a search of about 500 trials overflowed
    the stack, which stopped the pool and every experiment in it."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    big = submit(store, pool_spec("big", 1500, 0.05, budget=50))
    with running(pool) as runner:
        wait_for(lambda: len(store.trials(big)) == 1500, TIMEOUT, "every trial to be submitted")
        store.request_cancel(big)
        wait_for(lambda: status(store, big) is ExperimentStatus.CANCELLED, TIMEOUT, "the cancellation")
    assert not runner.is_alive()
    store.close()


def test_a_search_of_many_trials_goes_in_by_turns_and_holds_no_other_experiment(tmp_path: Path) -> None:
    """100,000 trials were all asked for in one go, in the pool's one thread: another user's experiment of 2 trials
    waited 111 s (1 s alone), and the big one's own cancel waited too."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    big = submit(store, pool_spec("big", 20_000, 0.05, budget=50))
    with running(pool) as runner:
        wait_for(lambda: store.trials(big), TIMEOUT, "the big search to be taken up")
        small = submit(store, pool_spec("small", 2, 0.02, budget=3), owner="bob")
        wait_for(lambda: status(store, small) is ExperimentStatus.FINISHED, TIMEOUT, "the small one to finish")
        assert len(store.trials(big)) < 20_000  # it ran while the big one was still being submitted
        store.request_cancel(big)
        wait_for(lambda: status(store, big) is ExperimentStatus.CANCELLED, TIMEOUT, "the cancellation")
        assert len(store.trials(big)) < 20_000  # taken at once, not once every trial was asked for
    store.close()


def test_a_pool_started_again_goes_on_from_the_latest_time_in_its_store(tmp_path: Path) -> None:
    """One clock for the pool, across restarts: the pool's GPU timeline puts every experiment's runs on it, so
    an experiment taken up by a new pool must not start at 0 again, even when no open experiment carries the
    time on."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    ran = []
    for name in ("before", "after"):
        pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
        experiment_id = submit(store, pool_spec(name, 3, 0.05))
        with running(pool):
            wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FINISHED, TIMEOUT, f"{name} to finish")
        check_completed(store, tmp_path, experiment_id, 3, 5)
        ran.append([event.at for event in store.events(experiment_id)])
    before, after = ran
    assert max(before) > 0.5 and min(after) >= max(before)
    store.close()


class PoolDied(Exception):
    """The pool's end right after its store recorded a cancel (``DiesAfterACancel``)."""


class DiesAfterACancel(SqlStore):
    """A pool's store that ends the pool once a cancel and its Stops are committed, before any is carried out, as
    ``kill -9`` there would: a stopped trial is killed at once, so nothing else leaves one asked to stop."""

    def record_events(self, experiment_id: int, records: Any) -> list[int]:
        seqs = super().record_events(experiment_id, records)
        if any(isinstance(event, ExperimentCancelled) for event, _, _ in records):
            raise PoolDied
        return seqs


def test_an_experiment_whose_cancel_was_under_way_when_the_pool_stopped_ends_cancelled(tmp_path: Path) -> None:
    """The cancel's Stops were decided, and its running trial had not ended yet, when the pool stopped: the next
    pool ended that trial on taking the experiment up, and recorded the experiment finished."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment_id = submit(store, pool_spec("slow", 1, 3.0, budget=4))
    pool = PoolSession(DiesAfterACancel(f"sqlite:///{tmp_path}/pool.db"), tmp_path,
                       resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    runner = threading.Thread(target=lambda: pytest.raises(PoolDied, pool.run))
    runner.start()
    wait_for(lambda: any(isinstance(e, Start) for e in (r.decision for r in store.decisions(experiment_id))),
             TIMEOUT, "its trial to start")
    store.request_cancel(experiment_id)
    runner.join(TIMEOUT)
    assert any(isinstance(e, ExperimentCancelled) for e in store.events(experiment_id))
    assert [t.state for t in store.trials(experiment_id)] == [TrialState.RUNNING]
    assert status(store, experiment_id) is ExperimentStatus.INTERRUPTED
    again = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with running(again):
        wait_for(lambda: status(store, experiment_id) is not ExperimentStatus.INTERRUPTED, TIMEOUT, "its end")
    assert status(store, experiment_id) is ExperimentStatus.CANCELLED
    assert [t.state for t in store.trials(experiment_id)] == [TrialState.STOPPED]
    store.close()


# ---------------------------------------------------------------------- warm workers of each experiment's own
def test_each_experiment_runs_in_warm_workers_of_its_own_which_end_with_it(tmp_path: Path) -> None:
    """Two experiments whose modules share a name run in warm workers, each experiment in its own: its
    trials share its workers' processes (a process per run would give every trial one), its code is its
    own, and its workers end when it finishes while the pool goes on."""
    curve = (Path(__file__).parent / "trials" / "curve.py").read_text()
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    ids = {}
    for origin in ("a", "b"):
        workdir = tmp_path / origin
        workdir.mkdir()
        (workdir / "model.py").write_text(curve + f"""

_train = train


def train(config: dict[str, Any]) -> None:
    _train(config)
    (trial.trial_dir() / "origin").write_text({origin!r})
""")
        spec = pool_spec(origin, 4, 0.1, budget=8, trial={"function": "model:train", "workdir": str(workdir)})
        ids[origin] = submit(store, spec, owner=origin)
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: all(status(store, i) is ExperimentStatus.FINISHED for i in ids.values()), TIMEOUT,
                 "both experiments to finish")
        assert runner.is_alive()
        workers = {}
        for origin, experiment_id in ids.items():
            check_completed(store, tmp_path, experiment_id, 4, 8)
            trials = tmp_path / "runs" / origin / "trials"
            assert {(path / "origin").read_text() for path in trials.iterdir()} == {origin}
            workers[origin] = {pid for path in trials.iterdir()
                               for pid in json.loads((path / "result.json").read_text())["pids"]}
            assert len(workers[origin]) <= 2, "four trials ran in at most the two slots' workers"
            assert len(list((tmp_path / "pool" / "workers").glob(f"e{experiment_id}-*.log"))) <= 2
        assert not workers["a"] & workers["b"]
        suspended = [r for i in ids.values() for r in store.decisions(i) if isinstance(r.decision, Suspend)]
        assert suspended, "the experiments' trials took turns"
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pids in workers.values() for pid in pids),
                 10, "the finished experiments' workers to end")
    assert not runner.is_alive()
    store.close()


def test_a_trial_that_kills_its_worker_takes_no_other_experiments_trials_along(tmp_path: Path) -> None:
    """A trial that ends its whole process (``os._exit``) fails; its experiment's other trials fall back to their
    checkpoints and complete exactly; the other experiment's workers, on the same slots, never notice."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    budget = 6
    configs = [{"rate": 0.3 + 0.1 * i, "sleep": 0.08, "crash": "hard" if i == 0 else "none", "crash_step": 3}
               for i in range(4)]
    crashy = submit(store, stored_form(parse_spec(spec_of("crashy", search={"sampler": "list", "configs": configs},
                                                          budget={"steps": budget}))), owner="ann")
    calm = submit(store, pool_spec("calm", 4, 0.08, budget=budget), owner="bob")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: {status(store, crashy), status(store, calm)} == {ExperimentStatus.FINISHED}, TIMEOUT,
                 "both experiments to finish")
    check_completed(store, tmp_path, calm, 4, budget)
    calm_pids = {pid for path in (tmp_path / "runs" / "calm" / "trials").iterdir()
                 for pid in json.loads((path / "result.json").read_text())["pids"]}
    assert len(calm_pids) <= 2  # its workers were never replaced
    trials = {trial.trial_id: trial for trial in store.trials(crashy)}
    assert trials["0"].state is TrialState.FAILED and "worker died" in (trials["0"].error or "")
    for trial_id in ("1", "2", "3"):
        assert trials[trial_id].state is TrialState.COMPLETED, trials[trial_id].error
        result = json.loads((tmp_path / "runs" / "crashy" / "trials" / trial_id / "result.json").read_text())
        rate = trials[trial_id].params["rate"]
        assert result["total"] == pytest.approx(sum(score(rate, step) for step in range(1, budget + 1)))
    store.close()


# ---------------------------------------------------------------------- unmodified programs in a pool
def test_an_experiment_a_dead_pool_ran_that_can_no_longer_run_fails_alone(tmp_path: Path) -> None:
    """Its workdir moved while the pool was down (a server root moved in an upgrade): failing it took the writer's
    claim of the dead pool for another writer's, and the new pool stopped at every start, every user's
    experiments with it."""
    workdir = tmp_path / "moved"
    shutil.copytree(TESTS / "trials", workdir / "trials")
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    lost = submit(store, pool_spec("lost", 2, 0.05, trial={"function": "trials.curve:train", "workdir": str(workdir)}))
    dead = SqlStore(f"sqlite:///{tmp_path}/pool.db")  # the pool that died, as it ran it
    dead.claim_writer(lost, "the pool that died")
    dead.set_status(lost, ExperimentStatus.RUNNING)
    dead.close()
    shutil.rmtree(workdir)
    calm = submit(store, pool_spec("calm", 2, 0.05), owner="bob")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: status(store, calm) is ExperimentStatus.FINISHED, TIMEOUT, "the other one to finish")
    failed = store.experiment(lost)
    assert failed.status is ExperimentStatus.FAILED and "trial.workdir" in (failed.error or ""), failed
    store.close()


def test_an_experiment_that_raises_any_error_at_its_take_up_or_its_start_fails_alone(tmp_path: Path) -> None:
    """One user's experiment stopped the pool, and every start from the store met it again: reading its spec raised
    an error not of Hermes (Path.resolve's RuntimeError on links that loop), or its trials' folders could not be
    made (a file where they go). Each fails with its reason (the file is refused as its spec is read); the pool and
    the other users' experiment go on."""

    def read_spec(record: ExperimentRecord) -> ExperimentSpec:
        """As a host of the pool may read a spec: its storage dir resolved first, strictly."""
        (tmp_path / record.spec["storage"]["dir"]).resolve(strict=True)
        return parse_spec(record.spec, source=record.name, base_dir=tmp_path)

    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    (tmp_path / "loop").symlink_to("loop")
    looped = submit(store, pool_spec("looped", 2, 0.05, storage={"dir": "loop"}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "blocked").write_text("a file where the experiment's folder goes")
    blocked = submit(store, pool_spec("blocked", 2, 0.05), owner="bob")
    calm = submit(store, pool_spec("calm", 2, 0.05), owner="cid")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1,
                       read_spec=read_spec)
    with running(pool) as runner:
        wait_for(lambda: status(store, calm) is ExperimentStatus.FINISHED, TIMEOUT, "the calm one to finish")
        wait_for(lambda: status(store, blocked).is_final, TIMEOUT, "the blocked one to end")
        assert runner.is_alive()
    failed = store.experiment(looped)
    assert failed.status is ExperimentStatus.FAILED, failed
    assert (failed.error or "").startswith("the pool could not take it up: "), failed  # RuntimeError; 3.13: ELOOP's
    refused = store.experiment(blocked)
    assert refused.status is ExperimentStatus.FAILED, refused
    assert "storage.dir: " in (refused.error or "") and "the experiment's folder, is not a directory" in refused.error
    assert not store.trials(blocked)
    check_completed(store, tmp_path, calm, 2, 5)
    store.close()


def test_a_sampler_that_raises_fails_its_experiment_alone_and_a_specs_resources_are_the_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One user's Optuna sampler that raises ends that user's experiment, failed with the reason; the pool, and the
    other experiment sharing it, go on."""
    (tmp_path / "failing_sampler.py").write_text(
        "import optuna\n\n\nclass FailingSampler(optuna.samplers.RandomSampler):\n"
        "    def after_trial(self, study, trial, state, values):\n"
        "        raise RuntimeError('boom')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    failing = pool_spec("failing", 4, 0.05, budget=6)
    failing["search"]["sampler"] = {"optuna": "failing_sampler.FailingSampler"}
    failing_id = submit(store, stored_form(parse_spec(failing)), owner="ann")
    # the pool's slots run it, whatever its spec names: not a GPU this machine lacks, nor a thousand slots
    calm = submit(store, pool_spec("calm", 3, 0.05, budget=6, resources={"gpus": [7], "cpu_slots": 1000}), owner="bob")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: status(store, failing_id) is ExperimentStatus.FAILED, TIMEOUT, "the failing one to fail")
        wait_for(lambda: status(store, calm) is ExperimentStatus.FINISHED, TIMEOUT, "the calm one to finish")
        assert runner.is_alive()
    error = store.experiment(failing_id).error or ""
    assert "search.sampler failing_sampler.FailingSampler failed when told trial" in error and "boom" in error
    assert all(trial.state.is_terminal for trial in store.trials(failing_id))
    check_completed(store, tmp_path, calm, 3, 6)
    store.close()


def test_a_hung_trial_in_a_pool_is_failed_by_its_own_specs_limit(tmp_path: Path) -> None:
    """Each experiment's trial.timeout holds for its trials in the shared pool (each launch carries its limits)."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    configs = [{"rate": 0.5, "sleep": 0.05, "hang_after": 2}, {"rate": 0.7, "sleep": 0.05, "hang_after": -1}]
    spec = spec_of("hung", search={"sampler": "list", "configs": configs}, budget={"steps": 4})
    spec["trial"]["timeout"] = 2
    experiment_id = submit(store, stored_form(parse_spec(spec)))
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FINISHED, 30, "the experiment to end")
    trials = {trial.trial_id: trial for trial in store.trials(experiment_id)}
    assert trials["0"].state is TrialState.FAILED and "trial.timeout" in (trials["0"].error or "")
    assert trials["1"].state is TrialState.COMPLETED
    store.close()


def test_an_unmodified_program_that_prints_rarely_is_preempted_between_its_lines_in_a_pool(tmp_path: Path) -> None:
    """Its steps take 1.5 s and its experiment's period is 0.3 s: the pool ticks for it, as ``hermes run`` does,
    so the core suspends it mid-step; once it is done the pool stops ticking."""
    spec = spec_of(
        "rare",
        trial={"command": f"{sys.executable} trials/printer.py --steps 2 --rate {{rate}} --sleep 1.5",
               "metrics_regex": PRINTED, "workdir": str(TESTS)},
        search={"sampler": "random", "trials": 2, "seed": 4, "space": {"rate": RATE}},
        budget={"steps": 2},
        policy={"name": "rr", "period": 0.3},
    )
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment_id = submit(store, stored_form(parse_spec(spec)))
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FINISHED, TIMEOUT, "the experiment to end")
        # the pool thread stores the status first, then stops ticking
        wait_for(lambda: pool.executor.loop.period is None, 5, "the pool to stop ticking")
    trials = store.trials(experiment_id)
    assert [trial.state for trial in trials] == [TrialState.COMPLETED] * 2
    events = store.events(experiment_id)
    first = next(event for event in events if isinstance(event, TrialReported))
    suspended = [event for event in events if isinstance(event, TrialSuspended)]
    assert suspended and suspended[0].at < first.at  # a tick, not a report, ended the first turn
    assert any(isinstance(event, PeriodElapsed) for event in events)
    store.close()


# ---------------------------------------------------------------------- kill -9 of the pool process
def kill_pool(command: list[str], env: dict[str, str], cwd: Path, moment: Callable[[], object], timeout: float) -> None:
    """Start a pool process (``python -m hermes.pool``) and SIGKILL it once ``moment()`` holds."""
    pool = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(moment, timeout, "the moment")
        pool.send_signal(signal.SIGKILL)
        pool.wait(timeout=10)
    finally:
        if pool.poll() is None:
            pool.kill()
            pool.wait()


def rerun_pool(command: list[str], env: dict[str, str], cwd: Path, store: SqlStore, ids: list[int],
               timeout: float) -> None:
    """Start the pool process again, and SIGTERM it once every experiment of ``ids`` finished: it exits with 0."""
    restarted = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    try:
        wait_for(lambda: all(status(store, i) is ExperimentStatus.FINISHED for i in ids), timeout,
                 "every experiment to finish after the restart")
        restarted.send_signal(signal.SIGTERM)
        _, stderr = restarted.communicate(timeout=60)
    finally:
        if restarted.poll() is None:
            restarted.kill()
            restarted.wait()
    assert restarted.returncode == 0, stderr


def completed_trials(store: SqlStore, ids: list[int]) -> set[tuple[int, str]]:
    return {(i, trial.trial_id) for i in ids for trial in store.trials(i) if trial.state is TrialState.COMPLETED}


def check_continued(store: SqlStore, tmp_path: Path, ids: list[int], budget: int,
                    before: dict[int, list], completed_before: set[tuple[int, str]]) -> None:
    """After a kill and a restart: every trial complete and exact, the log only appended to, no finished trial run
    again, and every trial started once (the others resumed from their checkpoints)."""
    for experiment_id in ids:
        check_completed(store, tmp_path, experiment_id, 4, budget)
        metrics = store.metrics(experiment_id)
        assert metrics[: len(before[experiment_id])] == before[experiment_id]  # the log is append-only
        after = Counter(record.trial_id for record in metrics[len(before[experiment_id]):])
        assert not {(experiment_id, trial_id) for trial_id in after} & completed_before, "a finished trial ran again"
        starts = Counter(r.decision.trial_id for r in store.decisions(experiment_id) if isinstance(r.decision, Start))
        assert set(starts.values()) == {1}  # resumed from checkpoints, never started from scratch again
    views = [ExperimentView.load(store, store.experiment(experiment_id)) for experiment_id in ids]
    runs = sorted((run for view in views for run in view.runs), key=lambda run: (run.gpu, run.started_at))
    for earlier, later in zip(runs, runs[1:]):  # the killed pool's runs end before the new pool's begin on their GPU
        if earlier.gpu == later.gpu:
            assert earlier.ended_at is not None and earlier.ended_at <= later.started_at, (earlier, later)


def test_a_pool_killed_with_sigkill_continues_every_experiment(tmp_path: Path) -> None:
    database = tmp_path / "pool.db"
    store = SqlStore(f"sqlite:///{database}")
    budget, checkpoint_every = 6, 2
    specs = [
        pool_spec(name, 4, 0.08, budget=budget, storage={"dir": "runs", "checkpoint_every": checkpoint_every})
        for name in ("left", "right")
    ]
    ids = [submit(store, specs[0], owner="ann"), submit(store, specs[1], owner="bob", weight=2.0)]
    command = [sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{database}", "--dir", str(tmp_path),
               "--cpu-slots", "2", "--poll", "0.1"]
    # The trials run in the pool's warm workers, which live under tmp_path/pool.
    kill_pool(command, environment(), tmp_path, lambda: count_reports(database) >= 10 and trial_processes(tmp_path),
              TIMEOUT)
    wait_for(lambda: not trial_processes(tmp_path), 5, "the trials of the killed pool to die")
    assert [status(store, experiment_id) for experiment_id in ids] == [ExperimentStatus.RUNNING] * 2
    before = {experiment_id: store.metrics(experiment_id) for experiment_id in ids}
    used_before = {experiment_id: store.experiment(experiment_id).gpu_seconds_used for experiment_id in ids}
    assert all(used > 0 for used in used_before.values())  # the fair-share accounts were saved as it ran
    completed_before = completed_trials(store, ids)

    rerun_pool(command, environment(), tmp_path, store, ids, TIMEOUT)
    check_continued(store, tmp_path, ids, budget, before, completed_before)
    for experiment_id in ids:
        replays_to_the_same_decisions(store, experiment_id)
        assert store.experiment(experiment_id).gpu_seconds_used > used_before[experiment_id]  # went on from them
    store.close()


def test_the_pool_command_refuses_bad_options_with_one_line_each_and_exit_code_2(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'hermes.db'}"
    refusals = {
        ("--store", "nonsense", "--dir", str(tmp_path)): "hermes: error: --store: Could not parse",
        ("--store", store, "--dir", str(tmp_path), "--cpu-slots", "-1"): "hermes: error: --cpu-slots: Input should be",
        ("--store", store, "--dir", str(tmp_path), "--poll", "0"): "hermes: error: --poll: must be a positive",
        ("--store", store, "--dir", str(tmp_path / "nope")): "hermes: error: --dir: ",
        ("--store", store, "--dir", str(tmp_path), "--ray", "127.0.0.1:1"): "hermes: error: the pool's Ray address: ",
    }
    running = {options: subprocess.Popen([sys.executable, "-m", "hermes.pool", *options], env=environment(),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for options in refusals}
    try:
        for options, refusal in refusals.items():
            _, err = running[options].communicate(timeout=TIMEOUT)
            assert running[options].returncode == 2, (options, err)
            assert err.startswith(refusal) and len(err.splitlines()) == 1, (options, err)
    finally:  # one that was not refused runs a pool: end it
        for process in running.values():
            process.kill()
            process.wait()
    shown = subprocess.run([sys.executable, "-m", "hermes.pool", "--help"], env=environment(), capture_output=True,
                           text=True, check=True).stdout
    assert shown.startswith("usage: python -m hermes.pool ") and "``" not in shown


def test_a_pool_experiment_whose_spec_an_older_hermes_read_otherwise_fails_naming_the_field(tmp_path: Path) -> None:
    """A stored spec that this Hermes reads otherwise (a bound kept as the text `1e-4`, which it reads as a number):
    a restarted server failed its experiment with "its stored spec is not as a pool stores it; submit
    hermes.pool.stored_form(spec) (PoolSession.submit does)", which no user of the server can act on."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    spec = pool_spec("exponent", 2, 0.01, budget=2)
    spec["search"]["space"]["width"] = {"type": "loguniform", "low": "1e-4", "high": 0.1}  # stored as text
    experiment_id = submit(store, spec)
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with running(pool):
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FAILED, TIMEOUT, "the experiment to fail")
    error = store.experiment(experiment_id).error or ""
    assert error.startswith("experiment exponent: its stored spec reads differently now (in "
                            "search.space.width.low): an older Hermes recorded it, which read the same text "
                            "differently (YAML 1.1: 1e1 as text, 010 as 8)"), error
    assert error.endswith("it cannot continue: submit it again under a new name (--name NEW)"), error
    assert store.events(experiment_id) == []
    store.close()


def test_a_restarted_pool_loses_the_dead_pools_nodes_without_starting_a_trial_on_one(tmp_path: Path) -> None:
    """The log of a pool that died with its trial running on node a of two (a and b): the new pool lost the old
    nodes one at a time, and losing a placed the trial on b, not lost yet; that start was recorded, never carried
    out, so the log held a run on b that never happened."""
    budget = 3
    params = {"rate": 0.5, "sleep": 0.01}
    spec = stored_form(parse_spec(spec_of("two-nodes", search={"configs": [params]}, budget={"steps": budget})))
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment_id = submit(store, spec)
    running_trial = TrialRecord("0", params, TrialState.RUNNING, budget, 0.1, gpu="a/cpu0", started_at=0.1)
    store.record_events(experiment_id, [
        (NodeAdded(0.0, "a", ("a/cpu0",)), [], []),
        (NodeAdded(0.0, "b", ("b/cpu0",)), [], []),
        (TrialSubmitted(0.1, "0", budget, params), [Start("0", "a/cpu0")], [running_trial]),
    ])
    store.set_status(experiment_id, ExperimentStatus.RUNNING)
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with running(pool):
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FINISHED, TIMEOUT, "the experiment to end")
    runs = [(r.decision.trial_id, r.decision.gpu) for r in store.decisions(experiment_id)
            if isinstance(r.decision, (Start, Resume))]
    assert runs[0] == ("0", "a/cpu0") and len(runs) == 2, runs
    assert runs[1][1].split("/")[0] not in ("a", "b"), runs  # on the new pool's own slot
    assert [trial.state for trial in store.trials(experiment_id)] == [TrialState.COMPLETED]
    assert sorted(metric.step for metric in store.metrics(experiment_id)) == list(range(1, budget + 1))
    store.close()


def test_unmodified_programs_keep_their_slots_in_a_pool_and_every_one_completes(tmp_path: Path) -> None:
    """ann's two unmodified programs (SIGSTOPped in place when suspended, so they can continue only on their own
    slot) hold both slots when bob's experiment arrives, owed one: the pool suspends neither, and bob gets a slot once
    one of them ends, where before it suspended one for bob and ann's experiment ended with it stopped at its step."""
    steps = 20
    printers = spec_of(
        "printers",
        trial={"command": f"{sys.executable} trials/printer.py --steps {steps} --rate {{rate}} --sleep 0.1",
               "metrics_regex": PRINTED, "workdir": str(TESTS)},
        search={"sampler": "random", "trials": 2, "seed": 4, "space": {"rate": RATE}},
        budget={"steps": steps},
        policy={"name": "fifo"},
    )
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    ann = submit(store, stored_form(parse_spec(printers)))
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool):
        wait_for(lambda: len({metric.trial_id for metric in store.metrics(ann)}) == 2, TIMEOUT,
                 "both programs to print")
        bob = submit(store, pool_spec("functions", 2, 0.1, budget=15, policy={"name": "fifo"}), owner="bob")
        wait_for(lambda: {status(store, ann), status(store, bob)} == {ExperimentStatus.FINISHED}, TIMEOUT,
                 "both experiments to finish")
    assert [(trial.state, trial.error) for trial in store.trials(ann)] == [(TrialState.COMPLETED, None)] * 2
    assert not [r for r in store.decisions(ann) if isinstance(r.decision, Suspend)]
    steps_of: dict[str, set[int]] = {}
    for metric in store.metrics(ann):
        steps_of.setdefault(metric.trial_id, set()).add(metric.step)
    assert list(steps_of.values()) == [set(range(1, steps + 1))] * 2
    check_completed(store, tmp_path, bob, 2, 15)
    store.close()
