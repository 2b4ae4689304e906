"""Loading a plug-in class named ``module:Class``: a policy, a stopper or a searcher of one's own."""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os
import sys
import threading
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

_FOLDER: ContextVar[Path | None] = ContextVar("plugin_folder", default=None)
# Each module a plug-in's import loaded from its folder (the plug-in's, and those it imports from there): that
# folder, its file, and the file's mtime then (``_forget_stale``)
_FROM_FOLDER: dict[str, tuple[Path, Path, int]] = {}
# Held across forgetting, the path's change and the import: two runs at once in one process (two notebook threads)
# each get their own folder's module (unheld, one dropped the module the other was importing, KeyError, or found it
# in the other's folder). Reentrant: a plug-in's module may load another plug-in as it is imported.
_IMPORTING = threading.RLock()


@contextmanager
def importable_from(folder: Path | None) -> Iterator[None]:
    """Plug-ins loaded inside are imported with ``folder`` first on Python's path, as a trial's process imports
    its module from its workdir: ``hermes run`` gives the trial's workdir (``ExperimentSpec.plugins_from``),
    ``hermes simulate`` the current folder, where a user keeps a policy beside the trial's code. None: Python's path
    alone, as everywhere else (a server refuses a user's plug-ins)."""
    token = _FOLDER.set(folder)
    try:
        yield
    finally:
        _FOLDER.reset(token)


