"""``policy: hermes`` and ``policy.stopper: median``: a bare name, as ``search.sampler: tpe`` takes one (the README
and docs/policy.md write ``policy.stopper: median``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes.errors import SpecError
from hermes.experiment import parse_spec
from tests.test_run import hermes, search, spec_of, write_spec


def stored_policy(storage: Path) -> dict[str, Any]:
    with sqlite3.connect(storage / "hermes.db") as connection:
        [(spec,)] = connection.execute("SELECT spec FROM experiments").fetchall()
    return json.loads(spec)["policy"]


def test_a_bare_stopper_runs_and_is_stored_as_its_mapping_so_a_rerun_of_either_form_matches(tmp_path: Path) -> None:
    """``hermes run`` refused the documented form: "policy.stopper: Input should be a valid dictionary or instance
    of StopperSpec" (exit 2)."""
    spec = spec_of("bare", search=search(1, 0, 0.0), budget={"steps": 1}, resources={"gpus": "none", "cpu_slots": 1},
                   policy={"name": "hermes", "stopper": "median"})
    path = write_spec(tmp_path, spec)
    first = hermes("run", str(path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    stored = {"name": "hermes", "params": {}, "stopper": {"name": "median", "params": {}}}
    assert stored_policy(tmp_path / "runs") == stored
    write_spec(tmp_path, {**spec, "policy": {"name": "hermes", "stopper": {"name": "median"}}})
    again = hermes("run", str(path), cwd=tmp_path)
    assert again.returncode == 0 and "different spec" not in again.stderr, again.stderr
    assert stored_policy(tmp_path / "runs") == stored


def test_a_bare_policy_reads_as_its_mapping() -> None:
    """``policy: hermes`` was "policy: Input should be a valid dictionary or instance of PolicySpec"."""
    base = spec_of("bare", search=search(1, 0, 0.0))
    for bare, mapping in [("hermes", {"name": "hermes"}), ("fifo", {"name": "fifo"}),
                          ({"name": "rr", "stopper": "asha"}, {"name": "rr", "stopper": {"name": "asha"}})]:
        given = parse_spec({**base, "policy": bare}).model_dump(mode="json")
        assert given == parse_spec({**base, "policy": mapping}).model_dump(mode="json")


STOPPER_SHAPE = "a stopper's name (asha, median, or module:Class of your own) or a mapping with name and params"
POLICY_SHAPE = ("a policy's name (fifo, rr, slaq, asha, hyperband, hermes, or module:Class of your own) or a "
                "mapping of name, period, params and stopper")


@pytest.mark.parametrize(("policy", "message"), [
    ({"name": "hermes", "stopper": 3}, f"policy.stopper: must be {STOPPER_SHAPE}, got 3"),
    ({"name": "hermes", "stopper": ["median"]}, f"policy.stopper: must be {STOPPER_SHAPE}, got ['median']"),
    (["hermes"], f"policy: must be {POLICY_SHAPE}, got ['hermes']"),
    (None, f"policy: must be {POLICY_SHAPE}, got None"),
    ({"name": "hermes", "stopper": "medain"}, "policy.stopper.name: unknown early stopper 'medain'; choose one"),
    ("gandiva", "policy.name: unknown policy 'gandiva'; choose one of fifo, rr"),
])
def test_a_policy_or_stopper_of_another_shape_is_told_what_to_write(policy: Any, message: str) -> None:
    """Not pydantic's words naming an internal class (PolicySpec, StopperSpec)."""
    with pytest.raises(SpecError) as raised:
        parse_spec({**spec_of("shape", search=search(1, 0, 0.0)), "policy": policy})
    assert str(raised.value).startswith(f"<spec>: {message}")
    assert "Spec" not in str(raised.value)
