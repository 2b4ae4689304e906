"""Hermes: a preemptive, convergence-aware GPU scheduler for hyper-parameter optimisation.

``hermes.run(spec)`` runs an experiment from Python (``hermes.tuning``); trial code imports
``hermes.trial``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_TUNING = ("run", "ExperimentResult", "TrialResult")


def __getattr__(name: str) -> Any:
    """``hermes.run`` and its results, imported when first asked for: a trial's process, which imports
    ``hermes.trial``, does not load the scheduler, the store and the report with them."""
    if name in _TUNING:
        from hermes import tuning

        return getattr(tuning, name)
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")
