"""`hermes server` where its root cannot be made or written: one line naming what to change, never a traceback.

A root with a file on its way, and a store on a read-only disk (an incident's `revoke-token` included), ended in a
Python traceback, the SQL and the tokens' digests in it; a pool whose folder cannot be written was told to change
storage.dir, which a server has none of.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_run import NO_OVERRIDE

pytest.importorskip("fastapi", reason="the server needs the server extra")

ROOT = Path(__file__).resolve().parents[1]


def server(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([*prefix, sys.executable, "-m", "hermes.cli", "server", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def refused(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    [line] = ran.stderr.splitlines()
    return line


def test_a_root_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").touch()
    root = tmp_path / "afile" / "srv"
    expected = f"hermes: error: --root {root}: cannot make the folder: Not a directory"
    assert refused(server("--root", str(root), "add-user", "bob")) == expected
    assert refused(server("--root", str(root), "--port", "0")) == expected  # before anything is served
    database = f"sqlite:///{tmp_path / 'afile' / 'x.db'}"
    assert refused(server("--root", str(tmp_path / "srv"), "--database", database, "add-user", "bob")) == (
        f"hermes: error: --database {database}: its folder {tmp_path / 'afile'}: cannot make the folder: "
        "File exists")


def test_a_pool_folder_that_cannot_be_written_names_the_root(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    assert server("--root", str(root), "add-user", "alice").returncode == 0
    (root / "pool").touch()
    assert refused(server("--root", str(root), "--port", "0")) == (
        f"hermes: error: the pool's folder {root.resolve() / 'pool'} cannot be written (file exists: "
        f"{root.resolve() / 'pool'}); give the pool a folder this user can write (`hermes server --root`, "
        "`python -m hermes.pool --dir`)")


def test_account_commands_on_a_read_only_store_say_so(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    assert server("--root", str(root), "add-user", "alice").returncode == 0
    prefix = tuple(NO_OVERRIDE) if os.geteuid() == 0 else ()
    if prefix and shutil.which(prefix[0]) is None:
        pytest.skip(f"no {prefix[0]} here, to make the store read-only for root")
    (root / "hermes.db").chmod(0o444)
    root.chmod(0o555)
    try:
        probe = subprocess.run([*prefix, "sh", "-c", 'touch "$0/probe" 2>/dev/null', str(root)])
        if probe.returncode == 0:
            pytest.skip("cannot make the store read-only here")
        expected = "hermes: error: --database sqlite (in --root): cannot use it: attempt to write a readonly database"
        for command in (("add-user", "bob"), ("add-token", "alice"), ("revoke-token", "alice", "--all")):
            assert refused(server("--root", str(root), *command, prefix=prefix)) == expected, command
        listed = server("--root", str(root), "tokens", prefix=prefix)
        assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr
    finally:
        root.chmod(0o755)
        (root / "hermes.db").chmod(0o644)
