"""The server's API over a store with a damaged record, and run endings that agree with what the core recorded.

A real server (uvicorn, in a thread) reads a real SQLite store that the tests edit with sqlite3, as a hand edit or
a cut file would; experiments are recorded by the real core and StoreRecorder.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from test_store_reads import serving  # noqa: E402

from hermes.core.events import (
    Event,
    GpuRemoved,
    NodeAdded,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.policies import make_policy
from hermes.report.integrity import find_damage
from hermes.server.app import Hermes, ServerConfig, create_app
from hermes.server.client import Client, RemoteStore, ServerError
from hermes.store import ExperimentStatus, ExperimentStore, SqlStore
from hermes.store.recorder import StoreRecorder
from hermes.testing.recorded import experiment_spec, record_simulated


@dataclass
class Served:
    url: str
    hermes: Hermes
    tokens: dict[str, str]

    def get(self, path: str, user: str = "alice", method: str = "GET") -> tuple[int, Any]:
        """The status and the JSON body of a request to the API, over HTTP."""
        request = urllib.request.Request(f"{self.url}/api{path}", method=method,
                                         headers={"Authorization": f"Bearer {self.tokens[user]}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                return error.code, json.loads(body)
            except ValueError:
                return error.code, body.decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """A real server on a local port whose runner runs nothing: the tests record into its store."""
    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        tokens = {name: hermes.accounts.add_user(name) for name in ("alice", "bob")}
        yield Served(url, hermes, tokens)


def record(store: ExperimentStore, experiment_id: int, events: list[Event], max_failures: int = 0) -> None:
    """``events`` through the real core on round-robin, recorded as a runner records them."""
    scheduler = Scheduler(make_policy("rr", period=30.0), objective=Objective("max"), max_failures=max_failures)
    recorder = StoreRecorder(store, experiment_id, scheduler)
    for event in events:
        recorder(event, scheduler.handle(event))
        recorder.flush()


# ---------------------------------------------------------------------- a damaged record through the API
DAMAGES = {
    "trial budget": "UPDATE trials SET budget = 'x' WHERE experiment_id = :id AND trial_id = '1'",
    "metrics step": "UPDATE metrics SET step = 2.5 WHERE id = (SELECT MIN(id) FROM metrics WHERE experiment_id = :id)",
    "event cut": "UPDATE events SET data = substr(data, 1, 12) WHERE experiment_id = :id AND seq = 6",
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_record_is_named_by_its_experiments_routes_and_lists_every_other_experiment(
    served: Served, damage: str
) -> None:
    """A record of one experiment edited by hand: every route that reads it answered a bare 500 "Internal Server
    Error", and the list of experiments failed for every user. Now the routes that read its trials, reports or log
    answer a 500 whose ``detail`` names the record as ``hermes status`` does (less the store's file) and what to do;
    the list, the experiment itself, a cancel and the pool's timeline answer, the damaged experiment marked
    ``damaged`` to its owner, and never shown to another user."""
    store = served.hermes.store
    ids = {}
    for owner, name in (("alice", "good"), ("alice", "bad"), ("bob", "bobs")):
        ids[name] = store.submit_experiment(name, experiment_spec(name, 4, 3), owner)
        record_simulated(store, ids[name], 4, 3, seed=len(name), policy="rr")
    bad = ids["bad"]
    store.set_status(bad, ExperimentStatus.RUNNING)  # the list reads an open experiment's log too
    database = served.hermes.config.root / "hermes.db"
    with sqlite3.connect(database) as connection:
        assert connection.execute(DAMAGES[damage], {"id": bad}).rowcount == 1
    connection.close()
    named = find_damage(database)  # what `hermes status` names
    assert named is not None and f"experiment_id {bad}," in named
    detail = (f"the server's store has a damaged record: {named}; its administrator can correct that value, "
              "or restore the store from a backup")

    code, listed = served.get("/experiments")
    assert code == 200, listed
    assert [(e["name"], e["damaged"]) for e in listed] == [("good", None), ("bad", detail)]
    assert listed[0]["trials"] == 4 and listed[1]["trials"] is None
    code, bobs = served.get("/experiments", "bob")
    assert code == 200 and [(e["name"], e["damaged"]) for e in bobs] == [("bobs", None)]

    for path in ("/trials", "/trials/0", "/timeline", "/curves"):
        assert served.get(f"/experiments/{bad}{path}") == (500, {"detail": detail}), path
        assert served.get(f"/experiments/{ids['good']}{path}")[0] == 200, path
        assert served.get(f"/experiments/{bad}{path}", "bob")[0] == 404, path  # as for a missing one
    assert str(database) not in detail
    code, shown = served.get(f"/experiments/{bad}")
    assert code == 200 and shown["damaged"] == detail and shown["spec"]["name"] == "bad", shown

    remote = RemoteStore(Client(served.url, served.tokens["alice"]))  # as `hermes status --server` reads
    assert [e.name for e in remote.experiments()] == ["good", "bad"]
    with pytest.raises(ServerError, match="500 Internal Server Error: the server's store has a damaged record: "):
        remote.trials(bad)

    code, timeline = served.get("/cluster/timeline")
    assert code == 200 and timeline["damaged"] == [bad], timeline
    assert {run["experiment"] for run in timeline["runs"]} == {ids["good"], None}  # None: bob's, anonymous
    assert f"{bad}:0" in timeline["cursor"].split(",")
    code, timeline = served.get("/cluster/timeline", "bob")
    assert code == 200 and timeline["damaged"] == [] and {run["owner"] for run in timeline["runs"]} == {
        "bob", "(other users)"}

    code, cancelled = served.get(f"/experiments/{bad}/cancel", method="POST")  # it was cancelled: not a 500
    assert code == 202 and cancelled["cancel_requested"] and cancelled["damaged"] == detail, cancelled


# ---------------------------------------------------------------------- exits described as the record says
def test_events_and_decisions_describe_an_exit_without_a_report_as_the_failure_the_record_holds(
    served: Served,
) -> None:
    """On one GPU, trial 0 exits with code 0 before any report, which the core records failed; trial 1, started in
    its place, reports and exits. The API's events said trial 0 "completed", and trial 1's start "because trial 0
    completed"; a page that begins after trial 1's report must still say that trial 1 completed."""
    store = served.hermes.store
    experiment_id = store.submit_experiment("silent", experiment_spec("silent", 2, 3), "alice")
    record(store, experiment_id, [
        NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "0", 3), TrialSubmitted(0.0, "1", 3),
        SubmissionsClosed(0.0), TrialExited(1.0, "0", True), TrialReported(2.0, "1", 3, 0.5),
        TrialExited(2.0, "1", True),
    ])
    assert {t.trial_id: t.state for t in store.trials(experiment_id)} == {
        "0": TrialState.FAILED, "1": TrialState.COMPLETED}
    path = f"/experiments/{experiment_id}"

    def exits(after: int) -> dict[str, str]:
        code, page = served.get(f"{path}/events?after={after}")
        assert code == 200, page
        return {e["trial_id"]: e["description"] for e in page["events"] if e["type"] == "TrialExited"}

    assert exits(0) == {"0": "trial 0 failed (ended without a report) at 1.0s", "1": "trial 1 completed at 2.0s"}
    assert exits(4) == {"0": "trial 0 failed (ended without a report) at 1.0s", "1": "trial 1 completed at 2.0s"}
    assert exits(6) == {"1": "trial 1 completed at 2.0s"}  # its report is on the page before
    code, page = served.get(f"{path}/decisions?after=4")
    assert code == 200 and [d["reason"] for d in page["decisions"]] == [
        "started on n0/g0 because trial 0 failed (ended without a report) at 1.0s"]


