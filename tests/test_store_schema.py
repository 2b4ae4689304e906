"""The store's layout across Hermes versions, and records it must name or escape rather than fail on.

An experiments row that does not decode (a hand edit) is named as any damaged record is, and stops that experiment
alone; a store is stamped with its layout's version, an older layout is read as it is and brought up by a writer, and
one a newer Hermes stamped is refused before anything is written; text that UTF-8 cannot hold (lone surrogates, as
``os.fsdecode`` makes of a file name that is not UTF-8) is stored escaped. Real stores, SQLite files edited with
sqlite3 and PostgreSQL databases; the command line in real processes.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from test_run import environment, hermes, hermes_command, search, spec_of, write_spec

from hermes.core.states import TrialState
from hermes.store import ExperimentStatus, SqlStore, StoreError, TrialRecord
from hermes.store.base import DamagedRecord
from hermes.store.sql import SCHEMA_VERSION
from hermes.testing.recorded import experiment_spec, record_simulated

SPEC = {"name": "exp", "search": {"trials": 4}}
DAMAGES = {  # an experiments row (or its settings) as a hand edit left it, and how the record is named
    "status": ("UPDATE experiments SET status = 'paused' WHERE id = 1",
               "table experiments, row with id 1: column status holds 'paused', not one of"),
    "spec": ("UPDATE experiments SET spec = '{\"name\": ' WHERE id = 1",
             "table experiments, row with id 1: column spec is not valid JSON"),
    "created_at": ("UPDATE experiments SET created_at = 'yesterday' WHERE id = 1",
                   "table experiments, row with id 1: column created_at holds 'yesterday', not a number"),
    "weight": ("UPDATE experiment_settings SET weight = 'heavy' WHERE experiment_id = 1",
               "table experiment_settings, row with experiment_id 1: column weight holds 'heavy', not a number"),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":  # a fresh database on a throwaway server (tests/conftest.py)
        return request.getfixturevalue("postgres").new_database()
    return f"sqlite:///{tmp_path / 'hermes.db'}"


def execute(url: str, *statements: str) -> None:
    """Edit the store behind Hermes's back, as its administrator (or an older or newer Hermes) would."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.exec_driver_sql(query)]
    finally:
        engine.dispose()


@pytest.fixture
def store(url: str) -> Iterator[SqlStore]:
    opened = SqlStore(url)
    yield opened
    opened.close()


