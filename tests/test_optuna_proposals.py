"""What an Optuna sampler proposes, checked against the spec's space; the spec check past a long startup; the check's
quiet build. A sampler given by class path (GridSampler's ``search_space``) handed trials an int for a uniform and a
float off an int's step, and the run exited 0; TPE's wrong arguments passed the check when ``n_startup_trials`` was
11 or more (the check told 11 made-up results), then failed the experiment; reaching past the startup through made-up
finished trials made the check of a startup of 1,000 take 10-20 s, in the server's request thread and at every pool
poll; QMC's ExperimentalWarning was printed by the check's build and again by the run's."""

from __future__ import annotations

import copy
import functools
import warnings
from pathlib import Path
from typing import Any

import pytest

from hermes.errors import SpecError
from hermes.experiment.spec import SearchSpec, parse_spec
from hermes.search import make_searcher
from hermes.search.errors import SamplerFailed
from hermes.search.optuna_search import CHECK_ASKS
from tests.test_run import hermes, load_view, search, spec_of, write_spec

optuna = pytest.importorskip("optuna")

SPACE: dict[str, Any] = {
    "x": {"type": "uniform", "low": 0, "high": 1},
    "n": {"type": "int", "low": 3, "high": 19, "step": 4},
    "c": {"type": "choice", "values": ["a", 1]},
}
GRID = "optuna.samplers.GridSampler"
SAMPLERS = f'''import optuna


class LateOutside(optuna.samplers.RandomSampler):
    """Keeps to the space for the trials the spec check asks, then proposes rate 2.5, outside it."""

    def sample_independent(self, study, trial, name, distribution):
        if trial.number >= {CHECK_ASKS} and name == "rate":
            return 2.5
        return super().sample_independent(study, trial, name, distribution)


class LateValueError(optuna.samplers.RandomSampler):
    """Fails only past the trials the spec check asks for."""

    def sample_independent(self, study, trial, name, distribution):
        if trial.number >= 20:
            raise ValueError("The size of `samples` must be positive, but got 0.")
        return super().sample_independent(study, trial, name, distribution)


class LongStartTPE(optuna.samplers.TPESampler):
    """A startup of 30 trials by default, as a sampler of one's own may have."""

    def __init__(self, n_ei_candidates=24, seed=None, n_startup_trials=30):
        super().__init__(n_ei_candidates=n_ei_candidates, seed=seed, n_startup_trials=n_startup_trials)


class LongStartUnseeded(optuna.samplers.TPESampler):
    """A startup of 30 trials by default, and no seed to take: the check builds it twice."""

    def __init__(self, n_ei_candidates=24, n_startup_trials=30):
        super().__init__(n_ei_candidates=n_ei_candidates, seed=0, n_startup_trials=n_startup_trials)


class NoShortStart(optuna.samplers.TPESampler):
    """Refuses a startup of fewer than 20 trials."""

    def __init__(self, n_ei_candidates=24, seed=None, n_startup_trials=30):
        if n_startup_trials < 20:
            raise ValueError("n_startup_trials must be at least 20")
        super().__init__(n_ei_candidates=n_ei_candidates, seed=seed, n_startup_trials=n_startup_trials)


class NoShortStartAsserted(optuna.samplers.TPESampler):
    """Refuses a startup of fewer than 20 trials by an assert."""

    def __init__(self, n_ei_candidates=24, seed=None, n_startup_trials=30):
        assert n_startup_trials >= 20, "n_startup_trials must be at least 20"
        super().__init__(n_ei_candidates=n_ei_candidates, seed=seed, n_startup_trials=n_startup_trials)


class NoShortStartRuntime(optuna.samplers.TPESampler):
    """Refuses a startup of fewer than 20 trials by a RuntimeError."""

    def __init__(self, n_ei_candidates=24, seed=None, n_startup_trials=30):
        if n_startup_trials < 20:
            raise RuntimeError("n_startup_trials must be at least 20")
        super().__init__(n_ei_candidates=n_ei_candidates, seed=seed, n_startup_trials=n_startup_trials)
'''
# The reviewer's spec: its check took 10-20 s, through 990 made-up finished trials.
LONG_START = {"name": "tpe", "args": {"n_startup_trials": 1000, "n_ei_candidates": 1000}}
WIDE = {f"x{index}": {"type": "uniform", "low": 0.0, "high": 1.0} for index in range(30)}


