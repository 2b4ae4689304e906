"""A store its runner was killed while making, and a rerun that writes trial.workdir otherwise.

1. A runner killed while it made its store left hermes.db half made: no tables yet, or a hot rollback journal while it
   switched to WAL. `hermes status`, `list` and `results` then refused it for a false reason ("a copy made while a run
   wrote needs hermes.db-wal", "it cannot be written: ... read-only"). A new store is now made whole beside its place,
   then linked there: a runner killed meanwhile leaves no hermes.db.
2. A rerun whose trial.workdir named the same folder otherwise ('./code/' for 'code', its absolute path) was refused
   "differs in trial.workdir", and so was one that edited only the description.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_run import environment
from test_run import hermes as hermes_cli

import hermes
from hermes.store import SqlStore, StoreError

TRIAL = """from hermes import trial


def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, score=config["x"] * step)
"""

# ``hermes run``, whose process ends as SIGKILL would end it when its first SQLite statement ``argv[1]`` starts
KILLED_AT = """
import os, runpy, sqlite3.dbapi2, sys

statement = sys.argv.pop(1)
connect = sqlite3.dbapi2.connect


def connect_to_die(*args, **kwargs):
    connection = connect(*args, **kwargs)
    connection.set_trace_callback(lambda sql: sql == statement and os._exit(137))
    return connection


sqlite3.connect = sqlite3.dbapi2.connect = connect_to_die  # SQLAlchemy's is dbapi2's
runpy.run_module("hermes.cli", run_name="__main__")
"""


def project(folder: Path, **trial: str) -> Path:
    """A spec of one trial of one step, its code in ``folder/code``: its path."""
    (folder / "code").mkdir(parents=True, exist_ok=True)
    (folder / "code/quick.py").write_text(TRIAL)
    spec = {
        "name": "quick",
        "trial": {"function": "quick:train", "workdir": "code", **trial},
        "search": {"sampler": "list", "configs": [{"x": 1}]},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 1},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("statement", ["PRAGMA journal_mode=WAL", "BEGIN IMMEDIATE"])
def test_a_runner_killed_while_it_made_its_store_leaves_no_half_made_store(tmp_path: Path, statement: str) -> None:
    """Killed as it switched the new file to WAL (the store a file without tables, where a journal left beside it
    read as "read-only"), or as it made the tables (a WAL file without tables)."""
    path = project(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, statement, "run", str(path), "--no-live"],
                            check=False, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=60)
    assert killed.returncode == 137, killed.stderr
    runs = tmp_path / "runs"
    assert not (runs / "hermes.db").exists(), sorted(entry.name for entry in runs.iterdir())
    status = hermes_cli("status", "runs", cwd=tmp_path)
    assert (status.returncode, status.stdout) == (2, "")
    assert "runs holds no hermes.db" in status.stderr, status.stderr
    again = hermes_cli("run", str(path), "--no-live", cwd=tmp_path)
    assert again.returncode == 0 and "trial 0 completed at step 1" in again.stdout, again.stderr


def test_a_rerun_that_writes_the_same_workdir_otherwise_continues_and_another_folder_is_refused(
    tmp_path: Path,
) -> None:
    path = project(tmp_path)
    first = hermes.run(path)
    for written in ("./code/", str(tmp_path / "code")):
        project(tmp_path, workdir=written)
        again = hermes.run(path)
        assert (again.experiment_id, again.status, again.resumed) == (first.experiment_id, "finished", True)
    shutil.copytree(tmp_path / "code", tmp_path / "other")
    project(tmp_path, workdir="other")  # the same code, in another folder: it may differ later
    with pytest.raises(StoreError, match=r"\(differs in trial\.workdir\); give it a new name"):
        hermes.run(path)


def test_a_rerun_may_edit_the_description(tmp_path: Path) -> None:
    """It changes no result, and was refused "differs in description"; a change of anything else still is."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    try:
        spec = {"name": "exp", "description": "first try", "budget": {"steps": 5}}
        experiment_id = store.create_or_open_experiment("exp", spec)
        edited = spec | {"description": "the learning rates of the paper"}
        assert store.create_or_open_experiment("exp", edited) == experiment_id
        assert store.experiment(experiment_id).spec == edited
        with pytest.raises(StoreError, match=r"\(differs in budget\.steps\)"):
            store.create_or_open_experiment("exp", edited | {"budget": {"steps": 6}})
    finally:
        store.close()
