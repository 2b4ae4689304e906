"""What a trial's modules see in ``sys.argv`` at their import: the command line of the script whose ``hermes.run``
drives the experiment, whatever module the trial imports (argparse at a script's or a settings module's top level is
common), its file absolute; else the trial module's own file; never the warm worker's or the runner's arguments (a
strict ``parse_args`` failed every trial on them, a lenient one trained each with the defaults). Real ``hermes.run``
scripts and ``hermes run``, in warm workers and in processes of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run import environment, hermes

WARMTHS = [pytest.param(True, id="warm"), pytest.param(False, id="cold")]

SCRIPT = """
import argparse, json, sys
import hermes
from hermes import trial

seen = list(sys.argv)  # at the import, as argparse reads it
parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=1.0)
parser.add_argument("--trials", type=int, default=1)
parser.add_argument("--warm", type=int, default=1)
args = parser.parse_args()  # strict: another command line fails the import


def train(config):
    (trial.trial_dir() / "argv.json").write_text(json.dumps(seen))
    trial.report(1, loss=config["lr"] * args.scale)


if __name__ == "__main__":
    spec = {"name": "argv", "trial": {"function": train, "warm_workers": bool(args.warm)},
            "search": {"trials": args.trials, "seed": 0, "space": {"lr": {"type": "uniform", "low": 0.5, "high": 1}}},
            "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1}, "policy": {"name": "fifo"},
            "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": "runs"}}
    result = hermes.run(spec)
    print(json.dumps([[t.state, t.best, t.params["lr"], t.error, str(t.directory)] for t in result.trials]))
"""

MODULE = """
import argparse, json, sys
from hermes import trial

seen = list(sys.argv)
parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=1.0)
args = parser.parse_args()


def train(config):
    (trial.trial_dir() / "argv.json").write_text(json.dumps(seen))
    trial.report(1, loss=args.scale)
"""


SETTINGS = """
import argparse, sys

seen = list(sys.argv)
parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=1.0)
args = parser.parse_args()  # strict: another command line fails the import
"""

MODEL = """
import json
from hermes import trial
import settings


def train(config):
    (trial.trial_dir() / "argv.json").write_text(json.dumps(settings.seen))
    trial.report(1, loss=settings.args.scale)
"""

DRIVER = """
import json, os, sys
import hermes
import settings
from model import train

if __name__ == "__main__":
    spec = {"name": "other", "trial": {"function": train, "workdir": os.path.dirname(os.path.abspath(__file__)),
                                       "warm_workers": os.environ["WARM"] == "1"},
            "search": {"trials": 1, "seed": 0, "space": {"lr": {"type": "uniform", "low": 0, "high": 1}}},
            "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1}, "policy": {"name": "fifo"},
            "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": "runs"}}
    result = hermes.run(spec)
    print(json.dumps([[t.state, t.best, t.params["lr"], t.error, str(t.directory)] for t in result.trials]))
"""


def _run_script(folder: Path, *arguments: str, script: str = "tune.py", warm: bool | None = None) -> list[list]:
    env = environment() | ({} if warm is None else {"WARM": str(int(warm))})
    finished = subprocess.run([sys.executable, script, *arguments], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout.splitlines()[-1])


@pytest.mark.parametrize("warm", WARMTHS)
def test_a_scripts_trials_see_its_command_line_and_a_reruns(tmp_path: Path, warm: bool) -> None:
    (tmp_path / "tune.py").write_text(SCRIPT)
    flag = f"--warm={int(warm)}"
    [(state, best, lr, error, directory)] = _run_script(tmp_path, "--scale", "100", flag)
    assert (state, error) == ("completed", None)
    script = str((tmp_path / "tune.py").resolve())  # absolute: the trial runs in its own workdir
    assert json.loads((Path(directory) / "argv.json").read_text()) == [script, "--scale", "100", flag]
    assert best == pytest.approx(lr * 100)

    # Run again with one more trial: the new trial runs under this driver, and sees its command line.
    trials = _run_script(tmp_path, "--scale", "7", "--trials", "2", flag)
    assert [state for state, *_ in trials] == ["completed", "completed"]
    argvs = sorted(json.loads((Path(row[4]) / "argv.json").read_text()) for row in trials)
    assert argvs == [[script, "--scale", "100", flag], [script, "--scale", "7", "--trials", "2", flag]]


@pytest.mark.parametrize("warm", WARMTHS)
def test_every_module_of_a_scripts_trials_sees_its_command_line(tmp_path: Path, warm: bool) -> None:
    """The arguments parsed in a settings module that the trial's module imports, not in the script itself: that
    module saw the trial module's file alone, and the trial trained with the defaults (scale 1), silently. The script
    is started from the folder above its own, where a relative ``project/tune.py`` names nothing from the trial's
    workdir."""
    project = tmp_path / "project"
    project.mkdir()
    for name, text in (("settings.py", SETTINGS), ("model.py", MODEL), ("tune.py", DRIVER)):
        (project / name).write_text(text)
    [(state, best, _lr, error, directory)] = _run_script(tmp_path, "--scale", "100", script="project/tune.py",
                                                         warm=warm)
    assert (state, error) == ("completed", None)
    seen = json.loads((Path(directory) / "argv.json").read_text())
    assert seen == [str((project / "tune.py").resolve()), "--scale", "100"]
    assert best == 100


@pytest.mark.parametrize("warm", WARMTHS)
def test_a_module_run_by_hermes_run_sees_its_file_alone(tmp_path: Path, warm: bool) -> None:
    (tmp_path / "train.py").write_text(MODULE)
    spec = {"name": "module", "trial": {"function": "train:train", "warm_workers": warm},
            "search": {"trials": 1, "seed": 0, "space": {"lr": {"type": "uniform", "low": 0, "high": 1}}},
            "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1}, "policy": {"name": "fifo"},
            "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": "runs"}}
    (tmp_path / "experiment.yaml").write_text(json.dumps(spec))  # JSON is YAML
    finished = hermes("run", "experiment.yaml", "--no-live", cwd=tmp_path)
    trial = tmp_path / "runs" / "module" / "trials" / "0"
    assert json.loads((trial / "argv.json").read_text()) == [str(tmp_path / "train.py")], finished.stderr
    assert finished.returncode == 0, finished.stderr
