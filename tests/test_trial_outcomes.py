"""What the results say of how a trial ended: its checkpoint, its exit, its error's summary.

Real runners (``hermes.run`` and ``hermes run``), real warm workers and trial processes, the real store; the trials
are the functions of ``TRIALS``, written to each test's folder.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import hermes
from hermes.errors import HermesError
from hermes.trial import load_state, protocol
from tests.test_run import RUN_TIMEOUT, environment, hermes_command, write_spec
from tests.test_run import hermes as hermes_cli

TRIALS = '''
import sys

from hermes import trial

EXITS = {"message": "dataset not found: /data/foo", "none": None, "zero": 0, "three": 3}


def no_saver(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, loss=1.0 / step)


def with_files(config):
    files = trial.Files(lambda folder: (folder / "state").write_text("saved"), lambda folder: None)
    for step in range(files.restore() + 1, trial.budget() + 1):
        trial.report(step, loss=1.0 / step)


def train(config):
    {"no_saver": no_saver, "with_files": with_files}[config["kind"]](config)


def exits(config):
    trial.report(1, loss=1.0)
    sys.exit(EXITS[config["exit"]])


def crashes_after_a_report(config):
    trial.report(1, loss=1.0)
    raise ValueError("kaboom in trial")
'''
RAISED_AT = TRIALS.splitlines().index('    raise ValueError("kaboom in trial")') + 1  # its line in outcomes.py


def spec_of(name: str, function: str, configs: list[dict[str, Any]], folder: Path, steps: int = 2,
            **trial: Any) -> dict[str, Any]:
    """A spec of ``outcomes.<function>`` on two CPU slots, one trial per config, every step checkpointed."""
    (folder / "outcomes.py").write_text(TRIALS)
    return {"name": name, "trial": {"function": f"outcomes:{function}", "workdir": str(folder), **trial},
            "search": {"configs": configs}, "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": steps},
            "policy": {"name": "fifo"}, "resources": {"gpus": "none", "cpu_slots": 2},
            "storage": {"dir": str(folder / "runs"), "checkpoint_every": 1}}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> hermes.ExperimentResult:
    """A trial that creates no saver, and one whose Files save its state, every step checkpointed."""
    folder = tmp_path_factory.mktemp("saved")
    return hermes.run(spec_of("saved", "train", [{"kind": "no_saver"}, {"kind": "with_files"}], folder))


def test_a_trial_with_no_saver_has_no_checkpoint_in_its_results(saved: hermes.ExperimentResult) -> None:
    """Its checkpoints hold only hermes.json (the metrics of their step, to report it again): results named one
    as its checkpoint, and load_state said state.pt was not there, asking whether that was a checkpoint's folder."""
    by_kind = {trial.params["kind"]: trial for trial in saved.trials}
    no_saver, with_files = by_kind["no_saver"], by_kind["with_files"]
    assert no_saver.directory is not None
    kept = no_saver.directory / protocol.CHECKPOINTS_DIR / "step-2"
    assert [path.name for path in kept.iterdir()] == [protocol.META_FILE]  # what it commits: no state
    assert no_saver.checkpoint is None
    assert with_files.checkpoint == with_files.directory / protocol.CHECKPOINTS_DIR / "step-2"
    with pytest.raises(HermesError, match="checkpoint is None: the trial has no committed checkpoint"):
        load_state(no_saver.checkpoint)
    listed = json.loads(hermes_cli("results", str(saved.store.parent), "--format", "json", cwd=kept.parent).stdout)
    assert {row["params"]["kind"]: row["checkpoint"] for row in listed} == {
        "no_saver": None, "with_files": str(with_files.checkpoint)}


def test_results_as_csv_count_the_reports_as_json_does(saved: hermes.ExperimentResult) -> None:
    """JSON and hermes.run's results gave each trial's reports; CSV had no such column."""
    listed = hermes_cli("results", str(saved.store.parent), "--format", "csv", cwd=saved.store.parent).stdout
    rows = list(csv.DictReader(io.StringIO(listed)))
    assert [(row["trial"], row["reports"]) for row in rows] == [
        (trial.trial_id, str(trial.reports)) for trial in saved.trials] == [("0", "2"), ("1", "2")]


def test_a_checkpoint_past_the_last_step_the_store_recorded_is_not_the_results(tmp_path: Path) -> None:
    """The runner died between a trial's commit of step 2 and the store's record of its report: results pointed at
    step-2, while they listed step 1 only. Continued, the trial resumes from it and reports step 2 again."""
    spec = spec_of("past", "with_files", [{"kind": "with_files"}], tmp_path, steps=3)
    path = write_spec(tmp_path, spec)
    crashed = subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=tmp_path,
                             env={**environment(), "HERMES_CRASH_AT": "report:2"}, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT, check=False)
    assert crashed.returncode == 137, crashed.stderr
    checkpoints = tmp_path / "runs" / "past" / "trials" / "0" / protocol.CHECKPOINTS_DIR
    assert (checkpoints / protocol.LATEST_FILE).read_text() == "step-2"  # committed, its report never recorded
    [row] = json.loads(hermes_cli("results", "runs", "--format", "json", cwd=tmp_path).stdout)
    assert (row["steps"], row["checkpoint"]) == (1, None)

    [trial] = hermes.run(path).trials
    assert (trial.state, trial.steps, trial.reports, trial.checkpoint) == ("completed", 3, 3, checkpoints / "step-3")


def test_sys_exit_in_a_warm_worker_means_what_it_means_in_a_process_of_its_own(tmp_path: Path) -> None:
    """``sys.exit("dataset not found: /data/foo")`` failed with 'exit code dataset not found: /data/foo' and an
    empty stderr.log; a process of its own writes the message to its stderr and exits with 1."""
    configs = [{"exit": exit} for exit in ("message", "none", "zero", "three")]
    ended = {}
    for warm in (True, False):
        folder = tmp_path / ("warm" if warm else "process")
        folder.mkdir()
        result = hermes.run(spec_of("exits", "exits", configs, folder, warm_workers=warm, max_failures=0))
        ended[warm] = {trial.params["exit"]: (trial.state, trial.error, (trial.directory / "stderr.log").read_text())
                       for trial in result.trials}
    assert ended[True] == ended[False] == {
        "message": ("failed", "exit code 1: dataset not found: /data/foo", "dataset not found: /data/foo\n"),
        "none": ("completed", None, ""),
        "zero": ("completed", None, ""),
        "three": ("failed", "exit code 3", ""),
    }


def test_the_summary_of_a_crash_names_the_exception_and_where_it_was_raised(tmp_path: Path) -> None:
    """A trial with no saver that raised after its first report: the summary showed the first line of its stderr,
    Hermes's note that it starts over 'after its resume' (a run again after its crash), not where it raised."""
    result = hermes.run(spec_of("crash", "crashes_after_a_report", [{"kind": "crash"}], tmp_path))
    assert result.error == ("every trial failed; trial 0: uncaught ValueError: kaboom in trial, at "
                            f"outcomes.py:{RAISED_AT} (crashed 3 times)")
    [trial] = result.trials
    assert trial.directory is not None
    said = (trial.directory / "stderr.log").read_text()
    assert said.count("which was to go on after step 1 (a resume, or a run again after a crash), starts over from "
                      "step 1") == 2, said
    assert "after its resume" not in said
    status = hermes_cli("status", "runs", cwd=tmp_path).stdout
    assert f"uncaught ValueError: kaboom in trial, at outcomes.py:{RAISED_AT} (crashed 3 times)" in status, status
