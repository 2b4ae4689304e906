"""What an open dashboard relies on from the API, on real servers: cursors that still hold after the server
restarted, and logs cut between whole characters (what the page shows of them: tests/test_dashboard.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
from fastapi.testclient import TestClient
from test_server import Server, real_spec

from hermes.experiment.spec import ResourcesSpec
from hermes.server.api import LOG_TAIL
from hermes.server.app import ServerConfig, create_app


class Page:
    """What a dashboard page keeps of an experiment, merged from its polls as app.js merges them: trials by id,
    the experiment's runs by index and the pool's by key, each read from the cursor the last answer gave."""

    def __init__(self, experiment_id: int) -> None:
        self.path = f"/api/experiments/{experiment_id}"
        self.trials: dict[str, Any] = {}
        self.runs: dict[int, Any] = {}
        self.pool_runs: dict[str, Any] = {}
        self.cursors: dict[str, Any] = {"trials": 0, "timeline": 0, "pool": ""}

    def poll(self, server: Server) -> None:
        for route, listed, key, rows in (("trials", "trials", "trial", self.trials),
                                         ("timeline", "runs", "index", self.runs)):
            while True:
                answer = server.get(f"{self.path}/{route}", since=self.cursors[route])
                rows.update({row[key]: row for row in answer[listed]})
                self.cursors[route] = answer["version"]
                if not answer["more"]:
                    break
        while True:
            answer = server.get("/api/cluster/timeline", since=self.cursors["pool"])
            self.pool_runs.update({run["key"]: run for run in answer["runs"]})
            self.cursors["pool"] = answer["cursor"]
            if not answer["more"]:
                break


def test_a_page_left_open_catches_up_after_the_server_restarts(tmp_path: Path) -> None:
    """A page polls a running experiment; the server shuts down (its runs end, the experiment is interrupted) and
    starts again, which continues the experiment; the page, asking from the cursors it has, ends with what a page
    opened afresh reads: no run left running that ended, no trial missing (versions count the event log, so a
    digest built again numbers every change as the first one did)."""
    config = ServerConfig(root=tmp_path / "server", resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.2)
    with TestClient(create_app(config)) as client:
        server = Server(client)
        spec = real_spec("restarted", trials=4, steps=400, sleep=0.05)
        experiment_id = server.client.post("/api/experiments", json={"spec": spec},
                                           headers=server.as_("alice")).json()["id"]
        page = Page(experiment_id)
        deadline = time.monotonic() + 60
        while (sum(t["reports"] for t in page.trials.values()) < 20 or len(page.runs) < 3
               or all(run["ended_at"] is not None for run in page.runs.values())):  # shut down while one runs
            assert time.monotonic() < deadline, page.runs
            page.poll(server)
            time.sleep(0.3)
    tokens = server.tokens
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, tokens
        assert server.client.post(f"{page.path}/cancel", headers=server.as_("alice")).status_code == 202
        assert server.wait(experiment_id)["status"] == "cancelled"
        page.poll(server)
        fresh = Page(experiment_id)
        fresh.poll(server)
    assert [run for run in page.runs.values() if run["ended_at"] is None] == []
    assert page.runs == fresh.runs and page.trials == fresh.trials and page.pool_runs == fresh.pool_runs


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[Server]:
    """A server whose experiments the tests record (simulated): nothing runs."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        yield Server(client)


def test_a_log_comes_in_whole_characters(recorded: Server) -> None:
    """A log of 3-byte characters whose 64 KiB chunks end inside one: every chunk ends before the character it
    would cut and the next starts with it, so the chunks make the text again; a tail that starts inside one
    starts at the next; a character half written yet waits for its last byte; an invalid byte shows as U+FFFD."""
    server = recorded
    experiment_id = server.simulated("alice", "logged")
    trial_dir = server.hermes.config.root / "users" / "alice" / "runs" / "logged" / "trials" / "0"
    trial_dir.mkdir(parents=True)
    text = "ab" + "€" * 50_000  # 150,002 bytes: 65,536 = 2 + 3 * 21,844 + 2, inside a €
    log = trial_dir / "stdout.log"
    log.write_text(text, encoding="utf-8")
    path = f"/api/experiments/{experiment_id}/trials/0/log"
    chunks, offset = [], 0
    while offset < len(text.encode()):
        chunk = server.get(path, offset=offset)
        assert 0 < chunk["offset"] - offset <= LOG_TAIL and "\ufffd" not in chunk["text"]
        chunks.append(chunk["text"])
        offset = chunk["offset"]
    assert "".join(chunks) == text and len(chunks) == 3
    tail = server.get(path)
    assert tail["offset"] == tail["size"] and text.endswith(tail["text"]) and "\ufffd" not in tail["text"]
    assert len(tail["text"].encode()) > LOG_TAIL - 3

    with open(log, "ab") as file:
        file.write(b"x\xe2\x82")  # "x", then a "€" half written
    assert server.get(path, offset=offset) == {"offset": offset + 1, "size": offset + 3, "text": "x"}
    with open(log, "ab") as file:
        file.write(b"\xac \xff!")
    assert server.get(path, offset=offset + 1)["text"] == "€ \ufffd!"
