"""An experiment that ended keeps the weight it ran with: changing it is refused with 409, as its cancel is."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from fastapi.testclient import TestClient

from hermes.server.app import ServerConfig, create_app
from hermes.store import ExperimentStatus
from hermes.testing.recorded import experiment_spec


def test_the_weight_of_an_ended_experiment_is_not_changed(tmp_path: Path) -> None:
    config = ServerConfig(root=tmp_path / "server", run_experiments=False)
    with TestClient(create_app(config)) as client:
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        headers = {"Authorization": f"Bearer {hermes.accounts.add_user('alice')}"}
        store = hermes.store
        ids = {}
        for status in ExperimentStatus:
            ids[status] = store.submit_experiment(status.value, experiment_spec(status.value, 2, 2), "alice")
            if status is not ExperimentStatus.QUEUED:
                store.set_status(ids[status], status)
        for status, experiment_id in ids.items():
            response = client.put(f"/api/experiments/{experiment_id}/weight", json={"weight": 3}, headers=headers)
            if status.is_final:
                assert response.status_code == 409, (status, response.text)
                assert response.json() == {"detail": f"experiment {experiment_id} is {status.value} already"}
                assert store.experiment(experiment_id).weight == 1.0
            else:  # queued, running, or interrupted (a pool takes it up again)
                assert response.status_code == 200, (status, response.text)
                assert response.json()["weight"] == 3.0 and store.experiment(experiment_id).weight == 3.0
