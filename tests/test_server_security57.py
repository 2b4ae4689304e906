"""The API against a user who races it or sends no token: a trial's log is read from the one file opened, never
from where a link swapped in after a check leads; a request without a valid token is answered 401 before its body
is read or its query scanned."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")

from fastapi.testclient import TestClient
from test_server import Server

from hermes.server.api import MAX_DEPTH
from hermes.server.app import ServerConfig, create_app

FLIP = """import os, sys
own, target, log = sys.argv[1:]
swap = log + ".swap"
while True:  # the log, now a link to another user's file, now a file of one's own: each put there at once
    os.symlink(target, swap)
    os.replace(swap, log)
    os.link(own, swap)
    os.replace(swap, log)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server whose runner runs nothing, answering its errors (a 500 is an answer to count, not a raise)."""
    config = ServerConfig(root=tmp_path / "server", run_experiments=False)
    with TestClient(create_app(config), raise_server_exceptions=False) as client:
        yield Server(client)


def test_a_log_swapped_for_a_link_while_it_is_read_never_shows_what_the_link_leads_to(server: Server) -> None:
    """The route checked that the log resolved inside the experiment, then resolved and opened it again: bob, flipping
    his own stderr.log between a file and a link to alice's log, read alice's log (or /etc/passwd), and got 500s."""
    alices = server.simulated("alice", "hers")
    bobs = server.simulated("bob", "mine")
    users = server.hermes.config.root / "users"
    target = users / "alice" / "runs" / "hers" / "trials" / "0" / "stdout.log"
    target.parent.mkdir(parents=True)
    target.write_text("alice's secret\n")
    assert server.client.get(f"/api/experiments/{alices}/trials/0/log",
                             headers=server.as_("bob")).status_code == 404  # asked for directly: not bob's
    trial_dir = users / "bob" / "runs" / "mine" / "trials" / "0"
    trial_dir.mkdir(parents=True)
    log, own = trial_dir / "stderr.log", trial_dir / "own"
    own.write_text("bob's own line\n")
    os.link(own, log)
    flipper = subprocess.Popen([sys.executable, "-c", FLIP, str(own), str(target), str(log)])  # no GIL shared
    answers = _polled(server, bobs, flipper, stream="stderr", offset=0)
    assert set(answers) <= {"bob's own line\n", 404}, answers  # a link there is no log to show; never a 500
    os.replace(own, log)
    assert server.get(f"/api/experiments/{bobs}/trials/0/log", "bob", stream="stderr")["text"] == "bob's own line\n"


def test_an_experiment_folder_swapped_for_a_link_while_it_is_found_never_shows_another_users_log(
    server: Server
) -> None:
    """The server checked that <storage.dir>/<name> resolved inside the owner's area, then resolved it again: bob,
    flipping his experiment's folder between a folder of his own and a link to alice's, read alice's log."""
    alices = server.simulated("alice", "hers")
    bobs = server.simulated("bob", "mine")
    users = server.hermes.config.root / "users"
    hers = users / "alice" / "runs" / "hers"
    (hers / "trials" / "0").mkdir(parents=True)
    (hers / "trials" / "0" / "stdout.log").write_text("alice's secret\n")
    assert server.client.get(f"/api/experiments/{alices}/trials/0/log",
                             headers=server.as_("bob")).status_code == 404
    own, mine = users / "bob" / "runs" / "own", users / "bob" / "runs" / "mine"
    (own / "trials" / "0").mkdir(parents=True)
    (own / "trials" / "0" / "stdout.log").write_text("bob's own line\n")
    mine.symlink_to(own)  # a link inside his area, to a folder of his own: his experiment's folder all the same
    flipper = subprocess.Popen([sys.executable, "-c", FLIP_FOLDER, str(own), str(hers), str(mine)])
    answers = _polled(server, bobs, flipper)
    assert set(answers) <= {"bob's own line\n", 404}, answers


FLIP_FOLDER = """import os, sys
own, target, folder = sys.argv[1:]
swap = folder + ".swap"
while True:  # the experiment's folder, now a link to another user's, now a link to one's own
    os.symlink(target, swap)
    os.replace(swap, folder)
    os.symlink(own, swap)
    os.replace(swap, folder)
"""


def test_a_log_whose_trial_folder_is_a_link_out_is_not_shown(server: Server, tmp_path: Path) -> None:
    """No link in the log's own name, and none before it: the file opened must be the one in the trial's folder."""
    bobs = server.simulated("bob", "mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout.log").write_text("someone's secret\n")
    trials = server.hermes.config.root / "users" / "bob" / "runs" / "mine" / "trials"
    trials.mkdir(parents=True)
    (trials / "0").symlink_to(elsewhere)
    response = server.client.get(f"/api/experiments/{bobs}/trials/0/log", headers=server.as_("bob"))
    assert response.status_code == 404 and "secret" not in response.text, response.text
    assert server.get(f"/api/experiments/{bobs}/trials/1/log", "bob") == {"offset": 0, "size": 0, "text": ""}


def _polled(
    server: Server, experiment_id: int, flipper: subprocess.Popen[bytes], **params: object
) -> dict[int | str, int]:
    """Bob's trial 0's log asked for 200 times while ``flipper`` swaps links, then stopped: how often each answer
    (a text, or a status) came; none may hold another user's secret."""
    answers: dict[int | str, int] = {}
    try:
        for _ in range(200):
            response = server.client.get(f"/api/experiments/{experiment_id}/trials/0/log", params=params,
                                         headers=server.as_("bob"))
            assert "secret" not in response.text, response.text
            key = response.json()["text"] if response.status_code == 200 else response.status_code
            answers[key] = answers.get(key, 0) + 1
    finally:
        flipper.kill()
        flipper.wait()
    return answers


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer hermes_not-a-token"}])
def test_a_request_without_a_valid_token_is_401_before_its_body_or_query_is_looked_at(
    server: Server, headers: dict[str, str]
) -> None:
    """The body's depth and the query's NULs were checked first: a request with no token was answered 422."""
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    experiment_id = server.simulated("alice", "mine")
    for response in (
        server.client.request("GET", "/api/me", content=deep, headers={"content-type": "application/json", **headers}),
        server.client.get(f"/api/experiments/{experiment_id}/metrics", params={"trial": "\0"}, headers=headers),
        server.client.post("/api/experiments", content=deep, headers={"content-type": "application/json", **headers}),
    ):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
    # with a valid token both are still refused, naming what
    response = server.client.request("GET", "/api/me", content=deep, headers={"content-type": "application/json",
                                                                              **server.as_("alice")})
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "too_deep", response.text
    response = server.client.get(f"/api/experiments/{experiment_id}/metrics", params={"trial": "\0"},
                                 headers=server.as_("alice"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "trial"], response.text
