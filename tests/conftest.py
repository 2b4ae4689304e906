"""Fixtures shared by several test files."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A throwaway PostgreSQL server for the whole session (about 1.5 s to start), or a skip saying what is missing."""
    pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg: pip install -e '.[postgres]'")
    from hermes.testing.postgres import PostgresServer, find_binaries

    if find_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl): apt-get install -y postgresql (.ci/setup-services does)")
    directory = Path(tempfile.mkdtemp(prefix="hermes-pg-"))  # not under pytest's root-only tmp: postgres must enter it
    try:
        with PostgresServer(directory) as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)
