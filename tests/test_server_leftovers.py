"""`hermes server` against a store that cannot be written, clients that never send a request, and more experiments
open than the digests it keeps: real servers (a `hermes server` process, or uvicorn in a thread) on real stores."""

from __future__ import annotations

import resource
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
import httpx
from fastapi.testclient import TestClient
from test_server import (
    Server,
    _free_port,
    _wait_for,
    give_code,
    real_spec,
    server_command_with_a_user,
)
from test_server_damage import Served, served  # noqa: F401  (served: the fixture)
from test_store_reads import serving

from hermes.server.app import DIGESTS_KEPT, ServerConfig, create_app
from hermes.store import ExperimentStatus
from hermes.testing.recorded import experiment_spec

KEEP_ALIVE_S = 5  # uvicorn's timeout_keep_alive, which `hermes server` leaves as it is
TAKEN = "you have an experiment named 'digits' already"
UNAVAILABLE = "the server's store cannot be used now"
FAILED = "the server's store failed, and nothing of this request was done"


class HermesServer:
    """A `hermes server` process on a free port, with one user."""

    def __init__(self, root: Path) -> None:
        hermes, env, self.headers = server_command_with_a_user(root, "ann")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root.parent / "server.log", "w")  # noqa: SIM115  (closed by stop)
        self.process = subprocess.Popen([*hermes, "--port", str(self.port), "--cpu-slots", "1"], stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env)
        _wait_for(self.url)

    def submit(self, name: str) -> httpx.Response:
        return httpx.post(f"{self.url}/api/experiments", json={"spec": real_spec(name)}, headers=self.headers,
                          timeout=30)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HermesServer]:
    """One for the module's tests: starting one takes seconds."""
    server = HermesServer(tmp_path_factory.mktemp("leftovers") / "srv")
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------- a store that cannot record a submission
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="sets the server's file-size limit: Linux's prlimit")
def test_a_store_that_cannot_be_written_answers_503_not_that_the_name_is_taken(hermes_server: HermesServer) -> None:
    """The server's SQLite store refuses every write (its process may grow no file: as a read-only or failing disk,
    which reads still pass): a submission was answered 409 "you have an experiment named 'digits' already", though
    no experiment had that name; now 503, saying the store could not record it. Once the store takes writes again,
    the name is free, and taken only after it was submitted."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(hermes_server.process.pid, resource.RLIMIT_FSIZE, (0, hard))
    try:
        refused = hermes_server.submit("digits")
    finally:
        resource.prlimit(hermes_server.process.pid, resource.RLIMIT_FSIZE, (soft, hard))
    assert refused.status_code == 503 and refused.json()["detail"].startswith(UNAVAILABLE), refused.text
    assert "hermes.db" not in refused.text  # the database is not the caller's business
    submitted = hermes_server.submit("digits")
    assert submitted.status_code == 201, submitted.text
    again = hermes_server.submit("digits")
    assert again.status_code == 409 and TAKEN in again.json()["detail"]


def test_a_store_that_refuses_a_name_nobody_has_is_no_name_clash(served: Served) -> None:  # noqa: F811
    """The store says a taken name with a plain StoreError, which is also how it says any failure of a PostgreSQL
    database, or of a write refused in a way it does not name: here a trigger that refuses every new experiment. Each
    was answered 409 "you have an experiment named ... already"; only a name the user has is that 409 now, and a
    refusal the store does not name a 500 saying the store failed (no retry mends a trigger)."""
    give_code(served.hermes.config.root, "alice")
    headers = {"Authorization": f"Bearer {served.tokens['alice']}"}

    def submit() -> httpx.Response:
        return httpx.post(f"{served.url}/api/experiments", json={"spec": real_spec("digits")}, headers=headers)

    database = served.hermes.config.root / "hermes.db"
    with closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("CREATE TRIGGER refused BEFORE INSERT ON experiments BEGIN SELECT RAISE(ABORT, 'no'); END")
    refused = submit()
    assert refused.status_code == 500 and refused.json()["detail"].startswith(FAILED), refused.text
    with closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("DROP TRIGGER refused")
    assert submit().status_code == 201
    again = submit()
    assert again.status_code == 409 and TAKEN in again.json()["detail"]


def test_a_name_whose_experiment_row_is_damaged_is_still_taken(served: Served) -> None:  # noqa: F811
    """An experiments row edited by hand is left out of listings: a resubmission of its name was then told "try again
    later" (503) for ever, the name being found nowhere. It is a 409 (the store says a taken name as such), and the
    experiment's own route names the damage to an admin (its owner cannot be told apart from others: a 404)."""
    give_code(served.hermes.config.root, "alice")
    headers = {"Authorization": f"Bearer {served.tokens['alice']}"}

    def submit() -> httpx.Response:
        return httpx.post(f"{served.url}/api/experiments", json={"spec": real_spec("digits")}, headers=headers)

    first = submit()
    assert first.status_code == 201, first.text
    experiment_id = first.json()["id"]
    with closing(sqlite3.connect(served.hermes.config.root / "hermes.db")) as connection, connection:
        connection.execute("UPDATE experiments SET status = 'paused'")
    again = submit()
    assert again.status_code == 409 and TAKEN in again.json()["detail"], again.text
    assert served.get(f"/experiments/{experiment_id}")[0] == 404
    served.tokens["root"] = served.hermes.accounts.add_user("root", admin=True)
    code, body = served.get(f"/experiments/{experiment_id}", "root")
    assert code == 500 and "column status holds 'paused'" in body["detail"], body

