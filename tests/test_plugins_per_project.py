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


POLICY = '''
import time
from pathlib import Path

time.sleep(0.05)  # a plug-in slow to import: the other thread's run comes in meanwhile

from hermes.policies.fifo import FifoPolicy

TAG = "{tag}"


class Pol(FifoPolicy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(Path(__file__).with_name("used"), "a") as log:
            log.write(TAG + " ")
'''


def _run_spec(project: str, name: str) -> str:
    """A spec, as Python source, of one trial of project's proj_train:train under its mypol:Pol policy."""
    return repr({
        "name": name, "trial": {"function": "proj_train:train", "workdir": project},
        "search": {"sampler": "grid", "space": {"x": {"type": "grid", "values": [0.5]}}},
        "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1}, "policy": {"name": "mypol:Pol"},
        "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": f"{project}/runs"}})


def _project(folder: Path, tag: str) -> None:
    folder.mkdir()
    (folder / "mypol.py").write_text(POLICY.format(tag=tag))
    (folder / "proj_train.py").write_text(TRAIN)


def _driver(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


# Two notebook threads run their projects at once, each with its own mypol.py; prints how each run ended
THREADS = '''
import threading

import hermes

ended = {{}}

def go(project):
    try:
        ended[project] = hermes.run({spec_a} if project == "a" else {spec_b}).status
    except Exception as error:
        ended[project] = f"raised {{error}}"

threads = [threading.Thread(target=go, args=(project,)) for project in ("a", "b")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for project in sorted(ended):
    print(project, ended[project])
'''


def test_two_projects_run_at_once_each_get_their_own_plugin(tmp_path: Path) -> None:
    # One thread dropped the module the other was importing (KeyError: 'mypol'), or imported the other's folder's
    for project in ("a", "b"):
        _project(tmp_path / project, project)
    source = THREADS.format(spec_a=_run_spec("a", "first"), spec_b=_run_spec("b", "first"))
    ran = _driver(tmp_path, source)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == ["a finished", "b finished"], ran.stdout + ran.stderr
    for project in ("a", "b"):  # each run's policy, built from its own folder's module
        assert set((tmp_path / project / "used").read_text().split()) == {project}, ran.stdout


# The notebook, started in the project's folder, imports its plug-in to try it, the user edits it, then runs
NOTEBOOK = '''
import os
import sys
from pathlib import Path

os.chdir("a")
sys.path.insert(0, "")
import mypol

Path("mypol.py").write_text(Path("mypol.py").read_text().replace('TAG = "v1"', 'TAG = "v2"'))
import hermes

print(hermes.run({spec}).status)
'''


def test_a_plugin_the_notebook_imported_then_edited_is_read_again(tmp_path: Path) -> None:
    _project(tmp_path / "a", "v1")
    ran = _driver(tmp_path, NOTEBOOK.format(spec=_run_spec(".", "n")))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["finished"], ran.stdout + ran.stderr
    assert set((tmp_path / "a" / "used").read_text().split()) == {"v2"}, ran.stdout
