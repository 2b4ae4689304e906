"""A server's pool and the files of other users: links below an experiment's folder, its own restarts, its database.

Bob's link below his own experiment's folder (its trials folder, a trial's folder, its hermes.lock) to Alice's made
the pool write his trials into her experiment (her checkpoints deleted, her config.json overwritten) or take her
experiment's lock (his error named her experiment). A pool whose poll thread could not start left its executor open,
a guard process more at each restart. The database was readable by every local account.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
from fastapi.testclient import TestClient  # noqa: E402

from hermes.experiment.spec import ResourcesSpec  # noqa: E402
from hermes.pool import PoolSession  # noqa: E402
from hermes.server.app import ServerConfig, create_app  # noqa: E402
from hermes.store import SqlStore  # noqa: E402
from test_server import Server, real_spec  # noqa: E402


def _alices_experiment(area: Path, name: str) -> Path:
    """Alice's experiment folder as her finished run left it: a trial with its config, log and checkpoint."""
    folder = area / "runs" / name
    trial = folder / "trials" / "0"
    (trial / "checkpoints" / "step-5").mkdir(parents=True)
    (trial / "config.json").write_text('{"who": "alice"}')
    (trial / "stdout.log").write_text("alice-log 4\n")
    (folder / "hermes.lock").write_text(json.dumps({"pid": 1, "experiment": name}))
    return folder


def _snapshot(folder: Path) -> dict[str, Any]:
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


def test_a_link_below_an_experiments_folder_to_another_users_fails_it_and_writes_nothing_there(
        tmp_path: Path) -> None:
    config = ServerConfig(root=tmp_path / "server", resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server(client)
        root = server.hermes.config.root
        alice = _alices_experiment(root / "users" / "alice", "exp1")
        before = _snapshot(alice)
        runs = root / "users" / "bob" / "runs"
        (runs / "mine").mkdir(parents=True)
        (runs / "mine" / "trials").symlink_to(alice / "trials")  # found when the pool takes it up
        (runs / "spy").mkdir()
        (runs / "spy" / "hermes.lock").symlink_to(alice / "hermes.lock")
        (runs / "late" / "trials").mkdir(parents=True)
        (runs / "late" / "trials" / "0").symlink_to(alice / "trials" / "0")  # found as its trial 0 is submitted
        ids = {}
        for name in ("mine", "spy", "late"):
            spec = real_spec(name, trials=2, steps=2, storage={"dir": "runs"})
            response = client.post("/api/experiments", json={"spec": spec}, headers=server.as_("bob"))
            assert response.status_code == 201, response.text
            ids[name] = response.json()["id"]
        below = {"mine": "mine/trials", "spy": "spy/hermes.lock", "late": "late/trials/0"}
        for name, experiment_id in ids.items():
            failed = server.wait(experiment_id, "bob", timeout=30)
            assert failed["status"] == "failed", failed
            assert failed["error"].startswith(f"experiment {name}: storage.dir: '{below[name]}' leads outside the "
                                              "experiment's folder"), failed["error"]
            assert "alice" not in failed["error"] and "exp1" not in failed["error"], failed["error"]  # never the target
            assert server.hermes.store.metrics(experiment_id) == []  # nothing ran
    assert _snapshot(alice) == before


def test_a_pool_whose_poll_thread_cannot_start_closes_its_executor(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """As under a pids limit, where CPython's Thread.start raises RuntimeError: the pool stops with the host's
    limit (OSError EAGAIN, which the server says in a line), its executor's guard process ended."""
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        if thread.name.startswith("hermes-pool-poll"):
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refused)
    store = SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    try:
        with pytest.raises(OSError) as raised:
            pool.run()
    finally:
        store.close()
    assert raised.value.errno == errno.EAGAIN and "hermes-pool-poll" in str(raised.value)
    guard = pool.executor.guard._process  # type: ignore[union-attr]
    assert guard.returncode is not None  # collected: closed with the executor
    assert not Path(f"/proc/{guard.pid}").exists() or "guard" not in Path(f"/proc/{guard.pid}/cmdline").read_text()


def test_a_new_servers_database_is_readable_by_its_account_alone(tmp_path: Path) -> None:
    config = ServerConfig(root=tmp_path / "server", run_experiments=False)
    with TestClient(create_app(config)) as client:
        client.app.state.hermes.accounts.add_user("alice")  # type: ignore[attr-defined]
        database = config.root / "hermes.db"
        made = [path for path in (database, *(Path(f"{database}{end}") for end in ("-wal", "-shm"))) if path.exists()]
        assert database in made
        assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in made} == {path.name: 0o600 for path in made}
    # one that exists keeps its mode: an operator's choice
    database.chmod(0o640)
    assert ServerConfig(root=config.root).database_url.endswith("hermes.db")
    assert stat.S_IMODE(os.stat(database).st_mode) == 0o640

