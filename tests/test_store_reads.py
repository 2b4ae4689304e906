"""Reads of one trial's reports through the server, and damaged stores that reads must name as such."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient  # noqa: E402

from hermes.server.app import ServerConfig, create_app  # noqa: E402
from hermes.store import SqlStore, StoreError  # noqa: E402
from hermes.testing.recorded import experiment_spec, record_simulated  # noqa: E402


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """A server whose runner runs nothing, with alice's token in its headers."""
    with TestClient(create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))) as client:
        token = client.app.state.hermes.accounts.add_user("alice")  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def test_a_trials_reports_are_read_from_its_first_page(client: TestClient) -> None:
    """The dashboard's trial panel pages through one trial's reports: the first page is that trial's first
    reports, however many of other trials were recorded before them."""
    store = client.app.state.hermes.store  # type: ignore[attr-defined]
    experiment_id = store.submit_experiment("sim", experiment_spec("sim", 12, 6), "alice")
    record_simulated(store, experiment_id, 12, 6, seed=3, policy="rr")
    reports = store.metrics(experiment_id)
    last = reports[-1].trial_id
    own = [r for r in reports if r.trial_id == last]
    assert len(own) >= 5 and last not in {r.trial_id for r in reports[:5]}

    path = f"/api/experiments/{experiment_id}/metrics"
    page = client.get(path, params={"trial": last, "limit": 5}).json()
    assert [(m["trial"], m["step"]) for m in page["metrics"]] == [(r.trial_id, r.step) for r in own[:5]]
    assert page["cursor"] == page["metrics"][-1]["cursor"]
    rest = client.get(path, params={"trial": last, "after": page["cursor"]}).json()
    assert [m["step"] for m in rest["metrics"]] == [r.step for r in own[5:]]
    done = client.get(path, params={"trial": last, "after": rest["cursor"]}).json()
    assert done == {"cursor": rest["cursor"], "metrics": []}  # no more: the cursor stays, and a poll stops


def test_a_cut_store_file_is_named_damaged_in_one_line(tmp_path: Path) -> None:
    """A store file cut short (a full disk, a copy stopped half-way) is read as damaged, with what to do,
    not as SQLAlchemy's error with its statement and its web link."""
    path = tmp_path / "hermes.db"
    store = SqlStore(f"sqlite:///{path}")
    experiment_id = store.create_or_open_experiment("exp", experiment_spec("exp", 4, 6))
    for step in range(1, 2001):
        store.record_metrics(experiment_id, str(step % 4), step, float(step), {"loss": 1 / step})
    store.close()  # the last connection's close writes the -wal file into the store file
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(StoreError) as raised:  # as `hermes status` and the reports read it
        SqlStore.open_read_only(path).metrics(experiment_id)
    assert str(raised.value) == (
        f"{path} is damaged (database disk image is malformed): restore it from a backup, or use another storage dir"
    )
