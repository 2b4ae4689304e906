"""trial.Checkpoint(rng=True) with no torch object: torch is an optional extra, and importing it costs seconds.

Each trial program runs in a process of its own, as a trial does, with a trial session from the environment an
executor sets (no channel: these programs only commit and restore checkpoints, with real files).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermes.trial import protocol

ROOT = Path(__file__).resolve().parent.parent
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

# Commits a checkpoint of step 3 holding the generators of random and numpy, draws from them, then restores them.
ROUND_TRIP = """
import random, sys
import numpy
from hermes import trial
from hermes.trial.session import current

state = trial.Checkpoint(rng=True)
random.seed(1)
numpy.random.seed(2)
random.random(), numpy.random.random(5)  # somewhere in their streams, not at a seed
saved_python, saved_numpy = random.getstate(), numpy.random.get_state()
current().save(3)
random.random(), numpy.random.random(7)  # the steps after the checkpoint, lost with the process
assert state.restore() == 3
assert random.getstate() == saved_python, "random's generator is not the saved one"
restored = numpy.random.get_state()
assert restored[0] == saved_numpy[0] and restored[2:] == saved_numpy[2:], "numpy's generator is not the saved one"
assert (restored[1] == saved_numpy[1]).all(), "numpy's generator is not the saved one"
assert trial.load_state(trial.checkpoint_dir()) == {}
print("restored", sorted(p.name for p in (trial.checkpoint_dir() / "state").iterdir()))
"""


def run_trial(tmp_path: Path, program: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        protocol.ENV_TRIAL_ID: "t1",
        protocol.ENV_TRIAL_DIR: str(tmp_path / "t1"),
        protocol.ENV_BUDGET: "10",
    }
    (tmp_path / "t1").mkdir(exist_ok=True)
    (tmp_path / "t1" / protocol.CONFIG_FILE).write_text("{}")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program)], env=environment, cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=60)


def test_the_generators_round_trip_bitwise_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    """Where torch is not installed (an import of it fails), saving called torch.save: ModuleNotFoundError."""
    ran = run_trial(tmp_path, "import sys\nsys.modules['torch'] = None  # import torch fails, as uninstalled\n"
                    + ROUND_TRIP)
    assert ran.returncode == 0, ran.stderr
    assert "restored ['state.pkl']" in ran.stdout


@needs_torch  # installed, and not imported by the trial
def test_saving_and_offloading_generators_alone_does_not_import_torch(tmp_path: Path) -> None:
    """The first park or spill imported torch, seconds counted as the trial's GPU time."""
    ran = run_trial(tmp_path, ROUND_TRIP + textwrap.dedent("""
        assert "torch" not in sys.modules, "saving the checkpoint imported torch"
        state.offload()  # what a park does with every saver
        state.reload()
        assert "torch" not in sys.modules, "offloading the checkpoint imported torch"
    """))
    assert ran.returncode == 0, ran.stderr


@needs_torch
def test_a_checkpoint_torch_saved_still_loads_where_torch_is_imported(tmp_path: Path) -> None:
    """A trial that imports torch saves state.pt with torch.save, as before, and its generators come back bitwise."""
    ran = run_trial(tmp_path, "import torch\ntorch.manual_seed(3)\ntorch.rand(4)\nbefore = torch.get_rng_state()\n"
                    + ROUND_TRIP.replace("current().save(3)", "current().save(3)\ntorch.rand(9)")
                    + "assert torch.equal(torch.get_rng_state(), before)\n")
    assert ran.returncode == 0, ran.stderr
    assert "restored ['state.pt']" in ran.stdout


