"""``hermes.run`` from Python: the same experiment as ``hermes run``, its results as objects.

Real trial processes (tests/trials/curve.py on CPU slots), a real SQLite store, the real CLI to compare with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import hermes
from hermes.errors import HermesError, SpecError
from hermes.trial import protocol
from tests.test_run import hermes as hermes_cli
from tests.test_run import score, search, spec_of, write_spec


def test_run_from_python_gives_what_hermes_results_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a spec given as a mapping: its relative paths start here
    budget = 4
    spec = spec_of("from-python", search=search(5, 2, 0.01), budget={"steps": budget},
                   storage={"dir": "runs", "checkpoint_every": 2})
    result = hermes.run(spec)
    assert (result.name, result.status, result.error, result.resumed) == ("from-python", "finished", None, False)
    assert result.store == (tmp_path / "runs" / "hermes.db").resolve()
    assert [trial.rank for trial in result.trials] == [1, 2, 3, 4, 5]
    for trial in result.trials:
        assert trial.state == "completed" and trial.steps == trial.reports == budget
        assert trial.final == score(trial.params["rate"], budget)
        assert trial.directory == (tmp_path / "runs" / "from-python" / "trials" / trial.trial_id).resolve()
        assert json.loads((trial.checkpoint / protocol.META_FILE).read_text())["step"] == budget
    best = result.best
    assert best is result.trials[0] and best.best == max(trial.best for trial in result.trials)

    cli = json.loads(hermes_cli("results", "runs", "--format", "json", cwd=tmp_path).stdout)
    assert [(row["trial"], row["best"], row["checkpoint"]) for row in cli] == [
        (trial.trial_id, trial.best, str(trial.checkpoint)) for trial in result.trials]

    again = hermes.run(write_spec(tmp_path, spec))  # a path, this time: the experiment is found, and is finished
    assert again.resumed and again.experiment_id == result.experiment_id and again.trials == result.trials


def test_a_search_whose_every_value_diverged_has_no_best(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trial reported only NaN: ``result.best`` handed back a diverged model's checkpoint, and ``hermes status``
    named it best (Ray Tune's ``get_best_result`` and Optuna's ``best_trial`` leave NaN out)."""
    monkeypatch.chdir(tmp_path)
    spec = spec_of("all-nan", search=search(2, 0, 0.01, report={"type": "choice", "values": ["nan"]}),
                   budget={"steps": 2})
    result = hermes.run(spec)
    assert result.status == "finished" and [trial.reports for trial in result.trials] == [2, 2]
    assert result.best is None
    status = hermes_cli("status", "runs", cwd=tmp_path)
    assert "best        none: every value reported is NaN or infinite" in status.stdout, status.stdout
    listed = hermes_cli("list", "runs", cwd=tmp_path).stdout
    assert listed.splitlines()[-1].rstrip().endswith("2 completed"), listed  # an empty best column


SPY_SAMPLER = """
import optuna

told = []  # per sampler built in hermes.run's process (the spec check's first), each trial it was told the end of


class Spy(optuna.samplers.RandomSampler):
    \"\"\"Random, but trial n takes a choice's value n (mod its length), so each trial's kind is known.\"\"\"

    def __init__(self, seed=None):
        super().__init__(seed=seed)
        self.told = []  # (number, state, values)
        told.append(self.told)

    def sample_independent(self, study, trial, name, distribution):
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            return distribution.choices[trial.number % len(distribution.choices)]
        return super().sample_independent(study, trial, name, distribution)

    def after_trial(self, study, trial, state, values):
        self.told.append((trial.number, state.name, values))
        super().after_trial(study, trial, state, values)
"""


