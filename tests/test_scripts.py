"""End-to-end tests of command trials: unmodified programs read with ``trial.metrics_regex``, and commands that use
``hermes.trial`` through a wrapper. Real ``hermes run``, real processes, the real store (helpers of test_run.py);
each program is a few lines written into the test's directory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.core.decisions import Suspend
from hermes.core.states import TrialState
from hermes.local.launchers.process import NUMBER
from tests.test_local_executor import alive
from tests.test_run import hermes, load_view, run_ok, spec_of, trial_dir, write_spec


def program_spec(tmp_path: Path, name: str, program: str, pattern: str | None, steps: int,
                 space: dict[str, Any] | None = None, **trial: Any) -> Path:
    """A spec of ``program`` (written to ``program.py``, run with ``{param}`` arguments in ``space``'s order) on
    one CPU slot, its objective ``accuracy`` read with ``pattern`` (None: a command that uses hermes.trial)."""
    (tmp_path / "program.py").write_text(program)
    space = space or {"seed": [0]}
    arguments = " ".join(f"{{{param}}}" for param in space)
    section = {"command": f"{sys.executable} program.py {arguments}", "workdir": str(tmp_path), **trial}
    if pattern is not None:
        section["metrics_regex"] = pattern
    spec = spec_of(
        name,
        trial=section,
        search={"sampler": "grid", "space": {param: {"type": "grid", "values": values}
                                             for param, values in space.items()}},
        metric={"name": "accuracy", "mode": "max"},
        budget={"steps": steps},
        policy={"name": "fifo"},
        resources={"gpus": "none", "cpu_slots": 1},
    )
    return write_spec(tmp_path, spec)


def values_of(storage: Path) -> dict[str, list[tuple[int, float]]]:
    view, _ = load_view(storage)
    found: dict[str, list[tuple[int, float]]] = {}
    for record in view.metrics:
        found.setdefault(record.trial_id, []).append((record.step, record.values["accuracy"]))
    return found


# ---------------------------------------------------------------------- 1. lines redrawn with \r
KERAS = r"""
import sys, time
for epoch in range(1, 4):  # Keras fit(verbose=1): each epoch's line is redrawn with \r after every batch
    print(f"Epoch {epoch}/3")
    for batch in range(1, 6):
        accuracy = epoch * 0.1 + batch * 0.01
        sys.stdout.write(f"\r{batch}/5 [{'=' * batch}{'.' * (5 - batch)}] - loss: {1 - accuracy:.4f} - "
                         f"accuracy: {accuracy:.4f}")
        sys.stdout.flush()
        time.sleep(0.01)
    sys.stdout.write("\n")
"""


def test_a_line_redrawn_with_carriage_returns_reports_its_last_segment(tmp_path: Path) -> None:
    """Keras' progress line: recorded with its first batch's numbers (0.11, 0.21, 0.31) before, not its last."""
    path = program_spec(tmp_path, "keras", KERAS, r"loss: (?P<loss>[\d.]+) - accuracy: (?P<accuracy>[\d.]+)", 3)
    run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.15), (2, 0.25), (3, 0.35)]}


BAR = r"""
import sys, time
step = 0
while True:  # a tqdm bar on stderr, never ended by \n: redrawn a few times a step, its postfix updated
    step += 1
    for redraw in range(3):
        sys.stderr.write(f"\r{step}/1000 [{'#' * (step % 10):10}] acc={step / 10 + redraw / 100:.2f}")
        sys.stderr.flush()
        time.sleep(0.02)
"""


def test_a_bar_that_never_prints_a_newline_reports_each_step_as_it_goes(tmp_path: Path) -> None:
    """Before, its output was one line that never ended: no report until it exited, and it never does (it trains
    past its budget), so it ran into its trial.timeout. Now each step reports its last redraw once the next step
    shows, and the first step past the budget stops it, completed."""
    path = program_spec(tmp_path, "bar", BAR, r"(?P<step>\d+)/1000 .* acc=(?P<accuracy>[\d.]+)", 3, timeout=20)
    run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.12), (2, 0.22), (3, 0.32)]}


# ---------------------------------------------------------------------- 2. the objective named twice
def test_a_pattern_with_both_a_value_group_and_the_metrics_group_is_refused(tmp_path: Path) -> None:
    """The launcher ranked on ``value`` and the reports on the metric's name: now the spec names one."""
    path = program_spec(tmp_path, "both", "print('epoch 1 accuracy 0.5 value 0.1')\n",
                        r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+) value (?P<value>\S+)", 1)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert ("trial.metrics_regex: has both (?P<value>...) and (?P<accuracy>...): name the objective once"
            in result.stderr), result.stderr
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------- 3. failures of programs that log
LOGGING_CRASH = r"""
import logging
logging.basicConfig(level=logging.INFO)  # to stderr
for epoch in range(1, 3):
    for batch in range(30):
        logging.info("batch %d loss %.3f", batch, 1.0 / (batch + 1))
    logging.info("epoch %d accuracy %.2f", epoch, 0.1 * epoch)
raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


def test_a_failure_summary_shows_the_exception_not_the_first_line_the_program_logged(tmp_path: Path) -> None:
    """Before: ``exit code 1: INFO:root:batch 3 loss 0.250 ... (its runs c...``. The JSON keeps the whole error."""
    path = program_spec(tmp_path, "logged", LOGGING_CRASH, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 5,
                        max_failures=1)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    summary = "exit code 1 ... RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB, at program.py:8"
    assert f"trial 0 crashed ({summary}); crash 1 of trial.max_failures 1" in result.stdout, result.stdout
    assert f"trial 0 failed at step 2, accuracy 0.2 ({summary} (crashed 2 times))" in result.stdout, result.stdout
    assert f"hermes: error: every trial failed; trial 0: {summary} (crashed 2 times)\n" in result.stderr
    status = hermes("status", "runs", cwd=tmp_path)
    assert f"trial 0 (failed at step 2): {summary} (crashed 2 times)" in status.stdout, status.stdout
    results = hermes("results", "runs", "--format", "json", cwd=tmp_path)
    [entry] = json.loads(results.stdout)
    assert entry["error"].startswith("exit code 1: INFO:root:batch")
    assert entry["error"].endswith("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                                   "(its runs crashed 2 times; trial.max_failures is 1)")


# ---------------------------------------------------------------------- 4. hermes.trial in an unmodified program
READS_ITS_CONFIG = r"""
import sys
from hermes import trial
lr = trial.config()["lr"]  # its parameters, budget and directory, though its metrics are printed
(trial.trial_dir() / "seen.txt").write_text(f"{trial.trial_id()} {trial.budget()}")
for epoch in range(1, trial.budget() + 1):
    if sys.argv[2] == "report":
        trial.report(epoch, accuracy=lr * epoch)
    print(f"epoch {epoch} accuracy {lr * epoch:.2f}")
"""


def test_an_unmodified_program_reads_its_config_through_hermes_trial_and_is_told_it_cannot_report(
    tmp_path: Path,
) -> None:
    """Before, ``trial.config()`` failed: "hermes.trial needs 'HERMES_CHANNEL' from a Hermes executor"."""
    path = program_spec(tmp_path, "config", READS_ITS_CONFIG, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 3,
                        space={"lr": [0.1], "how": ["print", "report"]})
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    view, _ = load_view(tmp_path / "runs")
    by_how = {trial.params["how"]: trial for trial in view.trials}
    printed, reported = by_how["print"], by_how["report"]
    assert printed.state is TrialState.COMPLETED and printed.error is None
    assert values_of(tmp_path / "runs")[printed.trial_id] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    spec = {"name": "config"}
    assert (trial_dir(tmp_path / "runs", spec, printed.trial_id) / "seen.txt").read_text() == f"{printed.trial_id} 3"
    assert reported.state is TrialState.FAILED
    assert "HermesError: hermes.trial cannot report: this process has no channel to the scheduler" in reported.error
    assert "drop trial.metrics_regex to report through hermes.trial" in reported.error


# ---------------------------------------------------------------------- 5. a wrapper that runs the training script
TRAIN = """
from hermes import trial
for step in range(1, trial.budget() + 1):
    trial.report(step, accuracy=trial.config()["lr"] * step)
"""
WRAPPER = """
import os, subprocess, sys  # a launcher script that runs the real training script, as many projects have
channel = tuple(int(fd) for fd in os.environ["HERMES_CHANNEL"].split(","))
passed = channel if sys.argv[2] == "pass_fds" else ()
sys.exit(subprocess.run([sys.executable, "train.py"], pass_fds=passed).returncode)
"""


def test_a_wrapper_that_closes_the_channel_fails_saying_to_pass_it_on(tmp_path: Path) -> None:
    """Before: ``OSError: [Errno 9] Bad file descriptor``. The advice given works."""
    (tmp_path / "train.py").write_text(TRAIN)
    path = program_spec(tmp_path, "wrapper", WRAPPER, None, 2, space={"lr": [0.1], "how": ["pass_fds", "closed"]})
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    view, _ = load_view(tmp_path / "runs")
    by_how = {trial.params["how"]: trial for trial in view.trials}
    assert by_how["pass_fds"].state is TrialState.COMPLETED
    assert values_of(tmp_path / "runs")[by_how["pass_fds"].trial_id] == [(1, 0.1), (2, 0.2)]
    closed = by_how["closed"]
    assert closed.state is TrialState.FAILED
    assert "HermesError: hermes.trial's channel, descriptors " in closed.error, closed.error
    assert "was not inherited by this process: a program that runs this script must pass them on " in closed.error
    assert "Bad file descriptor" not in closed.error


# ---------------------------------------------------------------------- 6. steps from 0
def test_a_program_whose_lines_are_all_of_step_0_is_told_steps_count_from_1(tmp_path: Path) -> None:
    """Before, it was told it needs a trial.metrics_regex that matches its lines, which it had."""
    program = "for epoch in range(1):\n    print(f'epoch {epoch} accuracy 0.93')\n"
    path = program_spec(tmp_path, "zero", program, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 1)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    error = ("ended without a report: lines matched trial.metrics_regex, but its group 'step' read '0' in the line "
             "'epoch 0 accuracy 0.93': steps count from 1, as budget.steps does (print epoch + 1)")
    assert result.returncode == 1 and f"hermes: error: every trial failed; trial 0: {error}\n" in result.stderr, (
        result.stderr)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, error)]


def test_a_program_whose_first_step_is_past_the_budget_is_told_its_steps_are_iterations(tmp_path: Path) -> None:
    """Before, it failed saying no line matched trial.metrics_regex, which every line did."""
    program = "for iteration in range(100, 301, 100):\n    print(f'iter {iteration} accuracy 0.93', flush=True)\n"
    path = program_spec(tmp_path, "iters", program, r"iter (?P<step>\d+) accuracy (?P<accuracy>\S+)", 3)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    error = "its first report was step 100, past budget.steps 3: steps count up to the budget (epochs, say), not iterations"
    assert result.returncode == 1 and f"hermes: error: every trial failed; trial 0: {error}\n" in result.stderr, (
        result.stderr)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, error)]


# ---------------------------------------------------------------------- 6b. a crash after the last step
def test_a_program_that_crashes_after_its_last_step_completes_and_runs_once(tmp_path: Path) -> None:
    """A CUDA or NCCL teardown that fails after the last epoch: the trial trained its budget, so it is completed.
    Before, it ran twice more from its beginning and failed; a crash before the last step still runs it again,
    and says that the program starts over."""
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "with open('starts.txt', 'a') as starts:\n"
        "    starts.write(sys.argv[1] + '\\n')\n"
        "last = int(sys.argv[1]) if len(Path('starts.txt').read_text().split()) == 1 else 3\n"
        "for epoch in range(1, last + 1):\n"
        "    print(f'epoch {epoch} accuracy {epoch / 10}')\n"
        "sys.exit('teardown failed')\n"
    )
    path = program_spec(tmp_path, "teardown", program, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 3,
                        space={"crash_at": [2]}, max_failures=2)
    result = run_ok(path)
    assert "trial 0 crashed (exit code 1: teardown failed); crash 1 of trial.max_failures 2, it starts again from " \
           "its beginning, catching up to step 2" in result.stdout, result.stdout
    assert result.stdout.count(" crashed (") == 1
    assert (tmp_path / "starts.txt").read_text().split() == ["2", "2"]  # run again once, not twice more
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.step) for trial in view.trials] == [(TrialState.COMPLETED, 3)]
    assert view.trials[0].error == "after its last step: exit code 1: teardown failed"
    assert "trial 0 completed at step 3, accuracy 0.3 (after its last step: exit code 1: teardown failed)" in \
           result.stdout
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.1), (2, 0.2), (3, 0.3)]}
    assert ", 1 run again after a crash\n" in hermes("status", "runs", cwd=tmp_path).stdout  # the first, not the last


# ---------------------------------------------------------------------- 7. processes that leave the trial's group
RANKS = r"""
import subprocess, sys
from pathlib import Path
RANK = '''
import os, sys, time
from pathlib import Path
Path(f"rank-{sys.argv[1]}.pid").write_text(str(os.getpid()))
for step in range(1, 7):
    time.sleep(0.15)
    print(f"step {step} accuracy {step / 10 + float(sys.argv[1])}", flush=True)
'''
# as torchrun starts its ranks: each in a session of its own, outside the trial's process group
sys.exit(subprocess.Popen([sys.executable, "-c", RANK, sys.argv[1]], start_new_session=True).wait())
"""


def test_a_program_whose_work_runs_in_a_session_of_its_own_is_suspended_and_ended_with_it(tmp_path: Path) -> None:
    """torchrun starts each rank with ``start_new_session``: SIGSTOP of the trial's group missed it, its report came
    while the trial was suspended and ended the whole run ("trial 0 reported while suspended", at every rerun),
    and kills missed it too (it ran on, at 80% of a CPU, after the run)."""
    path = program_spec(tmp_path, "ranks", RANKS, r"step (?P<step>\d+) accuracy (?P<accuracy>\S+)", 6,
                        space={"rank": [0, 1]})
    spec = yaml.safe_load(path.read_text())
    spec["policy"] = {"name": "rr", "period": 0.3}  # each is suspended several times
    write_spec(tmp_path, spec)
    result = run_ok(path)
    view, decisions = load_view(tmp_path / "runs")
    assert sum(isinstance(decision, Suspend) for decision in decisions) >= 2, decisions
    values = values_of(tmp_path / "runs")
    for trial in view.trials:
        rank = trial.params["rank"]
        assert trial.state is TrialState.COMPLETED, result.stdout
        assert values[trial.trial_id] == [(step, pytest.approx(step / 10 + rank)) for step in range(1, 7)]
    for pid_file in tmp_path.glob("rank-*.pid"):
        assert not alive(int(pid_file.read_text())), "a rank outlived its trial"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="CPU slots are pinned only with a core each")
def test_every_process_of_a_pinned_slot_starts_on_its_cores(tmp_path: Path) -> None:
    """The slot's cores were set from the runner once the program had started: a child started at once (a shell's
    command) sometimes ran on every core (1 or 2 in 30)."""
    path = program_spec(tmp_path, "pinned", "", r"step (?P<step>\d+) accuracy (?P<accuracy>\S+)", 1,
                        space={"i": list(range(30))})
    spec = yaml.safe_load(path.read_text())
    spec["trial"]["command"] = "sh -c 'grep Cpus_allowed_list /proc/self/status; echo step 1 accuracy 0.{i}'"
    spec["resources"] = {"gpus": "none", "cpu_slots": 2}
    write_spec(tmp_path, spec)
    run_ok(path)
    lines = [line for log in (tmp_path / "runs" / "pinned" / "trials").glob("*/stdout.log")
             for line in log.read_text().splitlines() if line.startswith("Cpus_allowed_list")]
    assert len(lines) == 30
    assert all(line.split()[-1].isdigit() for line in lines), lines  # one core each, never "0-1"


# ---------------------------------------------------------------------- 8. numbers a pattern cuts short
CUT_SHORT = r"""
import sys
print("epoch 1 accuracy 0.50 loss 0.25")
if sys.argv[1] == "exponent":  # Python's own float output for a small loss
    print("epoch 2 accuracy 0.75 loss 9.999999999999977e-11")
