"""A policy, stopper or searcher of one's own kept beside the trial's code, in ``trial.workdir``, as a Ray Tune or
Optuna user keeps a scheduler beside the training script: ``hermes run`` and ``hermes.run`` find it there, as the
trial's process finds the trial's module, from any current folder and without PYTHONPATH. They failed with
"cannot load beside:LastFirst: ModuleNotFoundError". A pool's spec is still read without that folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.store import SqlStore

TRIALS = Path(__file__).resolve().parent / "trials"
PRINTED = r"step (?P<step>\d+) loss (?P<loss>\S+) score (?P<value>\S+)"
TIMEOUT = 60

# The plug-ins, in a module of the trial's workdir; a name no other test imports, since a module is imported once
PLUGINS = '''
from hermes.core.policy import EarlyStopper, SchedulingPolicy, Verdict
from hermes.search import BaseSearcher


class LastFirst(SchedulingPolicy):
    """Each trial on a slot of its own to its end; the latest waiting one first (FIFO runs the earliest)."""

    time_sharing = False

    def priority(self, trial, now):
        return int(trial.trial_id)

    def observe(self, trial, now):
        return Verdict.CONTINUE


class Never(EarlyStopper):
    def should_stop(self, trial):
        return False


class Rates(BaseSearcher):
    """Proposes the rates 0.1, 0.2, 0.3 in turn."""

    learns = False

    def __init__(self, search, *, max_pending=None):
        super().__init__(max_pending=max_pending)

    def _propose(self, index):
        return {"rate": 0.1 * (index + 1)} if index < 3 else None
'''


def project(root: Path) -> Path:
    """``root/project/spec.yaml``, whose trial runs in ``code`` (relative to the spec's folder), beside its plug-ins."""
    code = root / "project" / "code"
    code.mkdir(parents=True)
    (code / "beside_plugins.py").write_text(PLUGINS)
    spec = {
        "name": "beside",
        "trial": {"command": f"{sys.executable} {TRIALS / 'printer.py'} --steps 2 --rate {{rate}} --sleep 0.01",
                  "metrics_regex": PRINTED, "workdir": "code"},
        "search": {"sampler": "beside_plugins:Rates", "trials": 3,
                   "space": {"rate": {"type": "uniform", "low": 0.05, "high": 0.5}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 2},
        "policy": {"name": "beside_plugins:LastFirst", "stopper": {"name": "beside_plugins:Never"}},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
    }
    path = root / "project" / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def without_pythonpath() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def run_order(storage: Path) -> tuple[list[str], list[float]]:
    """The order the trials started in, and their rates, from the store."""
    store = SqlStore(f"sqlite:///{storage / 'hermes.db'}")
    try:
        (experiment,) = store.experiments()
        starts = [record.decision.trial_id for record in store.decisions(experiment.experiment_id)
                  if type(record.decision).__name__ == "Start"]
        rates = [round(trial.params["rate"], 6) for trial in store.trials(experiment.experiment_id)]
        return starts, rates
    finally:
        store.close()


def test_hermes_run_loads_a_policy_stopper_and_searcher_from_the_trials_workdir(tmp_path: Path) -> None:
    spec = project(tmp_path)
    ran = subprocess.run([sys.executable, "-m", "hermes.cli", "run", "--no-live", str(spec)], cwd=tmp_path,
                         env=without_pythonpath(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    starts, rates = run_order(tmp_path / "project" / "runs")
    # trial 0 takes the slot as it arrives; then the latest waiting first, where FIFO would run 0, 1, 2
    assert starts == ["0", "2", "1"]
    assert rates == [0.1, 0.2, 0.3]  # the searcher's


def test_hermes_run_from_python_loads_them_from_the_trials_workdir(tmp_path: Path) -> None:
    spec = yaml.safe_load(project(tmp_path).read_text())
    spec["trial"]["workdir"] = "project/code"  # a mapping's relative paths start at the current folder
    script = f"import hermes; result = hermes.run({spec!r}); print(result.status)"
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=without_pythonpath(),
                         capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split()[-1] == "finished"
    assert run_order(tmp_path / "runs") == (["0", "2", "1"], [0.1, 0.2, 0.3])


def test_a_pools_spec_is_not_read_with_the_trials_workdir(tmp_path: Path) -> None:
    """``parse_spec`` as a pool reads a stored spec (no ``plugins_beside_trial``): a module in the workdir is not
    imported, and the error says it was looked for on Python's path alone."""
    spec = yaml.safe_load(project(tmp_path).read_text())
    spec["search"]["sampler"] = "random"
    spec["policy"] = {"name": "beside_pool_only:LastFirst"}  # a module this process never imported
    (tmp_path / "project" / "code" / "beside_pool_only.py").write_text(PLUGINS)
    with pytest.raises(SpecError, match=r"No module named 'beside_pool_only' \(a plug-in is imported from Python's "):
        parse_spec(spec, base_dir=tmp_path / "project")
    assert "beside_pool_only" not in sys.modules
    spec["policy"] = {"name": "fifo"}
    assert parse_spec(spec, base_dir=tmp_path / "project").plugins_from is None  # the session builds from the path
    ran_here = parse_spec(spec, base_dir=tmp_path / "project", plugins_beside_trial=True)
    assert ran_here.plugins_from == ran_here.workdir == (tmp_path / "project" / "code").resolve()


def test_a_custom_optuna_sampler_beside_the_trial_is_found_there(tmp_path: Path) -> None:
    """``search.sampler: {optuna: module.Class}`` is a plug-in too: it was imported from Python's path alone."""
    spec = yaml.safe_load(project(tmp_path).read_text())
    spec["search"]["sampler"] = {"optuna": "beside_sampler.Seeded"}
    spec["policy"] = {"name": "fifo"}
    (tmp_path / "project" / "code" / "beside_sampler.py").write_text(
        "import optuna\n\n\nclass Seeded(optuna.samplers.RandomSampler):\n    pass\n")
    (tmp_path / "project" / "spec.yaml").write_text(yaml.safe_dump(spec))
    ran = subprocess.run([sys.executable, "-m", "hermes.cli", "run", "--no-live", str(tmp_path / "project" / "spec.yaml")],
                         cwd=tmp_path, env=without_pythonpath(), capture_output=True, text=True, timeout=TIMEOUT,
                         check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert run_order(tmp_path / "project" / "runs")[0] == ["0", "1", "2"]
    spec["search"]["sampler"] = {"optuna": "beside_nowhere.Seeded"}
    with pytest.raises(SpecError, match=r"beside_nowhere.*looked for in .*code and on Python's path"):
        parse_spec(spec, base_dir=tmp_path / "project", plugins_beside_trial=True)