def test_a_stopped_postgresql_answers_503_not_that_the_name_is_taken(tmp_path: Path, postgres: Any) -> None:
    """The server's PostgreSQL stopped (a restart, a crash): a submission was a bare 500, and a lost connection at
    its write a 409 "you have an experiment named ... already" (the store says both as a plain StoreError). Now a
    503 that says the store could not record it; once the database is back, the name is free."""
    app = create_app(ServerConfig(root=tmp_path / "server", database=postgres.new_database(), run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        headers = {"Authorization": f"Bearer {hermes.accounts.add_user('alice')}"}
        give_code(hermes.config.root, "alice")

        def submit() -> httpx.Response:
            return httpx.post(f"{url}/api/experiments", json={"spec": real_spec("digits")}, headers=headers,
                              timeout=30)

        postgres.stop()
        try:
            refused = submit()
        finally:
            postgres.start()
        assert refused.status_code == 503 and refused.json()["detail"].startswith(UNAVAILABLE), refused.text
        assert submit().status_code == 201
        again = submit()
        assert again.status_code == 409 and TAKEN in again.json()["detail"]


# ---------------------------------------------------------------------- connections that send no request
def test_a_connection_that_sends_no_whole_request_is_closed(hermes_server: HermesServer) -> None:
    """A client that connects and sends nothing, and one that sends part of a request head and stops (slowloris):
    uvicorn held each socket for ever (its keep-alive timer starts only after an answer). Both are closed within
    its keep-alive timeout of connecting, and the server answers the next request."""
    silent = socket.create_connection(("127.0.0.1", hermes_server.port))
    slow = socket.create_connection(("127.0.0.1", hermes_server.port))
    slow.sendall(b"GET /api/me HTTP/1.1\r\nHost: x\r\n")  # the blank line that ends a head never comes
    opened = time.monotonic()
    for sock in (silent, slow):
        with sock:
            sock.settimeout(KEEP_ALIVE_S + 5 - (time.monotonic() - opened))
            try:
                assert sock.recv(1024) == b""  # closed: no answer, no request to answer
            except ConnectionResetError:
                pass
            except TimeoutError:
                pytest.fail(f"the connection was still open {KEEP_ALIVE_S + 5} s after it was made")
    assert time.monotonic() - opened < KEEP_ALIVE_S + 5
    answer = httpx.get(f"{hermes_server.url}/api/me", headers=hermes_server.headers)
    assert answer.status_code == 200 and answer.json()["name"] == "ann"


# ---------------------------------------------------------------------- more experiments open than digests kept
@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server whose runner runs nothing: the tests make its experiments in its store."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        yield Server(client)


def test_a_list_poll_keeps_every_open_experiments_digest_and_bounds_ended_ones(server: Server) -> None:
    """210 open experiments, more than the 200 digests kept: each poll of the list dropped every digest before it was
    read again and built it anew from the store (an experiment of 5,000 trials takes seconds). Every open one's
    digest is kept now, the same from one poll to the next; once they end, only ``DIGESTS_KEPT`` stay."""
    store = server.hermes.store
    spec = experiment_spec("e", 1, 1)
    ids = [store.submit_experiment(f"e{i}", {**spec, "name": f"e{i}"}, "alice") for i in range(DIGESTS_KEPT + 10)]
    for experiment_id in ids[::2]:
        store.set_status(experiment_id, ExperimentStatus.RUNNING)  # queued and running are open alike
    assert [e["trials"] for e in server.get("/api/experiments")] == [0] * len(ids)
    kept = dict(server.hermes._digests)
    assert sorted(kept) == ids
    assert [e["id"] for e in server.get("/api/experiments")] == ids
    assert all(server.hermes._digests[i] is kept[i] for i in ids)  # none built again

    for experiment_id in ids:
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
    assert {e["status"] for e in server.get("/api/experiments")} == {"finished"}
    assert len(server.hermes._digests) == DIGESTS_KEPT  # the ended ones' bound


def test_the_digests_of_experiments_that_ended_unread_are_bounded_too(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Experiments whose digest was read while they ran (their page open), then ended while nothing read them: kept
    as open ones, they would add up for ever. Once more than ``DIGESTS_KEPT`` are counted open, the store says which
    still are."""
    monkeypatch.setattr("hermes.server.app.DIGESTS_KEPT", 2)
    store = server.hermes.store
    ids = [store.submit_experiment(f"e{i}", experiment_spec(f"e{i}", 1, 1), "alice") for i in range(5)]
    for experiment_id in ids[:3]:
        server.get(f"/api/experiments/{experiment_id}")  # read while queued, then ended unread
        store.set_status(experiment_id, ExperimentStatus.CANCELLED)
    for experiment_id in ids[3:]:
        server.get(f"/api/experiments/{experiment_id}")  # open: three counted open, one more than kept
    assert list(server.hermes._digests) == ids[1:]  # two ended ones, the least recently read dropped; both open ones