def search_spec(sampler: Any, space: dict[str, Any] | None = None) -> SearchSpec:
    spec = {
        "name": "proposals",
        "trial": {"function": "trialmod:train", "workdir": "."},
        "search": {"sampler": sampler, "trials": 8, "seed": 1, "space": copy.deepcopy(space or SPACE)},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
    }
    return parse_spec(spec).search


def grid(x: list[Any], n: list[Any], c: list[Any]) -> dict[str, Any]:
    return {"optuna": GRID, "args": {"search_space": {"x": x, "n": n, "c": c}}}


@pytest.fixture
def samplers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "proposalsamplers.py").write_text(SAMPLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("sampler", "problem"), [
    (grid([2.0], [7], ["a"]), "2.0 is outside search.space.x [0.0, 1.0]"),
    (grid([0.5], [3.5], ["a"]), "3.5 is out of search.space.n's type: must be an int, got float 3.5"),
    (grid([0.5], [4], ["a"]), "4 is off search.space.n's step: must be 3 plus a multiple of 4"),
    (grid([0.5], [23], ["a"]), "23 is outside search.space.n [3, 19]"),
    (grid([0.5], [7], [True]), "True is out of search.space.c's values as written: they hold int 1, not bool True"),
])
def test_a_proposal_outside_the_space_is_refused_at_the_check_naming_the_args(sampler: Any, problem: str) -> None:
    with pytest.raises(SpecError) as raised, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # GridSampler's own: "The value ... is out of range"
        search_spec(sampler)
    assert str(raised.value) == (f"<spec>: search.sampler.args: sampler {GRID} gave a first proposal outside the "
                                 f"spec's space: {problem}"), raised.value


def test_values_a_sampler_gives_in_another_type_reach_the_trials_as_declared() -> None:
    """An int for a uniform is its float, a whole float for an int is its int, as Optuna's suggest_float and
    suggest_int give them: nothing is lost."""
    searcher = make_searcher(search_spec(grid([0, 1], [7.0, 11], ["a"])), "max")
    proposals = [config.params for config in (searcher.ask() for _ in range(4)) if config is not None]
    assert sorted((params["x"], params["n"]) for params in proposals) == [(0.0, 7), (0.0, 11), (1.0, 7), (1.0, 11)]
    assert all(type(params["x"]) is float and type(params["n"]) is int for params in proposals), proposals


def test_a_proposal_outside_the_space_after_the_check_fails_the_run(samplers: Path) -> None:
    """Past the proposals the check asks, the run fails, naming the parameter and the value; no trial gets it."""
    spec = spec_of("outside", search={**search(CHECK_ASKS + 2, 0, 0.0), "sampler": {
        "optuna": "proposalsamplers.LateOutside"}}, budget={"steps": 1}, policy={"name": "fifo"})
    path = write_spec(samplers, spec)
    ran = hermes("run", str(path), "--no-live", cwd=samplers)
    reason = (f"hermes: error: search.sampler proposalsamplers.LateOutside failed proposing trial {CHECK_ASKS}: it "
              "gave a value outside the spec's space: 2.5 is outside search.space.rate [0.2, 1.0]")
    assert ran.returncode == 1 and reason in ran.stderr, ran.stderr
    view, _ = load_view(samplers / "runs")
    assert all(0.2 <= trial.params["rate"] <= 1.0 for trial in view.trials), view.trials


@pytest.mark.parametrize("sampler", [
    {"name": "tpe", "args": {"n_startup_trials": 11, "n_ei_candidates": 0}},
    {"name": "tpe", "args": {"n_startup_trials": 300, "n_ei_candidates": 0}},
    {"name": "tpe", "args": {"n_startup_trials": 5000, "n_ei_candidates": 0}},  # made-up trials reached 1,000 at most
    {"optuna": "proposalsamplers.LongStartTPE", "args": {"n_ei_candidates": 0}},
    {"optuna": "proposalsamplers.LongStartUnseeded", "args": {"n_ei_candidates": 0}},
])
def test_a_wrong_argument_read_after_a_long_startup_fails_at_the_check(samplers: Path, sampler: Any) -> None:
    """Asked on a sampler built alike but for a startup of 10, the first ask past it fails."""
    with pytest.raises(SpecError) as raised:
        search_spec(sampler)
    name = sampler.get("name") or sampler["optuna"]
    assert str(raised.value).startswith(
        f"<spec>: search.sampler.args: sampler {name} failed proposal 11 (after 10 made-up results, with "
        "n_startup_trials: 10 for the check) on the spec's space: "), raised.value


