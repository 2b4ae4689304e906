"""A database server that cannot serve now is StoreUnavailable, as a locked or read-only SQLite file is: a run on it
is recorded interrupted (a rerun continues it), a server answers 503. A stopped PostgreSQL was a plain StoreError,
which a run took for a bug of its own (recorded failed) and a server for a name already taken."""

from __future__ import annotations

from typing import Any

import pytest

from hermes.store import SqlStore, StoreUnavailable


def test_a_stopped_postgresql_is_unavailable_for_reads_and_writes_and_serves_again(postgres: Any) -> None:
    store = SqlStore(postgres.new_database())
    try:
        experiment_id = store.submit_experiment("kept", {"name": "kept"}, "ann")
        postgres.stop()
        try:
            with pytest.raises(StoreUnavailable, match="the database server cannot be reached"):
                store.experiments()
            with pytest.raises(StoreUnavailable, match="the database server cannot be reached"):
                store.submit_experiment("lost", {"name": "lost"}, "ann")
        finally:
            postgres.start()
        assert [record.experiment_id for record in store.experiments()] == [experiment_id]
    finally:
        store.close()
