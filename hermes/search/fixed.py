"""Searchers that choose without looking at results: random (with grid parameters) and an explicit list.

Random draws use only ``random.Random(...).random()``, whose sequence Python promises to keep
across versions, seeded per trial from ``(seed, index)``: a spec gives the same configurations on
every machine, and a larger budget keeps the configurations already drawn.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Any

from hermes.search.base import BaseSearcher

if TYPE_CHECKING:
    from hermes.experiment.spec import Parameter, SearchSpec


class RandomSearcher(BaseSearcher):
    """``random`` and ``grid``: trial ``i`` takes grid combination ``i mod combinations`` (grid values
    crossed in spec order, the last parameter varying fastest) and draws its other parameters from
    its own seeded stream. It never runs out; the budget ends it. A fixed parameter takes no draw, so adding
    one leaves the others' values as they were."""

    learns = False

    def __init__(self, search: SearchSpec, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)
        self._seed = search.seed
        self._space = search.space
        grid = search.grid
        self._combinations = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]

    def _propose(self, index: int) -> dict[str, Any]:
        stream = random.Random(f"{self._seed}:{index}")
        combination = self._combinations[index % len(self._combinations)]
        params = {}
        for name, parameter in self._space.items():
            if parameter.type == "constant":
                params[name] = parameter.values[0]
            else:
                params[name] = combination[name] if name in combination else draw(parameter, stream.random())
        return params


class ListSearcher(BaseSearcher):
    """``list``: the spec's ``configs``, in order, then nothing; the space's fixed parameters, which a config
    may leave out, are added to each."""

    learns = False

    def __init__(self, search: SearchSpec, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)
        self._configs = search.configs or []
        self._fixed = {name: p.values[0] for name, p in search.space.items() if p.type == "constant"}

    def _propose(self, index: int) -> dict[str, Any] | None:
        return {**self._configs[index], **self._fixed} if index < len(self._configs) else None


def draw(parameter: Parameter, u: float) -> Any:
    """Map ``u``, uniform in [0, 1), onto the parameter's range."""
    if parameter.type == "loguniform":
        low, high = math.log(parameter.low), math.log(parameter.high)
        value = math.exp(low + u * (high - low))
        return min(max(value, parameter.low), parameter.high)  # exp(log(x)) may miss x by an ulp
    if parameter.type == "uniform":
        return parameter.low + u * (parameter.high - parameter.low)
    if parameter.type == "int" and parameter.log:  # as Optuna does: each integer n takes [n - 0.5, n + 0.5)
        low, high = math.log(parameter.low - 0.5), math.log(parameter.high + 0.5)
        return min(max(round(math.exp(low + u * (high - low))), parameter.low), parameter.high)
    if parameter.type == "int":
        return parameter.low + parameter.step * int(u * ((parameter.high - parameter.low) // parameter.step + 1))
    return parameter.values[int(u * len(parameter.values))]  # choice (grid values come from the combination)
