"""A choice of 1 and "1" (or true and "true") holds two values, which JSON keeps apart: the CSV wrote both as 1 (and
true), and the table showed both as 1. Text that would read as JSON is now written quoted; other text stays bare."""

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

PARAMS = [{"v": 1, "w": True, "name": "adam"}, {"v": "1", "w": "true", "name": "adam"},
          {"v": 1.5, "w": "null", "name": "[1]"}]


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A store of one finished experiment, "mixed", whose trials hold ``PARAMS``."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        experiment_id = store.create_or_open_experiment("mixed", spec("mixed", "loss", "min"))
        for index, params in enumerate(PARAMS):
            store.upsert_trial(experiment_id, TrialRecord(str(index), params, TrialState.COMPLETED, budget=1,
                                                          submitted_at=0.0, step=1))
            store.record_metrics(experiment_id, str(index), 1, 1.0, {"loss": float(index)})
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
    finally:
        store.close()
    return tmp_path


def test_csv_tells_text_that_reads_as_json_from_the_value_it_reads_as(
    storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(storage), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    cells = [(row["param_v"], row["param_w"], row["param_name"]) for row in rows]
    assert cells == [("1", "true", "adam"), ('"1"', '"true"', "adam"), ("1.5", '"null"', '"[1]"')]

    def read(cell: str) -> object:  # as the CSV says to read a cell: JSON where it parses, else text
        try:
            return json.loads(cell)
        except ValueError:
            return cell

    assert [{name: read(row[f"param_{name}"]) for name in ("v", "w", "name")} for row in rows] == PARAMS
    assert [type(read(row["param_v"])) for row in rows] == [int, str, float]


def test_the_table_quotes_text_that_looks_like_a_number_or_a_boolean(
    storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(storage)]) == 0
    rows = [line.split()[-3:] for line in capsys.readouterr().out.splitlines()[3:]]
    assert rows == [["1", "true", "adam"], ['"1"', '"true"', "adam"], ["1.5", '"null"', '"[1]"']]
