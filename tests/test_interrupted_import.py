"""Ctrl-C while the first ``hermes.run`` imports the scheduler, the store and the report (``hermes.tuning``).

Each case runs a real Python process that presses its own Ctrl-C (SIGINT) the moment a chosen module starts to load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run import RUN_TIMEOUT, TESTS, environment, search, spec_of

SCRIPT = """
import importlib.abc, json, os, signal, sys
import hermes

class CtrlCAt(importlib.abc.MetaPathFinder):
    def __init__(self, name):
        self.name, self.fired = name, False

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, at this moment
        return None

spec = json.loads(sys.argv[2])
sys.meta_path.insert(0, CtrlCAt(sys.argv[1]))
try:
    hermes.run(spec)
    print("first: not interrupted")
except KeyboardInterrupt:
    print("first: KeyboardInterrupt, started", os.path.exists("runs"))
for attempt in ("second", "third"):
    try:
        print(attempt + ":", hermes.run(spec).status)
    except Exception as error:
        print(attempt + ":", type(error).__name__, error)
"""


@pytest.mark.parametrize(("module", "sampler"), [
    ("yaml.cyaml", "random"),  # importing hermes.tuning
    ("sqlalchemy.sql.schema", "random"),
    ("optuna.samplers._tpe.sampler", "tpe"),  # checking the spec's sampler
    ("numpy.linalg", "tpe"),
])
def test_ctrl_c_while_the_first_run_imports_leaves_later_runs_working(tmp_path: Path, module: str,
                                                                     sampler: str) -> None:
    """Raised in the middle of the import, the KeyboardInterrupt left a submodule whose parent's import was cut
    short, and every later ``hermes.run`` in that process (a notebook's kernel) failed: "partially initialized
    module 'yaml' has no attribute 'error'", "module 'sqlalchemy' has no attribute 'event'", "tpe needs Optuna,
    which is not installed", "module 'optuna.pruners' has no attribute '_filter_study'". The import now ends first,
    then the Ctrl-C raises, before the run starts anything."""
    spec = spec_of("interrupted", search={**search(1, 0, 0.0), "sampler": sampler}, budget={"steps": 1},
                   policy={"name": "fifo"}, resources={"gpus": "none", "cpu_slots": 1})
    spec["trial"] = {"function": "trials.curve:train", "workdir": str(TESTS)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, module, json.dumps(spec)], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.stdout.splitlines() == [
        "first: KeyboardInterrupt, started False", "second: finished", "third: finished"], done.stderr
