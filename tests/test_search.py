"""Searchers: proposals within the space, the same proposals from the same log, errors that name the field, budgets."""

from __future__ import annotations

import copy
import importlib.util
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes.errors import HermesError, SpecError, install_extra
from hermes.experiment.spec import SearchSpec, parse_spec
from hermes.search import Budget, make_searcher, without_budget
from hermes.search.base import BaseSearcher

SPACE: dict[str, Any] = {
    "lr": {"type": "loguniform", "low": 1.0e-4, "high": 1.0e-1},
    "momentum": {"type": "uniform", "low": 0.0, "high": 0.9},
    "layers": {"type": "int", "low": 1, "high": 4},
    "width": {"type": "choice", "values": [32, 64, 128]},
}
BASE: dict[str, Any] = {
    "name": "search",
    "trial": {"function": "examples.digits.train:train"},
    "metric": {"name": "accuracy", "mode": "max"},
    "budget": {"steps": 5},
    "policy": {"name": "fifo"},
}


def search_spec(**search: Any) -> SearchSpec:
    search.setdefault("space", copy.deepcopy(SPACE))
    return parse_spec({**BASE, "search": search}).search


def objective(params: dict[str, Any]) -> float:
    return -abs(math.log10(params["lr"]) + 2) + 0.1 * params["layers"] + (params["width"] == 64)


def within(search: SearchSpec, params: dict[str, Any]) -> bool:
    return list(params) == list(search.space) and all(search.space[n].contains(v) for n, v in params.items())


# ---------------------------------------------------------------------- proposals within the space
def test_random_covers_every_kind_and_keeps_todays_configurations() -> None:
    space = {**SPACE, "optimizer": {"type": "grid", "values": ["sgd", "adam"]}}
    search = search_spec(sampler="random", trials=40, seed=0, space=space)
    searcher = make_searcher(search, "max")
    configs = [searcher.ask() for _ in range(40)]
    assert all(c is not None and within(search, c.params) for c in configs)
    params = [c.params for c in configs if c]
    assert [p["optimizer"] for p in params[:4]] == ["sgd", "adam", "sgd", "adam"]  # grid cycled in trial order
    assert {p["layers"] for p in params} == {1, 2, 3, 4} and {p["width"] for p in params} == {32, 64, 128}
    assert all(type(p["layers"]) is int for p in params)
    # The stream of the runner before hermes.search: random.Random(f"{seed}:{index}"), one draw per parameter.
    u = random.Random("0:0").random()
    assert params[0]["lr"] == math.exp(math.log(1e-4) + u * (math.log(1e-1) - math.log(1e-4)))


def test_grid_passes_over_the_grid_and_list_gives_the_real_params() -> None:
    space = {"a": {"type": "grid", "values": [1, 2]}, "b": {"type": "grid", "values": ["x", "y"]}}
    grid = search_spec(sampler="grid", space=space)
    searcher = make_searcher(grid, "max")
    assert [searcher.ask().params for _ in range(4)] == [  # type: ignore[union-attr]
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"},
    ]
    assert Budget.of(grid).trials == 4

    configs = [{"lr": 0.1, "width": 64, "opt": "sgd"}, {"lr": 0.01, "width": 32, "opt": "adam"}]
    listed = parse_spec({**BASE, "search": {"configs": configs}}).search  # configs alone imply sampler list
    assert listed.sampler == "list" and listed.trials == 2
    assert listed.space["opt"].contains("adam") and not listed.space["opt"].contains("rmsprop")  # derived choices
    searcher = make_searcher(listed, "max")
    asked = [searcher.ask(), searcher.ask()]
    assert [c.params for c in asked if c] == configs and searcher.ask() is None
    with_space = search_spec(sampler="list", configs=[{k: v for k, v in c.items() if k != "opt"} for c in configs],
                             space={"lr": SPACE["lr"], "width": SPACE["width"]})
    assert with_space.trials == 2
    reordered = [{"width": 64, "lr": 0.1}, {"lr": 0.01, "width": 32}]  # a mapping's order is no part of it
    assert parse_spec({**BASE, "search": {"configs": reordered}}).search.trials == 2
    space = {"lr": SPACE["lr"], "width": SPACE["width"]}
    assert search_spec(sampler="list", configs=reordered, space=space).trials == 2
    choices = search_spec(trials=2, space={"flag": {"type": "choice", "values": [1, 2, "1"]}}).space["flag"]
    assert choices.contains(1) and not choices.contains(True) and not choices.contains(1.0)  # true is not 1


