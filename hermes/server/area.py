"""A user's area on the server: every file a submitted spec names must lie inside it.

What a spec names: the trial's workdir; the storage dir (checkpoints, logs); the package folders
and module file its trial function is imported from, where the workdir holds them; and the paths
of a command line: its program when given with a folder (``./train.sh``), and every other argument,
alone or after ``--option=``, read as a path from the workdir, filled with each string value its
placeholders can take (a line that can be filled in more than MAX_FILLINGS ways, all its arguments together, is
refused). Paths are resolved (links followed, ``..`` applied), so a link in the area
that points outside is refused like the outside path itself. A program named without a folder
(``python``) is the server's, found on its PATH, as a function's module may be an installed package.
A refusal names the field and the path as the spec wrote it, never where a link leads: the target of a
link (``/proc/<pid>/fd/N`` is one) would tell one user where another's files are. A path the server
cannot look at (links that loop, a name too long) is refused alike, naming its field. A workdir or
storage dir that starts with ``~`` is refused: a spec reads it as the home of whoever runs it, here the
server's account.

What a spec's sampler may cost (``sampler_cost_problems``): the server builds and asks it in its own process, where
every user's experiments wait for each ask, so the arguments that set an Optuna sampler's work or memory are bounded,
as are the spaces of the samplers that list every value. ``hermes run`` takes any: there the cost is the user's own.

What this cannot do: confine what a trial's code opens once it runs, since trials run as the
server's OS user. Where members' code is not trusted, isolate them below Hermes (an OS user per
member, containers).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hermes.experiment import ExperimentSpec
from hermes.experiment.command import Placeholder, parse_template
from hermes.experiment.locate import installed_files, workdir_files
from hermes.experiment.spec import MAX_TRIALS, Choice
from hermes.search import OPTUNA_SAMPLERS

Problem = tuple[str, str]  # (dotted field path, what is wrong), as SpecError.problems
MAX_FILLINGS = 10_000  # texts a command line's arguments can become, all together, that are checked; more is refused
# The largest value of each Optuna sampler argument that sets how much an ask does or how much the sampler holds. By
# name, whatever class path reached the sampler (no other Optuna sampler takes these names). Measured with Optuna 5.1,
# 3 parameters:
SAMPLER_ARG_LIMITS = {
    # TPE: candidates drawn and scored per parameter at each ask (Optuna's default 24). After 200 trials an ask took
    # 0.1 s with 1,000 and 0.4 s with 10,000; with 300,000 the spec check took 39 s
    "n_ei_candidates": 1_000,
    # CMA-ES: solutions per generation (Optuna's default 4 + 3 ln n: 7). An ask took 12 ms with 10,000; the optimizer,
    # made once the startup trials are done, lists a weight per solution: 10**7 took 7 s and 0.5 GB
    "popsize": 10_000,
    # NSGA-II and NSGA-III: trials per generation (Optuna's default 50)
    "population_size": 10_000,
    # NSGA-III: divisions of its reference points (Optuna's default 3), each point a tuple of this many: with the one
    # objective Hermes gives a study there is one point whatever the value, so no search needs more
    "dividing_parameter": 100,
}
# GPSampler lays out every value of an int range at each ask, 16 bytes each at the peak: GP_MAX_INT_VALUES (2**26)
# bounds that to 1 GiB anywhere, an ask of which took 1.3 GB and a second; the server's one process takes 16 MiB
SERVER_GP_MAX_INT_VALUES = 2**20


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
    if isinstance(sampler, dict) and isinstance(search, dict):
        problems.extend(sampler_cost_problems(sampler, search.get("space")))
    return problems


def sampler_cost_problems(sampler: dict[str, Any], space: Any) -> list[Problem]:
    """What an Optuna sampler (``search.sampler`` as the document gives it) would cost the server past its bounds.

    The server builds it and asks it ``CHECK_ASKS`` times (a longer startup than ``CHECK_STARTUP`` through a throwaway
    sampler built alike but for that one, so its length costs nothing) in a request thread, then in the pool's one loop,
    whose every ask all users' experiments wait out: a TPE of 300,000 candidates made another user's 1-second experiment
    take 86 s. Refused: an argument of ``SAMPLER_ARG_LIMITS`` over its bound; a GridSampler whose ``search_space`` has
    more combinations than an experiment may have trials (``MAX_TRIALS``, as Hermes's own grid), since it lists them all
    when built (3 parameters of 200 values, a 3 KB spec, grew the server by 560 MB); a BruteForceSampler whose space has
    more, since it lists each parameter's values as it asks (an int range of 10**7 values took 58 s and 1.3 GB); a
    GPSampler's int range of more than ``SERVER_GP_MAX_INT_VALUES`` values.
    """
    problems: list[Problem] = []
    args = sampler.get("args")
    args = args if isinstance(args, dict) else {}
    for name, limit in SAMPLER_ARG_LIMITS.items():
        value = _number(args.get(name))
        if value is not None and value > limit:
            problems.append((f"search.sampler.args.{name}", (f"{args[name]!r}: the server takes {limit:,} at most, "
                                                             "as it asks every user's sampler in one process")))
    grid = args.get("search_space")
    if isinstance(grid, dict) and _combinations(map(_length, grid.values())) > MAX_TRIALS:
        problems.append(("search.sampler.args.search_space", (
            f"has more than {MAX_TRIALS:,} combinations, the most trials an experiment may have (as sampler grid's), "
            "and GridSampler lists every one in the server's process")))
    name = sampler.get("name")
    path = sampler.get("optuna", OPTUNA_SAMPLERS.get(name) if isinstance(name, str) else None)
    sampler_class = path.rpartition(".")[2] if isinstance(path, str) else None  # the class, by any path to it
    parameters = space if isinstance(space, dict) else {}
    if sampler_class == "BruteForceSampler" and _combinations(map(_values, parameters.values())) > MAX_TRIALS:
        problems.append(("search.space", (f"has more than {MAX_TRIALS:,} combinations, the most trials an experiment "
                                          "may have, and BruteForceSampler lists each parameter's values in the "
                                          "server's process")))
    if sampler_class == "GPSampler":
        for param, parameter in parameters.items():
            if isinstance(parameter, dict) and parameter.get("type") == "int" and (
                    _values(parameter) > SERVER_GP_MAX_INT_VALUES):
                problems.append((f"search.space.{param}", (
                    f"holds {_values(parameter):,} values, and GPSampler lays out every one at each proposal: the "
                    f"server takes {SERVER_GP_MAX_INT_VALUES:,} at most (give it a step, or make it a uniform)")))
    return problems


def _number(value: Any) -> int | float | None:
    """``value`` as the number it is or spells (text: ``1e6``, as the spec reads a sampler's arguments); None for
    anything else, which validation refuses or the sampler takes as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _length(values: Any) -> int:
    """How many values GridSampler takes from one entry of its search_space: it iterates whatever it is given."""
    return len(values) if isinstance(values, (list, str, dict)) else 1


def _values(parameter: Any) -> int:
    """How many values a parameter of the space (as the document gives it) takes: an int range's, a choice's or a
    grid's; 1 for anything else (a fixed value, or a float range, which the samplers that list values refuse)."""
    if not isinstance(parameter, dict):
        return 1
    kind, low, high, step = (parameter.get(key) for key in ("type", "low", "high", "step"))
    step = 1 if step is None else step
    if kind in ("choice", "grid") and isinstance(parameter.get("values"), list):
        return len(parameter["values"])
    ints = all(isinstance(value, int) and not isinstance(value, bool) for value in (low, high, step))
    if kind == "int" and ints and step >= 1:
        return max((high - low) // step + 1, 1)
    return 1


def _combinations(counts: Iterable[int]) -> int:
    """The product of ``counts``, counted up to one more than MAX_TRIALS: a long product would be a number too long to
    write."""
    product = 1
    for count in counts:
        product *= count
        if product > MAX_TRIALS:
            return MAX_TRIALS + 1
    return product


def _plug_in_names(data: dict[str, Any], sampler: Any) -> list[tuple[str, Any]]:
    """The names of the spec that may be a plug-in's ``module:Class`` (``hermes.plugins.load_class``), by field."""
    policy = data.get("policy")
    if isinstance(policy, dict):
        stopper = policy.get("stopper")
        found = [("policy.name", policy.get("name"))]
        if isinstance(stopper, dict):
            found.append(("policy.stopper.name", stopper.get("name")))
        else:
            found.append(("policy.stopper", stopper))  # a bare name (stopper: median)
    else:
        found = [("policy", policy)]  # a bare name (policy: hermes), as the spec takes one
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
                    problems.append((f"{path}.{key}" if path else key, f"its name {problem}"))
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

    def confine(field: str, path: Path, shown: str, program: bool = False) -> bool:
        problem = place_problem(path, area, program)
        if problem is not None:
            problems.append((field, f"{shown} {problem}"))
        return problem is None

    def not_home(field: str, written: str) -> bool:
        """The spec reads a leading ``~`` as the home of whoever runs it: here the server's account, not the user."""
        home = written.startswith("~")
        if home:
            problems.append((field, f"{written!r} starts with ~, the home of the server's account, not yours: "
                                    "name a folder in your area"))
        return not home

    if spec.engine != "local":
        problems.append(("engine", f"{spec.engine!r}: the server runs every experiment in its own pool (local)"))
    if spec.storage.uri is not None:
        problems.append(("storage.uri", "the server keeps checkpoints in storage.dir, inside your area"))
    storage = spec.storage.dir
    if not_home("storage.dir", storage) and confine("storage.dir", base / storage, repr(storage)):
        # where the experiment's files go: a link there to another user's experiment had this one written into it
        confine("storage.dir", base / storage / spec.name, f"{storage!r} holds {spec.name}, which")
    written = spec.trial.workdir
    if not (not_home("trial.workdir", written) and confine("trial.workdir", base / written, repr(written))):
        return problems  # whatever the trial names from there is outside too
    workdir = (base / written).resolve()
    if spec.trial.function is not None:
        found = workdir_files(spec.trial.function, workdir)
        for path in found:
            if not confine("trial.function", path, f"{str(path.relative_to(workdir))!r} (imported from the workdir)"):
                break  # one is enough: the rest lie below it
        if not found and any(path.resolve().is_relative_to(root) for path in installed_files(spec.trial.function)):
            problems.append(("trial.function", "its module is found on the server's Python path inside the "
                                               f"server's root {root}; put it in your area and name it from there"))
    if spec.trial.command is not None:
        words = parse_template(spec.trial.command).words
        # bounded over the whole line, not per argument: a placeholder repeated in many arguments multiplied the checks
        counts = [_filling_count(word, spec) for word in words]
        if sum(counts) > MAX_FILLINGS:
            most = max(range(len(words)), key=counts.__getitem__)
            if counts[most] > MAX_FILLINGS:
                ways = f"more than {MAX_FILLINGS} ways (argument {most} alone)"
            else:
                widest = f" (argument {most} in {counts[most]})" if counts[most] > 1 else ""
                ways = f"{sum(counts)} ways in all{widest}"
            problems.append(("trial.command", f"its {len(words)} arguments can be filled in {ways}, too many to check "
                                              f"that none names a file outside your area: the server checks "
                                              f"{MAX_FILLINGS} at most"))
            return problems
        trial_dir = str(base / storage / spec.name / "trials" / "0")  # where {trial_dir} leads: each trial's alike
        for index, word in enumerate(words):
            named = ((text, path) for text in _fillings(word, spec, trial_dir) for path in _paths(text, index, workdir))
            for text, path in named:
                if not confine("trial.command", path, f"argument {index} ({text!r})", program=index == 0):
                    break  # one per argument
    return problems


def place_problem(
    path: Path, area: Path, program: bool = False, *, named: str = "your area on the server"
) -> str | None:
    """Why ``path`` is refused: it resolves outside ``area`` (resolved), or the server cannot look at it (links
    that loop, a name too long, no permission); None where it lies inside. Never where a link leads.
    ``program``: a command's program, whose folders are resolved but not the file (a venv's python is a link).
    ``named``: what the refusal calls ``area`` (a pool confines what lies below an experiment's folder to it)."""
    try:
        resolved = path.parent.resolve() / path.name if program and path.name not in ("", "..") else path.resolve()
        if not resolved.is_relative_to(area):
            return f"leads outside {named}"
        _look_at(resolved)
    except RuntimeError:  # Path.resolve's symlink loop before Python 3.13 (from 3.13, lstat's ELOOP below)
        return "cannot be read on the server: its links go round in a loop"
    except OSError as error:
        return f"cannot be read on the server: {error.strerror or type(error).__name__}"
    return None


def _look_at(path: Path) -> None:
    """Raise the OSError of a path the server cannot use (a name too long, a folder it may not search); one not
    made yet is fine. ``Path.resolve`` passes over those, and validation met them later, outside any field."""
    try:
        path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        pass


def _filling_count(word: tuple[str | Placeholder, ...], spec: ExperimentSpec) -> int:
    """How many texts ``word`` can become (``_fillings``), counted up to one more than MAX_FILLINGS: a long product
    would be a number too long to write."""
    count = 1
    for part in word:
        parameter = None if isinstance(part, str) else spec.search.space.get(part.name)  # None: {trial_dir}
        count *= len(parameter.values) if isinstance(parameter, Choice) else 1
        if count > MAX_FILLINGS:
            return MAX_FILLINGS + 1
    return count


def _fillings(word: tuple[str | Placeholder, ...], spec: ExperimentSpec, trial_dir: str) -> list[str]:
    """Every text ``word`` can become for the spec's search space, ``{trial_dir}`` (unless a parameter is so named)
    becoming ``trial_dir``."""
    choices: list[list[str]] = []
    for part in word:
        if isinstance(part, str):
            choices.append([part])
            continue
        if part.name not in spec.search.space:  # validation let only {trial_dir} through
            choices.append([trial_dir])
            continue
        parameter = spec.search.space[part.name]
        # a number holds no path separator: one stands for all
        choices.append([str(v) for v in parameter.values] if isinstance(parameter, Choice) else [str(parameter.low)])
    return ["".join(parts) for parts in itertools.product(*choices)]


def _paths(text: str, index: int, workdir: Path) -> list[Path]:
    """The paths one argument names, read from the workdir (where the trial runs). The program (argument 0) is
    found on PATH unless given with a folder."""
    if index == 0:
        return [workdir / text] if "/" in text else []
    texts = [text]
    if text.startswith("-") and "=" in text:
        texts.append(text.partition("=")[2])
    return [workdir / one for one in texts if one]