# ---------------------------------------------------------------------- a damaged experiments row
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_experiments_row_is_named_and_leaves_the_other_experiments_usable(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``experiments()`` decoded every row raw: one edited by hand failed it with a ValueError or a JSONDecodeError,
    for every caller (a runner looking for its own experiment, a pool, a server's list of every user's)."""
    edit, named = DAMAGES[damage]
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    try:
        damaged = store.submit_experiment("exp", SPEC, owner="ann")
        sound = store.create_or_open_experiment("other", SPEC)
        with closing(sqlite3.connect(path)) as connection, connection:
            assert connection.execute(edit).rowcount == 1
        with caplog.at_level(logging.WARNING, logger="hermes.store.sql"):
            assert [record.experiment_id for record in store.experiments()] == [sound]
            assert [record.experiment_id for record in store.experiments()] == [sound]
        assert [r.getMessage() for r in caplog.records if named in r.getMessage()] != []
        assert len(caplog.records) == 1  # said once, not at every poll of a pool or a server
        with pytest.raises(DamagedRecord) as raised:
            store.experiment(damaged)
        assert raised.value.record.startswith(named)
        assert store.create_or_open_experiment("other", SPEC) == sound
    finally:
        store.close()
    reader = SqlStore.open_read_only(path)
    try:
        assert [record.name for record in reader.experiments()] == ["other"]
    finally:
        reader.close()


def test_hermes_run_goes_on_beside_a_damaged_experiment_and_names_it_when_asked_to_run_it(tmp_path: Path) -> None:
    """Both runs failed with a traceback (exit 1): the one of another experiment too."""
    path = write_spec(tmp_path, spec_of("first", search=search(1, 0, 0.0), budget={"steps": 1}))
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    store.create_or_open_experiment("first", {"name": "first"})
    store.close()
    with closing(sqlite3.connect(tmp_path / "runs" / "hermes.db")) as connection, connection:
        connection.execute("UPDATE experiments SET status = 'paused'")

    other = hermes("run", str(path), "--no-live", "--name", "second", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert "experiment 1 is left out" in other.stderr  # said, not silently passed over
    same = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert same.returncode == 2, same.stderr
    assert "has a damaged record: table experiments, row with id 1: column status holds 'paused'" in same.stderr
    assert "experiment 'first' cannot go on from it" in same.stderr and "Traceback" not in same.stderr
    with closing(sqlite3.connect(tmp_path / "runs" / "hermes.db")) as connection:
        assert connection.execute("SELECT name, status FROM experiments").fetchall() == [
            ("first", "paused"), ("second", "finished")]  # the damaged one left as it was


def test_the_server_lists_every_other_experiment_beside_a_damaged_experiments_row(tmp_path: Path) -> None:
    """The list of experiments was a bare 500 for every user."""
    pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
    from fastapi.testclient import TestClient

    from hermes.server.app import ServerConfig, create_app

    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with TestClient(app, raise_server_exceptions=False) as client:
        hermes_server = app.state.hermes
        headers = {"Authorization": f"Bearer {hermes_server.accounts.add_user('alice')}"}
        ids = {}
        for name in ("good", "bad"):
            ids[name] = hermes_server.store.submit_experiment(name, experiment_spec(name, 4, 3), "alice")
            record_simulated(hermes_server.store, ids[name], 4, 3, seed=len(name), policy="rr")
        with closing(sqlite3.connect(tmp_path / "server" / "hermes.db")) as connection, connection:
            connection.execute("UPDATE experiments SET status = 'paused' WHERE id = ?", (ids["bad"],))
        listed = client.get("/api/experiments", headers=headers)
        assert listed.status_code == 200 and [e["name"] for e in listed.json()] == ["good"], listed.text
        good = client.get(f"/api/experiments/{ids['good']}", headers=headers)
        assert good.status_code == 200 and good.json()["trials"] == 4, good.text


# ---------------------------------------------------------------------- the layout's version
def test_a_new_store_is_stamped_and_one_of_the_previous_release_is_stamped_as_it_is(url: str) -> None:
    SqlStore(url).close()
    assert rows(url, "SELECT version FROM hermes_schema") == [(SCHEMA_VERSION,)]
    execute(url, "DROP TABLE hermes_schema")  # as the release before the stamp made it
    store = SqlStore(url)
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.close()
    assert rows(url, "SELECT version FROM hermes_schema") == [(SCHEMA_VERSION,)]
    assert rows(url, "SELECT id FROM experiments") == [(experiment,)]


def test_a_store_whose_settings_lack_the_pool_accounts_is_read_as_it_is_and_brought_up_by_a_writer(url: str) -> None:
    """The settings of commit 81efe8b, before ``gpu_seconds_used``/``owed``: status, list, results and run failed
    with 'no such column' (a writer's create_all adds tables, never columns)."""
    store = SqlStore(url)
    pooled = store.submit_experiment("exp", SPEC, owner="ann", weight=2.0)
    store.close()
    execute(url, "DROP TABLE IF EXISTS hermes_schema", "ALTER TABLE experiment_settings DROP COLUMN gpu_seconds_used",
            "ALTER TABLE experiment_settings DROP COLUMN gpu_seconds_owed")
    if url.startswith("sqlite"):
        reader = SqlStore.open_read_only(url.removeprefix("sqlite:///"))
        try:
            (record,) = reader.experiments()
            assert (record.owner, record.weight, record.gpu_seconds_used, record.gpu_seconds_owed) == ("ann", 2.0, 0, 0)
        finally:
            reader.close()
    store = SqlStore(url)
    try:
        assert store.experiment(pooled).gpu_seconds_used == 0.0
        store.save_accounts({pooled: (3.0, 4.0)})
        assert (store.experiment(pooled).gpu_seconds_used, store.experiment(pooled).gpu_seconds_owed) == (3.0, 4.0)
        other = store.submit_experiment("more", SPEC, owner="bob")
        assert store.experiment(other).gpu_seconds_owed == 0.0
    finally:
        store.close()
    assert rows(url, "SELECT version FROM hermes_schema") == [(SCHEMA_VERSION,)]


def test_a_store_whose_accounts_have_no_database_default_takes_new_submissions(url: str) -> None:
    """The settings of the releases before 3e9fc98 made the accounts NOT NULL with a default of SQLAlchemy's alone, no
    database default: a server that a newer Hermes ran on such a store answered every submission with a 500 (NOT
    NULL constraint failed: experiment_settings.gpu_seconds_used)."""
    store = SqlStore(url)
    store.submit_experiment("old", SPEC, owner="ann")
    store.close()
    if url.startswith("sqlite"):  # SQLite alters no column: the table is made again, as that release made it
        execute(url, "CREATE TABLE settings_then (experiment_id INTEGER NOT NULL PRIMARY KEY REFERENCES experiments "
                     "(id), owner VARCHAR(255), weight FLOAT NOT NULL, cancel_requested BOOLEAN NOT NULL, error TEXT, "
                     "gpu_seconds_used FLOAT NOT NULL, gpu_seconds_owed FLOAT NOT NULL)",
                "INSERT INTO settings_then SELECT experiment_id, owner, weight, cancel_requested, error, "
                "gpu_seconds_used, gpu_seconds_owed FROM experiment_settings",
                "DROP TABLE experiment_settings", "ALTER TABLE settings_then RENAME TO experiment_settings")
    else:
        execute(url, "ALTER TABLE experiment_settings ALTER COLUMN gpu_seconds_used DROP DEFAULT",
                "ALTER TABLE experiment_settings ALTER COLUMN gpu_seconds_owed DROP DEFAULT")
    store = SqlStore(url)
    try:
        submitted = store.submit_experiment("new", SPEC, owner="ann")
        assert (store.experiment(submitted).gpu_seconds_used, store.experiment(submitted).gpu_seconds_owed) == (0, 0)
    finally:
        store.close()


def test_a_store_a_newer_hermes_stamped_is_refused_before_anything_is_written(url: str) -> None:
    """It was written into: an experiment, its writer and its settings, before a raw constraint failed (a column
    the newer Hermes always fills), or a record of a newer kind was called damaged."""
    store = SqlStore(url)
    store.create_or_open_experiment("exp", SPEC)
    store.close()
    newer = SCHEMA_VERSION + 1
    execute(url, f"UPDATE hermes_schema SET version = {newer}")
    before = rows(url, "SELECT id, name, status FROM experiments")
    with pytest.raises(StoreError) as refused:
        SqlStore(url)
    message = str(refused.value)
    assert "written by a newer Hermes" in message and f"version {newer}" in message
    assert f"up to {SCHEMA_VERSION}" in message and "upgrade Hermes" in message
    assert rows(url, "SELECT id, name, status FROM experiments") == before
    assert rows(url, "SELECT version FROM hermes_schema") == [(newer,)]
    if url.startswith("sqlite"):
        with pytest.raises(StoreError, match="written by a newer Hermes"):
            SqlStore.open_read_only(url.removeprefix("sqlite:///"))


def test_hermes_run_and_status_refuse_a_store_a_newer_hermes_stamped(tmp_path: Path) -> None:
    path = write_spec(tmp_path, spec_of("fresh", search=search(1, 0, 0.0), budget={"steps": 1}))
    database = tmp_path / "runs" / "hermes.db"
    SqlStore(f"sqlite:///{database}").close()
    with closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("UPDATE hermes_schema SET version = ?", (SCHEMA_VERSION + 1,))
    for command in (("run", str(path), "--no-live"), ("status", "runs")):
        result = hermes(*command, cwd=tmp_path)
        assert result.returncode == 2 and "written by a newer Hermes" in result.stderr, result.stderr
    with closing(sqlite3.connect(database)) as connection:
        assert connection.execute("SELECT count(*) FROM experiments").fetchone() == (0,)


# ---------------------------------------------------------------------- text UTF-8 cannot hold
def test_text_with_lone_surrogates_is_stored_escaped(url: str, store: SqlStore) -> None:
    """A trial's error that names a file whose name is not UTF-8 (``os.fsdecode``: '\\udcff'), the reason an
    experiment failed, and a runner's command line raised UnicodeEncodeError at the write, on SQLite and PostgreSQL."""
    experiment = store.create_or_open_experiment("exp", SPEC)
    store.claim_writer(experiment, "hermes run /data/caf\udce9/exp.yaml")
    store.upsert_trial(experiment, TrialRecord("t0", {}, TrialState.FAILED, 3, 0.0, error="cannot open x\udcff.bin"))
    store.set_status(experiment, ExperimentStatus.FAILED, error="its searcher raised on y\udcff")
    assert store.trials(experiment)[0].error == "cannot open x\\udcff.bin"
    assert store.experiment(experiment).error == "its searcher raised on y\\udcff"
    assert rows(url, "SELECT holder FROM writers") == [("hermes run /data/caf\\udce9/exp.yaml",)]


def test_a_storage_dir_whose_name_is_not_utf8_is_run_and_reported(tmp_path: Path) -> None:
    """The store's URL could not be shown, nor the read-only URI made, for such a folder: run and status failed with
    a UnicodeEncodeError traceback."""
    folder = Path(tmp_path / "caf\udce9")  # b"caf\xe9": Latin-1
    path = write_spec(folder, spec_of("latin", search=search(1, 0, 0.0), budget={"steps": 1}))
    for command, said in ((("run", str(path), "--no-live"), "latin: finished"),
                          (("status", "runs"), "latin (id 1): finished")):
        result = subprocess.run(hermes_command(*command), cwd=folder, env=environment(), capture_output=True,
                                check=False, timeout=90)
        stdout, stderr = (result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))
        assert result.returncode == 0 and said in stdout, stderr
