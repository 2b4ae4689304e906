"""`hermes results --format csv|json` is an export: it gives every trial unless --top says, where it gave the table's
10 and `> all.csv` silently dropped the rest. The table keeps its top 10."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.states import TrialState
from hermes.report import STORE_FILE
from hermes.store import ExperimentStatus, SqlStore, TrialRecord
from tests.test_report import spec

TRIALS = 12


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A store of one finished experiment, "many", of 12 trials, each with one report."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        experiment_id = store.create_or_open_experiment("many", spec("many", "loss", "min"))
        for index in range(TRIALS):
            trial_id = f"{index:02d}"
            store.upsert_trial(experiment_id, TrialRecord(trial_id, {"lr": 0.01 * (index + 1)},
                                                          TrialState.COMPLETED, budget=1, submitted_at=0.0, step=1))
            store.record_metrics(experiment_id, trial_id, 1, 1.0, {"loss": float(index)})
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
    finally:
        store.close()
    return tmp_path


def test_csv_and_json_export_every_trial_and_the_table_its_top_10(
    storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(storage), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["trial"] for row in rows] == [f"{index:02d}" for index in range(TRIALS)]
    assert main(["results", str(storage), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == TRIALS
    assert main(["results", str(storage), "--format", "json", "--top", "3"]) == 0
    assert [row["trial"] for row in json.loads(capsys.readouterr().out)] == ["00", "01", "02"]

    assert main(["results", str(storage)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("many: top 10 by best loss (min)\n"), table
    assert len(table.splitlines()) == 3 + 10  # the title, the header and its rule, a row per trial
