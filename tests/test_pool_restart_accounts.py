"""The pool's fair-share accounts against its GPU timeline, across a stop by SIGTERM and a restart.

The accounts (GPU seconds used, ``store.save_accounts``, ``pool.shares()``, the server's ``/api/cluster``) must say
what the timeline shows each experiment held. They were charged only when the pool core was called (an event), and
saved at each look at the store: the stretch since the last event was missing while an epoch ran, and the last one
for good once the experiment finished. A stop recorded nothing, so the runs it interrupted ended, once the next pool
took them up, at the store's last event: the GPU time after their last report was in neither. Real trial processes
(tests/trials/curve.py), a real SQLite store, a real SIGTERM of a real pool process (``python -m hermes.pool``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore
from tests.test_pool import TIMEOUT, pool_spec, rerun_pool, running, status, submit
from tests.test_run import environment, wait_for

STEP = 0.6  # seconds a step of the trial takes
POLL = 0.1  # seconds between the pool's looks at the store


def held(store: SqlStore, experiment_id: int) -> float:
    """GPU seconds the experiment's runs held, by its timeline."""
    return sum(run.ended_at - run.started_at for run in store.runs(experiment_id) if run.ended_at is not None)


def test_the_accounts_follow_a_running_epoch_and_keep_its_last_one(tmp_path: Path) -> None:
    """While a step runs, the shares count its GPU time within a poll, not from its report on; once the experiment
    finishes, its saved accounts hold every run, the last one included."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    experiment_id = submit(store, pool_spec("epochs", 1, STEP, budget=3))
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=POLL)
    with running(pool):
        wait_for(lambda: store.runs(experiment_id), TIMEOUT, "its trial to start")
        time.sleep(STEP / 2 + 3 * POLL)  # into its first step, which has not reported yet
        assert not store.metrics(experiment_id)
        [share] = pool.shares()
        assert share.gpus == 1
        started = store.runs(experiment_id)[0].started_at
        assert share.used_gpu_seconds == pytest.approx(pool.executor.now() - started, abs=2 * POLL + 0.05)
        wait_for(lambda: status(store, experiment_id) is ExperimentStatus.FINISHED, TIMEOUT, "it to finish")
    assert store.experiment(experiment_id).gpu_seconds_used == pytest.approx(held(store, experiment_id), abs=0.02)
    store.close()


def test_a_sigterm_ends_the_runs_at_the_stop_and_the_accounts_agree_after_the_restart(tmp_path: Path) -> None:
    """SIGTERM 0.4 s after the trial's first report: its run ends when the pool stopped (not at that report), the
    saved accounts hold it up to there, and the next pool's run starts after it; once the experiment finished, the
    accounts hold every run the timeline shows."""
    database = tmp_path / "pool.db"
    store = SqlStore(f"sqlite:///{database}")
    experiment_id = submit(store, pool_spec("stopped", 1, STEP, budget=2))
    command = [sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{database}", "--dir", str(tmp_path),
               "--cpu-slots", "1", "--poll", str(POLL)]
    pool = subprocess.Popen(command, cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: store.metrics(experiment_id), TIMEOUT, "its first report")
        time.sleep(0.4)
        pool.send_signal(signal.SIGTERM)
        _, stderr = pool.communicate(timeout=60)
    finally:
        if pool.poll() is None:
            pool.kill()
            pool.wait()
    assert pool.returncode == 0, stderr
    assert status(store, experiment_id) is ExperimentStatus.INTERRUPTED
    reported = store.metrics(experiment_id)[-1].at
    [run] = store.runs(experiment_id)
    assert run.ended_by == "lost" and run.ended_at is not None and run.ended_at >= reported + 0.35
    assert store.latest_event_at() == run.ended_at  # the next pool's clock starts there
    assert store.experiment(experiment_id).gpu_seconds_used == pytest.approx(held(store, experiment_id), abs=0.02)

    rerun_pool(command, environment(), tmp_path, store, [experiment_id], TIMEOUT)
    first, *after = sorted(store.runs(experiment_id), key=lambda run: run.started_at)
    assert first == run and after and after[0].started_at >= run.ended_at  # old and new runs never overlap
    assert store.experiment(experiment_id).gpu_seconds_used == pytest.approx(held(store, experiment_id), abs=0.02)
    store.close()
