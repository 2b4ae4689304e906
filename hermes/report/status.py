"""Where an experiment stands: its progress, best trial, and who holds which GPU right now."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hermes.core.decisions import Decision, Resume, Start, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuReclaimed,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    SubmissionsReopened,
    TrialExited,
    TrialSuspended,
)
from hermes.core.states import TrialState
from hermes.report import (
    INTERRUPTED,
    ExperimentView,
    format_duration,
    format_number,
    format_param,
    format_table,
    is_live,
    printable,
    shown_state,
    summarise_error,
)
from hermes.report.results import Standing, can_be_best, standings
from hermes.store import DecisionRecord, ExperimentRecord, ExperimentStatus, ExperimentStore, Run, TrialRecord
from hermes.store.base import WAITING_FOR_FILES
from hermes.store.lock import describe, holder


ERRORS_SHOWN = 10  # distinct errors `hermes status` lists


@dataclass(frozen=True, slots=True)
class Status:
    view: ExperimentView
    elapsed: float  # from the first event to now
    now: float  # the latest time recorded; while a runner runs it, the experiment's time now
    by_state: dict[TrialState, int]  # trials in each state, in the state enum's order, zeros left out
    best: Standing | None  # None until a trial that has not failed reports a finite value
    gpus: dict[str, Run | None]  # every GPU the cluster has now -> the run on it, if any
    preemptions: int  # Suspend decisions
    migrations: int  # resumes on another GPU
    reruns: int  # runs that crashed, after which their trial ran again from its checkpoint
    state: str  # the stored status, with who runs it, or that nobody does although it says running
    live: bool  # a runner runs it now: otherwise no GPU is busy, whatever runs the log left open
    ended_by: str | None  # why a finished experiment ended before its searcher did (its budget of time or GPU hours)


def experiment_status(store: ExperimentStore, experiment: ExperimentRecord, lock: Path | None = None) -> Status:
    """Read the experiment's records and its event log; GPUs come from the log, so idle ones are listed too.

    ``lock``: the storage dir's runner lock (``hermes.store.lock``), to tell whether a "running"
    experiment has a runner, or lost it to ``kill -9`` or a crash of the machine."""
    view = ExperimentView.load(store, experiment, lock)
    events = store.events(experiment.experiment_id)
    records = store.decisions(experiment.experiment_id)
    decisions = [record.decision for record in records]
    counts = Counter(trial.state for trial in view.trials)
    live = is_live(experiment, lock)
    running = {run.gpu: run for run in view.runs if run.ended_at is None and live}
    now = max(view.now, events[-1].at if events else 0.0)  # while it runs, its clock now: it goes on between events
    return Status(
        view=view,
        elapsed=now - events[0].at if events else 0.0,
        now=now,
        by_state={state: counts[state] for state in TrialState if counts[state]},
        best=_best(view),
        gpus={gpu: running.get(gpu) for gpu in _present_gpus(events, records)},
        preemptions=sum(isinstance(decision, Suspend) for decision in decisions),
        migrations=sum(isinstance(decision, Resume) and decision.migrated for decision in decisions),
        reruns=_reruns(view, events),
        state=_state(experiment, lock),
        live=live,
        ended_by=ended_by(experiment, events),
    )


def ended_by(experiment: ExperimentRecord, events: Sequence[Event]) -> str | None:
    """The reason its log gives for ending it, when it finished by that (a cancel on request is a status of its
    own; a reopening, a larger budget, undoes it)."""
    if experiment.status is not ExperimentStatus.FINISHED:
        return None
    for event in reversed(events):
        if isinstance(event, SubmissionsReopened):
            return None
        if isinstance(event, ExperimentCancelled):
            return event.reason or None
    return None


def _reruns(view: ExperimentView, events: Sequence[Event]) -> int:
    """Crashed runs that did not end their trial: all its crashes, less the last one of a trial that ended by it
    (failed, or completed: a crash after its last step)."""
    crashes: Counter[str] = Counter()
    last_exit: dict[str, TrialExited] = {}
    for event in events:
        if isinstance(event, TrialExited):
            crashes[event.trial_id] += event.crashed
            last_exit[event.trial_id] = event
    ended = {trial.trial_id for trial in view.trials if trial.state in (TrialState.FAILED, TrialState.COMPLETED)}
    return sum(crashes.values()) - sum(last_exit[trial_id].crashed for trial_id in ended if trial_id in last_exit)


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def _best(view: ExperimentView) -> Standing | None:
    """The best trial's standing; None until a trial reports a finite value (a diverged one is no best), or while
    every one that did failed (``can_be_best``: they rank last)."""
    ranked = standings(view)
    return ranked[0] if ranked and ranked[0].best is not None and can_be_best(ranked[0].state) else None


def _state(experiment: ExperimentRecord, lock: Path | None, brief: bool = False) -> str:
    """Its stored status, and for a running one who runs it (``brief``: its pid only, for a line of a list); a pool's
    that waits for its files says so (``hermes.pool``), which a queued or interrupted status alone did not."""
    if experiment.error and experiment.error.startswith(WAITING_FOR_FILES):
        return f"{experiment.status.value} ({WAITING_FOR_FILES})"
    if experiment.status is not ExperimentStatus.RUNNING or lock is None:
        return experiment.status.value
    if experiment.owner is not None:  # a pool's
        if is_live(experiment, lock):
            return experiment.status.value
        if brief:
            return "running when its pool died"
        return "running when its pool ended without a word (killed?): starting its server (or pool) again continues it"
    if is_live(experiment, lock):
        who = holder(lock) or {}
        return f"running (pid {who.get('pid')})" if brief else f"running, by {describe(who)}"
    if brief:
        return "running when its runner died"
    return "running when its runner ended without a word (killed?): `hermes run` continues it"



def _trial_counts(counts: Counter[TrialState], live: bool) -> str:
    """Trials by state (``shown_state``): where no runner runs the experiment, those the log left on a GPU are
    interrupted (they go on from their checkpoints when it continues), counted first."""
    shown: Counter[str] = Counter()
    for state in sorted(TrialState, key=lambda state: shown_state(state, live) != INTERRUPTED):  # stable: enum order
        shown[shown_state(state, live)] += counts[state]
    return ", ".join(f"{count} {name}" for name, count in shown.items() if count)


def _present_gpus(events: Sequence[Event], decisions: Sequence[DecisionRecord]) -> list[str]:
    """The GPUs the cluster holds after the log, in order of arrival. A GPU a pool took back
    (``GpuReclaimed``) leaves as it leaves the core: a free one at once, one a trial holds when
    that trial suspends or exits; so another experiment's GPU is never listed as idle."""
    decided: dict[int, list[Decision]] = {}
    for record in decisions:
        decided.setdefault(record.event_seq, []).append(record.decision)
    node_gpus: dict[str, list[str]] = {}
    holding: dict[str, str] = {}  # trial -> the GPU it holds
    reclaimed: set[str] = set()  # GPUs that leave when their trial releases them

    def leave(*gone: str) -> None:
        for gpus in node_gpus.values():
            gpus[:] = [gpu for gpu in gpus if gpu not in gone]
        reclaimed.difference_update(gone)
        for trial_id in [trial_id for trial_id, gpu in holding.items() if gpu in gone]:
            del holding[trial_id]  # its run died with the GPU

    for seq, event in enumerate(events, 1):
        if isinstance(event, NodeAdded):
            node_gpus[event.node] = list(event.gpus)
        elif isinstance(event, GpuAdded):
            node_gpus.setdefault(event.node, []).append(event.gpu)
        elif isinstance(event, NodeRemoved):
            leave(*node_gpus.pop(event.node, []))
        elif isinstance(event, GpuRemoved):
            leave(event.gpu)
        elif isinstance(event, GpuReclaimed):
            if event.gpu in holding.values():
                reclaimed.add(event.gpu)
            else:
                leave(event.gpu)
        elif isinstance(event, (TrialSuspended, TrialExited)):
            released = holding.pop(event.trial_id, None)
            if released is not None and released in reclaimed:
                leave(released)
        for decision in decided.get(seq, ()):
            if isinstance(decision, (Start, Resume)):
                holding[decision.trial_id] = decision.gpu
    return [gpu for gpus in node_gpus.values() for gpu in gpus]


