"""A searcher of the user's own (``search.sampler: module:Class``) is anyone's code, as an Optuna sampler is: what it
raises, or a proposal outside the space, ends its experiment alone, recorded failed with a reason that names the
searcher and the call; never a traceback, never a whole pool.

As in tests/test_run.py and tests/test_pool.py, nothing of ours is mocked: real ``hermes run`` processes and a real
pool, with a tiny trial and the searchers below written beside it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.core.states import TrialState
from hermes.experiment import parse_spec
from hermes.experiment.spec import ResourcesSpec
from hermes.pool import PoolSession, stored_form
from hermes.search import make_searcher
from hermes.search.errors import SamplerFailed
from hermes.store import ExperimentStatus, SqlStore
from tests.test_run import hermes, load_view, wait_for

TIMEOUT = 60
TRIAL = """\
import time

from hermes import trial


def train(config):
    for step in range(1, trial.budget() + 1):
        time.sleep(0.02)
        trial.report(step, score=config["rate"] * step)
"""
SEARCHERS = """\
import math

from hermes.search import BaseSearcher


class Good(BaseSearcher):
    learns = False

    def __init__(self, search, *, max_pending=None):
        super().__init__(max_pending=max_pending)

    def _propose(self, index):
        return {"rate": 0.2 + 0.1 * index}


class ProposeRaises(Good):
    def _propose(self, index):
        if index == 1:
            raise RuntimeError("no second idea")
        return super()._propose(index)


class EndRaises(Good):
    def _end(self, index, value, stopped):
        raise ValueError("cannot learn")


class Gives(Good):
    \"\"\"Proposes what the class attribute ``proposal`` holds.\"\"\"

    proposal = None

    def _propose(self, index):
        return self.proposal


class Outside(Gives):
    proposal = {"rate": 5.0}


class NotANumber(Gives):
    proposal = {"rate": math.nan}


class Extra(Gives):
    proposal = {"rate": 0.5, "depth": 3}


class Missing(Gives):
    proposal = {}


class Pairs(Gives):
    proposal = [("rate", 0.5)]


class LeavesOutFixed(Gives):
    proposal = {"rate": 1}


class RoundedPastLow(Gives):  # exp(log(low)) at a Sobol point of 0
    proposal = {"rate": 0.19999999999999998}


class ListedAsFloat(Gives):  # np.asarray([16, 32])[1] is 32.0
    proposal = {"rate": 0.5, "width": 32.0}


class RoundedPastZero(Gives):  # 0.1 - 0.3 + 0.2
    proposal = {"rate": 0.5, "dropout": 2.7755575615628914e-17}
"""
RATE = {"type": "uniform", "low": 0.2, "high": 1.0}


def project(folder: Path) -> Path:
    """``folder`` with the trial and the searchers beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.py").write_text(TRIAL)
    (folder / "broken_searchers.py").write_text(SEARCHERS)
    return folder


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project in ``tmp_path``, its searchers on this process's path: a pool, and a spec parsed here, import a
    plug-in from Python's path, not from beside the trial as ``hermes run`` does."""
    monkeypatch.syspath_prepend(str(project(tmp_path)))
    return tmp_path


def spec_of(folder: Path, name: str, searcher: str, trials: int = 2, **space: Any) -> dict[str, Any]:
    return {
        "name": name,
        "trial": {"function": "tiny:train", "workdir": str(folder)},
        "search": {"sampler": f"broken_searchers:{searcher}", "trials": trials, "space": {"rate": RATE, **space}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 3},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
    }


