"""``hermes.run`` given what a Ray Tune user migrating a script writes: globals its ``main()`` sets, a script rerun
from another folder, a ``train(config, data)`` or a generator, a crash after the retrain notice.

Real scripts run in subprocesses, real trial processes on CPU slots and a real SQLite store.
"""

from __future__ import annotations

import functools
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes
from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.experiment.locate import set_under_main_guard
from hermes.local.system import tail
from tests.test_run import environment

WARNING = ("hermes: warning: trial.function train reads {name}, which tune.py sets under `if __name__ == "
           "\"__main__\":`, a block its trials do not run (they import tune.py afresh): set it at the module's top "
           "level or in the function\n")

RUN = """
    result = hermes.run({"name": "scaled", "trial": {"function": train}, "search": {"configs": [{"lr": 0.5}]},
                         "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 1},
                         "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
    print("best", result.best.best)
"""

SET_BY_MAIN = """
import hermes
from hermes import trial

SCALE = 1.0


def train(config):
    trial.report(1, acc=SCALE * config["lr"])


def parse():
    global SCALE
    SCALE = 100.0


def main():
    parse()
""" + RUN + """

if __name__ == "__main__":
    main()
"""

CHANGED_IN_PLACE = """
import hermes
from hermes import trial

SETTINGS = {"scale": 1.0}


def train(config):
    trial.report(1, acc=SETTINGS["scale"] * config["lr"])


if __name__ == "__main__":
    SETTINGS["scale"] = 100.0
""" + RUN


