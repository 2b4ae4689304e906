"""`hermes results --format csv|json` and `hermes trace` of a pool's experiments, read from the folder of the pool's
store: each trial's directory and checkpoint come from the experiment's own storage.dir (a server stores it
resolved), not from the store's folder, where only `hermes run` keeps them; they came out empty, and the trace had
no state_mb, so `hermes simulate` replayed it with its default state size. A relative storage.dir, which is relative
to the pool's folder that the store does not name, gives no path rather than a wrong one.

A real pool (as `hermes server` runs it) with real trial processes (tests/trials/curve.py), a real SQLite store, and
the real `hermes` command.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore
from tests.test_pool import kill_pool, pool_spec, running, status, submit
from tests.test_run import count_reports, environment, wait_for

TIMEOUT = 60
STEPS = 3


def hermes(*arguments: str, cwd: Path) -> str:
    ended = subprocess.run([sys.executable, "-m", "hermes.cli", *arguments], check=False, cwd=cwd, env=environment(),
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert ended.returncode == 0, ended.stderr
    return ended.stdout


def test_a_pools_results_and_trace_find_the_trials_files_in_the_experiments_storage_dir(tmp_path: Path) -> None:
    root, area = tmp_path / "root", tmp_path / "pool" / "area"  # the store, and the files of one in the pool's folder
    root.mkdir()
    store = SqlStore(f"sqlite:///{root}/hermes.db")
    pool = PoolSession(store, tmp_path / "pool", resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    absolute = submit(store, pool_spec("absolute", 2, 0.01, budget=STEPS,
                                       storage={"dir": str(area / "runs"), "checkpoint_every": 1}))
    relative = submit(store, pool_spec("relative", 1, 0.01, budget=STEPS,
                                       storage={"dir": "runs", "checkpoint_every": 1}))
    with running(pool):
        for experiment_id in (absolute, relative):
            wait_for(lambda i=experiment_id: status(store, i).is_final, TIMEOUT, "the pool to run it")
            assert status(store, experiment_id) is ExperimentStatus.FINISHED, store.experiment(experiment_id).error
    store.close()

    rows = list(csv.DictReader(io.StringIO(hermes("results", str(root), "--experiment", "ann/absolute",
                                                  "--format", "csv", cwd=tmp_path))))
    entries = json.loads(hermes("results", str(root), "--experiment", "ann/absolute", "--format", "json",
                                cwd=tmp_path))
    assert sorted(row["trial"] for row in rows) == ["0", "1"], rows
    for row, entry in zip(rows, entries, strict=True):
        trial_dir = area / "runs" / "absolute" / "trials" / row["trial"]
        assert row["directory"] == entry["directory"] == str(trial_dir), row
        assert row["checkpoint"] == entry["checkpoint"], (row, entry)
        assert Path(row["checkpoint"]).parent == trial_dir / "checkpoints" and Path(row["checkpoint"]).is_dir(), row
    trace = list(csv.DictReader(io.StringIO(hermes("trace", str(root), "--experiment", "ann/absolute",
                                                   cwd=tmp_path))))
    assert len(trace) == 2 * STEPS and all(float(line["state_mb"]) > 0 for line in trace), trace

    # its files lie in tmp_path/pool/runs/relative: not looked for in the store's folder, never a wrong path, not
    # even that of a `hermes run` experiment of the name beside the store (another experiment's checkpoints)
    assert (tmp_path / "pool" / "runs" / "relative" / "trials" / "0").is_dir()
    (root / "relative" / "trials" / "0" / "checkpoints" / "step-1").mkdir(parents=True)
    [row] = csv.DictReader(io.StringIO(hermes("results", str(root), "--experiment", "ann/relative", "--format", "csv",
                                              cwd=tmp_path)))
    assert row["directory"] == row["checkpoint"] == "", row
    assert "state_mb" not in hermes("trace", str(root), "--experiment", "ann/relative", cwd=tmp_path).splitlines()[0]


def test_a_killed_pools_experiment_with_its_own_storage_dir_shows_its_trials_interrupted(tmp_path: Path) -> None:
    """The pool's lock lies beside the store, not in the experiment's storage.dir: once its files were looked for
    there, a killed pool's trials showed running, as no lock said otherwise."""
    database = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{database}")
    submit(store, pool_spec("long", 2, 0.05, budget=400,
                            storage={"dir": str(tmp_path / "area"), "checkpoint_every": 1}))
    command = [sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{database}", "--dir", str(tmp_path),
               "--cpu-slots", "2", "--poll", "0.1"]
    kill_pool(command, environment(), tmp_path, lambda: count_reports(database) >= 4, TIMEOUT)
    assert store.experiments()[0].status is ExperimentStatus.RUNNING
    store.close()
    rows = list(csv.DictReader(io.StringIO(hermes("results", str(tmp_path), "--format", "csv", cwd=tmp_path))))
    assert [row["state"] for row in rows] == ["interrupted"] * 2, rows
    assert all(row["directory"].startswith(str(tmp_path / "area" / "long" / "trials")) for row in rows), rows
