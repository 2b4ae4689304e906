"""Edges of how a program's end and its numbers are read: thousands separators and Hugging Face's float epochs in
an unmodified program's output, a trial slow to exit after its last step or after committing its suspension, a
report from a forked child or from a program without a channel, and the GPU timeline's mark of a trial that ended
without a report. Real ``hermes run``, real processes, the real store (helpers of test_run.py and test_scripts.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hermes.core.decisions import Suspend
from hermes.core.states import TrialState
from hermes.local.watchdog import EXIT_GRACE, TrialLimits, Watchdog
from hermes.report import open_store, pick_experiment
from tests.test_run import hermes, load_view, run_ok, spec_of, trial_dir, write_spec
from tests.test_scripts import program_spec, values_of

DOCUMENTED = r"[-+]?[\d.]+(?:[eE][-+]?\d+)?"  # docs/trials.md's pattern of a number
GROUPED = r"[-+]?[\d,.]*\d(?:[eE][-+]?\d+)?"  # the one it suggests for thousands


# ---------------------------------------------------------------------- 1. thousands separators
THOUSANDS = ("for epoch in range(1, 4):  # a perplexity with thousands separators, and a comma-separated row\n"
             "    print(f'epoch {epoch} accuracy {1000.0 * epoch:,.2f} row {epoch},150,0.5', flush=True)\n")


def test_a_number_with_thousands_separators_fails_the_trial_and_the_suggested_pattern_reads_it(
    tmp_path: Path,
) -> None:
    """Before, the documented pattern read ``1,000.00`` as 1 and recorded it. The fields of a comma-separated row
    are no thousands."""
    (tmp_path / "cut").mkdir()
    path = program_spec(tmp_path / "cut", "thousands", THOUSANDS,
                        rf"epoch (?P<step>\d+) accuracy (?P<value>{DOCUMENTED})", 3)
    result = hermes("run", str(path), "--no-live", cwd=path.parent)
    error = ("trial.metrics_regex's group 'value' read '1' in the line 'epoch 1 accuracy 1,000.00 row 1,150,0.5', "
             f"where the number goes on: read it whole, with (?P<value>{GROUPED})")
    assert result.returncode == 1, result.stdout
    view, _ = load_view(path.parent / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, error)]
    assert view.metrics == []

    (tmp_path / "whole").mkdir()
    path = program_spec(tmp_path / "whole", "thousands", THOUSANDS,
                        rf"epoch (?P<step>\d+) accuracy (?P<value>{GROUPED}) row (?P<row>\d+),(?P<of>\d+),", 3)
    run_ok(path)
    view, _ = load_view(path.parent / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert [(record.step, record.values) for record in view.metrics] == [
        (epoch, {"value": 1000.0 * epoch, "row": epoch, "of": 150.0}) for epoch in (1, 2, 3)]


# ---------------------------------------------------------------------- 2. Hugging Face's float epochs
TRAINER = ("for epoch in range(1, 4):  # what a Hugging Face Trainer prints at each evaluation\n"
           "    print({'eval_loss': 1.0 / epoch, 'eval_accuracy': epoch / 10, 'epoch': float(epoch)}, flush=True)\n")


@pytest.mark.parametrize("step", [r"(?P<step>\d+)\.0", f"(?P<step>{DOCUMENTED})"], ids=["whole-then-.0", "number"])
def test_an_epoch_printed_as_a_whole_float_is_its_step(tmp_path: Path, step: str) -> None:
    """Before, ``\\d+\\.0`` was refused as reading part of '1.0', which the pattern itself read, and the number
    it suggested was refused as no whole number."""
    pattern = rf"'eval_accuracy': (?P<accuracy>{DOCUMENTED}), 'epoch': {step}"
    run_ok(program_spec(tmp_path, "trainer", TRAINER, pattern, 3))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.1), (2, 0.2), (3, 0.3)]}


# ---------------------------------------------------------------------- 3. slow to exit after its last step
STUCK_TEARDOWN = """
import time
for epoch in range(1, 4):
    time.sleep(0.1)
    print(f"epoch {epoch} accuracy {epoch / 10}", flush=True)
time.sleep(3600)  # a stuck NCCL or DataLoader teardown
"""
STUCK_FUNCTION = """
import time
from hermes import trial

def train(config):
    for epoch in range(1, trial.budget() + 1):
        time.sleep(0.1)
        trial.report(epoch, accuracy=epoch / 10)
    time.sleep(3600)  # a final save that never ends
