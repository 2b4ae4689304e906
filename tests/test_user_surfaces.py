"""What Hermes tells its user, held to what the docs say: ``hermes.run``'s warning of a script's guarded globals, and
where a trial's error summary says it was raised (the live view's best of a trial that reported only NaN is held in
tests/test_live.py).

Real trial processes and a real store (``hermes.run`` on CPU slots).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hermes
from hermes.experiment.locate import set_under_main_guard
from tests.test_run import environment

IMPORTED_NAME_REUSED_UNDER_GUARD = """
import hermes
from hermes import trial  # at the top level: every trial's process has it


def train(config):
    trial.report(1, score=config["x"])


if __name__ == "__main__":
    result = hermes.run({"name": "loop", "trial": {"function": train}, "search": {"configs": [{"x": 1.0}]},
                         "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
                         "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
    for trial in result.trials:  # the usual loop over the results, after the run
        print(trial.trial_id, trial.state)
"""


def test_a_name_the_script_imports_and_its_main_block_reuses_is_not_warned_of(tmp_path: Path) -> None:
    """``from hermes import trial`` at the top and ``for trial in result.trials:`` under ``if __name__ ==
    "__main__":`` warned that train reads trial, "which tune.py sets under" the guard: its trials have it."""
    (tmp_path / "tune.py").write_text(IMPORTED_NAME_REUSED_UNDER_GUARD)
    output = subprocess.run([sys.executable, "tune.py"], check=False, cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert output.stdout.splitlines()[-1] == "0 completed", output
    assert "warning" not in output.stderr, output.stderr


IMPORTED_NAME_ASSIGNED_UNDER_GUARD = """
from settings import lr


def train(config):
    return lr


if __name__ == "__main__":
    lr = 0.5  # the trials see settings.lr: this is what the warning is for
"""


def test_a_name_the_script_imports_and_its_main_block_assigns_is_still_warned_of(tmp_path: Path) -> None:
    """Leaving out every name the top level imports lost the warning where the guard assigns one: the trials read the
    imported value, not the one the script sets for them."""
    (tmp_path / "tune.py").write_text(IMPORTED_NAME_ASSIGNED_UNDER_GUARD)
    assert set_under_main_guard(tmp_path / "tune.py") == {"lr"}
    (tmp_path / "loop.py").write_text(IMPORTED_NAME_REUSED_UNDER_GUARD)
    assert set_under_main_guard(tmp_path / "loop.py") == {"result"}


BAD_METRIC = """from hermes import trial
def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, val_loss=1.0 / step)  # the spec's metric is "loss"
"""


def test_misusing_hermes_trial_is_said_at_the_users_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report without the spec's metric was said "at session.py:312", the line of Hermes that refused it, not the
    user's line that the docs promise ("uncaught ValueError: bad lr, at train.py:16")."""
    (tmp_path / "tr.py").write_text(BAD_METRIC)
    monkeypatch.chdir(tmp_path)
    result = hermes.run({"name": "located", "trial": {"function": "tr:train", "workdir": str(tmp_path)},
                         "search": {"configs": [{"q": 1}]}, "metric": {"name": "loss", "mode": "min"},
                         "budget": {"steps": 2}, "resources": {"gpus": "none", "cpu_slots": 1},
                         "storage": {"dir": "runs"}})
    assert result.error is not None and result.error.endswith("it reported 'val_loss', at tr.py:4"), result.error
