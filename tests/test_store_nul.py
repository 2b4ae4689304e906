"""Texts with a NUL character, stored alike on every backend: PostgreSQL's text refuses a NUL that SQLite kept, so a
trial whose error quoted bytes (``b'\\x00'``) stopped a PostgreSQL store's pool, again at each of its restarts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hermes.core.events import (
    ExperimentCancelled,
    NodeAdded,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.policies import make_policy
from hermes.store import ExperimentStatus, SqlStore, WriterLost
from hermes.store.recorder import StoreRecorder
from hermes.testing.recorded import experiment_spec

ERROR = "cannot parse record b'\x00\x01' in data\x00 file \udcff"  # NUL, a control character, a lone surrogate
STORED_ERROR = "cannot parse record b'\\x00\x01' in data\\x00 file \\udcff"  # each escaped, as the store keeps it


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "postgresql":  # a fresh database on a throwaway server (tests/conftest.py)
        url = request.getfixturevalue("postgres").new_database()
    else:
        url = f"sqlite:///{tmp_path}/hermes.db"
    store = SqlStore(url)
    yield store
    store.close()


def test_every_text_holding_a_nul_is_stored_and_read_back_alike_on_every_backend(store: SqlStore) -> None:
    spec = experiment_spec("nul", 1, 6) | {"description": "a\x00b"}
    experiment_id = store.submit_experiment("nul", spec, "alice")
    store.claim_writer(experiment_id, "pool\x00 pid 1")
    scheduler = Scheduler(make_policy("rr", period=30.0), objective=Objective("max"))
    recorder = StoreRecorder(store, experiment_id, scheduler)
    events = [
        NodeAdded(0.0, "n0", ("n0/g0",)),
        TrialSubmitted(0.0, "0", 6, {"path\x00": "a\x00b"}),
        TrialReported(1.0, "0", 1, 0.5, metrics={"score": 0.5, "loss\x00": 1.5}),
        TrialExited(2.0, "0", False, ERROR),
        ExperimentCancelled(3.0, "asked\x00"),
    ]
    for event in events:
        recorder(event, scheduler.handle(event))
        recorder.flush()  # each in a transaction of its own, as a pool records them
    store.set_status(experiment_id, ExperimentStatus.FAILED, error=f"a trial failed: {ERROR}")

    [trial] = store.trials(experiment_id)
    assert trial.state is TrialState.FAILED and trial.error == STORED_ERROR
    assert trial.params == {"path\x00": "a\x00b"}  # JSON keeps them exactly
    assert store.events(experiment_id) == [replace(event, metrics=None) if isinstance(event, TrialReported) else event
                                           for event in events]  # a report's metrics are in the metrics table
    assert [record.values for record in store.metrics(experiment_id)] == [{"score": 0.5, "loss\x00": 1.5}]
    experiment = store.experiment(experiment_id)
    assert experiment.spec == spec and experiment.error == f"a trial failed: {STORED_ERROR}"

    other = SqlStore(store.url)  # another pool's, say: the holder it claims with names it to this one
    other.claim_writer(experiment_id, "another\x00 pool")
    other.close()
    with pytest.raises(WriterLost, match=r"another\\x00 pool"):
        store.set_status(experiment_id, ExperimentStatus.FAILED)
