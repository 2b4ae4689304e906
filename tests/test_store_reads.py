"""Reads of one trial's reports through the server, and damaged stores that reads must name as such."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from hermes.server.app import ServerConfig, create_app  # noqa: E402
from hermes.server.client import Client, RemoteStore  # noqa: E402
from hermes.store import SqlStore, StoreError  # noqa: E402
from hermes.store.base import DamagedRecord  # noqa: E402
from hermes.testing.recorded import experiment_spec, record_simulated  # noqa: E402


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """A server whose runner runs nothing, with alice's token in its headers."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        token = client.app.state.hermes.accounts.add_user("alice")  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn on a free local port, in a thread, for the block: its URL."""
    listening = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RemoteStore, SqlStore]]:
    """A real server whose runner runs nothing: alice reads it as the command line does (``RemoteStore``, over
    HTTP), the test records into its store."""
    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        yield RemoteStore(Client(url, hermes.accounts.add_user("alice"))), hermes.store


def test_a_remote_stores_reports_of_one_trial_come_from_its_cursor(served: tuple[RemoteStore, SqlStore]) -> None:
    """``RemoteStore.metrics_after(..., trial_id=...)`` through the API: only that trial's reports, a page at a
    time, each page from the cursor of the last report of the one before, and none after its last."""
    remote, store = served
    experiment_id = store.submit_experiment("sim", experiment_spec("sim", 12, 6), "alice")
    record_simulated(store, experiment_id, 12, 6, seed=3, policy="rr")
    reports = store.metrics_after(experiment_id, 0)
    trial = reports[-1][1].trial_id
    own = [(cursor, r.trial_id, r.step, r.at) for cursor, r in reports if r.trial_id == trial]
    assert len(own) >= 4 and own[0][0] > reports[0][0]  # others' reports come before its first

    def read(after: int, limit: int | None = None) -> list[tuple[int, str, int, float]]:
        return [(cursor, r.trial_id, r.step, r.at)
                for cursor, r in remote.metrics_after(experiment_id, after, limit, trial_id=trial)]

    first = read(0, limit=3)
    assert first == own[:3]
    rest = read(first[-1][0])
    assert rest == own[3:]
    assert read(rest[-1][0]) == []


def test_a_hand_edited_time_of_a_logs_last_event_is_named_damaged(tmp_path: Path) -> None:
    """Where a server's pool goes on from (``latest_event_at``, the latest of the logs' last events): text there
    failed its start with a ValueError of float(), naming nothing."""
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    experiment_id = store.create_or_open_experiment("sim", experiment_spec("sim", 4, 3))
    record_simulated(store, experiment_id, 4, 3, seed=3, policy="rr")
    with sqlite3.connect(path) as connection:
        (seq,) = connection.execute("SELECT MAX(seq) FROM events").fetchone()
        connection.execute("UPDATE events SET at = 'soon' WHERE seq = ?", (seq,))
    connection.close()
    try:
        with pytest.raises(DamagedRecord) as raised:
            store.latest_event_at()
    finally:
        store.close()
    assert raised.value.record == (
        f"table events, row with experiment_id {experiment_id}, seq {seq}: column at holds 'soon', not a number"
    )


def test_a_trials_reports_are_read_from_its_first_page(client: TestClient) -> None:
    """The dashboard's trial panel pages through one trial's reports: the first page is that trial's first
    reports, however many of other trials were recorded before them."""
    store = client.app.state.hermes.store  # type: ignore[attr-defined]
    experiment_id = store.submit_experiment("sim", experiment_spec("sim", 12, 6), "alice")
    record_simulated(store, experiment_id, 12, 6, seed=3, policy="rr")
    reports = store.metrics(experiment_id)
    last = reports[-1].trial_id
    own = [r for r in reports if r.trial_id == last]
    assert len(own) >= 5 and last not in {r.trial_id for r in reports[:5]}

    path = f"/api/experiments/{experiment_id}/metrics"
    page = client.get(path, params={"trial": last, "limit": 5}).json()
    assert [(m["trial"], m["step"]) for m in page["metrics"]] == [(r.trial_id, r.step) for r in own[:5]]
    assert page["cursor"] == page["metrics"][-1]["cursor"]
    rest = client.get(path, params={"trial": last, "after": page["cursor"]}).json()
    assert [m["step"] for m in rest["metrics"]] == [r.step for r in own[5:]]
    done = client.get(path, params={"trial": last, "after": rest["cursor"]}).json()
    assert done == {"cursor": rest["cursor"], "metrics": []}  # no more: the cursor stays, and a poll stops


def test_a_cut_store_file_is_named_damaged_in_one_line(tmp_path: Path) -> None:
    """A store file cut short (a full disk, a copy stopped half-way) is read as damaged, with what to do,
    not as SQLAlchemy's error with its statement and its web link."""
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    experiment_id = store.create_or_open_experiment("exp", experiment_spec("exp", 4, 6))
    for step in range(1, 2001):
        store.record_metrics(experiment_id, str(step % 4), step, float(step), {"loss": 1 / step})
    store.close()  # the last connection's close writes the -wal file into the store file
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(StoreError) as raised:  # as `hermes status` and the reports read it
        SqlStore.open_read_only(path).metrics(experiment_id)
    assert str(raised.value) == (
        f"{path} is damaged (database disk image is malformed): restore it from a backup, or use another storage dir"
    )