def format_status(status: Status) -> str:
    """A few labelled lines for people, then one line per GPU."""
    view = status.view
    experiment, target = view.experiment, view.target
    trials = _trial_counts(Counter(status.by_state), status.live)
    lines = [
        f"experiment  {experiment.name} (id {experiment.experiment_id}): {status.state}"
        + (f" ({status.ended_by})" if status.ended_by else ""),
        f"metric      {target.name} ({target.objective.mode})",
        f"elapsed     {format_duration(status.elapsed)}",
        f"trials      {len(view.trials)}" + (f": {trials}" if trials else ""),
    ]
    if experiment.error:  # why it failed as a whole: its spec could not run, or its searcher raised
        lines.insert(1, f"error       {printable(summarise_error(experiment.error))}")
    best = status.best
    if best is None:
        values = [value for value in (target.value(record.values) for record in view.metrics) if value is not None]
        silent = "none (no trial reported)" if experiment.status.is_final else "none yet (no trial has reported)"
        if any(math.isfinite(value) for value in values):  # failed trials' alone: another's would be the best
            none = "none" if experiment.status.is_final else "none yet"
            why = f"{none}: only failed trials reported a finite {target.name}, and a failed trial is no result"
        else:
            why = "none: every value reported is NaN or infinite" if values else silent
        lines.append(f"best        {why}")
    else:
        params = printable(", ".join(f"{name}={format_param(value)}" for name, value in best.params.items()))
        lines.append(
            f"best        trial {best.trial_id}: {target.name} {format_number(best.best)} at step {best.best_step}"
            + (f" ({params})" if params else "")
        )
    failed = [trial for trial in view.trials if trial.error]
    if failed:
        lines.append(f"errors      {_count(len(failed), 'trial')}")
        lines += _errors(failed, _last_steps(view))
    reruns = f", {_count(status.reruns, 'run')} again after a crash" if status.reruns else ""
    lines.append(f"switches    {_count(status.preemptions, 'preemption')}, {_count(status.migrations, 'migration')}"
                 f"{reruns}")
    busy = sum(run is not None for run in status.gpus.values())
    lines.append(f"GPUs        {busy} of {len(status.gpus)} busy")
    if status.gpus:
        rows = [[gpu, *_assignment(run, status.now)] for gpu, run in status.gpus.items()]
        lines += ["  " + line for line in format_table(["GPU", "trial", "for", "run"], rows, right=(2,)).splitlines()]
    return "\n".join(lines)


