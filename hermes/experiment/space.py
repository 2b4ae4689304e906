"""Trial configurations from a spec's search space: drawn up front (random, grid) or asked of TPE.

Random draws use only ``random.Random(...).random()``, whose sequence Python promises to keep
across versions, seeded per trial from ``(seed, index)``: a spec gives the same configurations on
every machine, and raising ``trials`` keeps the configurations already drawn.
"""

from __future__ import annotations

import itertools
import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermes.errors import HermesError
from hermes.experiment.spec import (
    ExperimentSpec,
    IntRange,
    LogUniform,
    Parameter,
    Uniform,
)

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class Config:
    index: int  # 0, 1, ...: the trial's position in the experiment
    params: dict[str, Any]


class Sampler(ABC):
    """Proposes configurations one at a time and may learn from their results (ask/tell)."""

    @abstractmethod
    def ask(self) -> Config | None:
        """The next configuration, or None once the spec's ``trials`` were all asked."""

    def tell(self, index: int, value: float | None) -> None:
        """The final metric of configuration ``index``; None (or NaN) when the trial failed.

        Samplers that drew everything up front have nothing to learn and ignore it.
        """


class FixedSampler(Sampler):
    """Hands out configurations chosen before the experiment starts (random and grid search)."""

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
    """Optuna's TPE over an in-memory study; the same seed and the same asks and tells give the same configurations."""

    def __init__(self, spec: ExperimentSpec) -> None:
        import optuna  # optional: only TPE needs it

        self._failed = optuna.trial.TrialState.FAIL
        self._study = optuna.create_study(
            direction="maximize" if spec.metric.mode == "max" else "minimize",
            sampler=optuna.samplers.TPESampler(seed=spec.search.seed),
        )
        self._distributions = {name: _distribution(optuna, p) for name, p in spec.search.space.items()}
        self._total = spec.search.trials or 0
        self._asked = 0
        self._open: dict[int, optuna.trial.Trial] = {}

    def ask(self) -> Config | None:
        if self._asked >= self._total:
            return None
        trial = self._study.ask(self._distributions)
        config = Config(self._asked, {name: trial.params[name] for name in self._distributions})
        self._open[config.index] = trial
        self._asked += 1
        return config

    def tell(self, index: int, value: float | None) -> None:
        trial = self._open.pop(index, None)
        if trial is None:
            raise HermesError(f"configuration {index} was never asked, or its result was told already")
        if value is None or math.isnan(value):
            self._study.tell(trial, state=self._failed)
        else:
            self._study.tell(trial, value)


def make_sampler(spec: ExperimentSpec) -> Sampler:
    if spec.search.sampler == "tpe":
        return TpeSampler(spec)
    return FixedSampler(sample_configs(spec))


def sample_configs(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """Every trial's configuration for random and grid search, in trial order.

    Trial ``i`` takes grid combination ``i mod combinations`` (grid values crossed in spec order,
    the last parameter varying fastest) and draws its other parameters from its own seeded stream.
    """
    search = spec.search
    if search.sampler == "tpe":
        raise HermesError("sampler tpe proposes configurations as results arrive; use make_sampler(spec)")
    combinations = [dict(zip(search.grid, values, strict=True)) for values in itertools.product(*search.grid.values())]
    configs = []
    for index in range(search.trials or 0):
        stream = random.Random(f"{search.seed}:{index}")
        combination = combinations[index % len(combinations)]
        configs.append(
            {
                name: combination[name] if name in combination else _draw(parameter, stream.random())
                for name, parameter in search.space.items()
            }
        )
    return configs


def _draw(parameter: Parameter, u: float) -> Any:
    """Map ``u``, uniform in [0, 1), onto the parameter's range."""
    if isinstance(parameter, LogUniform):
        low, high = math.log(parameter.low), math.log(parameter.high)
        value = math.exp(low + u * (high - low))
        return min(max(value, parameter.low), parameter.high)  # exp(log(x)) may miss x by an ulp
    if isinstance(parameter, Uniform):
        return parameter.low + u * (parameter.high - parameter.low)
    if isinstance(parameter, IntRange):
        return parameter.low + int(u * (parameter.high - parameter.low + 1))
    return parameter.values[int(u * len(parameter.values))]  # choice


def _distribution(optuna: Any, parameter: Parameter) -> optuna.distributions.BaseDistribution:
    if isinstance(parameter, Uniform):  # LogUniform included
        return optuna.distributions.FloatDistribution(
            parameter.low, parameter.high, log=isinstance(parameter, LogUniform)
        )
    if isinstance(parameter, IntRange):
        return optuna.distributions.IntDistribution(parameter.low, parameter.high)
    return optuna.distributions.CategoricalDistribution(parameter.values)  # choice (the spec bars grid with tpe)
