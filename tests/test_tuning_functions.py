"""``hermes.run`` given the trial's function itself: which functions a trial's process can import, and what is said of
those it cannot. Real scripts in real Python processes, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_run import environment

SPEC = """{"name": "functions", "trial": {"function": train},
        "search": {"sampler": "list", "configs": [{"x": 1.0}]},
        "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}}"""

DECORATED = f"""
import hermes
from hermes.errors import SpecError
from hermes import trial

def timed(function):  # a plain decorator, without functools.wraps
    def wrapper(config):
        return function(config)
    return wrapper

@timed
def train(config):
    trial.report(1, score=config["x"])

def make():
    @timed
    def inner(config):
        trial.report(1, score=config["x"])
    return inner

if __name__ == "__main__":
    try:
        hermes.run({{**{SPEC}, "trial": {{"function": make()}}}})
    except SpecError as error:
        print("nested:", error)
    result = hermes.run({SPEC})
    print("ran", result.status, [t.state for t in result.trials])
"""

NOTEBOOK = f"""
import hermes
from hermes.errors import SpecError
from hermes import trial
namespace = {{"trial": trial}}
exec("def train(config):\\n    trial.report(1, score=1.0)\\n", namespace)  # no __name__: __module__ is None
train = namespace["train"]
try:
    hermes.run({SPEC})
except SpecError as error:
    print("exec:", error)
"""

STDIN = f"""
import hermes
from hermes.errors import SpecError
from hermes import trial

def train(config):
    trial.report(1, score=1.0)

try:
    hermes.run({SPEC})
except SpecError as error:
    print("stdin:", error)
"""

NO_FILE = ("trial.function: a trial's function runs in a process of its own, which imports it from a module: not from "
           "__main__ (a script run directly, a notebook's cell); move it into a .py file of trial.workdir")


def python(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environment(), input=stdin, capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_decorated_top_level_function_runs_and_a_nested_one_is_told_of_functools_wraps(tmp_path: Path) -> None:
    """A top-level function under a decorator without functools.wraps (its __qualname__ timed.<locals>.wrapper) was
    refused as "not a module's top-level function", though "script:train" ran it."""
    (tmp_path / "script.py").write_text(DECORATED)
    output = python("script.py", cwd=tmp_path)
    lines = output.stdout.splitlines()
    assert lines[-1] == "ran finished ['completed']", output
    assert lines[0] == ("nested: trial.function: timed.<locals>.wrapper is not a module's top-level function, which a "
                        "trial's process imports: define it at the top of a module (a decorator that wraps it must "
                        "keep its name with functools.wraps)"), output


def test_a_function_with_no_file_to_import_it_from_is_told_to_move_into_one(tmp_path: Path) -> None:
    """As of a notebook's or `python -c`'s function: one exec'd into a namespace was "no module 'None' in the trial's
    workdir", one of a script read from stdin "the script <stdin> defines it ... rename the file"."""
    (tmp_path / "notebook.py").write_text(NOTEBOOK)
    output = python("notebook.py", cwd=tmp_path)
    assert output.stdout.strip() == f"exec: <spec>: {NO_FILE}", output
    output = python("-", cwd=tmp_path, stdin=STDIN)
    assert output.stdout.strip() == f"stdin: <spec>: {NO_FILE}", output
    output = python("-c", STDIN, cwd=tmp_path)
    assert output.stdout.strip() == f"stdin: <spec>: {NO_FILE}", output
    assert not (tmp_path / "runs").exists()


def test_a_function_wrapped_by_another_modules_decorator_runs_by_its_name_in_the_script(tmp_path: Path) -> None:
    """Decorators come from a utils module or a library: the wrapper's module is theirs, and the script's name for it
    was not looked for ("timed.<locals>.wrapper is not a module's top-level function")."""
    (tmp_path / "timing.py").write_text("def timed(function):\n    def wrapper(config):\n"
                                        "        return function(config)\n    return wrapper\n")
    (tmp_path / "script.py").write_text(f"""
import hermes
from hermes import trial
from timing import timed

@timed
def train(config):
    trial.report(1, score=config["x"])

if __name__ == "__main__":
    result = hermes.run({SPEC})
    print("ran", result.status, [t.state for t in result.trials])
""")
    output = python("script.py", cwd=tmp_path)
    assert output.stdout.splitlines()[-1:] == ["ran finished ['completed']"], output


def test_a_decorated_function_of_an_imported_module_runs_by_that_modules_name(tmp_path: Path) -> None:
    """`import model; hermes.run({... model.train ...})`, train decorated at model's top level by another module's
    decorator: neither the decorator's module nor the script binds it, and it was refused as nested."""
    (tmp_path / "timing.py").write_text("def timed(function):\n    def wrapper(config):\n"
                                        "        return function(config)\n    return wrapper\n")
    (tmp_path / "model.py").write_text("from hermes import trial\nfrom timing import timed\n\n\n@timed\n"
                                       "def train(config):\n    trial.report(1, score=config['x'])\n")
    (tmp_path / "tune.py").write_text(f"""
import hermes
import model

if __name__ == "__main__":
    result = hermes.run({SPEC.replace("train", "model.train", 1)})
    print("ran", result.status, [t.state for t in result.trials])
""")
    output = python("tune.py", cwd=tmp_path)
    assert output.stdout.splitlines()[-1:] == ["ran finished ['completed']"], output
