"""The one engine loop shared by the simulator and the real executors.

events from the executor -> the core -> decisions -> the executor. Real runs and simulations
differ only in the executor (and its clock); the loop and the core are the same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Callable, Iterable

from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.core.scheduler import Scheduler
from hermes.errors import HermesError

DecisionListener = Callable[[Event, list[Decision]], None]


class Executor(ABC):
    """Carries out decisions and reports what happened; owns the clock."""

    @abstractmethod
    def apply(self, decision: Decision, at: float) -> None:
        """Start carrying out ``decision``, made at time ``at``; outcomes come back as events."""

    @abstractmethod
    def next_events(self) -> list[Event]:
        """Wait for (or, simulated, jump to) the next events; an empty list means nothing will ever come."""

    def settled(self, event: Event) -> None:
        """All decisions about ``event`` have been applied (a blocked trial may now be told to go on)."""


class Engine:
    def __init__(self, scheduler: Scheduler, executor: Executor, listeners: Iterable[DecisionListener] = ()) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.listeners = list(listeners)
        self._queue: deque[Event] = deque()

    def post(self, event: Event) -> None:
        """Queue an event that does not come from the executor (a new trial from the sampler, say)."""
        self._queue.append(event)

    def run(self, initial: Iterable[Event] = ()) -> None:
        """Feed events to the core until the experiment is finished."""
        queue = self._queue
        queue.extend(initial)
        scheduler, executor, listeners = self.scheduler, self.executor, self.listeners
        while not scheduler.finished:
            if not queue:
                queue.extend(executor.next_events())
                if not queue:
                    raise HermesError("the executor has nothing left to report but the experiment is unfinished")
            event = queue.popleft()
            decisions = scheduler.handle(event)
            for listener in listeners:
                listener(event, decisions)
            for decision in decisions:
                executor.apply(decision, event.at)
            executor.settled(event)
