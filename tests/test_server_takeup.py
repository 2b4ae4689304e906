"""A server that starts while an interrupted experiment's folder is missing, or leads out of its owner's area: real
servers (uvicorn in a thread, the pool running real trials on CPU slots) on one real store, started one after the
other on the same root, as a restarted ``hermes server``."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, Self

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
import httpx
from test_server import TESTS
from test_store_reads import serving

from hermes.experiment.spec import ResourcesSpec
from hermes.report.status import format_experiments
from hermes.server.app import ServerConfig, create_app
from hermes.store.sql import SqlStore

STEPS = 12
HELD = 3  # the step whose checkpoint each trial is saving when the first server stops
RATES = (0.2, 0.4)
MODULE = "takeup_curve"  # tests/trials/curve.py under a name of its own: none on the tests' Python path


class Started:
    """One start of the server on ``root``, for a ``with`` block: alice's calls to its API."""

    def __init__(self, root: Path) -> None:
        self.app = create_app(ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1))
        self._serving = serving(self.app)

    def __enter__(self) -> Self:
        self.url = self._serving.__enter__()
        accounts = self.app.state.hermes.accounts
        known = any(user.name == "alice" for user in accounts.users())
        token = accounts.add_token("alice") if known else accounts.add_user("alice")
        self.headers = {"Authorization": f"Bearer {token}"}
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(*exc)

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}/api{path}", headers=self.headers, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def until(self, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)
        return found


def _interrupted_mid_run(root: Path) -> tuple[int, Path]:
    """Alice's experiment, interrupted by the server's stop while each trial saves the checkpoint of its step
    ``HELD`` (held there, step 2's kept), its runs open: its id and folder (``proj`` in her area). The saves that
    come after it go on."""
    folder = root / "users" / "alice" / "proj"
    folder.mkdir(parents=True)
    shutil.copy(TESTS / "trials" / "curve.py", folder / f"{MODULE}.py")
    spec = {
        "name": "toy",
        "trial": {"function": f"{MODULE}:train"},
        "search": {"sampler": "list", "configs": [{"rate": rate, "sleep": 0.02, "hold_save": HELD}
                                                        for rate in RATES]},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": STEPS},
        "policy": {"name": "fifo"},
    }
    with Started(root) as server:
        submitted = httpx.post(f"{server.url}/api/experiments", json={"spec": spec, "folder": "proj"},
                               headers=server.headers, timeout=30)
        assert submitted.status_code == 201, submitted.text
        experiment_id = submitted.json()["id"]
        trials = folder / "runs" / "toy" / "trials"
        server.until(lambda: len(list(trials.glob(f"*/saving-{HELD}"))) == len(RATES))
        assert [run["ended_at"] for run in server.get("/cluster/timeline")["runs"]] == [None, None]
    for trial in trials.iterdir():
        (trial / f"go-{HELD}").touch()
    return experiment_id, folder


def _waiting(server: Started, path: str, missing: str) -> dict[str, Any]:
    """The experiment once its error says it waits for ``missing``: still interrupted, none of its runs open."""
    waiting = server.until(lambda: missing in ((e := server.get(path))["error"] or "") and e)
    assert waiting["status"] == "interrupted", waiting
    assert waiting["error"].startswith("waiting for its files: spec: "), waiting["error"]
    _no_open_run(server)
    return waiting


def _no_open_run(server: Started) -> None:
    runs = server.get("/cluster/timeline")["runs"]
    assert runs and all(run["ended_at"] is not None for run in runs), runs


def test_an_interrupted_experiment_waits_for_its_missing_files_and_continues_once_they_are_back(tmp_path: Path) -> None:
    """The server starts while the experiment's folder is away (a shared mount not up yet, a git checkout under way):
    the experiment was failed for good, though its checkpoints were back a moment later, and its runs stayed open on
    the pool's GPU timeline for ever. Now it waits, interrupted, saying why, its old runs ended; so while the folder
    is back but its trial's module is not; once that is back too, the next look at the store takes it up, and each
    trial continues from its checkpoint."""
    root = tmp_path / "server"
    experiment_id, folder = _interrupted_mid_run(root)
    away = folder.with_name("proj.away")
    folder.rename(away)
    path = f"/experiments/{experiment_id}"
    with Started(root) as server:
        _waiting(server, path, "trial.workdir: ")
        assert "does not exist" in server.get(path)["error"]
        with closing(SqlStore.open_read_only(root / "hermes.db")) as store:  # `hermes list` says why it waits
            assert " interrupted (waiting for its files) " in format_experiments(store), format_experiments(store)
        module = away / f"{MODULE}.py"
        module.rename(tmp_path / module.name)
        away.rename(folder)
        _waiting(server, path, f"trial.function: no module '{MODULE}'")
        (tmp_path / module.name).rename(folder / module.name)

        ended = server.until(lambda: (e := server.get(path))["status"] not in ("interrupted", "running") and e)
        assert ended["status"] == "finished" and ended["error"] is None, ended
        assert [t["state"] for t in server.get(f"{path}/trials")["trials"]] == ["completed", "completed"]
        _no_open_run(server)
    for rate, trial in zip(RATES, sorted((folder / "runs" / "toy" / "trials").iterdir()), strict=True):
        state = json.loads((trial / "result.json").read_text())
        assert len(state["pids"]) == 2  # a process of each server's
        assert math.isclose(state["total"], sum(1 - math.exp(-rate * step) for step in range(1, STEPS + 1)))


def test_an_experiment_that_waits_for_its_files_can_be_cancelled(tmp_path: Path) -> None:
    """Its folder may never come back: cancelling it needs none of its files, and frees its name."""
    root = tmp_path / "server"
    experiment_id, folder = _interrupted_mid_run(root)
    shutil.rmtree(folder)
    path = f"/experiments/{experiment_id}"
    with Started(root) as server:
        _waiting(server, path, "trial.workdir: ")
        cancel = httpx.post(f"{server.url}/api{path}/cancel", headers=server.headers, timeout=30)
        assert cancel.status_code == 202, cancel.text
        cancelled = server.until(lambda: (e := server.get(path))["status"] != "interrupted" and e)
        assert cancelled["status"] == "cancelled" and cancelled["error"] is None, cancelled
        assert [t["state"] for t in server.get(f"{path}/trials")["trials"]] == ["stopped", "stopped"]
        _no_open_run(server)


def test_an_interrupted_experiment_whose_folder_leads_out_of_the_area_fails_with_no_run_left_open(
    tmp_path: Path,
) -> None:
    """At the start, the folder is a link out of the owner's area: that is no moment's absence, and the experiment
    fails, as before; but now its old runs end first and its trials stop, so that no failed experiment holds a GPU
    on the timeline for ever."""
    root = tmp_path / "server"
    experiment_id, folder = _interrupted_mid_run(root)
    outside = tmp_path / "outside"
    folder.rename(outside)
    folder.symlink_to(outside)
    path = f"/experiments/{experiment_id}"
    with Started(root) as server:
        failed = server.until(lambda: (e := server.get(path))["status"] == "failed" and e)
        assert "trial.workdir" in failed["error"] and "leads outside your area" in failed["error"], failed["error"]
        _no_open_run(server)
        assert [t["state"] for t in server.get(f"{path}/trials")["trials"]] == ["stopped", "stopped"]
