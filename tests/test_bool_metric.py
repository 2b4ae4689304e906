"""A bool is no metric: ``float(True)`` is 1.0, so ``trial.report(step, accuracy=True)`` was stored as 1.0 and ranked
first. The objective as a bool (Python's, numpy's, a torch tensor of one) now fails the trial as any other value that
is no number does; another metric that is a bool is left out, said on the trial's stderr, as text is."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hermes import trial
from hermes.core.decisions import Start
from hermes.core.events import Event, TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_trial_api import Channel
from tests.test_warm_trial_edges import LIMITS, module
from tests.test_warm_workers import until_ended


def run(tmp_path: Path, code: str) -> list[Event]:
    """The events of a trial of ``code`` (budget 2, objective ``score``), run in a process of its own."""
    function = module(tmp_path, "judged", code)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(2, function=function, cwd=str(tmp_path), warm=False))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        return until_ended(executor, 1)


def test_a_bool_objective_fails_the_trial_instead_of_scoring_one(tmp_path: Path) -> None:
    events = run(tmp_path, """
        from hermes import trial


        def train(config):
            trial.report(1, score=True)
    """)
    [exited] = [e for e in events if isinstance(e, TrialExited)]
    assert not [e for e in events if isinstance(e, TrialReported)]
    assert not exited.succeeded
    assert "TypeError: metric 'score' must be a number, got bool True" in (exited.error or ""), exited.error


def test_another_metric_that_is_a_bool_is_left_out_and_said(tmp_path: Path) -> None:
    events = run(tmp_path, """
        from hermes import trial


        def train(config):
            for step in (1, 2):
                trial.report(step, score=step / 10, converged=step == 2)
    """)
    assert [(e.step, e.metrics) for e in events if isinstance(e, TrialReported)] == [
        (1, {"score": 0.1}), (2, {"score": 0.2})]
    assert (tmp_path / "run" / "trials" / "a" / "stderr.log").read_text() == (
        "hermes: trial a: its metric 'converged' is left out: the store keeps numbers, it reported bool False\n")


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Channel:
    return Channel(tmp_path / "t1", monkeypatch)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(np.True_, "bool np.True_"), (torch.tensor(True), "Tensor tensor(True)")],
    ids=["numpy", "torch"],
)
def test_numpys_and_torchs_bools_are_no_numbers_either(channel: Channel, value: Any, shown: str) -> None:
    channel.answer("continue")  # for the report that follows (a bool taken would take it instead of blocking)
    with pytest.raises(TypeError, match="^" + re.escape(f"metric 'accuracy' must be a number, got {shown}")):
        trial.report(1, accuracy=value)
    assert channel.received() == []
    trial.report(1, accuracy=np.float32(0.5), loss=torch.tensor(0.25))  # their numbers still are
    assert channel.received()[0]["metrics"] == {"accuracy": 0.5, "loss": 0.25}
