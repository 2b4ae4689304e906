"""``hermes.run``: an experiment from Python (a script, a notebook), as ``hermes run`` runs it.

What Ray Tune's ``Tuner.fit()`` and Optuna's ``study.optimize`` give a Python caller: the whole
experiment runs (or continues, from its store, as a rerun of ``hermes run`` does) and its results
come back as objects, best first, each with the trial's directory and newest checkpoint to load the
winner's model from. The trials themselves still run in their own processes, on the spec's slots.
"""

from __future__ import annotations

import dis
import functools
import inspect
import math
import os
import sys
import types
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes import sigint_held
from hermes.errors import HermesError, SpecError
from hermes.experiment import load_spec, parse_spec
from hermes.experiment.locate import (
    TRIAL_IS_A_FUNCTION,
    TRIAL_IS_NOT_ASYNC,
    set_under_main_guard,
    workdir_files,
)
from hermes.local.launchers.base import set_driver_script
from hermes.report import ExperimentView, every_trial_failed, shown_state
from hermes.report.files import trial_files
from hermes.report.results import can_be_best, standings
from hermes.session import STORE_FILE, ExperimentSession, interrupts_between_batches
from hermes.trial import protocol


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One trial, as ``hermes results --format json`` gives it."""

    rank: int  # 1 is best; failed trials rank last
    trial_id: str
    state: str  # a TrialState's value, or "interrupted" (left on a GPU by a run that did not end)
    params: dict[str, Any]
    best: float | None  # the best finite value of the objective it reported; None where none was finite (or none yet)
    best_step: int | None
    final: float | None  # its last reported value
    best_metrics: dict[str, float]  # every metric of the report that gave ``best`` (Ray Tune's best result's metrics)
    steps: int  # the last step it reported
    budget: int
    reports: int
    gpu_seconds: float
    error: str | None
    directory: Path | None  # its files (logs, config, what it wrote to trial_dir())
    # its newest committed checkpoint: of the last step storage.checkpoint_every saved, in storage.uri too (on s3://
    # and such, the URI of the trial's folder there, whose ``latest`` names it)
    checkpoint: Path | str | None


@dataclass(frozen=True, slots=True)
class ExperimentResult:
    """How the experiment ended, and every trial, best first."""

    name: str
    experiment_id: int
    status: str  # finished, cancelled, failed (its sampler raised: ``error`` says why)
    error: str | None  # why it failed, or why every trial failed (printed on stderr too, as ``hermes run`` does)
    store: Path  # the SQLite store; ``hermes status``, ``results`` and ``plot`` read it
    resumed: bool  # it continued an experiment found in the store
    trials: list[TrialResult]

    @property
    def best(self) -> TrialResult | None:
        """The best trial; None when none reported a finite value (a diverged trial is no best), or every one that
        did failed (a failed trial is never the best: ``can_be_best``)."""
        first = self.trials[0] if self.trials else None
        if first is None or first.best is None or not math.isfinite(first.best) or not can_be_best(first.state):
            return None
        return first


def _function_named(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A spec whose ``trial.function`` is the function itself (as Ray Tune's ``Tuner(train)`` takes it), with the
    ``module:function`` its trials import in its place. A function of the script being run (``__main__``) is its
    file's module, which trials import from the script's folder (the workdir, unless the spec gives one): the
    script's ``if __name__ == "__main__":`` keeps them from running it, so the function itself must lie outside that
    guard, as the spec check says. A notebook's has no file (nor has one read from stdin, or exec'd): the spec check
    says to move it into one."""
    trial = spec.get("trial")
    function = trial.get("function") if isinstance(trial, Mapping) else None
    if not callable(function):
        return spec
    if isinstance(function, type):  # its trials would call it with the config alone, and fail each
        raise SpecError(f"trial.function: {function.__qualname__} is a class: {TRIAL_IS_A_FUNCTION}",
                        [("trial.function", "a class")])
    unnamed = _unnamed(function)
    if unnamed is not None:
        fixed = isinstance(function, functools.partial)
        # Ray Tune's with_parameters(train, data=...): a data set put in search.space would be stored with each trial
        hint = ("; load the data it passes (as Ray Tune's with_parameters) at the module's top level or inside the "
                "function, where each trial's process loads it") if fixed else ""
        raise SpecError(f"trial.function: {unnamed} cannot be imported by a trial's process, which imports its "
                        f"function by module and name: give a module's top-level def (def train(config): ...){hint}",
                        [("trial.function", "not importable")])
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):  # its trials would never run it
        raise SpecError(f"trial.function: {function.__qualname__} is an async def: {TRIAL_IS_NOT_ASYNC}",
                        [("trial.function", "an async def")])
    uncallable = _not_called_by_trials(function)
    if uncallable is not None:
        why, problem = uncallable
        raise SpecError(f"trial.function: {function.__qualname__} {why}", [("trial.function", problem)])
    (module, name), named = _home(function), dict(trial)
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None) if module == "__main__" else None
    if module is None or (script is not None and not Path(script).is_file()):
        # exec'd into a namespace of its own, or a script read from stdin (`python - < tune.py`): no file to import
        # it from, as a notebook's function, of which the spec check says so
        return {**spec, "trial": {**named, "function": f"__main__:{function.__name__}"}}
    if name is None:
        raise SpecError(f"trial.function: {function.__qualname__} is not a module's top-level function, which a "
                        "trial's process imports: define it at the top of a module (a decorator that wraps it must "
                        "keep its name with functools.wraps)", [("trial.function", "nested")])
    if script is not None:
        path = Path(script).resolve()
        run_as = getattr(getattr(main, "__spec__", None), "name", None)  # python -m pkg.mod: its real name
        module = run_as or path.stem
        if not all(part.isidentifier() for part in module.split(".")):
            raise SpecError(f"trial.function: the script {path.name} defines it, and a trial's process imports it "
                            f"by the file's name, which {module!r} cannot be: rename the file",
                            [("trial.function", "not importable")])
        root = path.parents[module.count(".")]  # the folder that holds the module, or its top package
        named.setdefault("workdir", str(root))
        _warn_of_guarded_globals(function, name, path)
    file = path if script is not None else getattr(sys.modules.get(module), "__file__", None)
    _refuse_another_copy(function, module, file, named.get("workdir", "."))
    return {**spec, "trial": {**named, "function": f"{module}:{name}"}}


