"""A section written as a bare value (``metric: accuracy``, ``budget: 20``) was refused in pydantic's words, naming an
internal class ("metric: Input should be a valid dictionary or instance of MetricSpec"): it now says what the section
must hold, in the spec's own terms, as ``policy`` and ``policy.stopper`` already did. No shorthand is taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes.errors import SpecError
from hermes.experiment import parse_spec
from tests.test_run import hermes, search, spec_of, write_spec


@pytest.mark.parametrize(("section", "bare", "message"), [
    ("metric", "accuracy", "metric: must be a mapping such as {name: accuracy, mode: max}, got 'accuracy'"),
    ("budget", 20, "budget: must be a mapping such as {steps: 20}, got 20"),
    ("resources", "cpu", "resources: must be a mapping such as {gpus: none, cpu_slots: 4}, got 'cpu'"),
    ("storage", "runs", "storage: must be a mapping such as {dir: runs}, got 'runs'"),
    ("trial", "tiny:train", "trial: must be a mapping such as {function: train:main} or {command: 'python train.py "
                            "--lr {lr}'}, got 'tiny:train'"),
    ("search", "random", "search: must be a mapping such as {sampler: random, trials: 20, space: "),
    ("ray", "local", "ray: must be a mapping such as {address: local}, got 'local'"),
])
def test_a_bare_section_is_told_what_it_must_hold(section: str, bare: Any, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({**spec_of("bare", search=search(1, 0, 0.0)), section: bare})
    assert str(raised.value).startswith(f"<spec>: {message}")
    assert "Spec" not in str(raised.value) and "dictionary" not in str(raised.value)


def test_a_nested_section_lists_its_fields_and_every_problem_is_said(tmp_path: Path) -> None:
    """``trial.stall`` has no example: its fields are listed. Each bare section is a problem of its own, said
    together by ``hermes run``."""
    spec = spec_of("bare", search=search(1, 0, 0.0))
    path = write_spec(tmp_path, {**spec, "trial": {**spec["trial"], "stall": 5}, "metric": ["accuracy"]})
    refused = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert refused.returncode == 2
    assert "trial.stall: must be a mapping of factor, min, after, got 5" in refused.stderr
    assert "metric: must be a mapping such as {name: accuracy, mode: max}, got ['accuracy']" in refused.stderr


def test_every_example_a_refusal_gives_is_a_spec_that_reads() -> None:
    """The trial's example, {command: python train.py --lr {lr}}, was no YAML: its {lr} ended the flow mapping."""
    import yaml

    from hermes.experiment.spec import ExperimentSpec

    for field in ExperimentSpec.model_fields.values():
        section = field.annotation
        example = getattr(section, "_example", "") if isinstance(section, type) else ""
        for written in filter(None, example.split(" or ") if example else []):
            assert isinstance(yaml.safe_load(written), dict), written
