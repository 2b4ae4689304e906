"""The server's REST API: authentication, who sees what, refusals that name the field, every read, and real runs.

Reads are checked on experiments recorded by the real core and StoreRecorder in simulated time
(``hermes.testing.recorded``) against what the store itself says; submissions, cancelling and
trial logs on real experiments that the server's fair-share pool runs (tests/trials/curve.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient  # noqa: E402

from hermes.experiment.spec import ResourcesSpec  # noqa: E402
from hermes.server.api import STORE_INT_MAX  # noqa: E402
from hermes.server.app import ServerConfig, create_app  # noqa: E402
from hermes.server.auth import Accounts, token_id  # noqa: E402
from hermes.server.client import Client, RemoteStore  # noqa: E402
from hermes.store import ExperimentStatus, SqlStore, build_runs  # noqa: E402
from hermes.testing.recorded import experiment_spec, record_simulated  # noqa: E402

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
EXPERIMENT_ROUTES = [
    "/api/experiments/{id}", "/api/experiments/{id}/trials", "/api/experiments/{id}/trials/0",
    "/api/experiments/{id}/metrics", "/api/experiments/{id}/curves", "/api/experiments/{id}/events",
    "/api/experiments/{id}/decisions", "/api/experiments/{id}/timeline", "/api/experiments/{id}/trials/0/log",
]


def give_code(root: Path, user: str) -> Path:
    """Put the test trials (``trials.curve``) in ``user``'s area of the server at ``root``: a spec names only
    files there, and ``real_spec``'s workdir is the area itself."""
    area = root / "users" / user
    shutil.copytree(TESTS / "trials", area / "trials", ignore=shutil.ignore_patterns("__pycache__"))
    return area


def add_user(root: Path, name: str, admin: bool = False) -> str:
    """Make ``name`` a user of the server at ``root``, with the test trials in their area; return their token.
    In this process: `hermes server add-user` takes 2 s, importing the server (one test runs the command itself)."""
    with closing(Accounts(ServerConfig(root=root).database_url)) as accounts:
        token = accounts.add_user(name, admin=admin)
    give_code(root, name)
    return token


def real_spec(name: str, trials: int = 4, steps: int = 4, sleep: float = 0.05, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "trial": {"function": "trials.curve:train"},
        "search": {"sampler": "list", "configs": [
            {"rate": 0.2 + 0.2 * i, "sleep": sleep, "crash": "raise" if i == 1 else "none"} for i in range(trials)
        ]},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": steps},
        "policy": {"name": "rr", "period": 0.2},
        "resources": {"gpus": "none", "cpu_slots": 2},
        **extra,
    }