@pytest.fixture
def tpe_builds(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """The n_startup_trials of each TPESampler built, and the trials its study held at each of its asks."""
    startups: list[int] = []
    held: list[int] = []
    build, before = optuna.samplers.TPESampler.__init__, optuna.samplers.TPESampler.before_trial

    @functools.wraps(build)  # the signature stays TPESampler's, which the check reads
    def counted_build(self: Any, **args: Any) -> None:
        startups.append(args.get("n_startup_trials", 10))
        build(self, **args)

    def counted_before(self: Any, study: Any, trial: Any) -> None:
        held.append(len(study.get_trials(deepcopy=False)))
        before(self, study, trial)

    monkeypatch.setattr(optuna.samplers.TPESampler, "__init__", counted_build)
    monkeypatch.setattr(optuna.samplers.TPESampler, "before_trial", counted_before)
    return startups, held


def test_the_check_of_a_long_startup_tells_no_long_history(tpe_builds: tuple[list[int], list[int]]) -> None:
    """The reviewer's spec is checked on a throwaway TPE built alike but for a startup of 10, on studies of no more
    trials than the check asks; the run's sampler keeps its startup of 1,000."""
    startups, held = tpe_builds
    search = search_spec(LONG_START, WIDE)
    assert startups == [1000, CHECK_ASKS - 2] and held and max(held) <= CHECK_ASKS, (startups, held)
    held.clear()
    searcher = make_searcher(search, "max")
    assert searcher.ask() is not None
    assert startups[2:] == [1000] and held == [1], (startups, held)


@pytest.mark.parametrize("refusing", ["NoShortStart", "NoShortStartAsserted", "NoShortStartRuntime"])
def test_a_sampler_that_refuses_a_short_startup_is_checked_through_its_first_proposals(
        samplers: Path, tpe_builds: tuple[list[int], list[int]], refusing: str) -> None:
    """Its arguments are right: that it takes no shorter startup for the check, by whatever error (an assert, a
    RuntimeError failed the spec with a traceback), is no reason to refuse the spec."""
    startups, held = tpe_builds
    search = search_spec({"optuna": f"proposalsamplers.{refusing}", "args": {"n_ei_candidates": 8}})
    assert startups == [30] and len(held) == CHECK_ASKS, (startups, held)
    assert make_searcher(search, "max").ask() is not None


def test_a_value_error_while_searching_points_at_the_arguments(samplers: Path) -> None:
    searcher = make_searcher(search_spec({"optuna": "proposalsamplers.LateValueError", "args": {"seed": 2}}), "max")
    for _ in range(20):
        assert searcher.ask() is not None
    with pytest.raises(SamplerFailed) as raised:
        searcher.ask()
    assert str(raised.value).endswith("ValueError: The size of `samples` must be positive, but got 0. "
                                      "(search.sampler.args may hold a wrong value)"), raised.value


@pytest.mark.parametrize("sampler", [
    "qmc", {"optuna": "optuna.samplers.BruteForceSampler"}, {"optuna": "optuna.samplers.NSGAIIISampler"},
])
def test_the_experimental_warning_is_said_once_by_the_runs_build_not_the_checks(sampler: Any) -> None:
    space = {name: SPACE[name] for name in ("n", "c")}  # BruteForceSampler takes no float without a step
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        search = search_spec(sampler, space)
        assert not [warning for warning in said if warning.category is optuna.exceptions.ExperimentalWarning]
        make_searcher(search, "max")
    experimental = [warning for warning in said if warning.category is optuna.exceptions.ExperimentalWarning]
    assert len(experimental) == 1 and "is experimental" in str(experimental[0].message), experimental
