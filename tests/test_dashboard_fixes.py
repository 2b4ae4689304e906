"""What an open dashboard relies on from the API, on real servers: cursors that still hold after the server
restarted, and logs cut between whole characters (what the page shows of them: tests/test_dashboard.py)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
from fastapi.testclient import TestClient
from test_server import Server, real_spec

from hermes.core.events import NodeAdded, NodeRemoved, SubmissionsClosed, TrialExited, TrialReported, TrialSubmitted
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.experiment.spec import ResourcesSpec
from hermes.policies import make_policy
from hermes.server.api import LOG_TAIL
from hermes.server.app import ServerConfig, create_app
from hermes.server.digest import ExperimentDigest
from hermes.store import ExperimentStatus, SqlStore
from hermes.store.base import DamagedRecord
from hermes.store.recorder import StoreRecorder
from hermes.testing.recorded import experiment_spec, record_simulated


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


def test_a_trial_that_exits_without_a_report_is_said_failed_as_its_record_says(tmp_path: Path) -> None:
    """A trial process that exited with code 0 before its first report: the core records it failed, the timeline's
    run ends "failed", but the tooltips said it "completed" (its run's end, and the start of the next run on its
    GPU). Recorded by the real core and StoreRecorder, on one GPU: trial 0 exits silently, trial 1 reports."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    experiment_id = store.create_or_open_experiment("silent", experiment_spec("silent", 2, 3))
    scheduler = Scheduler(make_policy("rr", period=30.0), objective=Objective("max"))
    recorder = StoreRecorder(store, experiment_id, scheduler)
    for event in (NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "0", 3), TrialSubmitted(0.0, "1", 3),
                  SubmissionsClosed(0.0), TrialExited(1.0, "0", True), TrialReported(2.0, "1", 3, 0.5),
                  TrialExited(2.0, "1", True)):
        recorder(event, scheduler.handle(event))
        recorder.flush()
    digest = ExperimentDigest(store, store.experiment(experiment_id))
    digest.refresh(ExperimentStatus.FINISHED)
    runs, _ = digest.runs_since(0, 10)
    store.close()

    assert [(t["trial"], t["state"]) for t in digest.trials.values()] == [("0", "failed"), ("1", "completed")]
    assert digest.trials["0"]["error"].startswith("ended without a report: ")
    assert [(run["trial"], run["ended_by"]) for run in runs] == [("0", "failed"), ("1", "completed")]
    assert runs[0]["end_reason"] == "trial 0 failed (ended without a report) at 1.0s"
    assert runs[1]["start_reason"] == "started on n0/g0 because trial 0 failed (ended without a report) at 1.0s"
    assert runs[1]["end_reason"] == "trial 1 completed at 2.0s"


def test_a_hand_edited_report_time_is_named_at_every_poll_and_once_put_right_the_digest_is_whole(
        tmp_path: Path) -> None:
    """A report's time edited to text: the digest failed with a TypeError deep in its reading (a 500 that said
    nothing), and the polls after it served the trials without their records (all "pending", no parameters)."""
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    experiment_id = store.create_or_open_experiment("sim", experiment_spec("sim", 6, 4))
    record_simulated(store, experiment_id, 6, 4, seed=3, policy="rr")
    with sqlite3.connect(path) as connection:
        (at,) = connection.execute("SELECT at FROM metrics WHERE id = 3").fetchone()
        connection.execute("UPDATE metrics SET at = 'late' WHERE id = 3")
    connection.close()
    digest = ExperimentDigest(store, store.experiment(experiment_id))
    for _ in range(2):  # the next poll too, at once
        with pytest.raises(DamagedRecord) as raised:
            digest.refresh(ExperimentStatus.FINISHED)
        assert raised.value.record == (
            "table metrics, row with experiment_id 1, id 3: column at holds 'late', not a number"
        )
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE metrics SET at = ? WHERE id = 3", (at,))
    connection.close()
    digest.refresh(ExperimentStatus.FINISHED)
    fresh = ExperimentDigest(store, store.experiment(experiment_id))
    fresh.refresh(ExperimentStatus.FINISHED)
    store.close()
    assert digest.trials_since(0, 100) == fresh.trials_since(0, 100)
    assert digest.runs_since(0, 100) == fresh.runs_since(0, 100)
    assert {t["state"] for t in digest.trials.values()} <= {"completed", "failed"}


def test_runs_a_pool_ended_show_at_once_when_it_says_the_experiment_waits_its_status_unchanged(tmp_path: Path) -> None:
    """A pool that finds an interrupted experiment's files missing ends its old runs, then records it interrupted
    (as it was) with an error saying it waits: the digest, read while the runs were open, re-read the store only
    on a change of status or after REFRESH_INTERVAL, so the error was served beside runs still open (a CI failure
    of tests/test_server_takeup.py). A changed error reads the store at once."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    experiment_id = store.create_or_open_experiment("away", experiment_spec("away", 1, 3))
    scheduler = Scheduler(make_policy("fifo"), objective=Objective("max"))
    recorder = StoreRecorder(store, experiment_id, scheduler)

    def record(*events: Any) -> None:
        for event in events:
            recorder(event, scheduler.handle(event))
        recorder.flush()

    record(NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "0", 3))
    store.set_status(experiment_id, ExperimentStatus.INTERRUPTED)
    digest = ExperimentDigest(store, store.experiment(experiment_id))
    digest.refresh(ExperimentStatus.INTERRUPTED)
    assert [run["ended_at"] for run in digest.runs_since(0, 10)[0]] == [None]
    record(NodeRemoved(1.0, "n0"))
    store.set_status(experiment_id, ExperimentStatus.INTERRUPTED, error="waiting for its files: spec: gone")
    waiting = store.experiment(experiment_id)
    digest.refresh(waiting.status, waiting.error)
    store.close()
    assert [run["ended_at"] for run in digest.runs_since(0, 10)[0]] == [1.0]


def test_the_overview_never_names_a_failed_trial_the_best(tmp_path: Path) -> None:
    """A trial that reported the highest value and then failed is no result (as in `hermes results`): the API's and
    the dashboard's best named it; with every trial failed there is no best."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    experiment_id = store.create_or_open_experiment("crash", experiment_spec("crash", 2, 3))
    scheduler = Scheduler(make_policy("fifo"), objective=Objective("max"), max_failures=0)
    recorder = StoreRecorder(store, experiment_id, scheduler)
    for event in (NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")), TrialSubmitted(0.0, "0", 3), TrialSubmitted(0.0, "1", 3),
                  SubmissionsClosed(0.0), TrialReported(1.0, "0", 1, 0.9), TrialExited(1.5, "0", False, "boom"),
                  TrialReported(2.0, "1", 3, 0.5), TrialExited(2.0, "1", True)):
        recorder(event, scheduler.handle(event))
        recorder.flush()
    assert scheduler.trials["0"].state is TrialState.FAILED
    digest = ExperimentDigest(store, store.experiment(experiment_id))
    digest.refresh(ExperimentStatus.FINISHED)
    ended = ExperimentDigest.ended_overview(store, store.experiment(experiment_id))
    store.close()
    for overview in (digest.overview(), ended):
        assert (overview["best"], overview["best_trial"]) == (0.5, "1"), overview
