"""What the docs promise, held against the code: an async trial refused up front, the grid's trial count, the trial
API's exports, `hermes status` of an ended experiment, the simulator's tolerance.

Real spec checks (the module's syntax tree, ``hermes.run``), a real trial session on real pipes, a real SQLite store.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import hermes
from hermes import trial
from hermes.cli import main
from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.report import STORE_FILE
from hermes.report.status import experiment_status, format_status
from hermes.store import ExperimentStatus, SqlStore
from hermes.trial import protocol
from tests.test_report import spec
from tests.test_run import ROOT, search, spec_of
from tests.test_trial_api import Channel

TRIAL_IS_NOT_ASYNC = ("a trial's process calls its function without awaiting it, so an async def's body would never "
                      "run: make it a plain def (def train(config): ...), with asyncio.run inside if it needs a loop")

ASYNC_TRIALS = """
from hermes import trial


async def atrain(config):  # its process called it and dropped the coroutine: "ended without a report"
    trial.report(1, score=config["rate"])


async def agen(config):
    yield trial.report(1, score=config["rate"])


def _in_a_loop(function):
    return lambda config: None


@_in_a_loop
async def wrapped(config):  # a decorator may make it a plain function
    pass
"""


def test_an_async_trial_function_is_refused_at_the_spec_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``async def`` passed the check, then every trial failed "ended without a report" (its coroutine was never
    awaited, said only in stderr.log)."""
    (tmp_path / "asyncs.py").write_text(ASYNC_TRIALS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = spec_of("asyncs", search=search(1, 0, 0.01), budget={"steps": 1})
    module = importlib.import_module("asyncs")
    for name in ("atrain", "agen"):
        with pytest.raises(SpecError) as raised:
            hermes.run({**spec, "trial": {"function": getattr(module, name)}})
        assert str(raised.value) == f"trial.function: {name} is an async def: {TRIAL_IS_NOT_ASYNC}"
        with pytest.raises(SpecError) as raised:
            hermes.run({**spec, "trial": {"function": f"asyncs:{name}", "workdir": str(tmp_path)}})
        assert str(raised.value) == (f"<spec>: trial.function: module asyncs ({tmp_path / 'asyncs.py'}) defines "
                                     f"{name!r} as an async def: {TRIAL_IS_NOT_ASYNC}")
    assert not (tmp_path / "runs").exists()
    wrapped = {**spec, "trial": {"function": "asyncs:wrapped", "workdir": str(tmp_path)}}
    assert parse_spec(wrapped, base_dir=tmp_path).trial.function == "asyncs:wrapped"


def test_a_random_search_over_a_grid_needs_a_multiple_of_its_combinations() -> None:
    """docs/search.md said trial i takes combination i mod n, as if any count did; the check wants a multiple."""
    space = {"lr": {"type": "grid", "values": [0.1, 0.2, 0.3]}, "m": {"type": "uniform", "low": 0, "high": 1}}
    spec = spec_of("grid", search={"sampler": "random", "trials": 4, "space": space})
    refusal = "search.trials: must be a multiple of the 3 grid combinations"
    with pytest.raises(SpecError, match=refusal):
        parse_spec(spec)
    assert parse_spec({**spec, "search": {**spec["search"], "trials": 6}}).search.trials == 6
    assert refusal in (ROOT / "docs" / "search.md").read_text()


def test_resume_error_is_exported_by_the_trial_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/trials.md names ``ResumeError`` as what ``report`` raises; ``hermes.trial`` did not export it, so a
    trial could not catch it by that name."""
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Files(lambda directory: None, lambda directory: None)
    first.answer(protocol.SUSPEND)
    with pytest.raises(trial.SuspendExit):
        trial.report(1, accuracy=0.5)
    Channel(tmp_path / "t1", monkeypatch)
    trial.Files(lambda directory: None, lambda directory: None)  # registered, never restored
    with pytest.raises(trial.ResumeError, match="reported step 1, but it resumed from its checkpoint of step 1"):
        trial.report(1, accuracy=0.5)
    assert "ResumeError" in trial.__all__


def test_status_of_an_ended_experiment_without_reports_has_no_best_and_expects_none(tmp_path: Path) -> None:
    """It said "none yet" of a finished experiment, as if a report might still come."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        experiment_id = store.create_or_open_experiment("silent", spec("silent", "accuracy", "max"))
        running = format_status(experiment_status(store, store.experiment(experiment_id)))
        assert "best        none yet (no trial has reported)" in running.splitlines()
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
        ended = format_status(experiment_status(store, store.experiment(experiment_id)))
        assert "best        none (no trial reported)" in ended.splitlines()
    finally:
        store.close()


def test_a_negative_target_tolerance_is_refused_as_negative(capsys: pytest.CaptureFixture[str]) -> None:
    """``--target-tolerance -1`` was "must be a number or a percentage", which -1 is."""
    simulate = ["simulate", "--trace", str(ROOT / "data" / "digits_mlp.csv"), "--mode", "max", "--gpus", "2",
                "--policy", "fifo"]
    for option, negative in ((["--target-tolerance", "-1"], "-1"),
                             (["--target-tolerance=-2%"], "-2%")):  # with a space argparse takes -2% for an option
        assert main([*simulate, *option]) == 2
        assert (f"target tolerance must not be negative (a distance from the best), got {negative!r}"
                in capsys.readouterr().err)
    assert main([*simulate, "--target-tolerance", "0"]) == 0
