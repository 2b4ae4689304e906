"""``hermes.run`` from Python: the same experiment as ``hermes run``, its results as objects.

Real trial processes (tests/trials/curve.py on CPU slots), a real SQLite store, the real CLI to compare with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hermes
from hermes.errors import SpecError
from hermes.trial import protocol
from tests.test_run import hermes as hermes_cli
from tests.test_run import score, search, spec_of, write_spec


def test_run_from_python_gives_what_hermes_results_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a spec given as a mapping: its relative paths start here
    budget = 4
    spec = spec_of("from-python", search=search(5, 2, 0.01), budget={"steps": budget},
                   storage={"dir": "runs", "checkpoint_every": 2})
    result = hermes.run(spec)
    assert (result.name, result.status, result.error, result.resumed) == ("from-python", "finished", None, False)
    assert result.store == (tmp_path / "runs" / "hermes.db").resolve()
    assert [trial.rank for trial in result.trials] == [1, 2, 3, 4, 5]
    for trial in result.trials:
        assert trial.state == "completed" and trial.steps == budget
        assert trial.final == score(trial.params["rate"], budget)
        assert trial.directory == (tmp_path / "runs" / "from-python" / "trials" / trial.trial_id).resolve()
        assert json.loads((trial.checkpoint / protocol.META_FILE).read_text())["step"] == budget
    best = result.best
    assert best is result.trials[0] and best.best == max(trial.best for trial in result.trials)

    cli = json.loads(hermes_cli("results", "runs", "--format", "json", cwd=tmp_path).stdout)
    assert [(row["trial"], row["best"], row["checkpoint"]) for row in cli] == [
        (trial.trial_id, trial.best, str(trial.checkpoint)) for trial in result.trials]

    again = hermes.run(write_spec(tmp_path, spec))  # a path, this time: the experiment is found, and is finished
    assert again.resumed and again.experiment_id == result.experiment_id and again.trials == result.trials


def test_run_from_python_refuses_a_wrong_spec_naming_its_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="budget.steps"):
        hermes.run(spec_of("wrong", budget={"steps": 0}))
    assert not (tmp_path / "runs").exists()
    with pytest.raises(AttributeError, match="no attribute 'runn'"):
        hermes.runn  # noqa: B018
