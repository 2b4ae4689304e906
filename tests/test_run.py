"""End-to-end tests of ``hermes run``: the real command line, real trial processes, the real store.

Nothing of ours is mocked. The trials are tiny pure-Python programs in ``tests/trials/`` (a
synthetic learning curve, a short sleep per step, state checkpointed with ``hermes.trial.Files``),
run with ``tests/`` as their working directory, so the whole file takes seconds, not minutes.
Every run uses CPU slots (``gpus: none``), so it behaves the same on a machine with GPUs.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from copy import deepcopy
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import TrialReported
from hermes.core.states import TrialState
from hermes.core.scheduler import NO_REPORT
from hermes.experiment import load_spec
from hermes.sim.trace import load_trace
from hermes.report import ExperimentView, open_store, pick_experiment
from hermes.session import ExperimentSession
from hermes.store import ExperimentStatus, MetricRecord, SqlStore, TrialRecord
from hermes.trial import protocol

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RUN_TIMEOUT = 90  # seconds: a hung runner fails its test instead of hanging the suite
RATE = {"type": "uniform", "low": 0.2, "high": 1.0}  # how fast a curve trial learns


def score(rate: float, step: int) -> float:
    """What tests/trials/curve.py reports at ``step``."""
    return 1.0 - math.exp(-rate * step)


def spec_of(name: str, **sections: Any) -> dict[str, Any]:
    """A spec of curve trials on two CPU slots; ``sections`` replace whole top-level sections."""
    spec: dict[str, Any] = {
        "name": name,
        "trial": {"function": "trials.curve:train", "workdir": str(TESTS)},
        "search": search(6, 0, 0.05),
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 5},
        "policy": {"name": "rr", "period": 0.5},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "storage": {"dir": "runs", "checkpoint_every": 2},
    }
    spec.update(sections)
    return spec


def search(trials: int, seed: int, sleep: float, **space: Any) -> dict[str, Any]:
    """A random search over ``rate`` (and ``space``), every trial sleeping ``sleep`` seconds a step."""
    return {
        "sampler": "random",
        "trials": trials,
        "seed": seed,
        "space": {
            "rate": RATE,
            "sleep": {"type": "choice", "values": [sleep]},
            **space,
        },
    }


def write_spec(directory: Path, spec: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def environment() -> dict[str, str]:
    """This checkout's hermes for the runner (it passes it on to its trials)."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def hermes_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hermes.cli", *args]


