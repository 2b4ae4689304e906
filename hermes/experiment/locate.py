"""Find a trial's ``module:function`` without running any of its code.

Importing the module to check would run its top level: importing torch (seconds), loading a data
set, creating a GPU context, in the process that validates the spec or in a subprocess whose
timeout would then make validation flaky on a busy machine. Instead the module is located file by
file as the import system would locate it (the trial's workdir first, as in the worker; namespace
packages, folders without ``__init__.py``, nested too), and the function is looked up in the module's
syntax tree. What cannot be decided that way (a C extension, a namespace package named as the module,
a module that makes names at run time) is accepted: only certain misses fail.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import threading
from collections.abc import Collection, Iterator
from pathlib import Path

from hermes.local.system import trial_python_path

# CPython 3.11's parser is not safe in two threads at once ("SystemError: AST constructor recursion depth
# mismatch"): a server checks a user's spec while its pool checks another's.
_PARSING = threading.Lock()
_DYNAMIC = {"globals", "vars", "setattr", "__getattr__"}  # ways a module can bind names ast cannot see
# Why a class (a Ray Tune Trainable, say) cannot be a trial: its process would call it with the config alone.
TRIAL_IS_A_FUNCTION = ("a trial is a function that takes the config and reports through hermes.trial "
                       "(def train(config): ...), not a class such as Ray Tune's Trainable")
# Why an ``async def`` cannot be a trial: its process calls it and never awaits what that returns, so it never runs.
TRIAL_IS_NOT_ASYNC = ("a trial's process calls its function without awaiting it, so an async def's body would never "
                      "run: make it a plain def (def train(config): ...), with asyncio.run inside if it needs a loop")


def missing_function(target: str, workdir: Path) -> str | None:
    """Why ``package.module:function`` cannot be found from ``workdir``; None when it can (or may) be."""
    module_name, _, name = target.partition(":")
    parts = module_name.split(".")
    if parts[0] == "__main__":
        return ("a trial's function runs in a process of its own, which imports it from a module: not from "
                "__main__ (a script run directly, a notebook's cell); move it into a .py file of trial.workdir")
    spec = _find_spec(parts[0], [str(workdir)])
    if spec is not None and parts[0] in sys.stdlib_module_names and parts[0] in sys.modules:  # loaded by then
        return (f"{spec.origin} has the name of Python's own module {parts[0]!r}, which a trial's process imports "
                "before it, so it would never import this one: rename it")
    elsewhere = spec is None
    if elsewhere:
        try:  # installed packages, editable installs and built-ins; a top-level name imports nothing
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            spec = None
    if spec is None:
        return f"no module {parts[0]!r} in the trial's workdir ({workdir}) or on Python's path"
    only_here = _folder_trials_lack(spec, parts[0], workdir) if elsewhere else None
    if only_here is not None:
        return (f"no module {parts[0]!r} in the trial's workdir ({workdir}) or on Python's path: it is in "
                f"{only_here}, which this process has on its path (its program's folder, or one added to sys.path) "
                "and a trial's process does not; set trial.workdir to that folder")
    for depth in range(1, len(parts)):
        package, locations = ".".join(parts[:depth]), spec.submodule_search_locations
        if locations is None:
            return f"{package} ({spec.origin}) is a module, not a package, so it has no module {parts[depth]!r}"
        spec = _find_spec(".".join(parts[: depth + 1]), list(locations))
        if spec is None:
            return f"package {package} ({', '.join(locations)}) has no module {parts[depth]!r}"
    origin = spec.origin
    if origin is None or not origin.endswith(".py") or not Path(origin).is_file():
        return None
    try:
        tree = _parsed(Path(origin).read_bytes(), origin)
    except SyntaxError as error:
        return f"{origin} does not parse: {error.msg} (line {error.lineno})"
    except OSError as error:
        return f"cannot read {origin}: {error.strerror or error}"
    bound, certain, guarded = _top_level_names(tree.body)
    if certain and _only_defined_by(tree.body, name, ast.ClassDef):
        return f"module {module_name} ({origin}) defines {name!r} as a class: {TRIAL_IS_A_FUNCTION}"
    if certain and _only_defined_by(tree.body, name, ast.AsyncFunctionDef):
        return f"module {module_name} ({origin}) defines {name!r} as an async def: {TRIAL_IS_NOT_ASYNC}"
    if certain and _only_defined_by(tree.body, name, ast.FunctionDef):
        last = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name][-1]
        uncallable = _not_called_by_trials(last)
        if uncallable is not None:
            return f"module {module_name} ({origin}) defines {name!r}, which {uncallable}"
    if name in bound or not certain:
        return None
    if name in _top_level_names(guarded)[0]:
        return (f"module {module_name} ({origin}) defines {name!r} only under `if __name__ == \"__main__\":`, whose "
                "body a trial's process never runs (it imports the module): define it at the module's top level")
    functions = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    close = difflib.get_close_matches(name, functions, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (its functions: {', '.join(functions) or 'none'})"
    return f"module {module_name} ({origin}) defines no {name!r}{hint}"


def _parsed(source: bytes, filename: str) -> ast.Module:
    """``ast.parse``, one thread at a time (``_PARSING``)."""
    with _PARSING:
        return ast.parse(source, filename=filename)


def set_under_main_guard(script: Path, reached: Collection[str] = frozenset()) -> set[str]:
    """The module names a script's ``if __name__ == "__main__":`` sets: a trial's process imports the script without
    running that block, so what it sets there is not there. Those are the names the block assigns (its imports left
    out), those bound through ``global`` by the script's functions that it calls (by name, and those these call,
    each once: ``main()``), and those the block itself changes in place (``_changed_in_place``). A function named in
    ``reached``, one the trial's function calls too (a loader caching its data in a global), is left out: the trials
    run it as well. So are the in-place changes of the functions the block calls: the name is bound at the top level,
    where they may as well set it up (``logger.propagate = False`` in ``main()``). A name the top level imports and
    the block only reuses as a loop's or a ``with``'s target (``for trial in result.trials:``) is left out too: it
    hands the trials no value. One the block assigns (``lr = 0.5`` over an imported ``lr``) is not: the trials see
    the imported one. Empty where the file cannot be read."""
    try:
        tree = _parsed(script.read_bytes(), str(script))
    except (SyntaxError, ValueError, OSError):
        return set()
    imports = (ast.Import, ast.ImportFrom)
    guarded = _top_level_names(tree.body)[2]
    imported = _top_level_names([node for node in tree.body if isinstance(node, imports)])[0]
    set_there = _top_level_names([node for node in guarded if not isinstance(node, imports)])[0]
    for function in _functions_called(guarded, [*tree.body, *guarded], reached):
        set_there |= _bound_globally(function)
    # A module's state changed in place (os.environ, sys.path) is no value of the script's: its trials inherit the
    # environment, and a warning on every function that reads os would be noise. A name imported from one
    # (from settings import SETTINGS) is the script's value as any other.
    modules = {alias.asname or alias.name.split(".")[0]
               for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {alias.asname or alias.name for node in ast.walk(tree)  # from os import environ: the process's state
                if isinstance(node, ast.ImportFrom) and node.module in _PROCESS_STATE for alias in node.names}
    return (set_there - (imported - _assigned(guarded))) | (_changed_in_place(guarded) - modules)


# Modules whose objects hold the process's own state, which trials inherit (os.environ) or need not (sys.path)
_PROCESS_STATE = frozenset({"os", "sys"})

# Methods that change a list, dict or set in place: ``SETTINGS.update(...)`` under the guard sets what trials lack.
_CHANGING_METHODS = frozenset({"append", "extend", "insert", "update", "setdefault", "add", "clear", "pop",
                               "popitem", "remove", "discard"})


def _changed_in_place(statements: list[ast.stmt]) -> set[str]:
    """The names whose value ``statements`` change without binding them: ``X[k] = v``, ``X.attr = v`` (``+=``,
    ``del`` too), a call of one of ``_CHANGING_METHODS`` (``X.update(...)``), nested too (``X["a"]["b"] = v`` changes
    ``X``). A heuristic, by the method's name alone: ``X.add(...)`` of an object of any type counts."""
    names: set[str] = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                root = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _CHANGING_METHODS:
                root = node.func.value
            else:
                continue
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name):
                names.add(root.id)
    return names


