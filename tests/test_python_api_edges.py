"""``hermes.run`` given what a Ray Tune user writes: a class trainable, ``pathlib.Path`` folders, a script's globals.

Real trial processes (tests/trials/curve.py or a module written here, on CPU slots) and a real SQLite store.
"""

from __future__ import annotations

import importlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import hermes
from hermes.errors import SpecError
from hermes.experiment import parse_spec
from tests.test_run import TESTS, environment, search, spec_of

TRIAL_IS_A_FUNCTION = ("a trial is a function that takes the config and reports through hermes.trial "
                       "(def train(config): ...), not a class such as Ray Tune's Trainable")

TRAINABLES = """
from hermes import trial


class Trainable:  # Ray Tune's class API: a trial's process called Trainable(config), a TypeError in every trial
    def setup(self, config):
        pass

    def step(self):
        return {"score": 1.0}


def _report(config):
    trial.report(1, score=config["rate"])


class train:  # rebound to a function below: a trial imports that
    pass


train = _report


def _as_function(cls):
    return _report


@_as_function
class decorated:  # a decorator may make a class a function
    pass
"""


def test_a_class_as_the_trial_function_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A class passed the spec check, then every trial failed: "uncaught TypeError: Trainable() takes no arguments"."""
    (tmp_path / "trainables.py").write_text(TRAINABLES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = spec_of("classes", search=search(1, 0, 0.01), budget={"steps": 1})
    as_object = importlib.import_module("trainables").Trainable
    with pytest.raises(SpecError) as raised:
        hermes.run({**spec, "trial": {"function": as_object}})
    assert str(raised.value) == f"trial.function: Trainable is a class: {TRIAL_IS_A_FUNCTION}"
    with pytest.raises(SpecError) as raised:
        hermes.run({**spec, "trial": {"function": "trainables:Trainable", "workdir": str(tmp_path)}})
    assert str(raised.value) == (f"<spec>: trial.function: module trainables ({tmp_path / 'trainables.py'}) defines "
                                 f"'Trainable' as a class: {TRIAL_IS_A_FUNCTION}")
    assert not (tmp_path / "runs").exists()
    decorated = {**spec, "trial": {"function": "trainables:decorated", "workdir": str(tmp_path)}}
    assert parse_spec(decorated, base_dir=tmp_path).trial.function == "trainables:decorated"
    rebound = hermes.run({**spec, "trial": {"function": "trainables:train", "workdir": str(tmp_path)}})
    assert [trial.state for trial in rebound.trials] == ["completed"]


def test_pathlib_paths_in_a_dict_spec_run_and_continue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``storage.dir: Path(...)`` was "storage.dir: Input should be a valid string", trial.workdir too."""
    monkeypatch.chdir(tmp_path)
    spec = spec_of("paths", search=search(1, 0, 0.01), budget={"steps": 1}, storage={"dir": tmp_path / "runs"})
    spec["trial"] = {**spec["trial"], "workdir": TESTS}
    first = hermes.run(spec)
    assert [trial.state for trial in first.trials] == ["completed"]
    with sqlite3.connect(first.store) as connection:
        stored = json.loads(connection.execute("SELECT spec FROM experiments").fetchone()[0])
    assert (stored["trial"]["workdir"], stored["storage"]["dir"]) == (str(TESTS), str(tmp_path / "runs"))
    for again in (spec, {**spec, "trial": {**spec["trial"], "workdir": str(TESTS)},
                         "storage": {"dir": str(tmp_path / "runs")}}):
        continued = hermes.run(again)  # the same experiment, not "a different spec"
        assert continued.resumed and continued.experiment_id == first.experiment_id
    on_ray = parse_spec({**spec, "engine": "ray", "storage": {"dir": tmp_path / "runs", "uri": tmp_path / "shared"}})
    assert on_ray.checkpoint_uri == str(tmp_path / "shared" / "paths")


GLOBAL_SET_UNDER_GUARD = """
import hermes
from hermes import trial

DATA = None


def data():
    return DATA or []


def train(config):
    trial.report(1, score=float(len(data())))


if __name__ == "__main__":
    DATA = list(range(10))
    result = hermes.run({"name": "globals", "trial": {"function": train},
                         "search": {"sampler": "random", "trials": 1, "space": {"x": 1}},
                         "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
                         "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
    print("best", result.best.best)
"""


def test_a_global_that_the_scripts_main_block_sets_is_warned_of(tmp_path: Path) -> None:
    """Set under ``if __name__ == "__main__":``, the data a script's trial function reads (here through a helper) was
    silently not there in its trials, which import the script afresh: they trained on None."""
    (tmp_path / "tune.py").write_text(GLOBAL_SET_UNDER_GUARD)
    output = subprocess.run([sys.executable, "tune.py"], check=False, cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert output.stdout.splitlines()[-1] == "best 0.0", output
    assert ("hermes: warning: trial.function train reads DATA, which tune.py sets under `if __name__ == "
            "\"__main__\":`, a block its trials do not run (they import tune.py afresh): set it at the module's top "
            "level or in the function\n") in output.stderr, output.stderr


SIGTERMED = """
import hermes
spec = {{"name": "term", "trial": {{"function": "trials.curve:train", "workdir": {tests!r}}},
        "search": {{"sampler": "list", "configs": [{{"rate": 0.5, "sleep": 0.5}}]}},
        "metric": {{"name": "score", "mode": "max"}}, "budget": {{"steps": 100}},
        "resources": {{"gpus": "none", "cpu_slots": 1}}, "storage": {{"dir": {runs!r}}}}}
hermes.run(spec)
"""


def test_a_script_stopped_by_sigterm_says_so(tmp_path: Path) -> None:
    """A batch system's SIGTERM to a script that calls hermes.run ended in a bare `hermes.session.Terminated`."""
    import signal
    import time

    script = tmp_path / "driver.py"
    script.write_text(SIGTERMED.format(tests=str(TESTS), runs=str(tmp_path / "runs")))
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=environment(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "runs").glob("term/trials/0/stdout.log")):  # its trial runs
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert stderr.rstrip().splitlines()[-1] == ("hermes.session.Terminated: stopped by SIGTERM: the experiment is "
                                                "recorded interrupted, and running it again continues it"), stderr
