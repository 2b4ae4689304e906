"""What a runner killed with SIGKILL leaves behind: nothing, not even its trials' own children.

A trial's process (or warm worker) dies with the runner; the processes the trial started (a data
loader's workers, ``torchrun``'s ranks) did not, and went on holding their GPU while a restarted
runner resumed the trial. Real runner, real trials, real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.test_local_executor import alive
from tests.test_run import RUN_TIMEOUT, environment, hermes_command, wait_for, write_spec

SPAWNER = '''
import subprocess, sys, time
from hermes import trial

def train(config):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             start_new_session=config["own_session"])  # as torchrun starts its ranks
    (trial.trial_dir() / "child.pid").write_text(str(child.pid))
    for step in range(1, 100):
        time.sleep(0.2)
        trial.report(step=step, score=step)
'''


@pytest.mark.parametrize("own_session", [False, True], ids=["in-its-group", "in-a-session-of-its-own"])
@pytest.mark.parametrize("warm", [True, False], ids=["warm-worker", "process-per-run"])
def test_a_trials_children_die_with_a_runner_killed_by_sigkill(tmp_path: Path, warm: bool, own_session: bool) -> None:
    """A child in a session of its own (torchrun's ranks) is out of every group the guard kills: it is found by
    the run's tag in its environment."""
    (tmp_path / "spawner.py").write_text(SPAWNER)
    spec = {
        "name": "orphans",
        "trial": {"function": "spawner:train", "workdir": str(tmp_path), "warm_workers": warm},
        "search": {"sampler": "random", "trials": 1, "seed": 0,
                   "space": {"own_session": {"type": "choice", "values": [own_session]}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 99},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
    }
    path = write_spec(tmp_path, spec)
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = tmp_path / "runs" / "orphans" / "trials" / "0" / "child.pid"
    child = None
    try:
        wait_for(lambda: marker.exists() and marker.read_text(), RUN_TIMEOUT, "the trial to start its child")
        child = int(marker.read_text())
        assert alive(child)
        runner.kill()
        runner.wait()
        wait_for(lambda: not alive(child), 10, "the trial's child to die with the runner")
    finally:
        if runner.poll() is None:
            runner.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