def hermes(*args: str, cwd: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run the hermes command line to its end (or fail the test after ``timeout`` seconds)."""
    try:
        return subprocess.run(
            hermes_command(*args), check=False, cwd=cwd, env=environment(), capture_output=True, text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"hermes {' '.join(args)} did not end within {timeout}s; stdout:\n{expired.stdout!r}\n"
                    f"stderr:\n{expired.stderr!r}")


UNWRITABLE = ("permission", "read-only mount")  # how a folder cannot be written (``unwritable``)
# root with no capability to override a file's mode obeys it as its owner (a user switch, to nobody, could not read
# a checkout in a folder of root's alone)
NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
READ_ONLY_BIND = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"']


@contextmanager
def unwritable(folder: Path, how: str) -> Iterator[list[str]]:
    """The words that run a command where ``folder`` cannot be written: by a user without permission (its mode
    says so; root, which may write anything, runs the command without the capability to), or on a read-only mount
    of it (a bind mount in a mount namespace of the command's own: root only). Skips the test where this machine
    allows neither."""
    if how == "read-only mount":
        prefix = [*READ_ONLY_BIND, str(folder)]
    else:
        prefix = NO_OVERRIDE if os.geteuid() == 0 else []
        folder.chmod(0o555)
    try:
        if prefix and shutil.which(prefix[0]) is None:
            pytest.skip(f"no {prefix[0]} here, to make {folder} unwritable by a {how}")
        probe = subprocess.run([*prefix, "sh", "-c", 'test -r "$0" && ! touch "$0/probe" 2>/dev/null', str(folder)],
                               check=False, capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot make {folder} unwritable by a {how} here")
        yield prefix
    finally:
        folder.chmod(0o755)


def run_ok(spec_path: Path) -> subprocess.CompletedProcess[str]:
    result = hermes("run", str(spec_path), "--no-live", cwd=spec_path.parent)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def load_view(storage: Path) -> tuple[ExperimentView, list]:
    """The stored experiment and its decisions, read once the runner is gone."""
    store = open_store(storage)
    try:
        experiment = pick_experiment(store, None)
        view = ExperimentView.load(store, experiment)
        decisions = [record.decision for record in store.decisions(experiment.experiment_id)]
    finally:
        store.close()
    return view, decisions


def metrics_by_trial(metrics: list[MetricRecord]) -> dict[str, list[MetricRecord]]:
    grouped: dict[str, list[MetricRecord]] = {}
    for record in metrics:
        grouped.setdefault(record.trial_id, []).append(record)
    return grouped


def own_steps(records: list[MetricRecord]) -> list[int]:
    return [record.step for record in records]


def trials_by_id(trials: list[TrialRecord]) -> dict[str, TrialRecord]:
    return {trial.trial_id: trial for trial in trials}


def trial_dir(storage: Path, spec: dict[str, Any], trial_id: str) -> Path:
    return storage / spec["name"] / "trials" / trial_id


# ---------------------------------------------------------------------- 1. a whole experiment
def test_an_experiment_runs_to_the_end_with_preemptions_and_its_reports_work(tmp_path: Path) -> None:
    budget, sleep = 6, 0.06
    spec = spec_of(
        "e2e-small",
        search=search(6, 1, sleep),
        budget={"steps": budget},
        policy={"name": "rr", "period": 0.2},  # a trial runs ~0.36 s of steps: each is preempted
    )
    path = write_spec(tmp_path, spec)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = hermes("run", str(path), "--no-live", cwd=elsewhere)  # relative paths follow the spec, not the cwd
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    storage = tmp_path / "runs"

    assert "e2e-small: finished" in result.stdout
    assert result.stdout.count(" completed at step 6") == 6  # the --no-live line per finished trial

    view, decisions = load_view(storage)
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert len(view.trials) == 6
    grouped = metrics_by_trial(view.metrics)
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED and trial.error is None
        assert trial.step == budget and trial.ended_at is not None
        rate = trial.params["rate"]
        own = grouped[trial.trial_id]
        # A clean run re-reports nothing: each step once, in order, with every metric the trial sent.
        assert [record.step for record in own] == list(range(1, budget + 1))
        assert all(set(record.values) == {"score", "total"} for record in own)
        assert [record.values["score"] for record in own] == pytest.approx([score(rate, s) for s in own_steps(own)])
        # Its state survived every suspension: the running sum equals an uninterrupted run's.
        result_file = json.loads((trial_dir(storage, spec, trial.trial_id) / "result.json").read_text())
        assert result_file["total"] == pytest.approx(sum(score(rate, s) for s in range(1, budget + 1)))

    starts = Counter(d.trial_id for d in decisions if isinstance(d, Start))
    suspends = [d for d in decisions if isinstance(d, Suspend)]
    resumes = [d for d in decisions if isinstance(d, Resume)]
    assert starts == Counter({trial.trial_id: 1 for trial in view.trials})  # each started once, from scratch
    assert suspends, "rr with a short period preempts"
    assert Counter(d.trial_id for d in resumes) == Counter(d.trial_id for d in suspends)  # every one came back
    assert {run.ended_by for run in view.runs} == {"suspended", "completed"}

    # The read-only commands work on what the run left.
    status = hermes("status", str(storage), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "e2e-small" in status.stdout and "finished" in status.stdout
    assert "6 completed" in status.stdout
    assert f"{len(suspends)} preemptions" in status.stdout

    results = hermes("results", str(storage), "--format", "json", "--top", "10", cwd=tmp_path)
    assert results.returncode == 0, results.stderr
    standings = json.loads(results.stdout)
    assert [entry["rank"] for entry in standings] == [1, 2, 3, 4, 5, 6]
    assert sorted(entry["trial"] for entry in standings) == sorted(trial.trial_id for trial in view.trials)
    params = {trial.trial_id: trial.params for trial in view.trials}
    for entry in standings:
        assert entry["state"] == "completed" and entry["steps"] == budget and entry["reports"] == budget
        assert entry["best"] == pytest.approx(score(params[entry["trial"]]["rate"], budget))
        # where its files and its newest checkpoint (checkpoint_every 2) are: the winner's model to load
        directory = trial_dir(storage, spec, entry["trial"]).resolve()
        assert entry["directory"] == str(directory)
        assert entry["checkpoint"] == str(directory / protocol.CHECKPOINTS_DIR / f"step-{budget}")
    bests = [entry["best"] for entry in standings]
    assert bests == sorted(bests, reverse=True)

    plots = hermes("plot", str(storage), "--out", str(tmp_path / "plots"), cwd=tmp_path)
    assert plots.returncode == 0, plots.stderr
    written = [Path(line) for line in plots.stdout.split()]
    assert len(written) == 2
    for png in written:
        assert png.parent == tmp_path / "plots" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The search as a trace: each trial's curve, the time its steps took, and its state's size for the switches.
    traced = hermes("trace", str(storage), "--out", str(tmp_path / "search.csv"), cwd=tmp_path)
    assert traced.returncode == 0 and traced.stderr == "", traced.stderr
    curves = {curve.name: curve for curve in load_trace(tmp_path / "search.csv", "max").trials}
    assert sorted(curves) == sorted(trial.trial_id for trial in view.trials)
    for trial in view.trials:
        curve = curves[trial.trial_id]
        assert curve.metrics == tuple(record.values["score"] for record in grouped[trial.trial_id])
        # each step sleeps; the runs' time holds them all, but a run's first step is the mean of its others,
        # which may exceed it by the steps' jitter
        assert sleep * budget <= sum(curve.seconds) < max(curve.seconds) + sum(
            run.ended_at - run.started_at for run in runs_of(view, trial.trial_id))
        newest = trial_dir(storage, spec, trial.trial_id) / protocol.CHECKPOINTS_DIR / f"step-{budget}"
        assert curve.state_mb == pytest.approx(sum(f.stat().st_size for f in newest.rglob("*") if f.is_file()) / 1e6)
        assert curve.params["rate"] == trial.params["rate"]
    replayed = hermes("simulate", "--trace", str(storage), "--gpus", "2", "--compare", "fifo,hermes", "--seeds", "2",
                      cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert "e2e-small: 6 trials, 2 GPUs" in replayed.stdout


def test_the_log_has_a_line_for_every_trial_that_ends_also_those_stopped_while_they_wait(tmp_path: Path) -> None:
    """ASHA stops trials paused at a rung when the experiment ends: no exit of their own follows, and the log
    (``--no-live``, as in CI) left them out: 12 trials ended, 2 lines."""
    spec = spec_of("asha-log", search=search(8, 3, 0.02), budget={"steps": 9}, policy={"name": "asha"})
    result = run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    stopped = [trial for trial in view.trials if trial.state is TrialState.STOPPED]
    assert stopped, "ASHA stopped nothing: the test needs trials stopped while they wait"
    lines = [line for line in result.stdout.splitlines() if line.startswith("[") and " at step " in line]
    assert len(lines) == len(view.trials), result.stdout
    for trial in stopped:
        assert f"trial {trial.trial_id} stopped at step {trial.step}, score " in result.stdout


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "process-per-run"])
def test_trials_that_keep_no_checkpoint_start_over_after_a_resume_and_complete(tmp_path: Path, warm: bool) -> None:
    """A training loop with nothing registered to checkpoint cannot resume where it stopped: after a resume from
    disk it trains again from step 1. Every step still reaches the store once, and its state is an uninterrupted
    run's (the trial's own sum)."""
    budget = 5
    spec = spec_of(
        "stateless",
        trial={"function": "trials.curve:train", "workdir": str(TESTS), "warm_workers": warm},
        search=search(4, 1, 0.06, stateless={"type": "choice", "values": [True]},
                      implicit_steps={"type": "grid", "values": [False, True]}),  # trial.report(score=...) too
        budget={"steps": budget},
        policy={"name": "rr", "period": 0.2},
    )
    run_ok(write_spec(tmp_path, spec))
    storage = tmp_path / "runs"
    view, decisions = load_view(storage)
    assert any(isinstance(d, Suspend) for d in decisions)
    assert {trial.params["implicit_steps"] for trial in view.trials} == {False, True}
    grouped = metrics_by_trial(view.metrics)
    started_over = 0
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED, trial.error
        assert [record.step for record in grouped[trial.trial_id]] == list(range(1, budget + 1))
        directory = trial_dir(storage, spec, trial.trial_id)
        result_file = json.loads((directory / "result.json").read_text())
        assert result_file["total"] == pytest.approx(sum(score(trial.params["rate"], s) for s in range(1, budget + 1)))
        started_over += "keeps no checkpoint of its state" in (directory / "stderr.log").read_text()
    if not warm:  # every resume of a process per run is from disk
        assert started_over == len({d.trial_id for d in decisions if isinstance(d, Suspend)})
    store = open_store(storage)
    try:
        reported = Counter((event.trial_id, event.step) for event in store.events(view.experiment.experiment_id)
                           if isinstance(event, TrialReported))
    finally:
        store.close()
    assert set(reported.values()) == {1}  # the steps trained again were never reported again


# ---------------------------------------------------------------------- 2. crash recovery
def trial_processes(storage: Path) -> list[int]:
    """Live processes of trials of this storage dir: those whose environment names a trial dir in
    it, and the warm workers that run its function trials."""
    markers = (f"{protocol.ENV_TRIAL_DIR}={storage}{os.sep}".encode(), f"{protocol.ENV_WORKER_OF}={storage}{os.sep}".encode())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state not in ("Z", "X") and any(item.startswith(markers) for item in environ.split(b"\0")):
            pids.append(int(entry.name))
    return pids


def count_reports(database: Path) -> int:
    """Reports recorded so far, read without writing (the runner may be creating the file)."""
    return count_rows(database, "SELECT count(*) FROM metrics")


def count_suspends(database: Path) -> int:
    """Suspend decisions recorded so far, read as ``count_reports`` reads."""
    return count_rows(database, "SELECT count(*) FROM decisions WHERE type = 'Suspend'")


def count_rows(database: Path, query: str) -> int:
    if not database.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1.0)) as connection:
            return connection.execute(query).fetchone()[0]  # (sqlite3's own ``with`` commits, and leaves it open)
    except sqlite3.Error:  # no tables yet
        return 0


def run_until(path: Path, condition: Callable[[], object], what: str, sig: int = signal.SIGINT,
              env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str]:
    """Start ``hermes run`` on ``path`` and send it ``sig`` once ``condition`` holds (within ``timeout`` seconds):
    its exit status and stderr. ``env``: the runner's environment (default: this checkout's hermes)."""
    runner = subprocess.Popen(
        hermes_command("run", str(path), "--no-live"),
        cwd=path.parent, env=env or environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(condition, timeout, what)
        runner.send_signal(sig)
        _, stderr = runner.communicate(timeout=timeout)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    return runner.returncode, stderr


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


@pytest.mark.parametrize("kill_after", [3, 10, 20, 40])  # of 48 reports; by 40 some trials completed
def test_a_runner_killed_at_any_moment_continues_where_it_was(tmp_path: Path, kill_after: int) -> None:
    budget, checkpoint_every = 8, 3  # the budget is no multiple of the interval: the last steps are never saved
    spec = spec_of(
        f"e2e-crash-{kill_after}",
        search=search(6, 2, 0.03),
        budget={"steps": budget},
        policy={"name": "rr", "period": 0.15},
        storage={"dir": "runs", "checkpoint_every": checkpoint_every},
    )
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    database = storage / "hermes.db"

    runner = subprocess.Popen(
        hermes_command("run", str(path), "--no-live"),
        cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # The moment: enough reports recorded, and trial processes running that the kill must take along.
        wait_for(lambda: count_reports(database) >= kill_after and trial_processes(storage), 60, "the moment")
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == -signal.SIGKILL

    # Every trial process died with its runner (PR_SET_PDEATHSIG), so none races the restarted one.
    wait_for(lambda: not trial_processes(storage), 5, "the trial processes of the killed runner to die")

    store = open_store(storage)
    try:
        experiment = pick_experiment(store, None)
        before_metrics = store.metrics(experiment.experiment_id)
        before_trials = trials_by_id(store.trials(experiment.experiment_id))
    finally:
        store.close()
    assert experiment.status is ExperimentStatus.RUNNING  # killed: nobody set anything else
    completed_before = {t for t, record in before_trials.items() if record.state is TrialState.COMPLETED}

    result = run_ok(path)
    assert "(continued)" in result.stdout
    assert " lost: " not in result.stdout  # the dead runner's slots are in the log, but no node of this run was lost

    view, decisions = load_view(storage)
    assert view.experiment.experiment_id == experiment.experiment_id
    assert view.experiment.status is ExperimentStatus.FINISHED
    ids = [trial.trial_id for trial in view.trials]
    assert len(ids) == len(set(ids)) == 6  # no trial twice in the trials table
    # The store's log is append-only: what the first runner recorded is still there, first.
    assert view.metrics[: len(before_metrics)] == before_metrics
    after = metrics_by_trial(view.metrics[len(before_metrics):])
    before = metrics_by_trial(before_metrics)
    assert not completed_before & set(after), "trials completed before the kill ran again"
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED, f"trial {trial.trial_id}: {trial.state} {trial.error}"
        rate = trial.params["rate"]
        steps_before = set(own_steps(before.get(trial.trial_id, [])))
        steps_after = own_steps(after.get(trial.trial_id, []))
        # Every step was reported, and values are what the curve gives at that step.
        assert set(range(1, budget + 1)) == steps_before | set(steps_after), (
            f"trial {trial.trial_id}: reported {sorted(steps_before)} then {steps_after}"
        )
        assert set(steps_after) <= set(range(1, budget + 1)) and steps_after == sorted(steps_after)
        repeated = [step for step in steps_after if step in steps_before]
        assert not repeated, f"trial {trial.trial_id}: steps {repeated} stored twice"  # redone, but stored once
        for record in view.metrics:
            if record.trial_id == trial.trial_id:
                assert record.values["score"] == pytest.approx(score(rate, record.step))
        # Resumed from checkpoints that hold the right state: the running sum is an uninterrupted run's.
        result_file = json.loads((trial_dir(storage, spec, trial.trial_id) / "result.json").read_text())
        assert result_file["total"] == pytest.approx(sum(score(rate, s) for s in range(1, budget + 1)))
    # The trials the first runner had started were resumed, not started again from scratch.
    starts = Counter(d.trial_id for d in decisions if isinstance(d, Start))
    assert all(count == 1 for count in starts.values()) and set(starts) == set(ids)


def test_a_checkpoint_whose_report_the_runner_never_recorded(tmp_path: Path) -> None:
    """The narrowest moment of a crash, made deterministic: a trial has committed the checkpoint
    of step 3 and sent its report, but the runner dies before recording it (the test holds the
    store's write lock meanwhile). The restarted runner resumes the trial from that checkpoint."""
    budget = 5
    spec = spec_of(
        "e2e-unrecorded-checkpoint",
        search=search(1, 0, 0.02, hold_save={"type": "choice", "values": [3]}),
        budget={"steps": budget},
        policy={"name": "fifo", "period": 1.0},
        resources={"gpus": "none", "cpu_slots": 1},
        storage={"dir": "runs", "checkpoint_every": 3},
    )
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    directory = trial_dir(storage, spec, "0")
    runner = subprocess.Popen(
        hermes_command("run", str(path), "--no-live"),
        cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    lock = None
    try:
        wait_for(lambda: (directory / "saving-3").exists(), 60, "the checkpoint of step 3")
        lock = sqlite3.connect(storage / "hermes.db", timeout=10.0, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the runner can record nothing from now on
        (directory / "go-3").touch()
        wait_for(lambda: protocol.latest_checkpoint(directory) is not None, 10, "the checkpoint to be committed")
        time.sleep(0.3)  # the report is sent; the runner waits for the lock
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        if lock is not None:
            lock.execute("ROLLBACK")
            lock.close()
    wait_for(lambda: not trial_processes(storage), 5, "the trial process of the killed runner to die")
    assert protocol.latest_checkpoint(directory) == (directory / "checkpoints" / "step-3", 3)
    view, _ = load_view(storage)
    assert own_steps(view.metrics) == [1, 2]  # report 3 never made it to the store

    run_ok(path)
    view, _ = load_view(storage)
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED]
    steps = own_steps(view.metrics)
    result_file = json.loads((directory / "result.json").read_text())
    rate = view.trials[0].params["rate"]
    assert result_file["total"] == pytest.approx(sum(score(rate, s) for s in range(1, budget + 1)))
    # The checkpoint is ahead of the log: the resumed trial reports step 3 again from the metrics
    # its checkpoint keeps, before training step 4.
    assert steps == [1, 2, 3, 4, 5]


FAULTS = {
    # The runner dies after recording a trial's exit in the log, before rewriting the trial's record.
    "trial-record": "BEFORE UPDATE ON trials WHEN NEW.state = 'completed'",
    # It dies before the log has a report whose checkpoint the trial has already committed.
    "checkpointed-report": "BEFORE INSERT ON events WHEN NEW.type = 'TrialReported' "
                           "AND json_extract(NEW.data, '$.step') = 4",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_runner_that_dies_between_two_of_its_writes_leaves_a_store_its_successor_completes(
    tmp_path: Path, fault: str
) -> None:
    """A fault injected into the store (a trigger that aborts one write) ends the runner; the
    transaction of that event (its metrics, the event, trial records) leaves nothing behind."""

    budget = 5
    spec = spec_of(
        f"e2e-fault-{fault}",
        search=search(2, 0, 0.02),
        budget={"steps": budget},
        policy={"name": "fifo", "period": 1.0},
        resources={"gpus": "none", "cpu_slots": 1},
        storage={"dir": "runs", "checkpoint_every": 2},
    )
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    SqlStore(f"sqlite:///{storage / 'hermes.db'}").close()  # the tables, for the trigger
    with sqlite3.connect(storage / "hermes.db") as connection:
        connection.execute(f"CREATE TRIGGER fault {FAULTS[fault]} BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
    failed = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert failed.returncode == 2 and "injected fault" in failed.stderr, failed.stderr
    assert not trial_processes(storage)
    with sqlite3.connect(storage / "hermes.db") as connection:
        connection.execute("DROP TRIGGER fault")

    result = run_ok(path)
    assert "(continued)" in result.stdout
    view, _ = load_view(storage)
    assert view.experiment.status is ExperimentStatus.FINISHED
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED and trial.step == budget and trial.ended_at is not None
    for trial_id, records in metrics_by_trial(view.metrics).items():
        assert set(own_steps(records)) == set(range(1, budget + 1)), f"trial {trial_id}: {own_steps(records)}"


def test_an_interrupted_run_stops_its_trials_and_continues_when_run_again(tmp_path: Path) -> None:
    spec = spec_of("e2e-interrupt", budget={"steps": 6})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    returncode, stderr = run_until(  # then Ctrl-C
        path, lambda: count_reports(storage / "hermes.db") >= 5 and trial_processes(storage), "5 reports")
    assert returncode == 130, stderr
    assert f"interrupted: run `hermes run {path}` again to continue" in stderr
    assert not trial_processes(storage)  # the runner stopped them before it exited
    view, _ = load_view(storage)
    assert view.experiment.status is ExperimentStatus.INTERRUPTED

    result = run_ok(path)
    assert "e2e-interrupt: finished (continued)" in result.stdout
    view, _ = load_view(storage)
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 6
    for trial_id, records in metrics_by_trial(view.metrics).items():
        assert set(own_steps(records)) == set(range(1, 7)), trial_id


def test_a_rerun_may_change_the_policy_and_continues_from_the_old_ones_decisions(tmp_path: Path) -> None:
    """The log of a time-sharing policy continued by FIFO, as a log that an older Hermes wrote is continued by a newer
    one that decides otherwise: the replay follows the log's decisions, and the new policy decides from there."""
    spec = spec_of("e2e-other-policy", budget={"steps": 6}, policy={"name": "rr", "period": 0.1})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    database = storage / "hermes.db"
    returncode, stderr = run_until(
        path, lambda: count_suspends(database) >= 2 and count_reports(database) >= 8 and trial_processes(storage),
        "suspensions")
    assert returncode == 130, stderr
    _, before = load_view(storage)
    assert sum(isinstance(decision, Suspend) for decision in before) >= 2  # FIFO would not have made them

    write_spec(tmp_path, {**spec, "policy": {"name": "fifo"}})
    result = run_ok(path)
    assert "e2e-other-policy: finished (continued)" in result.stdout
    view, decisions = load_view(storage)
    assert decisions[: len(before)] == before
    assert not any(isinstance(decision, Suspend) for decision in decisions[len(before):])  # FIFO's from there
    assert view.experiment.spec["policy"]["name"] == "fifo"
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 6
    for trial in view.trials:
        assert set(own_steps(metrics_by_trial(view.metrics)[trial.trial_id])) == set(range(1, 7)), trial.trial_id
        result_file = json.loads((trial_dir(storage, spec, trial.trial_id) / "result.json").read_text())
        assert result_file["total"] == pytest.approx(sum(score(trial.params["rate"], s) for s in range(1, 7)))


def test_sigterm_interrupts_a_run_like_ctrl_c(tmp_path: Path) -> None:
    """``kill <runner>`` (a service manager, a batch system): recorded as interrupted, trials stopped."""
    spec = spec_of("e2e-sigterm", budget={"steps": 6})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    returncode, stderr = run_until(
        path, lambda: count_reports(storage / "hermes.db") >= 3 and trial_processes(storage), "3 reports",
        signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM, stderr
    assert f"interrupted: run `hermes run {path}` again to continue" in stderr and "Traceback" not in stderr
    assert not trial_processes(storage)
    status = hermes("status", str(storage), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("experiment  e2e-sigterm (id 1): interrupted\n")
    assert " interrupted, " in status.stdout and " running" not in status.stdout, status.stdout
    assert "GPUs        0 of 2 busy" in status.stdout  # its trials are stopped: they go on from their checkpoints


def test_a_closed_terminal_interrupts_a_run_like_sigterm(tmp_path: Path) -> None:
    """SIGHUP (the terminal or the SSH session closed) ended the runner at once, exit 129, the experiment left
    "running"; it is taken as SIGTERM is, and the live view's writes to the closed terminal (EIO) raise nothing."""
    import pty

    spec = spec_of("e2e-sighup", budget={"steps": 6})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    leader, follower = pty.openpty()
    runner = subprocess.Popen(
        hermes_command("run", str(path)), cwd=tmp_path, env={**environment(), "TERM": "xterm", "COLUMNS": "120"},
        stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, text=True,
    )
    os.close(follower)

    def drained() -> bool:  # the live view's frames, read as a terminal would
        while select.select([leader], [], [], 0)[0] and os.read(leader, 1 << 16):
            pass
        return count_reports(storage / "hermes.db") >= 3 and bool(trial_processes(storage))

    try:
        wait_for(drained, 60, "3 reports")
        os.close(leader)  # the terminal is gone: the runner's writes to it fail
        runner.send_signal(signal.SIGHUP)
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 128 + signal.SIGHUP, stderr
    assert f"interrupted: run `hermes run {path}` again to continue" in stderr and "Traceback" not in stderr
    assert not trial_processes(storage)
    status = hermes("status", str(storage), cwd=tmp_path)
    assert status.stdout.startswith("experiment  e2e-sighup (id 1): interrupted\n"), status.stdout


@pytest.mark.parametrize("how", UNWRITABLE)
def test_a_storage_dir_that_cannot_be_written_is_refused_in_a_line(tmp_path: Path, how: str) -> None:
    """Another user's storage dir, or a read-only mount: the runner lock's OSError was a traceback and exit code 1,
    which is every trial failing."""
    path = write_spec(tmp_path, spec_of("e2e-unwritable"))
    storage = tmp_path / "runs"
    storage.mkdir()
    with unwritable(storage, how) as prefix:
        result = subprocess.run([*prefix, *hermes_command("run", str(path), "--no-live")], check=False,
                                cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    reason = "permission denied" if how == "permission" else "read-only file system"
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"hermes: error: the storage dir {storage} cannot be written ({reason}: "
                             f"{storage / 'hermes.lock'}); give storage.dir a folder this user can write\n")
    assert list(storage.iterdir()) == []  # nothing was written


def test_a_search_of_many_trials_starts_them_while_it_submits_and_takes_sigterm_between_turns(
    tmp_path: Path,
) -> None:
    """Submissions go in by turns of 100, but each turn's last submission asked for the next in the same batch: no
    trial started before all 100,000 were in (14 s here), and SIGTERM waited for them (a million: minutes)."""
    spec = spec_of("e2e-many", search=search(100_000, 0, 0.0), budget={"steps": 1},
                   resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    database = (tmp_path / "runs" / "hermes.db").resolve()
    submitted: list[int] = []

    def reported() -> bool:
        if count_reports(database) == 0:
            return False
        submitted.append(count_rows(database, "SELECT count(*) FROM trials"))
        return True

    started = time.monotonic()
    returncode, stderr = run_until(path, reported, "a report", signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM, stderr
    assert submitted[0] < 100_000 and time.monotonic() - started < 30
    assert count_rows(database, "SELECT count(*) FROM trials") < 100_000


def test_a_run_whose_output_is_closed_is_interrupted_not_failed(tmp_path: Path) -> None:
    """``hermes run spec.yaml | head -1``: the next line printed met a closed pipe, and the experiment was recorded
    failed, without a word. Its reader going away is no fault of the experiment: it is interrupted, and says so."""
    path = write_spec(tmp_path, spec_of("e2e-pipe", budget={"steps": 3}))
    storage = (tmp_path / "runs").resolve()
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().startswith("[")  # the first trial's line
        runner.stdout.close()
        stderr = runner.stderr.read()
        runner.wait(RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 1, stderr
    assert f"interrupted: its output was closed; run `hermes run {path}` again to continue" in stderr, stderr
    assert "Traceback" not in stderr
    view, _ = load_view(storage)
    assert view.experiment.status is ExperimentStatus.INTERRUPTED
    assert not trial_processes(storage)
    assert "(continued)" in run_ok(path).stdout


def test_a_store_deleted_while_the_experiment_runs_is_an_error_not_a_finished_run(tmp_path: Path) -> None:
    """SQLite writes on into a deleted file: the run ended "finished" and exit 0, with every record gone."""
    path = write_spec(tmp_path, spec_of("e2e-deleted", budget={"steps": 4}))
    storage = (tmp_path / "runs").resolve()
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: count_reports(storage / "hermes.db") >= 2, RUN_TIMEOUT, "2 reports")
        for name in ("hermes.db", "hermes.db-wal", "hermes.db-shm"):
            (storage / name).unlink(missing_ok=True)
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 2, stderr
    assert f"hermes: error: {storage / 'hermes.db'} was deleted or replaced while the experiment ran" in stderr
    assert not trial_processes(storage)


def test_reports_of_a_running_experiment_count_its_time_up_to_now(tmp_path: Path) -> None:
    """Elapsed time, a GPU's "for" and a trial's GPU seconds stood still at the last event: a trial in a long
    epoch, or hung, looked as if no time passed. The runner notes its clock in its lock; reports count from it."""
    spec = spec_of("e2e-clock", search=search(1, 0, 0.05, hang_after={"type": "choice", "values": [1]}),
                   resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: count_reports(storage / "hermes.db") >= 1, RUN_TIMEOUT, "the trial's report")
        readings = []
        for pause in (1.0, 0.0):
            status = hermes("status", str(storage), cwd=tmp_path).stdout
            elapsed = next(line for line in status.splitlines() if line.startswith("elapsed"))
            [row] = json.loads(hermes("results", str(storage), "--format", "json", cwd=tmp_path).stdout)
            readings.append((float(elapsed.split()[1].removesuffix("s")), row["gpu_seconds"]))  # under a minute
            time.sleep(pause)
    finally:
        runner.send_signal(signal.SIGINT)
        runner.wait(RUN_TIMEOUT)
    (elapsed_1, gpu_1), (elapsed_2, gpu_2) = readings
    assert 0.8 < elapsed_2 - elapsed_1 < 10 and 0.8 < gpu_2 - gpu_1 < 10, readings


def run_on_a_terminal(path: Path, cwd: Path, columns: int, timeout: float) -> tuple[int | None, str]:
    """``hermes run path`` with a pseudo-terminal for its output (so its live view is drawn): its exit code and
    what it showed."""
    import pty

    leader, follower = pty.openpty()
    runner = subprocess.Popen(
        hermes_command("run", str(path)), cwd=cwd, env={**environment(), "TERM": "xterm", "COLUMNS": str(columns)},
        stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )
    os.close(follower)
    output = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the runner closed the terminal
                break
            if not chunk:
                break
            output += chunk
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        os.close(leader)
    return runner.returncode, output.decode(errors="replace")


def test_the_live_view_runs_on_a_terminal(tmp_path: Path) -> None:
    """Without --no-live on a terminal, the run shows Rich's live view, then the same leaderboard."""
    spec = spec_of("e2e-live", search=search(3, 0, 0.02), budget={"steps": 3})
    returncode, text = run_on_a_terminal(write_spec(tmp_path, spec), tmp_path, 120, RUN_TIMEOUT)
    assert returncode == 0, text
    assert "leaderboard" in text  # the live view was drawn
    assert "e2e-live: finished" in text and "top 3 by best score" in text


# ---------------------------------------------------------------------- 3. a crashing trial
def test_a_trial_that_keeps_crashing_fails_with_its_exit_code_and_stderr_and_the_others_complete(
    tmp_path: Path,
) -> None:
    """Each run of a crashing trial crashes at step 2: it is run again from its checkpoint trial.max_failures times
    (2 by default), then fails with the last crash's reason."""
    budget = 4
    spec = spec_of(
        "e2e-crash-trial",
        search=search(6, 3, 0.03, crash={"type": "grid", "values": ["none", "raise", "exit3"]}),
        budget={"steps": budget},
    )
    result = run_ok(write_spec(tmp_path, spec))
    assert "e2e-crash-trial: finished" in result.stdout
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    grouped = metrics_by_trial(view.metrics)
    assert Counter(trial.params["crash"] for trial in view.trials) == {"none": 2, "raise": 2, "exit3": 2}
    for trial in view.trials:
        crash = trial.params["crash"]
        steps = own_steps(grouped.get(trial.trial_id, []))
        if crash == "none":
            assert trial.state is TrialState.COMPLETED and trial.error is None
            assert steps == list(range(1, budget + 1))
            continue
        assert trial.state is TrialState.FAILED and trial.ended_at is not None
        assert steps == [1]  # it fails at step 2
        error = trial.error or ""
        if crash == "raise":  # in a warm worker: an exception is no process exit
            assert error.startswith("uncaught RuntimeError: ")
            assert "about to fail at step 2" in error
            assert "RuntimeError: synthetic failure at step 2" in error  # the traceback's tail
        else:
            assert error.startswith("exit code 3: ")
            assert "giving up at step 2 with exit code 3\n" in error
        assert error.endswith("(its runs crashed 3 times; trial.max_failures is 2)")
        assert result.stdout.count(f"trial {trial.trial_id} crashed (") == 2
        assert f"trial {trial.trial_id} failed at step 1" in result.stdout


@pytest.mark.parametrize("warm", [True, False])
def test_a_trial_that_crashed_once_runs_again_from_its_checkpoint_and_completes_exactly(
    tmp_path: Path, warm: bool
) -> None:
    """A crash after reports (an exception, an exit code, a dead process: a flaky device, the out-of-memory
    killer) is run again from the last checkpoint, on any slot; the steps past it are trained again but stored
    once, and the running total comes out as an uninterrupted run's. With trial.max_failures 0 it fails."""
    budget, crashes = 5, ["none", "raise", "exit3", "hard"]
    spec = spec_of(
        "e2e-crash-once",
        search=search(4, 3, 0.03, crash={"type": "grid", "values": crashes},
                      crash_step={"type": "choice", "values": [4]}, crash_runs={"type": "choice", "values": [1]}),
        budget={"steps": budget},
        trial={"function": "trials.curve:train", "workdir": str(TESTS), "warm_workers": warm},
    )
    result = run_ok(write_spec(tmp_path, spec))
    view, decisions = load_view(tmp_path / "runs")
    grouped = metrics_by_trial(view.metrics)
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED and trial.error is None, trial
        steps = grouped[trial.trial_id]
        assert own_steps(steps) == list(range(1, budget + 1))
        expected = 0.0
        for step in range(1, budget + 1):
            expected += score(trial.params["rate"], step)
        assert steps[-1].values["total"] == pytest.approx(expected, abs=1e-12)  # resumed from step 2's checkpoint
        crashed = trial.params["crash"] != "none"
        assert result.stdout.count(f"trial {trial.trial_id} crashed (") == crashed
        if crashed:
            assert f"trial {trial.trial_id} crashed" in result.stdout
            assert "it runs again from its last saved checkpoint (or its beginning), catching up to step 2" in result.stdout
            assert sum(isinstance(d, Resume) and d.trial_id == trial.trial_id for d in decisions) >= 1
    status = hermes("status", "runs", cwd=tmp_path).stdout
    assert ", 3 runs again after a crash\n" in status and "errors" not in status
    again = run_ok(tmp_path / "experiment.yaml")  # the log, crashes and all, replays into the finished state
    assert " crashed (" not in again.stdout and load_view(tmp_path / "runs")[0].metrics == view.metrics

    spec["name"], spec["trial"]["max_failures"] = "e2e-crash-once-strict", 0
    spec["storage"]["dir"] = "strict"
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "strict")
    assert "after a crash" not in hermes("status", "strict", cwd=tmp_path).stdout  # 3 crashes, each the last
    states = {trial.params["crash"]: trial.state for trial in view.trials}
    assert states == {"none": TrialState.COMPLETED, "raise": TrialState.FAILED, "exit3": TrialState.FAILED,
                      "hard": TrialState.FAILED}


# ---------------------------------------------------------------------- 4. malformed specs
def _without_metric(spec: dict[str, Any]) -> None:
    del spec["metric"]


def _bad_bound(spec: dict[str, Any]) -> None:
    spec["search"]["space"]["rate"] = {"type": "loguniform", "low": 0.0, "high": 1.0}


def _high_below_low(spec: dict[str, Any]) -> None:
    spec["search"]["space"]["rate"] = {"type": "uniform", "low": 1.0, "high": 0.5}


def _unknown_policy(spec: dict[str, Any]) -> None:
    spec["policy"] = {"name": "no-such-policy", "period": 1.0}


def _unknown_placeholder(spec: dict[str, Any]) -> None:
    spec["trial"] = {"command": f"{sys.executable} trials/printer.py --rate {{rate}} --steps {{steps}}",
                     "metrics_regex": r"score (?P<value>\S+)", "workdir": str(TESTS)}


def _zero_budget(spec: dict[str, Any]) -> None:
    spec["budget"] = {"steps": 0}


def _missing_gpu(spec: dict[str, Any]) -> None:
    spec["resources"] = {"gpus": [99], "cpu_slots": 2}


@pytest.mark.parametrize(
    ("break_spec", "expected"),
    [
        (_without_metric, "metric: required"),
        (_bad_bound, "search.space.rate.low: must be > 0 for loguniform"),
        (_high_below_low, "search.space.rate.high: must be greater than low"),
        (_unknown_policy, "policy.name: unknown policy 'no-such-policy'"),
        (_unknown_placeholder, "trial.command: placeholder {steps} is not in search.space"),
        (_zero_budget, "budget.steps"),
        (_missing_gpu, "resources.gpus: no GPU 99 on this machine"),
    ],
    ids=["no-metric", "loguniform-from-0", "high-below-low", "unknown-policy", "unknown-placeholder",
         "zero-budget", "missing-gpu"],
)
def test_a_malformed_spec_is_refused_before_anything_is_written(
    tmp_path: Path, break_spec: Callable[[dict[str, Any]], None], expected: str
) -> None:
    spec = spec_of("e2e-bad")
    break_spec(spec)
    path = write_spec(tmp_path, spec)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=30)
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("hermes: error: ")
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # no store, no trial dirs: fixing the spec starts afresh
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["experiment.yaml"]


def test_the_fixed_spec_runs_after_a_refused_one(tmp_path: Path) -> None:
    """A spec refused for a missing GPU leaves no experiment behind that the corrected spec would clash with."""
    spec = spec_of("e2e-fixed", search=search(2, 0, 0.0), budget={"steps": 2})
    broken = deepcopy(spec)
    _missing_gpu(broken)
    assert hermes("run", str(write_spec(tmp_path, broken)), "--no-live", cwd=tmp_path, timeout=30).returncode == 2
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2


def test_one_spec_runs_twice_under_two_names(tmp_path: Path) -> None:
    """``--name`` runs a spec as another experiment of the same store, beside the first, which stays as it was."""
    spec = spec_of("e2e-first", search=search(2, 0, 0.0), budget={"steps": 2})
    path = write_spec(tmp_path, spec)
    run_ok(path)
    again = hermes("run", str(path), "--no-live", "--name", "e2e-second", cwd=tmp_path)
    assert again.returncode == 0 and "e2e-second: finished;" in again.stdout, again.stderr
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    experiments = {e.name: e for e in store.experiments()}
    assert set(experiments) == {"e2e-first", "e2e-second"}
    for experiment in experiments.values():
        assert experiment.status is ExperimentStatus.FINISHED and experiment.spec["name"] == experiment.name
        assert [t.state for t in store.trials(experiment.experiment_id)] == [TrialState.COMPLETED] * 2
    store.close()
    assert (tmp_path / "runs" / "e2e-second" / "trials").is_dir()
    listed = hermes("list", "runs", cwd=tmp_path).stdout.splitlines()  # a line each, oldest first
    assert listed[0].split() == ["id", "name", "owner", "status", "trials", "best"]
    assert [line.split()[:5] for line in listed[2:]] == [["1", "e2e-first", "finished", "2", "completed"],
                                                         ["2", "e2e-second", "finished", "2", "completed"]]
    assert all(" score " in line and "(trial " in line for line in listed[2:])
    changed = write_spec(tmp_path, {**spec, "budget": {"steps": 2}, "metric": {"name": "score", "mode": "min"}})
    refused = hermes("run", str(changed), "--no-live", cwd=tmp_path)  # the same name, another spec: says what to do
    assert refused.returncode == 2 and "(differs in metric.mode); give it a new name (hermes run SPEC --name NEW, or hermes.run(spec, name=...))" in (
        refused.stderr)


# ---------------------------------------------------------------------- 5. unmodified programs
PRINTED = r"step (?P<step>\d+) loss (?P<loss>\S+) score (?P<value>\S+)"


def printer_spec(name: str, steps: int, pattern: str = PRINTED, options: str = "") -> dict[str, Any]:
    """Three unmodified programs (tests/trials/printer.py) time-sharing one CPU slot under round robin."""
    return spec_of(
        name,
        trial={
            "command": f"{sys.executable} trials/printer.py --steps {steps} --rate {{rate}} --sleep 0.1 {options}",
            "metrics_regex": pattern,
            "workdir": str(TESTS),
        },
        search={"sampler": "random", "trials": 3, "seed": 4, "space": {"rate": RATE}},
        budget={"steps": steps},
        policy={"name": "rr", "period": 0.2},
        resources={"gpus": "none", "cpu_slots": 1},
    )


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_unmodified_program_is_stopped_and_continued_and_reports_everything(tmp_path: Path, stream: str) -> None:
    """Its metrics are read wherever it prints them: stdout, or stderr (``logging``'s default), kept in its log."""
    steps = 6
    spec = printer_spec("e2e-unmodified", steps, options="--log" if stream == "stderr" else "")
    result = run_ok(write_spec(tmp_path, spec))
    assert "e2e-unmodified: finished" in result.stdout
    storage = tmp_path / "runs"
    view, decisions = load_view(storage)
    grouped = metrics_by_trial(view.metrics)
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED and trial.error is None and trial.step == steps
        own = grouped[trial.trial_id]
        assert own_steps(own) == list(range(1, steps + 1))
        rate = trial.params["rate"]
        assert [record.values["value"] for record in own] == [round(score(rate, s), 4) for s in range(1, steps + 1)]
        assert [record.values["loss"] for record in own] == [round(1 - score(rate, s), 4) for s in range(1, steps + 1)]
        # One process printed every line: it was stopped and continued, never started again.
        lines = (trial_dir(storage, spec, trial.trial_id) / f"{stream}.log").read_text().splitlines()
        assert len(lines) == steps
        assert len({line.rsplit(" pid ", 1)[1] for line in lines}) == 1
    suspended = {d.trial_id for d in decisions if isinstance(d, Suspend)}
    resumes = [d for d in decisions if isinstance(d, Resume)]
    assert suspended, "rr with a short period preempts"
    assert {d.trial_id for d in resumes} == suspended
    assert not any(d.migrated for d in resumes)
    assert all(run.gpu == "local/cpu0" for run in view.runs)
    # While stopped, a program reports nothing: no report lands inside a suspension.
    for trial in view.trials:
        runs = runs_of(view, trial.trial_id)
        gaps = [(a.ended_at, b.started_at) for a, b in pairwise(runs)]
        for record in grouped[trial.trial_id]:
            assert not any(start < record.at < end for start, end in gaps)


def stopped_process(storage: Path) -> int | None:
    """A trial process of ``storage`` that is stopped (SIGSTOP: suspended) after it printed a report, if any."""
    marker = f"{protocol.ENV_TRIAL_DIR}=".encode()
    for pid in trial_processes(storage):
        try:
            stopped = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        directory = next((item[len(marker):].decode() for item in environ if item.startswith(marker)), None)
        if stopped and directory and (Path(directory) / "stdout.log").read_text().strip():
            return pid
    return None


def test_an_unmodified_program_killed_while_suspended_runs_again(tmp_path: Path) -> None:
    """A stopped process keeps its memory, which makes it the out-of-memory killer's likeliest pick; killed, its
    trial failed at once instead of running again as a crash of a running one does (trial.max_failures)."""
    spec = printer_spec("e2e-killed-suspended", 6)
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        victim: list[int] = []
        wait_for(lambda: victim.append(pid) or True if (pid := stopped_process(storage)) else False, 60,
                 "a suspended trial process")
        os.kill(victim[0], signal.SIGKILL)  # stopped, it stays so until killed: SIGCONT would come from the runner
        output, _ = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 0, output
    assert "crashed (exit code -9 (SIGKILL)); crash 1 of trial.max_failures 2" in output
    view, _ = load_view(storage)
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 3, output
    for records in metrics_by_trial(view.metrics).values():
        assert own_steps(records) == list(range(1, 7))


@pytest.mark.parametrize("pattern", [PRINTED, r"loss (?P<loss>\S+) score (?P<value>\S+)"], ids=["step", "no-step"])
def test_unmodified_programs_whose_runner_died_start_again_and_complete(tmp_path: Path, pattern: str) -> None:
    """A stopped program dies with its runner. Run again, each starts from its beginning, and the lines up to the
    step the store holds are caught up, not reported again; without a step group, lines count from its start."""
    steps = 4
    spec = printer_spec("e2e-unmodified-rerun", steps, pattern)
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    database = storage / "hermes.db"
    returncode, stderr = run_until(
        path, lambda: count_suspends(database) >= 2 and count_reports(database) >= 4 and trial_processes(storage),
        "suspensions")
    assert returncode == 130, stderr

    result = run_ok(path)
    assert "e2e-unmodified-rerun: finished (continued)" in result.stdout
    view, _ = load_view(storage)
    grouped = metrics_by_trial(view.metrics)
    started_again = 0
    for trial in view.trials:
        assert trial.state is TrialState.COMPLETED and trial.error is None and trial.step == steps
        own = grouped[trial.trial_id]
        assert set(own_steps(own)) == set(range(1, steps + 1))
        rate = trial.params["rate"]
        assert all(record.values["value"] == round(score(rate, record.step), 4) for record in own)
        lines = (trial_dir(storage, spec, trial.trial_id) / "stdout.log").read_text().splitlines()
        started_again += len({line.rsplit(" pid ", 1)[1] for line in lines}) > 1
    assert started_again  # the trials stopped when the runner died printed from step 1 again, in a new process
    store = open_store(storage)
    try:
        reported = [event for event in store.events(pick_experiment(store, None).experiment_id)
                    if isinstance(event, TrialReported)]
    finally:
        store.close()
    for trial in view.trials:  # the steps the store held were caught up: none reported again, with other numbers
        steps_reported = [event.step for event in reported if event.trial_id == trial.trial_id]
        assert steps_reported == list(range(1, steps + 1)), trial.trial_id


def test_an_unmodified_program_that_prints_rarely_is_preempted_between_its_lines(tmp_path: Path) -> None:
    """Its step takes 1.5 s and the period is 0.3 s: the period ticks let the core suspend it mid-step."""
    spec = spec_of(
        "e2e-unmodified-rare",
        trial={
            "command": f"{sys.executable} trials/printer.py --steps 1 --rate {{rate}} --sleep 1.5",
            "metrics_regex": PRINTED,
            "workdir": str(TESTS),
        },
        search={"sampler": "random", "trials": 2, "seed": 4, "space": {"rate": RATE}},
        budget={"steps": 1},
        policy={"name": "rr", "period": 0.3},
        resources={"gpus": "none", "cpu_slots": 1},
    )
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert all(trial.state is TrialState.COMPLETED for trial in view.trials)
    started_first = min(view.runs, key=lambda run: run.started_at).trial_id
    first_run = runs_of(view, started_first)[0]
    first_report = min(r.at for r in view.metrics if r.trial_id == started_first)
    # It was suspended before it printed anything: a tick, not a report, ended its turn.
    assert first_run.ended_by == "suspended" and first_run.ended_at < first_report


def runs_of(view: ExperimentView, trial_id: str) -> list:
    return [run for run in view.runs if run.trial_id == trial_id]


# ---------------------------------------------------------------------- 6. bad reports
def test_bad_reports_fail_their_trial_or_rank_last_and_never_hang_the_runner(tmp_path: Path) -> None:
    budget = 3
    spec = spec_of(
        "e2e-bad-reports",
        search={
            "sampler": "grid",
            "space": {
                "report": {"type": "grid", "values": ["ok", "nan", "unnamed", "never"]},
                "sleep": {"type": "grid", "values": [0.02]},
            },
        },
        budget={"steps": budget},
    )
    result = run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    by_kind = {trial.params["report"]: trial for trial in view.trials}
    grouped = metrics_by_trial(view.metrics)

    # A report without the objective metric is refused in the trial: it fails and says why.
    unnamed = by_kind["unnamed"]
    assert unnamed.state is TrialState.FAILED
    assert (unnamed.error or "").startswith("uncaught ValueError: ")
    assert "report() must include the objective metric 'score'" in (unnamed.error or "")
    assert unnamed.trial_id not in grouped
    assert f"trial {unnamed.trial_id} failed before its first report" in result.stdout

    # A trial that returns without a single report cannot be ranked: it fails, and says what was missing.
    never = by_kind["never"]
    assert never.state is TrialState.FAILED and never.trial_id not in grouped
    assert (never.error or "").startswith("ended without a report: a function trial calls hermes.trial.report")

    # NaN is a diverged trial: it is recorded as reported, and ranks below every finite value.
    nan = by_kind["nan"]
    assert nan.state is TrialState.COMPLETED
    assert own_steps(grouped[nan.trial_id]) == list(range(1, budget + 1))
    assert all(math.isnan(record.values["score"]) for record in grouped[nan.trial_id])
    assert by_kind["ok"].state is TrialState.COMPLETED

    results = hermes("results", str(tmp_path / "runs"), "--format", "json", cwd=tmp_path)
    assert results.returncode == 0, results.stderr
    standings = json.loads(results.stdout)  # strict JSON: NaN is written as null
    assert [entry["trial"] for entry in standings[:2]] == [by_kind["ok"].trial_id, nan.trial_id]
    assert standings[1]["best"] is None and standings[1]["reports"] == budget
    assert hermes("status", str(tmp_path / "runs"), cwd=tmp_path).returncode == 0


def one_printer(name: str, steps: int, pattern: str, *options: str) -> dict[str, Any]:
    """A spec of one run of tests/trials/printer.py for ``steps`` steps (``options`` added), read with ``pattern``."""
    return spec_of(
        name,
        trial={
            "command": " ".join([sys.executable, "trials/printer.py", "--steps", str(steps), "--sleep", "0.01",
                                 *options]),
            "metrics_regex": pattern,
            "workdir": str(TESTS),
        },
        search={"sampler": "random", "trials": 1, "seed": 0, "space": {"rate": RATE}},
        budget={"steps": steps},
    )


def test_an_unmodified_program_printing_nan_completes(tmp_path: Path) -> None:
    spec = one_printer("e2e-unmodified-nan", 3, PRINTED, "--nan")
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED]
    assert own_steps(view.metrics) == [1, 2, 3]
    assert all(math.isnan(record.values["value"]) for record in view.metrics)


def test_an_unmodified_programs_objective_group_may_carry_the_metrics_name(tmp_path: Path) -> None:
    """``(?P<score>...)`` for the metric ``score``, as naturally as ``(?P<value>...)``: stored under its own name."""
    spec = one_printer("e2e-unmodified-named", 3, r"step (?P<step>\d+) loss (?P<loss>\S+) score (?P<score>\S+)",
                       "--rate", "0.5")
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert own_steps(view.metrics) == [1, 2, 3]
    assert [sorted(record.values) for record in view.metrics] == [["loss", "score"]] * 3
    scores = [record.values["score"] for record in view.metrics]
    assert scores == [pytest.approx(score(0.5, step), abs=1e-4) for step in (1, 2, 3)]


def test_an_unmodified_program_that_trains_past_its_budget_is_stopped_there_and_completes(tmp_path: Path) -> None:
    spec = one_printer("e2e-past-budget", 30, PRINTED, "--sleep", "0.1")  # it trains 30 steps, whatever the budget
    spec["budget"] = {"steps": 3}
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    [trial] = view.trials
    assert trial.state is TrialState.COMPLETED and trial.step == 3  # stopped at its first report past 3, not kept
    assert [record.step for record in view.metrics] == [1, 2, 3]


@pytest.mark.parametrize("how", ["function", "command"])
def test_a_trial_that_reports_past_its_budget_ends_there_completed_without_that_report(tmp_path: Path, how: str) -> None:
    """As Ray Tune's ``training_iteration`` stop: the step past the budget was recorded and ranked ("steps 4/3")."""
    (tmp_path / "overrun.py").write_text(
        "from hermes import trial\n\n\n"
        "def train(config):\n"
        "    for step in range(1, trial.budget() + 4):\n"
        "        trial.report(step, score=step / 10)\n\n\n"
        "if __name__ == '__main__':\n"
        "    train(trial.config())\n"
    )
    section = ({"function": "overrun:train"} if how == "function"
               else {"command": f"{sys.executable} overrun.py"}) | {"workdir": str(tmp_path)}
    spec = spec_of("e2e-overrun", trial=section, budget={"steps": 3},
                   search={"sampler": "random", "trials": 1, "seed": 0, "space": {"rate": RATE}})
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    [trial] = view.trials
    assert trial.state is TrialState.COMPLETED and trial.step == 3 and trial.error is None
    assert [record.step for record in view.metrics] == [1, 2, 3]
    stderr = (trial_dir(tmp_path / "runs", spec, trial.trial_id) / "stderr.log").read_text()
    assert "reported step 4, past its budget of 3 steps" in stderr


def test_an_unmodified_programs_lines_give_their_numbers_and_say_which_group_was_none(tmp_path: Path) -> None:
    """Groups that are not numbers (a phase's name) are left out; an objective or a step that is not a number,
    or a step that no store keeps (a timestamp), is named in the trial's error."""
    worded = one_printer("e2e-words", 3, r"(?P<phase>[a-z]+) (?P<step>\d+) loss (?P<loss>\S+) score (?P<value>\S+)")
    run_ok(write_spec(tmp_path / "worded", worded))
    view, _ = load_view(tmp_path / "worded" / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED]
    assert [sorted(record.values) for record in view.metrics] == [["loss", "value"]] * 3
    for name, pattern, options, error in (
        ("e2e-misread", r"step (?P<step>\d+) (?P<value>loss)", (),
         "ended without a report: lines matched trial.metrics_regex, but its group 'value' read 'loss', not a "
         "number, in the line 'step 1 loss"),
        ("e2e-huge-step", PRINTED, ("--first-step", str(2**40)),
         f"trial.metrics_regex's group 'step' read {2**40} in the line 'step {2**40} loss"),
    ):
        result = hermes("run", str(write_spec(tmp_path / name, one_printer(name, 3, pattern, *options))), "--no-live",
                        cwd=tmp_path / name)
        assert result.returncode == 1 and error in result.stderr, result.stderr
        view, _ = load_view(tmp_path / name / "runs")
        assert [trial.state for trial in view.trials] == [TrialState.FAILED] and error in view.trials[0].error


def test_a_sampler_that_raises_ends_the_experiment_failed_with_its_reason(tmp_path: Path) -> None:
    """Any Optuna sampler may be named, so any may raise: the experiment ends, recorded failed with the reason, its
    trials stopped with what they reported; no traceback, no experiment left looking as if it ran."""
    (tmp_path / "failing_sampler.py").write_text(
        "import optuna\n\n\nclass FailingSampler(optuna.samplers.RandomSampler):\n"
        "    def after_trial(self, study, trial, state, values):\n"
        "        if trial.number == 1:\n"
        "            raise RuntimeError('boom')\n"
    )
    sampler = {"optuna": "failing_sampler.FailingSampler"}
    spec = spec_of("e2e-sampler-fails", search={**search(4, 0, 0.05), "sampler": sampler},
                   budget={"steps": 10})
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    reason = "search.sampler failing_sampler.FailingSampler failed when told trial 1's end: RuntimeError: boom"
    assert result.returncode == 1 and f"hermes: error: {reason}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FAILED and reason in (view.experiment.error or "")
    assert all(trial.state.is_terminal for trial in view.trials) and len(view.trials) == 4
    status = hermes("status", "runs", cwd=tmp_path)
    assert f"error       {reason}" in status.stdout and "0 of 2 busy" in status.stdout, status.stdout
    again = hermes("run", str(tmp_path / "experiment.yaml"), "--no-live", cwd=tmp_path)  # replayed: said as it ended
    assert again.returncode == 1 and f"hermes: error: {reason}" in again.stderr, again.stderr
    assert "e2e-sampler-fails had already ended, so nothing ran" in again.stderr and "failed (continued)" in again.stdout
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FAILED and reason in (view.experiment.error or "")


def test_a_failed_search_run_again_stays_failed(tmp_path: Path) -> None:
    """A sampler that fails proposing a trial past those the spec check asks of it (``CHECK_ASKS``): the search
    fails. Run again, it stays failed, said as its first run said it (exit 1), since nothing was left to run."""
    from hermes.search.optuna_search import CHECK_ASKS

    (tmp_path / "late_ask_fails.py").write_text(
        "import optuna\n\n\nclass LateAskFails(optuna.samplers.RandomSampler):\n"
        "    def sample_independent(self, study, trial, name, distribution):\n"
        f"        if trial.number >= {CHECK_ASKS}:\n"
        "            raise RuntimeError('boom')\n"
        "        return super().sample_independent(study, trial, name, distribution)\n"
    )
    sampler = {"optuna": "late_ask_fails.LateAskFails"}
    spec = spec_of("e2e-second-ask", search={**search(CHECK_ASKS + 1, 0, 0.0), "sampler": sampler},
                   budget={"steps": 2})
    path = write_spec(tmp_path, spec)
    reason = (f"hermes: error: search.sampler late_ask_fails.LateAskFails failed proposing trial {CHECK_ASKS}: "
              "RuntimeError: boom")
    first = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert first.returncode == 1 and reason in first.stderr, first.stderr
    again = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert again.returncode == 1 and reason in again.stderr, again.stderr
    assert again.stdout.startswith("e2e-second-ask: failed (continued)"), again.stdout
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FAILED


def test_a_run_whose_every_trial_failed_exits_with_code_1_and_the_first_error(tmp_path: Path) -> None:
    """A broken training script fails CI: the experiment is recorded as finished, but the command says what went
    wrong and exits with 1 (a run with some trials completed exits with 0)."""
    spec = spec_of("e2e-all-failed", search=search(3, 0, 0.01, crash={"type": "choice", "values": ["raise"]},
                                                   crash_step={"type": "choice", "values": [1]}))
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "hermes: error: every trial failed; trial 0: uncaught RuntimeError: synthetic failure at step 1" in (
        result.stderr)
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert [trial.state for trial in view.trials] == [TrialState.FAILED] * 3


def test_a_printed_line_whose_objective_group_did_not_match_is_no_report(tmp_path: Path) -> None:
    """An optional ``value`` group: lines where it is missing are skipped, not a protocol error that fails the trial."""
    spec = one_printer("e2e-unmodified-optional", 4,
                       r"step (?P<step>\d+) loss (?P<loss>\S+) score (?P<value>0\.[0-6]\d*)?",  # 0.39, 0.63
                       "--rate", "0.5")
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert own_steps(view.metrics) == [1, 2]
    values = [record.values["value"] for record in view.metrics]
    assert values == [pytest.approx(score(0.5, step), abs=1e-4) for step in (1, 2)]


def test_a_program_whose_lines_never_match_fails_saying_what_to_fix_in_full(tmp_path: Path) -> None:
    spec = one_printer("e2e-unmodified-unmatched", 2, r"epoch (?P<step>\d+) acc (?P<value>\S+)")
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 1
    assert f"hermes: error: every trial failed; trial 0: {NO_REPORT}\n" in result.stderr  # not cut short


def test_a_report_that_lacks_the_objective_on_the_wire_fails_its_trial(tmp_path: Path) -> None:
    """A program that speaks the protocol itself (not through hermes.trial) and omits the objective."""
    spec = spec_of(
        "e2e-raw-report",
        trial={"command": f"{sys.executable} trials/raw.py", "workdir": str(TESTS)},
        search=search(1, 0, 0.0),
        budget={"steps": 2},
    )
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 1 and "every trial failed" in result.stderr  # its only trial
    view, _ = load_view(tmp_path / "runs")
    (trial,) = view.trials
    assert trial.state is TrialState.FAILED and not view.metrics
    assert (trial.error or "").startswith("protocol error: ")
    assert "report of step 1 lacks the objective metric 'score'" in (trial.error or "")
    assert "failed before its first report (protocol error" in result.stdout


# ---------------------------------------------------------------------- 7. TPE: trials proposed as results arrive
def test_tpe_proposes_trials_as_others_finish_and_a_rerun_continues_the_same_study(tmp_path: Path) -> None:
    """With Optuna's TPE, a few trials per slot are in flight and each finished one is told to the
    sampler before the next is asked for; a second run of the finished experiment replays the same
    asks and tells and changes nothing."""
    trials = 10
    search_tpe = search(trials, 3, 0.01)
    search_tpe["sampler"] = "tpe"
    spec = spec_of("e2e-tpe", search=search_tpe, budget={"steps": 3}, resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    result = run_ok(path)
    assert "study created" not in result.stderr  # Hermes's study is no news to its user
    view, _ = load_view(tmp_path / "runs")
    assert len(view.trials) == trials
    assert all(trial.state is TrialState.COMPLETED for trial in view.trials)
    # 4 trials per slot in flight: the 5th is submitted only after the 1st ended.
    submitted = sorted(trial.submitted_at for trial in view.trials)
    first_end = min(trial.ended_at for trial in view.trials)
    assert submitted[3] < first_end <= submitted[4]
    again = run_ok(path)
    assert "(continued)" in again.stdout
    assert load_view(tmp_path / "runs")[0].metrics == view.metrics


TOLD_SEARCHER = """
from hermes.search import BaseSearcher


class Told(BaseSearcher):
    '''Each proposal says how many reports and ends the searcher had been told when asked.'''

    def __init__(self, search, *, max_pending=None):
        super().__init__(max_pending=max_pending)
        self.told = 0

    def _propose(self, index):
        return {'rate': 0.2 + 0.001 * self.told, 'sleep': 0.0}

    def _report(self, index, step, value):
        self.told += 1

    def _end(self, index, value, stopped):
        self.told += 1
"""


def test_a_learning_searcher_is_asked_where_the_log_holds_its_submissions(tmp_path: Path) -> None:
    """A rerun replays the log into a fresh searcher and asks it where each submission lies in the log; live,
    it must have been asked at that same point. A searcher of one's own whose every proposal says how many
    reports and ends it had been told: trials that end together (one batch of events) once got their
    submissions logged after the rest of the batch, and the rerun refused the experiment as changed."""
    (tmp_path / "told_searcher.py").write_text(TOLD_SEARCHER)
    told = {**search(24, 0, 0.0), "sampler": "told_searcher:Told", "max_pending": 4}
    spec = spec_of("e2e-told", search=told, budget={"steps": 2}, resources={"gpus": "none", "cpu_slots": 4},
                   policy={"name": "fifo"})
    path = write_spec(tmp_path, spec)
    run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    assert len({trial.params["rate"] for trial in view.trials}) > 12  # its proposals did follow what it was told
    write_spec(tmp_path, {**spec, "search": {**told, "trials": 25}})  # extended: the searcher must go on from the log
    again = run_ok(path)
    assert "(continued)" in again.stdout


def test_optuna_is_told_that_a_trial_which_crashed_after_reporting_failed(tmp_path: Path) -> None:
    """Its partial best is no result: told COMPLETE, it could become the study's best trial."""
    crashing = {**search(3, 0, 0.01, crash={"type": "choice", "values": ["raise"]}), "sampler": "tpe"}
    trial_section = {"function": "trials.curve:train", "workdir": str(TESTS), "max_failures": 0}
    spec = spec_of("e2e-tpe-crash", search=crashing, trial=trial_section, budget={"steps": 4})
    session = ExperimentSession(load_spec(write_spec(tmp_path, spec)))
    session.run()
    view, _ = load_view(tmp_path / "runs")
    assert all(trial.state is TrialState.FAILED for trial in view.trials) and view.metrics  # it reported first
    study = session.searcher.study  # type: ignore[attr-defined]
    assert [trial.state.name for trial in study.trials] == ["FAIL"] * 3


def test_parked_trials_hold_no_open_files_in_their_worker(tmp_path: Path) -> None:
    """Each parked trial kept its stdout.log and stderr.log open: a worker of a thousand trials under round robin
    ran out of descriptors (EMFILE at the usual limit of 1024), and trials failed. Here the limit is 64, and more
    trials than that are parked at once."""
    import resource

    trials = 80  # each suspended at its first report (its step takes twice the turn), all 80 parked at once
    spec = spec_of("e2e-many-parked", search=search(trials, 0, 0.01), budget={"steps": 2},
                   policy={"name": "rr", "period": 0.005}, resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    result = subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=RUN_TIMEOUT, preexec_fn=limit_files)
    assert result.returncode == 0, result.stdout + result.stderr
    view, decisions = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * trials
    assert sum(isinstance(decision, Suspend) for decision in decisions) > 64  # many parked at once


def test_a_trial_whose_checkpoint_cannot_be_written_to_move_it_fails_alone(tmp_path: Path) -> None:
    """A parked trial resumed on another slot is spilled to disk first; when its saver raised, the trial still
    started on the new slot while its crash was reported, so the core gave that slot to another trial as well, and
    the whole run ended ("cannot run trial 1 on local/cpu1: trial 0 holds it"), recorded failed."""
    (tmp_path / "unsaveable.py").write_text(
        "import time\n\nfrom hermes import trial\n\n\n"
        "def save(directory):\n"
        "    raise ValueError('cannot save')\n\n\n"
        "def train(config):\n"
        "    saver = trial.Files(save, lambda directory: None)\n"
        "    for step in range(saver.restore(), trial.budget()):\n"
        "        time.sleep(0.02)\n"
        "        trial.report(step + 1, loss=config['x'] / (step + 1))\n"
    )
    spec = spec_of("e2e-unsaveable", trial={"function": "unsaveable:train", "workdir": str(tmp_path)},
                   search={"configs": [{"x": 1.0}, {"x": 2.0}, {"x": 3.0}]}, metric={"name": "loss", "mode": "min"},
                   budget={"steps": 40}, policy={"name": "rr", "period": 0.1},
                   storage={"dir": "runs", "checkpoint_every": 1000})
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode in (0, 1) and "holds it" not in result.stderr, result.stdout + result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert all(trial.state.is_terminal for trial in view.trials)
    assert any("cannot save" in (trial.error or "") for trial in view.trials)  # a move was tried, and failed


# ---------------------------------------------------------------------- 8. budgets: time, and a rerun that extends
def test_a_time_budget_ends_the_experiment_cleanly(tmp_path: Path) -> None:
    """``max_time`` reached: no new trial is asked, the running ones are stopped, and the run ends
    finished with every trial terminal, in about that time."""
    long_search = search(40, 1, 0.2)
    long_search["max_time"] = 2
    spec = spec_of("e2e-time", search=long_search, budget={"steps": 50})
    path = write_spec(tmp_path, spec)
    started = time.monotonic()
    result = run_ok(path)
    took = time.monotonic() - started
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED, result.stdout
    assert all(trial.state.is_terminal for trial in view.trials)
    assert any(trial.state is TrialState.STOPPED for trial in view.trials)
    assert max(trial.ended_at for trial in view.trials) < 2 + 2.0  # stopped at its next step, not hours later
    assert took < 30
    why = "its budget of time or GPU hours is spent"  # said where it ends and in its status, not a plain "finished"
    assert f"e2e-time: finished: {why}; " in result.stdout
    assert f"e2e-time (id 1): finished ({why})\n" in hermes("status", "runs", cwd=tmp_path).stdout
    assert " stopped before its first report\n" in result.stdout and " stopped at step 0" not in result.stdout


def test_a_rerun_with_a_larger_trial_budget_extends_the_experiment(tmp_path: Path) -> None:
    """The first run's node is lost before submissions reopen: a new trial started on it (the same slot's
    name, another run) was resumed while it ran, and counted as crashed ("the trial ended: suspended")."""
    spec = spec_of("e2e-extend", search=search(3, 2, 0.01), budget={"steps": 2})
    path = write_spec(tmp_path, spec)
    run_ok(path)
    first, _ = load_view(tmp_path / "runs")
    assert len(first.trials) == 3
    spec["search"]["trials"] = 11
    write_spec(tmp_path, spec)
    again = run_ok(path)
    assert "(continued)" in again.stdout and " crashed (" not in again.stdout
    store = open_store(tmp_path / "runs")
    try:
        kinds = [type(event).__name__ for event in store.events(pick_experiment(store, None).experiment_id)]
    finally:
        store.close()
    assert kinds.index("NodeRemoved") < kinds.index("SubmissionsReopened") < kinds.index("NodeAdded", kinds.index(
        "NodeRemoved"))
    extended, _ = load_view(tmp_path / "runs")
    assert len(extended.trials) == 11 and all(t.state is TrialState.COMPLETED for t in extended.trials)
    assert [t.trial_id for t in extended.trials] == [str(index) for index in range(11)]  # not 0-2, then 03-10
    assert [t.params for t in extended.trials[:3]] == [t.params for t in first.trials]  # the first three kept
    kept = {m.trial_id: m for m in first.metrics}
    assert all(m == kept[m.trial_id] for m in extended.metrics if m.trial_id in kept and m.step == kept[m.trial_id].step)
    assert "e2e-extend: finished (continued)" in run_ok(path).stdout  # its log, a finished core's lost node too, replays
    spec["search"]["seed"] = 9  # anything but the budget is still refused
    write_spec(tmp_path, spec)
    refused = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert refused.returncode == 2 and "search.seed" in refused.stderr


@pytest.mark.parametrize(
    ("statement", "record"),
    [("UPDATE events SET data = '{\"trial\": ' WHERE seq = (SELECT MAX(seq) FROM events WHERE type = 'TrialReported')",
      "table events, row with experiment_id 1, seq {seq}: column data is not valid JSON (Expecting value"),
     ("UPDATE metrics SET metric_values = '{\"score\": \"abc\"}' WHERE id = 3",
      "table metrics, row with experiment_id 1, id 3: column metric_values holds 'abc' for metric 'score', not a number")],
    ids=["event", "metrics"],
)
def test_a_damaged_record_stops_a_rerun_before_anything_runs_naming_it_as_status_does(
    tmp_path: Path, statement: str, record: str
) -> None:
    """A killed run's store with a record cut short, or a metric that is no number: the rerun says which record
    is damaged, as ``hermes status`` does (exit 2, no traceback), before any trial runs; it does not crash with a
    JSONDecodeError, nor run the whole experiment to crash at its end, and it leaves the experiment as it was."""
    spec = spec_of(f"e2e-damaged-{'event' if 'events' in statement else 'metrics'}", search=search(2, 0, 0.05))
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    database = storage / "hermes.db"
    returncode, _ = run_until(path, lambda: count_reports(database) >= 4 and trial_processes(storage), "4 reports",
                              signal.SIGKILL)
    assert returncode == -signal.SIGKILL
    wait_for(lambda: not trial_processes(storage), 5, "the trial processes of the killed runner to die")
    with sqlite3.connect(database) as connection:
        seq = connection.execute("SELECT MAX(seq) FROM events WHERE type = 'TrialReported'").fetchone()[0]
        connection.execute(statement)
    connection.close()
    counts = lambda: [count_rows(database, f"SELECT count(*) FROM {table}") for table in ("events", "metrics")]
    before = counts()
    logs = {log: log.stat().st_size for log in (storage / spec["name"] / "trials").glob("*/stderr.log")}

    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"hermes: error: {database} has a damaged record: {record.format(seq=seq)}")
    assert "the experiment cannot continue from it" in result.stderr and "Traceback" not in result.stderr
    assert counts() == before  # nothing ran: no event, no report
    assert {log: log.stat().st_size for log in logs} == logs
    status = hermes("status", str(storage), cwd=tmp_path)
    assert status.returncode == 2
    assert status.stderr.startswith(f"hermes: error: {database} has a damaged record: {record.format(seq=seq)}")
    row = count_rows(database, "SELECT count(*) FROM experiments WHERE status = 'running'")
    assert row == 1  # as the killed run left it


def test_asha_with_a_cap_on_trials_in_flight_asks_for_more_when_every_one_waits_at_a_rung(tmp_path: Path) -> None:
    """A learning searcher keeps a few trials in flight (``max_pending``); ASHA pauses each at its rung until
    others reach it. Every trial in flight paused, none was asked for, and the run ended "the executor has nothing
    left to report but the experiment is unfinished" (TPE with ASHA, Ray Tune's and Optuna's usual pair)."""
    space = search(9, 0, 0.01)
    spec = spec_of("asha-capped", search={**space, "max_pending": 3}, budget={"steps": 9}, policy={"name": "asha"},
                   resources={"gpus": "none", "cpu_slots": 1})
    run_ok(write_spec(tmp_path, spec))
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED and len(view.trials) == 9
    assert sum(trial.state is TrialState.COMPLETED for trial in view.trials) == 1  # 9 -> 3 -> 1, as ASHA promotes


def test_a_run_that_fails_on_an_error_of_its_own_records_what_it_was(tmp_path: Path) -> None:
    """Stored failed with no reason: `hermes status` said "failed", and nothing more."""
    from hermes.experiment import parse_spec

    def broken(event: object, _decisions: object) -> None:
        if isinstance(event, TrialReported):
            raise RuntimeError("a listener's bug")

    spec = parse_spec(spec_of("broken", search=search(1, 0, 0.01)), base_dir=tmp_path)
    session = ExperimentSession(spec, listeners=[broken])
    with pytest.raises(RuntimeError, match="a listener's bug"):
        session.run()
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FAILED
    assert view.experiment.error == "RuntimeError: a listener's bug"
    status = hermes("status", "runs", cwd=tmp_path)
    assert "error       RuntimeError: a listener's bug" in status.stdout, status.stdout


def test_a_learning_searcher_keeps_more_trials_in_flight_when_gpus_join(tmp_path: Path) -> None:
    """TPE keeps 4 trials per slot in flight, counted from the slots the engine had at the start: a Ray node that
    joined later with 6 GPUs got 4 trials, and 2 of its GPUs stayed idle for the whole run. Driven as a pool or
    a runner drives a session: the core's events, then what the searcher may submit after each."""
    from hermes.core.events import NodeAdded
    from hermes.experiment import parse_spec
    from hermes.local import LocalExecutor, local_slots

    space = {"rate": RATE}
    spec = parse_spec(spec_of("grow", search={"sampler": "tpe", "trials": 40, "seed": 0, "space": space},
                              resources={"gpus": "none", "cpu_slots": 1}), base_dir=tmp_path)
    session = ExperimentSession(spec)
    session.replay()
    with LocalExecutor(tmp_path / "work", slots=local_slots(cpu_slots=1), metric="score") as executor:
        session.host(executor, lambda event: None)
        submitted = []

        def handle(event: object) -> None:
            decisions = session.scheduler.handle(event)
            session.after(event, decisions)
            for submission in session.submissions(event.at):
                submitted.append(submission)
                handle(submission)

        handle(NodeAdded(0.0, "first", ("first/gpu0",)))
        assert len(submitted) == 4  # 4 per slot
        handle(NodeAdded(1.0, "joined", tuple(f"joined/gpu{i}" for i in range(6))))
        assert len(submitted) == 4 * 7
    session.store.close()


def test_a_ctrl_c_that_comes_twice_records_the_run_interrupted(tmp_path: Path) -> None:
    """GNU timeout, and a terminal under a wrapper that passes signals on, send SIGINT to the runner and then to its
    group: the second came while the run recorded its end, and left it "running when its runner ended without a
    word (killed?)" in 5 runs of 6."""
    path = write_spec(tmp_path, spec_of("twice", search=search(4, 0, 0.05), budget={"steps": 40},
                                        policy={"name": "rr", "period": 0.2},
                                        resources={"gpus": "none", "cpu_slots": 1}))
    database = tmp_path / "runs" / "hermes.db"
    for apart in (0.0, 0.005, 0.02, 0.05):  # the second while the run records its end, at one of these
        before = count_reports(database)  # each run reports more, from where the last one stopped
        runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            wait_for(lambda: count_reports(database) >= before + 3, RUN_TIMEOUT, "reports")
            os.kill(runner.pid, signal.SIGINT)
            time.sleep(apart)
            os.killpg(runner.pid, signal.SIGINT)  # the runner's group: itself again
            _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.communicate()
        assert runner.returncode in (130, -signal.SIGINT), stderr  # one that came once the run ended: Python's exit
        view, _ = load_view(tmp_path / "runs")
        assert view.experiment.status is ExperimentStatus.INTERRUPTED, (apart, stderr)


SHIFTING_SEARCHER = """
from hermes.search import BaseSearcher


class Shifting(BaseSearcher):
    '''Proposes rate {rate} for every trial: a searcher whose code changes between two runs.'''

    learns = False

    def __init__(self, search, *, max_pending=None):
        super().__init__(max_pending=max_pending)

    def _propose(self, index):
        return {{'rate': {rate}, 'sleep': 0.0}}
"""


def test_a_finished_search_whose_searcher_proposes_otherwise_now_is_shown_as_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished experiment recorded by an older Hermes, whose searcher proposes otherwise now (before 2026-12-06
    Optuna was told COMPLETE for a trial that reported only NaN, now FAIL; here the searcher's code changed), was
    refused unchanged, "the store's trial 3 does not match what the searcher proposes now; was the spec or the code
    of the searcher changed?", though it needs no more proposals. Extended, it needs them: refused, saying why and
    what to do."""
    from hermes.tuning import run

    searcher = tmp_path / "shifting.py"
    searcher.write_text(SHIFTING_SEARCHER.format(rate=0.3))
    spec = spec_of("shifted", search={**search(2, 0, 0.0), "sampler": "shifting:Shifting"}, budget={"steps": 2})
    path = write_spec(tmp_path, spec)
    run_ok(path)
    searcher.write_text(SHIFTING_SEARCHER.format(rate=0.45))  # another length: no stale bytecode

    again = run_ok(path)
    assert "shifted: finished (continued)" in again.stdout and "shifted: top 2 by best score" in again.stdout
    monkeypatch.syspath_prepend(str(tmp_path))  # as `hermes run` finds it: in its working directory
    assert run(path).status == "finished"

    write_spec(tmp_path, {**spec, "search": {**spec["search"], "trials": 3}})
    extended = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert extended.returncode == 2, extended.stderr
    assert ("hermes: error: the store's trial 0 was proposed as {'rate': 0.3, 'sleep': 0.0} but the searcher "
            "proposes {'rate': 0.45, 'sleep': 0.0} now: the spec's search, the searcher's code or the Hermes that "
            "recorded it differs") in extended.stderr
    assert "run it under a new name (--name NEW: it starts over)" in extended.stderr
    assert len(load_view(tmp_path / "runs")[0].trials) == 2


def test_a_spec_that_an_older_hermes_read_otherwise_is_refused_saying_so(tmp_path: Path) -> None:
    """An older Hermes read the spec with YAML 1.1, where `010` is 8: run unchanged, the spec was refused as one
    "with a different spec", which its user never edited."""
    width = {"type": "choice", "values": [8]}  # as YAML 1.1 read 010
    spec = spec_of("octal", search=search(1, 0, 0.0, width=width), budget={"steps": 1})
    path = write_spec(tmp_path, spec)
    run_ok(path)
    path.write_text(path.read_text().replace("- 8", "- 010"))  # the same text, as the user wrote it
    assert "- 010" in path.read_text()

    refused = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert refused.returncode == 2
    assert "(differs in search.space.width.values); give it a new name" in refused.stderr
    assert ("a spec not edited since may have been read differently by the Hermes that recorded it (YAML 1.1: "
            "010, 1e-4, yes/no/on/off)") in refused.stderr
