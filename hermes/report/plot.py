"""PNG figures of a stored experiment: its learning curves and its GPU timeline.

matplotlib is imported only here, and used through its object API on the Agg canvas (no pyplot),
so plotting needs no display and leaves the process's global backend alone.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.core.events import Event, GpuAdded, GpuRemoved, NodeAdded, NodeRemoved
from hermes.core.states import TrialState
from hermes.errors import HermesError
from hermes.report import ExperimentView, format_number
from hermes.report.results import can_be_best, standings
from hermes.store import ExperimentStatus

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

HIGHLIGHTED = 5  # best trials drawn in colour; the rest stay grey, so many curves remain readable
DPI = 120
INTERRUPTED = "interrupted"  # a run still open in the log of an experiment no runner runs: its runner stopped
ENDINGS = {  # how a run ended -> (marker, colour) drawn at its end; completed runs need no mark
    "suspended": ("^", "black"),
    "stopped": ("s", "black"),
    "failed": ("X", "red"),  # its code or process failed
    # Not the trial's doing: its runner was interrupted (a restarted runner loses the old run's nodes first, so
    # those runs end "lost"), or its GPU or node went away. It goes on from its checkpoint.
    "lost": ("o", "0.45"),
    INTERRUPTED: ("o", "0.45"),
}
NOT_RUNNING = (ExperimentStatus.INTERRUPTED, ExperimentStatus.FAILED, ExperimentStatus.FINISHED,
               ExperimentStatus.CANCELLED)  # no runner runs it: a run the log left open ended when its runner did


def plot_experiment(view: ExperimentView, out_dir: str | Path, events: Sequence[Event] | None = None) -> list[Path]:
    """Write ``<experiment>_curves.png`` and ``<experiment>_gpus.png`` into ``out_dir``; return their paths.

    ``events``: the experiment's event log (``store.events``), whence the GPUs it had, idle ones too; without
    it the timeline shows only the GPUs that ran a trial."""
    figures = draw_figures(view, events)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{view.experiment.name}_curves.png", out / f"{view.experiment.name}_gpus.png"]
    for figure, path in zip(figures, paths, strict=True):
        _save(figure, path)
    return paths


def _save(figure: Figure, path: Path) -> None:
    """Into a file beside ``path``, renamed over it once whole: a viewer that reloads the PNG while it is written
    reads the old one or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        figure.savefig(temporary, dpi=DPI, format="png")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def draw_figures(view: ExperimentView, events: Sequence[Event] | None = None) -> tuple[Figure, Figure]:
    """The learning curves and the GPU timeline, drawn but not saved (see ``plot_experiment``)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise HermesError("plotting needs matplotlib: pip install 'matplotlib>=3.7'") from None
    curves, timeline = Figure(layout="constrained"), Figure(layout="constrained")
    # A pool's experiments are stamped on the pool's clock, which ran before they came: their time starts at their
    # first event, as `hermes status` counts it (their runs sat at the end of an axis of the pool's whole life).
    origin = events[0].at if events else min((trial.submitted_at for trial in view.trials), default=0.0)
    _draw_curves(view, curves, origin)
    _draw_timeline(view, timeline, _gpu_presence(events or ()), origin)
    return curves, timeline


def _draw_curves(view: ExperimentView, figure: Figure, origin: float) -> None:
    """The objective per trial against its step and against time since ``origin``, the best trials in colour."""
    target = view.target
    run_starts: dict[str, list[float]] = defaultdict(list)
    for run in view.runs:
        run_starts[run.trial_id].append(run.started_at)
    by_step: dict[str, dict[int, float]] = defaultdict(dict)  # a step re-reported after a rollback: the last report
    by_time: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # (time, value, run number)
    for record in view.metrics:
        value = target.value(record.values)
        if value is None:
            continue
        value = value if math.isfinite(value) else math.nan  # a gap in the line, not a broken axis
        by_step[record.trial_id][record.step] = value
        run_number = bisect.bisect_right(run_starts[record.trial_id], record.at)
        by_time[record.trial_id].append((record.at - origin, value, run_number))
    top = [s for s in standings(view) if s.best is not None][:HIGHLIGHTED]  # failed trials after the others
    colours = {s.trial_id: f"C{rank}" for rank, s in enumerate(top)}
    scale, unit = _time_scale(view.now - origin)

    figure.set_size_inches(13, 5)
    step_axes, time_axes = figure.subplots(1, 2, sharey=True)
    # The grey trials first, as one collection of lines and one line of markers per axes (an artist per trial makes
    # drawing quadratic: each one added rescales over those before it); then the highlighted trials from the last to
    # the best, so the best is drawn on top.
    grey = _GreyCurves()
    for trial in view.trials:
        if trial.trial_id not in colours:
            grey.add(sorted(by_step[trial.trial_id].items()),
                     [(at / scale, value, run) for at, value, run in by_time[trial.trial_id]])
    grey.draw(step_axes, time_axes)
    for s in reversed(top):
        style: dict[str, Any] = {"color": colours[s.trial_id], "linewidth": 1.8, "marker": ".", "markersize": 3,
                                 "zorder": 3}
        steps = sorted(by_step[s.trial_id].items())
        step_axes.plot([step for step, _ in steps], [v for _, v in steps], **style)
        _plot_runs(time_axes, [(at / scale, value, run) for at, value, run in by_time[s.trial_id]], style)
    for s in top:
        step_axes.plot([s.best_step], [s.best], marker="*", markersize=11, color=colours[s.trial_id], zorder=4,
                       linestyle="none", label=f"#{s.rank} trial {s.trial_id}: {format_number(s.best)}"
                       + ("" if can_be_best(s.state) else " (failed)"))
    if top:
        from matplotlib.ticker import MaxNLocator

        step_axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 2.5
        step_axes.legend(title=f"best {target.name}", loc="best", fontsize="small")
        title = f"{view.experiment.name}: {target.name} of {len(view.trials)} trials, best {len(top)} in colour"
    else:
        headline, detail = _nothing_reported(view)
        step_axes.text(0.5, 0.5, f"{headline}\n{detail}" if detail else headline, transform=step_axes.transAxes,
                       ha="center", va="center", color="0.4")
        for axes in (step_axes, time_axes):  # nothing drawn: a scale around 0 would only mislead
            axes.set_xticks([])
            axes.set_yticks([])
        title = f"{view.experiment.name}: {target.name} of {len(view.trials)} trials, {headline}"
    step_axes.set_xlabel("step")
    step_axes.set_ylabel(f"{target.name} ({'higher' if target.objective.mode == 'max' else 'lower'} is better)")
    time_axes.set_xlabel(f"time since the experiment started ({unit})")
    for axes in (step_axes, time_axes):
        axes.grid(alpha=0.3)
    figure.suptitle(title)


def _nothing_reported(view: ExperimentView) -> tuple[str, str]:
    """What the curves say when no trial reported the objective: a headline, and why where the records tell."""
    running = view.experiment.status not in NOT_RUNNING
    if not view.trials:
        return ("no trial yet" if running else "no trial ran"), ""
    headline = "no reports yet" if running else "no trial reported"
    if {record.trial_id for record in view.metrics}:
        return headline, f"the reports hold no {view.target.name}"
    failed = sum(trial.state is TrialState.FAILED for trial in view.trials)
    if failed == len(view.trials):
        return headline, "every trial failed before its first report"
    if failed:
        return headline, f"{failed} of {len(view.trials)} trials failed before their first report"
    return headline, ""


def _plot_runs(axes: Axes, points: list[tuple[float, float, int]], style: dict[str, Any]) -> None:
    """Solid while the trial trains; dotted across the pauses between its runs."""
    axes.plot([x for x, _, _ in points], [y for _, y, _ in points], **{**style, "linestyle": ":", "marker": None})
    xs: list[float] = []
    ys: list[float] = []
    for index, (x, y, run) in enumerate(points):
        if index and run != points[index - 1][2]:
            xs.append(math.nan)
            ys.append(math.nan)
        xs.append(x)
        ys.append(y)
    axes.plot(xs, ys, **style)


GREY = {"color": "0.6", "linewidth": 0.8, "alpha": 0.5, "zorder": 2}  # the trials not highlighted
GREY_MARKS = {"marker": ".", "markersize": 2}


class _GreyCurves:
    """The trials not highlighted, drawn as ``_plot_runs`` and a step line would draw each, but gathered: per axes
    one collection of solid pieces, one of dotted ones, and one line of the markers."""

    def __init__(self) -> None:
        self.step_solid: list[list[tuple[float, float]]] = []
        self.time_solid: list[list[tuple[float, float]]] = []
        self.time_dotted: list[list[tuple[float, float]]] = []
        self.step_marks: list[tuple[float, float]] = []
        self.time_marks: list[tuple[float, float]] = []

    def add(self, steps: list[tuple[int, float]], points: list[tuple[float, float, int]]) -> None:
        """A trial's (step, value) reports, and its (time, value, run number) ones in time order."""
        self.step_solid.extend(_pieces([(float(step), value) for step, value in steps]))
        self.step_marks.extend((step, value) for step, value in steps if not math.isnan(value))
        self.time_dotted.extend(_pieces([(x, y) for x, y, _ in points]))
        start = 0
        for index in range(1, len(points) + 1):  # solid within a run, not across the pause before the next
            if index == len(points) or points[index][2] != points[index - 1][2]:
                self.time_solid.extend(_pieces([(x, y) for x, y, _ in points[start:index]]))
                start = index
        self.time_marks.extend((x, y) for x, y, _ in points if not math.isnan(y))

    def draw(self, step_axes: Axes, time_axes: Axes) -> None:
        from matplotlib.collections import LineCollection
        from matplotlib.lines import Line2D

        solid = {"capstyle": "projecting", "joinstyle": "round"}  # as a Line2D's solid line
        dotted = {"linestyle": ":", "capstyle": "butt", "joinstyle": "round"}  # as a Line2D's dashes
        for axes, pieces, kwargs in ((time_axes, self.time_dotted, dotted), (step_axes, self.step_solid, solid),
                                     (time_axes, self.time_solid, solid)):
            if pieces:
                axes.add_collection(LineCollection(
                    pieces, colors=GREY["color"], linewidths=GREY["linewidth"], alpha=GREY["alpha"],
                    zorder=GREY["zorder"], **kwargs))
        for axes, marks in ((step_axes, self.step_marks), (time_axes, self.time_marks)):
            if marks:
                axes.add_line(Line2D([x for x, _ in marks], [y for _, y in marks], linestyle="none",
                                     **{**GREY, **GREY_MARKS}))


