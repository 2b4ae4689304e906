"""A `hermes server` whose pool an error stopped: its store refuses every write (a full disk, say), so the pool could
not record its experiments interrupted, and the API showed them running, GPUs held, bars growing, until the store
took writes again. A real server process whose file-size limit is set to 0 (reads still pass)."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
import httpx
from test_server import _free_port, _wait_for, real_spec, server_command_with_a_user

STOPPED = "the pool stopped: "


def _until(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not so after {timeout} s")


@pytest.mark.alone  # beside other files' load, the pool's restart 1 s later came within its 0.5 s look at the bars
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="sets the server's file-size limit: Linux's prlimit")
def test_a_pool_stopped_by_a_store_that_refuses_writes_shows_its_experiments_interrupted_until_it_runs_again(
    tmp_path: Path,
) -> None:
    hermes, env, headers = server_command_with_a_user(tmp_path / "srv", "ann")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen([*hermes, "--port", str(port), "--cpu-slots", "1"], stdout=log,
                                  stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(url.removesuffix("/api"))

        def get(path: str) -> Any:
            answer = httpx.get(f"{url}{path}", headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
            return answer.json()

        spec = real_spec("slow", trials=2, steps=40, sleep=0.05, resources={"gpus": "none", "cpu_slots": 1})
        submitted = httpx.post(f"{url}/experiments", json={"spec": spec}, headers=headers, timeout=30)
        assert submitted.status_code == 201, submitted.text
        experiment = f"/experiments/{submitted.json()['id']}"
        _until(lambda: get("/cluster")["users"] and get(experiment)["by_state"].get("running"))

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (0, hard))  # the next report cannot be recorded
        try:
            shown = _until(lambda: (e := get(experiment))["status"] == "interrupted" and e)
            assert shown["error"].startswith(f"{STOPPED}the server's store ") and "continue from" in shown["error"], shown
            assert "hermes.db" not in shown["error"]  # the store's file is the log's business, not the users'
            assert [e["status"] for e in get("/experiments")] == ["interrupted"]
            cluster = get("/cluster")
            assert cluster["pool_stopped"].startswith(STOPPED) and cluster["users"] == [], cluster
            ended = get(f"{experiment}/timeline")["now"]
            time.sleep(0.5)
            assert get(f"{experiment}/timeline")["now"] == ended  # its bars grow no more
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (soft, hard))

        _until(lambda: get(experiment)["status"] == "running" and get("/cluster")["pool_stopped"] is None)
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (0, hard))  # a second outage, after the pool ran again
        try:
            again = _until(lambda: (e := get(experiment))["status"] == "interrupted" and e)["error"]
            # it waits the first delay again (1 s), not twice the last one (the delay only grew, up to 30 s)
            assert "starts again in 1 s" in again or "is starting again" in again, again
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (soft, hard))

        finished = _until(lambda: (e := get(experiment))["status"] == "finished" and e, timeout=120)
        assert finished["error"] is None and finished["by_state"] == {"completed": 1, "failed": 1}, finished
        assert get("/cluster")["pool_stopped"] is None
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_experiment_the_stopped_pool_recorded_interrupted_says_why() -> None:
    """A pool stopped by its lost Ray cluster (the store fine) recorded its experiments interrupted, with no error:
    the API showed them interrupted, error null, the reason in /api/cluster alone."""
    from hermes.server.api import _summary
    from hermes.store import ExperimentRecord, ExperimentStatus

    def shown(status: ExperimentStatus, error: str | None, owner: str | None = "alice") -> tuple[str, str | None]:
        record = ExperimentRecord(1, "exp", {}, 0.0, status, owner=owner, error=error)
        summary = _summary(record, pool_stopped=STOPPED + "lost the Ray cluster")
        return summary.status, summary.error

    assert shown(ExperimentStatus.INTERRUPTED, None) == ("interrupted", STOPPED + "lost the Ray cluster")
    assert shown(ExperimentStatus.RUNNING, None) == ("interrupted", STOPPED + "lost the Ray cluster")
    waiting = "waiting for its files: ..."  # a reason of its own stays
    assert shown(ExperimentStatus.INTERRUPTED, waiting) == ("interrupted", waiting)
    assert shown(ExperimentStatus.FINISHED, None) == ("finished", None)
    assert shown(ExperimentStatus.INTERRUPTED, None, owner=None) == ("interrupted", None)  # hermes run's
