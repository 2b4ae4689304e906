"""Search: which configurations an experiment tries, proposed one at a time as results arrive.

``make_searcher`` builds the spec's searcher; the registry maps names to code that is imported
only when used (Optuna only for Optuna's samplers). ``Budget`` says when to stop asking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from hermes.plugins import load_class
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
PENDING_PER_SLOT = 4  # default max_pending of a searcher that learns, or that has no trial count

__all__ = [
    "BUDGET_FIELDS",
    "HERMES_SEARCHERS",
    "OPTUNA_SAMPLERS",
    "BaseSearcher",
    "Budget",
    "Config",
    "SamplerError",
    "check_sampler",
    "hermes_searcher",
    "make_searcher",
    "max_pending_for",
    "without_budget",
]


def make_searcher(search: SearchSpec, mode: Literal["max", "min"], slots: int = 1) -> BaseSearcher:
    """The searcher of a validated ``search`` section, for a metric to ``mode`` on ``slots`` slots; one of the user's
    has its proposals checked against the space (``BaseSearcher.bind``).

    ``max_pending``: the spec's, else unlimited for searchers that choose without results and have
    a trial count (all trials at once, as the policies like), else ``PENDING_PER_SLOT`` per slot.
    """
    cls = hermes_searcher(search)
    if cls is not None:
        searcher = cls(search, max_pending=max_pending_for(search, cls.learns, slots))
        own = f"{cls.__module__}:{cls.__qualname__}" in HERMES_SEARCHERS.values()
        searcher.bind(search.sampler_name, None if own else search.space)
        return searcher
    from hermes.search.optuna_search import OptunaSearcher

    pending = max_pending_for(search, True, slots)
    return OptunaSearcher(search, _optuna_sampler(search), mode=mode, max_pending=pending)


def hermes_searcher(search: SearchSpec) -> type[BaseSearcher] | None:
    """The spec's searcher class when it is no Optuna sampler: one of ``HERMES_SEARCHERS``, or a
    ``BaseSearcher`` of the user's own named ``module:Class``. SamplerError when that cannot be loaded."""
    name = search.sampler_name
    path = HERMES_SEARCHERS.get(name) or (name if ":" in name else None)
    if path is None:
        return None
    try:
        return load_class(path, BaseSearcher, "hermes.search.BaseSearcher")
    except ValueError as error:
        raise SamplerError("sampler" if isinstance(search.sampler, str) else "sampler.name", str(error)) from None


def max_pending_for(search: SearchSpec, learns: bool, slots: int) -> int | None:
    """The ``max_pending`` of the spec's searcher on ``slots`` slots (see ``make_searcher``)."""
    if search.max_pending:
        return search.max_pending
    return PENDING_PER_SLOT * slots if learns or search.trials is None else None


def check_sampler(search: SearchSpec) -> None:
    """Raise SamplerError, naming the field, if the spec's sampler is unknown or its arguments are wrong."""
    if hermes_searcher(search) is not None:
        if search.sampler_args:
            raise SamplerError("sampler.args", f"sampler {search.sampler_name} takes no arguments")
    else:
        from hermes.search.optuna_search import ask_once

        # Built and asked: a wrong class or argument fails now, not at the first trial (where a failed
        # experiment would also keep its name from the corrected spec). Many arguments are read only when asked.
        # Built quietly: the run builds it again, and Optuna's ExperimentalWarning is said then.
        field = "sampler.args" if search.sampler_args else _sampler_field(search)
        ask_once(_optuna_sampler(search, quiet=True), search, field)


def _sampler_field(search: SearchSpec) -> str:
    """The spec field that names the sampler, for errors."""
    if isinstance(search.sampler, str):
        return "sampler"
    return "sampler.name" if "name" in search.sampler else "sampler.optuna"


def _optuna_sampler(search: SearchSpec, *, quiet: bool = False) -> optuna.samplers.BaseSampler:
    """The spec's Optuna sampler; ``quiet``: without Optuna's ExperimentalWarning (see ``build_sampler``)."""
    from hermes.search.optuna_search import build_sampler

    by_name = isinstance(search.sampler, str) or "name" in search.sampler
    field = _sampler_field(search)
    if by_name and search.sampler_name not in OPTUNA_SAMPLERS:
        known = ", ".join((*HERMES_SEARCHERS, *OPTUNA_SAMPLERS))
        raise SamplerError(field, f"unknown sampler {search.sampler_name!r}; choose one of {known}, or give a "
                                  "searcher of your own as module:Class")
    path = OPTUNA_SAMPLERS[search.sampler_name] if by_name else search.sampler_name
    return build_sampler(path, search.sampler_args, search.seed, field, quiet=quiet)
