"""The local executor's event loop ticks by its period on the clock it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.experiment import load_spec
from hermes.local.engine import MIN_TICK_S, tick_period
from hermes.local.loop import EventLoop
from tests.test_run import spec_of, write_spec


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_tick_comes_once_whatever_the_periods_missed() -> None:
    clock = Clock(0.0)
    loop = EventLoop(2.0, clock)
    try:
        assert not loop.tick()
        clock.now = 9.0  # four periods missed: one tick, and the next at 10
        assert loop.tick() and not loop.tick()
        clock.now = 10.0
        assert loop.tick() and not loop.tick()
    finally:
        loop.close()


@pytest.mark.timeout(10)
def test_a_period_below_the_clocks_resolution_ticks_and_returns() -> None:
    """At 500 s a period of 1e-300 s added nothing, and the loop that stepped through the missed periods never ended
    (a server's pool, every user's experiments with it)."""
    clock = Clock(0.0)
    loop = EventLoop(1e-300, clock)
    try:
        clock.now = 500.0
        assert loop.tick() and not loop.tick()
        clock.now = 501.0
        assert loop.tick()
    finally:
        loop.close()


@pytest.mark.parametrize("period", [1e-300, 0.0001])
def test_an_unmodified_programs_ticks_come_no_faster_than_a_process_switches(period: float, tmp_path: Path) -> None:
    """A period of 1e-4 s wrote 1,200 ticks a second to the store; refusing it at the spec instead failed a server's
    experiment accepted before, when the server was upgraded."""
    spec = spec_of("tiny-period", trial={"command": "python train.py", "metrics_regex": r"loss=(?P<value>\S+)"},
                   policy={"name": "hermes", "period": period})
    loaded = load_spec(write_spec(tmp_path, spec))
    assert loaded.policy.period == period  # the policy's own, as written
    assert tick_period(loaded) == MIN_TICK_S


def test_an_unmodified_programs_ticks_follow_a_period_given_in_the_policys_params(tmp_path: Path) -> None:
    """``policy.params.period`` sets the policy's period as ``policy.period`` does, but the ticks that let the core
    preempt a program between its printed lines stayed at 60 s."""
    spec = spec_of("params-period", trial={"command": "python train.py", "metrics_regex": r"loss=(?P<value>\S+)"},
                   policy={"name": "rr", "params": {"period": 2.5}})
    assert tick_period(load_spec(write_spec(tmp_path, spec))) == 2.5
