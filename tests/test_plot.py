"""What ``hermes plot`` draws, read back from the figures: the GPUs on the timeline, the marks at the runs' ends,
and what the curves say when there is nothing to draw.

Each experiment is a scripted log fed through the real scheduling core and recorded as a runner records one
(its events with the decisions the core took, each report's metrics, each trial's record), in a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import pytest

from hermes.core.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.experiment import parse_spec
from hermes.policies import make_policy
from hermes.report import STORE_FILE, ExperimentView, open_store, pick_experiment
from hermes.store import ExperimentStatus, SqlStore, TrialRecord

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from hermes.report.plot import draw_figures, plot_experiment

RED = (1.0, 0.0, 0.0, 1.0)
Draw = Callable[[str, Sequence[Event], ExperimentStatus], tuple[ExperimentView, Figure, Figure]]


def record(directory: Path, name: str, events: Sequence[Event], status: ExperimentStatus) -> None:
    """Feed ``events`` through a fifo core and store what a runner would; leave the experiment in ``status``."""
    spec = parse_spec({
        "name": name,
        "trial": {"function": "tests.trials.curve:train"},
        "search": {"trials": 2, "space": {"rate": {"type": "uniform", "low": 0.1, "high": 1.0}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 4},
        "policy": {"name": "fifo"},
    }).model_dump(mode="json")
    with closing(SqlStore(f"sqlite:///{directory / STORE_FILE}")) as store:
        experiment_id = store.create_or_open_experiment(name, spec)
        scheduler = Scheduler(make_policy("fifo"), objective=Objective("max"))
        for event in events:
            store.append_event(experiment_id, event, scheduler.handle(event))
            if isinstance(event, TrialReported):
                store.record_metrics(experiment_id, event.trial_id, event.step, event.at, {"score": event.value})
        for trial in scheduler.trials.values():
            store.upsert_trial(experiment_id, TrialRecord(
                trial_id=trial.trial_id, params=dict(trial.params), state=trial.state, budget=trial.budget,
                submitted_at=trial.submitted_at, step=trial.step, checkpoint_step=trial.checkpoint_step,
                gpu=trial.gpu, error=trial.error,
                started_at=0.0 if trial.state is not TrialState.PENDING else None,
                ended_at=events[-1].at if trial.state.is_terminal else None,
            ))
        store.set_status(experiment_id, status)


@pytest.fixture
def drawn(tmp_path: Path) -> Iterator[Draw]:
    """A function that records a log as an experiment and returns its view and the two figures drawn of it."""
    stores: list[SqlStore] = []

    def draw(name: str, events: Sequence[Event], status: ExperimentStatus) -> tuple[ExperimentView, Figure, Figure]:
        record(tmp_path, name, events, status)
        store = open_store(tmp_path)
        stores.append(store)
        experiment = pick_experiment(store, name)
        view = ExperimentView.load(store, experiment)
        curves, timeline = draw_figures(view, store.events(experiment.experiment_id))
        return view, curves, timeline

    yield draw
    for store in stores:
        store.close()


def marks(figure: Figure) -> list[tuple[str, tuple[float, ...]]]:
    """The markers drawn on the timeline (run ends and resumes), one per mark: (marker, colour)."""
    from matplotlib.colors import to_rgba

    axes = figure.axes[0]
    return [(str(line.get_marker()), to_rgba(line.get_color())) for line in axes.lines if line.get_linestyle() == "None"
            for _ in line.get_xdata()]


def legend_labels(figure: Figure) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def test_the_timeline_draws_every_gpu_the_experiment_had_idle_ones_too(drawn: Draw, tmp_path: Path) -> None:
    """One trial on a cluster of three GPUs, a fourth granted later and one taken away: each gets its row, as
    ``hermes status`` lists them, though only n0/g0 ever ran anything."""
    events = [
        NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")),
        NodeAdded(0.0, "n1", ("n1/g0",)),
        TrialSubmitted(0.0, "a", 4),
        SubmissionsClosed(0.0),
        TrialReported(2.0, "a", 1, 0.3),
        GpuAdded(3.0, "n1", "n1/g1"),  # joins later, never used
        GpuRemoved(4.0, "n0/g1"),  # leaves idle
        TrialReported(5.0, "a", 2, 0.5),
        TrialReported(7.0, "a", 3, 0.6),
        TrialReported(9.0, "a", 4, 0.7),
        TrialExited(10.0, "a", succeeded=True),
    ]
    view, _, timeline = drawn("idle", events, ExperimentStatus.FINISHED)
    assert {run.gpu for run in view.runs} == {"n0/g0"}
    axes = timeline.axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == ["n0/g0", "n0/g1", "n1/g0", "n1/g1"]
    assert axes.get_ylim() == (3.5, -0.5)  # every row shown, the first GPU at the top
    assert axes.get_title() == "idle: GPU timeline (1 run; colour = trial)"
    assert "not in the cluster" in legend_labels(timeline)  # n1/g1 before it joined, n0/g1 after it left

    written = plot_experiment(view, tmp_path / "plots", events)  # the files hold the same figures
    assert [path.name for path in written] == ["idle_curves.png", "idle_gpus.png"]


def test_the_step_axis_has_whole_steps_only(drawn: Draw) -> None:
    """Steps are whole numbers: a curve of 4 steps was ticked at 1.5, 2.5 and 3.5 too."""
    events = [
        NodeAdded(0.0, "n0", ("n0/g0",)),
        TrialSubmitted(0.0, "a", 4),
        SubmissionsClosed(0.0),
        *(TrialReported(float(step), "a", step, 0.1 * step) for step in range(1, 5)),
        TrialExited(4.5, "a", succeeded=True),
    ]
    _, curves, _ = drawn("short", events, ExperimentStatus.FINISHED)
    step_axes = curves.axes[0]
    low, high = step_axes.get_xlim()
    ticks = [tick for tick in step_axes.get_xticks() if low <= tick <= high]
    assert len(ticks) >= 2 and all(tick == int(tick) for tick in ticks), ticks


def test_an_experiment_whose_every_trial_failed_says_so_and_claims_no_best(drawn: Draw) -> None:
    events = [
        NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")),
        TrialSubmitted(0.0, "a", 4),
        TrialSubmitted(0.0, "b", 4),
        SubmissionsClosed(0.0),
        TrialExited(0.2, "a", succeeded=False, error="RuntimeError: synthetic failure", crashed=True),
        TrialExited(0.3, "b", succeeded=False, error="RuntimeError: synthetic failure", crashed=True),
    ]
    view, curves, _ = drawn("doomed", events, ExperimentStatus.FINISHED)
    assert [trial.state for trial in view.trials] == [TrialState.FAILED, TrialState.FAILED] and not view.metrics
    title = curves._suptitle.get_text()  # type: ignore[union-attr]
    assert title == "doomed: score of 2 trials, no trial reported"
    assert "best" not in title
    step_axes, time_axes = curves.axes
    said = " ".join(text.get_text() for text in step_axes.texts)
    assert "every trial failed before its first report" in said and "yet" not in said  # finished: nothing to wait for
    for axes in (step_axes, time_axes):  # no scale of -0.04 to 0.04 around nothing
        assert list(axes.get_xticks()) == [] and list(axes.get_yticks()) == []
        assert not any(len(line.get_xdata()) for line in axes.lines)


def test_a_running_experiment_without_reports_is_waiting_for_them(drawn: Draw) -> None:
    events = [NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "a", 4), TrialSubmitted(0.0, "b", 4)]
    _, curves, _ = drawn("young", events, ExperimentStatus.RUNNING)
    assert curves._suptitle.get_text() == "young: score of 2 trials, no reports yet"  # type: ignore[union-attr]


def test_interrupted_and_lost_runs_are_not_drawn_as_failures(drawn: Draw) -> None:
    """Trial a crashes for good: the one red mark. Trial b's run ends when its runner is interrupted (a restarted
    runner loses the old run's node first, so the log says "lost"), and its next run is open when the runner is
    interrupted again: both get the grey mark of an interruption, not the red one of a crash."""
    events = [
        NodeAdded(0.0, "n0", ("n0/g0", "n0/g1")),
        TrialSubmitted(0.0, "a", 4),
        TrialSubmitted(0.0, "b", 4),
        SubmissionsClosed(0.0),
        TrialReported(1.0, "b", 1, 0.3, checkpointed=True),
        TrialExited(1.5, "a", succeeded=False, error="RuntimeError: synthetic failure", crashed=True),
        TrialReported(2.0, "b", 2, 0.4, checkpointed=True),
        NodeRemoved(2.5, "n0"),  # Ctrl-C, then `hermes run` again: the old run's node is lost, the new one joins
        NodeAdded(2.5, "n0", ("n0/g0", "n0/g1")),
        TrialReported(3.5, "b", 3, 0.5, checkpointed=True),  # then Ctrl-C again, b still on its GPU
    ]
    view, _, timeline = drawn("cut", events, ExperimentStatus.INTERRUPTED)
    assert [(run.trial_id, run.ended_by) for run in view.runs] == [("a", "failed"), ("b", "lost"), ("b", None)]
    ends = [mark for mark in marks(timeline) if mark[0] != "v"]  # less the resume's mark
    assert [colour for _, colour in ends].count(RED) == 1  # trial a's crash only
    grey = [(marker, colour) for marker, colour in ends if colour != RED]
    assert len(grey) == 2 and all(colour[0] == colour[1] == colour[2] for _, colour in grey)
    assert {marker for marker, _ in grey} != {"X"}  # another shape too, so it tells apart without colour
    labels = legend_labels(timeline)
    assert "failed" in labels and "interrupted or lost" in labels and "failed or lost" not in labels
    handles = {text.get_text(): handle for legend in timeline.legends
               for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)}
    interrupted = handles["interrupted or lost"]
    assert isinstance(interrupted, Line2D) and interrupted.get_marker() == grey[0][0]  # the legend shows the mark


def test_the_artists_drawn_do_not_grow_with_the_trials_and_runs(tmp_path: Path) -> None:
    """An artist per run or per trial makes a plot quadratic (each one added rescales the axes over those before
    it: minutes and gigabytes for thousands of runs): the bars, marks and grey curves of 200 trials take no more
    artists than those of 20."""
    from hermes.testing.recorded import experiment_spec, record_simulated

    def artists(trials: int) -> tuple[int, list[int]]:
        with closing(SqlStore(f"sqlite:///{tmp_path / f'{trials}.db'}")) as store:
            experiment_id = store.create_or_open_experiment(f"many{trials}", experiment_spec(f"many{trials}", trials, 4))
            record_simulated(store, experiment_id, trials, 4)
            view = ExperimentView.load(store, pick_experiment(store, f"many{trials}"))
            figures = draw_figures(view, store.events(experiment_id))
        return len(view.runs), [len(axes.lines) + len(axes.collections) + len(axes.patches)
                                for figure in figures for axes in figure.axes]  # the curves' two axes, the timeline's

    few_runs, few = artists(20)
    many_runs, many = artists(200)
    assert many_runs > 5 * few_runs
    assert all(count <= bound for count, bound in zip(many, few, strict=True)), (few, many)
    assert max(many) < 20


def test_a_pool_experiment_is_drawn_from_its_first_event_not_from_the_pools_start(drawn: Draw) -> None:
    """A pool stamps its experiments on its own clock, which had run 90 s before this one came: the runs sat in the
    last 2% of an axis from 0 to 96 s labelled "time since the experiment started"."""
    events = [
        NodeAdded(90.0, "n0", ("n0/g0",)),
        TrialSubmitted(90.0, "a", 2),
        SubmissionsClosed(90.0),
        TrialReported(92.0, "a", 1, 0.3),
        TrialReported(95.0, "a", 2, 0.5),
        TrialExited(96.0, "a", succeeded=True),
    ]
    _, curves, timeline = drawn("pooled", events, ExperimentStatus.FINISHED)
    axes = timeline.axes[0]
    assert axes.get_xlim() == (0.0, 6.0)
    (bar,) = [collection for collection in axes.collections if len(collection.get_paths()) == 1]
    assert sorted({x for x, _ in bar.get_paths()[0].vertices}) == [0.0, 6.0]  # the run, from its start to its end
    time_axes = curves.axes[1]
    assert [list(line.get_xdata()) for line in time_axes.lines if len(line.get_xdata()) == 2][0] == [2.0, 5.0]
