"""Hermes: a preemptive, convergence-aware GPU scheduler for hyper-parameter optimisation.

``hermes.run(spec)`` runs an experiment from Python (``hermes.tuning``); trial code imports
``hermes.trial``.
"""

from __future__ import annotations

import sys
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
    """``hermes.tuning``, with Ctrl-C held back while its few hundred modules load and taken once they have:
    raised in the middle, it left a submodule whose parent's import was cut short (yaml, sqlalchemy), and each
    later ``hermes.run`` in that process failed (a notebook's kernel had to be restarted)."""
    if "hermes.tuning" in sys.modules:
        from hermes import tuning

        return tuning
    import signal
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        # only the main thread may set handlers, and only a Python handler can be put back (an ignored or
        # default SIGINT leaves no half-imported module)
        from hermes import tuning

        return tuning
    received = False

    def hold(_signum: int, _frame: object) -> None:
        nonlocal received
        received = True

    signal.signal(signal.SIGINT, hold)
    try:
        from hermes import tuning
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # to the handler it was meant for: KeyboardInterrupt by default
    return tuning
