"""Int ranges of up to 2**54 values under every sampler: each draws them past its startup trials, or the spec check
refuses the range naming the parameter. GPSampler lays out every value of a range at each proposal (a range of
10**15 values failed the run with MemoryError after its startup trials), and TPE put values off a step over a range
wider than 2**53."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

from hermes.errors import SpecError
from hermes.experiment.spec import SearchSpec, parse_spec
from hermes.search import make_searcher
from hermes.search.optuna_search import GP_MAX_INT_VALUES
from tests.test_search import BASE

ASKS = 14  # past TPE's 10 startup trials, CMA-ES's 1, and GP's given below
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # QMCSampler's


def search_spec(sampler: Any, **n: int | bool) -> SearchSpec:
    space = {"n": {"type": "int", **n}, "x": {"type": "uniform", "low": 0.0, "high": 1.0}}
    return parse_spec({**BASE, "search": {"sampler": copy.deepcopy(sampler), "trials": ASKS, "space": space}}).search


def drawn(search: SearchSpec, asks: int = ASKS) -> list[int]:
    """The values of n that the spec's searcher proposes, each trial ended before the next is asked."""
    searcher, values = make_searcher(search, "max"), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CMA-ES and QMC say they sample n independently; Optuna's experimental ones
        for _ in range(asks):
            config = searcher.ask()
            assert config is not None
            values.append(config.params["n"])
            searcher.on_end(config.index, config.params["x"] - abs(config.params["n"] / 2**53 - 0.3))
    return values


def on_range(values: list[int], low: int, high: int, step: int = 1) -> bool:
    return all(type(v) is int and low <= v <= high and (v - low) % step == 0 for v in values)


@pytest.mark.parametrize("sampler", ["gp", {"optuna": "optuna.samplers.GPSampler"}], ids=["gp", "class-path"])
def test_gp_refuses_a_range_it_would_lay_out_beyond_memory_naming_the_parameter_and_the_limit(sampler: Any) -> None:
    for n in ({"low": 0, "high": 10**15}, {"low": 1, "high": 10**15, "log": True}, {"low": 0, "high": 2**26}):
        values = n["high"] - n["low"] + 1
        name = sampler if isinstance(sampler, str) else sampler["optuna"]
        with pytest.raises(SpecError) as refused:
            search_spec(sampler, **n)
        assert str(refused.value).startswith(
            f"<spec>: search.space.n: holds {values} values, more than sampler {name} takes in an int range "
            "(67108864, 2**26): Optuna's GPSampler lays out every value of the range at each proposal"), refused.value
        assert "use another sampler (tpe, cmaes, qmc and random take any range)" in str(refused.value)
    assert GP_MAX_INT_VALUES == 2**26
    search_spec(sampler, low=1, high=2**26)  # the most it takes
    search_spec(sampler, low=0, high=10**15, step=10**8)  # a step that leaves 10**7 + 1 values


def test_gp_proposes_past_its_startup_over_a_range_it_takes_at_the_edge_of_a_float() -> None:
    top, step = 2**53, 3
    low = top - 3 * 10**6  # 10**6 + 1 values, every one a whole float
    search = search_spec({"name": "gp", "args": {"n_startup_trials": 2}}, low=low, high=top, step=step)
    assert on_range(drawn(search, asks=3), low, top, step)


@pytest.mark.parametrize("sampler", ["random", "tpe", "cmaes", "qmc"])
def test_the_other_samplers_draw_every_range_the_check_takes_past_their_startup(sampler: str) -> None:
    for low, high, step in ((0, 10**15, 1), (-(2**53), 2**53, 1), (-(2**53), 0, 3)):
        assert on_range(drawn(search_spec(sampler, low=low, high=high, step=step)), low, high, step)
    if sampler != "tpe":  # they keep to a step in Python ints over any range
        low, high = -(2**53), 2**53
        assert on_range(drawn(search_spec(sampler, low=low, high=high, step=3)), low, high, 3)


def test_tpe_refuses_a_stepped_range_wider_than_a_float_holds_exactly() -> None:
    """TPE's 11th to 14th proposals over -2**53..2**53 on a step of 3 held 4 values off the step (of 60 asked)."""
    with pytest.raises(SpecError) as refused:
        search_spec("tpe", low=-(2**53), high=2**53, step=3)
    assert str(refused.value).startswith(
        "<spec>: search.space.n: spans 18014398509481983 from low to its top value, more than 2**53 "
        "(9007199254740992), which sampler tpe takes with a step: Optuna's TPESampler puts a value on the step in "
        "floats"), refused.value
    low = -(2**53) + 5
    assert on_range(drawn(search_spec("tpe", low=low, high=low + 2**53, step=3)), low, low + 2**53, 3)


def test_grid_takes_no_int_range() -> None:
    with pytest.raises(SpecError, match=r"search\.space\.n: sampler grid takes grid parameters only; use sampler "
                                        "random"):
        search_spec("grid", low=0, high=10**15)