def _same_file(one: Path, other: Path) -> bool:
    """The same file, by whatever path: a link, hard or symbolic, or a second mount of the folder."""
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _refuse_another_copy(function: Any, module: str, file: str | Path | None, workdir: Any) -> None:
    """SpecError where the trial's workdir holds another file of ``module`` than the function's: a trial's process
    imports its module from there first, so the trials ran that file (an older copy beside a notebook, which imported
    the function from ../src) and not the function given, without a word."""
    try:
        folder = (Path.cwd() / Path(workdir).expanduser()).resolve()  # as parse_spec reads it, from the current folder
        expected = Path(file).resolve() if file is not None else None
    except (TypeError, RuntimeError, OSError):  # not a path, or not one here: the spec check says so
        return
    found = workdir_files(f"{module}:_", folder)
    if expected is None or not found or not found[-1].is_file() or _same_file(found[-1], expected):
        return
    root = expected.parents[module.count(".") + (expected.name == "__init__.py")]
    raise SpecError(f"trial.function: {function.__qualname__} is in {expected}, but a trial's process imports "
                    f"{module} from its workdir ({folder}) first, where it is {found[-1]}, another file, which the "
                    f"trials would run in its place: set trial.workdir to {root}, the folder of the one given, or move "
                    f"{found[0]} away", [("trial.function", "another file of its module in trial.workdir")])