def run_script(directory: Path, source: str) -> subprocess.CompletedProcess[str]:
    (directory / "tune.py").write_text(source)
    return subprocess.run([sys.executable, "tune.py"], check=False, cwd=directory, env=environment(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("source", [SET_BY_MAIN, CHANGED_IN_PLACE], ids=["global-in-main", "dict-changed"])
def test_a_global_set_by_a_function_the_guard_calls_or_changed_in_place_there_is_warned_of(
    tmp_path: Path, source: str
) -> None:
    """``main()`` under the guard setting ``global SCALE`` (through a helper), or the guard's ``SETTINGS["scale"] =
    100``: the trials trained with the default 1.0, and nothing said so (only names the guard itself assigned
    counted)."""
    output = run_script(tmp_path, source)
    assert output.stdout.splitlines()[-1] == "best 0.5", output  # what the warning is for: the trials' own value
    name = "SCALE" if "SCALE" in source else "SETTINGS"
    assert WARNING.format(name=name) in output.stderr, output.stderr


def test_what_the_guard_changes_in_a_module_or_a_functions_own_names_is_not_warned_of(tmp_path: Path) -> None:
    """The heuristic's bounds: a module's state (``os.environ``, ``sys.path``, which a trial's process inherits or
    sets up itself) and a called function's local list are no global the trials lack; a function the guard never
    calls sets nothing."""
    (tmp_path / "tune.py").write_text("""
import os
import sys

RESULTS = []
LIMIT = 1


def collect(rows):
    kept = []
    kept.append(rows)
    rows.append(1)
    return kept


def never_called():
    global LIMIT
    LIMIT = 2


def main():
    global RESULTS
    RESULTS = collect([])


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, "src")
    main()
""")
    assert set_under_main_guard(tmp_path / "tune.py") == {"RESULTS"}


CACHED_BY_TRAIN = """
import logging

import hermes
from hermes import trial

logger = logging.getLogger(__name__)
_DATA = None
_CACHE = {}


def get_data():
    global _DATA
    if _DATA is None:
        _DATA = [1.0, 2.0]
    return _DATA


def load(name):
    if name not in _CACHE:
        _CACHE[name] = [1.0]
    return _CACHE[name]


def train(config):
    logger.info("lr %s", config["lr"])
    trial.report(1, acc=config["lr"] * len(get_data()) * len(load("train")))


def main():
    logger.propagate = False
    print("rows", len(get_data()), len(load("train")))
""" + RUN + """

if __name__ == "__main__":
    main()
"""


def test_a_cache_the_trial_fills_itself_or_a_module_object_main_configures_is_not_warned_of(tmp_path: Path) -> None:
    """A loader the trial calls too (``global _DATA`` on first use, or a dict cache) run by the guard before tuning,
    and ``logger.propagate = False`` in ``main()``: each trial loads or has them itself, and the warning said the
    trials lacked ``_DATA``, ``_CACHE`` and ``logger``."""
    output = run_script(tmp_path, CACHED_BY_TRAIN)
    assert output.stdout.splitlines()[-1] == "best 1.0", output
    assert "warning" not in output.stderr, output.stderr


def test_a_name_imported_from_a_module_and_changed_under_the_guard_is_warned_of(tmp_path: Path) -> None:
    """``from settings import SETTINGS``, then ``SETTINGS["scale"] = 100`` under the guard: the trials import
    settings afresh and train with 1.0, and nothing said so (every imported name was taken for a module's)."""
    (tmp_path / "tune.py").write_text("""
import os
from settings import SETTINGS


def train(config):
    return SETTINGS["scale"]


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"
    SETTINGS["scale"] = 100.0
""")
    assert set_under_main_guard(tmp_path / "tune.py") == {"SETTINGS"}


def test_the_environment_changed_under_the_guard_through_a_name_imported_from_os_is_not_warned_of(
        tmp_path: Path) -> None:
    """``from os import environ`` then ``environ["DATA_ROOT"] = ...`` under the guard: the trials inherit the
    environment, yet the widened warning named environ (as it leaves os.environ out)."""
    (tmp_path / "tune.py").write_text("""
from os import environ
from sys import path as search_path
from settings import SETTINGS


def train(config):
    return environ["DATA_ROOT"], SETTINGS["scale"]


if __name__ == "__main__":
    environ["DATA_ROOT"] = "/data"
    search_path.insert(0, "/opt/lib")
    SETTINGS["scale"] = 100.0
""")
    assert set_under_main_guard(tmp_path / "tune.py") == {"SETTINGS"}


GLOBAL_ELSEWHERE = """
from hermes import trial

COUNTER = 0


def bump():
    global COUNTER, made_later
    COUNTER += 1


def make(scale):
    def train(config):
        trial.report(1, acc=scale * config["lr"])
    return train


if __name__ == "__main__":
    trainable = make(10.0)
"""


def test_a_global_statement_leaves_the_check_of_other_names_on(tmp_path: Path) -> None:
    """Any ``global`` in the script turned the "defined only under the guard" check off for every name: the spec was
    taken, and each trial failed on its import ("has no attribute 'trainable'"). The names a ``global`` lists may
    be bound when it runs, so those are still taken."""
    (tmp_path / "tune.py").write_text(GLOBAL_ELSEWHERE)
    spec = {"name": "guarded", "trial": {"function": "tune:trainable", "workdir": str(tmp_path)},
            "search": {"configs": [{"lr": 0.5}]}, "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 1},
            "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": str(tmp_path / "runs")}}
    with pytest.raises(SpecError, match=r"defines 'trainable' only under `if __name__ == \"__main__\":`"):
        parse_spec(spec, base_dir=tmp_path)
    parse_spec({**spec, "trial": {**spec["trial"], "function": "tune:made_later"}}, base_dir=tmp_path)


RERUN = """
import sys
from pathlib import Path

import hermes
from hermes import trial


def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, acc=config["lr"] * step)


if __name__ == "__main__":
    result = hermes.run({"name": "rerun", "trial": {"function": train},
                         "search": {"trials": int(sys.argv[1]), "seed": 0,
                                    "space": {"lr": {"type": "uniform", "low": 0.1, "high": 1.0}}},
                         "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 2},
                         "resources": {"gpus": "none", "cpu_slots": 1},
                         "storage": {"dir": Path(__file__).resolve().parent / "runs"}})
    print(result.status, result.resumed, len(result.trials))
"""


def run_from(folder: Path, script: str, *args: str) -> str:
    output = subprocess.run([sys.executable, script, *args], check=False, cwd=folder, env=environment(),
                            capture_output=True, text=True, timeout=120)
    return output.stdout.splitlines()[-1] if output.stdout else output.stderr


def test_a_script_rerun_from_another_folder_continues_its_experiment(tmp_path: Path) -> None:
    """The script's folder is stored as an absolute trial.workdir: stored relative to the current directory, the
    same script run again from the folder above (``python proj/tune.py``) was refused as a changed spec, "differs in
    trial.workdir". (A moved project is refused, as before: its folder is another.)"""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "tune.py").write_text(RERUN)
    assert run_from(project, "tune.py", "1") == "finished False 1"
    assert run_from(tmp_path, "proj/tune.py", "2") == "finished True 2", "the rerun from above was refused"
    with sqlite3.connect(project / "runs" / "hermes.db") as store:
        [(workdir,)] = store.execute("select json_extract(spec, '$.trial.workdir') from experiments").fetchall()
    assert workdir == str(project.resolve())