def _last_steps(view: ExperimentView) -> dict[str, int]:
    """The last step each trial reported, as ``hermes results`` counts its steps: not the store's step of a trial,
    which a crash sets back to its checkpoint's."""
    last: dict[str, int] = {}
    for record in view.metrics:
        last[record.trial_id] = max(record.step, last.get(record.trial_id, 0))
    return last


def _errors(failed: list[TrialRecord], last_steps: dict[str, int] | None = None) -> list[str]:
    """A line per error, its trials together (a thousand trials failing alike make one line), the first
    ERRORS_SHOWN errors, control characters escaped; ``hermes results`` lists every trial's. ``last_steps``: the
    last step each trial reported (``_last_steps``), where the store's step of a trial is not."""
    alike: dict[str, list[TrialRecord]] = {}
    for trial in failed:
        alike.setdefault(printable(summarise_error(trial.error or "")), []).append(trial)
    lines = []
    for error, trials in list(alike.items())[:ERRORS_SHOWN]:
        if len(trials) == 1:
            trial = trials[0]
            step = (last_steps or {}).get(trial.trial_id, trial.step)
            lines.append(f"  trial {trial.trial_id} ({trial.state.value} at step {step}): {error}")
            continue
        named = ", ".join(trial.trial_id for trial in trials[:3]) + (f" and {len(trials) - 3} more" if len(trials) > 3
                                                                      else "")
        states = "/".join(dict.fromkeys(trial.state.value for trial in trials))
        lines.append(f"  trials {named} ({states}): {error}")
    others = sum(len(trials) for trials in list(alike.values())[ERRORS_SHOWN:])
    if others:
        lines.append(f"  ... and {others} more with other errors: `hermes results --format csv` gives every trial's")
    return lines


def _assignment(run: Run | None, now: float) -> list[str]:
    if run is None:
        return ["idle", "", ""]
    how = "migrated" if run.migrated else "resumed" if run.resumed else "started"
    if run.yield_requested_at is not None:
        how += f", asked to yield {format_duration(now - run.yield_requested_at)} ago"
    return [run.trial_id, format_duration(now - run.started_at), how]


def format_experiments(store: ExperimentStore, lock: Path | None = None) -> str:
    """One line per experiment of the store, oldest first: what ``hermes status`` says of each in a few cells."""
    rows = []
    for experiment in store.experiments():
        view = ExperimentView.load(store, experiment)
        counts = Counter(trial.state for trial in view.trials)
        best = _best(view)
        rows.append([
            str(experiment.experiment_id), experiment.name, experiment.owner or "", _state(experiment, lock, brief=True),
            _trial_counts(counts, is_live(experiment, lock)) or "none yet",
            "" if best is None else f"{view.target.name} {format_number(best.best)} (trial {best.trial_id})",
        ])
    if not rows:
        return "no experiment yet"
    return format_table(["id", "name", "owner", "status", "trials", "best"], rows, right=(0,))
