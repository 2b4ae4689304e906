"""``hermes status``, ``list``, ``results`` and ``plot --server`` read an experiment through ``RemoteStore``, which
must follow every page the API gives: a real server (uvicorn, in a thread) over a real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from test_store_reads import serving

from hermes.core.events import TrialSubmitted
from hermes.core.states import TrialState
from hermes.server.api import PAGE_MAX
from hermes.server.app import ServerConfig, create_app
from hermes.server.client import Client, RemoteStore
from hermes.store import SqlStore, TrialRecord
from hermes.testing.recorded import experiment_spec, record_simulated


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RemoteStore, SqlStore]]:
    """alice reads a real server as the command line does (over HTTP); the test records into its store."""
    app = create_app(ServerConfig(root=tmp_path / "server", run_experiments=False))
    with serving(app) as url:
        hermes = app.state.hermes
        yield RemoteStore(Client(url, hermes.accounts.add_user("alice"))), hermes.store


def test_every_trial_is_read_past_the_servers_page(served: tuple[RemoteStore, SqlStore]) -> None:
    """More trials than a page of ``/trials`` holds: the command line saw the first 10,000 alone."""
    remote, store = served
    count = PAGE_MAX + 5
    experiment_id = store.submit_experiment("big", experiment_spec("big", count, 2), "alice")
    store.record_events(experiment_id, [
        (TrialSubmitted(float(i), f"t{i}", 2, {"lr": 0.1}), (),
         [TrialRecord(f"t{i}", {"lr": 0.1}, TrialState.PENDING, 2, float(i))])
        for i in range(count)
    ])
    trials = remote.trials(experiment_id)
    assert len(trials) == count and {t.trial_id for t in trials} == {f"t{i}" for i in range(count)}
    assert trials[-1] == TrialRecord(f"t{count - 1}", {"lr": 0.1}, TrialState.PENDING, 2, float(count - 1))


def test_reports_and_trials_are_read_a_page_at_a_time_to_the_last(
    served: tuple[RemoteStore, SqlStore], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``metrics_after`` without a limit gave one page of reports; with pages of three, every read still gives all."""
    remote, store = served
    experiment_id = store.submit_experiment("sim", experiment_spec("sim", 8, 4), "alice")
    record_simulated(store, experiment_id, 8, 4, seed=3, policy="rr")
    monkeypatch.setattr("hermes.server.client.PAGE", 3)
    reports = store.metrics_after(experiment_id, 0)
    assert len(reports) > 6
    assert remote.metrics_after(experiment_id, 0) == reports
    assert remote.metrics_after(experiment_id, reports[1][0], limit=4) == reports[2:6]
    assert remote.metrics(experiment_id) == [report for _cursor, report in reports]
    assert sorted(remote.trials(experiment_id), key=lambda t: t.trial_id) == sorted(
        store.trials(experiment_id), key=lambda t: t.trial_id)
