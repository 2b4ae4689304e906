"""The leaderboard: trials ranked by the best value of the objective each has reported.

Best rather than final: a stopped or suspended trial has no final value, a diverging one ends worse
than it was, and the scheduler's policies rank trials by their best score too. The final value is
shown beside it. A non-finite value is the worst possible (as in the core), so it is no best: a trial
that reported only NaN or infinities has none (empty in CSV, null in JSON, as a non-finite final value
is too) and ranks after every trial with one; trials that have not reported yet come after those, in
submission order, and ties keep submission order. A failed trial is never the best (``can_be_best``): failed
trials come after every other, ranked among themselves the same way, their values still shown.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hermes.core.states import TrialState
from hermes.report import (
    ExperimentView,
    format_duration,
    format_number,
    format_param,
    format_table,
    is_live,
    param_text,
    shown_state,
    summarise_error,
)
from hermes.report.files import TrialFiles, trial_files

ERROR_WIDTH = 60  # characters of a trial's error in the table; csv and json carry all of it


@dataclass(frozen=True, slots=True)
class Standing:
    """One trial's line on the leaderboard."""

    rank: int  # 1 is best
    trial_id: str
    state: TrialState
    params: dict[str, Any]
    best: float | None  # best finite objective value reported; None before the first report, or if none was finite
    best_step: int | None  # the first step that reported ``best``; None where there is no best
    final: float | None  # the last value reported
    steps: int  # last step reported
    budget: int
    reports: int
    gpu_seconds: float  # time holding a GPU, summed over its runs
    error: str | None  # why it failed
    # every metric of the report that gave ``best`` (validation accuracy beside the loss ranked by, say), as Ray Tune's
    # best result and Optuna's user attributes carry them; empty where there is no best
    best_metrics: dict[str, float]


def can_be_best(state: str) -> bool:
    """Whether a trial in ``state`` (a TrialState, or the state a read-out shows) may be the experiment's best. A
    failed trial's partial best is no result: its searcher was told it failed (Optuna's best trial is a complete
    one), and its checkpoint is of a crashed run. A stopped trial's values are a healthy trial's, so it may be."""
    return state != TrialState.FAILED


def standings(view: ExperimentView) -> list[Standing]:
    """Every trial, best first (failed trials last)."""
    objective = view.target.objective
    reports: dict[str, list[tuple[int, float, dict[str, float]]]] = defaultdict(list)  # step, objective, every metric
    last_step: dict[str, int] = {}  # not the core's step: a trial that fell back to its checkpoint is behind it
    for record in view.metrics:
        value = view.target.value(record.values)
        if value is not None:
            reports[record.trial_id].append((record.step, value, record.values))
        last_step[record.trial_id] = max(record.step, last_step.get(record.trial_id, 0))
    now = view.now
    gpu_seconds: dict[str, float] = defaultdict(float)
    for run in view.runs:
        gpu_seconds[run.trial_id] += (run.ended_at if run.ended_at is not None else now) - run.started_at

    unranked = []
    for trial in view.trials:
        own = reports.get(trial.trial_id, [])
        finite = [report for report in own if math.isfinite(report[1])]
        best_step, best, best_metrics = max(finite, key=lambda report: objective.score(report[1]),
                                            default=(None, None, {}))
        unranked.append(
            Standing(
                rank=0,
                trial_id=trial.trial_id,
                state=trial.state,
                params=trial.params,
                best=best,
                best_step=best_step,
                final=own[-1][1] if own else None,
                steps=last_step.get(trial.trial_id, trial.step),
                budget=trial.budget,
                reports=len(own),
                gpu_seconds=gpu_seconds.get(trial.trial_id, 0.0),
                error=trial.error,
                best_metrics=_named(best_metrics, view.target.name),
            )
        )
    # sorted() is stable, so ties keep submission order.
    ranked = sorted(unranked, key=lambda s: (not can_be_best(s.state), s.best is None, not s.reports,
                                             -objective.score(s.best) if s.best is not None else 0))
    return [replace(standing, rank=rank) for rank, standing in enumerate(ranked, start=1)]


