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
from dataclasses import dataclass
from typing import Any, ClassVar

from hermes.errors import HermesError


@dataclass(frozen=True, slots=True)
class Config:
    index: int  # 0, 1, ...: the trial's position in the experiment, in ask order
    params: dict[str, Any]  # the real hyper-parameters, as the trial receives them


class BaseSearcher(ABC):
    """Proposes configurations and may learn from their results (like Optuna's ask-and-tell).

    The public methods keep the bookkeeping every searcher needs (indices, pending trials, calls
    that make no sense) and call the ``_propose``/``_report``/``_end`` hooks of the subclass.

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
        params = self._propose(self._asked)
        if params is None:
            return None
        self._asked += 1
        return Config(self._asked - 1, params)

    def on_report(self, index: int, step: int, value: float) -> None:
        """Trial ``index`` reported ``value`` (the metric, in its own direction; NaN: diverged) at ``step``."""
        self._check_open(index)
        self._report(index, step, float(value))

    def on_end(self, index: int, value: float | None, *, stopped: bool = False) -> None:
        """Trial ``index`` ended with ``value`` (its best or final metric; None, NaN or infinite: it failed).

        A trial that never reported a finite value (every report NaN: it diverged) has no result to learn
        from: the core ranks such a trial's best as -inf, which Optuna took as a real value.
        ``stopped``: the scheduler ended it before its full budget, so ``value`` is a partial result.
        """
        self._check_open(index)
        self._ended.add(index)
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
