"""PNG figures of a stored experiment: its learning curves and its GPU timeline.

matplotlib is imported only here, and used through its object API on the Agg canvas (no pyplot),
so plotting needs no display and leaves the process's global backend alone.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.core.events import Event, GpuAdded, GpuRemoved, NodeAdded, NodeRemoved
from hermes.core.states import TrialState
from hermes.errors import HermesError
from hermes.report import ExperimentView, format_number
from hermes.report.results import standings
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
        figure.savefig(path, dpi=DPI)
    return paths


def draw_figures(view: ExperimentView, events: Sequence[Event] | None = None) -> tuple[Figure, Figure]:
    """The learning curves and the GPU timeline, drawn but not saved (see ``plot_experiment``)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise HermesError("plotting needs matplotlib: pip install 'matplotlib>=3.7'") from None
    curves, timeline = Figure(layout="constrained"), Figure(layout="constrained")
    _draw_curves(view, curves)
    _draw_timeline(view, timeline, _gpu_presence(events or ()))
    return curves, timeline


def _draw_curves(view: ExperimentView, figure: Figure) -> None:
    """The objective per trial against its step and against time, the best trials in colour."""
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
        by_time[record.trial_id].append((record.at, value, run_number))
    top = [s for s in standings(view) if s.best is not None][:HIGHLIGHTED]
    colours = {s.trial_id: f"C{rank}" for rank, s in enumerate(top)}
    scale, unit = _time_scale(view.now)

    figure.set_size_inches(13, 5)
    step_axes, time_axes = figure.subplots(1, 2, sharey=True)
    # Grey first, then the highlighted trials from the last to the best, so the best is drawn on top.
    order = [t.trial_id for t in view.trials if t.trial_id not in colours] + [s.trial_id for s in reversed(top)]
    for trial_id in order:
        colour = colours.get(trial_id)
        style: dict[str, Any] = (
            {"color": colour, "linewidth": 1.8, "marker": ".", "markersize": 3, "zorder": 3}
            if colour
            else {"color": "0.6", "linewidth": 0.8, "marker": ".", "markersize": 2, "alpha": 0.5, "zorder": 2}
        )
        steps = sorted(by_step[trial_id].items())
        step_axes.plot([s for s, _ in steps], [v for _, v in steps], **style)
        _plot_runs(time_axes, [(at / scale, value, run) for at, value, run in by_time[trial_id]], style)
    for s in top:
        step_axes.plot([s.best_step], [s.best], marker="*", markersize=11, color=colours[s.trial_id], zorder=4,
                       linestyle="none", label=f"#{s.rank} trial {s.trial_id}: {format_number(s.best)}")
    if top:
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


def _draw_timeline(view: ExperimentView, figure: Figure, presence: dict[str, Spans]) -> None:
    """One row per GPU the experiment had, one bar per run coloured by trial; the tail of a run asked to yield is
    hatched, and a GPU's time out of the cluster shaded."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    gpus = sorted({run.gpu for run in view.runs} | set(presence), key=_natural)
    row = {gpu: index for index, gpu in enumerate(gpus)}
    tab20 = colormaps["tab20"]
    colours = [tab20(index) for index in range(20) if index not in (14, 15)]  # no greys: bars must not look like idle
    palette = {trial.trial_id: colours[index % len(colours)] for index, trial in enumerate(view.trials)}
    now = view.now
    scale, unit = _time_scale(now)
    figure.set_size_inches(13, max(2.8, 0.5 * len(gpus) + 1.8))
    axes: Axes = figure.subplots()
    absent = False
    first = min((spans[0][0] for spans in presence.values()), default=0.0)  # the cluster the experiment began with
    for gpu, spans in presence.items():  # shade where the GPU was not the experiment's: before it joined, after it left
        gaps: list[tuple[float, float]] = []
        since: float | None = spans[0][0] if spans[0][0] == first else 0.0  # the first cluster's: there from the start
        for joined, left in spans:
            if since is not None:
                gaps.append((since, joined - since))
            since = left
        if since is not None:
            gaps.append((since, now - since))
        gaps = [(start / scale, width / scale) for start, width in gaps if width > now / 200]  # not a restart's blink
        if gaps:
            absent = True
            axes.broken_barh(gaps, (row[gpu] - 0.5, 1.0), facecolors="0.92", edgecolor="none", zorder=0)
    open_ended = view.experiment.status in NOT_RUNNING  # its runner stopped: an open run ended with it
    for run in view.runs:
        y, colour = row[run.gpu], palette.get(run.trial_id, (0.5, 0.5, 0.5))
        start = run.started_at / scale
        end = (run.ended_at if run.ended_at is not None else now) / scale
        ended_by = INTERRUPTED if run.ended_at is None and open_ended else run.ended_by
        yielding = run.yield_requested_at / scale if run.yield_requested_at is not None else end
        axes.broken_barh([(start, yielding - start)], (y - 0.38, 0.76), facecolors=colour, edgecolor="white",
                         linewidth=0.6)
        if yielding < end:
            axes.broken_barh([(yielding, end - yielding)], (y - 0.38, 0.76), facecolors=colour, alpha=0.45,
                             hatch="////", edgecolor="white", linewidth=0.6)
        if end - start > now / scale / 40:  # the bar is wide enough to name its trial
            red, green, blue = colour[:3]
            ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.6 else "white"  # readable on the bar
            axes.text((start + end) / 2, y, run.trial_id, ha="center", va="center", fontsize=7, color=ink, clip_on=True)
        if run.resumed:
            axes.plot([start], [y - 0.38], marker="D" if run.migrated else "v", markersize=4.5, linestyle="none",
                      color="magenta" if run.migrated else "black", zorder=4)
        if ended_by in ENDINGS:
            marker, mark_colour = ENDINGS[ended_by]
            axes.plot([end], [y + 0.38 if ended_by == "suspended" else y], marker=marker, markersize=5.5,
                      color=mark_colour, markeredgecolor="white" if marker == "o" else mark_colour,
                      markeredgewidth=0.6, linestyle="none", zorder=4, clip_on=False)  # whole at the axis's end
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