def train_with_data(config: dict[str, Any], data: list[float]) -> None:  # as tune.with_parameters(train, data=...)
    pass


def train_keyword_only(*, config: dict[str, Any]) -> None:
    pass


def train_yielding(config: dict[str, Any]) -> Iterator[dict[str, float]]:  # Ray Tune's old function API
    yield {"acc": config["lr"]}


def train_with_a_default(config: dict[str, Any], data: list[float] | None = None) -> None:
    pass


@pytest.mark.parametrize(("function", "said"), [
    (train_with_data, ("train_with_data cannot be called as a trial's process calls it, with the config as its one "
                       "argument (train(config)): missing a required argument: 'data'; its first parameter takes the "
                       "config (def train(config): ...), and any other needs a default (load the data a trial needs "
                       "at the module's top level or inside the function)")),
    (train_keyword_only, ("train_keyword_only cannot be called as a trial's process calls it, with the config as its "
                          "one argument (train(config)): too many positional arguments;")),
    (train_yielding, ("train_yielding is a generator function (it yields), as Ray Tune's old function API took: a "
                      "trial reports each result with trial.report(step, metric=value), not yield")),
])
def test_a_function_a_trial_cannot_call_with_its_config_is_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: Any, said: str
) -> None:
    """They passed the check, every trial failed (pointing at Hermes's worker.py, or at a missing report), and the
    experiment was recorded ended under its name."""
    monkeypatch.chdir(tmp_path)
    spec = {"name": "signature", "trial": {"function": function}, "search": {"configs": [{"lr": 0.5}]},
            "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 1},
            "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}}
    with pytest.raises(SpecError) as raised:
        hermes.run(spec)
    assert str(raised.value).startswith(f"trial.function: {said}"), raised.value
    assert not (tmp_path / "runs").exists()


NAMED_TRIALS = """
def train_with_data(config, data):
    pass


def train_keyword_only(*, config):
    pass


def train_yielding(config):
    if config:
        yield {"acc": config["lr"]}


def train_with_a_default(config, data=None, *, seed=0):
    pass


def train_with_a_nested_generator(config):
    def batches():
        yield 1
    return None


def train_with_args(*args):
    pass
"""


@pytest.mark.parametrize(("name", "said"), [
    ("train_with_data", "cannot be called as a trial's process calls it, with the config as its one argument "
                        "(train(config)): it takes (config, data); its first parameter takes the config"),
    ("train_keyword_only", "cannot be called as a trial's process calls it, with the config as its one argument "
                           "(train(config)): it takes (config);"),
    ("train_yielding", "is a generator function (it yields), as Ray Tune's old function API took: a trial reports "
                       "each result with trial.report(step, metric=value), not yield"),
    ("train_with_a_default", None),
    ("train_with_a_nested_generator", None),
    ("train_with_args", None),
])
def test_a_named_function_a_trial_cannot_call_with_its_config_is_refused_by_the_spec_check(
    tmp_path: Path, name: str, said: str | None
) -> None:
    """Named as ``module:function`` (a YAML spec, or a text in hermes.run's dict), these passed the check that a
    function object fails, and each trial started and failed: "missing 1 required positional argument", pointing at
    Hermes's worker.py, or "ended without a report" for a generator."""
    (tmp_path / "named.py").write_text(NAMED_TRIALS)
    spec = {"name": "signature", "trial": {"function": f"named:{name}", "workdir": str(tmp_path)},
            "search": {"configs": [{"lr": 0.5}]}, "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 1}}
    if said is None:
        assert parse_spec(spec, base_dir=tmp_path).trial.function == f"named:{name}"
        return
    with pytest.raises(SpecError) as raised:
        parse_spec(spec, base_dir=tmp_path)
    assert f"module named ({tmp_path / 'named.py'}) defines {name!r}, which {said}" in str(raised.value), raised.value


GIVEN_DATA_BY_A_DECORATOR = """
import functools

import hermes
from hermes import trial


def with_data(function):
    @functools.wraps(function)
    def wrapper(config):
        return function(config, [1.0, 2.0])
    return wrapper


@with_data
def train(config, data):
    trial.report(1, acc=config["lr"] * len(data))


if __name__ == "__main__":
""" + RUN


def test_a_function_whose_functools_wraps_decorator_supplies_an_argument_is_taken(tmp_path: Path) -> None:
    """The wrapper the module binds as ``train`` takes the config alone; the check read the signature of the function
    it wraps (``train(config, data)``, through ``__wrapped__``) and refused it."""
    output = run_script(tmp_path, GIVEN_DATA_BY_A_DECORATOR)
    assert output.stdout.splitlines()[-1] == "best 1.0", output


def test_a_partial_is_told_to_load_its_data_not_to_put_it_in_the_search_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Tune's ``with_parameters(train, data=data)`` as a partial was told "a value every trial takes goes in
    search.space as it is": done with the data set, the spec check echoed all 1.9 MB of it. A function whose other
    parameters have defaults is no partial, and is not refused."""
    monkeypatch.chdir(tmp_path)
    spec = {"name": "partial", "search": {"configs": [{"lr": 0.5}]}, "metric": {"name": "acc", "mode": "max"},
            "budget": {"steps": 1}, "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}}
    with pytest.raises(SpecError) as raised:
        hermes.run({**spec, "trial": {"function": functools.partial(train_with_data, data=[1.0])}})
    assert str(raised.value).endswith("(def train(config): ...); load the data it passes (as Ray Tune's "
                                      "with_parameters) at the module's top level or inside the function, where each "
                                      "trial's process loads it"), raised.value
    assert "search.space" not in str(raised.value)


CRASHES_AFTER_REPORTING = """
import os
import signal
import sys

from hermes import trial


def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, acc=0.1 * step)
        if step == 2:
            print(f"dying by {config['how']}", file=sys.stderr, flush=True)
            if config["how"] == "exit":
                sys.exit(1)
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
"""


def test_a_crash_after_the_retrain_notice_is_said_by_its_own_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial without checkpoints, run again after a crash, prints Hermes's "keeps no checkpoint ... retraining"
    notice on its stderr: its next crash's error quoted that notice as the cause ("exit code -9 (SIGKILL): hermes:
    trial 1 keeps no checkpoint ...", as if Hermes had killed it)."""
    (tmp_path / "crashes.py").write_text(CRASHES_AFTER_REPORTING)
    monkeypatch.chdir(tmp_path)
    result = hermes.run({"name": "notice", "trial": {"function": "crashes:train", "warm_workers": False,
                                                     "max_failures": 1},
                         "search": {"configs": [{"how": "exit"}, {"how": "kill"}]},
                         "metric": {"name": "acc", "mode": "max"}, "budget": {"steps": 3},
                         "resources": {"gpus": "none", "cpu_slots": 2}, "storage": {"dir": "runs"}})
    errors = {trial.params["how"]: trial.error for trial in result.trials}
    assert errors == {"exit": "exit code 1: dying by exit\n(its runs crashed 2 times; trial.max_failures is 1)",
                      "kill": "exit code -9 (SIGKILL): dying by kill\n(its runs crashed 2 times; trial.max_failures "
                              "is 1)"}, errors
    log = (tmp_path / "runs" / "notice" / "trials" / "1" / "stderr.log").read_text()
    assert "hermes: trial 1 keeps no checkpoint of its state" in log  # still there, for its reader


def test_a_workers_log_is_quoted_with_its_note_of_why_it_exited(tmp_path: Path) -> None:
    """A warm worker's log is Hermes's own: its note that a trial's function did not return says why the trial it
    was running failed with it. A trial's log is quoted without Hermes's notes, its own lines whole."""
    note = "hermes: trial a did not return within 30s of its stop: its warm worker exits\n"
    (tmp_path / "local-cpu0.log").write_text(note)
    assert tail(tmp_path / "local-cpu0.log", 0) == note.strip()
    (tmp_path / "stderr.log").write_text(f"epoch 1\n{note}Traceback (most recent call last):\nMemoryError\n")
    assert tail(tmp_path / "stderr.log", 0) == "epoch 1\nTraceback (most recent call last):\nMemoryError"
