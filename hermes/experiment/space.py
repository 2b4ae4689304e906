"""The runner's sampler API, kept as thin adapters over ``hermes.search`` until the session uses it.

New code should call ``hermes.search.make_searcher`` and ``Budget`` directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from hermes.errors import HermesError
from hermes.experiment.spec import ExperimentSpec
from hermes.search import BaseSearcher, Config, make_searcher

__all__ = ["Config", "FixedSampler", "Sampler", "TpeSampler", "make_sampler", "sample_configs"]


class Sampler(ABC):
    """Proposes configurations one at a time and may learn from their results (ask/tell)."""

    @abstractmethod
    def ask(self) -> Config | None:
        """The next configuration, or None once the spec's ``trials`` were all asked."""

    def tell(self, index: int, value: float | None) -> None:
        """The final metric of configuration ``index``; None (or NaN) when the trial failed."""


class FixedSampler(Sampler):
    """Hands out configurations chosen before the experiment starts."""

    def __init__(self, configs: list[dict[str, Any]]) -> None:
        self._configs = configs
        self._next = 0

    def ask(self) -> Config | None:
        if self._next >= len(self._configs):
            return None
        config = Config(self._next, dict(self._configs[self._next]))
        self._next += 1
        return config


class TpeSampler(Sampler):
    """Any searcher of the spec (Optuna's included), cut off after the spec's ``trials``."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self._searcher: BaseSearcher = make_searcher(spec.search, spec.metric.mode)
        self._total = spec.search.trials or 0

    def ask(self) -> Config | None:
        return self._searcher.ask() if self._searcher.asked < self._total else None

    def tell(self, index: int, value: float | None) -> None:
        self._searcher.on_end(index, value)


def make_sampler(spec: ExperimentSpec) -> Sampler:
    if spec.search.sampler_name in ("random", "grid", "list"):
        return FixedSampler(sample_configs(spec))
    return TpeSampler(spec)


def sample_configs(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """Every trial's configuration for random, grid and list search, in trial order."""
    if spec.search.sampler_name not in ("random", "grid", "list"):
        raise HermesError(
            f"sampler {spec.search.sampler_name} proposes configurations as results arrive; use make_sampler(spec)"
        )
    searcher = make_searcher(spec.search, spec.metric.mode)
    return [config.params for config in (searcher.ask() for _ in range(spec.search.trials or 0)) if config]