else:  # more digits than the group reads
    print("epoch 2 accuracy 0.9512 loss 0.125")
"""


def test_a_group_that_reads_part_of_a_number_fails_the_trial_naming_a_pattern_that_reads_it_whole(
    tmp_path: Path,
) -> None:
    """Before, ``[\\d.]+`` read 9.999999999999977e-11 as 9.999999999999977, and ``\\d\\.\\d\\d`` 0.9512 as 0.95,
    recorded without a word; now the trial fails at that line, its steps before it kept."""
    pattern = r"epoch (?P<step>\d+) accuracy (?P<accuracy>\d\.\d\d).* loss (?P<loss>[\d.]+)"
    path = program_spec(tmp_path, "cut", CUT_SHORT, pattern, 2, space={"how": ["exponent", "digits"]})
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    view, _ = load_view(tmp_path / "runs")
    errors = {trial.params["how"]: (trial.state, trial.error) for trial in view.trials}
    whole = NUMBER
    exponent = ("trial.metrics_regex's group 'loss' read '9.999999999999977' in the line 'epoch 2 accuracy 0.75 "
                f"loss 9.999999999999977e-11', where the number goes on: read it whole, with (?P<loss>{whole})")
    digits = ("trial.metrics_regex's group 'accuracy' read '0.95' in the line 'epoch 2 accuracy 0.9512 loss 0.125', "
              f"where the number goes on: read it whole, with (?P<accuracy>{whole})")
    assert errors == {"exponent": (TrialState.FAILED, exponent), "digits": (TrialState.FAILED, digits)}
    assert values_of(tmp_path / "runs") == {trial.trial_id: [(1, 0.5)] for trial in view.trials}


def test_the_documented_pattern_reads_signs_and_exponents(tmp_path: Path) -> None:
    """docs/trials.md's example pattern read Python's ``1e-05`` as 1 and missed ``-1e-05``."""
    docs = (Path(__file__).parents[1] / "docs" / "trials.md").read_text()
    pattern = docs.split("Example, for `examples/scripts/print_metrics.py`:\n\n```\n")[1].split("\n")[0]
    program = ("for epoch in range(1, 4):\n"
               "    print(f'epoch {epoch} loss {(-1) ** epoch * 10.0 ** (-5 * epoch)} accuracy {1 - 0.1 ** epoch}')\n")
    run_ok(program_spec(tmp_path, "exponents", program, pattern, 3))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert [(record.step, record.values) for record in view.metrics] == [
        (epoch, {"loss": (-1) ** epoch * 10.0 ** (-5 * epoch), "value": 1 - 0.1 ** epoch}) for epoch in (1, 2, 3)]