def _functions_called(
    statements: list[ast.stmt], body: list[ast.stmt], skipped: Collection[str]
) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions defined in ``body`` that ``statements`` call by their name, and those these call, each once;
    none named in ``skipped``, nor what only these call."""
    functions = {node.name: node for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name not in skipped}
    called: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    pending: list[ast.AST] = list(statements)
    while pending:
        for node in ast.walk(pending.pop()):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions \
                    and node.func.id not in called:
                called[node.func.id] = functions[node.func.id]
                pending.append(functions[node.func.id])
    return list(called.values())


def _bound_globally(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The module names ``function`` binds through ``global`` (a ``global`` of a name it only reads binds none)."""
    declared = {name for node in ast.walk(function) if isinstance(node, ast.Global) for name in node.names}
    bound = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {alias.asname or alias.name.split(".")[0] for node in ast.walk(function)
              if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    return bound & declared


def _assigned(statements: list[ast.stmt]) -> set[str]:
    """The names that assignments among ``statements`` (and the blocks inside them) bind: ``x = ...``, ``x: T = ...``,
    ``x += ...``, not a loop's or a ``with``'s target."""
    names: set[str] = set()
    for statement in statements:
        for node in ast.walk(statement):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            names.update(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
    return names


def _folder_trials_lack(spec: importlib.machinery.ModuleSpec, name: str, workdir: Path) -> Path | None:
    """The folder on this process's path where ``spec`` was found, if a trial's process does not have it: the
    calling script's (the current one for ``python -c`` or a notebook), or one its code added (a notebook's
    ``sys.path.append("../src")``). The spec check found the module there, and every trial then failed on import.
    Where it is, a trial's process is asked too: an editable install's finder (a .pth's) may serve it there."""
    python_path = trial_python_path()
    shared = {Path(entry).resolve() for entry in _trial_path(python_path)}
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        if folder not in shared and _lies_in(spec, folder):
            return None if _trials_find(name, str(workdir), python_path) else folder
    return None


@functools.lru_cache(maxsize=64)
def _trials_find(name: str, workdir: str, python_path: str) -> bool:
    """Whether a fresh interpreter in ``workdir``, with the environment trials get, finds the top-level module
    ``name``; True where it cannot be asked (no refusal on a guess)."""
    try:
        asked = subprocess.run(
            [sys.executable, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)",
             name],
            cwd=workdir, env={**os.environ, "PYTHONPATH": python_path}, capture_output=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return True
    return asked.returncode != 1


@functools.lru_cache(maxsize=4)
def _trial_path(python_path: str) -> tuple[str, ...]:
    """Where a trial's process imports from besides its workdir, asked of a fresh interpreter with the environment
    trials get (``hermes.local.system.slot_environment``: PYTHONPATH, this source checkout's hermes): what site's
    .pth files and the venv add, never what this process's code added. Asked once per PYTHONPATH (about 20 ms)."""
    try:
        asked = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
            env={**os.environ, "PYTHONPATH": python_path}, capture_output=True, text=True, timeout=60, check=True,
        )
        return tuple(json.loads(asked.stdout))
    except (OSError, subprocess.SubprocessError, ValueError):  # cannot tell: take this process's path as theirs
        return tuple(sys.path)


def _lies_in(spec: importlib.machinery.ModuleSpec, folder: Path) -> bool:
    """Whether the top-level module or package was found in ``folder`` itself."""
    if spec.submodule_search_locations is not None:  # a package: where its folder is
        places = list(spec.submodule_search_locations)
    else:
        places = [spec.origin] if spec.has_location and spec.origin else []
    return any(Path(place).resolve().parent == folder for place in places)


def workdir_files(target: str, workdir: Path) -> list[Path]:
    """The package folders and module file that ``package.module:function`` is imported from when
    the trial's workdir holds its top-level package (the worker puts the workdir first on its path),
    as found there, links unresolved; empty when it comes from elsewhere (an installed package)."""
    parts = target.partition(":")[0].split(".")
    spec = _find_spec(parts[0], [str(workdir)])
    found: list[Path] = []
    for depth in range(1, len(parts) + 1):
        if spec is None:
            break
        locations = list(spec.submodule_search_locations or [])
        found += [Path(location) for location in locations]
        if spec.origin is not None and spec.has_location:
            found.append(Path(spec.origin))
        if depth < len(parts):
            spec = _find_spec(".".join(parts[: depth + 1]), locations)
    return found


def _find_spec(name: str, locations: list[str]) -> importlib.machinery.ModuleSpec | None:
    """``PathFinder.find_spec(name, locations)`` without importing ``name``'s parents: PathFinder reads a namespace
    package's parent ``__path__`` from ``sys.modules`` (KeyError for ``ns1.ns2`` unless ``ns1`` was imported). As
    it, the first module or regular package in ``locations`` wins, else a namespace package of every folder of
    that name in them."""
    portions: list[str] = []
    for location in locations:
        finder = pkgutil.get_importer(location)
        spec = finder.find_spec(name) if finder is not None else None
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions += spec.submodule_search_locations or []
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def installed_files(target: str) -> list[Path]:
    """The file or package folders of the top-level package of ``package.module:function`` as
    found on Python's path, where the workdir does not hold it (nothing is imported)."""
    try:
        spec = importlib.util.find_spec(target.partition(":")[0].split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    found = [Path(location) for location in spec.submodule_search_locations or []]
    return found + ([Path(spec.origin)] if spec.origin is not None and spec.has_location else [])


def _top_level_names(body: list[ast.stmt]) -> tuple[set[str], bool, list[ast.stmt]]:
    """The names the statements of a module's top level bind when the module is imported, whether that list is
    certain to be complete, and the statements under ``if __name__ == "__main__":``, which an import skips."""
    bound: set[str] = set()
    certain = True
    guarded: list[ast.stmt] = []
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            guarded += node.body
            pending += [node.test, *node.orelse]
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            certain &= node.name not in _DYNAMIC
            # Their bodies are other scopes, but a ``global`` there may bind a module name: taken as bound.
            bound.update(name for inner in ast.walk(node) if isinstance(inner, ast.Global) for name in inner.names)
            pending += node.decorator_list
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                certain &= alias.name != "*"
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            certain &= node.id not in _DYNAMIC
        elif isinstance(node, ast.Lambda):
            continue
        pending += ast.iter_child_nodes(node)
    return bound, certain, guarded


def _only_defined_by(body: list[ast.stmt], name: str,
                     kind: type[ast.ClassDef | ast.AsyncFunctionDef | ast.FunctionDef]) -> bool:
    """Whether the module's top level binds ``name`` by undecorated statements of ``kind`` alone (``class``, ``async
    def``, ``def``): a decorator, or an assignment after it, may make it another function."""
    definitions = [node for node in body if isinstance(node, kind) and node.name == name]
    others = [node for node in body if node not in definitions]
    return (bool(definitions) and not any(node.decorator_list for node in definitions)
            and name not in _top_level_names(others)[0])


def _not_called_by_trials(function: ast.FunctionDef) -> str | None:
    """Why a trial's process, which calls its function with the config alone (``train(config)``) and takes its
    reports from trial.report, cannot run this ``def``; None where it can. Told from the syntax, as ``hermes.run``
    tells it from a function object: each trial of such a function would start, and fail."""
    if any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in _own_nodes(function.body)):
        return ("is a generator function (it yields), as Ray Tune's old function API took: a trial reports each "
                "result with trial.report(step, metric=value), not yield")
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    required = positional[: len(positional) - len(arguments.defaults)]
    keywords = [argument for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults) if default is None]
    if len(required) <= 1 and not keywords and (positional or arguments.vararg is not None):
        return None
    shown = ", ".join(argument.arg for argument in [*positional, *arguments.kwonlyargs])
    return (f"cannot be called as a trial's process calls it, with the config as its one argument (train(config)): "
            f"it takes ({shown}); its first parameter takes the config (def train(config): ...), and any other needs "
            "a default (load the data a trial needs at the module's top level or inside the function)")


def _own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of a function's body, leaving out those of the functions, lambdas and classes defined in it: a
    ``yield`` there makes them generators, not it."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    pending: list[ast.AST] = [node for node in body if not isinstance(node, nested)]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def _is_main_guard(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    texts = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and texts == ["__main__"]
