"""A second pool on a folder that a pool holds is refused naming the option that gives it another folder: it said
"running experiment 'pool'" and "use another storage.dir", though a pool is no experiment and neither `hermes
server` nor `python -m hermes.pool` has a storage.dir option. Real pools on real SQLite stores."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from test_pool_store_lock import refusal

from hermes.pool import PoolSession
from hermes.store import SqlStore
from hermes.store.lock import StorageInUse


def test_a_second_pool_on_a_held_folder_is_refused_naming_root_and_dir(tmp_path: Path) -> None:
    first, second = SqlStore(f"sqlite:///{tmp_path}/first.db"), SqlStore(f"sqlite:///{tmp_path}/second.db")
    held = PoolSession(first, tmp_path / "srv")
    held.claim()  # as a server does at its start
    try:
        with pytest.raises(StorageInUse) as refused:
            PoolSession(second, tmp_path / "srv").claim()  # another store: the folder is what refuses it
        message = str(refused.value)
        assert message.startswith(f"{tmp_path / 'srv' / 'pool'} is in use by another pool, pid {os.getpid()} on "
                                  f"{socket.gethostname()} (`"), message
        assert message.endswith("one pool per folder: stop it, or give this one another folder "
                                "(`hermes server --root`, `python -m hermes.pool --dir`)"), message
        assert "experiment" not in message and "storage.dir" not in message
        line = refusal([sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{tmp_path}/third.db",
                        "--dir", str(tmp_path / "srv")], tmp_path)
        assert line.startswith(f"hermes: error: {tmp_path / 'srv' / 'pool'} is in use by another pool, pid "), line
        assert "`python -m hermes.pool --dir`" in line and "experiment" not in line
    finally:
        first.close()
        second.close()
