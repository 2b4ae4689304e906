"""Edges of the hang watchdog (hermes/local/watchdog.py) and of a process-per-run trial's channel: a trial that a
preemptive policy suspends at each report, so that no run of it reports twice, is still watched for hangs; a restore
slower than the steps, or a process lingering after committing its suspension, is not taken for a hang; and a report
of more than a megabyte reads the same in a process of its own as in a warm worker. Real ``hermes run``, real
processes, the real store (helpers of test_run.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hermes.core.decisions import Resume
from hermes.core.states import TrialState
from hermes.local.launchers.process import MAX_LINE
from hermes.experiment import load_spec
from hermes.local.engine import trial_launch
from hermes.local.watchdog import EXIT_GRACE, TrialLimits, Watchdog
from hermes.store import ExperimentStatus
from tests.test_run import hermes, load_view, run_ok, spec_of, write_spec

HANGS = """
import json, threading, time
from hermes import trial

def train(config):
    time.sleep(0.2)  # its start-up (imports, loading data), longer than a turn of round robin
    state = {"step": 0}
    saver = trial.Files(lambda folder: (folder / "state.json").write_text(json.dumps(state)),
                        lambda folder: state.update(json.loads((folder / "state.json").read_text())))
    for step in range(saver.restore() + 1, trial.budget() + 1):
        if step == config["hang_at"]:
            time.sleep(3600)  # a hung step: a deadlocked data loader, a stuck collective
        time.sleep(0.05)
        state["step"] = step
        trial.report(step, loss=1.0 / step + config["seed"])
    if config["linger"]:
        threading.Thread(target=time.sleep, args=(3600,)).start()  # no daemon: its process does not exit