OPTUNA = [
    pytest.param({"sampler": "tpe"}, id="tpe"),
    pytest.param({"sampler": {"name": "tpe", "args": {"n_startup_trials": 3, "multivariate": True}}}, id="tpe-args"),
    pytest.param(
        {"sampler": {"name": "cmaes", "args": {"n_startup_trials": 3}}},
        id="cmaes",
        marks=pytest.mark.skipif(importlib.util.find_spec("cmaes") is None, reason="needs the cmaes package"),
    ),
    pytest.param({"sampler": {"name": "gp", "args": {"n_startup_trials": 3}}}, id="gp"),
    pytest.param({"sampler": "qmc"}, id="qmc"),
    pytest.param({"sampler": {"optuna": "optuna.samplers.NSGAIISampler", "args": {"population_size": 4}}}, id="nsga2"),
]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("sampler", OPTUNA)
def test_optuna_samplers_propose_within_the_space_and_learn(sampler: dict[str, Any]) -> None:
    search = search_spec(trials=8, seed=3, **sampler)
    searcher = make_searcher(search, "max", slots=2)
    assert searcher.max_pending == 8  # 4 per slot
    for _ in range(8):
        config = searcher.ask()
        assert config is not None and within(search, config.params)
        assert type(config.params["layers"]) is int
        searcher.on_report(config.index, 1, objective(config.params) / 2)
        searcher.on_end(config.index, objective(config.params))


INT_OPTIONS: dict[str, Any] = {
    "batch": {"type": "int", "low": 1, "high": 1000, "log": True},
    "hidden": {"type": "int", "low": 64, "high": 1000, "step": 64},  # 64, ..., 960: 1000 is off the step
}


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("sampler", ["random", "tpe", "qmc"])
def test_int_parameters_take_log_and_step_in_every_sampler(sampler: str) -> None:
    """As Optuna's suggest_int(log=True) and suggest_int(step=...): neither could be written ("unknown field")."""
    search = search_spec(sampler=sampler, trials=200, seed=1, space=copy.deepcopy(INT_OPTIONS))
    searcher = make_searcher(search, "max", slots=50)
    proposals = []
    for _ in range(200):
        config = searcher.ask()
        assert config is not None and within(search, config.params)
        proposals.append(config.params)
        searcher.on_end(config.index, float(config.params["hidden"]))
    batch, hidden = [p["batch"] for p in proposals], [p["hidden"] for p in proposals]
    assert all(type(value) is int for value in batch + hidden)
    assert {value % 64 for value in hidden} == {0} and max(hidden) <= 960 and len(set(hidden)) > 5
    assert 0.3 < sum(value < 32 for value in batch) / len(batch) < 0.7  # log-uniform: half lie below sqrt(1000)
    assert not search.space["hidden"].contains(100) and search.space["hidden"].contains(960)


