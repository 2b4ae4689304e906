"""Search: which configurations an experiment tries, proposed one at a time as results arrive.

``make_searcher`` builds the spec's searcher; the registry maps names to code that is imported
only when used (Optuna only for Optuna's samplers). ``Budget`` says when to stop asking.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

from hermes.search.base import BaseSearcher, Config
from hermes.search.budget import BUDGET_FIELDS, Budget, without_budget
from hermes.search.errors import SamplerError

if TYPE_CHECKING:
    import optuna

    from hermes.experiment.spec import SearchSpec

# Searchers of Hermes's own, by name: "module:class", built as ``cls(search, max_pending=...)``.
HERMES_SEARCHERS = {
    "random": "hermes.search.fixed:RandomSearcher",
    "grid": "hermes.search.fixed:RandomSearcher",  # a random search whose parameters are all grid
    "list": "hermes.search.fixed:ListSearcher",
}
# Optuna's samplers, by name; any other is given by class path (``sampler: {optuna: ...}``).
OPTUNA_SAMPLERS = {
    "tpe": "optuna.samplers.TPESampler",
    "cmaes": "optuna.samplers.CmaEsSampler",
    "gp": "optuna.samplers.GPSampler",
    "qmc": "optuna.samplers.QMCSampler",
}
SEARCHERS = (*HERMES_SEARCHERS, *OPTUNA_SAMPLERS)
PENDING_PER_SLOT = 4  # default max_pending of a searcher that learns, or that has no trial count

__all__ = [
    "BUDGET_FIELDS",
    "HERMES_SEARCHERS",
    "OPTUNA_SAMPLERS",
    "SEARCHERS",
    "BaseSearcher",
    "Budget",
    "Config",
    "SamplerError",
    "check_sampler",
    "make_searcher",
    "without_budget",
]


def make_searcher(search: SearchSpec, mode: Literal["max", "min"], slots: int = 1) -> BaseSearcher:
    """The searcher of a validated ``search`` section, for a metric to ``mode`` on ``slots`` slots.

    ``max_pending``: the spec's, else unlimited for searchers that choose without results and have
    a trial count (all trials at once, as the policies like), else ``PENDING_PER_SLOT`` per slot.
    """
    name = search.sampler_name
    learns = name not in HERMES_SEARCHERS
    pending = search.max_pending or (PENDING_PER_SLOT * slots if learns or search.trials is None else None)
    if not learns:
        module, _, attr = HERMES_SEARCHERS[name].partition(":")
        return getattr(importlib.import_module(module), attr)(search, max_pending=pending)
    from hermes.search.optuna_search import OptunaSearcher

    return OptunaSearcher(search, _optuna_sampler(search), mode=mode, max_pending=pending)


def check_sampler(search: SearchSpec) -> None:
    """Raise SamplerError, naming the field, if the spec's sampler is unknown or its arguments are wrong."""
    name = search.sampler_name
    if name in HERMES_SEARCHERS:
        if search.sampler_args:
            raise SamplerError("sampler.args", f"sampler {name} takes no arguments")
    else:
        _optuna_sampler(search)  # builds it: a wrong class or argument fails now, not hours in


def _optuna_sampler(search: SearchSpec) -> optuna.samplers.BaseSampler:
    from hermes.search.optuna_search import build_sampler

    by_name = isinstance(search.sampler, str) or "name" in search.sampler
    field = "sampler" if isinstance(search.sampler, str) else "sampler.name" if by_name else "sampler.optuna"
    if by_name and search.sampler_name not in OPTUNA_SAMPLERS:
        raise SamplerError(field, f"unknown sampler {search.sampler_name!r}; choose one of {', '.join(SEARCHERS)}")
    path = OPTUNA_SAMPLERS[search.sampler_name] if by_name else search.sampler_name
    return build_sampler(path, search.sampler_args, search.seed, field)
