"""A failed trial is never the experiment's best: its searcher was told it failed (Optuna's best trial is a complete
one) and its checkpoint is of a crashed run. It ranks after every other trial, its values still shown.

Real runs (``hermes.run``: trial processes on a CPU slot, a real SQLite store) read back by the real CLI; a stopped
trial's case from a real store.
"""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pytest

import hermes
from hermes.cli import main
from hermes.core.states import TrialState
from hermes.report import ExperimentView, pick_experiment
from hermes.report.plot import draw_figures
from hermes.report.results import standings
from hermes.report.status import experiment_status, format_status
from hermes.store import ExperimentStatus, SqlStore, TrialRecord
from hermes.tuning import ExperimentResult
from tests.test_report import spec as stored_spec

# Reports acc = x * step; the trials whose x is above 0.8 crash after step ``crash_at`` on every run (a CUDA out of
# memory late in training, say), so they fail with the highest value reported.
TRIAL = """\
from hermes import trial

CRASH_AT = {crash_at}


def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, acc=config["x"] * step)
        if config["x"] > 0.8 and step == CRASH_AT:
            raise RuntimeError("CUDA out of memory (simulated)")
"""


def run_experiment(folder: Path, name: str, xs: list[float], crash_at: int, max_failures: int) -> ExperimentResult:
    folder.mkdir()
    (folder / "crashing_trial.py").write_text(TRIAL.format(crash_at=crash_at))
    return hermes.run({
        "name": name,
        "trial": {"function": "crashing_trial:train", "workdir": str(folder), "max_failures": max_failures},
        "search": {"configs": [{"x": x} for x in xs]},
        "metric": {"name": "acc", "mode": "max"},
        "budget": {"steps": 4},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1, "threads_per_slot": 1},
        "storage": {"dir": str(folder / "store")},
    })


@pytest.fixture(scope="module")
def one_failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExperimentResult]:
    """Trial 1 (x 0.9) crashes after step 3 on each of its 3 runs and fails with acc 2.7, above trial 0's 2.0."""
    folder = tmp_path_factory.mktemp("one") / "experiment"
    return folder / "store", run_experiment(folder, "one-failed", [0.5, 0.9, 0.3], crash_at=3, max_failures=2)


@pytest.fixture(scope="module")
def all_failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExperimentResult]:
    """Both trials crash after step 2, with acc 1.8 and 1.9."""
    folder = tmp_path_factory.mktemp("all") / "experiment"
    return folder / "store", run_experiment(folder, "all-failed", [0.9, 0.95], crash_at=2, max_failures=0)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_result_best_is_the_best_trial_that_did_not_fail(one_failed: tuple[Path, ExperimentResult]) -> None:
    _, result = one_failed
    assert [(t.trial_id, t.state, t.best) for t in result.trials] == [
        ("0", "completed", 2.0), ("2", "completed", 1.2), ("1", "failed", pytest.approx(2.7))]
    assert result.best is result.trials[0]  # trial 0, not the crashed trial 1
    assert result.error is None


def test_results_rank_a_failed_trial_after_every_other_in_every_format(
    one_failed: tuple[Path, ExperimentResult], capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = one_failed
    rows = json.loads(cli(capsys, "results", str(store), "--format", "json"))
    assert [(row["rank"], row["trial"], row["state"]) for row in rows] == [
        (1, "0", "completed"), (2, "2", "completed"), (3, "1", "failed")]
    assert rows[2]["best"] == pytest.approx(2.7) and rows[2]["best_step"] == 3  # its values are still shown
    csv = cli(capsys, "results", str(store), "--format", "csv").splitlines()
    assert [line.split(",")[:3] for line in csv[1:4]] == [["1", "0", "completed"], ["2", "2", "completed"],
                                                          ["3", "1", "failed"]]
    table = cli(capsys, "results", str(store)).splitlines()
    assert table[0] == "one-failed: top 3 by best acc (max), failed trials last"
    assert [line.split()[:3] for line in table[3:]] == [["1", "0", "completed"], ["2", "2", "completed"],
                                                        ["3", "1", "failed"]]


def test_status_and_list_name_the_best_trial_that_did_not_fail(
    one_failed: tuple[Path, ExperimentResult], capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = one_failed
    assert "best        trial 0: acc 2 at step 4 (x=0.5)\n" in cli(capsys, "status", str(store))
    assert cli(capsys, "list", str(store)).splitlines()[-1].rstrip().endswith("acc 2 (trial 0)")


def test_the_plot_colours_a_failed_trial_after_the_others_and_says_it_failed(
    one_failed: tuple[Path, ExperimentResult],
) -> None:
    store, _ = one_failed
    with closing(SqlStore(f"sqlite:///{store / 'hermes.db'}")) as opened:
        view = ExperimentView.load(opened, pick_experiment(opened, "one-failed"))
    curves, _ = draw_figures(view)
    legend = curves.axes[0].get_legend()
    assert [text.get_text() for text in legend.get_texts()] == [
        "#1 trial 0: 2", "#2 trial 2: 1.2", "#3 trial 1: 2.7 (failed)"]


def test_when_every_trial_failed_there_is_no_best_and_each_read_out_says_so(
    all_failed: tuple[Path, ExperimentResult], capsys: pytest.CaptureFixture[str]
) -> None:
    store, result = all_failed
    assert result.best is None and result.error is not None and result.error.startswith("every trial failed")
    assert [(t.trial_id, t.best) for t in result.trials] == [("1", 1.9), ("0", 1.8)]  # by value among themselves
    status = cli(capsys, "status", str(store))
    assert "best        none: only failed trials reported a finite acc, and a failed trial is no result\n" in status
    assert cli(capsys, "list", str(store)).splitlines()[-1].rstrip().endswith("2 failed")  # an empty best column
    table = cli(capsys, "results", str(store)).splitlines()
    assert table[0] == "all-failed: top 2 by best acc (max)"  # every trial failed: nothing ranked after another


def test_a_stopped_trial_may_be_the_best_and_a_failed_one_ranks_after_a_pending_one() -> None:
    """Stopped (early): its values are a healthy trial's. Failed trials come after every trial that did not fail,
    one that has not reported yet too."""
    trials = {"0": (TrialState.COMPLETED, [0.5, 0.4]), "1": (TrialState.FAILED, [0.3, 0.1]),
              "2": (TrialState.STOPPED, [0.35, 0.2]), "3": (TrialState.PENDING, []),
              "4": (TrialState.FAILED, [0.25])}
    with closing(SqlStore("sqlite://")) as store:
        experiment_id = store.create_or_open_experiment("mixed", stored_spec("mixed", "loss", "min"))
        for trial_id, (state, values) in trials.items():
            store.upsert_trial(experiment_id, TrialRecord(trial_id, {"lr": 0.01}, state, budget=3, submitted_at=0.0,
                                                          step=len(values)))
            for step, value in enumerate(values, start=1):
                store.record_metrics(experiment_id, trial_id, step, float(step), {"loss": value})
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
        experiment = pick_experiment(store, "mixed")
        ranked = standings(ExperimentView.load(store, experiment))
        status = format_status(experiment_status(store, experiment))
    assert [(s.trial_id, s.best) for s in ranked] == [("2", 0.2), ("0", 0.4), ("3", None), ("1", 0.1), ("4", 0.25)]
    assert "best        trial 2: loss 0.2 at step 2 (lr=0.01)\n" in status
