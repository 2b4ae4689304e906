"""A runner that was stopped (Ctrl-Z, Slurm's ``scontrol suspend``, a frozen cgroup) goes on where it was: no trial is
failed as hung for the time it, or its runner, was stopped, nor while it waited for its runner's answer.

Each test stops something for longer than its trials' stall limit, set low in the spec; the watchdog took that time
for their silence and failed every running trial at once, losing the experiment's work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.core.states import TrialState
from tests.test_run import (
    TESTS,
    count_rows,
    environment,
    hermes_command,
    load_view,
    search,
    spec_of,
    wait_for,
    write_spec,
)

STALL = {"factor": 5, "min": "1.5s"}  # steps of 0.1 s: no healthy trial is silent for 1.5 s
PAUSE = 3.0  # seconds stopped: past the stall limit, and past what the runner may miss (PAUSE_MARGIN)


def descendants(root: int) -> list[int]:
    """The processes started by ``root``, at any depth (a trial in a session of its own too)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


@pytest.mark.timeout(60)
def test_a_job_stopped_whole_goes_on_and_its_trials_complete(tmp_path: Path) -> None:
    """SIGSTOP to the runner and every process under it, as a suspended Slurm job: on SIGCONT every trial failed
    with ``hung: no report for 1.5s``, the run exited 1 ("every trial failed"), and a rerun ran none of them again."""
    spec = spec_of(
        "paused-job",
        trial={"function": "trials.curve:train", "workdir": str(TESTS), "stall": STALL},
        search=search(2, 0, 0.1),
        budget={"steps": 15},
        policy={"name": "fifo"},
    )
    path = write_spec(tmp_path, spec)
    database = tmp_path / "runs" / "hermes.db"
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:  # both trials stepped twice: a stall limit holds them
        wait_for(lambda: count_rows(database, "SELECT count(*) FROM (SELECT trial_id FROM metrics GROUP BY trial_id "
                                              "HAVING count(*) >= 2)") == 2, 45, "two reports of each trial")
        job = [runner.pid, *descendants(runner.pid)]
        for pid in job:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(PAUSE)
        for pid in job:  # the runner first: it would judge its trials before they could say a word
            os.kill(pid, signal.SIGCONT)
        _, stderr = runner.communicate(timeout=45)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 0, stderr
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error, trial.step) for trial in view.trials] == [(TrialState.COMPLETED, None, 15)] * 2


# A runner of one trial on the real local executor, without the core: it answers every report "continue", but one, which
# it answers only PAUSE seconds later: stopped meanwhile (SIGSTOP to itself, as Ctrl-Z while it decides), or awake (a
# Ray node's agent whose driver was stopped: it waits for its answer). It prints how the trial ended.
RUNNER = """
import json, os, signal, subprocess, sys, threading, time
from hermes.core.decisions import Start
from hermes.core.events import TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.watchdog import TrialLimits

how, pause, tests = sys.argv[1], float(sys.argv[2]), sys.argv[3]
executor = LocalExecutor("run", slots=local_slots(cpu_slots=1), metric="score", cwd=tests,
                         limits=TrialLimits(stall_factor=5.0, stall_min=1.5))
executor.submit("t", TrialLaunch(15, function="trials.curve:train", config={"sleep": 0.1}))
executor.apply(Start("t", next(iter(executor.slots))), executor.now())
held, ended = None, None
while ended is None:
    events = executor.next_events()
    if held is not None and time.monotonic() >= held[1]:
        executor.settled(held[0])
        held = None
    for event in events:
        if isinstance(event, TrialExited):
            ended = event
        elif isinstance(event, TrialReported) and event.step == 3:
            if how == "stopped":
                subprocess.Popen(["sh", "-c", f"sleep {pause}; kill -CONT {os.getpid()}"])
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                held = (event, time.monotonic() + pause)
                threading.Timer(pause, executor.wake).start()
                continue
        executor.settled(event)
executor.close()
print(json.dumps({"succeeded": ended.succeeded, "error": ended.error}))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["stopped", "awake"])
def test_a_trial_waiting_for_its_runners_answer_is_not_hung(tmp_path: Path, how: str) -> None:
    """Stopped as it decided about a report (Ctrl-Z of ``hermes run`` then ``fg``), the runner answered on SIGCONT and
    failed at once the trial it had just answered, as silent since that report; a runner that waits for the answer
    (a Ray node's agent, its driver stopped) failed it while it waited."""
    ran = subprocess.run([sys.executable, "-c", RUNNER, how, str(PAUSE), str(TESTS)], check=False, cwd=tmp_path,
                         env=environment(), capture_output=True, text=True, timeout=45, start_new_session=True)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1]) == {"succeeded": True, "error": None}


BUSY_STOPPER = """
import time

from hermes.core.policy import EarlyStopper


class Slow(EarlyStopper):
    def should_stop(self, trial):
        time.sleep(1.1)  # a heavy stopper, a slow commit: the runner busy, not stopped
        return False
"""

HANGS = """
import sys
import time

hang = int(sys.argv[1])
for step in range(1, 6):
    if hang and step == 2:
        time.sleep(100000)
    time.sleep(1.3)  # longer than the stopper's second: the runner keeps up, busy most of the time
    print(f"epoch {step} accuracy {step / 1000:.4f}", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_busy_runner_is_no_pause_and_a_hung_trial_beside_a_healthy_one_fails_in_time(tmp_path: Path) -> None:
    """A runner busy for over a second at each report (a stopper that takes 1.1 s) was taken for a paused one: the
    hung trial's silence grew by 0.2 s a report, and it failed only once the healthy one had ended."""
    (tmp_path / "slow.py").write_text(BUSY_STOPPER)
    (tmp_path / "hangs.py").write_text(HANGS)
    spec = spec_of("busy", trial={"command": "python hangs.py {hang}", "workdir": str(tmp_path),
                                  "metrics_regex": r"epoch (?P<step>\d+) accuracy (?P<value>\S+)",
                                  "stall": {"after": "2s", "factor": 0}},
                   search={"sampler": "grid", "space": {"hang": {"type": "grid", "values": [1, 0]}}},
                   metric={"name": "accuracy", "mode": "max"}, budget={"steps": 5},
                   policy={"name": "fifo", "stopper": {"name": "slow:Slow"}},
                   resources={"gpus": "none", "cpu_slots": 2}, storage={"dir": "runs"})
    ran = subprocess.run(hermes_command("run", str(write_spec(tmp_path, spec)), "--no-live"), cwd=tmp_path, check=False,
                         env=environment(), capture_output=True, text=True, timeout=50)
    lines = [line for line in ran.stdout.splitlines() if line.startswith("[") and (" failed " in line or " completed " in line)]
    assert [("hung" in line, "completed" in line) for line in lines] == [(True, False), (False, True)], ran.stdout
