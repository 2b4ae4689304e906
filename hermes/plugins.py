"""Loading a plug-in class named ``module:Class``: a policy, a stopper or a searcher of one's own."""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from typing import Any


def load_class(path: str, base: type, base_name: str | None = None) -> type:
    """The class at ``path`` (``module:Class``), which must subclass ``base`` (named ``base_name`` in errors).

    ValueError saying why not: the module's import may raise anything, and the user should see what."""
    module, _, attribute = path.partition(":")
    try:
        loaded = getattr(importlib.import_module(module), attribute)
    except (Exception, SystemExit) as error:  # a module that runs a command line when imported exits
        raise ValueError(f"cannot load {path}: {type(error).__name__}: {error}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise ValueError(f"{path} is not a subclass of {base_name or f'{base.__module__}.{base.__name__}'}")
    return loaded


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
