"""The searcher contract (``hermes.testing.searcher_contract``) on Hermes's own searchers and two Optuna samplers."""

from __future__ import annotations

import importlib.util
import random
import re
from typing import Any

import pytest

from hermes.search import BaseSearcher
from hermes.search.fixed import draw
from hermes.testing.searcher_contract import *  # noqa: F401,F403
from tests.test_search import INT_OPTIONS, SPACE
GRID: dict[str, Any] = {
    "optimizer": {"type": "grid", "values": ["sgd", "adam"]},
    "batch": {"type": "grid", "values": [16, 32, 64]},
}
CONFIGS = [
    {"lr": 0.1, "width": 64, "optimizer": "sgd"},
    {"lr": 0.01, "width": 32, "optimizer": "adam"},
    {"lr": 0.001, "width": 128, "optimizer": "sgd"},
    {"lr": 0.03, "width": 64, "optimizer": "adam"},
]
NEEDS_OPTUNA = pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs Optuna (the tpe extra)")
SEARCHES = [
    pytest.param({"sampler": "random", "trials": 12, "seed": 3, "space": {**SPACE, "optimizer": GRID["optimizer"]}},
                 id="random"),
    pytest.param({"sampler": "grid", "space": GRID}, id="grid"),
    pytest.param({"sampler": "list", "configs": CONFIGS, "seed": 1}, id="list"),
    pytest.param({"sampler": {"name": "tpe", "args": {"n_startup_trials": 4}}, "trials": 12, "seed": 3,
                  "space": SPACE}, id="tpe", marks=NEEDS_OPTUNA),
    pytest.param({"sampler": "qmc", "trials": 8, "seed": 3, "space": SPACE}, id="qmc",
                 marks=[NEEDS_OPTUNA, pytest.mark.filterwarnings("ignore:QMCSampler is experimental")]),
    # int parameters with log and step, and fixed parameters, which no sampler searches
    pytest.param({"sampler": "random", "trials": 12, "seed": 3, "space": {**SPACE, **INT_OPTIONS, "warmup": 3}},
                 id="random-int-options-fixed"),
    pytest.param({"sampler": "grid", "space": {**GRID, "warmup": 3}}, id="grid-fixed"),
    pytest.param({"sampler": "list", "configs": CONFIGS, "space": {"lr": SPACE["lr"], "width": SPACE["width"],
                  "optimizer": {"type": "choice", "values": ["sgd", "adam"]}, "warmup": 3}}, id="list-fixed"),
    pytest.param({"sampler": {"name": "tpe", "args": {"n_startup_trials": 4}}, "trials": 12, "seed": 3,
                  "space": {**SPACE, **INT_OPTIONS, "warmup": 3}}, id="tpe-int-options-fixed", marks=NEEDS_OPTUNA),
]


@pytest.fixture(params=SEARCHES)
def search_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.param


class Unseeded(BaseSearcher):
    """Breaks the determinism rule: its proposals are unseeded random draws."""

    learns = False

    def __init__(self, search: Any, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)
        self._space = search.space

    def _propose(self, index: int) -> dict[str, Any]:
        return {name: draw(parameter, random.random()) for name, parameter in self._space.items()}


class Peeks(Unseeded):
    """Says it does not learn, and proposes from how many reports it was told."""

    def __init__(self, search: Any, *, max_pending: int | None = None) -> None:
        super().__init__(search, max_pending=max_pending)
        self._reports = 0

    def _report(self, index: int, step: int, value: float) -> None:
        self._reports += 1

    def _propose(self, index: int) -> dict[str, Any]:
        return {name: draw(parameter, self._reports * 0.618 % 1.0) for name, parameter in self._space.items()}


def test_a_broken_searcher_is_told_which_proposal_differed_first() -> None:
    """The suite failed a searcher that breaks the rule with a bare AssertionError: pytest does not rewrite the
    asserts of the imported suite, so nothing said which proposal differed, or at which call."""
    space = {"lr": SPACE["lr"]}
    unseeded = {"sampler": f"{__name__}:Unseeded", "trials": 12, "seed": 3, "space": space}
    with pytest.raises(AssertionError, match=r"a fresh searcher told the same calls \(interleaving 1\) proposed "
                                             r"otherwise: ask 1 \(call 1 of \d+\) differs first\n"
                                             r"  expected: \{'lr': [\d.e-]+\}\n  got:      \{'lr': [\d.e-]+\}"):
        test_the_same_calls_give_the_same_proposals(unseeded)
    peeks = {**unseeded, "sampler": f"{__name__}:Peeks"}
    with pytest.raises(AssertionError, match=r"told results, it proposed otherwise than told none: ask (\d+) "
                                             r"\(call (\d+) of \d+\) differs first") as caught:
        test_a_searcher_that_does_not_learn_ignores_results(peeks)
    ask, call = map(int, re.search(r"ask (\d+) \(call (\d+)", str(caught.value)).groups())
    assert 1 < ask < call  # the first proposal after a report, which came between two asks
