"""A rerun with a larger budget that runs again the trials the spent budget stopped keeps to search.max_pending:
the searcher was told those trials ended as they stopped, so it counted none of them in flight and asked as many
new ones at once, which waited (on a budget that ended again first, they never started and ended stopped).

Real `hermes run` processes on one CPU slot and a SQLite store, as in tests/test_budget_rerun.py: the first run's
budget ends while trial 0 waits at its step 3 for a gate file, and trial 1 has not started.
"""

from __future__ import annotations

from pathlib import Path

from hermes.core.decisions import Resume
from hermes.core.states import TrialState
from tests.test_budget_rerun import run_stopped_by_budget
from tests.test_run import load_view, run_ok, write_spec

MAX_PENDING = 2


def test_a_rerun_that_runs_the_stopped_trials_again_counts_them_in_max_pending(tmp_path: Path) -> None:
    space = {"x": {"type": "uniform", "low": 0.0, "high": 1.0}}
    search = {"sampler": "random", "trials": 4, "max_pending": MAX_PENDING, "space": space, "max_time": 1.5}
    spec, path = run_stopped_by_budget(tmp_path, search)
    first, _ = load_view(tmp_path / "runs")
    assert [t.trial_id for t in first.trials] == ["0", "1"]

    (tmp_path / "gate").touch()
    spec["search"]["max_time"] = 60
    write_spec(tmp_path, spec)
    run_ok(path)
    view, decisions = load_view(tmp_path / "runs")
    assert [d.trial_id for d in decisions if isinstance(d, Resume)] == ["0"]
    assert [t.trial_id for t in view.trials] == ["0", "1", "2", "3"]
    assert all(t.state is TrialState.COMPLETED and t.step == 4 for t in view.trials)
    completed = {run.trial_id: run.ended_at for run in view.runs if run.ended_by == "completed"}
    for trial in view.trials:  # unfinished from its submission to its completed run's end, stopped or not
        in_flight = [t.trial_id for t in view.trials
                     if t.submitted_at <= trial.submitted_at < completed[t.trial_id]]
        assert len(in_flight) <= MAX_PENDING, (trial.trial_id, in_flight)
