"""Loading a plug-in class named ``module:Class``: a policy, a stopper or a searcher of one's own."""

from __future__ import annotations

import importlib


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
