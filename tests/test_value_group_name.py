"""A command's ``metrics_regex`` reads the objective in its documented ``(?P<value>...)`` group: best_metrics held it
as ``value``, not by the metric's name as README says, and the CSV had an ``at_best_value`` column beside
``best_accuracy``. Real run (``hermes.run``), real process, the real store; the store keeps the group as read."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

import hermes
from hermes.cli import main
from tests.test_run import load_view
from tests.test_scripts import program_spec

PROGRAM = "print('epoch 1 loss 0.25 accuracy 0.75', flush=True)\n"


def test_best_metrics_name_the_value_group_by_the_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = hermes.run(program_spec(tmp_path, "named", PROGRAM, r"loss (?P<loss>\S+) accuracy (?P<value>\S+)", 1))
    assert [trial.best_metrics for trial in result.trials] == [{"loss": 0.25, "accuracy": 0.75}]
    view, _ = load_view(tmp_path / "runs")
    assert [record.values for record in view.metrics] == [{"loss": 0.25, "value": 0.75}]  # as read, as stores before

    assert main(["results", str(tmp_path / "runs"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["best_metrics"] == {"loss": 0.25, "accuracy": 0.75}
    assert main(["results", str(tmp_path / "runs"), "--format", "csv"]) == 0
    [row] = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert (row["best_accuracy"], row["at_best_loss"]) == ("0.75", "0.25") and "at_best_value" not in row
