"""How many unfinished experiments one user may have on a server (``hermes server --max-experiments``).

Without a bound, a script submitting in a loop filled the store and the pool's memory with queued experiments. The
count is taken in the write that adds an experiment, so submissions made at once, through several store objects
(several server threads, or two servers on one PostgreSQL), cannot pass it together.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes.store import ExperimentStatus, SqlStore, TooManyExperiments

pytest.importorskip("fastapi", reason="the server needs the server extra")

from fastapi.testclient import TestClient  # noqa: E402
from test_server import Server, real_spec  # noqa: E402

from hermes.server.app import ServerConfig, create_app  # noqa: E402

SPEC = {"name": "x"}


@pytest.fixture(params=["sqlite-file", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres").new_database())
    return f"sqlite:///{tmp_path}/hermes.db"


def test_submissions_at_once_never_pass_the_limit(url: str) -> None:
    SqlStore(url).close()  # the tables, made once
    stores = [SqlStore(url) for _ in range(8)]
    accepted: list[int] = []
    refused: list[str] = []
    start = threading.Barrier(len(stores))

    def submit(index: int) -> None:
        start.wait()
        try:
            accepted.append(stores[index].submit_experiment(f"e{index}", SPEC, "ann", max_active=3))
        except TooManyExperiments as error:
            refused.append(str(error))

    threads = [threading.Thread(target=submit, args=(index,)) for index in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(accepted) == 3 and len(refused) == 5
        assert refused[0] == "ann has 3 experiments queued, running or interrupted, the most allowed (3)"
        store = stores[0]
        assert store.submit_experiment("bobs", SPEC, "bob", max_active=3)  # each owner is counted alone
        store.set_status(accepted[0], ExperimentStatus.FINISHED)  # an ended experiment frees a place
        store.set_status(accepted[1], ExperimentStatus.INTERRUPTED)  # an interrupted one resumes: it holds one
        store.submit_experiment("again", SPEC, "ann", max_active=3)
        with pytest.raises(TooManyExperiments):
            store.submit_experiment("more", SPEC, "ann", max_active=3)
        store.submit_experiment("unbounded", SPEC, "ann")  # PoolSession.submit's default: no bound
    finally:
        for store in stores:
            store.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    config = ServerConfig(root=tmp_path / "server", run_experiments=False, max_active=2)
    with TestClient(create_app(config)) as client:
        yield Server(client)


def test_the_server_refuses_a_users_experiment_past_the_limit_saying_what_to_do(server: Server) -> None:
    def submit(name: str, user: str = "alice") -> tuple[int, dict]:
        response = server.client.post("/api/experiments", json={"spec": real_spec(name)}, headers=server.as_(user))
        return response.status_code, response.json()

    assert submit("one")[0] == submit("two")[0] == 201
    code, body = submit("three")
    assert code == 429
    assert body["detail"] == ("you have 2 experiments queued, running or interrupted, the most this server takes "
                              "from one user (`hermes server --max-experiments`): submit this one when one of them "
                              "has ended, or cancel one")
    assert submit("three", "bob")[0] == 201
    assert [record.name for record in server.hermes.store.experiments()] == ["one", "two", "three"]


def test_the_limit_is_a_server_flag() -> None:
    shown = subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--help"], capture_output=True, text=True,
                           check=True).stdout
    assert "--max-experiments N" in shown and "(default 50)" in shown
    refused = subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--max-experiments", "0"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "--max-experiments" in refused.stderr