def test_a_run_of_trials_that_keep_generators_alone_where_torch_is_not_installed(tmp_path: Path) -> None:
    """A Files saver plus Checkpoint(rng=True), as docs/trials.md advises, where import torch fails: every trial
    failed with ModuleNotFoundError."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "torch.py").write_text("raise ModuleNotFoundError('no torch here', name='torch')\n")
    (tmp_path / "objective.py").write_text(textwrap.dedent("""
        import json, random
        from hermes import trial

        def train(config):
            model = {"w": 0.0}
            files = trial.Files(lambda d: (d / "model.json").write_text(json.dumps(model)),
                                lambda d: model.update(json.loads((d / "model.json").read_text())))
            generators = trial.Checkpoint(rng=True)
            for step in range(max(files.restore(), generators.restore()), trial.budget()):
                model["w"] += random.random() * config["x"]
                trial.report(step + 1, loss=abs(model["w"] - 1))
    """))
    (tmp_path / "spec.yaml").write_text(textwrap.dedent("""
        name: no-torch
        trial: {function: objective:train, workdir: .}
        search: {sampler: random, trials: 2, space: {x: {type: uniform, low: 0, high: 1}}}
        metric: {name: loss, mode: min}
        budget: {steps: 3}
        policy: {name: fifo}
        resources: {gpus: none, cpu_slots: 1, threads_per_slot: 1}
        storage: {dir: store}
    """))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(ROOT)])}
    ran = subprocess.run([sys.executable, "-m", "hermes.cli", "run", "spec.yaml"], cwd=tmp_path, env=environment,
                         check=False, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(path.name for path in (tmp_path / "store").rglob("state.pkl")) == ["state.pkl", "state.pkl"]


LOST = """
import pathlib
from hermes import trial
from hermes.trial.session import current

state = trial.Checkpoint(rng=True)
current().save(3)
folder = trial.checkpoint_dir() / "state"
for file in folder.iterdir():
    file.unlink()  # lost by hand, whichever it was
try:
    trial.load_state(trial.checkpoint_dir())
except Exception as error:
    print("load_state:", error)
assert state.restore() == 0  # moved aside as damaged, said on stderr: the trial retrains
"""


def test_a_checkpoint_whose_state_file_is_lost_is_said_so_naming_both_files(tmp_path: Path) -> None:
    """With state.pt gone, the trial's restore and load_state named a state.pkl that was never written."""
    ran = run_trial(tmp_path, LOST)
    assert ran.returncode == 0, ran.stderr
    assert "state.pt (or state.pkl) is not there" in ran.stdout, ran.stdout
    assert "damaged (neither state.pt nor state.pkl is there)" in ran.stderr, ran.stderr


# A torch whose import, begun in another thread, is half done until the program lets it finish half a second later.
SLOW_TORCH = """
import pickle
import sys

started, finish = sys.modules["__main__"].IMPORT_GATES
started.set()
finish.wait(10)
seeded = False


class cuda:
    @staticmethod
    def is_initialized():
        return False


def get_rng_state():
    return "torch's generator"


def seed():
    global seeded
    seeded = True


def save(state, path):
    path.write_bytes(pickle.dumps(state))
"""

DURING_IMPORT = """
import sys
import threading

IMPORT_GATES = threading.Event(), threading.Event()
sys.path.insert(0, "fake")
from hermes import trial
from hermes.trial.checkpoint import reseed_rng
from hermes.trial.session import current, release_device_cache

state = trial.Checkpoint(rng=True)
threading.Thread(target=__import__, args=("torch",)).start()  # a data loader warming up
IMPORT_GATES[0].wait(10)  # sys.modules holds torch, half-built
threading.Timer(0.5, IMPORT_GATES[1].set).start()
{action}
import torch
folder = trial.checkpoint_dir()  # None where nothing was saved
print("done", torch.seeded, sorted(p.name for p in (folder / "state").iterdir()) if folder else [])
"""


@pytest.mark.parametrize(("action", "done"), [("current().save(3)", "done False ['state.pt']"),
                                              ("reseed_rng()", "done True []"),
                                              ("release_device_cache()", "done False []")],
                         ids=["save", "reseed", "release-cache"])
def test_the_generators_wait_for_a_torch_import_half_done_in_another_thread(
    tmp_path: Path, action: str, done: str
) -> None:
    """capture_rng, reseed_rng and release_device_cache (a parked trial's) used the half-built module in sys.modules:
    AttributeError, "partially initialized module 'torch' has no attribute 'get_rng_state'" (or 'cuda')."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "torch.py").write_text(SLOW_TORCH)
    ran = run_trial(tmp_path, DURING_IMPORT.replace("{action}", action))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == done, ran.stdout