class Server:
    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.hermes = client.app.state.hermes  # type: ignore[attr-defined]
        self.tokens = {name: self.hermes.accounts.add_user(name, admin=name == "root") for name in
                       ("alice", "bob", "root")}
        for name in self.tokens:
            give_code(self.hermes.config.root, name)

    def as_(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def get(self, path: str, user: str = "alice", **params: Any) -> Any:
        response = self.client.get(path, headers=self.as_(user), params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def simulated(self, owner: str, name: str, trials: int = 12) -> int:
        store = self.hermes.store
        experiment_id = store.submit_experiment(name, experiment_spec(name, trials, 6), owner)
        record_simulated(store, experiment_id, trials, 6, seed=len(name), policy="rr")
        return experiment_id

    def wait(self, experiment_id: int, user: str = "alice", timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            experiment = self.get(f"/api/experiments/{experiment_id}", user)
            if experiment["status"] in ("finished", "failed", "cancelled"):
                return experiment
            time.sleep(0.1)
        raise AssertionError(f"experiment {experiment_id} still {experiment['status']} after {timeout}s")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server whose runner runs nothing: its experiments are recorded by the tests (simulated)."""
    config = ServerConfig(root=tmp_path / "server", max_body=64 * 1024, run_experiments=False)
    with TestClient(create_app(config)) as client:
        yield Server(client)


@pytest.fixture
def running_server(tmp_path: Path) -> Iterator[Server]:
    """A server that runs what is submitted, on a pool of two CPU slots."""
    config = ServerConfig(root=tmp_path / "server", resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.2)
    with TestClient(create_app(config)) as client:
        yield Server(client)


# ---------------------------------------------------------------------- authentication and ownership
def test_every_api_route_needs_a_valid_token(server: Server) -> None:
    experiment_id = server.simulated("alice", "mine")
    paths = ["/api/me", "/api/experiments", "/api/cluster", "/api/cluster/timeline", "/api/users",
             *(p.format(id=experiment_id) for p in EXPERIMENT_ROUTES)]
    for path in paths:
        for headers in ({}, {"Authorization": "Bearer hermes_not-a-token"}, {"Authorization": "Basic YWxpY2U6eA=="}):
            response = server.client.get(path, headers=headers)
            assert response.status_code == 401, (path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
    for method, path in [("post", "/api/experiments"), ("post", f"/api/experiments/{experiment_id}/cancel"),
                         ("put", f"/api/experiments/{experiment_id}/weight"), ("put", "/api/users/alice/weight")]:
        assert server.client.request(method, path, json={"weight": 2}).status_code == 401
    # a token in the URL is never taken: it would end up in access logs
    assert server.client.get("/api/me", params={"token": server.tokens["alice"]}).status_code == 401
    assert server.get("/api/me") == {"name": "alice", "admin": False}


def test_another_users_experiment_is_not_found(server: Server) -> None:
    alices = server.simulated("alice", "alices")
    bobs = server.simulated("bob", "bobs")
    assert [e["name"] for e in server.get("/api/experiments", "alice")] == ["alices"]
    assert [e["name"] for e in server.get("/api/experiments", "bob")] == ["bobs"]
    assert [e["name"] for e in server.get("/api/experiments", "root")] == ["alices", "bobs"]
    for path in EXPERIMENT_ROUTES:
        response = server.client.get(path.format(id=bobs), headers=server.as_("alice"))
        assert response.status_code == 404, (path, response.text)
        assert server.client.get(path.format(id=bobs), headers=server.as_("root")).status_code == 200, path
        assert server.client.get(path.format(id=alices), headers=server.as_("alice")).status_code == 200, path
    assert server.client.get("/api/experiments/999", headers=server.as_("root")).status_code == 404
    response = server.client.post(f"/api/experiments/{bobs}/cancel", headers=server.as_("alice"))
    assert response.status_code == 404
    response = server.client.put(f"/api/experiments/{bobs}/weight", json={"weight": 5}, headers=server.as_("alice"))
    assert response.status_code == 404
    assert server.hermes.store.experiment(bobs).weight == 1.0
    server.hermes.store.set_status(bobs, ExperimentStatus.RUNNING)  # one that ended keeps its weight (409)
    response = server.client.put(f"/api/experiments/{bobs}/weight", json={"weight": 5}, headers=server.as_("bob"))
    changed, read = response.json(), server.get(f"/api/experiments/{bobs}", "bob")
    assert changed["weight"] == 5.0 and changed["trials"] == 12  # the record a GET gives: its trials were null
    assert changed == {**read, "spec": None}
    # the cluster view names only the caller; others are one row
    users = [row["user"] for row in server.get("/api/cluster", "alice")["users"]]
    assert "bob" not in users


def test_tokens_are_stored_hashed(server: Server, tmp_path: Path) -> None:
    database = (tmp_path / "server" / "hermes.db").read_bytes()
    for token in server.tokens.values():
        assert token.encode() not in database
        assert token.removeprefix("hermes_").encode() not in database


# ---------------------------------------------------------------------- refusals
def test_malformed_requests_are_refused_naming_the_field(server: Server) -> None:
    def submit(body: Any, **kwargs: Any) -> Any:
        return server.client.post("/api/experiments", headers=server.as_("alice"), json=body, **kwargs)

    json_headers = {**server.as_("alice"), "content-type": "application/json"}
    response = server.client.post("/api/experiments", content=b'{"spec": {"name": ', headers=json_headers)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"
    response = submit({"weight": 1})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "spec"]
    for weight in (-1, 1e308, 1e-9, True, "2.5"):  # ratios, from a millionth to a million (true is no 1)
        response = submit({"spec": real_spec("w"), "weight": weight})
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "weight"]
    bad = real_spec("bad")
    bad["search"] = {"trials": 3, "space": {"lr": {"type": "loguniform", "low": 0, "high": 1}}}
    response = submit({"spec": bad})
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "spec", "search", "space", "lr", "low"] and "> 0" in problem["msg"]
    outside = real_spec("outside", storage={"dir": "/tmp/elsewhere", "allow_outside": True})
    response = submit({"spec": outside})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "spec", "storage", "dir"]
    response = server.client.put("/api/experiments/1/weight", json={"weight": "heavy"}, headers=server.as_("alice"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "weight"]
    for body in (b'{"weight": Infinity}', b'{"weight": NaN}'):  # Python's JSON reads them; a 422 still is JSON
        response = server.client.put("/api/experiments/1/weight", content=body, headers=json_headers)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "weight"], body
        assert response.json()["detail"][0]["msg"] == "Input should be a finite number", body  # not "<= 1000000"
    endless = real_spec("endless", policy={"name": "hermes", "params": {"ageing": float("inf")}})
    response = server.client.post("/api/experiments", content=json.dumps({"spec": endless}), headers=json_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "spec", "policy", "params", "ageing"]
    assert server.hermes.store.experiments() == []


def test_oversized_payloads_are_refused(server: Server) -> None:
    big = {"spec": {**real_spec("big"), "description": "x" * 70_000}}
    response = server.client.post("/api/experiments", json=big, headers=server.as_("alice"))
    assert response.status_code == 413
    chunks = iter([b'{"spec": {"description": "', b"x" * 40_000, b"x" * 40_000, b'"}}'])
    response = server.client.post(  # no Content-Length: counted as it streams in
        "/api/experiments", content=chunks, headers={**server.as_("alice"), "content-type": "application/json"}
    )
    assert response.status_code == 413
    assert server.hermes.store.experiments() == []


def test_an_id_no_store_holds_is_not_found_and_a_cursor_past_one_is_refused_naming_it(server: Server) -> None:
    """A store's ids have 32 bits (PostgreSQL's integer): an id past them is answered as a missing experiment (as
    another user's); a cursor past them, which no answer gives, with 422 naming it."""
    alices = server.simulated("alice", "alices")
    bobs = server.simulated("bob", "bobs")
    past = STORE_INT_MAX + 1
    for experiment_id in (past, -past - 1, bobs):
        for path in EXPERIMENT_ROUTES:
            response = server.client.get(path.format(id=experiment_id), headers=server.as_("alice"))
            assert response.status_code == 404, (path, response.text)
            assert response.json() == {"detail": f"no experiment {experiment_id}"}
        response = server.client.post(f"/api/experiments/{experiment_id}/cancel", headers=server.as_("alice"))
        assert response.status_code == 404, response.text
        response = server.client.put(f"/api/experiments/{experiment_id}/weight", json={"weight": 2},
                                     headers=server.as_("alice"))
        assert response.status_code == 404, response.text
    for route, cursor in [("metrics", "after"), ("curves", "after"), ("events", "after"), ("decisions", "after"),
                          ("trials", "since"), ("timeline", "since")]:
        response = server.client.get(f"/api/experiments/{alices}/{route}", params={cursor: past},
                                     headers=server.as_("alice"))
        assert response.status_code == 422, (route, response.text)
        assert response.json()["detail"][0]["loc"] == ["query", cursor], route
        server.get(f"/api/experiments/{alices}/{route}", **{cursor: past - 1})  # the last a store holds: nothing after
    response = server.client.get("/api/cluster/timeline", params={"since": f"{alices}:{'9' * 5000}"},
                                 headers=server.as_("alice"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "since"]
    for since in (f"{alices}:{past}", f"{alices}:{'9' * 19}", f"{past}:0"):  # within the pattern's 19 digits
        response = server.client.get("/api/cluster/timeline", params={"since": since}, headers=server.as_("alice"))
        assert response.status_code == 422, (since, response.text)
        assert response.json()["detail"][0]["loc"] == ["query", "since"]
    server.get("/api/cluster/timeline", since=f"{alices}:{past - 1}")
    assert server.hermes.store.experiment(bobs).weight == 1.0


def test_a_plug_in_of_ones_own_is_refused_as_the_server_would_import_it(server: Server, capsys) -> None:
    """``module:Class`` names a policy, a stopper or a searcher of one's own, which the spec's check imports: any
    installed module ran in the server's process (``venv.__main__`` built a virtualenv in its folder, a 500)."""
    refusals = [
        (real_spec("p", policy={"name": "this:Policy"}), ["body", "spec", "policy", "name"]),
        (real_spec("s", policy={"name": "rr", "stopper": {"name": "this:Stopper"}}),
         ["body", "spec", "policy", "stopper", "name"]),
        (real_spec("b", policy="this:Policy"), ["body", "spec", "policy"]),  # bare names, as the spec takes them
        (real_spec("t", policy={"name": "rr", "stopper": "this:Stopper"}), ["body", "spec", "policy", "stopper"]),
        ({**real_spec("q"), "search": {**real_spec("q")["search"], "sampler": "this:Searcher"}},
         ["body", "spec", "search", "sampler"]),
        ({**real_spec("r"), "search": {**real_spec("r")["search"], "sampler": {"name": "this:Searcher"}}},
         ["body", "spec", "search", "sampler", "name"]),
    ]
    for spec, loc in refusals:
        response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
        assert response.status_code == 422, (loc, response.text)
        [problem] = response.json()["detail"]
        assert problem["loc"] == loc and "module:Class" in problem["msg"], problem
    assert "The Zen of Python" not in capsys.readouterr().out  # `this` prints it when imported
    assert server.hermes.store.experiments() == []
    bare = real_spec("m", policy={"name": "rr", "stopper": "median"})  # a built-in's bare name is taken
    assert server.client.post("/api/experiments", json={"spec": bare}, headers=server.as_("alice")).status_code == 201


def test_a_nul_character_is_refused_naming_its_field(server: Server) -> None:
    """No path, command argument or environment variable can carry a NUL: one is refused like any bad field."""
    refusals = [
        ({"spec": real_spec("w", trial={"function": "trials.curve:train", "workdir": "a\0b"})},
         ["body", "spec", "trial", "workdir"]),
        ({"spec": real_spec("s", storage={"dir": "a\0b"})}, ["body", "spec", "storage", "dir"]),
        ({"spec": real_spec("c", trial={"command": "python a\0b.py"})}, ["body", "spec", "trial", "command"]),
        ({"spec": real_spec("f"), "folder": "a\0b"}, ["body", "folder"]),
    ]
    for body, loc in refusals:
        response = server.client.post("/api/experiments", json=body, headers=server.as_("alice"))
        assert response.status_code == 422, (loc, response.text)
        [problem] = response.json()["detail"]
        assert problem["loc"] == loc and "NUL" in problem["msg"], problem
    assert server.hermes.store.experiments() == []


def test_a_lone_surrogate_is_refused_naming_its_field(server: Server) -> None:
    """JSON's ``"\\ud800"`` reads as text that no UTF-8 reply can hold: the experiment was stored and started, the
    reply failed (500), a retry was told the name is taken, and every read of it (``hermes list`` included) was
    a 500."""
    lone = "bad \ud800 char"
    refusals = [
        ({"spec": {**real_spec("d"), "description": lone}}, ["body", "spec", "description"]),
        ({"spec": real_spec("v", search={"sampler": "grid", "space": {"x": {"type": "grid", "values": [lone]}}})},
         ["body", "spec", "search", "space", "x", "values", "0"]),
        ({"spec": real_spec("k", search={"sampler": "grid", "space": {lone: {"type": "grid", "values": [1]}}})},
         ["body", "spec", "search", "space", "bad \\ud800 char"]),
        ({"spec": real_spec("f"), "folder": lone}, ["body", "folder"]),
    ]
    json_headers = {**server.as_("alice"), "content-type": "application/json"}
    for body, loc in refusals:
        response = server.client.post("/api/experiments", content=json.dumps(body), headers=json_headers)  # \\ud800
        assert response.status_code == 422, (loc, response.text)
        [problem] = response.json()["detail"]
        assert problem["loc"] == loc and ("surrogate" in problem["msg"] or "unicode" in problem["msg"]), problem
    assert server.hermes.store.experiments() == []


def test_a_body_nested_too_deep_is_refused_at_any_depth(server: Server) -> None:
    """A body nesting arrays and objects past 64 levels is refused before it is parsed, however deep: parsing
    it, echoing it in a 422, or walking the spec would recurse past Python's stack."""
    json_headers = {**server.as_("alice"), "content-type": "application/json"}
    spec = json.dumps({"spec": {**real_spec("deep"), "description": "HOLE"}})
    experiment_id = server.simulated("alice", "weighed")
    for depth in (64, 500, 1_000, 30_000):
        deep = "[" * depth + "]" * depth
        for method, path, body in [("post", "/api/experiments", spec.replace('"HOLE"', deep)),
                                   ("post", "/api/experiments", f'{{"spec": {deep}}}'),
                                   ("put", f"/api/experiments/{experiment_id}/weight", f'{{"weight": {deep}}}')]:
            response = server.client.request(method, path, content=body, headers=json_headers)
            assert response.status_code == 422, (depth, path, response.text)
            [problem] = response.json()["detail"]
            assert problem["loc"] == ["body"] and "deeper than 64 levels" in problem["msg"], problem
    assert [e.name for e in server.hermes.store.experiments()] == ["weighed"]
    # brackets in strings are no nesting
    response = server.client.post("/api/experiments", content=spec.replace("HOLE", '\\"' + "[{" * 100),
                                  headers=json_headers)
    assert response.status_code == 201, response.text
    # a string never ended, of escaped quotes: read once, not again from each quote (time in the square of its
    # length: 64 KiB held every request for 15 s, without a token, and the largest body an hour)
    started = time.monotonic()
    response = server.client.post("/api/experiments", content=b'"' + b'\\"' * 30_000, headers=json_headers)
    assert response.status_code == 422 and time.monotonic() - started < 3


def test_names_are_per_user_and_a_users_taken_name_is_a_conflict(server: Server) -> None:
    server.simulated("bob", "taken")
    response = server.client.post("/api/experiments", json={"spec": real_spec("taken")}, headers=server.as_("alice"))
    assert response.status_code == 201, response.text  # bob's name is not alice's business
    again = server.client.post("/api/experiments", json={"spec": real_spec("taken")}, headers=server.as_("alice"))
    assert again.status_code == 409 and "you have an experiment named 'taken'" in again.json()["detail"]
    assert [(e["name"], e["owner"]) for e in server.get("/api/experiments", "root")] == [("taken", "bob"),
                                                                                        ("taken", "alice")]


# ---------------------------------------------------------------------- the user's area
def test_a_spec_names_no_file_outside_its_users_area(server: Server, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = server.hermes.config.root
    area = root / "users" / "alice"
    outside = tmp_path / "outside"
    (outside / "pkg").mkdir(parents=True)
    (outside / "secret.py").write_text("def train(config, reporter):\n    pass\n")
    (outside / "pkg" / "__init__.py").write_text("")
    (outside / "pkg" / "mod.py").write_text("def train(config, reporter):\n    pass\n")
    code = area / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    (code / "linked.py").symlink_to(outside / "secret.py")  # links inside the area that point out of it
    (code / "pkg").symlink_to(outside / "pkg")
    (area / "out").symlink_to(outside)
    (root / "shared.py").write_text("def train(config, reporter):\n    pass\n")  # in the root, not in an area
    monkeypatch.syspath_prepend(str(root))

    def command(line: str, **space: Any) -> dict[str, Any]:
        spec = real_spec("c", trial={"command": line, "workdir": "code"})
        spec["search"] = {"trials": 2, "space": space or {"lr": {"type": "uniform", "low": 0.1, "high": 1}}}
        return spec

    def refused(spec: dict[str, Any], field: str, user: str = "alice") -> str:
        response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_(user))
        assert response.status_code == 422, (field, response.text)
        [problem] = response.json()["detail"]
        assert problem["loc"] == ["body", "spec", *field.split(".")], (field, problem)
        return problem["msg"]

    message = refused(real_spec("w", trial={"function": "secret:train", "workdir": str(outside)}), "trial.workdir")
    assert "outside your area" in message
    # nothing outside is looked at: a missing folder there is refused alike, without saying it is missing
    assert "outside your area" in refused(real_spec("w", trial={"function": "x:f", "workdir": "/no/such"}),
                                          "trial.workdir")
    refused(real_spec("w", trial={"function": "trials.curve:train", "workdir": "../bob"}), "trial.workdir")
    refused(real_spec("w", trial={"function": "trials.curve:train", "workdir": "out"}), "trial.workdir")
    refused(real_spec("w", trial={"function": "trials.curve:train", "workdir": "../bob"}), "trial.workdir", "root")
    refused(real_spec("w", storage={"dir": "out/runs"}), "storage.dir")
    (area / "runs").mkdir(exist_ok=True)
    (area / "runs" / "taken").symlink_to(root / "users" / "bob")  # the experiment's own folder: bob's files were
    assert "'runs' holds taken, which leads outside" in refused(real_spec("taken", storage={"dir": "runs"}),
                                                                "storage.dir")  # written
    message = refused(real_spec("w", trial={"function": "linked:train", "workdir": "code"}), "trial.function")
    assert message.startswith("'linked.py' (imported from the workdir)") and str(outside) not in message
    refused(real_spec("w", trial={"function": "pkg.mod:train", "workdir": "code"}), "trial.function")
    assert "server's root" in refused(real_spec("w", trial={"function": "shared:train"}), "trial.function")
    refused(command(f"python {outside}/secret.py --lr {{lr}}"), "trial.command")
    refused(command("python ../../../../outside/secret.py --lr {lr}"), "trial.command")
    refused(command("python linked.py --lr {lr}"), "trial.command")
    refused(command("python train.py --config=/etc/passwd --lr {lr}"), "trial.command")
    refused(command("pkg/tool --lr {lr}"), "trial.command")  # a program in a linked folder
    refused(command("../.. --lr {lr}"), "trial.command")
    # {trial_dir}, the trial's own folder, is checked where it leads: a crash of the check (KeyError) was a 500
    refused(command(f"python train.py --lr {{lr}} --out={{trial_dir}}/{'../' * 8}{outside.name}"), "trial.command")
    data = {"type": "choice", "values": ["train.py", "../../../../outside/secret.py"]}
    assert "argument 1" in refused(command("python {data}", data=data), "trial.command")
    foreign = {"sampler": {"optuna": "trials.curve.Sampler"}, "trials": 2,
               "space": {"rate": {"type": "uniform", "low": 0, "high": 1}}}
    refused(real_spec("w", search=foreign), "search.sampler.optuna")
    refused(real_spec("w", engine="ray"), "engine")
    assert server.hermes.store.experiments() == []

    # inside the area, links included; a program on the server's PATH, or a venv's python that links out of it
    (code / "inside.py").symlink_to(code / "train.py")
    (area / "venv" / "bin").mkdir(parents=True)
    (area / "venv" / "bin" / "python").symlink_to(sys.executable)
    accepted = [
        real_spec("f1"),
        real_spec("f2", trial={"function": "trials.curve:train", "workdir": str(area)}, storage={"dir": "code/runs"}),
        command("python inside.py --lr={lr} --out=runs/x"),
        command("../venv/bin/python train.py {data}", data={"type": "choice", "values": ["a", "b/c"]}),
        command("python train.py --lr={lr} --save_dir={trial_dir}/ckpt"),
    ]
    for index, spec in enumerate(accepted):
        spec["name"] = f"ok{index}"
        response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
        assert response.status_code == 201, response.text
        assert Path(response.json()["spec"]["trial"]["workdir"]).is_relative_to(area.resolve())


def test_a_spec_is_read_in_the_folder_of_the_area_it_names(server: Server) -> None:
    """``folder``: where the spec's file lies in the area, as ``hermes submit`` sends it; never outside the area."""
    area = (server.hermes.config.root / "users" / "alice").resolve()
    spec = real_spec("nested", trial={"function": "trials.curve:train", "workdir": ".."}, storage={"dir": "../runs"})
    response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
    assert response.status_code == 422 and "outside your area" in response.text  # read from the area itself
    response = server.client.post("/api/experiments", json={"spec": spec, "folder": "specs"},
                                  headers=server.as_("alice"))
    assert response.status_code == 201, response.text
    stored = response.json()["spec"]
    assert (stored["trial"]["workdir"], stored["storage"]["dir"]) == (str(area), str(area / "runs"))
    for outside in ("..", "../bob", "/tmp"):
        response = server.client.post("/api/experiments", json={"spec": {**spec, "name": "x"}, "folder": outside},
                                      headers=server.as_("alice"))
        assert response.status_code == 422, outside
        assert response.json()["detail"][0]["loc"] == ["body", "folder"], outside


def test_the_pool_checks_a_spec_again_when_it_takes_it_up(tmp_path: Path) -> None:
    root = tmp_path / "server"
    with TestClient(create_app(ServerConfig(root=root, run_experiments=False))) as client:
        token = client.app.state.hermes.accounts.add_user("alice")  # type: ignore[attr-defined]
        area = give_code(root, "alice")
        (area / "code").mkdir()
        shutil.copytree(area / "trials", area / "code" / "trials")
        spec = real_spec("moved", trial={"function": "trials.curve:train", "workdir": "code"})
        response = client.post("/api/experiments", json={"spec": spec}, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 201, response.text
    shutil.rmtree(area / "code")  # while it waits, queued, its workdir becomes a link out of the area
    shutil.copytree(area / "trials", tmp_path / "elsewhere" / "trials")
    (area / "code").symlink_to(tmp_path / "elsewhere")
    config = ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        failed = server.wait(response.json()["id"])
        store = client.app.state.hermes.store  # type: ignore[attr-defined]
        assert store.metrics(failed["id"]) == []  # nothing ran
    assert failed["status"] == "failed"
    assert "trial.workdir" in failed["error"] and "outside your area" in failed["error"]


def _refused(server: Server, spec: dict[str, Any], field: str, user: str = "alice", folder: str = "") -> str:
    """The message of the one problem a submission of ``spec`` is refused with, which names ``field``."""
    response = server.client.post("/api/experiments", json={"spec": spec, "folder": folder}, headers=server.as_(user))
    assert response.status_code == 422, (field, response.text)
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", *(["folder"] if field == "folder" else ["spec", *field.split(".")])], problem
    return problem["msg"]


def _command_spec(name: str, line: str) -> dict[str, Any]:
    return {**real_spec(name, trial={"command": line}),
            "search": {"trials": 2, "space": {"lr": {"type": "uniform", "low": 0.1, "high": 1}}}}


def test_a_path_the_server_cannot_read_is_refused_naming_its_field_not_a_500(server: Server) -> None:
    """Links that loop (Path.resolve's RuntimeError) and a name too long (os.stat's OSError) were a 500 at
    submission, and a loop where a trial's log is read too: bad input is a 4xx, the path as the spec wrote it."""
    area = server.hermes.config.root / "users" / "alice"
    (area / "loop").symlink_to("loop")
    (area / "runs").mkdir()
    (area / "runs" / "looped").symlink_to("looped")  # the experiment's own folder
    long = "b" * 300
    cases = [
        (real_spec("w", trial={"function": "trials.curve:train", "workdir": "loop"}), "trial.workdir", "'loop'"),
        (real_spec("s", storage={"dir": "loop/runs"}), "storage.dir", "'loop/runs'"),
        (real_spec("looped"), "storage.dir", "'runs' holds looped, which"),
        (real_spec("n", storage={"dir": long}), "storage.dir", repr(long)),
        (real_spec("n", trial={"function": "trials.curve:train", "workdir": f"trials/{long}"}), "trial.workdir",
         repr(f"trials/{long}")),
        (_command_spec("c", "python trials/curve.py --data=loop/x --lr {lr}"), "trial.command",
         "argument 2 ('--data=loop/x')"),
        (_command_spec("c", "loop/python trials/curve.py --lr {lr}"), "trial.command", "argument 0 ('loop/python')"),
    ]
    for spec, field, shown in cases:
        message = _refused(server, spec, field)
        assert message.startswith(f"{shown} cannot be read on the server: "), (field, message)
        assert str(area) not in message
    assert "its links go round in a loop" in _refused(server, real_spec("f"), "folder", folder="loop/specs")
    assert "File name too long" in _refused(server, real_spec("n", storage={"dir": long}), "storage.dir")
    assert server.hermes.store.experiments() == []
    logged = server.simulated("alice", "looped")  # its trials' folder is the loop: no log to show, not a 500
    response = server.client.get(f"/api/experiments/{logged}/trials/0/log", headers=server.as_("alice"))
    assert response.status_code == 404, response.text


def test_a_tilde_path_is_refused_as_the_servers_home_not_the_users(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec reads ``~`` as the home of whoever runs it: on the server, the server's account. The area's check read
    it as a folder named ``~`` in the area, so such a spec was taken, and named files outside (the refusals then said
    which functions a module there defines)."""
    home = tmp_path / "server-home"
    home.mkdir()
    (home / "secret_tool.py").write_text("def train(config):\n    pass\n")
    monkeypatch.setenv("HOME", str(home))
    cases = [
        (real_spec("t1", trial={"function": "secret_tool:train", "workdir": "~"}), "trial.workdir", "~"),
        (real_spec("t2", trial={"function": "secret_tool:other", "workdir": "~/"}), "trial.workdir", "~/"),
        (real_spec("t3", storage={"dir": "~/bob-writes-here"}), "storage.dir", "~/bob-writes-here"),
        (real_spec("t4", storage={"dir": "~root/runs"}), "storage.dir", "~root/runs"),
    ]
    for spec, field, written in cases:
        message = _refused(server, spec, field, "bob")
        assert message == (f"{written!r} starts with ~, the home of the server's account, not yours: name a folder "
                           "in your area"), message
    assert server.hermes.store.experiments() == []
    assert list(home.iterdir()) == [home / "secret_tool.py"]


def test_a_refusal_names_the_path_as_written_never_where_a_link_leads(server: Server, tmp_path: Path) -> None:
    """A refusal said where a link points ("is /srv/.../secret-dataset, outside your area"): with a link in another
    user's area, or /proc/<pid>/fd/N of the server's own open files, one user read where another's files are."""
    secret = tmp_path / "alices-private-store" / "secret-dataset"
    secret.mkdir(parents=True)
    root = server.hermes.config.root
    (root / "users" / "alice" / "data").symlink_to(secret)
    (root / "users" / "bob" / "mine").symlink_to(secret)
    with open(secret / "weights.bin", "w") as held:  # a file the server's process holds open
        fd = held.fileno()
        proc = ("/proc/self/cwd", f"/proc/self/fd/{fd}", f"/proc/{os.getpid()}/fd/{fd}")
        for written in ("../alice/data", "mine", *proc):
            spec = real_spec("probe", trial={"function": "trials.curve:train", "workdir": written})
            message = _refused(server, spec, "trial.workdir", "bob")
            assert message == f"{written!r} leads outside your area on the server", message
        message = _refused(server, real_spec("probe", storage={"dir": "mine"}), "storage.dir", "bob")
        assert message == "'mine' leads outside your area on the server"
        message = _refused(server, _command_spec("probe", f"python x.py --data=/proc/self/fd/{fd}"), "trial.command",
                           "bob")
        assert message == f"argument 2 ('--data=/proc/self/fd/{fd}') leads outside your area on the server"


def test_a_spec_whose_check_raises_unexpectedly_is_refused_in_a_line_not_a_500(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The last line of defence: an error no check expected while a spec is checked (here Python's parser, reading
    the trial's module to find its function, recursed too deep) was a 500; it is a 422 of one line, its traceback
    in the server's log."""
    (server.hermes.config.root / "users" / "alice" / "deep.py").write_text("x = " + "-" * 5000 + "1\n")
    with caplog.at_level(logging.ERROR, logger="hermes.server"):
        spec = real_spec("deep", trial={"function": "deep:f"})
        response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"][:2] == ["body", "spec"] and "\n" not in problem["msg"], problem
    if problem["loc"] == ["body", "spec"]:  # the server's own catch, not a check's refusal naming a field
        assert problem["msg"] == "spec: the server could not check it (RecursionError); its log has the details"
        assert "Traceback" in caplog.text and "RecursionError" in caplog.text
    assert server.hermes.store.experiments() == []


def test_a_link_loop_made_while_an_experiment_waits_fails_it_alone_and_the_pool_goes_on(tmp_path: Path) -> None:
    """Bob's storage.dir became a link loop between his submission and the pool's take-up: Path.resolve's
    RuntimeError stopped the pool, which started again from the store and met the same record, again and again,
    while every user's experiments stayed interrupted."""
    root = tmp_path / "server"
    with TestClient(create_app(ServerConfig(root=root, run_experiments=False))) as client:
        server = Server(client)
        looped = client.post("/api/experiments", json={"spec": real_spec("looped", storage={"dir": "st-loop"})},
                             headers=server.as_("bob")).json()["id"]
        calm = client.post("/api/experiments", json={"spec": real_spec("calm")},
                           headers=server.as_("alice")).json()["id"]
    (root / "users" / "bob" / "st-loop").symlink_to("st-loop")
    config = ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with TestClient(create_app(config)) as client:
        server.client = client
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        pool = hermes.pool
        failed = server.wait(looped, "bob", timeout=30)
        finished = server.wait(calm, "alice", timeout=30)
        assert hermes.pool is pool  # never stopped and started again
    assert failed["status"] == "failed", failed
    assert failed["error"].startswith("spec: storage.dir: ") and "its links go round in a loop" in failed["error"]
    assert finished["status"] == "finished" and finished["by_state"] == {"completed": 3, "failed": 1}


def test_a_trial_log_is_read_only_inside_its_experiments_directory(server: Server, tmp_path: Path) -> None:
    experiment_id = server.simulated("alice", "logged")
    trial_dir = server.hermes.config.root / "users" / "alice" / "runs" / "logged" / "trials" / "0"
    trial_dir.mkdir(parents=True)
    (trial_dir / "stdout.log").write_text("epoch 1\n")
    path = f"/api/experiments/{experiment_id}/trials/0/log"
    assert server.get(path)["text"] == "epoch 1\n"
    secret = tmp_path / "secret.txt"
    secret.write_text("the admin's notes")
    (trial_dir / "stderr.log").symlink_to(secret)  # a trial's code may leave a link where its log goes
    response = server.client.get(path, params={"stream": "stderr"}, headers=server.as_("alice"))
    assert response.status_code == 404 and "notes" not in response.text
    for trial in ("..", "..%2F..%2F..", "0%2F..%2F.."):
        assert server.client.get(f"/api/experiments/{experiment_id}/trials/{trial}/log",
                                 headers=server.as_("alice")).status_code == 404, trial
    # a user's area may be a link to a shared mount: their trials' logs are read there
    mount = tmp_path / "mount" / "carol"
    mount.mkdir(parents=True)
    (server.hermes.config.root / "users" / "carol").symlink_to(mount)
    carol = server.hermes.accounts.add_user("carol")
    linked = server.simulated("carol", "linked")
    (mount / "runs" / "linked" / "trials" / "0").mkdir(parents=True)
    (mount / "runs" / "linked" / "trials" / "0" / "stdout.log").write_text("epoch 1 on the mount\n")
    response = server.client.get(f"/api/experiments/{linked}/trials/0/log",
                                 headers={"Authorization": f"Bearer {carol}"})
    assert response.status_code == 200 and response.json()["text"] == "epoch 1 on the mount\n", response.text
    # an experiment that `hermes run` wrote into the server's database: no owner, its files beside the database
    store = server.hermes.store
    local = store.create_or_open_experiment("local", experiment_spec("local", 2, 2))
    record_simulated(store, local, 2, 2, policy="rr")
    assert server.get(f"/api/experiments/{local}/trials/0/log", "root") == {"offset": 0, "size": 0, "text": ""}


# ---------------------------------------------------------------------- users' weights
def test_an_admin_sets_a_users_weight(server: Server) -> None:
    def put(name: str, body: Any, user: str = "root", **kwargs: Any) -> Any:
        return server.client.put(f"/api/users/{name}/weight", json=body, headers=server.as_(user), **kwargs)

    response = put("bob", {"weight": 3})
    assert response.status_code == 200 and response.json() == {"user": "bob", "admin": False, "weight": 3.0}
    assert server.hermes.store.owner_weights() == {"bob": 3.0}
    assert [(u["user"], u["weight"]) for u in server.get("/api/users", "root")] == [
        ("alice", 1.0), ("bob", 3.0), ("root", 1.0)]
    assert server.get("/api/users", "bob") == [{"user": "bob", "admin": False, "weight": 3.0}]
    for name in ("bob", "alice", "nobody"):  # a user may not change weights, not even their own
        response = put(name, {"weight": 5}, user="alice")
        assert response.status_code == 403 and "admin" in response.json()["detail"]
    assert put("nobody", {"weight": 2}).status_code == 404
    for bad in ({"weight": 0}, {"weight": -1}, {"weight": 1e308}, {"weight": "heavy"}, {}, {"weight": 2, "extra": 1},
                {"weight": True}, {"weight": "2.5"}):  # true was a weight of 1, silently
        response = put("bob", bad)
        assert response.status_code == 422, bad
        assert response.json()["detail"][0]["loc"][:2] == ["body", "weight" if "extra" not in bad else "extra"]
    response = server.client.put("/api/users/bob/weight", content=b'{"weight": Infinity}',
                                 headers={**server.as_("root"), "content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "weight"]
    assert server.hermes.store.owner_weights() == {"bob": 3.0}


def test_a_users_weight_moves_their_share_in_the_running_pool(running_server: Server) -> None:
    server = running_server
    ids = {}
    for user in ("alice", "bob"):
        response = server.client.post("/api/experiments", json={"spec": real_spec(f"{user}-w", trials=6, steps=60)},
                                      headers=server.as_(user))
        assert response.status_code == 201, response.text
        ids[user] = response.json()["id"]

    def shares() -> dict[str, tuple[float | None, float]]:
        return {row["user"]: (row["weight"], row["share"]) for row in server.get("/api/cluster", "root")["users"]}

    deadline = time.monotonic() + 30
    while shares() != {"alice": (1.0, 1.0), "bob": (1.0, 1.0)}:
        assert time.monotonic() < deadline, shares()
        time.sleep(0.05)
    response = server.client.put("/api/users/alice/weight", json={"weight": 3}, headers=server.as_("root"))
    assert response.status_code == 200
    while (found := shares()) != {"alice": (3.0, pytest.approx(1.5)), "bob": (1.0, pytest.approx(0.5))}:
        assert time.monotonic() < deadline, found  # the pool takes it up at its next look at the store
        time.sleep(0.05)
    assert [row["weight"] for row in server.get("/api/cluster", "alice")["users"]] == [None, 3.0]
    for user, experiment_id in ids.items():
        server.client.post(f"/api/experiments/{experiment_id}/cancel", headers=server.as_(user))
        assert server.wait(experiment_id, user)["status"] == "cancelled"


# ---------------------------------------------------------------------- reads
def test_reads_agree_with_the_store_and_follow_cursors(server: Server) -> None:
    experiment_id = server.simulated("alice", "sim", trials=12)
    store = server.hermes.store
    path = f"/api/experiments/{experiment_id}"
    detail = server.get(path)
    assert detail["status"] == "finished" and detail["trials"] == 12 and detail["spec"]["name"] == "sim"
    assert sum(detail["by_state"].values()) == 12

    trials = server.get(f"{path}/trials")
    records = {t.trial_id: t for t in store.trials(experiment_id)}
    assert {t["trial"] for t in trials["trials"]} == set(records)
    reports = store.metrics(experiment_id)
    for summary in trials["trials"]:
        own = [r.values["value"] for r in reports if r.trial_id == summary["trial"]]
        assert summary["reports"] == len(own) and summary["state"] == records[summary["trial"]].state.value
        finite = [v for v in own if v == v and abs(v) != float("inf")]
        assert summary["best"] == (max(finite) if finite else None)
    assert detail["best"] == max(t["best"] for t in trials["trials"] if t["best"] is not None)
    assert server.get(f"{path}/trials", since=trials["version"])["trials"] == []  # nothing new

    pages, cursor = [], 0
    while True:
        page = server.get(f"{path}/metrics", after=cursor, limit=7)
        if not page["metrics"]:
            break
        pages += page["metrics"]
        cursor = page["cursor"]
    assert [(m["trial"], m["step"]) for m in pages] == [(r.trial_id, r.step) for r in reports]
    curves = server.get(f"{path}/curves")
    assert curves["trial"] == [r.trial_id for r in reports] and curves["more"] is False
    assert server.get(f"{path}/curves", after=curves["cursor"])["trial"] == []

    events = server.get(f"{path}/events")["events"]
    assert [e["type"] for e in events] == [type(e).__name__ for e in store.events(experiment_id)]
    decisions = server.get(f"{path}/decisions")
    assert [(d["type"], d["trial_id"]) for d in decisions["decisions"]] == [
        (type(r.decision).__name__, r.decision.trial_id) for r in store.decisions(experiment_id)
    ]
    assert all(" because " in d["reason"] for d in decisions["decisions"])
    later = server.get(f"{path}/decisions", after=events[len(events) // 2]["seq"])["decisions"]
    assert later == [d for d in decisions["decisions"] if d["seq"] > events[len(events) // 2]["seq"]]

    timeline = server.get(f"{path}/timeline")
    expected = build_runs(store.events(experiment_id), store.decisions(experiment_id))
    runs = sorted(timeline["runs"], key=lambda run: run["index"])  # in the order they last changed
    assert [(r["trial"], r["gpu"], r["started_at"], r["ended_at"], r["ended_by"]) for r in runs] == [
        (r.trial_id, r.gpu, r.started_at, r.ended_at, r.ended_by) for r in expected
    ]
    assert timeline["gpus"] == ["n0/g0", "n0/g1", "n1/g0", "n1/g1"]
    assert any(r["resumed"] for r in timeline["runs"]) and all("start_reason" in r for r in timeline["runs"])
    assert server.get(f"{path}/timeline", since=timeline["version"])["runs"] == []
    assert server.client.get(f"{path}/trials/nope", headers=server.as_("alice")).status_code == 404
    assert server.client.get(f"{path}/trials/..%2F..%2Fx/log", headers=server.as_("alice")).status_code == 404


def test_the_pools_timeline_holds_every_experiments_runs_and_hides_what_others_may_not_see(server: Server) -> None:
    mine, theirs = server.simulated("alice", "mine", trials=8), server.simulated("bob", "theirs", trials=8)
    experiments = {mine: "alice", theirs: "bob"}
    expected = {experiment_id: server.get(f"/api/experiments/{experiment_id}/timeline", owner)["runs"]
                for experiment_id, owner in experiments.items()}
    everything = server.get("/api/cluster/timeline", "root")
    assert not everything["more"] and everything["gpus"] == ["n0/g0", "n0/g1", "n1/g0", "n1/g1"]
    for experiment_id, owner in experiments.items():
        runs = {r["index"]: r for r in everything["runs"] if r["experiment"] == experiment_id}
        assert len(runs) == len(expected[experiment_id]) > 8
        for run in expected[experiment_id]:  # the admin sees each run as its experiment's timeline has it
            assert runs[run["index"]] == {**run, "key": f"{experiment_id}.{run['index']}",
                                          "experiment": experiment_id, "name": server.get(
                                              f"/api/experiments/{experiment_id}", owner)["name"], "owner": owner}
    assert server.get("/api/cluster/timeline", "root", since=everything["cursor"])["runs"] == []

    # alice sees her runs, and bob's as another user's: when and where, not what or why
    seen = server.get("/api/cluster/timeline", "alice")["runs"]
    assert {r["key"] for r in seen} == {r["key"] for r in everything["runs"]}
    hidden = [r for r in seen if r["owner"] == "(other users)"]
    assert len(hidden) == len(expected[theirs])
    for run in hidden:
        assert run["experiment"] is None and run["name"] is None and run["trial"] is None
        assert not any(key.endswith("reason") for key in run)
    assert all(r["owner"] == "alice" and r["name"] == "mine" and "start_reason" in r for r in seen if r not in hidden)

    pages, cursor = [], ""  # pages of 5 miss nothing and repeat nothing
    while True:
        page = server.get("/api/cluster/timeline", "root", since=cursor, limit=5)
        pages += [r["key"] for r in page["runs"]]
        cursor = page["cursor"]
        if not page["more"]:
            break
    assert sorted(pages) == sorted(r["key"] for r in everything["runs"])
    for bad in ("1:2,x", "1", "-1:0"):
        assert server.client.get("/api/cluster/timeline", params={"since": bad},
                                 headers=server.as_("alice")).status_code == 422


def test_the_server_keeps_a_bounded_number_of_digests_and_rebuilds_a_dropped_one_alike(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hermes.server.app.DIGESTS_KEPT", 2)
    ids = [server.simulated("alice", f"sim{i}", trials=6) for i in range(3)]
    first = [server.get(f"/api/experiments/{i}/timeline") for i in ids]  # the first one's digest is dropped
    assert list(server.hermes._digests) == ids[1:]
    assert server.get(f"/api/experiments/{ids[0]}/timeline") == first[0]  # rebuilt from the store, the same
    assert list(server.hermes._digests) == [ids[2], ids[0]]


def test_openapi_documents_every_route(server: Server) -> None:
    paths = server.client.get("/openapi.json").json()["paths"]
    for path in ["/api/experiments", "/api/experiments/{experiment_id}", "/api/experiments/{experiment_id}/cancel",
                 "/api/experiments/{experiment_id}/weight", "/api/experiments/{experiment_id}/trials",
                 "/api/experiments/{experiment_id}/metrics", "/api/experiments/{experiment_id}/decisions",
                 "/api/experiments/{experiment_id}/timeline", "/api/experiments/{experiment_id}/trials/{trial_id}/log",
                 "/api/cluster", "/api/cluster/timeline", "/api/users", "/api/users/{name}/weight"]:
        assert path in paths, path
    assert server.client.get("/").status_code == 200  # the dashboard's page needs no token: it holds no data


# ---------------------------------------------------------------------- real runs
def test_submitted_experiments_run_and_can_be_cancelled(running_server: Server) -> None:
    server = running_server
    first = server.client.post("/api/experiments", json={"spec": real_spec("first")}, headers=server.as_("alice"))
    assert first.status_code == 201 and first.json()["status"] == "queued"
    slow = real_spec("slow", trials=6, steps=200, sleep=0.05)
    second = server.client.post("/api/experiments", json={"spec": slow, "weight": 2}, headers=server.as_("alice"))
    queued = server.client.post("/api/experiments", json={"spec": real_spec("queued")}, headers=server.as_("alice"))
    first_id, second_id, queued_id = (r.json()["id"] for r in (first, second, queued))
    assert second.json()["weight"] == 2.0
    response = server.client.post(f"/api/experiments/{queued_id}/cancel", headers=server.as_("alice"))
    assert response.status_code == 202 and response.json()["cancel_requested"]

    done = server.wait(first_id)
    assert done["status"] == "finished" and done["by_state"] == {"completed": 3, "failed": 1}
    log = server.get(f"/api/experiments/{first_id}/trials/1/log", stream="stderr")
    assert "about to fail at step 2" in log["text"] and log["offset"] == log["size"] > 0
    assert server.get(f"/api/experiments/{first_id}/trials/1/log", stream="stderr", offset=log["offset"])["text"] == ""

    cancelled = server.wait(queued_id)  # the pool never starts it, or stops it at its next look at the store
    assert cancelled["status"] == "cancelled" and set(cancelled["by_state"]) <= {"stopped", "completed", "failed"}

    deadline = time.monotonic() + 30
    while not server.get(f"/api/experiments/{second_id}/curves")["trial"] and time.monotonic() < deadline:
        time.sleep(0.1)
    response = server.client.put(f"/api/experiments/{second_id}/weight", json={"weight": 3},
                                 headers=server.as_("alice"))
    assert response.json()["weight"] == 3.0
    assert server.client.post(f"/api/experiments/{second_id}/cancel", headers=server.as_("alice")).status_code == 202
    cancelled = server.wait(second_id)
    assert cancelled["status"] == "cancelled" and set(cancelled["by_state"]) <= {"stopped", "completed", "failed"}
    assert server.client.post(f"/api/experiments/{second_id}/cancel", headers=server.as_("alice")).status_code == 409
    assert server.get("/api/experiments/" + str(second_id) + "/trials")["trials"][0]["step"] < 200


def _hanging_spec(name: str, *more: dict[str, Any], seconds: float = 2.0) -> dict[str, Any]:
    """A spec whose trial 0 trains slowly, silent for ``seconds`` between its reports (a stop lands at its next
    one); ``more``: the configs of further trials."""
    spec = real_spec(name, trials=1, steps=5)
    spec["search"]["configs"] = [{"rate": 0.5, "sleep": seconds, "crash": "none"}, *more]
    return spec


def _until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def test_a_running_experiments_clock_goes_on_between_its_events(running_server: Server) -> None:
    """Its trial trains on without a report: the experiment's timeline and trials give the pool's clock as their
    ``now``, not the time of its last event, so that the running bar grows; once it ended, the clock stops."""
    server = running_server
    # 3 s between reports: its first is seen up to 0.5 s late (the view's age), then 1 s of silence is awaited, and
    # a loaded machine may add a second before the checks; the next report must not have come by then
    experiment_id = server.client.post("/api/experiments", json={"spec": _hanging_spec("quiet", seconds=3.0)},
                                       headers=server.as_("alice")).json()["id"]
    path = f"/api/experiments/{experiment_id}"
    _until(lambda: [t["reports"] for t in server.get(f"{path}/trials")["trials"]] == [1])
    time.sleep(1.0)  # the trial trains on silently meanwhile: its experiment records nothing
    last_event = server.get(f"{path}/events")["events"][-1]["at"]
    before = server.hermes.pool.executor.now()
    timeline = server.get(f"{path}/timeline")
    trials = server.get(f"{path}/trials")
    assert [run["ended_at"] for run in timeline["runs"]] == [None]  # still running
    assert timeline["now"] >= before >= last_event + 0.9, (timeline["now"], before, last_event)
    assert trials["now"] >= before
    cluster = server.get("/api/cluster/timeline")
    assert cluster["now"] >= before  # the pool's timeline extends it alike

    assert server.client.post(f"{path}/cancel", headers=server.as_("alice")).status_code == 202
    assert server.wait(experiment_id)["status"] == "cancelled"
    ended = server.get(f"{path}/timeline")
    time.sleep(0.3)
    assert server.get(f"{path}/timeline")["now"] == ended["now"] == server.get(f"{path}/events")["events"][-1]["at"]


def test_a_stopped_trial_is_described_as_stopped_and_a_crashed_one_as_crashed(running_server: Server) -> None:
    """Cancelling stops trial 0 (its process answers the Stop with error 'stopped'): its exit is described as a
    stop, in the events and in its run's end reason, never as a failure; trial 1's crashes are crashes."""
    server = running_server
    crashing = {"rate": 0.3, "sleep": 0.05, "crash": "raise"}  # at step 2 of every run: it fails in the end
    experiment_id = server.client.post("/api/experiments", json={"spec": _hanging_spec("stopped", crashing)},
                                       headers=server.as_("alice")).json()["id"]
    path = f"/api/experiments/{experiment_id}"
    _until(lambda: {t["trial"]: t["state"] for t in server.get(f"{path}/trials")["trials"]} == {
        "0": "running", "1": "failed"})
    assert server.client.post(f"{path}/cancel", headers=server.as_("alice")).status_code == 202
    assert server.wait(experiment_id)["by_state"] == {"stopped": 1, "failed": 1}

    exits: dict[str, list[dict[str, Any]]] = {}
    for event in server.get(f"{path}/events")["events"]:
        if event["type"] == "TrialExited":
            exits.setdefault(event["trial_id"], []).append(event)
    assert [(e["error"], e["description"].split(" at ")[0]) for e in exits["0"]] == [("stopped", "trial 0 stopped")]
    assert exits["1"] and all(e["crashed"] and e["description"].startswith("trial 1 crashed (") for e in exits["1"])
    runs = server.get(f"{path}/timeline")["runs"]
    stopped = [run for run in runs if run["trial"] == "0"]
    assert [run["ended_by"] for run in stopped] == ["stopped"]
    assert stopped[0]["end_reason"].startswith("trial 0 stopped at "), stopped[0]
    assert stopped[0]["yield_reason"].startswith("asked to stop because the experiment was cancelled")
    crashed = [run for run in runs if run["trial"] == "1"]
    assert crashed and all(run["ended_by"] == "failed" and run["end_reason"].startswith("trial 1 crashed (")
                           for run in crashed), crashed


def test_two_users_experiments_share_the_pool_at_once(running_server: Server) -> None:
    server = running_server
    ids = {}
    for user in ("alice", "bob"):  # of one name: names are per user
        response = server.client.post("/api/experiments", json={"spec": real_spec("run", trials=2, steps=30)},
                                      headers=server.as_(user))
        assert response.status_code == 201, response.text
        ids[user] = response.json()["id"]
    # both run at once, one slot each: their statuses, and the pool's shares as the cluster view reports them
    deadline = time.monotonic() + 30
    while True:
        statuses = {user: server.get(f"/api/experiments/{ids[user]}", user)["status"] for user in ids}
        cluster = server.get("/api/cluster", "root")
        held = {row["user"]: row["gpus_now"] for row in cluster["users"]}
        if statuses == {"alice": "running", "bob": "running"} and held == {"alice": 1, "bob": 1}:
            break
        assert time.monotonic() < deadline, (statuses, cluster)
        time.sleep(0.05)
    assert cluster["gpus"] == 2
    for row in cluster["users"]:
        assert row["experiments"] == 1 and row["weight"] == 1.0 and row["share"] == pytest.approx(1.0), row
    mine = server.get("/api/cluster", "alice")["users"]  # alice sees bob's use as another user's
    assert [(row["user"], row["gpus_now"], row["weight"]) for row in mine] == [("(other users)", 1, None),
                                                                              ("alice", 1, 1.0)]
    for user, experiment_id in ids.items():
        done = server.wait(experiment_id, user)
        assert done["status"] == "finished" and done["by_state"] == {"completed": 1, "failed": 1}, done
    runs = {user: server.get(f"/api/experiments/{ids[user]}/timeline", user)["runs"] for user in ids}
    (a_start, a_end), (b_start, b_end) = ((min(r["started_at"] for r in rs), max(r["ended_at"] for r in rs))
                                          for rs in runs.values())
    assert a_start < b_end and b_start < a_end  # their runs overlapped in time
    for user, experiment_id in ids.items():  # each kept its own log, trials and files, in its owner's area
        trials = server.get(f"/api/experiments/{experiment_id}/trials", user)["trials"]
        assert len(trials) == 2 and len(server.get(f"/api/experiments/{experiment_id}/events", user)["events"]) > 4
        trials_dir = server.hermes.config.root / "users" / user / "runs" / "run" / "trials"
        checkpoints = list(trials_dir.glob("*/checkpoints/step-*"))
        assert checkpoints, f"no checkpoint of {user}'s run in their area"
    deadline = time.monotonic() + 5  # the pool's shares are as of its last look at the store (poll)
    while server.get("/api/cluster", "root")["users"]:
        assert time.monotonic() < deadline, "finished experiments still hold a share"
        time.sleep(0.05)


def test_the_pools_timeline_shows_who_ran_where_and_why_a_gpu_changed_hands(running_server: Server) -> None:
    """bob's experiment arrives while alice's holds both slots: the pool takes one back at once for his fair
    share. The pool's timeline shows both on the two slots, never two runs on one slot at a time, and the reasons
    say what the pool did."""
    server = running_server
    first = server.client.post("/api/experiments", json={"spec": real_spec("alices-run", trials=4, steps=30)},
                               headers=server.as_("alice")).json()["id"]
    deadline = time.monotonic() + 30
    while {row["user"]: row["gpus_now"] for row in server.get("/api/cluster", "root")["users"]} != {"alice": 2}:
        assert time.monotonic() < deadline, "alice's experiment never held both slots"
        time.sleep(0.05)
    second = server.client.post("/api/experiments", json={"spec": real_spec("bobs-run", trials=2, steps=10)},
                                headers=server.as_("bob")).json()["id"]
    assert server.wait(first, "alice")["status"] == server.wait(second, "bob")["status"] == "finished"
    runs = server.get("/api/cluster/timeline", "root")["runs"]
    assert {r["owner"] for r in runs} == {"alice", "bob"} and {r["gpu"] for r in runs} == {"local/cpu0", "local/cpu1"}
    for gpu in ("local/cpu0", "local/cpu1"):
        held = sorted((r["started_at"], r["ended_at"]) for r in runs if r["gpu"] == gpu)
        assert all(end <= next_start + 1e-9 for (_, end), (next_start, _) in zip(held, held[1:])), held
    taken = [r for r in runs if r["owner"] == "alice" and "below its fair share" in (r.get("yield_reason") or "")]
    assert taken and taken[0]["yield_reason"].startswith("asked to suspend because the pool took GPU local/cpu")
    bobs_first = min((r for r in runs if r["owner"] == "bob"), key=lambda r: r["started_at"])
    assert "because the pool gave the experiment local/cpu" in bobs_first["start_reason"]
    assert bobs_first["started_at"] >= taken[0]["yield_requested_at"]


def test_a_restarted_server_continues_its_experiments(tmp_path: Path) -> None:
    config = ServerConfig(root=tmp_path / "server", run_experiments=False)
    with TestClient(create_app(config)) as client:
        token = client.app.state.hermes.accounts.add_user("alice")  # type: ignore[attr-defined]
        give_code(tmp_path / "server", "alice")
        headers = {"Authorization": f"Bearer {token}"}
        response = client.post("/api/experiments", json={"spec": real_spec("later")}, headers=headers)
        assert response.json()["status"] == "queued"
    with TestClient(create_app(ServerConfig(root=tmp_path / "server"))) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        assert server.wait(response.json()["id"])["status"] == "finished"


# ---------------------------------------------------------------------- the command line
def test_server_command_adds_users_binds_locally_keeps_tokens_out_of_logs_and_revokes_them(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    root = tmp_path / "srv"
    made = subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "add-user", "carol"],
                          capture_output=True, text=True, env=env, check=True)
    token = re.search(r"hermes_\S+", made.stdout)[0]  # type: ignore[index]
    area = (root / "users" / "carol").resolve()
    assert area.is_dir() and f"carol's area, where every file their specs name must lie: {area}\n" in made.stdout
    with closing(SqlStore(f"sqlite:///{root / 'hermes.db'}")) as store:
        assert store.experiments() == []
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        import httpx

        url = f"http://127.0.0.1:{port}"
        _wait_for(url)
        assert httpx.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}"}).json()["name"] == "carol"
        assert httpx.get(f"{url}/api/me", params={"token": token}).status_code == 401
        assert httpx.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
        assert httpx.get(f"{url}/api/experiments/{token}").status_code == 401  # a token pasted into a path
        assert _listening_addresses(port) == ["127.0.0.1"]

        # Tokens are listed by id, never shown again, and revoked on the running server at once.
        def accounts(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), *args],
                                  capture_output=True, text=True, env=env, check=False)

        def me(bearer: str) -> int:
            return httpx.get(f"{url}/api/me", headers={"Authorization": f"Bearer {bearer}"}).status_code

        laptop = re.search(r"hermes_\S+", accounts("add-token", "carol", "--label", "laptop").stdout)[0]  # type: ignore[index]
        leaked = re.search(r"hermes_\S+", accounts("add-token", "carol", "--label", "ci").stdout)[0]  # type: ignore[index]
        listed = accounts("tokens", "carol").stdout
        ids = {label: token_id(secret) for label, secret in (("first token", token), ("laptop", laptop), ("ci", leaked))}
        for label, shown in ids.items():
            assert re.search(rf"^carol +{shown} +{label} +20\d\d-", listed, re.MULTILINE), listed
        assert not any(secret in listed or secret.removeprefix("hermes_") in listed for secret in (token, laptop, leaked))
        assert {me(token), me(laptop), me(leaked)} == {200}
        assert accounts("revoke-token", "carol", ids["laptop"][:4]).stdout == f"revoked 1 token(s) of carol: {ids['laptop']}\n"
        assert (me(token), me(laptop), me(leaked)) == (200, 401, 200)  # no restart needed
        assert accounts("revoke-token", "carol", leaked).returncode == 0  # a leaked token, pasted
        assert (me(token), me(leaked)) == (200, 401)
        for wrong, refusal in ((ids["laptop"], f"'carol' has no token with id '{ids['laptop']}'"),
                               ("ab", "'ab' is neither a token id"), (leaked, "'carol' has no such token")):
            refused = accounts("revoke-token", "carol", wrong)
            assert refused.returncode == 2 and refusal in refused.stderr, refused.stderr
        refused = accounts("revoke-token", "nobody", "--all")
        assert refused.returncode == 2 and "no user 'nobody'" in refused.stderr
        assert accounts("revoke-token", "carol", "--all").stdout == f"revoked 1 token(s) of carol: {ids['first token']}\n"
        assert me(token) == 401 and accounts("tokens").stdout == "no tokens\n"

        # A second server started by mistake is refused before its pool takes over anything: this root's
        # pool is held by the first (on any port), and the port is taken (for any root).
        for second_root, second_port, refusal in ((root, _free_port(), f"{root / 'pool'} is in use by another pool"),
                                                  (tmp_path / "srv2", port, f"cannot listen on 127.0.0.1:{port}: ")):
            second = subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--root", str(second_root),
                                     "--port", str(second_port)], capture_output=True, text=True, env=env, timeout=60)
            assert second.returncode == 2 and refusal in second.stderr, second.stderr
            assert "Traceback" not in second.stderr
        assert httpx.get(f"{url}/openapi.json").status_code == 200 and process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)
    log.seek(0)
    output = log.read()
    assert "GET /api/me" in output  # the access log is on ...
    assert token not in output and token.removeprefix("hermes_") not in output  # ... and holds no token
    assert "GET /api/experiments/hermes_<redacted>" in output


def _listening_addresses(port: int) -> list[str]:
    """The IPv4 addresses a socket listens on at ``port``, from /proc/net/tcp (and none on IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(address) == 8
                             else address)
    return found


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/openapi.json", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"no server at {url} after {timeout}s")


def test_the_server_keeps_its_experiments_and_users_in_postgresql(tmp_path: Path, postgres: Any) -> None:
    url = postgres.new_database()
    config = ServerConfig(root=tmp_path / "server", database=url, run_experiments=False)
    with TestClient(create_app(config)) as client:
        server = Server(client)
        alices, bobs = server.simulated("alice", "pg-a"), server.simulated("bob", "pg-b")
        timeline = server.get(f"/api/experiments/{alices}/timeline")
        store = SqlStore(url)
        assert len(timeline["runs"]) == len(store.runs(alices)) > 0
        assert client.get(f"/api/experiments/{bobs}", headers=server.as_("alice")).status_code == 404
        assert client.get("/api/experiments").status_code == 401
        for route in ("metrics", "curves", "events", "decisions"):  # a cursor past PostgreSQL's integers was a 500
            assert server.get(f"/api/experiments/{alices}/{route}", after=STORE_INT_MAX) is not None, route
            past = client.get(f"/api/experiments/{alices}/{route}", params={"after": STORE_INT_MAX + 1},
                              headers=server.as_("alice"))
            assert past.status_code == 422, (route, past.text)
        store.close()
    assert not (tmp_path / "server" / "hermes.db").exists()


def test_a_pool_stopped_by_a_postgresql_restart_starts_again_and_runs_its_experiments(
    tmp_path: Path, postgres: Any
) -> None:
    """A few seconds without its database stopped the pool for good, while the server took submissions that nothing
    ran and showed its experiments running: the pool starts again from the store, and connections are checked
    before use (the first request after the restart was a 500)."""
    url = postgres.new_database()
    config = ServerConfig(root=tmp_path / "server", database=url, resources=ResourcesSpec(gpus="none", cpu_slots=2),
                          poll=0.2)
    with TestClient(create_app(config)) as client:
        server = Server(client)
        # 4.7 s of steps on two slots (trial 1 fails at step 2): it runs on when the database goes, 0.1 s in
        before = server.client.post("/api/experiments", json={"spec": real_spec("before", steps=15, sleep=0.1)},
                                    headers=server.as_("alice")).json()["id"]
        deadline = time.monotonic() + 30
        while not server.get(f"/api/experiments/{before}/metrics")["metrics"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        postgres.stop()
        time.sleep(1.5)
        postgres.start()
        after = server.client.post("/api/experiments", json={"spec": real_spec("after")}, headers=server.as_("alice"))
        assert after.status_code == 201, after.text
        for experiment_id in (before, after.json()["id"]):
            experiment = server.wait(experiment_id, timeout=90)
            assert experiment["status"] == "finished" and experiment["by_state"] == {"completed": 3, "failed": 1}


def test_submit_status_results_and_plot_against_a_server(tmp_path: Path) -> None:
    import httpx
    import yaml

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    root = tmp_path / "srv"
    hermes = [sys.executable, "-m", "hermes.cli"]
    env["HERMES_TOKEN"] = add_user(root, "erin")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([*hermes, "server", "--root", str(root), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_for(url)
        (tmp_path / "specs").mkdir()  # the area mirrors tmp_path: the spec lies in specs/, the trials beside it
        spec_file = tmp_path / "specs" / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(real_spec("remote", trial={"function": "trials.curve:train",
                                                                       "workdir": ".."})))
        submitted = subprocess.run([*hermes, "submit", "specs/spec.yaml", "--server", url], capture_output=True,
                                   text=True, env=env, cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted remote as experiment 1 (queued)" in submitted.stdout
        again = subprocess.run([*hermes, "submit", "specs/spec.yaml", "--server", url], capture_output=True,
                               text=True, env=env, cwd=tmp_path)
        assert again.returncode == 2 and "409" in again.stderr and "another name" in again.stderr
        headers = {"Authorization": f"Bearer {env['HERMES_TOKEN']}"}
        _until(lambda: httpx.get(f"{url}/api/experiments/1", headers=headers).json()["status"] == "finished", 60)
        status = subprocess.run([*hermes, "status", "--server", url], capture_output=True, text=True, env=env).stdout
        assert "experiment  remote (id 1): finished" in status and "trials      4: 3 completed, 1 failed" in status
        remote = subprocess.run([*hermes, "results", "--server", url, "--format", "json"], capture_output=True,
                                text=True, env=env, check=True).stdout
        local = subprocess.run([*hermes, "results", str(root), "--format", "json"], capture_output=True,
                               text=True, env=env, check=True).stdout
        assert '"state": "failed"' in remote
        files = ("directory", "checkpoint")  # a server's client has no files; the store's own folder has them
        remote_rows, local_rows = json.loads(remote), json.loads(local)
        assert all(row[name] is None for row in remote_rows for name in files), remote_rows
        assert all(Path(row["directory"]).is_dir() for row in local_rows), local_rows
        assert [{k: v for k, v in row.items() if k not in files} for row in local_rows] == [
            {k: v for k, v in row.items() if k not in files} for row in remote_rows]
        stored = SqlStore(f"sqlite:///{root.resolve() / 'hermes.db'}")
        seen = RemoteStore(Client(url, env["HERMES_TOKEN"]))
        assert seen.latest_event_at() == stored.latest_event_at() > 0  # where a pool would go on
        stored.close()
        plots = subprocess.run([*hermes, "plot", "--server", url, "--out", str(tmp_path / "plots")],
                               capture_output=True, text=True, env=env, check=True).stdout.split()
        assert [Path(p).name for p in plots] == ["remote_curves.png", "remote_gpus.png"]
        traced = subprocess.run([*hermes, "trace", "--server", url], capture_output=True, text=True, env=env,
                                check=True).stdout.splitlines()  # a team's search judges the policies too
        assert traced[0].startswith("trial,epoch,metric,seconds") and len(traced) > 1 + 3 * 3
        # cancelling from the command line: a running experiment ends cancelled; a finished or unknown one is refused
        spec_file.write_text(yaml.safe_dump(real_spec("remote", steps=400, trial={"function": "trials.curve:train",
                                                                                  "workdir": ".."})))
        renamed = subprocess.run([*hermes, "submit", "specs/spec.yaml", "--name", "long", "--server", url], env=env,
                                 cwd=tmp_path, capture_output=True, text=True)  # the spec's name is taken: --name
        assert renamed.returncode == 0 and "submitted long as experiment 2" in renamed.stdout, renamed.stderr
        cancelled = subprocess.run([*hermes, "cancel", "long", "--server", url], capture_output=True, text=True,
                                   env=env)
        assert cancelled.returncode == 0 and "cancelling long (experiment 2" in cancelled.stdout, cancelled.stderr
        _until(lambda: httpx.get(f"{url}/api/experiments/2", headers=headers).json()["status"] == "cancelled", 60)
        status = subprocess.run([*hermes, "status", "--experiment", "long", "--server", url], capture_output=True,
                                text=True, env=env).stdout
        assert "experiment  long (id 2): cancelled" in status, status
        listed = subprocess.run([*hermes, "list", "--server", url], capture_output=True, text=True, env=env,
                                check=True).stdout.splitlines()
        assert [line.split()[:4] for line in listed[2:]] == [["1", "remote", "erin", "finished"],
                                                             ["2", "long", "erin", "cancelled"]]
        for name, refusal in (("remote", "409 Conflict: experiment 1 is finished already"),
                              ("nope", "no experiment 'nope' in http")):
            refused = subprocess.run([*hermes, "cancel", name, "--server", url], capture_output=True, text=True,
                                     env=env)
            assert refused.returncode == 2 and refusal in refused.stderr, refused.stderr
        env["HERMES_TOKEN"] = "hermes_wrong"
        refused = subprocess.run([*hermes, "status", "--server", url], capture_output=True, text=True, env=env)
        assert refused.returncode == 2 and "401" in refused.stderr
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)


def server_command_with_a_user(root: Path, user: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``hermes server --root root`` as words, the environment to run it in, and the headers of ``user``, whom it
    adds (with the trials in their area)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    hermes = [sys.executable, "-m", "hermes.cli", "server", "--root", str(root)]
    return hermes, env, {"Authorization": f"Bearer {add_user(root, user)}"}


def test_a_server_killed_mid_experiment_continues_it_when_restarted(tmp_path: Path) -> None:
    import httpx

    root = tmp_path / "srv"
    hermes, env, headers = server_command_with_a_user(root, "fay")

    def start() -> tuple[subprocess.Popen[bytes], str]:
        port = _free_port()
        process = subprocess.Popen([*hermes, "--port", str(port)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=env)
        _wait_for(f"http://127.0.0.1:{port}")
        return process, f"http://127.0.0.1:{port}/api/experiments"

    process, api = start()
    try:
        spec = real_spec("survivor", trials=4, steps=12, sleep=0.1)  # 1.9 s on two slots: killed 0.4 s in
        experiment_id = httpx.post(api, json={"spec": spec}, headers=headers).json()["id"]
        deadline = time.monotonic() + 60
        while len(httpx.get(f"{api}/{experiment_id}/curves", headers=headers).json()["trial"]) < 8:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        process.kill()  # kill -9: no shutdown of any kind
        process.wait()
    with closing(SqlStore(f"sqlite:///{root / 'hermes.db'}")) as store:
        before = store.metrics(experiment_id)
        assert before and store.experiment(experiment_id).status is ExperimentStatus.RUNNING
    process, api = start()
    try:
        deadline = time.monotonic() + 90
        while (found := httpx.get(f"{api}/{experiment_id}", headers=headers).json())["status"] != "finished":
            assert time.monotonic() < deadline, found
            time.sleep(0.2)
        assert found["by_state"] == {"completed": 3, "failed": 1}
        with closing(SqlStore(f"sqlite:///{root / 'hermes.db'}")) as store:
            after = store.metrics(experiment_id)
        assert after[: len(before)] == before  # nothing recorded before the kill is lost or rewritten
        for trial in ("0", "2", "3"):
            assert max(r.step for r in after if r.trial_id == trial) == 12
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)


def test_a_server_whose_terminal_closes_records_its_experiments_interrupted(tmp_path: Path) -> None:
    """SIGHUP (the terminal or SSH session it was started from closed) ended the server at once: its experiments
    stayed "running when its runner died" in the store."""
    import httpx

    root = tmp_path / "srv"
    hermes, env, headers = server_command_with_a_user(root, "gus")
    port = _free_port()
    process = subprocess.Popen([*hermes, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    try:
        _wait_for(f"http://127.0.0.1:{port}")
        api = f"http://127.0.0.1:{port}/api/experiments"
        experiment_id = httpx.post(api, json={"spec": real_spec("hungup", trials=2, steps=200, sleep=0.1)},
                                   headers=headers).json()["id"]
        deadline = time.monotonic() + 60
        while not httpx.get(f"{api}/{experiment_id}/curves", headers=headers).json()["trial"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGHUP)
        assert process.wait(timeout=30) == -signal.SIGTERM  # taken as SIGTERM, which uvicorn raises again once done
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with closing(SqlStore(f"sqlite:///{root / 'hermes.db'}")) as store:
        assert store.experiment(experiment_id).status is ExperimentStatus.INTERRUPTED


def test_trials_and_runs_come_in_pages_that_miss_nothing(server: Server) -> None:
    experiment_id = server.simulated("alice", "paged", trials=12)
    path = f"/api/experiments/{experiment_id}"
    for route, key, limit in (("trials", "trials", 5), ("timeline", "runs", 7)):
        everything = server.get(f"{path}/{route}")
        assert everything["more"] is False
        pages, since = [], 0
        while True:
            page = server.get(f"{path}/{route}", since=since, limit=limit)
            assert len(page[key]) <= limit
            pages += page[key]
            since = page["version"]
            if not page["more"]:
                break
        assert pages == sorted(everything[key], key=lambda row: row["version"]) and len(pages) > limit


def test_a_server_url_without_a_scheme_is_http_and_one_the_client_cannot_use_is_refused_naming_it() -> None:
    from hermes.server.client import ServerError

    assert Client("gpu-box", "t").url == "http://gpu-box"  # as Determined's -m host:port
    assert Client("gpu-box:8600/", "t").url == "http://gpu-box:8600"
    assert Client("https://gpu-box", "t").url == "https://gpu-box"
    for url in ("ftp://gpu-box", "http://", "gpu-box:99999", "gpu-box:port", "http://gpu-box:0"):
        with pytest.raises(ServerError, match="cannot be used") as refused:
            Client(url, "t")
        assert url.split("://")[-1] in str(refused.value)


def test_a_server_url_that_redirects_is_refused_and_the_token_goes_nowhere_else() -> None:
    """urllib followed a redirect (a proxy's login page, say) and sent the bearer token on to wherever it led,
    another host too: a redirect is not followed, and the error names where it leads."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hermes.server.client import ServerError

    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"[]")

        do_POST = do_GET

        def log_message(self, *_: Any) -> None:
            pass

    class Redirect(Elsewhere):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_address[1]}/sso/login")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    redirect = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threads = [threading.Thread(target=one.serve_forever, daemon=True) for one in (elsewhere, redirect)]
    for thread in threads:
        thread.start()
    try:
        client = Client(f"http://127.0.0.1:{redirect.server_address[1]}", "hermes_" + "S" * 43)
        for call in (lambda: client.request("GET", "/experiments"), lambda: client.submit(real_spec("x"))):
            with pytest.raises(ServerError) as refused:
                call()
            assert str(refused.value).startswith(f"the server URL {client.url} redirects to "
                                                 f"http://127.0.0.1:{elsewhere.server_address[1]}/sso/login; ")
        assert seen == []
    finally:
        for one in (elsewhere, redirect):
            one.shutdown()
            one.server_close()


def test_a_web_server_that_is_not_hermes_is_named_not_a_json_traceback(capsys: Any) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hermes.cli import main

    class Welcome(BaseHTTPRequestHandler):
        """Another web server's page, whatever the path: a 200 that is HTML, not JSON."""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            page = b"<html><body>It works!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Welcome)
    serving = threading.Thread(target=httpd.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        for command in ("status", "list", "results"):
            assert main([command, "--server", url, "--token", "t"]) == 2
            error = capsys.readouterr().err
            assert error.startswith(f"hermes: error: {url} did not answer as a Hermes server (text/html"), error
    finally:
        httpd.shutdown()
        httpd.server_close()
        serving.join(timeout=10)
