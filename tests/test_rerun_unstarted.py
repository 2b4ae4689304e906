"""A rerun of an experiment whose trials were drawn but never started may say where they run.

On Ray, a spec that asks for GPUs the cluster lacks waits, saying "to run on the nodes' CPUs instead, set
resources.gpus: none and resources.cpu_slots"; its trials' submissions are in the store by then, so the rerun that
followed the advice was refused ("differs in resources.gpus, resources.cpu_slots"). The store is left as that run
left it (its submissions, no start), the rerun is a real `hermes run`.
"""

from __future__ import annotations

from pathlib import Path

from test_run import hermes, load_view, spec_of, write_spec

from hermes.core.events import TrialSubmitted
from hermes.core.states import TrialState
from hermes.experiment import parse_spec
from hermes.store import SqlStore, TrialRecord

CONFIGS = [{"rate": 0.3, "sleep": 0.0}, {"rate": 0.6, "sleep": 0.0}]


def drawn_not_started(tmp_path: Path, resources: dict[str, object]) -> dict[str, object]:
    """A spec, and its experiment in the store as a run that drew its trials and started none left it."""
    spec = spec_of("waited", search={"sampler": "list", "configs": CONFIGS}, resources=resources)
    document = parse_spec(spec, source="spec", base_dir=tmp_path).model_dump(mode="json")
    (tmp_path / "runs").mkdir()
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    try:
        experiment = store.create_or_open_experiment("waited", document)
        for index, params in enumerate(CONFIGS):
            store.record_event(experiment, TrialSubmitted(0.0, str(index), 5, params), [],
                               [TrialRecord(str(index), params, TrialState.PENDING, 5, 0.0)])
    finally:
        store.close()
    return spec


def test_a_rerun_of_trials_that_never_started_may_change_their_resources(tmp_path: Path) -> None:
    spec = drawn_not_started(tmp_path, {"gpus": "all"})
    result = hermes("run", str(write_spec(tmp_path, {**spec, "resources": {"gpus": "none", "cpu_slots": 1}})),
                    "--no-live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.trial_id, trial.state) for trial in view.trials] == [("0", TrialState.COMPLETED),
                                                                         ("1", TrialState.COMPLETED)]


def test_what_the_drawn_trials_are_may_not_change(tmp_path: Path) -> None:
    spec = drawn_not_started(tmp_path, {"gpus": "none", "cpu_slots": 2})
    result = hermes("run", str(write_spec(tmp_path, {**spec, "budget": {"steps": 3}})), "--no-live", cwd=tmp_path)
    assert result.returncode == 2 and "differs in budget.steps" in result.stderr, result.stderr
