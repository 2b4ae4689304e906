"""The server as its store grows: what a poll of the dashboard's experiment list (``GET /api/experiments``, every 2 s)
reads of the store must not grow with the experiments' histories. Checked by counting the reads a real server makes
of its real store, never by timing them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient
from test_server import Server

from hermes.server.app import ServerConfig, create_app
from hermes.store import ExperimentStatus, ExperimentStore
from hermes.testing.recorded import record_simulated

HISTORY = ("events", "events_after", "decisions", "decisions_after", "metrics", "metrics_after", "trials")
OVERVIEW = ("trials", "by_state", "best", "best_trial")  # what the list shows of an experiment's trials


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server whose runner runs nothing: its experiments are recorded by the tests (simulated)."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        yield Server(client)


def count_reads(store: ExperimentStore, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the calls of the store's reads of an experiment's history, by method, on the server's own store."""
    reads: Counter[str] = Counter()

    def counted(name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            reads[name] += 1
            return read(*args, **kwargs)
        return call

    for name in HISTORY:
        monkeypatch.setattr(store, name, counted(name, getattr(store, name)))
    return reads


def test_a_list_poll_reads_nothing_of_ended_experiments_past_the_digests_kept(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More experiments than the server keeps digests of: each poll dropped every digest before it was read again
    and rebuilt it from the whole of its experiment's log (201 experiments of 5,000 trials: minutes a poll)."""
    monkeypatch.setattr("hermes.server.app.DIGESTS_KEPT", 2)
    monkeypatch.setattr("hermes.server.digest.REFRESH_INTERVAL", 0.0)  # every poll comes after it, as the page's do
    ids = [server.simulated("alice", f"sim{i}", trials=6) for i in range(4)]
    reads = count_reads(server.hermes.store, monkeypatch)
    first = server.get("/api/experiments")
    assert [e["id"] for e in first] == ids and all(e["trials"] == 6 for e in first)
    reads.clear()
    for _ in range(3):
        assert server.get("/api/experiments") == first
        assert reads == Counter()  # nothing of any experiment's trials, reports or log


def test_an_ended_experiment_is_listed_as_its_digest_shows_it_without_reading_its_log(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its event log and decisions are most of what a digest reads, and nothing the list shows comes from them."""
    ids = [server.simulated("alice", f"sim{i}", trials=5 + 3 * i) for i in range(3)]
    reads = count_reads(server.hermes.store, monkeypatch)
    listed = server.get("/api/experiments")
    assert reads["events"] + reads["events_after"] + reads["decisions"] + reads["decisions_after"] == 0
    for experiment_id, entry in zip(ids, listed, strict=True):
        detail = server.get(f"/api/experiments/{experiment_id}")  # from the experiment's digest, built from its log
        assert {key: entry[key] for key in OVERVIEW} == {key: detail[key] for key in OVERVIEW}
        assert entry["best"] is not None and sum(entry["by_state"].values()) == entry["trials"]


def test_an_ended_experiment_run_again_is_listed_as_it_ended_the_second_time(server: Server) -> None:
    """Ended is not forever for an experiment that ``hermes run`` wrote into the server's store: one that failed runs
    again from its log. Its record changes with it, and so does what the list shows."""
    store = server.hermes.store
    experiment_id = server.simulated("alice", "again", trials=4)
    store.set_status(experiment_id, ExperimentStatus.FAILED, error="the runner's bug")
    assert server.get("/api/experiments")[0]["trials"] == 4
    record_simulated(store, experiment_id, 9, 6, seed=3, policy="rr")  # running, then finished: unseen by the list
    entry = server.get("/api/experiments")[0]
    detail = server.get(f"/api/experiments/{experiment_id}")
    assert entry["status"] == "finished" and entry["trials"] == 9
    assert {key: entry[key] for key in OVERVIEW} == {key: detail[key] for key in OVERVIEW}