"""


@pytest.mark.parametrize("kind", ["unmodified", "warm-function"])
def test_a_trial_that_hangs_after_its_last_step_is_killed_and_completed(tmp_path: Path, kind: str) -> None:
    """As a crash there is: it trained its budget. Before, it failed (hung: no report for ...)."""
    stall = {"factor": 2, "min": 0.5}
    if kind == "unmodified":
        path = program_spec(tmp_path, "teardown", STUCK_TEARDOWN, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 3,
                            stall=stall)
    else:
        (tmp_path / "stuck.py").write_text(STUCK_FUNCTION)
        path = write_spec(tmp_path, spec_of(
            "teardown", trial={"function": "stuck:train", "workdir": str(tmp_path), "stall": stall},
            search={"sampler": "grid", "space": {"seed": {"type": "grid", "values": [0]}}},
            metric={"name": "accuracy", "mode": "max"}, budget={"steps": 3}, policy={"name": "fifo"},
            resources={"gpus": "none", "cpu_slots": 1}))
    result = run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    [trial] = view.trials
    assert (trial.state, trial.step) == (TrialState.COMPLETED, 3), trial.error
    assert trial.error is not None and trial.error.startswith("after its last step: hung: no report for "), trial.error
    assert "trial 0 completed at step 3, accuracy 0.3 (after its last step: hung: " in result.stdout
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.1), (2, 0.2), (3, 0.3)]}


# ---------------------------------------------------------------------- 4. slow to exit after its suspension
LINGERS = """
import json, threading, time
from hermes import trial
state = {"step": 0}
saver = trial.Files(lambda d: (d / "s.json").write_text(json.dumps(state)),
                    lambda d: state.update(json.loads((d / "s.json").read_text())))
start = saver.restore()
done = threading.Event()
threading.Thread(target=done.wait).start()  # a metrics-upload thread, no daemon: the process lingers at its exit
for step in range(start + 1, trial.budget() + 1):
    time.sleep(0.15)
    state["step"] = step
    trial.report(step, accuracy=step / 10)
done.set()  # only at its end: suspended (report raises SuspendExit), the process lingers
"""


def command_spec(tmp_path: Path, name: str, program: str, steps: int, seeds: int, policy: dict[str, Any],
                 **trial: Any) -> Path:
    """A spec of ``program``, a command that reports through hermes.trial, run with each of ``seeds`` seeds on one CPU
    slot, checkpointed at every step."""
    (tmp_path / "program.py").write_text(program)
    return write_spec(tmp_path, spec_of(
        name,
        trial={"command": f"{sys.executable} program.py {{seed}}", "workdir": str(tmp_path), **trial},
        search={"sampler": "grid", "space": {"seed": {"type": "grid", "values": list(range(seeds))}}},
        metric={"name": "accuracy", "mode": "max"},
        budget={"steps": steps},
        policy=policy,
        resources={"gpus": "none", "cpu_slots": 1},
        storage={"dir": "runs", "checkpoint_every": 1},
    ))


def test_a_trial_that_lingers_after_committing_its_suspension_is_killed_and_counted_suspended(tmp_path: Path) -> None:
    """Before, the first such trial failed for good (hung: no report for ...) though its checkpoint was committed."""
    run_ok(command_spec(tmp_path, "linger", LINGERS, 4, 2, {"name": "rr", "period": 0.3},  # 4 steps: 2 turns at least
                        stall={"factor": 2, "min": 2, "after": 3}))  # room for a slow commit of its suspension
    view, decisions = load_view(tmp_path / "runs")
    assert any(isinstance(decision, Suspend) for decision in decisions)
    assert [(trial.state, trial.step, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, 4, None)] * 2
    assert values_of(tmp_path / "runs") == {trial: [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)] for trial in ("0", "1")}


def test_the_watchdog_gives_a_trial_that_committed_its_suspension_a_bounded_time_to_exit() -> None:
    """Without a step time and without trial.stall.after, a lingering process held its slot for ever."""
    watchdog = Watchdog(TrialLimits())
    watchdog.started("t", 0.0)
    watchdog.reported("t", 1.0)  # one report in this run: no step time yet, so no stall limit applies
    assert watchdog.deadline() is None
    watchdog.exiting("t", 2.0)
    assert watchdog.deadline() == 2.0 + EXIT_GRACE
    assert watchdog.overdue(1.0 + EXIT_GRACE) == []
    reason = f"it did not exit within {EXIT_GRACE:g}s of committing its suspension"
    assert watchdog.overdue(2.0 + EXIT_GRACE) == [("t", reason)]


# ---------------------------------------------------------------------- 5. reports without a channel of their own
FORKS = """
import multiprocessing
from hermes import trial

