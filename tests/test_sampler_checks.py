"""The spec check of an Optuna sampler. An unseeded one (``seed: null``, or a class that takes no seed) was accepted,
and a crashed run of it could never be continued: the rerun proposed anew and was refused. An argument of the wrong
type read only after the startup trials (``n_ei_candidates: 1e2``, cmaes ``popsize: 4.0``) passed the check, which
asked once, and failed the experiment after its startup trials, hinting at a sampler of Hermes's own."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import SpecError
from hermes.experiment.spec import SearchSpec, parse_spec
from hermes.search import make_searcher
from hermes.search.errors import SamplerFailed
from tests.test_run import environment, hermes_command

pytest.importorskip("optuna")

SPACE: dict[str, Any] = {
    "x": {"type": "uniform", "low": 0.0, "high": 1.0},
    "n": {"type": "int", "low": 1, "high": 20, "step": 2},
    "c": {"type": "choice", "values": ["a", "b", "c"]},
}
SAMPLERS = '''import optuna


class KwargsTPE(optuna.samplers.TPESampler):
    """Takes no seed parameter of its own: Hermes cannot seed it."""

    def __init__(self, **kwargs):
        kwargs.setdefault("n_startup_trials", 2)
        super().__init__(**kwargs)


class FixedTPE(optuna.samplers.TPESampler):
    """Takes no seed parameter, but seeds itself."""

    def __init__(self):
        super().__init__(n_startup_trials=2, seed=7)


class LateTypeError(optuna.samplers.RandomSampler):
    """Fails only past the trials the spec check asks for."""

    def sample_independent(self, study, trial, name, distribution):
        if trial.number >= 20:
            raise TypeError("'float' object cannot be interpreted as an integer")
        return super().sample_independent(study, trial, name, distribution)
'''


def spec(sampler: Any, **search: Any) -> dict[str, Any]:
    return {
        "name": "checks",
        "trial": {"function": "trialmod:train", "workdir": "."},
        "search": {"sampler": sampler, "trials": 30, "max_pending": 30, "seed": 1, "space": copy.deepcopy(SPACE), **search},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
    }


def search_spec(sampler: Any) -> SearchSpec:
    return parse_spec(spec(sampler)).search


@pytest.fixture
def samplers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "checksamplers.py").write_text(SAMPLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_unseeded_sampler_is_refused_by_hermes_run_before_any_store(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec({"name": "tpe", "args": {"seed": None}})))
    done = subprocess.run(hermes_command("run", "exp.yaml", "--no-live"), check=False, cwd=tmp_path,
                          env=environment(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "search.sampler.args.seed: must be an int, got None" in done.stderr
    assert "Hermes seeds it from search.seed" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("seed", ["3", 3.0, True])
def test_a_seed_argument_must_be_an_int(seed: Any) -> None:
    with pytest.raises(SpecError, match=r"search\.sampler\.args\.seed: must be an int"):
        search_spec({"name": "tpe", "args": {"seed": seed}})
    assert search_spec({"name": "tpe", "args": {"seed": 3}}).sampler_args == {"seed": 3}


def test_a_sampler_that_takes_no_seed_must_propose_alike_each_time_it_is_built(samplers: Path) -> None:
    with pytest.raises(SpecError, match=(r"search\.sampler\.optuna: sampler checksamplers\.KwargsTPE proposes "
                                         r"differently each time .* a rerun could not continue .* seed argument")):
        search_spec({"optuna": "checksamplers.KwargsTPE"})
    seeded, fixed = search_spec({"optuna": "checksamplers.KwargsTPE", "args": {"seed": 5}}), search_spec(
        {"optuna": "checksamplers.FixedTPE"})
    for search in (seeded, fixed):  # a rerun replays alike
        first, second = make_searcher(search, "max"), make_searcher(search, "max")
        for _ in range(4):
            one, two = first.ask(), second.ask()
            assert one is not None and two is not None and one.params == two.params


@pytest.mark.parametrize(("sampler", "error"), [
    ({"name": "tpe", "args": {"n_startup_trials": 2, "n_ei_candidates": 1e2}},
     "search.sampler.args: sampler tpe failed proposal 3 (after 2 made-up results) on the spec's space: TypeError: "),
    ({"name": "cmaes", "args": {"n_startup_trials": 2, "popsize": 4.0}},
     "search.sampler.args.popsize: sampler cmaes takes int or null, got 4.0 (float)"),
    ({"name": "gp", "args": {"n_startup_trials": 2.0}},
     "search.sampler.args.n_startup_trials: sampler gp takes int, got 2.0 (float)"),
    ({"name": "qmc", "args": {"scramble": 1}}, "search.sampler.args.scramble: sampler qmc takes bool, got 1 (int)"),
])
def test_a_wrong_typed_argument_read_after_the_startup_trials_fails_at_the_check(sampler: Any, error: str) -> None:
    with pytest.raises(SpecError) as raised:
        search_spec(sampler)
    assert str(raised.value).startswith(f"<spec>: {error}"), raised.value


@pytest.mark.parametrize("sampler", [
    {"name": "tpe", "args": {"n_startup_trials": 2, "n_ei_candidates": 100, "prior_weight": 1}},
    {"name": "cmaes", "args": {"n_startup_trials": 2, "popsize": 4, "x0": {"x": 0.5}}},
    {"name": "gp", "args": {"n_startup_trials": 2}},
    {"name": "qmc", "args": {"scramble": True, "qmc_type": "halton"}},
    {"optuna": "optuna.samplers.NSGAIISampler", "args": {"population_size": 4}},
])
def test_right_arguments_pass(sampler: Any) -> None:
    assert search_spec(sampler).sampler_args == sampler["args"]


def test_the_check_of_cmaes_gp_and_qmc_imports_none_of_their_heavy_packages() -> None:
    """Past its startup CmaEsSampler imports cmaes (1.7 s), GPSampler torch (3 s) and QMCSampler scipy (2.6 s):
    the check asks them once and reads their annotations, so that it stays quick."""
    code = f"""
import sys
from hermes.experiment.spec import parse_spec
for name in ("cmaes", "gp", "tpe", "qmc"):
    parse_spec({spec({"name": "tpe"})!r} | {{"search": {{**{spec({"name": "tpe"})["search"]!r}, "sampler": name}}}})
print(sorted(m for m in ("cmaes", "scipy", "torch") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_type_error_while_searching_does_not_suggest_another_sampler(samplers: Path) -> None:
    searcher = make_searcher(search_spec({"optuna": "checksamplers.LateTypeError", "args": {"seed": 2}}), "max")
    for _ in range(20):
        assert searcher.ask() is not None
    with pytest.raises(SamplerFailed) as raised:
        searcher.ask()
    assert str(raised.value).endswith("(search.sampler.args may hold a value of the wrong type)"), raised.value
    assert "Hermes's own" not in str(raised.value)
