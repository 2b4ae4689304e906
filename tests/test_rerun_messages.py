"""Running an experiment that had ended again runs nothing: its failed trials are not run again. After every trial
failed (a trial module that cannot be imported), fixing the module and running the same command said the old error
as if the fixed code had failed, and nothing said that nothing ran. Real runs, real trial processes, a real store."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

import hermes
from tests.test_run import RUN_TIMEOUT, environment, hermes_command

FIXED = '''from hermes import trial


def train(config):
    trial.report(1, loss=config["x"])
'''
BROKEN = f"import a_package_not_installed\n{FIXED}"
ERROR = ("every trial failed; trial 0: its worker died, exit code 1 ... ModuleNotFoundError: No module named "
         "'a_package_not_installed', at fixable_trial.py:1")


def test_a_rerun_of_an_experiment_whose_every_trial_failed_says_that_nothing_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fixable_trial.py").write_text(BROKEN)
    spec = {
        "name": "broken",
        "trial": {"function": "fixable_trial:train", "workdir": ".", "max_failures": 0},
        "search": {"sampler": "list", "configs": [{"x": 0.5}, {"x": 0.25}]},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "storage": {"dir": "runs"},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(hermes_command("run", "exp.yaml", "--no-live"), check=False, cwd=tmp_path,
                              env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)

    first = run()
    assert (first.returncode, first.stderr) == (1, f"hermes: error: {ERROR}\n")  # it ran: the error is the code's
    (tmp_path / "fixable_trial.py").write_text(FIXED)
    note = ("broken had already ended, so nothing ran: this error is its earlier run's, and an ended experiment's "
            "failed trials are not run again; to run changed code, run it as a new experiment ({}), or raise "
            "search.trials to add trials to this one")

    again = run()
    assert again.stdout.startswith("broken: finished (continued)"), again.stdout
    assert (again.returncode, again.stderr) == (
        1, f"hermes: error: {ERROR}\n{note.format('`hermes run exp.yaml --name broken-2`')}\n")

    monkeypatch.chdir(tmp_path)
    result = hermes.run("exp.yaml")
    renamed = "hermes.run(..., name='broken-2')"
    assert result.resumed and result.error == f"{ERROR} ({note.format(renamed)})"