def _not_called_by_trials(function: Any) -> tuple[str, str] | None:
    """Why a trial's process, which calls its function with the config alone (``train(config)``) and takes its
    reports from trial.report, cannot run ``function``, and that in short: each of its trials would fail. None where
    it can, or where that cannot be told (a builtin's signature)."""
    if inspect.isgeneratorfunction(function):  # its call makes a generator, which no one iterates
        why = ("is a generator function (it yields), as Ray Tune's old function API took: a trial reports each result "
               "with trial.report(step, metric=value), not yield")
        return why, "a generator function"
    try:  # the function a trial calls: a functools.wraps wrapper that supplies an argument, not the one it wraps
        signature = inspect.signature(function, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind({})
    except TypeError as error:
        why = (f"cannot be called as a trial's process calls it, with the config as its one argument (train(config)): "
               f"{error}; its first parameter takes the config (def train(config): ...), and any other needs a default "
               "(load the data a trial needs at the module's top level or inside the function)")
        return why, "cannot take the config"
    return None


def _home(function: Any) -> tuple[str | None, str | None]:
    """The module whose top level has ``function``, which a trial's process imports, and its name there: where it was
    defined; for a function a decorator wrapped without functools.wraps (``timed.<locals>.wrapper``), where the
    wrapper was bound: the decorator's module, the script being run (a decorator from a utils module), or another
    module it imported (``model.train``). No name for a method, or a function defined in another, which no module
    has at its top level."""
    module = function.__module__
    if "." not in function.__qualname__:
        return module, function.__qualname__
    others = (candidate for candidate in list(sys.modules) if candidate not in (module, "__main__"))
    for candidate in (module, "__main__", *others):  # where it was defined first, then the script, then the rest
        found = sys.modules.get(candidate) if candidate is not None else None
        name = next((key for key, value in vars(found).items() if value is function), None) if found else None
        if name is not None:
            return candidate, name
    return module, None


def _warn_of_guarded_globals(function: Any, name: str, script: Path) -> None:
    """Say where the script's function reads a global that its ``__main__`` block sets: its trials import the script
    afresh and never see that value (Ray Tune's users expect the function's globals to come along)."""
    if not inspect.isfunction(function):
        return
    read = _globals_read(function)
    unseen = sorted(read & set_under_main_guard(script, reached=read))
    if unseen:
        print(f"hermes: warning: trial.function {name} reads {', '.join(unseen)}, which {script.name} "
              f"sets under `if __name__ == \"__main__\":`, a block its trials do not run (they import {script.name} "
              "afresh): set it at the module's top level or in the function", file=sys.stderr, flush=True)


def _globals_read(function: types.FunctionType) -> set[str]:
    """The global names ``function`` reads, and those read by the functions of its module it reads (a helper that
    loads the data)."""
    read: set[str] = set()
    pending = [function.__code__]
    while pending:
        code = pending.pop()
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval not in read:
                read.add(instruction.argval)
                value = function.__globals__.get(instruction.argval)
                if inspect.isfunction(value) and value.__module__ == function.__module__:
                    pending.append(value.__code__)
        pending += [constant for constant in code.co_consts if isinstance(constant, types.CodeType)]
    return read


def _driver_script() -> tuple[str, ...]:
    """The command line of the script being run (``python tune.py --scale 100``, ``python -m pkg.tune``), which its
    trials see as sys.argv, as every module of this process did (one that parses it at its import); its file first
    and absolute, since a trial runs in its own workdir; nothing for a notebook, ``python -c`` or a script read from
    stdin."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if script is None or not Path(script).is_file():
        return ()
    return (str(Path(script).resolve()), *sys.argv[1:])


def _unnamed(function: Any) -> str | None:
    """What ``function`` is where no module has it under a name of its own (a trial's process imports it by one):
    a lambda, a functools.partial, an object with __call__; None for a def."""
    if isinstance(function, functools.partial):
        return "a functools.partial"
    if not hasattr(function, "__qualname__"):
        return f"a callable {type(function).__name__} object"
    if getattr(function, "__name__", None) == "<lambda>":
        return "a lambda"
    return None


def run(spec: str | Path | Mapping[str, Any], *, name: str | None = None) -> ExperimentResult:
    """Run the experiment ``spec`` describes to its end, or continue it, and return its results.

    ``spec``: the path of a YAML spec, or the spec as a mapping (its relative paths start at the current
    directory; its ``trial.function`` may be the function itself, defined in a module of the trial's workdir). A
    policy, stopper or searcher of one's own (``module:Class``) is looked for in the trial's workdir first, as
    ``hermes run`` looks. ``name``: in place of the spec's own (``hermes run --name``). A spec that is wrong raises
    SpecError naming the fields; Ctrl-C ends the run between two of its steps, records it interrupted and
    raises KeyboardInterrupt (calling ``run`` again continues it); a full disk raises NoSpaceError.
    """
    if os.environ.get(protocol.ENV_TRIAL_ID) or os.environ.get(protocol.ENV_WORKER_CHANNEL):
        raise HermesError(
            "hermes.run was called in a trial's own process: the module that defines the trial calls it when it is "
            "imported, and each trial imports that module, so each would start an experiment of its own; put the "
            "call under `if __name__ == \"__main__\":`")
    session: ExperimentSession | None = None
    started = False  # session.run() was called, which lets the experiment go where it ends before it runs anything
    previous = set_driver_script(_driver_script())
    try:
        # Until the run's own handling takes Ctrl-C, it waits for each step of the set-up: its first imports (of
        # Optuna and numpy as the spec's sampler is checked, of Ray as the session starts it), cut short, broke every
        # later hermes.run of the process
        with sigint_held():
            if isinstance(spec, Mapping):
                spec = _function_named(spec)
                checked = parse_spec({**spec, **({"name": name} if name is not None else {})}, base_dir=Path.cwd(),
                                     plugins_beside_trial=True)
            else:
                checked = load_spec(spec, name)
        with sigint_held():
            session = ExperimentSession(checked)
        with interrupts_between_batches(session):
            started = True
            outcome = session.run()
    except BaseException:
        if session is not None:
            if not started:  # Ctrl-C held through the set-up: a new experiment is recorded interrupted
                session.abandon()
            session.store.close()  # the traceback keeps the session: a notebook's held the store's files open
        raise
    finally:
        set_driver_script(previous)
    with closing(session.store) as store:
        view = ExperimentView.load(store, store.experiment(outcome.experiment_id))
    experiment_dir = checked.storage_dir / checked.name
    saved = {trial.trial_id: trial.checkpoint_step for trial in view.trials}
    trials = []
    for standing in standings(view):
        files = trial_files(experiment_dir, standing.trial_id, saved_step=saved[standing.trial_id],
                            recorded_step=standing.steps)
        trials.append(TrialResult(
            rank=standing.rank, trial_id=standing.trial_id, state=shown_state(standing.state, live=False),
            params=dict(standing.params), best=standing.best, best_step=standing.best_step, final=standing.final,
            best_metrics=dict(standing.best_metrics), steps=standing.steps, budget=standing.budget, reports=standing.reports, gpu_seconds=standing.gpu_seconds,
            error=standing.error,
            directory=files.directory, checkpoint=files.checkpoint,
        ))
    error = session.failure or every_trial_failed(view.trials)
    if error is not None and not outcome.ran:  # the error of its last run, not of the code as it is now
        more = "" if session.failure else ", or raise search.trials to add trials to this one"  # not past its failure
        error += (f" ({checked.name} had already ended, so nothing ran: this error is its earlier run's, and an ended "
                  "experiment's failed trials are not run again; to run changed code, run it as a new experiment "
                  f"(hermes.run(..., name={f'{checked.name}-2'!r})){more})")
    if error is not None:  # where a script's user looks, as `hermes run` says it
        print(f"hermes: error: {error}", file=sys.stderr, flush=True)
    return ExperimentResult(checked.name, outcome.experiment_id, outcome.status.value, error,
                            checked.storage_dir / STORE_FILE, outcome.resumed, trials)
