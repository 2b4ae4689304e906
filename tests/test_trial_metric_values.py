"""A metric that float() cannot hold is no number: left out, or the objective's error names it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hermes import trial
from tests.test_trial_api import Channel


def test_a_metric_that_a_float_cannot_hold_is_left_out_or_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An int of 10**400 (OverflowError) or a complex tensor (RuntimeError) crashed the trial with a traceback, where
    a metric besides the objective that is no number is left out, said once; numpy's complex lost its imaginary part.
    The objective's error names it and says why."""
    channel = Channel(tmp_path / "t1", monkeypatch)
    channel.answer("continue")
    trial.report(1, accuracy=0.5, count=10**400, spectrum=torch.tensor(1 + 2j), phase=np.complex128(1 + 2j),
                 huge=10**5000)  # whose repr Python refuses (over 4300 digits)
    assert [message["metrics"] for message in channel.received()] == [{"accuracy": 0.5}]
    ten = "1" + "0" * 79
    assert capsys.readouterr().err.splitlines() == [
        f"hermes: trial t1: its metric {name!r} is left out: the store keeps numbers, it reported {shown}"
        for name, shown in (("count", f"int {ten} (int too large to convert to float)"),
                            ("spectrum", "Tensor tensor(1.+2.j)"), ("phase", "complex128 np.complex128(1+2j)"),
                            ("huge", "int (int too large to convert to float)"))
    ]
    with pytest.raises(TypeError, match=r"^metric 'accuracy' must be a number, got int 1000.* \(int too large to "):
        trial.report(2, accuracy=10**400)
    assert channel.received() == []
