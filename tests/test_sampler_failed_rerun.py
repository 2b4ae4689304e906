"""Running again an experiment whose sampler failed it shows it as it ended. Optuna's GridSampler fails once its grid
is done (docs/search.md); the rerun replayed the log into a new sampler, which failed alike, and `hermes run` exited 2
with only that error, hermes.run raised it. Real runs, real trial processes, a real store."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

import hermes
from hermes.search.errors import SamplerFailed
from tests.test_run import RUN_TIMEOUT, environment, hermes_command

TRIAL = '''from hermes import trial


def train(config):
    trial.report(1, loss=config["x"])
'''
FAILED = "search.sampler optuna.samplers.GridSampler failed when told trial "


def spec(trials: int) -> dict:
    return {
        "name": "grid",
        "trial": {"function": "grid_trial:train", "workdir": "."},
        "search": {
            "sampler": {"optuna": "optuna.samplers.GridSampler", "args": {"search_space": {"x": [0.1, 0.5]}}},
            "trials": trials,
            "space": {"x": {"type": "uniform", "low": 0.0, "high": 1.0}},
        },
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "storage": {"dir": "runs"},
    }


def test_a_rerun_of_an_experiment_whose_sampler_failed_shows_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "grid_trial.py").write_text(TRIAL)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec(trials=2)))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(hermes_command("run", "exp.yaml", "--no-live"), check=False, cwd=tmp_path,
                              env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)

    first = run()
    assert first.returncode == 1 and first.stderr.startswith(f"hermes: error: {FAILED}"), first.stderr
    error = first.stderr.removeprefix("hermes: error: ").splitlines()[0]

    again = run()  # as the first run said, with the note that nothing ran
    assert again.stdout.startswith("grid: failed (continued)"), again.stdout
    assert "completed" in again.stdout  # the table of its trials
    assert again.returncode == 1, again.stderr
    assert again.stderr.startswith(f"hermes: error: {error}\ngrid had already ended, so nothing ran: "), again.stderr
    assert "raise search.trials" not in again.stderr  # more trials would ask the sampler past its failure: refused

    monkeypatch.chdir(tmp_path)
    result = hermes.run("exp.yaml")
    assert (result.status, result.resumed) == ("failed", True)
    assert result.error is not None and result.error.startswith(f"{error} (grid had already ended, so nothing ran")
    assert "raise search.trials" not in result.error

    # More trials would ask the sampler again, which cannot follow the log: refused, and the experiment stays failed
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec(trials=4)))
    with pytest.raises(SamplerFailed, match="GridSampler failed"):
        hermes.run("exp.yaml")
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec(trials=2)))
    assert hermes.run("exp.yaml").status == "failed"
