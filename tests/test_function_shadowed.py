"""``hermes.run`` given a function whose module the trial's workdir holds another file of: a notebook's folder with an
older train.py, the function imported from ../src. Its trials imported the workdir's and ran the old code, without a
word; now the run is refused, naming both files, and runs the function given once trial.workdir is its folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TRAIN = '''
from hermes import trial


def train(config):
    trial.report(1, loss=config["x"], which={which})
'''

DRIVER = '''
import sys

import hermes

sys.path.insert(0, "../src")
import shadowed_train

spec = {"name": "shadowed", "trial": {"function": shadowed_train.train},
        "search": {"sampler": "random", "trials": 1, "seed": 0,
                   "space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
        "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 1},
        "resources": {"cpu_slots": 1, "threads_per_slot": 1}, "storage": {"dir": "runs"}}
try:
    result = hermes.run(spec)
    print("ran", result.trials[0].best_metrics["which"])
except hermes.errors.SpecError as error:
    print("refused:", error)
spec["trial"]["workdir"] = "../src"
print("ran", hermes.run(spec).trials[0].best_metrics["which"])
'''


def test_a_function_whose_module_the_workdir_holds_another_copy_of_is_refused(tmp_path: Path) -> None:
    for folder, which in (("nb", 1), ("src", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "shadowed_train.py").write_text(TRAIN.format(which=which))
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER)], cwd=tmp_path / "nb", env=env,
                         capture_output=True, text=True, timeout=90, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    refused, after = ran.stdout.strip().splitlines()
    src, nb = (tmp_path / "src").resolve(), (tmp_path / "nb").resolve()
    assert refused.startswith(f"refused: trial.function: train is in {src / 'shadowed_train.py'}, but a trial's "
                              f"process imports shadowed_train from its workdir ({nb}) first, where it is "
                              f"{nb / 'shadowed_train.py'}, another file"), ran.stdout
    assert f"set trial.workdir to {src}" in refused
    assert after == "ran 2.0"  # the function given


def test_the_same_file_reached_by_another_path_is_no_other_copy(tmp_path: Path) -> None:
    """A hard link (or a second mount of the project) names the function's own file: refused, the user was told to
    move their only copy away."""
    from hermes.tuning import _function_named

    (tmp_path / "src").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "src" / "linked_train.py").write_text(TRAIN.format(which=1))
    os.link(tmp_path / "src" / "linked_train.py", tmp_path / "work" / "linked_train.py")
    sys.path.insert(0, str(tmp_path / "src"))
    try:
        import linked_train

        named = _function_named({"trial": {"function": linked_train.train, "workdir": str(tmp_path / "work")}})
    finally:
        sys.path.remove(str(tmp_path / "src"))
        sys.modules.pop("linked_train", None)
    assert named["trial"]["function"] == "linked_train:train"
