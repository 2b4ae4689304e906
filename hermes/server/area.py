"""A user's area on the server: every file a submitted spec names must lie inside it.

What a spec names: the trial's workdir; the storage dir (checkpoints, logs); the package folders
and module file its trial function is imported from, where the workdir holds them; and the paths
of a command line: its program when given with a folder (``./train.sh``), and every other argument,
alone or after ``--option=``, read as a path from the workdir, filled with each string value its
placeholders can take. Paths are resolved (links followed, ``..`` applied), so a link in the area
that points outside is refused like the outside path itself. A program named without a folder
(``python``) is the server's, found on its PATH, as a function's module may be an installed package.

What this cannot do: confine what a trial's code opens once it runs, since trials run as the
server's OS user. Where members' code is not trusted, isolate them below Hermes (an OS user per
member, containers).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from hermes.experiment import ExperimentSpec
from hermes.experiment.command import Placeholder, parse_template
from hermes.experiment.locate import installed_files, workdir_files
from hermes.experiment.spec import Choice

Problem = tuple[str, str]  # (dotted field path, what is wrong), as SpecError.problems
MAX_FILLINGS = 10_000  # ways to fill one argument of a command line that are checked; more is refused


def document_problems(data: dict[str, Any]) -> list[Problem]:
    """What must be refused before the spec is even validated, since validating it would act on it.

    Validation builds the Optuna sampler a spec names by class path, which imports its module in
    the server's own process: only Optuna's samplers may be named, never a module found elsewhere; and so
    it loads a policy, stopper or searcher of one's own (``module:Class``): those are refused.
    Non-finite numbers (the JSON parser reads ``Infinity`` and ``NaN``) are refused wherever they
    are: in free-form parameters they would be stored as null, and the pool would read another spec.
    So are NUL characters, which no path, command argument or environment variable can carry, and lone
    surrogates, which no UTF-8 text can (the reply that echoed one failed after the experiment was stored).
    """
    problems = _value_problems(data)
    search = data.get("search")
    sampler = search.get("sampler") if isinstance(search, dict) else None
    class_path = sampler.get("optuna") if isinstance(sampler, dict) else None
    if class_path is not None and not (isinstance(class_path, str) and class_path.startswith("optuna.")):
        problems.append(("search.sampler.optuna", f"{class_path!r}: the server builds only Optuna's own "
                                                  "samplers (a class of the optuna package, like "
                                                  "optuna.samplers.NSGAIISampler)"))
    for field, name in _plug_in_names(data, sampler):
        if isinstance(name, str) and ":" in name:
            problems.append((field, f"{name!r}: the server runs only its own policies, stoppers and searchers, "
                                    "by name; a class of one's own (module:Class) would be imported in its process"))
    return problems


def _plug_in_names(data: dict[str, Any], sampler: Any) -> list[tuple[str, Any]]:
    """The names of the spec that may be a plug-in's ``module:Class`` (``hermes.plugins.load_class``), by field."""
    policy = data.get("policy")
    policy = policy if isinstance(policy, dict) else {}
    stopper = policy.get("stopper")
    found = [("policy.name", policy.get("name"))]
    if isinstance(stopper, dict):
        found.append(("policy.stopper.name", stopper.get("name")))
    if isinstance(sampler, dict):
        found.append(("search.sampler.name", sampler.get("name")))
    else:
        found.append(("search.sampler", sampler))
    return found


