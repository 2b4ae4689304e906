"""A server's root moved (a new disk, another mount point: `mv old new`, then `hermes server --root new`): its stored
specs name their workdir and storage dir absolute, under the old root. Every open experiment failed for good
("storage.dir: '/old/users/alice/runs' leads outside your area on the server"), and the trial logs of the others
answered 404. Real servers (FastAPI's TestClient, the second one's pool running real trials) on one real store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient
from test_server import Server, give_code, real_spec

from hermes.experiment.spec import ResourcesSpec
from hermes.server.app import ServerConfig, create_app
from hermes.testing.recorded import record_simulated


def test_a_moved_root_runs_its_open_experiments_and_shows_the_logs_of_ended_ones(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    with TestClient(create_app(ServerConfig(root=old, run_experiments=False))) as client:
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        token = hermes.accounts.add_user("alice")
        give_code(old, "alice")
        headers = {"Authorization": f"Bearer {token}"}
        spec = real_spec("open", trials=1, steps=2, sleep=0.01, storage={"dir": "runs"})
        opened = client.post("/api/experiments", json={"spec": spec}, headers=headers).json()
        assert opened["spec"]["storage"]["dir"] == str(old.resolve() / "users" / "alice" / "runs")  # as stored
        ended = client.post("/api/experiments", json={"spec": {**spec, "name": "ended"}}, headers=headers).json()
        record_simulated(hermes.store, ended["id"], 2, 2, policy="rr")
    log = old / "users" / "alice" / "runs" / "ended" / "trials" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1\n")
    os.rename(old, new)

    config = ServerConfig(root=new, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        finished = server.wait(opened["id"])
        assert (finished["status"], finished["error"], finished["by_state"]) == ("finished", None, {"completed": 1})
        assert server.get(f"/api/experiments/{ended['id']}/trials/0/log")["text"] == "epoch 1\n"
        shown = server.get(f"/api/experiments/{opened['id']}/trials/0/log")["text"]
    trial = new / "users" / "alice" / "runs" / "open" / "trials" / "0"
    assert shown == (trial / "stdout.log").read_text()  # its files are in the moved area
    assert not old.exists()


def test_an_area_linked_to_a_shared_mount_under_users_owner_runs_its_experiments_there(tmp_path: Path) -> None:
    """The area a link to ``.../nfs/users/alice/hermes``: its stored paths, the link's target, hold ``users/alice``
    outside the root that never moved. They were read in the area (``.../hermes/hermes``): the experiment stayed
    queued for ever, waiting for its files."""
    root, shared = tmp_path / "root", tmp_path / "nfs" / "users" / "alice" / "hermes"
    shared.mkdir(parents=True)
    (root / "users").mkdir(parents=True)
    (root / "users" / "alice").symlink_to(shared)
    give_code(root, "alice")  # into the shared mount, through the link
    config = ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client = client
        server.tokens = {"alice": client.app.state.hermes.accounts.add_user("alice")}  # type: ignore[attr-defined]
        spec = real_spec("linked", trials=1, steps=2, sleep=0.01, storage={"dir": "runs"})
        made = client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice")).json()
        assert made["spec"]["storage"]["dir"] == str(shared.resolve() / "runs")  # the link's target, as stored
        finished = server.wait(made["id"], timeout=20)
        assert (finished["status"], finished["error"], finished["by_state"]) == ("finished", None, {"completed": 1})
        shown = server.get(f"/api/experiments/{made['id']}/trials/0/log")["text"]
    assert shown == (shared / "runs" / "linked" / "trials" / "0" / "stdout.log").read_text()  # in the mount
    assert not (shared / "hermes").exists()


def test_a_copied_root_runs_its_open_experiments_in_the_copy_while_the_old_root_stays(tmp_path: Path) -> None:
    """`cp -a old new` (the old root kept as a backup), then `hermes server --root new`: the stored paths under the
    old root exist still, so they were read as stored, and every open experiment failed for good, "outside your
    area". Those under another server's root (it holds hermes.db) are read in this one's area."""
    old, new = tmp_path / "old", tmp_path / "new"
    with TestClient(create_app(ServerConfig(root=old, run_experiments=False))) as client:
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        token = hermes.accounts.add_user("alice")
        give_code(old, "alice")
        spec = real_spec("open", trials=1, steps=2, sleep=0.01, storage={"dir": "runs"})
        opened = client.post("/api/experiments", json={"spec": spec}, headers={"Authorization": f"Bearer {token}"})
        opened.raise_for_status()
    (old / "users" / "alice" / "runs").mkdir()  # exists in both
    shutil.copytree(old, new, symlinks=True)

    config = ServerConfig(root=new, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        finished = server.wait(opened.json()["id"])
        assert (finished["status"], finished["error"], finished["by_state"]) == ("finished", None, {"completed": 1})
    assert (new / "users" / "alice" / "runs" / "open" / "trials" / "0" / "stdout.log").is_file()
    assert list((old / "users" / "alice" / "runs").iterdir()) == []  # the backup is left as it was