def evaluate(step):
    trial.report(step, accuracy=step / 10)

trial.report(1, accuracy=0.1)  # commits checkpoint 1 (checkpoint_every 1)
child = multiprocessing.get_context("fork").Process(target=evaluate, args=(2,))
child.start()
child.join()
print("child exit code", child.exitcode, flush=True)
for step in (2, 3):
    trial.report(step, accuracy=step / 10)
"""


def test_a_report_from_a_forked_child_fails_at_once_and_the_trial_goes_on(tmp_path: Path) -> None:
    """Before, the child hung for ever in the checkpoint's fsyncs (a thread pool its parent made), and its trial
    with it."""
    run_ok(command_spec(tmp_path, "forks", FORKS, 3, 1, {"name": "fifo"}, stall={"after": 10}))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.1), (2, 0.2), (3, 0.3)]}
    directory = trial_dir(tmp_path / "runs", {"name": "forks"}, "0")
    assert "child exit code 1" in (directory / "stdout.log").read_text()
    assert ("HermesError: trial 0: report() was called in a process forked from the trial's (pid "
            in (directory / "stderr.log").read_text())


PAST_ITS_BUDGET = "from hermes import trial\ntrial.report(50, accuracy=0.5)\n"


def test_an_unmodified_program_that_reports_past_its_budget_is_told_it_has_no_channel(tmp_path: Path) -> None:
    """Before, it was told its first report was past budget.steps, as if it could report."""
    path = program_spec(tmp_path, "nochannel", PAST_ITS_BUDGET, r"it (?P<step>\d+) loss (?P<accuracy>\S+)", 20)
    hermes("run", str(path), "--no-live", cwd=tmp_path)
    view, _ = load_view(tmp_path / "runs")
    [trial] = view.trials
    assert trial.state is TrialState.FAILED
    assert "HermesError: hermes.trial cannot report: this process has no channel to the scheduler" in trial.error
    assert "past budget.steps" not in trial.error


# ---------------------------------------------------------------------- 6. the GPU timeline's end of a run
SILENT_OR_NOT = ("import sys\n"
                 "if sys.argv[1] == 'silent':\n"
                 "    print('training... (no metric line: a typo in the pattern, say)')\n"
                 "else:\n"
                 "    print('epoch 1 accuracy 0.1')\n")


def test_a_run_that_ended_without_a_report_ends_failed_on_the_gpu_timeline(tmp_path: Path) -> None:
    """Before, its exit with code 0 was drawn as a completed run, though the trial failed."""
    path = program_spec(tmp_path, "silent", SILENT_OR_NOT, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 1,
                        space={"kind": ["silent", "ok"]})
    hermes("run", str(path), "--no-live", cwd=tmp_path)
    store = open_store(tmp_path / "runs")
    try:
        experiment = pick_experiment(store, None)
        states = {trial.params["kind"]: trial.state for trial in store.trials(experiment.experiment_id)}
        trial_kinds = {trial.trial_id: trial.params["kind"] for trial in store.trials(experiment.experiment_id)}
        ends = {trial_kinds[run.trial_id]: run.ended_by for run in store.runs(experiment.experiment_id)}
    finally:
        store.close()
    assert states == {"silent": TrialState.FAILED, "ok": TrialState.COMPLETED}
    assert ends == {"silent": "failed", "ok": "completed"}


# ---------------------------------------------------------------------- a child that outlives the program
LEFT_CHILD = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])  # a logger, a loader worker\n"
              "for epoch in range(1, 6):  # a bar redrawn with \\r to the end, never ended by a newline\n"
              "    sys.stdout.write(f'\\rtrain {epoch}/5 epoch={epoch}, accuracy={0.1 * epoch:.3f}')\n"
              "    sys.stdout.flush()\n"
              "    time.sleep(0.05)\n")


def test_a_program_whose_child_outlives_it_reports_its_last_lines(tmp_path: Path) -> None:
    """The child, killed with its group but not gone yet, held the pipes open when the program's exit was collected:
    the bar's step before the last, held until its line moved on, and its last, not ended by a newline, were never
    read (the trial completed at step 3 of 5)."""
    path = program_spec(tmp_path, "child", LEFT_CHILD, r"epoch=(?P<step>\d+), accuracy=(?P<accuracy>\d+\.\d+)", 5)
    run_ok(path)
    assert values_of(tmp_path / "runs") == {"0": [(step, round(0.1 * step, 3)) for step in range(1, 6)]}