def test_a_trial_that_only_diverged_is_told_to_the_sampler_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every report NaN: the sampler was told a COMPLETE trial of value -inf (+inf when minimising), which TPE ranks
    as a result; docs/search.md promises FAIL. Hermes's own states stay as they are (it ran to its budget)."""
    import importlib

    (tmp_path / "spy_sampler.py").write_text(SPY_SAMPLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    searched = {**search(2, 0, 0.01, report={"type": "choice", "values": ["nan", "ok"]}),
                "sampler": {"optuna": "spy_sampler.Spy"}}
    result = hermes.run(spec_of("diverged", search=searched, budget={"steps": 2}))
    by_kind = {trial.params["report"]: trial for trial in result.trials}
    assert [by_kind[kind].state for kind in ("nan", "ok")] == ["completed", "completed"]
    told = sorted(importlib.import_module("spy_sampler").told[-1])  # the experiment's sampler, built last
    assert told == [(0, "FAIL", None), (1, "COMPLETE", [by_kind["ok"].best])]


def test_run_from_python_refuses_a_wrong_spec_naming_its_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="budget.steps"):
        hermes.run(spec_of("wrong", budget={"steps": 0}))
    assert not (tmp_path / "runs").exists()
    with pytest.raises(AttributeError, match="no attribute 'runn'"):
        hermes.runn  # noqa: B018


def test_a_trial_module_only_the_callers_folder_holds_is_refused_up_front(tmp_path: Path) -> None:
    """Python searches the calling script's folder (the current one for ``python -c`` or a notebook) first; a
    trial's process does not. The spec check found the module there, and every trial then failed on import."""
    import subprocess
    import sys

    from tests.test_run import environment

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "models").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "models" / "__init__.py").write_text("")
    (project / "models" / "mlp.py").write_text("def train(config):\n    pass\n")
    for name, workdir in (("elsewhere", elsewhere), ("here", project)):
        spec = spec_of(name, trial={"function": "models.mlp:train", "workdir": str(workdir)})
        write_spec(project / name, spec)
    program = ("import hermes\nfrom hermes.errors import SpecError\nfor name in ('elsewhere', 'here'):\n"
               "    try:\n        hermes.run(f'{name}/experiment.yaml')\n        print(name, 'ran')\n"
               "    except SpecError as error:\n        print(name, error)\n")
    output = subprocess.run([sys.executable, "-c", program], cwd=project, env=environment(), capture_output=True,
                            text=True, timeout=120)
    lines = output.stdout.splitlines()
    assert lines[0].startswith("elsewhere ") and (
        f"no module 'models' in the trial's workdir ({elsewhere}) or on Python's path: it is in {project}, which "
        "this process has on its path (its program's folder, or one added to sys.path) and a trial's process does "
        "not; set trial.workdir to that folder") in lines[0], output
    assert lines[1] == "here ran", output
    assert not (project / "elsewhere" / "runs").exists()



def test_a_trial_module_on_a_folder_the_caller_added_to_its_path_is_refused_up_front(tmp_path: Path) -> None:
    """A notebook's ``sys.path.append("../src"); from mymod import train``: the check found the module on this
    process's path and passed; every trial then failed on import (a trial's process has no such entry)."""
    import subprocess
    import sys

    from tests.test_run import environment

    src, notebook = tmp_path / "src", tmp_path / "notebook"
    src.mkdir()
    notebook.mkdir()
    (src / "added_mymod.py").write_text("def train(config):\n    pass\n")
    spec = spec_of("added", trial={"function": "added_mymod:train"})
    program = (f"import sys\nsys.path.append({str(src)!r})\nimport hermes\nfrom hermes.errors import SpecError\n"
               f"try:\n    hermes.run({spec!r})\n    print('ran')\nexcept SpecError as error:\n    print(error)\n")
    output = subprocess.run([sys.executable, "-c", program], cwd=notebook, env=environment(), capture_output=True,
                            text=True, timeout=120)
    assert f"no module 'added_mymod' in the trial's workdir ({notebook}) or on Python's path: it is in {src}, " \
           "which this process has on its path" in output.stdout, output
    assert not (notebook / "runs").exists()

DOUBLE_CTRL_C = """
import json, os, signal, sys, threading, time
from pathlib import Path
import hermes
from tests.test_run import search, spec_of

# 3 s of steps: each interrupted run below holds them 0.5 s at most, so the third is still running when it is cut
spec = spec_of("twice", search=search(1, 0, 0.2), budget={"steps": 15}, resources={"gpus": "none", "cpu_slots": 1})
lock = Path("runs/hermes.lock")

def interrupt_twice(apart):
    while not (lock.exists() and lock.read_text()):  # a runner holds the storage dir
        time.sleep(0.01)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(apart)  # while the run ends its trials and releases its storage dir, at one of these
    os.kill(os.getpid(), signal.SIGINT)

found = []
for apart in (0.002, 0.01, 0.03):
    threading.Thread(target=interrupt_twice, args=(apart,), daemon=True).start()
    try:
        hermes.run(spec)
    except KeyboardInterrupt:
        saved = sys.exc_info()  # as IPython keeps the last traceback, and with it what the run held
    try:
        time.sleep(0.3)  # a second Ctrl-C that came after the run's end raises here
    except KeyboardInterrupt:
        pass
    found += [int(pid) for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]
again = hermes.run(spec)
print(json.dumps({"children": found, "status": again.status, "steps": [t.steps for t in again.trials]}))
"""