"""


def hang_spec(tmp_path: Path, warm: bool, configs: list[dict[str, int]], steps: int) -> Path:
    """Trials of HANGS on one CPU slot, each run of them reporting once. In warm workers under the hermes policy (every
    default): its first sweep suspends each trial at its first report. In a process per run, whose switches the hermes
    policy finds too dear to make, under round robin with turns shorter than a trial's start-up: each run is told to
    suspend at its first report too."""
    (tmp_path / "hangs.py").write_text(HANGS)
    return write_spec(tmp_path, spec_of(
        "hangs",
        trial={"function": "hangs:train", "workdir": str(tmp_path), "warm_workers": warm,
               "stall": {"factor": 5, "min": 1}},
        search={"sampler": "list", "configs": [{"hang_at": 0, "linger": 0, **config} for config in configs]},
        metric={"name": "loss", "mode": "min"},
        budget={"steps": steps},
        policy={"name": "hermes"} if warm else {"name": "rr", "period": 0.1},
        resources={"gpus": "none", "cpu_slots": 1, "threads_per_slot": 1},
    ))


@pytest.mark.parametrize("warm", [True, False], ids=["warm-worker", "own-process"])
def test_a_trial_suspended_at_each_report_that_hangs_after_two_is_killed_and_the_others_complete(
    tmp_path: Path, warm: bool
) -> None:
    """docs/trials.md: the defaults "catch a trial that hangs after it has reported twice". Before, a trial whose runs
    each reported once had no step time, so it held the only slot for ever and the others never ran again."""
    path = hang_spec(tmp_path, warm, [{"seed": 0, "hang_at": 3}, {"seed": 1}, {"seed": 2}], 4)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=40)
    assert result.returncode == 0, result.stderr
    view, decisions = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert any(isinstance(decision, Resume) and decision.trial_id == "0" for decision in decisions)  # step 2: a new run
    outcomes = {trial.trial_id: (trial.state, trial.step) for trial in view.trials}
    assert outcomes == {"0": (TrialState.FAILED, 2), "1": (TrialState.COMPLETED, 4), "2": (TrialState.COMPLETED, 4)}
    [hung] = [trial for trial in view.trials if trial.trial_id == "0"]
    why = r"its slowest (step took \S+s|run took \S+s to its first report)"  # it hung in a step, or starting again
    assert re.fullmatch(rf"hung: no report for \S+s, while {why} \(trial.stall: factor 5, min 1s\)", hung.error or ""), (
        hung.error)
    assert "trial 0 failed at step 2" in result.stdout


def test_a_last_run_that_does_not_exit_is_killed_and_counts_completed(tmp_path: Path) -> None:
    """A process per run whose last run reports only its budget's last step and then does not exit (a thread that is
    no daemon). Before, with no step time, it held its slot for ever."""
    path = hang_spec(tmp_path, False, [{"seed": 0, "linger": 1}, {"seed": 1}], 2)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=40)
    assert result.returncode == 0, result.stderr
    view, decisions = load_view(tmp_path / "runs")
    assert any(isinstance(decision, Resume) and decision.trial_id == "0" for decision in decisions)  # step 2: a new run
    assert [(trial.trial_id, trial.state, trial.step) for trial in view.trials] == [
        ("0", TrialState.COMPLETED, 2), ("1", TrialState.COMPLETED, 2)]
    errors = [trial.error or "" for trial in view.trials]
    assert errors[0].startswith("after its last step: hung: no report for ") and errors[1] == "", errors
    assert "trial 0 completed at step 2, loss 0.5 (after its last step: hung: " in result.stdout


# ---------------------------------------------------------------------- what a step is, on the watchdog's clock
def test_a_step_spans_a_suspension_and_arms_the_stall_limit() -> None:
    """One report a run: the running time from the report before the suspension to the one after the resume is a
    step (suspended time is free). Before, only two reports of one run timed a step."""
    watchdog = Watchdog(TrialLimits(stall_factor=20, stall_min=1))
    watchdog.started("t", 0.0)
    watchdog.reported("t", 1.0)  # its first report: start-up and a step, no step time yet
    watchdog.stopped("t", 1.1)  # suspended
    watchdog.started("t", 50.0)
    assert watchdog.deadline() is None  # no step across two runs yet: its restore is not measured against steps
    watchdog.reported("t", 50.4)  # a step of 0.1 + 0.4 seconds' running time
    assert watchdog.deadline() == pytest.approx(50.4 + 20 * 0.5)
    reason = "hung: no report for 10s, while its slowest step took 0.5s (trial.stall: factor 20, min 1s)"
    assert watchdog.overdue(60.5) == [("t", reason)]


def test_the_default_limits_let_a_fast_trial_evaluate_for_minutes(tmp_path: Path) -> None:
    """Steps of 0.2 s and an evaluation of 65 s: the spec's defaults killed it as hung after 60 s, a healthy trial
    lost; a real hang is still caught, after 10 minutes."""
    spec = load_spec(write_spec(tmp_path, spec_of("evaluates")))
    watchdog = Watchdog(trial_launch(spec, {}, str(tmp_path)).limits)
    watchdog.started("t", 0.0)
    for moment in (1.0, 1.2, 1.4):
        watchdog.reported("t", moment)
    assert watchdog.deadline() == pytest.approx(1.4 + 600)  # a hang here is caught after 10 minutes
    assert watchdog.overdue(1.4 + 65) == []
    watchdog.reported("t", 1.4 + 65)  # its evaluation's report: now its slowest step
    assert watchdog.deadline() == pytest.approx(66.4 + 20 * 65)


def test_a_run_starting_again_is_measured_against_start_ups() -> None:
    """A process per run starts Python, imports and loads its checkpoint again at each resume: seconds, against steps
    of a tenth. Before, such a restore was killed at 20 times a step (min 1 s here) as a hang."""
    watchdog = Watchdog(TrialLimits(stall_factor=20, stall_min=1))
    watchdog.started("t", 0.0)
    for moment in (3.0, 3.1, 3.2):  # a start-up of 3 s to its first report, then steps of 0.1 s
        watchdog.reported("t", moment)
    watchdog.stopped("t", 3.2)
    watchdog.started("t", 10.0)
    assert watchdog.deadline() == pytest.approx(10.0 + 20 * 3.0)  # a hung restore is caught, at 20 start-ups
    watchdog.reported("t", 15.0)  # 5 s of running time since its last report: a step, and its slowest start
    assert watchdog.deadline() == pytest.approx(15.0 + 20 * 5.0)
    watchdog.stopped("t", 15.0)
    watchdog.started("t", 20.0)
    reason = "hung: no report for 100s, while its slowest run took 5s to its first report (trial.stall: factor 20, min 1s)"
    assert watchdog.overdue(119.0) == [] and watchdog.overdue(120.0) == [("t", reason)]



def test_a_run_starting_again_is_given_a_whole_step_at_least() -> None:
    """A quick first report (a baseline evaluation before training), then steps of 3 s: a resume's first report
    holds a whole step, and was killed at 20 times the quick one."""
    watchdog = Watchdog(TrialLimits(stall_factor=2, stall_min=0.1))
    watchdog.started("t", 0.0)
    watchdog.reported("t", 0.05)
    watchdog.reported("t", 3.05)  # a step of 3 s
    watchdog.stopped("t", 3.05)
    watchdog.started("t", 10.0)
    assert watchdog.deadline() == pytest.approx(10.0 + 2 * 3.0)
    reason = "hung: no report for 6s, while its slowest step took 3s (trial.stall: factor 2, min 0.1s)"
    assert watchdog.overdue(15.9) == [] and watchdog.overdue(16.0) == [("t", reason)]

def test_lingering_after_committing_its_suspension_is_no_step() -> None:
    """A process that committed its suspension and lingers until it is killed (a thread that is no daemon) held its
    slot, but those seconds were no step of its training."""
    watchdog = Watchdog(TrialLimits(stall_factor=20, stall_min=1))
    watchdog.started("t", 0.0)
    watchdog.reported("t", 1.0)
    watchdog.exiting("t", 1.2)  # its checkpoint written
    reason = f"it did not exit within {EXIT_GRACE:g}s of committing its suspension"
    assert watchdog.overdue(1.2 + EXIT_GRACE) == [("t", reason)]  # stopped by the watchdog: killed
    watchdog.started("t", 100.0)
    watchdog.reported("t", 101.0)  # 0.2 s to its commit, then 1 s to start again and report
    assert watchdog.deadline() == pytest.approx(101.0 + 20 * 1.2)


# ---------------------------------------------------------------------- a report of more than a megabyte
BIG = """
import time
from hermes import trial

