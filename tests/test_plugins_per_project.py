"""One process (a notebook's kernel) that runs one project, then another whose trial.workdir holds a plug-in module of
the same name: the second ran the first one's searcher, since Python had that module already; and a plug-in (or a
module it imports from its folder) edited between two runs was never read again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TIMEOUT = 90

SAMPLER = '''
from hermes.search import BaseSearcher
from proj_helpers import X


class S(BaseSearcher):
    learns = False

    def __init__(self, search, *, max_pending=None):
        super().__init__(max_pending=max_pending)

    def _propose(self, index):
        return {"x": X} if index < 1 else None
'''

TRAIN = '''
from hermes import trial


def train(config):
    trial.report(1, loss=config["x"])
'''

# Runs project a, then b, then b again after its helper changed; prints the x each run's searcher proposed
DRIVER = '''
import sys
from pathlib import Path

import hermes

def proposed(project, name):
    result = hermes.run({
        "name": name, "trial": {"function": "proj_train:train", "workdir": project},
        "search": {"sampler": "proj_sampler:S", "trials": 1, "space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
        "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1},
        "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": f"{project}/runs"}})
    return result.trials[0].params["x"]

print(proposed("a", "first"), proposed("b", "first"))
Path("b/proj_helpers.py").write_text("X = 0.555  # edited\\n")
print(proposed("b", "second"))
'''


def test_a_second_projects_plugin_of_the_same_name_is_its_own(tmp_path: Path) -> None:
    for project, x in (("a", "0.11"), ("b", "0.77")):
        folder = tmp_path / project
        folder.mkdir()
        (folder / "proj_sampler.py").write_text(SAMPLER)  # the same file in both: their helpers differ
        (folder / "proj_helpers.py").write_text(f"X = {x}\n")
        (folder / "proj_train.py").write_text(TRAIN)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=TIMEOUT, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["0.11", "0.77", "0.555"], ran.stdout + ran.stderr