def format_results(
    view: ExperimentView, top: list[Standing], output: str, experiment_dir: Path | None = None,
    lock: Path | None = None,
) -> str:
    """``top`` as an aligned table for people, or as CSV or JSON (non-finite values empty, or null) for programs.

    With ``experiment_dir`` (the experiment's folder on this machine), CSV and JSON also give each
    trial's directory and its newest committed checkpoint (``hermes.report.files``), as Ray Tune's results
    give the best trial's path and checkpoint: where to load the winner's model from.

    A trial is in the state ``hermes status`` counts it in: where no runner runs the experiment (``is_live``,
    with ``lock``, the runner lock of the storage dir read), one that the log left on a GPU is ``interrupted``.
    The lock is apart from ``experiment_dir``: a pool's experiment keeps its files in its own storage.dir, and the
    pool's lock lies beside the store."""
    names = list(dict.fromkeys(name for standing in top for name in standing.params))
    metric = view.target.name
    others = list(dict.fromkeys(name for standing in top for name in standing.best_metrics if name != metric))
    saved = {trial.trial_id: trial.checkpoint_step for trial in view.trials}
    files = {s.trial_id: _files(experiment_dir, s, saved[s.trial_id]) for s in top}
    live = is_live(view.experiment, lock)
    states = {s.trial_id: shown_state(s.state, live) for s in top}
    if output == "json":
        return json.dumps([_as_json(s) | {"state": states[s.trial_id]} | files[s.trial_id] for s in top], indent=2,
                          allow_nan=False)
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(
            ["rank", "trial", "state", f"best_{metric}", "best_step", f"final_{metric}", "steps", "budget", "reports",
             "gpu_seconds", *(f"param_{name}" for name in names), "error", "directory", "checkpoint",
             *(f"at_best_{name}" for name in others)]  # last: a reader of the columns before by position reads them
        )
        for s in top:
            writer.writerow(
                [s.rank, s.trial_id, states[s.trial_id], _csv(s.best), _csv(s.best_step), _csv(_finite(s.final)),
                 s.steps, s.budget, s.reports, round(s.gpu_seconds, 3), *(param_text(s.params[name]) if name in s.params else "" for name in names),
                 _csv(s.error), *(_csv(value) for value in files[s.trial_id].values()),
                 *(_csv(_finite(s.best_metrics.get(name))) for name in others)]
            )
        return buffer.getvalue().rstrip("\n")
    errors = any(s.error for s in top)  # the column only when some trial has one
    header = ["#", "trial", "state", f"best {metric}", "at step", "final", "steps", "GPU time", *names,
              *(["error"] if errors else [])]
    rows = [
        [str(s.rank), s.trial_id, states[s.trial_id], format_number(s.best), _csv(s.best_step), format_number(s.final),
         f"{s.steps}/{s.budget}", format_duration(s.gpu_seconds),
         *(format_param(s.params[name]) if name in s.params else "-" for name in names),
         *([summarise_error(s.error, ERROR_WIDTH) if s.error else "-"] if errors else [])]
        for s in top
    ]
    mode = view.target.objective.mode
    failed_last = ", failed trials last" if len({can_be_best(s.state) for s in top}) == 2 else ""
    table = format_table(header, rows, right=(0, 3, 4, 5, 6, 7))
    return f"{view.experiment.name}: top {len(top)} by best {metric} ({mode}){failed_last}\n{table}"


def _as_json(standing: Standing) -> dict[str, Any]:
    return {
        "rank": standing.rank,
        "trial": standing.trial_id,
        "state": standing.state.value,
        "best": _finite(standing.best),
        "best_step": standing.best_step,
        "final": _finite(standing.final),
        "steps": standing.steps,
        "budget": standing.budget,
        "reports": standing.reports,
        "gpu_seconds": round(standing.gpu_seconds, 3),
        "params": standing.params,
        "error": standing.error,
        "best_metrics": {name: _finite(value) for name, value in standing.best_metrics.items()},
    }


def _named(metrics: dict[str, float], metric: str) -> dict[str, float]:
    """A report's metrics with the objective by the metric's name, as README says best_metrics hold it: a command's
    ``metrics_regex`` reads it in a group ``value``, which the store keeps as read (``Target.value`` reads it)."""
    if metric in metrics or "value" not in metrics:
        return dict(metrics)
    return {metric if name == "value" else name: value for name, value in metrics.items()}


def _files(experiment_dir: Path | None, standing: Standing, saved_step: int) -> dict[str, str | None]:
    """The trial's directory, if it is on this machine, and its newest committed checkpoint, in the durable storage
    too, of a step it lists (None: none)."""
    if experiment_dir is None:
        files = TrialFiles(None, None)
    else:
        files = trial_files(experiment_dir, standing.trial_id, saved_step=saved_step, recorded_step=standing.steps)
    return {"directory": _text(files.directory), "checkpoint": _text(files.checkpoint)}


def _text(path: Path | str | None) -> str | None:
    return None if path is None else str(path)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _csv(value: object) -> str:
    return "" if value is None else str(value)
