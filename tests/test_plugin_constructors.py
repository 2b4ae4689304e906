"""A policy or stopper of one's own whose constructor raises (it reads a file that is missing): `hermes run` and
`hermes simulate` printed a traceback of 15 to 34 lines and exited 1, where a failing ``configure()`` is one line,
exit 2. Now the constructor's failure is one line naming the field or option, exit 2; a wrong parameter still says
what Python says of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hermes.cli import main
from hermes.errors import SpecError
from hermes.experiment import parse_spec

ROOT = Path(__file__).resolve().parent.parent
DIGITS = str(ROOT / "data" / "digits_mlp.csv")
MODULE = "constructor_reads_a_file"  # a name no other test imports, since a module is imported once
PLUGINS = '''
import json

from hermes.core.policy import EarlyStopper, SchedulingPolicy


class PriorFromFile(SchedulingPolicy):
    def __init__(self, period: float = 60.0, prior: str = "prior.json"):
        super().__init__(period)
        with open(prior) as f:
            self.prior = json.load(f)

    def priority(self, trial, now):
        return 0.0


class ThresholdsFromFile(EarlyStopper):
    def __init__(self, table: str = "thresholds.json"):
        with open(table) as f:
            self.table = json.load(f)

    def should_stop(self, trial):
        return False
'''
POLICY_RAISED = "PriorFromFile.__init__() raised FileNotFoundError: [Errno 2] No such file or directory: 'prior.json'"
STOPPER_RAISED = ("ThresholdsFromFile.__init__() raised FileNotFoundError: [Errno 2] No such file or directory: "
                  "'thresholds.json'")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plug-ins' module in the current folder, where `hermes simulate` and a spec's trial workdir find it."""
    (tmp_path / f"{MODULE}.py").write_text(PLUGINS)
    (tmp_path / "toy.py").write_text("def train(config):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        sys.modules.pop(MODULE, None)


def spec(policy: dict[str, object]) -> dict[str, object]:
    return {
        "name": "constructors",
        "trial": {"function": "toy:train", "workdir": "."},
        "search": {"sampler": "random", "trials": 1, "space": {"lr": {"type": "uniform", "low": 0.1, "high": 1.0}}},
        "metric": {"name": "accuracy", "mode": "max"},
        "budget": {"steps": 1},
        "policy": policy,
        "resources": {"gpus": "none", "cpu_slots": 1},
    }


def test_hermes_run_says_in_one_line_that_the_policys_constructor_raised(plugins: Path) -> None:
    (plugins / "spec.yaml").write_text(yaml.safe_dump(spec({"name": f"{MODULE}:PriorFromFile"})))
    ran = subprocess.run([sys.executable, "-m", "hermes.cli", "run", "--no-live", "spec.yaml"], cwd=plugins,
                         capture_output=True, text=True, check=False, timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr == f"hermes: error: spec.yaml: policy.params: policy {MODULE}:PriorFromFile: {POLICY_RAISED}\n"


def test_a_spec_names_the_stoppers_constructor_and_still_says_what_a_wrong_parameter_is(plugins: Path) -> None:
    stopper = spec({"name": "fifo", "stopper": {"name": f"{MODULE}:ThresholdsFromFile"}})
    with pytest.raises(SpecError) as raised:
        parse_spec(stopper, base_dir=plugins, plugins_beside_trial=True)
    assert f"policy.stopper.params: stopper {MODULE}:ThresholdsFromFile: {STOPPER_RAISED}" in str(raised.value)
    wrong = spec({"name": f"{MODULE}:PriorFromFile", "params": {"priors": "p.json"}})
    with pytest.raises(SpecError) as raised:
        parse_spec(wrong, base_dir=plugins, plugins_beside_trial=True)
    assert "PriorFromFile.__init__() got an unexpected keyword argument 'priors'" in str(raised.value)


@pytest.mark.parametrize(("options", "said"), [
    (["--policy", f"{MODULE}:PriorFromFile"], f"--policy {MODULE}:PriorFromFile: {POLICY_RAISED}"),
    (["--compare", f"fifo,{MODULE}:PriorFromFile", "--seeds", "1"],
     f"--compare 'fifo,{MODULE}:PriorFromFile': {POLICY_RAISED}"),
    (["--policy", "fifo", "--stopper", f"{MODULE}:ThresholdsFromFile"],
     f"--stopper {MODULE}:ThresholdsFromFile: {STOPPER_RAISED}"),
])
def test_hermes_simulate_says_in_one_line_which_constructor_raised(
    plugins: Path, capsys: pytest.CaptureFixture[str], options: list[str], said: str,
) -> None:
    assert main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", *options]) == 2
    assert capsys.readouterr().err == f"hermes: error: {said}\n"