def load_class(path: str, base: type, base_name: str | None = None) -> type:
    """The class at ``path`` (``module:Class``), which must subclass ``base`` (named ``base_name`` in errors).

    ValueError saying why not: the module's import may raise anything, and the user should see what."""
    module, _, attribute = path.partition(":")
    try:
        loaded = getattr(import_plugin_module(module), attribute)
    except (Exception, SystemExit) as error:  # a module that runs a command line when imported exits
        missing = isinstance(error, ModuleNotFoundError) and f"{module}.".startswith(f"{error.name}.")
        hint = f" ({plugin_hint()})" if missing else ""  # the plug-in's module, not one it imports
        raise ValueError(f"cannot load {path}: {type(error).__name__}: {error}{hint}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise ValueError(f"{path} is not a subclass of {base_name or f'{base.__module__}.{base.__name__}'}")
    return loaded


def import_plugin_module(module: str) -> types.ModuleType:
    """Import a plug-in's module as ``load_class`` does (the folder ``importable_from`` gives first on the path): a
    custom Optuna sampler's (``search.sampler: {optuna: ...}``) too."""
    folder = _FOLDER.get()
    with _IMPORTING, _first_on_path(folder):
        if folder is None:  # a pool's: the first module of a name serves every experiment (docs/extending.md)
            return importlib.import_module(module)
        folder = folder.resolve()
        _forget_stale(module, folder)
        present = set(sys.modules)
        loaded = importlib.import_module(module)
        for name in [*_chain(module), *(set(sys.modules) - present)]:
            file = _file(getattr(sys.modules.get(name), "__file__", None))
            if not _kept(name) and _in_folder(name, file, folder):
                _FROM_FOLDER[name] = (folder, file, _mtime(file))
        return loaded


def _forget_stale(module: str, folder: Path) -> None:
    """Drop from ``sys.modules`` what a fresh process would not import now, the folder first on its path: a notebook
    that ran a project whose workdir has mysampler.py, then another's with its own, ran the first one's searcher,
    and never re-read a plug-in edited since. Stale: a module of the plug-in's name (or a package of it) for which
    the folder now gives another file than the one loaded, and one loaded from a plug-in folder for which the path
    now gives another file, or none, or whose file changed since; with the latter go all the modules loaded from its
    folder, which may hold what it defined (``from helpers import X``). A module of the plug-in's name that the
    folder gives but Hermes did not load (the notebook imported it to try it) goes too: its file may have been edited
    since, and when it was read is not known. The old modules live on in what they built (a policy of an experiment
    running in another thread keeps its code); Hermes's and Python's own never go."""
    stale: set[str] = set()
    for name in {*([] if _kept(module) else _chain(module)), *_FROM_FOLDER}:
        if sys.modules.get(name) is None:
            continue
        parent = name.rpartition(".")[0]
        locations = getattr(sys.modules.get(parent), "__path__", None) if parent else sys.path
        spec = importlib.machinery.PathFinder.find_spec(name, list(locations)) if locations is not None else None
        found = _file(spec.origin if spec is not None and spec.has_location else None)
        before = _FROM_FOLDER.get(name)
        if before is not None and (found, _mtime(found)) != before[1:]:
            stale |= {other for other, (place, *_) in _FROM_FOLDER.items() if place == before[0]}
        elif before is None and _in_folder(name, found, folder):
            stale.add(name)  # imported otherwise (by the notebook itself): shadowed by the folder, or maybe edited
    for key in list(sys.modules) if stale else []:
        if any(key == name or key.startswith(f"{name}.") for name in stale):
            del sys.modules[key]
    for name in [name for name in _FROM_FOLDER if name not in sys.modules]:
        del _FROM_FOLDER[name]


def _chain(module: str) -> list[str]:
    """``a.b.c``'s packages and itself: ``a``, ``a.b``, ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[:depth]) for depth in range(1, len(parts) + 1)]


def _kept(module: str) -> bool:
    """Whether ``module`` is never dropped (``_forget_stale``): Hermes's, Python's, or the program's own."""
    top = module.partition(".")[0]
    return top in ("hermes", "__main__") or top in sys.stdlib_module_names


def _in_folder(module: str, file: Path | None, folder: Path) -> bool:
    """Whether ``file``, of ``module``, is the folder's own: its top-level module or package lies in the folder
    itself, not in a virtualenv kept there (numpy, reloaded, would break)."""
    if file is None or not file.is_relative_to(folder):
        return False
    return file.relative_to(folder).parts[0].partition(".")[0] == module.partition(".")[0]


def _file(path: str | None) -> Path | None:
    return Path(path).resolve() if path else None


def _mtime(path: Path | None) -> int:
    try:
        return os.stat(path).st_mtime_ns if path is not None else -1
    except OSError:
        return -1


def plugin_hint() -> str:
    """Where a plug-in's module was looked for, and how to put it there."""
    folder = _FOLDER.get()
    if folder is not None:
        return f"looked for in {folder} and on Python's path"
    return ("a plug-in is imported from Python's path by the process that runs Hermes, not from trial.workdir: "
            "install its package, or add its folder to PYTHONPATH")


@contextmanager
def _first_on_path(folder: Path | None) -> Iterator[None]:
    """``folder`` first on ``sys.path`` for one import only: what the plug-in imports later, and the rest of the
    process, see the path as it was. Hermes's own modules cannot be shadowed from there: ``hermes`` is imported
    by then, and its modules are found in its package, never on the path."""
    if folder is None:
        yield
        return
    entry = str(folder)
    sys.path.insert(0, entry)
    importlib.invalidate_caches()  # a module written since the folder was last listed (in the same second)
    try:
        yield
    finally:
        sys.path.remove(entry)


def construct(cls: type, params: dict[str, Any]) -> Any:
    """``cls(**params)``, whose parameters annotated ``int``, ``float`` or ``bool`` (or one of them or None, as
    ``float | None``) must be given as such: a reduction factor of 2.5 passed every range check and failed hours
    in (a float is no list index), and ``true`` ran as a period of 1 s. TypeError naming the parameter; a class
    whose hints cannot be read is built as it is, and a parameter whose hint is another type is not checked."""
    try:
        hints = typing.get_type_hints(cls.__init__)
        accepted = inspect.signature(cls).parameters
    except Exception:  # hints naming what its module does not import, say: nothing to check against
        hints, accepted = {}, {}
    for name, value in params.items():
        wanted = _kinds(hints.get(name)) if name in accepted else ()
        if wanted and not any(_is(value, kind) for kind in wanted):
            raise TypeError(f"{name} must be {' or '.join(_NUMBERS[kind] for kind in wanted)}, got {value!r}")
    return cls(**params)


_NUMBERS: dict[Any, str] = {int: "a whole number", float: "a number", bool: "true or false", type(None): "null"}


def _kinds(hint: Any) -> tuple[Any, ...]:
    """The types of _NUMBERS a hint allows (``float | None``: float and None); none, so unchecked, where it allows
    another type too, or is not a type (a hint left out)."""
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return kinds if all(isinstance(kind, type) and kind in _NUMBERS for kind in kinds) else ()


def _is(value: Any, wanted: type) -> bool:
    if wanted is bool or wanted is type(None):
        return isinstance(value, wanted)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if wanted is int else isinstance(value, (int, float))
