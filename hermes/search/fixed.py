"""Searchers that choose without looking at results: random (with grid parameters) and an explicit list.

Random draws use only ``random.Random(...).random()``, whose sequence Python promises to keep
across versions, seeded per trial from ``(seed, index)``: a spec gives the same configurations on
every machine, and a larger budget keeps the configurations already drawn. A trial's parameters are
drawn from its one stream in space order, one ``random()`` each (an int range of more than 2**53
values takes a few more, see ``_below``).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from hermes.search.base import BaseSearcher

if TYPE_CHECKING:
    from hermes.experiment.spec import Parameter, SearchSpec


class RandomSearcher(BaseSearcher):
    """``random`` and ``grid``: trial ``i`` takes grid combination ``i mod combinations`` (grid values
    crossed in spec order, the last parameter varying fastest) and draws its other parameters, in spec order,
    from its own seeded stream. It never runs out; the budget ends it. A fixed parameter takes no draw, so adding
    one leaves the others' values as they were."""

    learns = False

    def __init__(self, search: SearchSpec, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)
        self._seed = search.seed
        self._space = search.space
        self._grid = search.grid  # crossed lazily (``_combination``): a spec of 10 KB crosses to a million dicts
        self._combinations = math.prod(len(values) for values in self._grid.values())

    def _propose(self, index: int) -> dict[str, Any]:
        stream = random.Random(f"{self._seed}:{index}")
        combination = self._combination(index % self._combinations)
        params = {}
        for name, parameter in self._space.items():
            if parameter.type == "constant":
                params[name] = parameter.values[0]
            else:
                params[name] = combination[name] if name in combination else _draw(parameter, stream)
        return params


    def _combination(self, number: int) -> dict[str, Any]:
        """The ``number``-th combination of the grid, as ``itertools.product`` orders them (the last parameter varying
        fastest)."""
        combination = {}
        for name, values in reversed(self._grid.items()):
            number, place = divmod(number, len(values))
            combination[name] = values[place]
        return combination


class ListSearcher(BaseSearcher):
    """``list``: the spec's ``configs``, in order, then nothing; the space's fixed parameters, which a config
    may leave out, are added to each. A ``uniform`` or ``loguniform`` parameter's value is a float, as every
    other sampler gives it (Optuna's ``suggest_float``), though the config wrote a whole number (``momentum: 0``);
    the stored spec keeps the config as written, so that experiments stored before still match it."""

    learns = False

    def __init__(self, search: SearchSpec, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)
        self._configs = search.configs or []
        self._fixed = {name: p.values[0] for name, p in search.space.items() if p.type == "constant"}
        self._floats = {name for name, p in search.space.items() if p.type in ("uniform", "loguniform")}

    def _propose(self, index: int) -> dict[str, Any] | None:
        if index >= len(self._configs):
            return None
        config = {name: float(value) if name in self._floats else value for name, value in self._configs[index].items()}
        return {**config, **self._fixed}


_RANDOM_BITS = 53  # random() returns k / 2**53 for a k of 53 random bits


def _draw(parameter: Parameter, stream: random.Random) -> Any:
    """``draw`` from a trial's stream; an int range of more than 2**53 values from as many ``random()`` calls as
    it needs, where one call's 53 bits reached only some of its values (and beyond a float's range, none)."""
    if parameter.type == "int" and not parameter.log:
        count = (parameter.high - parameter.low) // parameter.step + 1
        if count > 2**_RANDOM_BITS:
            return parameter.low + parameter.step * _below(count, stream)
    return draw(parameter, stream.random())


def _below(count: int, stream: random.Random) -> int:
    """A whole number uniform in [0, count), exact for any count: 53 bits per ``random()`` call (the one method
    whose sequence Python keeps across versions), drawn again where they pass the largest multiple of count."""
    calls = -(-count.bit_length() // _RANDOM_BITS)
    span = 1 << (_RANDOM_BITS * calls)
    while True:
        bits = 0
        for _ in range(calls):
            bits = bits << _RANDOM_BITS | int(stream.random() * 2**_RANDOM_BITS)
        if bits < span - span % count:
            return bits % count


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
