"""A trial function's return value, which Hermes does not read (it reads reports): an Optuna-style ``return loss``
failed its trial with the bare "ended without a report", a Ray Tune-style ``return {"loss": ...}`` after reports was
dropped without a word. Now it is said once in the trial's stderr.log, and the failure of a trial that never reported
says what it returned and how to report it. Real ``hermes.run`` scripts, in warm workers and processes of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run import environment

SCRIPT = """
import json, sys
import hermes
from hermes import trial


def train(config):
    if config["kind"] == "optuna":
        return (config["lr"] - 0.3) ** 2
    trial.report(1, loss=1.0)
    if config["kind"] == "ray":
        return {"loss": 0.001}


if __name__ == "__main__":
    spec = {"name": "returns", "trial": {"function": train, "warm_workers": sys.argv[1] == "warm", "max_failures": 2},
            "search": {"sampler": "grid",
                       "space": {"kind": {"type": "grid", "values": ["optuna", "ray", "none"]}, "lr": 0.5}},
            "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1}, "policy": {"name": "fifo"},
            "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": "runs"}}
    result = hermes.run(spec)
    print(json.dumps({t.params["kind"]: [t.state, t.error, (t.directory / "stderr.log").read_text()]
                      for t in result.trials}))
"""

OPTUNA_SAID = ("train returned 0.04000000000000001, which Hermes does not read: report it with "
               "hermes.trial.report(step, loss=value) at each step")


@pytest.mark.parametrize("warmth", ["warm", "cold"])
def test_a_returned_value_is_said_and_names_the_failure_of_a_trial_that_never_reported(
    tmp_path: Path, warmth: str
) -> None:
    (tmp_path / "tune.py").write_text(SCRIPT)
    finished = subprocess.run([sys.executable, "tune.py", warmth], cwd=tmp_path, env=environment(),
                              capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    trials = json.loads(finished.stdout.splitlines()[-1])

    state, error, log = trials["optuna"]
    assert (state, error) == ("failed", f"ended without a report: {OPTUNA_SAID}")
    assert log == f"hermes: {OPTUNA_SAID}\n"  # once: no crash, so not run again for trial.max_failures

    state, error, log = trials["ray"]
    assert (state, error) == ("completed", None)
    assert log == ("hermes: train returned {'loss': 0.001}, which Hermes does not read: report it with "
                   "hermes.trial.report(step, **result) for each result\n")

    assert trials["none"] == ["completed", None, ""]
