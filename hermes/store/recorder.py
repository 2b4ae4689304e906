"""The persistence listener: every event, with what it caused, is in the store before anything acts on it."""

from __future__ import annotations

from hermes.core.decisions import Decision
from hermes.core.events import Event, GpuRemoved, NodeAdded, NodeRemoved
from hermes.core.scheduler import Scheduler
from hermes.core.trial import Trial
from hermes.faults import crash_point
from hermes.store.base import ExperimentStore, TrialRecord


class StoreRecorder:
    """An engine listener that keeps each event, its decisions, its report's metrics and the
    records of the trials it changed, and writes what it kept in one transaction when the engine
    flushes it, before the executor acts (``ExperimentStore.record_events``): one commit for all
    the events the engine handled together.

    The executor acts only after the flush, so a crash at any moment leaves the log either with
    an event and all it caused, or without the event, which the restarted trial then reports again."""

    def __init__(self, store: ExperimentStore, experiment_id: int, scheduler: Scheduler) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.scheduler = scheduler
        self._kept: list[tuple[Event, list[Decision], list[TrialRecord]]] = []

    def __call__(self, event: Event, decisions: list[Decision]) -> None:
        self._kept.append((event, decisions, self.changed_records(event, decisions)))

    def flush(self) -> None:
        kept, self._kept = self._kept, []
        if kept:
            self.store.record_events(self.experiment_id, kept)
            crash_point("recorded")  # committed, and nothing acted on it yet

    def changed_records(self, event: Event, decisions: list[Decision]) -> list[TrialRecord]:
        """The records of the trials ``event`` and its decisions changed, as the core has them now."""
        changed = {decision.trial_id for decision in decisions}
        trial_id = getattr(event, "trial_id", None)
        if trial_id is not None:
            changed.add(trial_id)
        if isinstance(event, (NodeAdded, NodeRemoved)):
            changed.update(t.trial_id for t in self.scheduler.trials.values() if not t.state.is_terminal)
        if isinstance(event, (NodeRemoved, GpuRemoved)):  # the runs lost with it: stopped, if asked to stop
            changed.update(t.trial_id for t in self.scheduler.trials.values() if t.idle_since == event.at)
        return [trial_record(self.scheduler.trials[changed_id], event.at) for changed_id in sorted(changed)]


def trial_record(trial: Trial, now: float) -> TrialRecord:
    return TrialRecord(
        trial_id=trial.trial_id,
        params=dict(trial.params),
        state=trial.state,
        budget=trial.budget,
        submitted_at=trial.submitted_at,
        step=trial.step,
        checkpoint_step=trial.checkpoint_step,
        gpu=trial.gpu,
        error=trial.error,
        started_at=trial.started_at,
        ended_at=now if trial.state.is_terminal else None,
    )