def test_random_draws_every_integer_of_a_range_wider_than_a_float_exactly() -> None:
    """A range of more than 2**53 integers drew only some of them (u * count in floats), and one wider than a float's
    range raised OverflowError in the runner: each is drawn exactly now, from more of the trial's stream. Ordinary
    ranges draw as before, one random() each, so recorded experiments replay."""
    from hermes.search.fixed import draw

    huge, wide = 10**400, 2**60
    space = {"n": {"type": "int", "low": -huge, "high": huge}, "w": {"type": "int", "low": 0, "high": wide},
             "s": {"type": "int", "low": 1, "high": wide, "step": 3}, "lr": SPACE["lr"]}
    searcher = make_searcher(search_spec(trials=64, seed=4, space=space), "max")
    params = [config.params for config in (searcher.ask() for _ in range(64)) if config is not None]
    assert len(params) == 64 and all(type(p[name]) is int for p in params for name in ("n", "w", "s"))
    assert all(-huge <= p["n"] <= huge and 0 <= p["w"] <= wide and 1 <= p["s"] <= wide for p in params)
    assert {p["s"] % 3 for p in params} == {1}  # on the step
    assert len({p["w"] % 128 for p in params}) > 32  # u * (2**60 + 1) hit multiples of 128 alone
    assert sum(p["n"] > 0 for p in params) in range(16, 49) and len({p["n"] // 10**397 for p in params}) > 32
    exact = {"type": "int", "low": 0, "high": 2**53 - 1}  # 2**53 values: one random() each, as ever
    ordinary = make_searcher(search_spec(trials=3, seed=4, space={"e": exact, "lr": SPACE["lr"]}), "max")
    for index in range(3):
        stream = random.Random(f"4:{index}")
        parameter = search_spec(trials=3, space={"e": exact}).space["e"]
        expected = draw(parameter, stream.random())
        assert ordinary.ask().params["e"] == expected  # type: ignore[union-attr]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_an_int_range_a_sampler_cannot_draw_is_refused_naming_the_parameter() -> None:
    """Under tpe a range beyond a float was refused as "search.sampler: sampler tpe failed a first proposal", and
    within one but beyond 2**53 Optuna's samplers fail later (a NaN, a memory error) or miss values."""
    for sampler in ("tpe", "qmc", {"name": "cmaes", "args": {}}):
        for bound, value in (("high", 2**53 + 1), ("low", -(10**400))):
            n = {"type": "int", "low": 0, "high": 1, bound: value}
            with pytest.raises(SpecError) as raised:
                search_spec(sampler=sampler, trials=2, space={"n": n})
            name = sampler if isinstance(sampler, str) else sampler["name"]
            assert str(raised.value).startswith(
                f"<spec>: search.space.n.{bound}: must lie within -2**53 and 2**53 (9007199254740992) for sampler "
                f"{name}, got {value}: Optuna's samplers draw integers through floats")
    edge = search_spec(sampler="tpe", trials=2, space={"n": {"type": "int", "low": -(2**53), "high": 2**53}})
    assert type(make_searcher(edge, "max").ask().params["n"]) is int  # type: ignore[union-attr]
    with pytest.raises(SpecError, match=r"search\.space\.n\.high: must be at most 2\*\*53 \(9007199254740992\) for "
                                        "log: true, got 9007199254740993: a log-uniform integer is drawn through"):
        search_spec(trials=2, space={"n": {"type": "int", "low": 1, "high": 2**53 + 1, "log": True}})
    logged = search_spec(trials=8, space={"n": {"type": "int", "low": 1, "high": 2**53, "log": True}})
    searcher = make_searcher(logged, "max")
    assert all(1 <= searcher.ask().params["n"] <= 2**53 for _ in range(8))  # type: ignore[union-attr]


def test_a_grid_of_a_million_combinations_is_crossed_as_it_is_asked_not_held() -> None:
    """Each ``sampler: grid`` experiment of two 1,000-value parameters (a 10 KB spec) held its million combinations as
    dicts, about 210 MB of a server's memory; in ``itertools.product`` order, the last parameter fastest."""
    import itertools
    import tracemalloc

    values = list(range(1000))
    space = {"a": {"type": "grid", "values": values}, "b": {"type": "grid", "values": [f"v{v}" for v in values]}}
    grid = search_spec(sampler="grid", space=space, trials=1_000_000)
    tracemalloc.start()
    try:
        searcher = make_searcher(grid, "max")
        asked = [searcher.ask() for _ in range(1002)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak
    crossed = itertools.product(values, [f"v{v}" for v in values])
    assert [(c.params["a"], c.params["b"]) for c in asked if c is not None] == list(itertools.islice(crossed, 1002))


def test_configs_keep_to_a_grid_parameter_without_its_multiple_rule() -> None:
    """configs checked against a space with a grid parameter were refused: "search.trials: must be a multiple of the
    3 grid combinations", though the configs, not the grid, say what runs."""
    space = {"a": {"type": "grid", "values": [1, 2, 3]}, "lr": SPACE["lr"]}
    listed = search_spec(configs=[{"a": 1, "lr": 0.01}, {"a": 3, "lr": 0.001}], space=space)
    assert listed.sampler == "list" and listed.trials == 2
    searcher = make_searcher(listed, "max")
    assert [searcher.ask().params for _ in range(2)] == [{"a": 1, "lr": 0.01}, {"a": 3, "lr": 0.001}]  # type: ignore
    assert searcher.ask() is None
    with pytest.raises(SpecError, match=r"search\.configs\.0\.a: 4 is outside search\.space\.a: not one of its"):
        search_spec(configs=[{"a": 4, "lr": 0.01}], space=space)
    with pytest.raises(SpecError, match=r"search\.trials: must be at most the 2 configs"):
        search_spec(configs=[{"a": 1, "lr": 0.01}, {"a": 2, "lr": 0.01}], trials=3, space=space)


def test_a_config_gives_a_uniform_parameter_a_float_as_every_sampler_does() -> None:
    """A config's momentum: 0 reached the trial as int 0 where random and Optuna's suggest_float give 0.0; the stored
    spec keeps it as written, so that an experiment stored with it still matches."""
    space = {"momentum": SPACE["momentum"], "lr": {**SPACE["lr"], "high": 1}, "layers": SPACE["layers"]}
    listed = search_spec(configs=[{"momentum": 0, "lr": 1, "layers": 2}, {"momentum": 0.5, "lr": 0.01, "layers": 3}],
                         space=space)
    searcher = make_searcher(listed, "max")
    first, second = (searcher.ask().params for _ in range(2))  # type: ignore[union-attr]
    assert first == {"momentum": 0.0, "lr": 1.0, "layers": 2} and second["momentum"] == 0.5
    assert [type(first[name]) for name in ("momentum", "lr", "layers")] == [float, float, int]
    assert listed.model_dump(mode="json")["configs"][0] == {"momentum": 0, "lr": 1, "layers": 2}


def test_fixed_parameters_reach_every_trial_and_no_sampler_searches_them() -> None:
    """Ray Tune's ``param_space={"lr": 0.1}`` (spec ``lr: 0.1``) was refused: "Input should be a valid dictionary"."""
    space = {**copy.deepcopy(SPACE), "warmup": 3, "optimizer": "adam", "nesterov": True, "decay": "1e-4"}
    search = search_spec(sampler="random", trials=4, seed=2, space=space)
    fixed = {"warmup": 3, "optimizer": "adam", "nesterov": True, "decay": "1e-4"}  # text stays text, as in a choice
    searcher, plain = make_searcher(search, "max"), make_searcher(search_spec(trials=4, seed=2), "max")
    for _ in range(4):
        params, others = searcher.ask().params, plain.ask().params  # type: ignore[union-attr]
        assert params == {**others, **fixed} and within(search, params)  # the other draws are as without them
    stored = search.model_dump(mode="json")
    assert stored["space"]["warmup"] == 3 and stored["space"]["decay"] == "1e-4"  # stored as written
    assert parse_spec({**BASE, "search": stored}).search.model_dump(mode="json") == stored

    tpe = make_searcher(search_spec(sampler="tpe", trials=2, space=space), "max")
    assert {k: v for k, v in tpe.ask().params.items() if k in fixed} == fixed  # type: ignore[union-attr]
    assert set(tpe.study.trials[0].distributions) == set(SPACE)  # type: ignore[attr-defined]

    grid = search_spec(sampler="grid", space={"a": {"type": "grid", "values": [1, 2]}, "warmup": 3})
    searcher = make_searcher(grid, "max")
    assert [searcher.ask().params for _ in range(2)] == [{"a": 1, "warmup": 3}, {"a": 2, "warmup": 3}]  # type: ignore
    fixed_space = {"a": {"type": "choice", "values": [1, 2]}, "warmup": 3}
    for configs in ([{"a": 1}, {"a": 2}], [{"a": 1, "warmup": 3}, {"a": 2, "warmup": 3}]):  # left out, or as fixed
        searcher = make_searcher(search_spec(sampler="list", configs=configs, space=fixed_space), "max")
        proposed = [searcher.ask().params for _ in range(2)]  # type: ignore[union-attr]
        assert proposed == [{"a": 1, "warmup": 3}, {"a": 2, "warmup": 3}]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_qmc_draws_a_sequence_of_its_own_for_each_seed_once_scrambled() -> None:
    """Optuna's QMCSampler takes its seed only when scrambled, which it is not by default (kept: searches recorded
    unscrambled continue as they began): scrambled, it takes search.seed."""
    def proposals(seed: int, **args: Any) -> list[dict[str, Any]]:
        searcher = make_searcher(search_spec(sampler={"name": "qmc", "args": args}, trials=4, seed=seed), "max")
        return [searcher.ask().params for _ in range(4)]  # type: ignore[union-attr]

    assert proposals(0, scramble=True) == proposals(0, scramble=True)
    assert all(a != b for a, b in zip(proposals(0, scramble=True)[1:], proposals(1, scramble=True)[1:], strict=True))
    assert proposals(0)[1:] == proposals(1)[1:]  # Optuna's own sequence


# ---------------------------------------------------------------------- determinism: same log, same proposals
Log = list[tuple[Any, ...]]


def drive(searcher: BaseSearcher, trials: int, seed: int) -> Log:
    """A session's life in miniature: asks while the searcher wants more, reports and ends in a seeded
    interleaving (several trials in flight, some stopped early, one failed)."""
    rng, log, steps, params = random.Random(seed), [], {}, {}
    while searcher.asked < trials or steps:
        if searcher.asked < trials and searcher.wants_more and (not steps or rng.random() < 0.4):
            config = searcher.ask()
            assert config is not None
            steps[config.index], params[config.index] = 0, config.params
            log.append(("ask", config.params))
            continue
        index = rng.choice(sorted(steps))
        value = objective(params[index]) * (steps[index] + 1) / 4
        if steps[index] < 3 and rng.random() < 0.7:
            steps[index] += 1
            entry: tuple[Any, ...] = ("report", index, steps[index], value)
        elif index == 2:
            entry = ("end", index, None, False)  # failed
        else:
            entry = ("end", index, value, steps[index] < 3)  # stopped before the full budget
        log.append(entry)
        apply(searcher, [entry])
        if entry[0] == "end":
            del steps[index]
    return log


def apply(searcher: BaseSearcher, log: Log) -> list[dict[str, Any]]:
    """Replay ``log`` as a restarted session does: re-ask every logged trial and check its params."""
    proposed = []
    for entry in log:
        if entry[0] == "ask":
            config = searcher.ask()
            assert config is not None and config.params == entry[1]
            proposed.append(config.params)
        elif entry[0] == "report":
            searcher.on_report(*entry[1:])
        else:
            searcher.on_end(entry[1], entry[2], stopped=entry[3])
    return proposed


REPLAYED = [
    pytest.param({"sampler": "random", "space": {**SPACE, "g": {"type": "grid", "values": [0, 1]}}}, id="random"),
    pytest.param({"sampler": {"name": "tpe", "args": {"n_startup_trials": 4}}}, id="tpe"),
    pytest.param({"sampler": {"name": "gp", "args": {"n_startup_trials": 4}}}, id="gp"),
    pytest.param({"sampler": "qmc"}, id="qmc"),
]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("sampler", REPLAYED)
def test_the_same_log_gives_the_same_proposals_also_after_a_crash(sampler: dict[str, Any]) -> None:
    search = search_spec(trials=14, seed=5, max_pending=4, **sampler)
    log = drive(make_searcher(search, "max"), 14, seed=1)
    assert sum(entry[0] == "ask" for entry in log) == 14 and any(e[0] == "end" and e[3] for e in log)
    assert len(apply(make_searcher(search, "max"), log)) == 14  # apply() checks each proposal against the log
    for crash in (len(log) // 3, 2 * len(log) // 3):  # a new searcher fed the first K entries, then continued
        resumed = make_searcher(search, "max")
        apply(resumed, log[:crash])
        apply(resumed, log[crash:])


def test_optuna_is_told_reports_as_they_arrive_and_how_each_trial_ended() -> None:
    import optuna

    searcher = make_searcher(search_spec(trials=4, sampler="tpe"), "min")
    configs = [searcher.ask() for _ in range(4)]
    assert all(configs)
    for index in range(4):
        searcher.on_report(index, 1, 0.5 + index)
    searcher.on_report(0, 1, 9.0)  # a step reported again after a resume from an older checkpoint: the first stays
    searcher.on_report(0, 2, 0.25)
    study = searcher.study  # type: ignore[attr-defined]
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # running trials carry their partial curve
    assert study.trials[0].intermediate_values == {1: 0.5, 2: 0.25}
    searcher.on_end(0, 0.25)
    searcher.on_end(1, 1.5, stopped=True)
    searcher.on_end(2, float("nan"))
    searcher.on_end(3, None)
    states = [trial.state for trial in study.trials]
    state = optuna.trial.TrialState
    assert states == [state.COMPLETE, state.PRUNED, state.FAIL, state.FAIL]
    assert study.trials[1].value == 1.5  # Optuna keeps a pruned trial's last report as its value
    assert searcher.pending == 0
    with pytest.raises(HermesError, match="told already"):
        searcher.on_end(0, 1.0)
    with pytest.raises(HermesError, match="never asked"):
        searcher.on_report(7, 1, 1.0)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_trial_that_never_reported_a_finite_value_is_told_failed(mode: str) -> None:
    """Every report NaN: the core's best score is -inf, so the session tells +inf (min) or -inf (max), which Optuna
    took as a COMPLETE trial's value; docs/search.md promises FAIL for a diverged trial."""
    import optuna

    searcher = make_searcher(search_spec(trials=4, sampler="tpe"), mode)
    for index in range(4):
        searcher.ask()
        searcher.on_report(index, 1, math.nan)
    searcher.on_end(0, math.inf)
    searcher.on_end(1, -math.inf, stopped=True)
    searcher.on_end(2, 0.5)  # finite reports before it diverged: its best of them, as before
    searcher.on_end(3, 0.75, stopped=True)
    state = optuna.trial.TrialState
    study = searcher.study  # type: ignore[attr-defined]
    assert [trial.state for trial in study.trials] == [state.FAIL, state.FAIL, state.COMPLETE, state.PRUNED]
    assert study.trials[2].value == 0.5


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_diverged_report_does_not_look_best_to_tpe(mode: str) -> None:
    """A stopped trial whose last report was +inf (maximised; -inf minimised) was TPE's best PRUNED trial, and steered
    its proposals into the region that diverges: it is told NaN, which Optuna ranks worst, as a NaN report is."""
    sign = 1 if mode == "max" else -1

    def first_proposal(diverged: float, seed: int) -> float:
        search = search_spec(sampler={"name": "tpe", "args": {"n_startup_trials": 10}}, trials=11, seed=seed,
                             space={"x": {"type": "uniform", "low": 0, "high": 1}})
        searcher = make_searcher(search, mode)
        for _ in range(10):  # every trial stopped at step 2 (as ASHA stops them); x > 0.6 diverges, the peak is 0.2
            config = searcher.ask()
            assert config is not None
            x, last = config.params["x"], sign * (0.6 - abs(config.params["x"] - 0.2))
            searcher.on_report(config.index, 1, sign * 0.1 if x > 0.6 else sign * (0.5 - abs(x - 0.2)))
            searcher.on_report(config.index, 2, diverged if x > 0.6 else last)
            searcher.on_end(config.index, sign * 0.1 if x > 0.6 else last, stopped=True)
            if x > 0.6:
                assert math.isnan(searcher.study.trials[config.index].intermediate_values[2])  # type: ignore
        proposal = searcher.ask()
        assert proposal is not None
        return proposal.params["x"]

    infinite = [first_proposal(sign * math.inf, seed) for seed in range(12)]
    assert infinite == [first_proposal(math.nan, seed) for seed in range(12)]
    assert sum(x > 0.6 for x in infinite) <= 4, infinite  # as told: 10 of 12 in the diverging region


# ---------------------------------------------------------------------- errors name the field
BAD = [
    ({"sampler": "bayes"}, "search.sampler: unknown sampler 'bayes'; choose one of random, grid, list, tpe, cmaes"),
    ({"sampler": {"name": "bayes"}}, "search.sampler.name: unknown sampler 'bayes'"),
    ({"sampler": {"optuna": "optuna.samplers.NoSuchSampler"}}, "search.sampler.optuna: unknown Optuna sampler class"),
    ({"sampler": {"optuna": "nosuchmodule.Sampler"}}, "search.sampler.optuna: unknown Optuna sampler class"),
    (
        {"sampler": {"optuna": "optuna.Study"}},
        "search.sampler.optuna: unknown Optuna sampler class 'optuna.Study' (not a subclass",
    ),
    ({"sampler": {"name": "tpe", "args": {"bogus": 1}}}, "search.sampler.args: optuna.samplers.TPESampler: "),
    ({"sampler": {"name": "random", "args": {"x": 1}}}, "search.sampler.args: sampler random takes no arguments"),
    ({"sampler": {"name": "tpe", "optuna": "x.Y"}}, "search.sampler: give exactly one of name"),
    ({"sampler": {"name": "tpe", "seed": 1}}, "search.sampler.seed: unknown field; expected one of name, optuna, args"),
    ({"sampler": {"name": "tpe", "args": [1]}}, "search.sampler.args: must be a mapping"),
    ({"sampler": "gp", "space": {"g": {"type": "grid", "values": [1, 2]}}}, "search.space.g: sampler gp takes no grid"),
    ({"sampler": "list"}, "search.configs: required for sampler list"),
    ({"sampler": "random", "configs": [{"lr": 0.1}]}, "search.configs: only for sampler list"),
    ({"configs": []}, "search.configs: must list at least one configuration"),
    ({"configs": [{"lr": 0.1}, {"width": 3}]}, "search.configs.1: must set the same parameters as configs.0 (lr)"),
    ({"configs": [{"lr": [0.1]}]}, "search.configs.0.lr: must be a string, a finite number or a boolean"),
    ({"configs": [{"lr": 0.5, "momentum": 0.1, "layers": 1, "width": 64}]}, "search.configs.0.lr: 0.5 is outside"),
    ({"configs": [{"lr": 0.01}]}, "search.configs.0: must set exactly the parameters of space"),
    ({"configs": [{"lr": 0.1}, {"lr": 0.2}], "trials": 3, "space": None}, "search.trials: must be at most the 2"),
    ({"sampler": "random"}, "search.trials: required for sampler random, unless max_time or max_gpu_hours is given"),
    ({"trials": 2, "max_time": "2 weeks"}, "search.max_time: must be seconds or a duration like '90m'"),
    ({"configs": [{"lr": 0.1, "momentum": 0.1, "layers": True, "width": 64}]}, "search.configs.0.layers: True is out"),
    ({"configs": [{"lr": 0.1, "momentum": 0.1, "layers": 1, "width": 64.0}]}, "search.configs.0.width: 64.0 is out"),
    ({"max_time": 60, "space": {"a": {"type": "grid", "values": list(range(1000))},
                                "b": {"type": "grid", "values": list(range(1001))}}},
     "search.trials: the grid has 1001000 combinations, more than the 1000000"),  # random lists them up front too
    ({"trials": 2, "max_gpu_hours": 0}, "search.max_gpu_hours: Input should be greater than 0"),
    ({"sampler": {"name": None}}, "search.sampler.name: must be a sampler's name (tpe, say) or a searcher's module:"),
    ({"sampler": {"name": ""}}, "search.sampler.name: must be a sampler's name (tpe, say) or a searcher's module:"),
    ({"sampler": {"optuna": "..Foo"}}, "search.sampler.optuna: must be a sampler class's dotted path like optuna."),
    ({"sampler": {"optuna": "Foo"}}, "search.sampler.optuna: must be a sampler class's dotted path like optuna."),
    ({"sampler": 5}, "search.sampler: must be a sampler's name, module:Class, or a mapping with name or optuna"),
    ({"sampler": {"name": "tpe", "args": {"n_startup_trials": "5"}}},  # read only when asked: asked once at the check
     "search.sampler.args: sampler tpe failed a first proposal on the spec's space: TypeError: "),
    ({"sampler": {"optuna": "optuna.samplers.BruteForceSampler"}},
     ("search.sampler.optuna: sampler optuna.samplers.BruteForceSampler failed a first proposal on the spec's space: "
      "ValueError: FloatDistribution.step must be given")),
    ({"configs": [{}]}, "search.configs.0: sets no parameter"),
    ({"trials": 2, "max_time": True}, "search.max_time: Input should be a valid number"),
    ({"trials": 2, "max_gpu_hours": "1"}, "search.max_gpu_hours: Input should be a valid number"),
    ({"trials": 2, "space": {"n": {"type": "int", "low": 1, "high": 9, "log": True, "step": 2}}},
     "search.space.n.step: cannot be combined with log: true (as in Optuna's suggest_int); give one of them"),
    ({"trials": 2, "space": {"n": {"type": "int", "low": 0, "high": 9, "log": True}}},
     "search.space.n.low: must be at least 1 for log: true, got 0"),
    ({"trials": 2, "space": {"n": {"type": "int", "low": 1, "high": 9, "step": 0}}},
     "search.space.n.step: must be a whole number of at least 1, got 0"),
    ({"trials": 2, "space": {"n": {"type": "int", "low": 1, "high": 9, "step": 2.0}}},
     "search.space.n.step: Input should be a valid integer"),
    ({"configs": [{"n": 4}], "space": {"n": {"type": "int", "low": 1, "high": 9, "step": 2}}},
     "search.configs.0.n: 4 is off search.space.n's step: must be 1 plus a multiple of 2"),
    ({"configs": [{"a": 1, "w": 4}], "space": {"a": {"type": "choice", "values": [1]}, "w": 3}},
     "search.configs.0.w: 4 is out of search.space.w: it is fixed at int 3"),
    ({"configs": [{"w": 3}], "space": {"a": {"type": "choice", "values": [1]}, "w": 3}},
     "search.configs.0: must set exactly the parameters of space (a); it may set the fixed ones (w) too"),
    ({"trials": 2, "space": {"lr": [0.1, 0.2]}}, "search.space.lr: must be a parameter (a mapping with a type: "
     "uniform, loguniform, int, choice, grid) or a fixed value (text, a finite number or a boolean), got [0.1, 0.2]"),
    ({"trials": 2, "space": {"lr": math.nan}}, "search.space.lr: must be a parameter (a mapping with a type"),
    ({"sampler": {"name": "tpe", "args": {"gamma": len}}, "trials": 2},
     "search.sampler.args.gamma: must be a plain value (text, a finite number, a boolean, null, or a list or mapping "
     "of them) that the stored spec can hold, got a callable: <built-in function len>"),
    ({"sampler": {"name": "tpe", "args": {"x": [1, {"y": object}]}}, "trials": 2},
     "search.sampler.args.x.1.y: must be a plain value"),
]


@pytest.mark.parametrize(("search", "message"), BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD)])
def test_a_wrong_search_names_the_field(search: dict[str, Any], message: str) -> None:
    search = {"space": copy.deepcopy(SPACE), **search}
    if search["space"] is None:
        del search["space"]
    with pytest.raises(SpecError) as raised:
        parse_spec({**BASE, "search": search}, source="s.yaml")
    assert str(raised.value).startswith(f"s.yaml: {message}")


def test_a_sampler_whose_package_is_missing_fails_at_spec_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cmaes", None)  # Python's mark of a module that cannot be imported
    with pytest.raises(SpecError, match=r"search.sampler: optuna.samplers.CmaEsSampler needs the Python package"):
        search_spec(sampler="cmaes", trials=4)
    monkeypatch.setitem(sys.modules, "optuna", None)  # a bare install: no `tpe` extra
    with pytest.raises(SpecError, match=r"search.sampler: optuna.samplers.TPESampler needs Optuna, which is not "
                                        rf"installed: {re.escape(install_extra('tpe'))}"):
        search_spec(sampler="tpe", trials=4)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("sampler_needs_more", "import optuna\nimport hermes_no_such_dependency\nS = optuna.samplers.RandomSampler\n",
     "ModuleNotFoundError: No module named 'hermes_no_such_dependency'"),
    ("sampler_raises", "raise RuntimeError('needs a GPU')\n", "RuntimeError: needs a GPU"),
    ("sampler_misspelt", "class S(object)\n    pass\n", "SyntaxError: expected ':'"),
])
def test_a_sampler_module_that_fails_to_import_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, message: str
) -> None:
    """Its own failure was reported as a class not found, or escaped as a traceback."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as raised:
        search_spec(sampler={"optuna": f"{name}.S"}, trials=2)
    assert str(raised.value).startswith(f"<spec>: search.sampler.optuna: cannot import {name}: {message}")
    with pytest.raises(SpecError, match=r"search.sampler.optuna: unknown Optuna sampler class 'not_there_at_all.S' "
                                        r"\(not found: No module named 'not_there_at_all'; a plug-in is imported from "
                                        r"Python's path"):
        search_spec(sampler={"optuna": "not_there_at_all.S"}, trials=2)


# ---------------------------------------------------------------------- budgets
def test_the_budget_ends_asking_at_whichever_limit_comes_first() -> None:
    budget = Budget.of(search_spec(trials=10, max_time="1.5h", max_gpu_hours=2))
    assert budget == Budget(trials=10, seconds=5400.0, gpu_seconds=7200.0)
    assert budget.may_ask(9, 5399.0, 7199.0)
    assert not budget.may_ask(10, 0.0, 0.0)
    assert not budget.may_ask(0, 5400.0, 0.0)
    assert not budget.may_ask(0, 0.0, 7200.0)
    timed = search_spec(max_time=90)  # no trial count: random proposes until the time is up
    assert Budget.of(timed) == Budget(seconds=90.0) and Budget.of(timed).may_ask(10**6, 89.9, 1e9)
    assert make_searcher(timed, "max", slots=3).max_pending == 12  # bounded, or asking would never stop
    assert make_searcher(search_spec(trials=10), "max").max_pending is None  # all at once, as before
    assert [search_spec(max_time=t).max_time for t in ("90m", "2h", "1d", "30s", "45")] == [5400, 7200, 86400, 30, 45]
    assert [search_spec(max_time=t).max_time for t in ("1e1", "1.5e2s", "2E1m")] == [10, 150, 1200]  # YAML: text


def test_a_larger_budget_is_the_same_experiment_and_keeps_its_proposals() -> None:
    small, large = search_spec(trials=8, seed=2), search_spec(trials=16, seed=2, max_time="2h")
    dump = lambda s: {"search": s.model_dump(mode="json"), "name": "x"}  # noqa: E731
    assert without_budget(dump(small)) == without_budget(dump(large)) and dump(small) != dump(large)
    assert without_budget(dump(small)) != without_budget(dump(search_spec(trials=8, seed=3)))
    first = [make_searcher(small, "max").ask() for _ in range(1)]
    again = make_searcher(large, "max")
    assert first == [again.ask()]


def test_a_spec_stored_before_hermes_search_still_matches_its_dump() -> None:
    """The store compares dumps: unset new fields are left out, so old experiments open and replay."""
    dumped = search_spec(sampler="random", trials=4, seed=1).model_dump(mode="json")
    assert list(dumped) == ["sampler", "trials", "seed", "space"]


class _Learner(BaseSearcher):
    """A searcher of one's own that learns (the default): kept to a few trials in flight."""

    def __init__(self, search: SearchSpec, *, max_pending: int | None = None) -> None:
        super().__init__(max_pending=max_pending)

    def _propose(self, index: int) -> dict[str, Any]:
        return {"lr": 0.01, "momentum": 0.5, "layers": 2, "width": 64}


def test_a_searcher_named_by_class_path_gets_the_concurrency_its_kind_needs() -> None:
    """A registered searcher was taken as one that chooses up front: a learner was asked every trial at once."""
    learner = make_searcher(search_spec(trials=12, sampler=f"{__name__}:_Learner"), "max", slots=2)
    assert isinstance(learner, _Learner) and learner.max_pending == 8
    fixed = make_searcher(search_spec(trials=12, sampler="hermes.search.fixed:RandomSearcher"), "max", slots=2)
    assert fixed.max_pending is None  # it chooses without results: every trial at once