def run(tmp_path: Path, searcher: str) -> tuple[str, Any]:
    """``hermes run`` of a search by ``searcher``, which must fail: its error line, and the stored experiment."""
    spec = tmp_path / "experiment.yaml"
    spec.write_text(yaml.safe_dump(spec_of(project(tmp_path), searcher.lower(), searcher)))
    result = hermes("run", str(spec), "--no-live", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hermes: error: ")]
    assert len(errors) == 1, result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FAILED
    assert view.experiment.error and view.experiment.error in errors[0]
    return errors[0], view


def test_a_searcher_that_raises_proposing_fails_its_experiment_with_a_reason_that_names_it(tmp_path: Path) -> None:
    """It was a raw traceback and a status error "RuntimeError: no second idea" that named neither the searcher nor
    the call."""
    error, view = run(tmp_path, "ProposeRaises")
    assert error == ("hermes: error: search.sampler broken_searchers:ProposeRaises failed proposing trial 1: "
                     "RuntimeError: no second idea")
    assert [trial.state for trial in view.trials] == [TrialState.STOPPED]  # trial 0, asked before it: stopped


def test_a_searcher_that_raises_when_told_an_end_keeps_the_trial_that_ended(tmp_path: Path) -> None:
    """The exception left the engine's batch before the store had the trial's exit: trial 0 ran to its end and was
    shown interrupted."""
    error, view = run(tmp_path, "EndRaises")
    assert error == ("hermes: error: search.sampler broken_searchers:EndRaises failed when told trial 0's end: "
                     "ValueError: cannot learn")
    first, second = view.trials
    assert first.state is TrialState.COMPLETED and first.step == 3, first
    assert second.state is TrialState.STOPPED


def test_a_proposal_outside_the_space_is_refused_before_any_trial_runs(tmp_path: Path) -> None:
    """Every trial ran with ``rate: 5.0`` for a uniform [0.2, 1.0]."""
    error, view = run(tmp_path, "Outside")
    assert error == ("hermes: error: search.sampler broken_searchers:Outside failed proposing trial 0: it gave a value "
                     "outside the spec's space: 5.0 is outside search.space.rate [0.2, 1.0]")
    assert view.trials == []


@pytest.mark.parametrize(("searcher", "problem"), [
    ("NotANumber", "a value outside the spec's space: nan is outside search.space.rate [0.2, 1.0]"),
    ("Extra", "'depth', which the spec's space does not hold"),
    ("Missing", "no value for rate of the spec's space"),  # every trial failed with KeyError in the user's code
    ("Pairs", "list [('rate', 0.5)], not a dict of the space's parameters"),
])
def test_a_proposal_that_is_no_config_of_the_space_is_refused(importable: Path, searcher: str, problem: str) -> None:
    search = parse_spec(spec_of(importable, "any", searcher)).search
    with pytest.raises(SamplerFailed) as raised:
        make_searcher(search, "max").ask()
    assert str(raised.value) == f"search.sampler broken_searchers:{searcher} failed proposing trial 0: it gave {problem}"


def test_a_proposal_may_leave_out_the_fixed_parameters_and_is_given_as_declared(importable: Path) -> None:
    """As ``sampler: list`` takes a config: the fixed ones are added (every trial's config holds them, docs/search.md),
    a whole number for a uniform is a float."""
    search = parse_spec(spec_of(importable, "any", "LeavesOutFixed", sleep=0.5)).search
    config = make_searcher(search, "max").ask()
    assert config is not None and config.params == {"rate": 1.0, "sleep": 0.5}
    assert type(config.params["rate"]) is float


@pytest.mark.parametrize(("searcher", "space", "params"), [
    ("RoundedPastLow", {}, {"rate": 0.19999999999999998}),
    ("ListedAsFloat", {"width": {"type": "choice", "values": [16, 32]}}, {"rate": 0.5, "width": 32.0}),
    ("ListedAsFloat", {"width": 32}, {"rate": 0.5, "width": 32.0}),  # fixed: a choice of one
    ("RoundedPastZero", {"dropout": {"type": "uniform", "low": -1.0, "high": 0.0}},
     {"rate": 0.5, "dropout": 2.7755575615628914e-17}),
])
def test_round_off_past_a_bound_or_a_listed_number_of_another_type_is_in_the_space(
    importable: Path, searcher: str, space: dict[str, Any], params: dict[str, Any],
) -> None:
    """A searcher's arithmetic (exp of a log at a bound, float32) or NumPy's types (a float for a listed int) failed
    the experiment at its first trial, which ran before the check."""
    search = parse_spec(spec_of(importable, "any", searcher, **space)).search
    config = make_searcher(search, "max").ask()
    assert config is not None and config.params == params


def test_a_pool_fails_only_the_experiment_whose_searcher_raises(importable: Path) -> None:
    """The exception ended the whole pool, another owner's experiment with it, and again at every restart."""
    folder = importable
    store = SqlStore(f"sqlite:///{folder}/pool.db")
    doomed = store.submit_experiment("doomed", stored_form(parse_spec(spec_of(folder, "doomed", "ProposeRaises"))),
                                     owner="ann")
    calm = store.submit_experiment("calm", stored_form(parse_spec(spec_of(folder, "calm", "Good", trials=3))),
                                   owner="bob")
    pool = PoolSession(store, folder, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.05)
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        wait_for(lambda: store.experiment(calm).status is ExperimentStatus.FINISHED, TIMEOUT, "the calm one to finish")
        wait_for(lambda: store.experiment(doomed).status is ExperimentStatus.FAILED, TIMEOUT, "the doomed one to fail")
        assert runner.is_alive()
    finally:
        pool.stop()
        runner.join(TIMEOUT)
    assert [trial.state for trial in store.trials(calm)] == [TrialState.COMPLETED] * 3
    assert store.experiment(doomed).error == ("search.sampler broken_searchers:ProposeRaises failed proposing trial 1: "
                                              "RuntimeError: no second idea")


def test_an_experiment_stored_without_the_fixed_parameters_its_searcher_left_out_continues(tmp_path: Path) -> None:
    """Before proposals were checked, a proposal reached the log as the searcher gave it, its fixed parameters left
    out: a rerun compared it with the proposal now given them, and refused to continue ("proposes ... now")."""
    import json
    import sqlite3

    folder = project(tmp_path)
    path = tmp_path / "experiment.yaml"
    spec = spec_of(folder, "stored-before", "LeavesOutFixed", trials=1, sleep=0.01)
    path.write_text(yaml.safe_dump(spec))
    assert hermes("run", str(path), "--no-live", cwd=tmp_path).returncode == 0
    with sqlite3.connect(tmp_path / "runs" / "hermes.db") as db:  # as the Hermes before the check wrote it
        [(seq, data)] = db.execute("SELECT seq, data FROM events WHERE type = 'TrialSubmitted'").fetchall()
        event = json.loads(data)
        assert event["params"] == {"rate": 1.0, "sleep": 0.01}
        del event["params"]["sleep"]
        db.execute("UPDATE events SET data = ? WHERE seq = ?", (json.dumps(event), seq))
    path.write_text(yaml.safe_dump({**spec, "search": {**spec["search"], "trials": 2}}))
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 0 and "stored-before: finished (continued)" in result.stdout, result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2
