"""A rerun with a larger time or GPU budget continues the trials the spent budget stopped (docs/search.md, "Budgets").

Real `hermes run` processes on one CPU slot and a SQLite store. The first run's trial 0 reports two checkpointed
steps, then waits for a gate file that is not there: the budget ends while it waits, before any other trial starts
(its start and two steps of 0.05 s take well under the budget's 1.5 s). The gate is made before the rerun that
extends the budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermes.core.decisions import Resume, Start
from hermes.core.states import TrialState
from hermes.report import open_store, pick_experiment
from hermes.report.status import experiment_status
from hermes.session import BUDGET_SPENT
from hermes.store import ExperimentStatus
from tests.test_run import hermes, load_view, run_ok, write_spec

TRIAL = '''
import time
from pathlib import Path

from hermes import trial

GATE = Path(__file__).with_name("gate")


def train(config):
    """Steps of 0.05 s from its checkpoint; past step 2 only once the gate is there. Each run notes where it began."""
    saver = trial.Files(lambda directory: (directory / "x").write_text("x"), lambda directory: None)
    start = saver.restore()
    with open(trial.trial_dir() / "starts", "a") as starts:
        starts.write(f"{start}\\n")
    for step in range(start + 1, trial.budget() + 1):
        time.sleep(0.05)
        while step > 2 and not GATE.exists():
            time.sleep(0.05)
        trial.report(step, loss=config["x"] + 1.0 / step)
'''


def spec_in(folder: Path, name: str, search: dict[str, Any]) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gated.py").write_text(TRIAL)
    return {
        "name": name,
        "trial": {"function": "gated:train", "workdir": str(folder)},
        "search": search,
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 4},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs", "checkpoint_every": 1},
    }


def logged(folder: Path) -> tuple[int, str | None]:
    """How many events the experiment's log holds, and why `hermes status` says it ended before its searcher did."""
    store = open_store(folder / "runs")
    try:
        experiment = pick_experiment(store, None)
        return len(store.events(experiment.experiment_id)), experiment_status(store, experiment).ended_by
    finally:
        store.close()


def run_stopped_by_budget(folder: Path, search: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The first run, whose budget ends while trial 0 waits at its step 3: the others never start."""
    spec = spec_in(folder, "extended", search)
    path = write_spec(folder, spec)
    run_ok(path)
    view, _ = load_view(folder / "runs")
    assert [t.state for t in view.trials] == [TrialState.STOPPED] * len(view.trials)
    assert view.trials[0].checkpoint_step == 2 and all(t.started_at is None for t in view.trials[1:])
    assert logged(folder)[1] == BUDGET_SPENT
    return spec, path


def extend(folder: Path, spec: dict[str, Any], path: Path, field: str, larger: float) -> None:
    """Rerun with a larger ``field``: every trial completes, none asked anew; trial 0 from its checkpoint."""
    first, _ = load_view(folder / "runs")
    (folder / "gate").touch()
    spec["search"][field] = larger
    write_spec(folder, spec)
    run_ok(path)
    extended, decisions = load_view(folder / "runs")
    assert [(t.trial_id, t.params) for t in extended.trials] == [(t.trial_id, t.params) for t in first.trials]
    assert all(t.state is TrialState.COMPLETED and t.step == 4 for t in extended.trials)
    assert [d.trial_id for d in decisions if isinstance(d, Resume)] == ["0"]
    assert [d.trial_id for d in decisions if isinstance(d, Start)] == [t.trial_id for t in extended.trials]
    assert (folder / "runs" / "extended" / "trials" / "0" / "starts").read_text() == "0\n2\n"  # its checkpoint's
    assert [run.ended_by for run in extended.runs] == ["stopped"] + ["completed"] * len(extended.trials)
    assert extended.experiment.status is ExperimentStatus.FINISHED and logged(folder)[1] is None


def test_a_rerun_with_a_larger_max_time_runs_the_trials_its_end_stopped(tmp_path: Path) -> None:
    """Random search: a rerun with the same max_time leaves it as it ended; a larger one runs the four trials."""
    space = {"x": {"type": "uniform", "low": 0.0, "high": 1.0}}
    spec, path = run_stopped_by_budget(tmp_path, {"sampler": "random", "trials": 4, "space": space, "max_time": 1.5})
    events = logged(tmp_path)[0]
    assert "extended: finished (continued)" in run_ok(path).stdout
    assert logged(tmp_path) == (events, BUDGET_SPENT)
    extend(tmp_path, spec, path, "max_time", 60)


def test_a_rerun_with_more_gpu_hours_evaluates_the_grid_points_never_run(tmp_path: Path) -> None:
    space = {"x": {"type": "grid", "values": [0.1, 0.2, 0.3]}}
    spec, path = run_stopped_by_budget(tmp_path, {"sampler": "grid", "space": space, "max_gpu_hours": 1.5 / 3600})
    extend(tmp_path, spec, path, "max_gpu_hours", 0.01)


BUGGY = """
from hermes.policies.fifo import FifoPolicy


class Buggy(FifoPolicy):
    def observe(self, trial, now):
        raise RuntimeError("bug in my policy")
"""


def test_a_larger_budget_whose_first_rerun_failed_still_runs_them(tmp_path: Path) -> None:
    """The rerun with the larger budget fails as its log replays (a policy of one's own that raises): the store took
    the budget as it opened the experiment, so the next rerun, policy fixed, found it unchanged and ran nothing."""
    space = {"x": {"type": "uniform", "low": 0.0, "high": 1.0}}
    spec, path = run_stopped_by_budget(tmp_path, {"sampler": "random", "trials": 3, "space": space, "max_time": 1.5})
    (tmp_path / "buggy.py").write_text(BUGGY)
    spec["search"]["max_time"] = 60
    write_spec(tmp_path, {**spec, "policy": {"name": "buggy:Buggy"}})
    failed = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert failed.returncode == 2 and "observe() raised RuntimeError: bug in my policy" in failed.stderr, failed
    extend(tmp_path, spec, path, "max_time", 60)
