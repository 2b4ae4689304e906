"""The searcher contract (``hermes.testing.searcher_contract``) on Hermes's own searchers and two Optuna samplers."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from hermes.testing.searcher_contract import *  # noqa: F401,F403
from tests.test_search import SPACE
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
]


@pytest.fixture(params=SEARCHES)
def search_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.param
