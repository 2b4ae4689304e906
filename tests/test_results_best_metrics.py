"""Every metric a trial reported with its best value reaches the read-outs: the store kept them, but `hermes results`
gave only the objective, so a validation accuracy reported beside the loss ranked by could be read back only by SQL
(Ray Tune's best result carries every metric of its report, Optuna's trials their user attributes)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.states import TrialState
from hermes.report import STORE_FILE
from hermes.store import ExperimentStatus, SqlStore, TrialRecord
from tests.test_report import spec


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """Trial 0's loss is best at step 2 (its accuracy there 0.7, not its last 0.9); trial 1 reported a NaN accuracy
    with its best; trial 2 reported nothing finite."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        experiment_id = store.create_or_open_experiment("two", spec("two", "loss", "min"))
        reports = {"0": [{"loss": 0.5, "acc": 0.6}, {"loss": 0.2, "acc": 0.7}, {"loss": 0.3, "acc": 0.9}],
                   "1": [{"loss": 0.4, "acc": math.nan, "lr_now": 0.01}],
                   "2": [{"loss": math.inf}]}
        for trial_id, reported in reports.items():
            store.upsert_trial(experiment_id, TrialRecord(trial_id, {"lr": 0.1}, TrialState.COMPLETED,
                                                          budget=len(reported), submitted_at=0.0, step=len(reported)))
            for step, values in enumerate(reported, start=1):
                store.record_metrics(experiment_id, trial_id, step, float(step), values)
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
    finally:
        store.close()
    return tmp_path


def test_json_and_csv_give_every_metric_of_the_report_that_gave_the_best(
    storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(storage), "--format", "json"]) == 0
    rows = {row["trial"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["0"]["best"] == 0.2 and rows["0"]["best_metrics"] == {"loss": 0.2, "acc": 0.7}
    assert rows["1"]["best_metrics"] == {"loss": 0.4, "acc": None, "lr_now": 0.01}  # JSON has no NaN
    assert rows["2"]["best"] is None and rows["2"]["best_metrics"] == {}

    assert main(["results", str(storage), "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(row["trial"], row["at_best_acc"], row["at_best_lr_now"]) for row in table] == [
        ("0", "0.7", ""), ("1", "", "0.01"), ("2", "", "")]
    assert "at_best_loss" not in table[0]  # the objective's own column is best_loss
    assert list(table[0])[-3:] == ["checkpoint", "at_best_acc", "at_best_lr_now"]  # after the columns there before


def test_hermes_run_gives_them_as_hermes_results_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hermes
    from tests.test_run import hermes as hermes_cli
    from tests.test_run import score, search, spec_of

    monkeypatch.chdir(tmp_path)
    budget = 3
    result = hermes.run(spec_of("metrics", search=search(2, 2, 0.01), budget={"steps": budget},
                                storage={"dir": "runs"}))
    for trial in result.trials:  # tests/trials/curve.py reports its score and the running total of its scores
        total = sum(score(trial.params["rate"], step) for step in range(1, trial.best_step + 1))
        assert trial.best_metrics == {"score": trial.best, "total": pytest.approx(total)}, trial
    cli = json.loads(hermes_cli("results", "runs", "--format", "json", cwd=tmp_path).stdout)
    assert [row["best_metrics"] for row in cli] == [trial.best_metrics for trial in result.trials]
