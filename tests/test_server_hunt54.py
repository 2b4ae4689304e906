"""The server over texts with a NUL (on PostgreSQL too), over experiments that `hermes run` runs in its store, and the
steps it shows of a trial whose record fell back to its checkpoint: real servers on real stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient
from test_server import Server, real_spec
from test_store_reads import serving

from hermes.core.events import (
    ExperimentCancelled,
    NodeAdded,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.experiment.spec import ResourcesSpec
from hermes.policies import make_policy
from hermes.report import ExperimentView
from hermes.report.results import standings
from hermes.server.app import ServerConfig, create_app
from hermes.server.client import Client, RemoteStore, ServerError
from hermes.store.recorder import StoreRecorder
from hermes.testing.recorded import experiment_spec

NUL_TRIAL = '''def train(config):
    raise RuntimeError("cannot parse record b'\\x00\\x01' in data file")
'''


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server whose runner runs nothing: the tests record into its store."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        yield Server(client)


def _refused_naming_trial(server: Server, experiment_id: int) -> None:
    response = server.client.get(f"/api/experiments/{experiment_id}/metrics", params={"trial": "\0"},
                                 headers=server.as_("alice"))
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["query", "trial"] and "NUL" in problem["msg"], problem


def test_a_trial_whose_error_holds_a_nul_fails_alone_on_postgresql_and_the_pool_runs_on(
    tmp_path: Path, postgres: Any
) -> None:
    """PostgreSQL refused the NUL in the trial's error: the pool stopped, and at each restart replayed the log and ran
    the trial again, so it stopped again, and no user's experiment made progress. A NUL in a query was a 500."""
    config = ServerConfig(root=tmp_path / "server", database=postgres.new_database(),
                          resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.2)
    with TestClient(create_app(config)) as client:
        server = Server(client)
        (config.root / "users" / "alice" / "trials" / "nul.py").write_text(NUL_TRIAL)
        ids = {}
        for user, spec in (("bob", real_spec("victim")),
                           ("alice", real_spec("nul", trials=1, trial={"function": "trials.nul:train"}))):
            response = client.post("/api/experiments", json={"spec": spec}, headers=server.as_(user))
            assert response.status_code == 201, response.text
            ids[user] = response.json()["id"]
        assert server.wait(ids["bob"], "bob", timeout=60)["by_state"] == {"completed": 3, "failed": 1}
        assert server.wait(ids["alice"], timeout=60)["by_state"] == {"failed": 1}
        [trial] = server.get(f"/api/experiments/{ids['alice']}/trials")["trials"]
        assert "b'\\x00\x01'" in trial["error"] and "\0" not in trial["error"], trial["error"]  # stored escaped
        assert server.get("/api/cluster", "root")["pool_stopped"] is None
        _refused_naming_trial(server, ids["alice"])


def test_a_nul_in_any_query_parameter_is_refused_naming_it(server: Server) -> None:
    experiment_id = server.simulated("alice", "nul-query")
    _refused_naming_trial(server, experiment_id)
    response = server.client.get(f"/api/experiments/{experiment_id}/trials", params={"since": "0", "x": "a\0"},
                                 headers=server.as_("alice"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "x"], response.text
    assert server.get(f"/api/experiments/{experiment_id}/metrics", trial="0")["metrics"]  # no NUL: answered


def test_a_cancel_or_weight_of_an_experiment_that_hermes_run_runs_is_refused_saying_so(tmp_path: Path) -> None:
    """The pool never takes up an experiment that `hermes run` writes into the server's store (no owner): a cancel
    was accepted (202, and the command line said its trials stop) and the run finished anyway; an interrupted one
    kept its cancel asked for ever."""
    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        root = Client(url, hermes.accounts.add_user("root", admin=True))
        local = hermes.store.create_or_open_experiment("localc", experiment_spec("localc", 2, 6))  # as `hermes run`
        with pytest.raises(ServerError, match=r"409 Conflict: .*localc.* is run by `hermes run`.*stop that"):
            root.cancel("localc")  # what `hermes cancel localc` does and says
        with pytest.raises(ServerError, match=r"409 Conflict: .*is run by `hermes run`.*no share of the pool"):
            root.request("PUT", f"/experiments/{local}/weight", {"weight": 5})
        record = hermes.store.experiment(local)
        assert (record.cancel_requested, record.weight) == (False, 1.0)
        pooled = hermes.store.submit_experiment("pooled", experiment_spec("pooled", 2, 6), "root")
        assert root.cancel("pooled")["cancel_requested"]  # the pool's own are taken as before
        assert root.request("PUT", f"/experiments/{pooled}/weight", {"weight": 5})["weight"] == 5


def test_a_trials_steps_are_the_last_it_reported_as_hermes_results_counts_them(tmp_path: Path) -> None:
    """A trial whose run ended after a report past its checkpoint (a kill -9, a crash) has its record set back to
    the checkpoint's step: the API's trials (the dashboard's steps) said 2 where `hermes results` said 3, and its
    best was "at step" 3, past its steps."""
    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        remote = RemoteStore(Client(url, hermes.accounts.add_user("alice")))
        experiment_id = hermes.store.submit_experiment("steps", experiment_spec("steps", 1, 6), "alice")
        scheduler = Scheduler(make_policy("rr", period=30.0), objective=Objective("max"), max_failures=1)
        recorder = StoreRecorder(hermes.store, experiment_id, scheduler)
        for event in (NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "0", 6, {"x": 1}),
                      TrialReported(1.0, "0", 1, 0.1), TrialReported(2.0, "0", 2, 0.2, checkpointed=True),
                      TrialReported(3.0, "0", 3, 0.3), TrialExited(4.0, "0", False, "killed", crashed=True),
                      ExperimentCancelled(5.0, "cancelled"), TrialExited(6.0, "0", False, "stopped")):
            recorder(event, scheduler.handle(event))
            recorder.flush()
        assert [record.step for record in hermes.store.trials(experiment_id)] == [2]  # back to its checkpoint
        [trial] = remote.client.request("GET", f"/experiments/{experiment_id}/trials")["trials"]
        [standing] = standings(ExperimentView.load(remote, remote.experiment(experiment_id)))  # `hermes results`
        assert trial["step"] == standing.steps == 3 and trial["best_step"] == standing.best_step == 3, trial
