"""Hermes: a preemptive, convergence-aware GPU scheduler for hyper-parameter optimisation.

``hermes.run(spec)`` runs an experiment from Python (``hermes.tuning``); trial code imports
``hermes.trial``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

_TUNING = ("run", "ExperimentResult", "TrialResult")


def __getattr__(name: str) -> Any:
    """``hermes.run`` and its results, imported when first asked for: a trial's process, which imports
    ``hermes.trial``, does not load the scheduler, the store and the report with them."""
    if name in _TUNING:
        return getattr(_import_tuning(), name)
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")


def _import_tuning() -> ModuleType:
    """``hermes.tuning``, with Ctrl-C held back while its few hundred modules load (``sigint_held``). Imported, not
    taken from ``sys.modules``, once there too: another thread may be importing it still, and the import's lock makes
    this one wait for the whole module (it got one without ``run`` yet, an AttributeError)."""
    if "hermes.tuning" in sys.modules:
        return importlib.import_module("hermes.tuning")
    with sigint_held():
        return importlib.import_module("hermes.tuning")


@contextmanager
def sigint_held() -> Iterator[None]:
    """Ctrl-C held back while the block runs, and raised as it ends: raised in the middle of a module's first import
    (yaml, sqlalchemy, Optuna, numpy), it left a submodule whose parent's import was cut short, and each later
    ``hermes.run`` in that process failed (a notebook's kernel had to be restarted). A second Ctrl-C is taken at
    once, by the handler held back, to end a set-up that takes long. Only in the main thread, which alone may set
    handlers, and only over a Python handler, which alone can be put back (an ignored or default SIGINT leaves no
    half-imported module)."""
    import signal
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    received = False

    def hold(_signum: int, _frame: object) -> None:
        nonlocal received
        received = True
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        signal.raise_signal(signal.SIGINT)  # to the handler it was meant for: KeyboardInterrupt by default