def _pieces(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The polylines of a line through ``points`` that a NaN value breaks, each of two points or more."""
    pieces: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if math.isnan(y):
            pieces.append([])
        else:
            pieces[-1].append((x, y))
    return [piece for piece in pieces if len(piece) > 1]


Spans = list[tuple[float, float | None]]  # when a GPU joined the experiment's cluster, and left it (None: never)


def _gpu_presence(events: Sequence[Event]) -> dict[str, Spans]:
    """Every GPU the log's cluster had, idle ones too (as ``hermes status`` finds them), with its spans there."""
    spans: dict[str, Spans] = {}
    node_gpus: dict[str, list[str]] = {}

    def leave(gpu: str, at: float) -> None:
        if spans.get(gpu) and spans[gpu][-1][1] is None:
            spans[gpu][-1] = (spans[gpu][-1][0], at)

    for event in events:
        if isinstance(event, (NodeAdded, GpuAdded)):
            joined = event.gpus if isinstance(event, NodeAdded) else (event.gpu,)
            node = node_gpus.setdefault(event.node, [])
            for gpu in joined:
                if gpu not in node:
                    node.append(gpu)
                if not spans.get(gpu) or spans[gpu][-1][1] is not None:
                    spans.setdefault(gpu, []).append((event.at, None))
        elif isinstance(event, NodeRemoved):
            for gpu in node_gpus.pop(event.node, []):
                leave(gpu, event.at)
        elif isinstance(event, GpuRemoved):
            for gpus in node_gpus.values():
                if event.gpu in gpus:
                    gpus.remove(event.gpu)
            leave(event.gpu, event.at)
    return spans


def _draw_timeline(view: ExperimentView, figure: Figure, presence: dict[str, Spans], origin: float) -> None:
    """One row per GPU the experiment had, one bar per run coloured by trial, against time since ``origin``; the tail
    of a run asked to yield is hatched, and a GPU's time out of the cluster shaded."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    gpus = sorted({run.gpu for run in view.runs} | set(presence), key=_natural)
    row = {gpu: index for index, gpu in enumerate(gpus)}
    tab20 = colormaps["tab20"]
    colours = [tab20(index) for index in range(20) if index not in (14, 15)]  # no greys: bars must not look like idle
    palette = {trial.trial_id: colours[index % len(colours)] for index, trial in enumerate(view.trials)}
    now = view.now - origin
    scale, unit = _time_scale(now)
    presence = {gpu: [(joined - origin, None if left is None else left - origin) for joined, left in spans]
                for gpu, spans in presence.items()}
    figure.set_size_inches(13, max(2.8, 0.5 * len(gpus) + 1.8))
    axes: Axes = figure.subplots()
    # One collection per kind of bar and one line per kind of mark, whatever the number of runs (an artist per
    # run makes drawing quadratic: each one added rescales the axes over those before it).
    gaps: list[tuple[float, float, float]] = []  # (start, width, row), shaded
    first = min((spans[0][0] for spans in presence.values()), default=0.0)  # the cluster the experiment began with
    for gpu, spans in presence.items():  # shade where the GPU was not the experiment's: before it joined, after it left
        since: float | None = spans[0][0] if spans[0][0] == first else 0.0  # the first cluster's: there from the start
        out: list[tuple[float, float]] = []
        for joined, left in spans:
            if since is not None:
                out.append((since, joined - since))
            since = left
        if since is not None:
            out.append((since, now - since))
        gaps.extend((start / scale, width / scale, row[gpu])
                    for start, width in out if width > now / 200)  # not a restart's blink
    absent = bool(gaps)
    _bars(axes, gaps, 0.5, facecolors="0.92", edgecolor="none", zorder=0)
    open_ended = view.experiment.status in NOT_RUNNING  # its runner stopped: an open run ended with it
    trained: list[tuple[float, float, float]] = []  # (start, width, row) of each run until asked to yield
    tails: list[tuple[float, float, float]] = []  # and from then to its end
    trained_colours: list[Any] = []
    tail_colours: list[Any] = []
    resumes: dict[tuple[str, str], tuple[list[float], list[float]]] = {  # (marker, colour) -> where
        ("v", "black"): ([], []), ("D", "magenta"): ([], [])}  # on another GPU drawn over on the same one
    ends: dict[tuple[str, str], tuple[list[float], list[float]]] = {mark: ([], []) for mark in ENDINGS.values()}
    for run in view.runs:
        y, colour = row[run.gpu], palette.get(run.trial_id, (0.5, 0.5, 0.5))
        start = (run.started_at - origin) / scale
        end = (run.ended_at - origin if run.ended_at is not None else now) / scale
        ended_by = INTERRUPTED if run.ended_at is None and open_ended else run.ended_by
        yielding = (run.yield_requested_at - origin) / scale if run.yield_requested_at is not None else end
        trained.append((start, yielding - start, y))
        trained_colours.append(colour)
        if yielding < end:
            tails.append((yielding, end - yielding, y))
            tail_colours.append(colour)
        if end - start > now / scale / 40:  # the bar is wide enough to name its trial
            red, green, blue = colour[:3]
            ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.6 else "white"  # readable on the bar
            axes.text((start + end) / 2, y, run.trial_id, ha="center", va="center", fontsize=7, color=ink, clip_on=True)
        if run.resumed:
            xs, ys = resumes["D", "magenta"] if run.migrated else resumes["v", "black"]
            xs.append(start)
            ys.append(y - 0.38)
        if ended_by in ENDINGS:
            xs, ys = ends[ENDINGS[ended_by]]
            xs.append(end)
            ys.append(y + 0.38 if ended_by == "suspended" else y)
    _bars(axes, trained, 0.38, facecolors=trained_colours, edgecolor="white", linewidth=0.6)
    _bars(axes, tails, 0.38, facecolors=tail_colours, alpha=0.45, hatch="////", edgecolor="white", linewidth=0.6)
    for (marker, mark_colour), (xs, ys) in resumes.items():
        if xs:
            axes.plot(xs, ys, marker=marker, markersize=4.5, linestyle="none", color=mark_colour, zorder=4)
    # Failures drawn over the other ends where marks crowd.
    for (marker, mark_colour), (xs, ys) in sorted(ends.items(), key=lambda kind: kind[0] == ENDINGS["failed"]):
        if xs:
            axes.plot(xs, ys, marker=marker, markersize=5.5, color=mark_colour,
                      markeredgecolor="white" if marker == "o" else mark_colour, markeredgewidth=0.6,
                      linestyle="none", zorder=4, clip_on=False)  # whole at the axis's end
    axes.set_yticks(range(len(gpus)), gpus)
    axes.set_ylim(len(gpus) - 0.5, -0.5)  # the first GPU at the top
    axes.set_xlim(0, max(now / scale, 1e-9))
    axes.set_xlabel(f"time since the experiment started ({unit})")
    axes.grid(axis="x", alpha=0.3)
    if not view.runs:
        axes.text(0.5, 0.5, "no trial has run yet" if not open_ended else "no trial ran", transform=axes.transAxes,
                  ha="center", color="0.4")
    legend = [
        Patch(facecolor="0.5", alpha=0.45, hatch="////", edgecolor="white", label="asked to yield (suspend or stop)"),
        Line2D([], [], marker="^", color="black", linestyle="none", label="suspended"),
        Line2D([], [], marker="v", color="black", linestyle="none", label="resumed on the same GPU"),
        Line2D([], [], marker="D", color="magenta", linestyle="none", label="resumed on another GPU"),
        Line2D([], [], marker="s", color="black", linestyle="none", label="stopped"),
        Line2D([], [], marker="X", color="red", linestyle="none", label="failed"),
        Line2D([], [], marker="o", color="0.45", markeredgecolor="white", markeredgewidth=0.6, linestyle="none",
               label="interrupted or lost"),
    ]
    if absent:
        legend.append(Patch(facecolor="0.92", label="not in the cluster"))
    figure.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize="small", frameon=False)
    runs = f"{len(view.runs)} run{'' if len(view.runs) == 1 else 's'}"
    axes.set_title(f"{view.experiment.name}: GPU timeline ({runs}; colour = trial)")


def _bars(axes: Axes, bars: list[tuple[float, float, float]], half: float, **kwargs: Any) -> None:
    """One collection of the (start, width, row) bars, each ``2 * half`` high about its row, as ``broken_barh``
    draws them; the axes' limits are set apart, once."""
    from matplotlib.collections import PolyCollection

    if bars:
        axes.add_collection(PolyCollection(
            [[(x, y - half), (x, y + half), (x + width, y + half), (x + width, y - half)] for x, width, y in bars],
            **kwargs), autolim=False)


def _time_scale(span: float) -> tuple[float, str]:
    """Seconds, minutes or hours, whichever keeps the axis's numbers short."""
    if span >= 3 * 3600:
        return 3600.0, "h"
    if span >= 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _natural(name: str) -> list[int | str]:
    """Sort key that puts g2 before g10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
