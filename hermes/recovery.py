"""Continuing an experiment from its store after its runner died, or was stopped.

The log is the source of truth: every event, and the decisions the core made about it. Replaying
both into a fresh core reaches the state the old core had, even where this core would decide
otherwise (a log that an older version of Hermes wrote, whose policy has changed since); the
sampler is replayed alongside, so it proposes what it proposed before. The trials the old run
believed to be running died with it: the new run first tells the core that the old nodes are gone, all of
them before the core decides anything (``ExperimentSession.lose_old_nodes``), which falls those trials back
to their last checkpoints, and then announces its own resources.

Everything of the experiment that the store holds is read, and so checked, before anything is replayed: a
damaged record (``hermes.store.base.DamagedRecord``: JSON cut short, a metric that is no number) stops the
run with the record named, before a trial runs or anything is written, rather than a traceback now or at
the end of a run whose results could then not be read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from hermes.core.decisions import Decision
from hermes.core.events import Event, NodeRemoved
from hermes.core.scheduler import Scheduler
from hermes.errors import HermesError
from hermes.store.base import DamagedRecord, ExperimentStore


@dataclass(frozen=True, slots=True)
class Recovered:
    events: int  # events replayed
    now: float  # the experiment's clock when its last event happened
    lost_nodes: tuple[NodeRemoved, ...]  # to handle before anything the new executor reports


def replay(
    store: ExperimentStore,
    experiment_id: int,
    scheduler: Scheduler,
    follow: Callable[[Event, list[Decision]], None],
) -> Recovered:
    """Feed the stored log to ``scheduler`` and ``follow`` (the session's bookkeeping), in order."""
    try:
        history = store.events(experiment_id)
        decisions = store.decisions(experiment_id)
        store.trials(experiment_id)  # not replayed, but read at the end of the run (its results) and by reports
        store.metrics(experiment_id)
    except DamagedRecord as error:
        raise DamagedRecord(f"{error}; the experiment cannot continue from it, and was left as it was",
                            error.record) from None
    decided: dict[int, list[Decision]] = defaultdict(list)
    for record in decisions:
        decided[record.event_seq].append(record.decision)
    for seq, event in enumerate(history, 1):
        try:
            scheduler.replay(event, decided[seq])
        except HermesError as error:
            raise HermesError(f"the experiment's log does not replay: event {seq} of {len(history)} "
                              f"({type(event).__name__}): {error}") from error
        follow(event, decided[seq])
    now = history[-1].at if history else 0.0
    return Recovered(len(history), now, tuple(NodeRemoved(now, node) for node in scheduler.cluster.nodes))
