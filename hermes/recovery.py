"""Continuing an experiment from its store after its runner died, or was stopped.

The event log is the source of truth. Replaying it into a fresh core reaches the state the old
core had (the core is deterministic); the sampler is replayed alongside, so it proposes what it
proposed before. The trials the old run believed to be running died with it: the new run first
tells the core that the old nodes are gone, which falls those trials back to their last
checkpoints, and then announces its own resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hermes.core.decisions import Decision
from hermes.core.events import Event, NodeRemoved
from hermes.core.scheduler import Scheduler
from hermes.store.base import ExperimentStore


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
    history = store.events(experiment_id)
    for event in history:
        follow(event, scheduler.handle(event))
    now = history[-1].at if history else 0.0
    return Recovered(len(history), now, tuple(NodeRemoved(now, node) for node in scheduler.cluster.nodes))