# ---------------------------------------------------------------------- the GPU timeline
def test_a_crash_after_the_last_step_ends_its_run_completed_as_the_core_records_the_trial(tmp_path: Path) -> None:
    """Trial 0 crashes after reporting its last step (a failing CUDA teardown, say): the core records it completed,
    the timeline ended its run "failed". Trial 1 reports its last step unsaved and loses its GPU: it falls back to
    step 1, so its next run's crash is a crash (run again), and only the crash after its last step again completes
    it."""
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    experiment_id = store.create_or_open_experiment("crashes", experiment_spec("crashes", 2, 2))
    crash = {"succeeded": False, "error": "CUDA error: unspecified launch failure", "crashed": True}
    record(store, experiment_id, [
        NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")), TrialSubmitted(0.0, "0", 2), TrialSubmitted(0.0, "1", 2),
        SubmissionsClosed(0.0),
        TrialReported(1.0, "0", 1, 0.1, checkpointed=True), TrialReported(1.0, "1", 1, 0.1, checkpointed=True),
        TrialReported(2.0, "0", 2, 0.2), TrialReported(2.0, "1", 2, 0.2),
        TrialExited(3.0, "0", **crash),  # after its last step
        GpuRemoved(4.0, "n0/g1"),  # trial 1 falls back to step 1, and is resumed on n0/g0
        TrialExited(5.0, "1", **crash),  # before its last step: run again from step 1
        TrialReported(6.0, "1", 2, 0.3), TrialExited(7.0, "1", **crash),
    ], max_failures=2)
    try:
        states = {t.trial_id: t.state for t in store.trials(experiment_id)}
        runs = [(run.trial_id, run.gpu, run.ended_by) for run in store.runs(experiment_id)]
    finally:
        store.close()
    assert states == {"0": TrialState.COMPLETED, "1": TrialState.COMPLETED}
    assert runs == [("0", "n0/g0", "completed"), ("1", "n0/g1", "lost"), ("1", "n0/g0", "failed"),
                    ("1", "n0/g0", "completed")]
