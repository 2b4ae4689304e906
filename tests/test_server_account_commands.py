"""`hermes server add-user`, `tokens`, `add-token` and `revoke-token` open the store alone: they imported the whole
application (FastAPI, uvicorn, the pool) to find it, about a second of each command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")

ACCOUNTS = """
import sys
from hermes.cli import main
root = sys.argv[1]
for action in (["add-user", "zed"], ["tokens"], ["add-token", "zed"]):
    assert main(["server", "--root", root, *action]) == 0
print(sorted(name for name in ("fastapi", "uvicorn", "hermes.pool", "hermes.server.app") if name in sys.modules))
"""


def test_the_account_commands_leave_the_application_unimported(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-c", ACCOUNTS, str(tmp_path / "srv")], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]", ran.stdout
    assert "zed" in ran.stdout and (tmp_path / "srv" / "hermes.db").is_file()
