"""The local executor's event loop ticks by its period on the clock it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.errors import HermesError
from hermes.experiment import load_spec
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
def test_a_spec_refuses_a_period_no_process_switches_at(period: float, tmp_path: Path) -> None:
    spec = spec_of("tiny-period", policy={"name": "hermes", "period": period})
    with pytest.raises(HermesError, match="policy.period: Input should be greater than or equal to 0.01"):
        load_spec(write_spec(tmp_path, spec))