def train(config):
    for step in range(1, trial.budget() + 1):
        time.sleep(0.01)  # per-class metrics: a report of more than a megabyte as a JSON line
        trial.report(step, loss=1.0 / step, **{f"class_{i}_acc": i / 70_000 for i in range(70_000)})
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm-worker", "own-process"])
def test_a_report_of_more_than_a_megabyte_is_recorded_whole(tmp_path: Path, warm: bool) -> None:
    """Before, a trial in a process of its own failed with ``protocol error: ValueError('a message of 1048576 bytes
    or more')``, the limit of an unmodified program's output lines, where a warm worker's recorded it."""
    metrics = {"loss": 1.0, **{f"class_{i}_acc": i / 70_000 for i in range(70_000)}}
    assert len(json.dumps({"type": "report", "step": 1, "metrics": metrics})) > MAX_LINE
    (tmp_path / "big.py").write_text(BIG)
    run_ok(write_spec(tmp_path, spec_of(
        "big", trial={"function": "big:train", "workdir": str(tmp_path), "warm_workers": warm},
        search={"sampler": "list", "configs": [{"seed": 0}]}, metric={"name": "loss", "mode": "min"},
        budget={"steps": 2}, policy={"name": "fifo"}, resources={"gpus": "none", "cpu_slots": 1},
    )))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.step, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, 2, None)]
    assert [(record.step, len(record.values), record.values["class_69999_acc"]) for record in view.metrics] == [
        (1, 70_001, 69_999 / 70_000), (2, 70_001, 69_999 / 70_000)]