def _value_problems(data: dict[str, Any]) -> list[Problem]:
    """Non-finite numbers and text no file or reply can hold, in document order; walked with a stack of its own,
    so that no nesting can exhaust Python's."""
    problems: list[Problem] = []
    unread: list[tuple[str, Any]] = [("", data)]  # (dotted path, value) still to read, the last first
    while unread:
        path, value = unread.pop()
        if isinstance(value, float) and not math.isfinite(value):
            problems.append((path, "must be a finite number"))
        elif isinstance(value, str) and (problem := text_problem(value)) is not None:
            problems.append((path, problem))
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            named = []
            for key, item in items:
                key = str(key)
                if (problem := text_problem(key)) is not None:
                    key = key.encode("utf-8", "backslashreplace").decode().replace("\0", "\\x00")
                    problems.append((f"{path}.{key}" if path else key, f"its name {problem[5:]}"))
                    continue
                named.append((f"{path}.{key}" if path else key, item))
            unread.extend(reversed(named))
    return problems


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be taken: a NUL character (no path, command argument or environment variable carries
    one), or a lone surrogate (JSON's ``"\\ud800"``: no UTF-8 file, database or reply can hold it)."""
    if "\0" in text:
        return "must not hold a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be Unicode text: it holds a lone surrogate (\\ud800 to \\udfff)"
    return None


def spec_problems(spec: ExperimentSpec, area: Path, root: Path, folder: Path | None = None) -> list[Problem]:
    """The fields of ``spec`` that name a file outside ``area`` (resolved), or that the server cannot honour.

    ``spec`` may be the document alone (``parse_spec`` without a base dir): its paths are read
    from ``folder`` (default: the area) here, so that they are confined before validation looks at
    any file they name. ``root``: the server's root, holding every user's area; no installed module
    may come from it.
    """
    area, root = area.resolve(), root.resolve()
    base = area if folder is None else folder
    problems: list[Problem] = []

    def confine(field: str, resolved: Path, what: str = "") -> bool:
        if resolved.is_relative_to(area):
            return True
        problems.append((field, f"{what}{resolved}, outside your area {area} on the server"))
        return False

    if spec.engine != "local":
        problems.append(("engine", f"{spec.engine!r}: the server runs every experiment in its own pool (local)"))
    if spec.storage.uri is not None:
        problems.append(("storage.uri", "the server keeps checkpoints in storage.dir, inside your area"))
    if confine("storage.dir", (base / spec.storage.dir).resolve(), "is "):
        # where the experiment's files go: a link there to another user's experiment had this one written into it
        confine("storage.dir", (base / spec.storage.dir / spec.name).resolve(), f"holds {spec.name}, a link to ")
    workdir = (base / spec.trial.workdir).resolve()
    confine("trial.workdir", workdir, "is ")
    if not workdir.is_relative_to(area):
        return problems  # whatever the trial names from there is outside too
    if spec.trial.function is not None:
        found = workdir_files(spec.trial.function, workdir)
        for path in found:
            if not confine("trial.function", path.resolve(), f"{path} (imported from the workdir) is "):
                break  # one is enough: the rest lie below it
        if not found and any(path.resolve().is_relative_to(root) for path in installed_files(spec.trial.function)):
            problems.append(("trial.function", "its module is found on the server's Python path inside the "
                                               f"server's root {root}; put it in your area and name it from there"))
    if spec.trial.command is not None:
        for index, word in enumerate(parse_template(spec.trial.command).words):
            fillings = _fillings(word, spec)
            if fillings is None:
                problems.append(("trial.command", f"argument {index} can be filled in more than {MAX_FILLINGS} "
                                                  "ways, too many to check that none names a file outside your area"))
                continue
            named = ((text, path) for text in fillings for path in _paths(text, index, workdir))
            for text, path in named:
                if not confine("trial.command", path, f"argument {index} ({text!r}) names "):
                    break  # one per argument
    return problems


def _fillings(word: tuple[str | Placeholder, ...], spec: ExperimentSpec) -> list[str] | None:
    """Every text ``word`` can become for the spec's search space; None when there are too many."""
    choices: list[list[str]] = []
    for part in word:
        if isinstance(part, str):
            choices.append([part])
            continue
        parameter = spec.search.space[part.name]
        # a number holds no path separator: one stands for all
        choices.append([str(v) for v in parameter.values] if isinstance(parameter, Choice) else [str(parameter.low)])
        if math.prod(map(len, choices)) > MAX_FILLINGS:
            return None
    return ["".join(parts) for parts in itertools.product(*choices)]


def _paths(text: str, index: int, workdir: Path) -> list[Path]:
    """The paths one argument names, read from the workdir (where the trial runs), resolved."""
    if index == 0:  # the program: found on PATH unless given with a folder; it may be a link (a venv's python)
        if "/" not in text:
            return []
        path = workdir / text
        return [path.resolve()] if path.name in ("", "..") else [path.parent.resolve() / path.name]
    texts = [text]
    if text.startswith("-") and "=" in text:
        texts.append(text.partition("=")[2])
    return [(workdir / one).resolve() for one in texts if one]
