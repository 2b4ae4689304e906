"""The searcher interface: proposals asked one at a time, told of every report and every end.

Determinism rule. A searcher is a pure function of the spec and of the sequence of calls made on
it: replaying the store's log (the same asks, reports and ends, in log order) into a fresh
searcher must give the same proposals. So a searcher takes its seed from the spec, never reads the
clock, the global ``random``/NumPy RNGs or the environment, and never depends on how calls were
interleaved other than through their order. A restarted session rebuilds its searcher this way and
checks that every logged trial is proposed again, with the same params.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hermes.errors import HermesError
from hermes.search.errors import SamplerFailed

if TYPE_CHECKING:
    from hermes.experiment.spec import Parameter


@dataclass(frozen=True, slots=True)
class Config:
    index: int  # 0, 1, ...: the trial's position in the experiment, in ask order
    params: dict[str, Any]  # the real hyper-parameters, as the trial receives them


class BaseSearcher(ABC):
    """Proposes configurations and may learn from their results (like Optuna's ask-and-tell).

    The public methods keep the bookkeeping every searcher needs (indices, pending trials, calls
    that make no sense) and call the ``_propose``/``_report``/``_end`` hooks of the subclass. A searcher is
    anyone's code: what a hook raises is SamplerFailed naming the searcher and the call, which ends its
    experiment alone (a session, a pool), not a traceback through the engine.

    ``sampler_name``: how its errors name it, the spec's ``search.sampler`` where ``make_searcher`` built it
    (``bind``), else its class path.

    ``max_pending`` is how many unfinished trials the searcher wants in flight (None: no limit):
    a searcher that learns proposes better when it has seen more ends. It is advice to the caller
    (ask while ``wants_more``), not enforced by ``ask``: a replay on a machine with fewer slots
    must still be able to ask what the log holds.

    ``learns``: whether its proposals use the results it is told. One that learns is kept to a few trials in
    flight by default (else it would propose every trial before the first result); one that chose up front
    (random, grid, a list) sets it False and gets all its trials at once.
    """

    learns: ClassVar[bool] = True

    def __init__(self, *, max_pending: int | None = None) -> None:
        self.max_pending = max_pending
        self._asked = 0
        self._ended: set[int] = set()
        self.sampler_name = f"{type(self).__module__}:{type(self).__qualname__}"
        self._checked_space: dict[str, Parameter] | None = None

    def bind(self, name: str, space: dict[str, Parameter] | None) -> None:
        """Name it as the spec does; ``space``: check every proposal against it (a searcher of the user's: Hermes's
        own propose within the space by construction, and a search of 10,000 trials need not pay for a check)."""
        self.sampler_name = name
        self._checked_space = space

    @property
    def asked(self) -> int:
        return self._asked

    @property
    def pending(self) -> int:
        """Trials asked and not yet ended."""
        return self._asked - len(self._ended)

    @property
    def wants_more(self) -> bool:
        """Whether another trial may be asked now without exceeding ``max_pending``."""
        return self.max_pending is None or self.pending < self.max_pending

    def ask(self) -> Config | None:
        """The next configuration; None when the searcher has nothing more to propose, now or ever."""
        index = self._asked
        with self._hook(f"proposing trial {index}"):
            params = self._propose(index)
        if params is None:
            return None
        if self._checked_space is not None:
            params = self._in_space(index, params, self._checked_space)
        self._asked += 1
        return Config(index, params)

    def on_report(self, index: int, step: int, value: float) -> None:
        """Trial ``index`` reported ``value`` (the metric, in its own direction; NaN: diverged) at ``step``."""
        self._check_open(index)
        with self._hook(f"when told trial {index}'s step {step}"):
            self._report(index, step, float(value))

    def on_end(self, index: int, value: float | None, *, stopped: bool = False) -> None:
        """Trial ``index`` ended with ``value`` (its best or final metric; None, NaN or infinite: it failed).

        A trial that never reported a finite value (every report NaN: it diverged) has no result to learn
        from: the core ranks such a trial's best as -inf, which Optuna took as a real value.
        ``stopped``: the scheduler ended it before its full budget, so ``value`` is a partial result.
        """
        self._check_open(index)
        self._ended.add(index)
        with self._hook(f"when told trial {index}'s end"):
            self._end(index, None if value is None or not math.isfinite(value) else float(value), stopped)

    @abstractmethod
    def _propose(self, index: int) -> dict[str, Any] | None:
        """The params of trial ``index``, or None once exhausted."""

    def _report(self, index: int, step: int, value: float) -> None:
        """Searchers that chose up front have nothing to learn."""

    def _end(self, index: int, value: float | None, stopped: bool) -> None:
        """Searchers that chose up front have nothing to learn. ``value`` is finite, or None: the trial failed."""

    def _check_open(self, index: int) -> None:
        if not 0 <= index < self._asked:
            raise HermesError(f"trial {index} was never asked")
        if index in self._ended:
            raise HermesError(f"the end of trial {index} was told already")

    @contextmanager
    def _hook(self, doing: str) -> Iterator[None]:
        """What a hook raises, as the failure that ends the experiment, naming the searcher and the call; a
        SamplerFailed is worded already (OptunaSearcher's)."""
        try:
            yield
        except SamplerFailed:
            raise
        except Exception as error:
            raise SamplerFailed(f"search.sampler {self.sampler_name} failed {doing}: {type(error).__name__}: "
                                f"{error}") from error

    def _in_space(self, index: int, params: Any, space: dict[str, Parameter]) -> dict[str, Any]:
        """A proposal of the user's searcher as its trial gets it (see ``_as_declared``), its fixed parameters added
        where it left them out (as ``sampler: list`` does; a rerun takes a proposal stored without them for the same,
        ``hermes.session``), in space order; SamplerFailed where it is no dict of the space's parameters or a value
        lies outside the space: else every trial ran with it, or failed in the user's code on a missing name. A value
        the searcher's arithmetic rounded past a bound, or a listed number of another type (NumPy's float for a listed
        int), is in the space, as given: it ran before the check too."""
        fixed = {name: p.values[0] for name, p in space.items() if p.type == "constant"}
        problem = _unfit(params, space, set(fixed))
        if problem is None:
            params = _as_declared(space, params)
            outside = _outside(space, params)  # near, a scan of a choice's values, only for what this refuses
            if outside is not None:
                outside = _outside(space, {name: value for name, value in params.items()
                                           if not _near(space[name], value)})
            problem = None if outside is None else f"a value outside the spec's space: {outside}"
        if problem is not None:
            raise SamplerFailed(f"search.sampler {self.sampler_name} failed proposing trial {index}: it gave {problem}")
        return {name: params[name] if name in params else fixed[name] for name in space}


def _near(parameter: Parameter, value: Any) -> bool:
    """Whether ``value``, outside ``parameter`` as written, is in it but for round-off (a float32 searcher, exp of a
    log at a bound: a millionth of the bound, or of a uniform's range where a bound is 0) or its type (0.0 where 0 is
    listed or fixed)."""
    if type(value) not in (int, float):
        return False
    if parameter.type in ("uniform", "loguniform"):
        scale = parameter.high - parameter.low if parameter.type == "uniform" else 0.0  # no log bound is 0
        return any(abs(value - bound) <= 1e-6 * max(abs(bound), scale) for bound in (parameter.low, parameter.high))
    if parameter.type in ("choice", "grid", "constant"):
        return any(type(listed) in (int, float) and listed == value for listed in parameter.values)
    return False


def _unfit(params: Any, space: dict[str, Parameter], fixed: set[str]) -> str | None:
    """Why ``params`` is no dict of the space's parameters (its fixed ones may be left out), or None."""
    if not isinstance(params, dict):
        return f"{type(params).__name__} {params!r}, not a dict of the space's parameters"
    missing = [name for name in space if name not in params and name not in fixed]
    if missing:
        return f"no value for {', '.join(missing)} of the spec's space"
    extra = [name for name in params if name not in space]
    if extra:
        return f"{', '.join(map(repr, extra))}, which the spec's space does not hold"
    return None


def _as_declared(space: dict[str, Parameter], params: dict[str, Any]) -> dict[str, Any]:
    """A proposal's values as their parameters take them, where that changes no value: a number in a uniform's range
    as a float (as ``sampler: list`` gives a config's ``0``, and Optuna's suggest_float), a whole float for an int as
    an int, a NumPy scalar as the value it holds. A sampler's own values (GridSampler's ``search_space``) reach
    ``trial.params`` as it gives them, unchecked and unconverted."""
    from hermes.experiment.spec import _plain

    declared = {}
    for name, value in params.items():
        value, parameter = _plain(value), space[name]
        if parameter.type in ("uniform", "loguniform") and type(value) is int and parameter.contains(value):
            value = float(value)
        elif parameter.type == "int" and type(value) is float and value.is_integer():
            value = int(value)
        declared[name] = value
    return declared


def _outside(space: dict[str, Parameter], params: dict[str, Any]) -> str | None:
    """Why a proposal lies outside the space, naming the first parameter and value that do (as a config of
    ``sampler: list`` is told), or None."""
    from hermes.experiment.spec import _misfit

    problems = (_misfit(space[name], value, f"search.space.{name}") for name, value in params.items())
    return next((problem for problem in problems if problem is not None), None)