def test_a_second_ctrl_c_lets_the_same_process_run_the_experiment_again(tmp_path: Path) -> None:
    """Two Ctrl-Cs 10 ms apart in a notebook: the second cut short the release of the first run, whose storage
    lock (held by the caller's own pid) refused the rerun, and whose worker and guard lived on."""
    import subprocess
    import sys

    from tests.test_run import environment

    output = subprocess.run([sys.executable, "-c", DOUBLE_CTRL_C], cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert output.returncode == 0, output.stderr[-3000:]
    result = json.loads(output.stdout.splitlines()[-1])
    assert result == {"children": [], "status": "finished", "steps": [15]}, output.stderr[-3000:]


IMPORTED_RUN = """
import hermes
from hermes import trial

def train(config):
    trial.report(1, score=config["x"])

result = hermes.run({"name": "nested", "trial": {"function": "hpo:train", "workdir": "."},
                     "search": {"sampler": "random", "trials": 2, "seed": 0,
                                "space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
                     "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
                     "resources": {"gpus": "none", "cpu_slots": 2}, "storage": {"dir": "runs"}})
print("ran", result.status, [t.state for t in result.trials])
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "process-per-run"])
def test_a_script_that_runs_hermes_run_when_imported_is_told_to_guard_it(tmp_path: Path, warm: bool) -> None:
    """Ray Tune's usual script, without ``if __name__ == "__main__":``: each worker importing the trial's module
    ran an experiment of its own, whose workers did so again (processes doubled at each level)."""
    import subprocess
    import sys

    from tests.test_run import environment

    (tmp_path / "hpo.py").write_text(IMPORTED_RUN.replace('"workdir": "."', f'"workdir": ".", "warm_workers": {warm}'))
    output = subprocess.run([sys.executable, "hpo.py"], cwd=tmp_path, env=environment(), capture_output=True,
                            text=True, timeout=120)
    assert output.stdout.splitlines() == ["ran finished ['failed', 'failed']"], output
    assert "hermes: error: every trial failed; trial 0: " in output.stderr
    assert 'put the call under `if __name__ == "__main__":`' in output.stderr
    assert [path.name for path in (tmp_path / "runs").iterdir() if path.is_dir()] == ["nested"]  # none nested


def test_run_from_python_says_when_every_trial_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``hermes run`` said so and exited 1; ``hermes.run`` said nothing, with ``error`` None."""
    monkeypatch.chdir(tmp_path)
    spec = spec_of("all-fail", search=search(2, 0, 0.01, crash={"type": "choice", "values": ["raise"]},
                                             crash_step={"type": "choice", "values": [1]}))
    result = hermes.run(spec)
    assert [trial.state for trial in result.trials] == ["failed", "failed"]
    assert result.error is not None and result.error.startswith("every trial failed; trial 0: uncaught ")
    assert f"hermes: error: {result.error}\n" in capsys.readouterr().err


def test_run_from_python_takes_the_trial_function_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As Ray Tune's ``Tuner(train)``: only ``'module:function'`` was taken ("Input should be a valid string")."""
    from tests.trials import curve

    monkeypatch.chdir(tmp_path)
    spec = spec_of("itself", search=search(2, 0, 0.01), budget={"steps": 2})
    spec["trial"] = {**spec["trial"], "function": curve.train}
    result = hermes.run(spec)
    assert [trial.state for trial in result.trials] == ["completed", "completed"]


class _Callable:
    def __call__(self, config: dict[str, object]) -> None:
        pass


def test_a_trial_function_no_process_can_import_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lambda was "must be 'package.module:function', got 'tests.test_tuning:<lambda>'", a functools.partial
    "Input should be a valid string"."""
    import functools

    from tests.trials import curve

    monkeypatch.chdir(tmp_path)
    spec = spec_of("unnamed", search=search(2, 0, 0.01), budget={"steps": 2})
    for function, what in [(lambda config: curve.train(config), "a lambda"),
                           (functools.partial(curve.train), "a functools.partial"),
                           (_Callable(), "a callable _Callable object")]:
        with pytest.raises(SpecError) as raised:
            hermes.run({**spec, "trial": {**spec["trial"], "function": function}})
        assert str(raised.value).startswith(f"trial.function: {what} cannot be imported by a trial's process, which "
                                            "imports its function by module and name: give a module's top-level def "
                                            "(def train(config): ...)")
    assert not (tmp_path / "runs").exists()


def test_numpy_numbers_and_fixed_parameters_run_and_a_callable_argument_is_refused_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """np.int64 in search.sampler.args (and search.seed) failed with a raw PydanticSerializationError once hermes.db
    was made, a callable too; a fixed parameter (Ray Tune's ``param_space={"sleep": 0.01}``) was refused."""
    np = pytest.importorskip("numpy")
    monkeypatch.chdir(tmp_path)
    searched = {"sampler": {"name": "tpe", "args": {"gamma": lambda n: min(n, 2)}}, "trials": 2, "seed": np.int64(1),
                "space": {"rate": {"type": "uniform", "low": 0.1, "high": 1.0}, "sleep": 0.01}}
    with pytest.raises(SpecError, match=r"^<spec>: search.sampler.args.gamma: must be a plain value .* got a "
                                        r"callable: <function "):
        hermes.run(spec_of("numpy", search=searched, budget={"steps": 2}))
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    searched["sampler"] = {"name": "tpe", "args": {"n_startup_trials": np.int64(1)}}
    result = hermes.run(spec_of("numpy", search=searched, budget={"steps": 2}))
    assert [trial.state for trial in result.trials] == ["completed", "completed"]
    assert [trial.params["sleep"] for trial in result.trials] == [0.01, 0.01]


GUARDED_FUNCTION = """
import hermes
from hermes import trial

if __name__ == "__main__":
    def train(config):
        trial.report(1, score=config["x"])

    hermes.run({"name": "guarded", "trial": {"function": train},
                "search": {"sampler": "random", "trials": 2, "space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
                "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
                "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
"""


def test_a_trial_function_under_the_main_guard_is_refused_up_front(tmp_path: Path) -> None:
    """Defined beside the hermes.run call, under ``if __name__ == "__main__":``: the check passed, and every trial
    failed with "module 'tune' has no attribute 'train'", as a trial's process imports the script."""
    import subprocess
    import sys

    from tests.test_run import environment

    (tmp_path / "tune.py").write_text(GUARDED_FUNCTION)
    output = subprocess.run([sys.executable, "tune.py"], cwd=tmp_path, env=environment(), capture_output=True,
                            text=True, timeout=120)
    assert output.returncode != 0
    assert (f"trial.function: module tune ({tmp_path / 'tune.py'}) defines 'train' only under `if __name__ == "
            "\"__main__\":`, whose body a trial's process never runs (it imports the module): define it at the "
            "module's top level") in output.stderr, output.stderr
    assert not (tmp_path / "runs").exists()


SCRIPT_ITSELF = """
import hermes
from hermes import trial

def train(config):
    trial.report(1, score=config["x"])

if __name__ == "__main__":
    result = hermes.run({"name": "script", "trial": {"function": train},
                         "search": {"sampler": "random", "trials": 2, "seed": 0,
                                    "space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
                         "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 1},
                         "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
    print("ran", result.status, [t.state for t in result.trials])
"""


def test_a_script_run_directly_may_name_its_own_trial_function(tmp_path: Path) -> None:
    """The README's pattern, ``"function": train`` in the script that is run: it was refused as ``__main__:train``.
    Its trials import the script's file as a module, from its folder (here not the current directory)."""
    import subprocess
    import sys

    from tests.test_run import environment

    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "tune.py").write_text(SCRIPT_ITSELF)
    output = subprocess.run([sys.executable, "scripts/tune.py"], cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert output.stdout.splitlines()[-1] == "ran finished ['completed', 'completed']", output
    # run as a package's module (python -m): imported by its name, from the package's folder (No module named 'pkg')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tune.py").write_text(SCRIPT_ITSELF.replace('"name": "script"', '"name": "module"'))
    output = subprocess.run([sys.executable, "-m", "pkg.tune"], cwd=tmp_path / "scripts", env={
        **environment(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{environment().get('PYTHONPATH', '')}"},
        capture_output=True, text=True, timeout=120)
    assert output.stdout.splitlines()[-1] == "ran finished ['completed', 'completed']", output
    # a file name no import can name: said, not "must be 'package.module:function', got 'my-tune:train'"
    (tmp_path / "scripts" / "my-tune.py").write_text(SCRIPT_ITSELF)
    output = subprocess.run([sys.executable, "scripts/my-tune.py"], cwd=tmp_path, env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert "the script my-tune.py defines it, and a trial's process imports it by the file's name" in output.stderr


TORCH_TRIAL = """
import torch
from hermes import trial

def train(config):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    state = trial.Checkpoint(model=model, optimizer=optimizer)
    for step in range(state.restore() + 1, trial.budget() + 1):
        optimizer.zero_grad()
        loss = model(torch.ones(4, 3)).square().mean()
        loss.backward()
        optimizer.step()
        trial.report(step, loss=float(loss))
    torch.save(model.state_dict(), trial.trial_dir() / "final.pt")
"""


def test_the_best_trials_model_loads_from_its_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``result.best.checkpoint`` is a folder: torch.load of its file failed (weights_only, its numpy generators) and
    ``trial.Checkpoint`` works only in a trial, so no documented way led to the winner's model."""
    import torch

    from hermes.trial import load_state

    (tmp_path / "net.py").write_text(TORCH_TRIAL)
    monkeypatch.chdir(tmp_path)
    result = hermes.run({"name": "net", "trial": {"function": "net:train"},
                         "search": {"sampler": "list", "configs": [{"lr": 0.1}, {"lr": 0.01}]},
                         "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 2},
                         "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"}})
    best = result.best
    assert best is not None and best.checkpoint is not None
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(load_state(best.checkpoint)["model"])
    final = torch.load(best.checkpoint.parents[1] / "final.pt")
    assert all(torch.equal(model.state_dict()[key], final[key]) for key in final)  # the winner's last step
    with pytest.raises(HermesError, match="is not there: is .* a checkpoint's folder"):
        load_state(tmp_path)


def test_a_ctrl_c_after_the_last_batch_is_raised_once_the_end_is_written(tmp_path: Path) -> None:
    """An interrupt that came after the engine's last batch (the run ending a few ms later) was dropped: the run
    returned finished and a script running experiments one after another went on to the next. It is raised once
    the run has written its end, which stays finished."""
    from hermes.experiment import parse_spec
    from hermes.session import ExperimentSession
    from hermes.store import ExperimentStatus

    spec = spec_of("last", search=search(2, 0, 0.02), budget={"steps": 2})
    session = ExperimentSession(parse_spec(spec, base_dir=tmp_path))
    interrupted: list[bool] = []

    def interrupt_once_finished(_event: object, _decisions: object) -> None:
        if session.scheduler.finished and not interrupted:
            interrupted.append(session.interrupt(KeyboardInterrupt()))

    session.listeners.append(interrupt_once_finished)
    with pytest.raises(KeyboardInterrupt):
        session.run()
    assert interrupted == [True]  # the engine took it, after its last batch
    assert session.store.experiment(session.experiment_id).status is ExperimentStatus.FINISHED
    session.store.close()


def test_an_interrupted_run_from_python_leaves_no_store_file_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """A notebook keeps the last traceback (``sys.last_traceback``), and with it the session: its store's
    hermes.db, -wal and -shm stayed open after the KeyboardInterrupt, until the traceback was dropped."""
    import signal
    import threading

    monkeypatch.chdir(tmp_path)
    spec = spec_of("held", search=search(2, 0, 0.5), budget={"steps": 20})
    timer = threading.Timer(1.5, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            hermes.run(spec)
    finally:
        timer.cancel()
    assert raised.traceback  # kept, as a notebook keeps it
    assert [link for link in open_files() if str(tmp_path) in link] == []  # other tests' files are not its


def open_files() -> list[str]:
    """What this process's file descriptors point to (one closed meanwhile left out)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return found
