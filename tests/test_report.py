"""hermes status, results and plot, on stores filled by real simulations through the real engine.

Each experiment is recorded the way a runner records one: every event with its decisions, every
report's metrics, and each trial's record whenever it changes. The reports must then agree with
what the scheduling core itself knows at the end (or at the moment the run was interrupted).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.decisions import Decision, Resume, Suspend
from hermes.core.events import Event, SubmissionsClosed, TrialReported, TrialSubmitted
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.errors import HermesError
from hermes.execution.engine import Engine
from hermes.experiment import parse_spec
from hermes.policies import make_policy
from hermes.report import NAMES_SHOWN, STORE_FILE, ExperimentView, open_store, pick_experiment
from hermes.report.files import TrialFiles, checkpoint_location, note_checkpoint_location, trial_files
from hermes.report.results import format_results, standings
from hermes.report.status import experiment_status, format_status
from hermes.report.trace import _param, experiment_trace
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import Trace, TraceTrial, load_trace, write_trace
from hermes.store import ExperimentStatus, ExperimentStore, SqlStore, TrialRecord
from hermes.store.lock import RunnerLock
from tests.test_run import UNWRITABLE, environment, hermes_command, unwritable

LAYOUT = {"n0": ("n0/g0", "n0/g1"), "n1": ("n1/g0",)}


def spec(name: str, metric: str, mode: str) -> dict[str, object]:
    """A valid spec, stored as the runner stores one, so the reports read the real spec's layout."""
    parsed = parse_spec(
        {
            "name": name,
            "trial": {"function": "examples.digits.train:train"},
            "search": {"trials": 10, "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}}},
            "metric": {"name": metric, "mode": mode},
            "budget": {"steps": 6},
            "policy": {"name": "rr", "period": 20.0},
        }
    )
    return parsed.model_dump(mode="json")


class Interrupted(Exception):
    """Raised by the recorder to cut a run short, as if its runner had been killed."""


@dataclass
class Recording:
    experiment_id: int
    scheduler: Scheduler
    events: int = 0
    preemptions: int = 0
    migrations: int = 0
    written: dict[str, TrialRecord] = field(default_factory=dict)


def record_simulation(
    store: ExperimentStore, name: str, *, mode: str, seed: int, trials: int = 10, stop_after: int | None = None
) -> Recording:
    """Run a synthetic trace through the engine and record it in ``store`` as a runner would.

    The objective is reported as ``score`` next to a decoy metric ``other``, so the reports must pick
    the objective by the name in the spec. ``stop_after`` events, the run is interrupted.
    """
    trace = synthetic_trace(trials, 6, seed=seed, mode=mode, epoch_seconds=(5.0, 20.0), diverge_fraction=0.2)
    experiment_id = store.create_or_open_experiment(name, spec(name, "score", mode))
    scheduler = Scheduler(make_policy("rr", period=20), objective=Objective(mode))
    executor = SimulatedExecutor(LAYOUT, SwitchCosts.profile("process"))  # as before warm costs became the default
    recording = Recording(experiment_id, scheduler)
    started_at: dict[str, float] = {}

    def record(event: Event, decisions: list[Decision]) -> None:
        store.append_event(experiment_id, event, decisions)
        if isinstance(event, TrialReported):
            metrics = {"other": -event.value, "score": event.value}
            store.record_metrics(experiment_id, event.trial_id, event.step, event.at, metrics)
        recording.preemptions += sum(isinstance(d, Suspend) for d in decisions)
        recording.migrations += sum(isinstance(d, Resume) and d.migrated for d in decisions)
        for trial in scheduler.trials.values():
            if trial.state is not TrialState.PENDING:
                started_at.setdefault(trial.trial_id, event.at)
            record_trial(store, recording, trial, started_at.get(trial.trial_id), event.at)
        recording.events += 1
        if recording.events == stop_after:
            raise Interrupted

    engine = Engine(scheduler, executor, [record])
    for i, curve in enumerate(trace.trials):
        executor.submit(curve.name, curve)
        engine.post(TrialSubmitted(0.0, curve.name, curve.epochs, {"lr": 10.0 ** -(1 + i % 3), **curve.params}))
    engine.post(SubmissionsClosed(0.0))
    try:
        engine.run()
    except Interrupted:
        store.set_status(experiment_id, ExperimentStatus.INTERRUPTED)
    else:
        store.set_status(experiment_id, ExperimentStatus.FINISHED)
    return recording


def record_trial(store: ExperimentStore, recording: Recording, trial: Trial, started: float | None, now: float) -> None:
    """Upsert the trial's record when it changed since it was last written."""
    previous = recording.written.get(trial.trial_id)
    ended = previous.ended_at if previous is not None and previous.ended_at is not None else now
    record = TrialRecord(
        trial_id=trial.trial_id,
        params=dict(trial.params),
        state=trial.state,
        budget=trial.budget,
        submitted_at=trial.submitted_at,
        step=trial.step,
        checkpoint_step=trial.checkpoint_step,
        gpu=trial.gpu,
        error=trial.error,
        started_at=started,
        ended_at=ended if trial.state.is_terminal else None,
    )
    if record != previous:
        store.upsert_trial(recording.experiment_id, record)
        recording.written[trial.trial_id] = record


def best_by_core(scheduler: Scheduler) -> Trial:
    """The trial with the highest score the core saw; ties go to the earlier submission."""
    reported = [t for t in scheduler.trials.values() if t.scores]
    return max(reported, key=lambda t: (max(t.scores), -t.seq))


@dataclass
class Recorded:
    directory: Path
    finished: Recording  # "sweep": mode max, run to the end
    minimised: Recording  # "loss-sweep": mode min, run to the end
    interrupted: Recording  # "cut": mode max, stopped mid-run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    directory = tmp_path_factory.mktemp("runs")
    store = SqlStore(f"sqlite:///{directory / STORE_FILE}")
    try:
        return Recorded(
            directory,
            record_simulation(store, "sweep", mode="max", seed=1),
            record_simulation(store, "loss-sweep", mode="min", seed=2),
            record_simulation(store, "cut", mode="max", seed=3, stop_after=25),
        )
    finally:
        store.close()


@pytest.fixture
def store(recorded: Recorded) -> Iterator[SqlStore]:
    opened = open_store(recorded.directory)
    yield opened
    opened.close()


def view_of(store: SqlStore, name: str) -> ExperimentView:
    return ExperimentView.load(store, pick_experiment(store, name))


# ---------------------------------------------------------------------- status
@pytest.mark.parametrize("name", ["sweep", "loss-sweep", "cut"])
def test_status_agrees_with_the_core(recorded: Recorded, store: SqlStore, name: str) -> None:
    recording = {"sweep": recorded.finished, "loss-sweep": recorded.minimised, "cut": recorded.interrupted}[name]
    core = recording.scheduler
    experiment = pick_experiment(store, name)
    if name == "cut":  # interrupted: nothing holds a GPU now; as its runner saw it while running, its trials did
        assert not any(experiment_status(store, experiment).gpus.values())
        experiment = replace(experiment, status=ExperimentStatus.RUNNING)
    status = experiment_status(store, experiment)

    counts = Counter(trial.state for trial in core.trials.values())
    assert status.by_state == {state: counts[state] for state in TrialState if counts[state]}
    best = best_by_core(core)
    assert status.best is not None and status.best.trial_id == best.trial_id
    assert status.best.best == best.values[best.scores.index(max(best.scores))]
    assert status.best.best_step == best.steps[best.scores.index(max(best.scores))]
    assert status.best.params == dict(best.params)
    assert (status.preemptions, status.migrations) == (recording.preemptions, recording.migrations)
    events = store.events(recording.experiment_id)
    assert status.elapsed == events[-1].at - events[0].at > 0
    assert list(status.gpus) == [gpu for gpus in LAYOUT.values() for gpu in gpus]
    assignments = {gpu: run.trial_id for gpu, run in status.gpus.items() if run is not None}
    assert assignments == {t.gpu: t.trial_id for t in core.trials.values() if t.gpu is not None}


def test_the_runs_exercise_what_the_status_shows(recorded: Recorded) -> None:
    """The recorded runs time-share, migrate, fail and (when cut) still hold GPUs, so the checks above bite."""
    for recording in (recorded.finished, recorded.minimised):
        assert recording.scheduler.finished
        assert recording.preemptions > 0 and recording.migrations > 0
        assert {t.state for t in recording.scheduler.trials.values()} == {TrialState.COMPLETED, TrialState.FAILED}
    cut = recorded.interrupted.scheduler
    assert not cut.finished
    assert {TrialState.RUNNING, TrialState.SUSPENDED, TrialState.PENDING} <= {t.state for t in cut.trials.values()}


def test_status_text(recorded: Recorded, store: SqlStore) -> None:
    cut = pick_experiment(store, "cut")
    text = format_status(experiment_status(store, cut))
    core = recorded.interrupted.scheduler
    best = best_by_core(core)
    assert text.startswith("experiment  cut (id 3): interrupted\nmetric      score (max)\n")
    assert f"best        trial {best.trial_id}: score " in text
    preemptions, migrations = recorded.interrupted.preemptions, recorded.interrupted.migrations
    assert (f"switches    {preemptions} preemption{'s' * (preemptions != 1)}, "
            f"{migrations} migration{'s' * (migrations != 1)}") in text
    busy = sum(t.gpu is not None for t in core.trials.values())
    by_state = Counter(t.state for t in core.trials.values())
    assert f"trials      {len(core.trials)}: {busy} interrupted, " in text and " running" not in text
    assert by_state[TrialState.RUNNING] == busy and "GPUs        0 of 3 busy" in text  # no runner: nothing runs
    text = format_status(experiment_status(store, replace(cut, status=ExperimentStatus.RUNNING)))
    assert f"GPUs        {busy} of 3 busy" in text and f"{busy} running" in text  # as its runner saw it
    for trial in core.trials.values():
        if trial.gpu is not None:
            assert any(line.split()[:2] == [trial.gpu, trial.trial_id] for line in text.splitlines())


# ---------------------------------------------------------------------- results
@pytest.mark.parametrize("name", ["sweep", "loss-sweep"])
def test_leaderboard_ranks_as_the_core_scores(recorded: Recorded, store: SqlStore, name: str) -> None:
    core = (recorded.finished if name == "sweep" else recorded.minimised).scheduler
    ranked = standings(view_of(store, name))
    expected = sorted(core.trials.values(),  # a failed trial's best is no result: failed ones come last
                      key=lambda t: (t.state is TrialState.FAILED, not t.scores, -max(t.scores, default=0.0), t.seq))
    assert [s.trial_id for s in ranked] == [t.trial_id for t in expected]
    assert [s.rank for s in ranked] == list(range(1, len(ranked) + 1))
    for standing in ranked:
        trial = core.trials[standing.trial_id]
        assert standing.state is trial.state and standing.steps == trial.step and standing.budget == trial.budget
        assert standing.final == (trial.values[-1] if trial.values else None)
        assert standing.reports == len(trial.values)
        assert standing.gpu_seconds == pytest.approx(trial.gpu_time)
    # Mode min: the leader has the lowest loss.
    finite = [s.best for s in ranked if s.best is not None and s.state is not TrialState.FAILED]
    assert ranked[0].best == (max(finite) if name == "sweep" else min(finite))


def test_results_as_csv_and_json(recorded: Recorded, store: SqlStore) -> None:
    view = view_of(store, "sweep")
    top = standings(view)[:4]
    rows = list(csv.DictReader(io.StringIO(format_results(view, top, "csv"))))
    assert [row["trial"] for row in rows] == [s.trial_id for s in top]
    assert [float(row["best_score"]) for row in rows] == [s.best for s in top]
    assert [float(row["gpu_seconds"]) for row in rows] == pytest.approx([s.gpu_seconds for s in top], abs=1e-3)
    assert {row["param_lr"] for row in rows} <= {"0.1", "0.01", "0.001"}
    parsed = json.loads(format_results(view, top, "json"))
    assert [(item["rank"], item["trial"], item["best"], item["state"]) for item in parsed] == [
        (s.rank, s.trial_id, s.best, s.state.value) for s in top
    ]
    assert parsed[0]["params"] == top[0].params
    assert parsed[0]["directory"] is None and parsed[0]["checkpoint"] is None  # no trial files given


def _commit_checkpoint(root: Path, name: str, step: int) -> Path:
    """A checkpoint published as the trial API (or a Ray run's durable storage) publishes one, with a saver's part."""
    (root / name / "state").mkdir(parents=True)
    (root / name / "hermes.json").write_text(json.dumps({"step": step}))
    (root / "latest").write_text(name)
    return root / name


def test_trial_files_on_one_machine_and_across_ray_nodes(tmp_path: Path) -> None:
    """One machine: ``trials/<id>``. A Ray run: the node where the trial last saved (here it moved from ``a`` to
    ``b``), and the newest checkpoint, the durable one on a tie."""
    single = tmp_path / "single"
    _commit_checkpoint(single / "trials" / "3" / "checkpoints", "step-2", 2)
    assert trial_files(single, "3") == TrialFiles(single / "trials" / "3", single / "trials" / "3" / "checkpoints" / "step-2")
    ray = tmp_path / "ray"
    _commit_checkpoint(ray / "nodes" / "a" / "trials" / "3" / "checkpoints", "step-2", 2)
    _commit_checkpoint(ray / "nodes" / "b" / "trials" / "3" / "checkpoints", "step-5", 5)
    durable = _commit_checkpoint(ray / "checkpoints" / "3", "step-5-0a1b2c3d", 5)
    assert trial_files(ray, "3") == TrialFiles(ray / "nodes" / "b" / "trials" / "3", durable)
    _commit_checkpoint(ray / "nodes" / "c" / "trials" / "4" / "checkpoints", "step-1", 1)
    (ray / "nodes" / "a" / "trials" / "4").mkdir(parents=True)  # ran there later, saved nothing: c has its state
    assert trial_files(ray, "4").directory == ray / "nodes" / "c" / "trials" / "4"
    assert trial_files(ray, "5") == TrialFiles(None, None)
    (durable.parent / "latest").write_bytes(b"\0" * 8)  # damaged (a crash): reports go on without it, as a
    assert trial_files(ray, "3") == TrialFiles(  # resume sets it aside; `hermes results` was a ValueError traceback
        ray / "nodes" / "b" / "trials" / "3", ray / "nodes" / "b" / "trials" / "3" / "checkpoints" / "step-5")


def test_trial_files_find_the_durable_checkpoint_in_the_storage_uri_a_run_noted(tmp_path: Path) -> None:
    """A Ray run with ``storage.uri``, read where no node's folder is (KubeRay's head runs no trial): the results
    gave no checkpoint, though the trial's newest was published under the URI. On s3:// and such, which a report
    does not open, the trial's folder there, where the store says it saved one."""
    experiment = tmp_path / "runs" / "digits"
    durable = tmp_path / "durable" / "digits"
    newest = _commit_checkpoint(durable / "3", "step-4-0a1b2c3d", 4)
    assert trial_files(experiment, "3") == TrialFiles(None, None)  # the default place only
    assert trial_files(experiment, "3", durable.as_uri()) == TrialFiles(None, newest)
    assert trial_files(experiment, "3", str(durable)) == TrialFiles(None, newest)

    note_checkpoint_location(experiment, durable.as_uri())  # what the run did: reports read the store alone
    assert checkpoint_location(experiment) == durable.as_uri()
    assert trial_files(experiment, "3") == TrialFiles(None, newest)
    local = _commit_checkpoint(experiment / "nodes" / "a" / "trials" / "3" / "checkpoints", "step-6", 6)
    assert trial_files(experiment, "3").checkpoint == local  # newer than the durable one: not uploaded yet
    note_checkpoint_location(experiment, None)  # a later run that keeps none: the default place again
    assert checkpoint_location(experiment) == str(experiment / "checkpoints")

    remote = "s3://bucket/checkpoints/digits"
    assert trial_files(experiment, "4", remote, saved_step=2) == TrialFiles(None, f"{remote}/4")
    assert trial_files(experiment, "4", remote, saved_step=0) == TrialFiles(None, None)  # it saved none


FAILS_AFTER_ITS_CHECKPOINT = """
from hermes import trial


def train(config):
    start = trial.Files(lambda folder: (folder / "state").write_text("saved"), lambda folder: None).restore()
    if start:
        raise RuntimeError(f"cannot go on from step {start}")
    for step in range(1, trial.budget() + 1):
        if step == 5:
            raise RuntimeError("synthetic failure at step 5")
        trial.report(step, loss=1.0 / step)
"""


def test_results_give_the_last_step_reported_of_a_trial_that_fell_back_to_its_checkpoint(tmp_path: Path) -> None:
    """A trial that reported steps 1 to 4, crashed, fell back to its checkpoint of step 3 and failed there: its
    ``steps`` were 3, below its reports and its best step, 4."""
    (tmp_path / "fails_later.py").write_text(FAILS_AFTER_ITS_CHECKPOINT)
    spec = {"name": "fell-back", "trial": {"function": "fails_later:train", "workdir": str(tmp_path)},
            "search": {"configs": [{"a": 1}]}, "metric": {"name": "loss", "mode": "min"}, "budget": {"steps": 8},
            "policy": {"name": "fifo"}, "resources": {"gpus": "none", "cpu_slots": 1},
            "storage": {"dir": "runs", "checkpoint_every": 3}}
    (tmp_path / "experiment.yaml").write_text(json.dumps(spec))
    run = subprocess.run(hermes_command("run", "experiment.yaml", "--no-live"), cwd=tmp_path, env=environment(),
                         capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 1 and "cannot go on from step 3" in run.stderr, run.stderr
    results = subprocess.run(hermes_command("results", "runs", "--format", "json"), cwd=tmp_path, env=environment(),
                             capture_output=True, text=True, timeout=60, check=True)
    [failed] = json.loads(results.stdout)
    assert (failed["state"], failed["steps"], failed["reports"], failed["best_step"]) == ("failed", 4, 4, 4)


def test_tables_align_wide_and_combining_characters_as_a_terminal_shows_them() -> None:
    """A CJK character takes two cells of a terminal and a combining accent none: padding by len() shifted every
    column after a parameter holding them."""
    from rich.cells import cell_len

    from hermes.report import format_table

    lines = format_table(["tag", "rate"], [["日本語日本語", "0.5"], ["ascii", "0.4"], ["e\u0301e\u0301", "0.3"]],
                         right=(1,)).splitlines()
    assert len({cell_len(line) for line in lines}) == 1, lines  # every line ends in the same cell
    assert lines[1].split()[0] == "-" * cell_len("日本語日本語")  # the column is as wide as its widest cell shows


def test_results_table_lists_params_and_units(store: SqlStore) -> None:
    view = view_of(store, "loss-sweep")
    lines = format_results(view, standings(view)[:3], "table").splitlines()
    assert lines[0] == "loss-sweep: top 3 by best score (min)"
    assert lines[1].split() == ["#", "trial", "state", "best", "score", "at", "step", "final", "steps", "GPU", "time",
                                "lr", "kind"]
    assert len(lines) == 6 and lines[3].split()[0] == "1"


def test_unreported_trials_rank_last(recorded: Recorded, store: SqlStore) -> None:
    ranked = standings(view_of(store, "cut"))
    silent = [s for s in ranked if s.best is None]
    assert silent and ranked[-len(silent):] == silent
    assert all(s.reports == 0 and s.final is None for s in silent)
    core = recorded.interrupted.scheduler
    assert [s.trial_id for s in silent] == [t.trial_id for t in core.trials.values() if not t.values]


def stored(reports: dict[str, list[float]], params: dict[str, dict[str, object]], mode: str = "min") -> SqlStore:
    """An in-memory store of one experiment, "odd", whose trials reported ``reports`` (objective ``loss``) at steps
    1, 2, ...; a trial without reports is pending."""
    store = SqlStore("sqlite://")
    experiment_id = store.create_or_open_experiment("odd", spec("odd", "loss", mode))
    for trial_id, values in reports.items():
        state = TrialState.COMPLETED if values else TrialState.PENDING
        store.upsert_trial(experiment_id, TrialRecord(trial_id, params[trial_id], state, budget=3, submitted_at=0.0,
                                                      step=len(values)))
        for step, value in enumerate(values, start=1):
            store.record_metrics(experiment_id, trial_id, step, float(step), {"loss": value})
    store.set_status(experiment_id, ExperimentStatus.FINISHED)
    return store


def test_a_trial_with_no_finite_value_has_no_best_in_any_format_and_ranks_after_those_with_one() -> None:
    """CSV gave nan, -inf and inf as best values (-inf ranked 4th of a minimised metric) and JSON null, but both
    gave a best step; a non-finite value is no best (the core scores it worst): empty, null, "-"."""
    nan, inf = float("nan"), float("inf")
    reports = {"0": [nan] * 3, "1": [-inf] * 3, "2": [inf] * 3, "3": [nan, 0.5, 1 / 3], "4": [0.5] * 3, "5": []}
    store = stored(reports, {trial_id: {"kind": str(trial_id)} for trial_id in reports})
    try:
        experiment = pick_experiment(store, "odd")
        view = ExperimentView.load(store, experiment)
        ranked = standings(view)
        status = format_status(experiment_status(store, experiment))
    finally:
        store.close()
    assert [(s.trial_id, s.best, s.best_step) for s in ranked] == [
        ("3", 1 / 3, 3), ("4", 0.5, 1), ("0", None, None), ("1", None, None), ("2", None, None), ("5", None, None)]
    rows = list(csv.DictReader(io.StringIO(format_results(view, ranked, "csv"))))
    assert [(row["trial"], row["best_loss"], row["best_step"], row["final_loss"]) for row in rows] == [
        ("3", str(1 / 3), "3", str(1 / 3)), ("4", "0.5", "1", "0.5"), ("0", "", "", ""), ("1", "", "", ""),
        ("2", "", "", ""), ("5", "", "", "")]
    entries = json.loads(format_results(view, ranked, "json"))
    assert [(e["trial"], e["best"], e["best_step"], e["final"]) for e in entries] == [
        ("3", 1 / 3, 3, 1 / 3), ("4", 0.5, 1, 0.5), ("0", None, None, None), ("1", None, None, None),
        ("2", None, None, None), ("5", None, None, None)]
    table = format_results(view, ranked, "table").splitlines()
    assert [line.split()[:4] for line in table[5:8]] == [["3", "0", "completed", "-"], ["4", "1", "completed", "-"],
                                                         ["5", "2", "completed", "-"]]
    assert "best        trial 3: loss 0.3333 at step 3 (kind=\"3\")" in status  # text, apart from a number 3


def test_control_characters_of_a_parameter_are_escaped_for_people_and_kept_for_programs() -> None:
    """A parameter holding a newline broke the results table's row and the status's best line in two."""
    params = {"0": {"tag": "line1\nline2", "colour": "\x1b[31mred"}, "1": {"tag": "plain", "colour": "none"}}
    store = stored({"0": [0.1], "1": [0.2]}, params)
    try:
        experiment = pick_experiment(store, "odd")
        view = ExperimentView.load(store, experiment)
        ranked = standings(view)
        status = format_status(experiment_status(store, experiment)).splitlines()
    finally:
        store.close()
    table = format_results(view, ranked, "table").splitlines()
    assert len(table) == 5  # the title, the header, its rule and a row per trial
    assert table[3].split()[-2:] == ["line1\\nline2", "\\x1b[31mred"]
    assert "best        trial 0: loss 0.1 at step 1 (tag=line1\\nline2, colour=\\x1b[31mred)" in status
    rows = list(csv.DictReader(io.StringIO(format_results(view, ranked, "csv"))))
    assert (rows[0]["param_tag"], rows[0]["param_colour"]) == ("line1\nline2", "\x1b[31mred")
    assert json.loads(format_results(view, ranked, "json"))[0]["params"] == params["0"]


def test_the_csv_writes_parameters_as_the_json_does() -> None:
    """A switch came out as Python's True, a list as its repr, where the JSON and a trace say true and [64, 32]."""
    params = {"0": {"flag": True, "layers": [64, 32], "lr": 0.001, "width": 64, "opt": "adam"}, "1": {"flag": False}}
    store = stored({"0": [0.1], "1": [0.2]}, params)
    try:
        view = ExperimentView.load(store, pick_experiment(store, "odd"))
        rows = list(csv.DictReader(io.StringIO(format_results(view, standings(view), "csv"))))
    finally:
        store.close()
    assert [row["param_flag"] for row in rows] == ["true", "false"]
    assert (rows[0]["param_layers"], rows[0]["param_lr"], rows[0]["param_width"], rows[0]["param_opt"]) == (
        "[64, 32]", "0.001", "64", "adam")
    assert rows[1]["param_layers"] == ""  # a trial without the parameter


# ---------------------------------------------------------------------- plots
def test_plots_are_real_images(recorded: Recorded, store: SqlStore, tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    from hermes.report.plot import plot_experiment

    for name in ("sweep", "cut"):
        paths = plot_experiment(view_of(store, name), tmp_path)
        assert [p.name for p in paths] == [f"{name}_curves.png", f"{name}_gpus.png"]
        for path in paths:
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
            pixels = image.imread(path)
            assert pixels.shape[0] >= 300 and pixels.shape[1] >= 1200
            assert pixels[..., :3].std() > 0.05  # drawn on, not a blank canvas
            assert len({tuple(p) for p in pixels[::7, ::7, :3].reshape(-1, 3).round(2)}) > 20  # trials in colour


# ---------------------------------------------------------------------- the command line
def test_cli_status_results_and_plot(recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = str(recorded.directory)
    assert main(["status", directory]) == 0
    assert capsys.readouterr().out.startswith("experiment  cut (id 3): interrupted")  # the newest by default
    assert main(["status", directory, "--experiment", "sweep"]) == 0
    assert "experiment  sweep (id 1): finished" in capsys.readouterr().out

    assert main(["results", directory, "--experiment", "sweep", "--top", "3", "--format", "json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert [item["trial"] for item in parsed] == [best_by_core(recorded.finished.scheduler).trial_id, *[
        item["trial"] for item in parsed[1:]]]
    assert len(parsed) == 3 and all(isinstance(item["best"], float) for item in parsed)
    assert main(["results", directory, "--experiment", "loss-sweep", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 10

    pytest.importorskip("matplotlib")
    assert main(["plot", directory, "--experiment", "sweep", "--out", str(tmp_path / "figures")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "figures" / "sweep_curves.png"), str(tmp_path / "figures" / "sweep_gpus.png")]
    assert all(Path(path).is_file() for path in printed)


def test_a_stored_experiment_gives_back_the_trace_it_replayed(recorded: Recorded, store: SqlStore) -> None:
    """The "sweep" experiment replayed a synthetic trace: exported, each trial has its curve again, diverged where
    it diverged, and its epochs' seconds without the start or resume of each run, which the trace did not hold; the
    epoch that diverged lasts from the last report to the end of its run, which may hold a start or resume."""
    source = synthetic_trace(10, 6, seed=1, mode="max", epoch_seconds=(5.0, 20.0), diverge_fraction=0.2)
    original = {trial.name: trial for trial in source.trials}
    view = view_of(store, "sweep")
    recorded_trace = experiment_trace(view)
    assert recorded_trace.left_out == 0 and recorded_trace.trace.mode == "max"
    assert sorted(trial.name for trial in recorded_trace.trace.trials) == sorted(original)
    assert any(trial.diverged for trial in recorded_trace.trace.trials)
    costs = SwitchCosts.profile("process")
    dearest = max(costs.start, costs.resume_cost(other_gpu=True, other_node=True))
    for trial in recorded_trace.trace.trials:
        replayed = original[trial.name]
        assert (trial.metrics, trial.diverged, trial.epochs) == (replayed.metrics, replayed.diverged, replayed.epochs)
        # epochs jitter 5% either way: a run's first epoch is the mean of the others, 10.5% off at most
        epochs = len(trial.metrics)
        assert trial.seconds[:epochs] == pytest.approx(replayed.seconds[:epochs], rel=0.11), trial.name
        if trial.diverged:
            assert 0 <= trial.seconds[-1] - replayed.seconds[-1] <= dearest + 1e-6, trial.name
        assert trial.params["lr"] in (0.1, 0.01, 0.001)


def test_a_trace_keeps_every_kind_of_hyper_parameter(tmp_path: Path) -> None:
    """Numbers as numbers; a choice, a switch or a list as text, which the trace loader reads back as a category."""
    trial = TraceTrial("t", (0.5,), (1.0,), False, {name: _param(value) for name, value in {
        "lr": 0.1, "width": 64, "optimizer": "adam", "batch_norm": True, "layers": [64, 32]}.items()})
    write_trace(Trace("kinds", "max", (trial,)), tmp_path / "kinds.csv")
    assert load_trace(tmp_path / "kinds.csv", "max").trials[0].params == {
        "lr": 0.1, "width": 64.0, "optimizer": "adam", "batch_norm": "true", "layers": "[64, 32]"}


def test_cli_trace_and_simulate_a_stored_experiment(
    recorded: Recorded, store: SqlStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(recorded.directory)
    assert main(["trace", directory, "--experiment", "cut"]) == 2  # interrupted before any trial finished
    assert "experiment 'cut' has no finished trial to replay yet" in capsys.readouterr().err
    halfway = tmp_path / "halfway"
    halfway.mkdir()
    writer = SqlStore(f"sqlite:///{halfway / STORE_FILE}")
    record_simulation(writer, "half", mode="max", seed=4, stop_after=80)  # of 103 events: some trials finished
    writer.close()
    written = tmp_path / "half.csv"
    assert main(["trace", str(halfway), "--out", str(written)]) == 0
    with closing(open_store(halfway)) as reader:
        expected = experiment_trace(view_of(reader, "half"))
    assert 0 < expected.left_out < 10 and f"{expected.left_out} trials left out" in capsys.readouterr().err
    assert load_trace(written, "max").trials == expected.trace.trials  # written as read, to the last digit
    assert main(["trace", directory, "--experiment", "loss-sweep"]) == 0
    assert capsys.readouterr().out.startswith("trial,epoch,metric,seconds,param_lr")
    nowhere = tmp_path / "no-such-folder" / "x.csv"
    assert main(["trace", directory, "--experiment", "loss-sweep", "--out", str(nowhere)]) == 2  # a traceback before
    assert f"--out {nowhere}: cannot write it: No such file or directory" in capsys.readouterr().err
    assert main(["plot", directory, "--experiment", "loss-sweep", "--out", str(written)]) == 2  # a file, no folder
    assert f"cannot write the plots into {written}: " in capsys.readouterr().err

    assert main(["simulate", "--trace", directory, "--experiment", "sweep", "--gpus", "3", "--json",
                 "--policy", "fifo"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["trials"] == 10 and figures["time_to_best_s"] > 0
    assert main(["simulate", "--trace", str(halfway), "--gpus", "2", "--policy", "fifo", "--json"]) == 0
    assert f"{expected.left_out} trials left out" in capsys.readouterr().err  # replayed without them, and said
    assert main(["simulate", "--trace", directory, "--experiment", "cut", "--gpus", "2"]) == 2
    assert "experiment 'cut' has no finished trial to replay yet" in capsys.readouterr().err
    assert main(["simulate", "--trace", directory, "--experiment", "sweep", "--gpus", "3", "--mode", "min"]) == 2
    assert "improves the other way (max)" in capsys.readouterr().err
    mistyped = tmp_path / "stor1"  # the path's mistake, not a demand for --mode that a path would not cure
    assert main(["simulate", "--trace", str(mistyped), "--gpus", "2"]) == 2
    assert capsys.readouterr().err.endswith(f"hermes: error: {mistyped}: cannot open: no such file or storage dir\n")
    assert main(["simulate", "--trace", str(written), "--gpus", "3"]) == 2
    assert "--mode max or min" in capsys.readouterr().err
    simulate = ["simulate", "--trace", str(written), "--mode", "max"]
    for wrong, told in ((["--gpus", "0"], "argument --gpus: must be a positive whole number, got '0'"),
                        (["--gpus", "2", "--period", "-3"], "argument --period: must be a positive number"),
                        (["--gpus", "2", "--seeds", "0"], "argument --seeds: must be a positive whole number"),
                        (["--gpus", "2", "--state-mb", "-1000"], "argument --state-mb: must be a number >= 0"),
                        (["--gpus", "2", "--state-mb", "nan"], "argument --state-mb: must be a number >= 0")):
        with pytest.raises(SystemExit):  # argparse's refusal, with the usage
            main([*simulate, *wrong])
        assert told in capsys.readouterr().err
    for wrong, told in ((["--gpus", "2", "--nodes", "3"], "--nodes 3: more nodes than the 2 GPUs"),
                        (["--gpus", "2", "--compare", "fifo,hermse"], "unknown policy 'hermse'; choose one of fifo"),
                        (["--gpus", "2", "--policy", "nosuch.module:Policy"],
                         "--policy nosuch.module:Policy: policy 'nosuch.module:Policy': cannot load nosuch.module:Policy: "
                         "ModuleNotFoundError"),
                        (["--gpus", "2", "--stopper", "hermes.policies.fifo:FifoPolicy"],
                         "is not a subclass of hermes.core.policy.EarlyStopper")):
        assert main([*simulate, *wrong]) == 2  # was a ValueError's traceback
        assert told in capsys.readouterr().err


def test_a_final_experiment_without_a_finished_trial_has_none_to_replay_not_none_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time budget that stopped every trial early: "no finished trial to replay yet" promised one to come."""
    with closing(SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")) as writer:
        recording = record_simulation(writer, "timed", mode="max", seed=4, stop_after=30)
        writer.set_status(recording.experiment_id, ExperimentStatus.FINISHED)
    assert main(["trace", str(tmp_path)]) == 2
    assert "hermes: error: experiment 'timed' has no finished trial to replay (" in capsys.readouterr().err


def test_cli_errors_name_the_problem(recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    # a mistyped server root made an empty server there, and said "no tokens"; a bad database gave a traceback
    assert main(["server", "--root", str(missing), "tokens"]) == 2
    assert f"--root {missing}: no server there (no hermes.db)" in capsys.readouterr().err and not missing.exists()
    assert main(["server", "--root", str(missing), "--database", "nonsense", "tokens"]) == 2
    assert "--database nonsense: cannot use it: Could not parse SQLAlchemy URL" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["server", "--port", "99999"])
    assert "argument --port: must be a port number, 0 to 65535, got '99999'" in capsys.readouterr().err
    assert main(["status", str(missing)]) == 2
    assert f"no Hermes store at {missing / STORE_FILE}" in capsys.readouterr().err
    assert not missing.exists()  # a report never creates a store
    assert main(["results", str(tmp_path)]) == 2
    assert f"{tmp_path} holds no {STORE_FILE}" in capsys.readouterr().err
    assert main(["plot", str(recorded.directory), "--experiment", "nope"]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err.replace("it holds sweep, loss-sweep, cut", "")
    with pytest.raises(SystemExit):
        main(["results", str(recorded.directory), "--top", "0"])


def test_an_empty_store_and_an_experiment_without_trials(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        with pytest.raises(HermesError, match="holds no experiment yet"):
            pick_experiment(store, None)
        store.create_or_open_experiment("fresh", spec("fresh", "accuracy", "max"))
        status = experiment_status(store, pick_experiment(store, None))
        assert status.best is None and status.by_state == {} and status.gpus == {}
        assert "best        none yet" in format_status(status)
        assert standings(status.view) == []
    finally:
        store.close()


def test_a_storage_dir_named_wins_over_hermes_server_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/server.md has users export HERMES_SERVER: `hermes list runs` then listed the server's experiments (or
    failed wanting its token), and `hermes plot runs` drew them into runs/."""
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    try:
        store.create_or_open_experiment("mine", spec("mine", "accuracy", "max"))
    finally:
        store.close()
    monkeypatch.setenv("HERMES_SERVER", "http://127.0.0.1:1")
    assert main(["list", str(tmp_path)]) == 0
    assert "mine" in capsys.readouterr().out
    assert main(["status", str(tmp_path), "--server", "http://127.0.0.1:1"]) == 2
    assert (f"hermes: error: give a storage dir ({tmp_path}) or --server (http://127.0.0.1:1), not both"
            in capsys.readouterr().err)


def test_a_name_two_owners_share_is_picked_as_owner_slash_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")  # a server's store: names are per owner
    try:
        alices, bobs = (store.submit_experiment("run", spec("run", "accuracy", "max"), owner)
                        for owner in ("alice", "bob"))
        solo = store.create_or_open_experiment("solo", spec("solo", "accuracy", "max"))
        assert pick_experiment(store, "bob/run").experiment_id == bobs
        assert pick_experiment(store, "alice/run").experiment_id == alices
        assert pick_experiment(store, "solo").experiment_id == solo
        with pytest.raises(HermesError, match="2 experiments in .* are called 'run': alice/run, bob/run; name one"):
            pick_experiment(store, "run")
        with pytest.raises(HermesError, match="no experiment 'carol/run' in .*; it holds alice/run, bob/run, solo"):
            pick_experiment(store, "carol/run")
        for index in range(NAMES_SHOWN):  # a server's thousands of experiments were all named on one line
            store.submit_experiment(f"more-{index}", spec(f"more-{index}", "accuracy", "max"), "bob")
        newest = ", ".join(f"bob/more-{index}" for index in range(NAMES_SHOWN))
        with pytest.raises(HermesError) as refused:
            pick_experiment(store, "carol/run")
        assert str(refused.value).endswith(f"; it holds {NAMES_SHOWN + 3} experiments, the newest {newest} (`hermes "
                                           "list` names them all)")
        store.set_status(alices, ExperimentStatus.RUNNING)
    finally:
        store.close()
    assert main(["status", str(tmp_path), "--experiment", "bob/run"]) == 0
    assert f"experiment  run (id {bobs}): queued" in capsys.readouterr().out
    # a pool runs alice's, and holds no runner's lock: that no `hermes run` holds it says nothing of it
    assert main(["status", str(tmp_path), "--experiment", "alice/run"]) == 0
    assert f"experiment  run (id {alices}): running\n" in capsys.readouterr().out


# ---------------------------------------------------------------------- reads never write, and survive damage
def copy_store(recorded: Recorded, directory: Path) -> Path:
    """A private copy of the recorded store, to damage."""
    import sqlite3

    directory.mkdir(parents=True, exist_ok=True)
    source, target = sqlite3.connect(recorded.directory / STORE_FILE), sqlite3.connect(directory / STORE_FILE)
    with target:
        source.backup(target)
    source.close()
    target.close()
    return directory


def test_reports_never_write_to_the_store(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / STORE_FILE).write_bytes(b"")
    for command in ("status", "results", "plot"):
        assert main([command, str(empty)]) == 2
        assert capsys.readouterr().err == (  # a copy of hermes.db alone, taken while a run wrote, reads so: say why
            f"hermes: error: {empty / STORE_FILE} holds no Hermes store (it has no experiments table); a copy made "
            f"while a run wrote needs {STORE_FILE}-wal beside it (or `sqlite3 {STORE_FILE} .backup copy.db` makes "
            "one whole)\n"
        )
    assert (empty / STORE_FILE).read_bytes() == b""  # no schema was created in it

    directory = copy_store(recorded, tmp_path / "copy")
    before = (directory / STORE_FILE).read_bytes()
    assert main(["status", str(directory)]) == 0 and main(["results", str(directory)]) == 0
    assert (directory / STORE_FILE).read_bytes() == before
    store = open_store(directory)
    try:
        with pytest.raises(HermesError, match="readonly database"):
            store.set_status(1, ExperimentStatus.FAILED)
    finally:
        store.close()


def read_as(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """A report run through ``prefix`` (``unwritable``): its own process, so that it may run without a capability."""
    return subprocess.run([*prefix, *hermes_command(*args)], check=False, env=environment(), capture_output=True,
                           text=True, timeout=120)


@pytest.mark.parametrize("how", UNWRITABLE)
def test_reports_read_a_store_in_a_folder_they_cannot_write(
    recorded: Recorded, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite reads a WAL store only where it can make its -shm file: another user's storage dir, or a read-only
    mount, gave "it cannot be written" or "its file cannot be opened". Read as the file stands, nothing written."""
    directory = copy_store(recorded, tmp_path / "runs")
    with sqlite3.connect(directory / STORE_FILE) as connection:
        connection.execute("PRAGMA journal_mode=WAL")  # as a runner leaves it
    connection.close()
    plots = tmp_path / "plots"
    plots.mkdir()
    shown = {}
    with unwritable(directory, how) as prefix:
        for command in ("status", "list", "results"):
            result = read_as(prefix, command, str(directory))
            assert (result.returncode, result.stderr) == (0, ""), command
            shown[command] = result.stdout
        result = read_as(prefix, "plot", str(directory), "--out", str(plots))
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [str(plots / "cut_curves.png"), str(plots / "cut_gpus.png")]
    assert sorted(path.name for path in directory.iterdir()) == [STORE_FILE]  # no -shm, no -wal
    for command, text in shown.items():  # what a reader who may write the folder is shown
        assert main([command, str(directory)]) == 0
        assert capsys.readouterr().out == text, command


@pytest.mark.parametrize("how", UNWRITABLE)
def test_a_store_in_a_folder_reports_cannot_write_is_not_read_as_it_stands_while_it_may_change(
    recorded: Recorded, tmp_path: Path, how: str
) -> None:
    """Read as it stands, a store would show what it held before writes that its -wal file holds, or that its
    runner makes meanwhile: refused, saying why."""
    held = copy_store(recorded, tmp_path / "held")
    lock = RunnerLock(held, "cut").acquire()
    try:
        with unwritable(held, how) as prefix:
            result = read_as(prefix, "status", str(held))
    finally:
        lock.release()
    assert result.returncode == 2
    assert result.stderr.startswith(f"hermes: error: {held / STORE_FILE}: cannot read it while pid {os.getpid()} "), (
        result.stderr)
    assert result.stderr.endswith(f"writes it: SQLite must make {STORE_FILE}-shm beside it, and {held} cannot be "
                                  "written here; try again in a moment\n"), result.stderr

    source = copy_store(recorded, tmp_path / "source")
    logged = tmp_path / "logged"
    logged.mkdir()
    writer = sqlite3.connect(source / STORE_FILE)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("UPDATE experiments SET status = 'failed'")
        writer.commit()  # into hermes.db-wal: copied, as a copy of a running store's folder has it, without its -shm
        for name in (STORE_FILE, f"{STORE_FILE}-wal"):
            shutil.copyfile(source / name, logged / name)
    finally:
        writer.close()
    with unwritable(logged, how) as prefix:
        result = read_as(prefix, "status", str(logged))
    assert (result.returncode, result.stderr) == (2, (
        f"hermes: error: {logged / STORE_FILE}: cannot read the writes {STORE_FILE}-wal holds: SQLite must make "
        f"{STORE_FILE}-shm beside it, and {logged} cannot be written here; read it as a user who may write {logged}, "
        "or from a copy of the folder\n"))


EVERY_REPORT = ("status", "results", "plot")
DAMAGE = [  # (statement, the reports that must fail on it, what they say)
    ("UPDATE trials SET params = '{\"lr\": 0.1' WHERE experiment_id = 3 AND trial_id = '4'", EVERY_REPORT,
     "table trials, row with experiment_id 3, trial_id '4': column params is not valid JSON"),
    ("UPDATE trials SET state = 'exploded' WHERE experiment_id = 3 AND trial_id = '2'", EVERY_REPORT,
     "table trials, row with experiment_id 3, trial_id '2': column state holds 'exploded', not one of completed"),
    ("UPDATE metrics SET metric_values = '{\"score\": \"high\"}' WHERE id = (SELECT MAX(id) FROM metrics)",
     EVERY_REPORT,
     "table metrics, row with experiment_id 3, id {last}: column metric_values holds 'high' for metric 'score'"),
    ("UPDATE metrics SET step = 'two' WHERE id = (SELECT MAX(id) FROM metrics)", EVERY_REPORT,
     "table metrics, row with experiment_id 3, id {last}: column step holds 'two', not a whole number"),
    ("UPDATE events SET data = '{\"type\": \"TrialExploded\"}' WHERE experiment_id = 3 AND seq = 7", EVERY_REPORT,
     "table events, row with experiment_id 3, seq 7: column data does not decode: cannot decode 'TrialExploded'"),
    # a report's step and time, as the trials' numbers: status and results showed a step of 2.5, plot drew it
    ("UPDATE metrics SET step = 2.5 WHERE id = (SELECT MAX(id) FROM metrics)", EVERY_REPORT,
     "table metrics, row with experiment_id 3, id {last}: column step holds 2.5, not a whole number"),
    ("UPDATE metrics SET at = 'late' WHERE id = (SELECT MAX(id) FROM metrics)", EVERY_REPORT,
     "table metrics, row with experiment_id 3, id {last}: column at holds 'late', not a number"),
    ("UPDATE metrics SET at = x'00ff' WHERE id = (SELECT MAX(id) FROM metrics)", EVERY_REPORT,
     "table metrics, row with experiment_id 3, id {last}: column at holds b'\\x00\\xff', not a number"),
    ("UPDATE decisions SET at = 'soon' WHERE experiment_id = 3 AND event_seq = {first} AND position = 0", EVERY_REPORT,
     "table decisions, row with experiment_id 3, event_seq {first}, position 0: column at holds 'soon', not a number"),
]


@pytest.mark.parametrize(
    ("statement", "commands", "message"), DAMAGE,
    ids=["json", "state", "metric", "step", "event", "step-fraction", "time", "time-blob", "decision-time"],
)
def test_a_damaged_record_is_named_not_a_traceback(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str], statement: str,
    commands: tuple[str, ...], message: str,
) -> None:
    import sqlite3

    directory = copy_store(recorded, tmp_path / "damaged")
    with sqlite3.connect(directory / STORE_FILE) as connection:
        last = connection.execute("SELECT MAX(id) FROM metrics").fetchone()[0]
        first = connection.execute("SELECT MIN(event_seq) FROM decisions WHERE experiment_id = 3").fetchone()[0]
        connection.execute(statement.replace("{first}", str(first)))
    connection.close()
    for command in commands:
        out = ["--out", str(tmp_path / "plots")] if command == "plot" else []
        assert main([command, str(directory), "--experiment", "cut", *out]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"hermes: error: {directory / STORE_FILE} has a damaged record: "
                              f"{message.format(last=last, first=first)}"), err
        assert err.endswith(f"; correct that value, or restore {STORE_FILE} from a backup\n"), err  # what to do
        assert "Traceback" not in err and err.count("\n") == 1, err


def test_status_and_results_show_why_trials_failed(store: SqlStore) -> None:
    experiment = pick_experiment(store, "sweep")
    failed = [trial for trial in store.trials(experiment.experiment_id) if trial.state is TrialState.FAILED]
    assert failed and all((trial.error or "").startswith("diverged in epoch") for trial in failed)
    lines = format_status(experiment_status(store, experiment)).splitlines()
    start = lines.index(f"errors      {len(failed)} trials")
    assert lines[start + 1 : start + 1 + len(failed)] == [
        f"  trial {trial.trial_id} (failed at step {trial.step}): {trial.error}" for trial in failed
    ]

    view = ExperimentView.load(store, experiment)
    ranked = standings(view)
    table = format_results(view, ranked, "table").splitlines()
    assert table[1].split()[-1] == "error"
    for trial in failed:
        row = next(line for line in table[3:] if line.split()[1] == trial.trial_id)
        assert row.endswith(trial.error or "")
    assert {row["trial"]: row["error"] for row in csv.DictReader(io.StringIO(format_results(view, ranked, "csv")))} == {
        s.trial_id: s.error or "" for s in ranked
    }
    assert {item["trial"]: item["error"] for item in json.loads(format_results(view, ranked, "json"))} == {
        s.trial_id: s.error for s in ranked
    }


def test_summarise_error_keeps_the_first_and_the_last_line() -> None:
    from hermes.report import summarise_error

    traceback = "exit code 1: Traceback (most recent call last):\n  File \"x.py\"\n\nValueError: bad lr\n"
    assert summarise_error(traceback) == "exit code 1 ... ValueError: bad lr"
    worker = "uncaught ValueError: bad lr: Traceback (most recent call last):\n  File \"x.py\"\nValueError: bad lr"
    assert summarise_error(worker) == "uncaught ValueError: bad lr"  # the first line says it already
    assert summarise_error("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'a'") == "KeyError: 'a'"
    assert summarise_error("exit code 1") == "exit code 1"
    assert summarise_error("x" * 200, width=20) == "x" * 17 + "..."


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(recorded: Recorded) -> None:
    """``hermes results | head``: no BrokenPipeError traceback, exit code 1 as Python's docs advise."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    for command in ("status", "results"):
        child = subprocess.Popen([sys.executable, "-m", "hermes.cli", command, str(recorded.directory)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # before the child has written anything: its first write finds no reader
        stderr = child.stderr.read().decode()
        assert child.wait(timeout=60) == 1, stderr
        assert stderr == ""


@pytest.mark.parametrize("ended", ["killed", "interrupted", "live"])
def test_results_show_the_trials_an_ended_run_left_on_a_gpu_as_interrupted_as_status_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ended: str
) -> None:
    """A run killed (it still says running, but its runner holds no lock) or interrupted leaves trials running or
    suspending in the store: ``hermes status`` counts them interrupted, and so do the table, CSV and JSON of
    ``hermes results``; while a runner runs the experiment they are running, in both."""
    from hermes.store.lock import RunnerLock

    store = SqlStore(f"sqlite:///{tmp_path / STORE_FILE}")
    lock = RunnerLock(tmp_path, "cut")
    try:
        experiment = store.create_or_open_experiment("cut", spec("cut", "accuracy", "max"))
        states = [TrialState.RUNNING, TrialState.SUSPENDING, TrialState.SUSPENDED, TrialState.COMPLETED]
        for number, state in enumerate(states):
            store.upsert_trial(experiment, TrialRecord(str(number), {"lr": 0.01}, state, 6, 0.0, step=2))
            store.record_metrics(experiment, str(number), 1, 1.0, {"accuracy": 0.5 - number / 10})
        if ended == "interrupted":
            store.set_status(experiment, ExperimentStatus.INTERRUPTED)
        if ended == "live":
            lock.acquire()
        left = "running" if ended == "live" else "interrupted"
        shown = [left, "suspending" if ended == "live" else "interrupted", "suspended", "completed"]

        assert main(["status", str(tmp_path)]) == 0
        counts = ("1 running, 1 suspending" if ended == "live" else "2 interrupted") + ", 1 suspended, 1 completed"
        out = capsys.readouterr().out
        assert f"trials      4: {counts}\n" in out, out
        assert main(["results", str(tmp_path), "--format", "json"]) == 0
        assert [row["state"] for row in json.loads(capsys.readouterr().out)] == shown
        assert main(["results", str(tmp_path), "--format", "csv"]) == 0
        assert [row["state"] for row in csv.DictReader(io.StringIO(capsys.readouterr().out))] == shown
        assert main(["results", str(tmp_path)]) == 0
        rows = capsys.readouterr().out.splitlines()[3:]
        assert [row.split()[2] for row in rows] == shown
    finally:
        lock.release()
        store.close()


def test_status_lists_each_error_once_with_its_trials_and_at_most_ten() -> None:
    """A thousand trials failing alike printed a thousand lines; they make one, and distinct errors past ten
    are counted, not listed (``hermes results`` lists every trial's)."""
    from hermes.report.status import ERRORS_SHOWN, _errors

    def failed(trial_id: str, error: str) -> TrialRecord:
        return TrialRecord(trial_id=trial_id, params={}, state=TrialState.FAILED, budget=5, submitted_at=0.0, step=2,
                           checkpoint_step=0, gpu=None, error=error, started_at=0.0, ended_at=1.0)

    alike = [failed(str(index), "uncaught ValueError: bad lr") for index in range(1000)]
    assert _errors(alike) == ["  trials 0, 1, 2 and 997 more (failed): uncaught ValueError: bad lr"]
    distinct = [failed(str(index), f"exit code {index}") for index in range(ERRORS_SHOWN + 5)]
    lines = _errors(distinct)
    assert lines[:2] == ["  trial 0 (failed at step 2): exit code 0", "  trial 1 (failed at step 2): exit code 1"]
    assert len(lines) == ERRORS_SHOWN + 1
    assert lines[-1] == "  ... and 5 more with other errors: `hermes results --format csv` gives every trial's"


def test_a_spec_or_the_store_file_given_for_the_storage_dir_is_told_which_dir_to_give(
    recorded: Recorded, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both were told "no Hermes store at .../experiment.yaml/hermes.db: ... holds no hermes.db"."""
    monkeypatch.chdir(Path(__file__).parents[1])
    assert main(["status", "examples/digits/experiment.yaml"]) == 2
    told = "hermes: error: examples/digits/experiment.yaml is a spec: give its storage dir, runs\n"
    assert capsys.readouterr().err == told  # its storage.dir, ../../runs, from its folder
    store_file = recorded.directory / STORE_FILE
    assert main(["results", str(store_file)]) == 2
    assert f"{store_file} is the store's file: give its folder, the storage dir {recorded.directory}\n" in (
        capsys.readouterr().err)
