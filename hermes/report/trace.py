"""A stored experiment as a learning-curve trace: a search Hermes ran, replayed by the simulator under any policy.

``hermes trace runs > search.csv`` writes it, ``hermes simulate --trace runs`` replays it at once, and
``bench/policy_panel.py --traces search.csv:max`` judges every policy on it, as on the recorded searches of
``data/``: a user's own searches judge the policies too.
"""

from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from hermes.core.states import TrialState
from hermes.report import ExperimentView
from hermes.report.files import trial_files
from hermes.sim.trace import Trace, TraceTrial
from hermes.store import MetricRecord, Run

SHORTEST_EPOCH_S = 1e-3  # an epoch the clock could not tell from nothing still costs something


@dataclass(frozen=True, slots=True)
class RecordedTrace:
    """A stored experiment's trace, and how many of its trials it could not hold."""

    trace: Trace
    left_out: int  # trials stopped early or not finished: what they would have reported is unknown


def experiment_trace(view: ExperimentView, experiment_dir: Path | None = None) -> RecordedTrace:
    """The experiment's finished trials as a trace: an epoch per report that has a value, in step order.

    An epoch's seconds must not hold what the recording policy paid (each start or resume, with its restore,
    which the simulator charges again under the policy it replays), so they are the time between two reports
    of one run. A run's first report follows its start: its epoch takes the mean of the run's others, else of
    the trial's other runs; only a trial none of whose runs reported twice has the time since each run began,
    start-up included, as nothing tells the two apart. A report whose objective is missing or not finite gives
    no epoch: its time goes to the trial's next report that has a value (the trial trained on), and where none
    follows, the trial diverged there. A failed trial is one that diverged: its last epoch costs the time from
    its last report to the end of its run, and gives nothing. A trial stopped early, or not finished, is left
    out, and counted. With ``experiment_dir`` (the experiment's folder on this machine), a trial's state size,
    which sets what a switch costs in the simulator, is that of its newest checkpoint; without one, the
    simulator's default. A trial is movable unless the experiment runs an unmodified program (a command with
    ``trial.metrics_regex``), which every executor submits with ``movable=False`` (it SIGSTOPs it in place): the
    simulator must not migrate it or charge it a state transfer either."""
    reports: dict[str, list[MetricRecord]] = {}
    for record in view.metrics:
        reports.setdefault(record.trial_id, []).append(record)
    runs: dict[str, list[Run]] = {}
    for run in sorted(view.runs, key=lambda run: run.started_at):
        runs.setdefault(run.trial_id, []).append(run)
    trials, left_out = [], 0
    movable = not (view.experiment.spec.get("trial") or {}).get("metrics_regex")
    for trial in view.trials:
        if trial.state not in (TrialState.COMPLETED, TrialState.FAILED) or trial.trial_id not in runs:
            left_out += 1
            continue
        recorded = _curve(view, sorted(reports.get(trial.trial_id, []), key=lambda r: r.step), runs[trial.trial_id],
                          failed=trial.state is TrialState.FAILED)
        if recorded is None:
            left_out += 1
            continue
        metrics, seconds, diverged = recorded
        params = {name: _param(value) for name, value in trial.params.items()}
        state_mb = None if experiment_dir is None else _checkpoint_mb(experiment_dir, trial.trial_id)
        trials.append(TraceTrial(trial.trial_id, tuple(metrics), tuple(seconds), diverged, params, state_mb, movable))
    return RecordedTrace(Trace(view.experiment.name, view.target.objective.mode, tuple(trials)), left_out)


def _curve(
    view: ExperimentView, reports: list[MetricRecord], runs: list[Run], *, failed: bool
) -> tuple[list[float], list[float], bool] | None:
    """(metrics, seconds, diverged) of one trial; None where its runs do not account for its reports."""
    starts = [run.started_at for run in runs]
    by_run: dict[int, list[MetricRecord]] = {}
    for record in reports:
        index = bisect_right(starts, record.at) - 1
        if index < 0:
            return None
        by_run.setdefault(index, []).append(record)
    gaps = {index: [later.at - earlier.at for earlier, later in pairwise(made)] for index, made in by_run.items()}
    trial_gaps = [gap for run_gaps in gaps.values() for gap in run_gaps]
    metrics: list[float] = []
    seconds: list[float] = []
    owed = 0.0  # seconds of reports without a value, paid by the next epoch that has one
    for index, made in sorted(by_run.items()):
        known = gaps[index] or trial_gaps
        first = statistics.fmean(known) if known else made[0].at - starts[index]
        for record, each in zip(made, [first, *gaps[index]]):
            owed += max(each, SHORTEST_EPOCH_S)
            value = view.target.value(record.values)
            if value is not None and math.isfinite(value):
                metrics.append(value)
                seconds.append(owed)
                owed = 0.0
    if failed:
        last = runs[-1]
        if last.ended_at is None:
            return None
        since = max([last.started_at, *(record.at for record in by_run.get(len(runs) - 1, []))])
        owed += max(last.ended_at - since, SHORTEST_EPOCH_S)
    if owed:
        return metrics, [*seconds, owed], True  # the last epochs were paid for and gave no value: diverged
    return (metrics, seconds, False) if metrics else None


def _param(value: object) -> float | str:
    """A hyper-parameter as a trace holds it: a number, or else its text (a choice, a switch, a list)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, str) else json.dumps(value)


def _checkpoint_mb(experiment_dir: Path, trial_id: str) -> float | None:
    """MB of the trial's newest committed checkpoint: the state a switch moves (None: it keeps none)."""
    checkpoint = trial_files(experiment_dir, trial_id).checkpoint
    if checkpoint is None:
        return None
    return sum(file.stat().st_size for file in checkpoint.rglob("*") if file.is_file()) / 1e6
