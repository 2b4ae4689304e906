"""The one engine loop shared by the simulator and the real executors.

events from the executor (and the inbox) -> the core -> listeners -> decisions -> the executor.
Real runs and simulations differ only in the executor and its clock; the loop and the core are
the same code.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.core.scheduler import Scheduler
from hermes.core.trial import Trial
from hermes.errors import HermesError
from hermes.execution.contract import Executor

DecisionListener = Callable[[Event, list[Decision]], None]
"""Called with every event and the decisions the core made about it, before the executor acts.
A listener may also have ``flush()``, called before the executor acts on what it was told."""


class Submitter(Protocol):
    """A source of work asked between batches: a search's next turn of submissions (``ExperimentSession``)."""

    @property
    def asks_due(self) -> bool: ...

    def submissions(self, now: float) -> list[Event]: ...


class Engine:
    """Feeds one core from one executor and from an inbox that any thread may post to.

    Order: the events the executor reported together, in order; then whatever was posted, in
    order. What is posted while an event goes through the listeners (a listener's submissions) is
    handled right after that event, before the rest: a replay of the log must find a searcher's
    submissions where it asked for them. All of them go through the core and the listeners before the
    executor acts on any (so that the store commits them at once); then the executor is asked again.
    A post wakes a blocked executor, so an event from another thread (a submission from an HTTP
    request, say) is handled at once.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        listeners: Iterable[DecisionListener] = (),
        *,
        waits_for_posts: bool = False,
        submitter: Submitter | None = None,
    ) -> None:
        """``waits_for_posts``: when the executor has nothing left to report, wait for a post
        (a host that submits more work later) instead of failing. ``submitter``: asked for its next turn
        between batches, when the executor has nothing new, so that a search of many trials goes in turn by
        turn, its trials starting and an interrupt taken between turns."""
        self.submitter = submitter
        self.scheduler = scheduler
        self.executor = executor
        self.listeners = list(listeners)
        # A listener with a ``flush`` method (the store recorder) may keep what it is told and write
        # it at once when asked: before the executor acts on any of it.
        self._flushes = [flush for flush in (getattr(listener, "flush", None) for listener in self.listeners) if flush]
        self.waits_for_posts = waits_for_posts
        # Only an executor that takes ``trial_ended`` is told: the simulator's loop pays nothing for it.
        self._tells_ended = type(executor).trial_ended is not Executor.trial_ended
        self._inbox: deque[Event] = deque()
        self._posted = threading.Condition()
        self._interrupt: BaseException | None = None  # what ``run`` raises at its next point between batches

    def interrupt(self, exception: BaseException) -> None:
        """Make ``run`` raise ``exception`` between two batches, never within one: inside a batch the
        store may be in the middle of a transaction, and an exception there leaves SQLite's write lock
        with a connection nobody closes, so the next write waits out the busy timeout. Safe from a
        signal handler: it sets an attribute and wakes the executor."""
        self._interrupt = exception
        self.executor.wake()

    def take_interrupt(self) -> BaseException | None:
        """The interrupt ``run`` had not raised when the experiment ended (it came after the last batch), taken
        from the engine: its caller raises it once it has written that end."""
        pending, self._interrupt = self._interrupt, None
        return pending

    def post(self, event: Event) -> None:
        """Queue an event that does not come from the executor. Safe from any thread."""
        with self._posted:
            self._inbox.append(event)
            self._posted.notify_all()
        self.executor.wake()

    def run(self, first: Iterable[Event] = ()) -> None:
        """Feed events to the core until the experiment is finished.

        ``first`` are handled before anything else, even by a finished core (a restarted runner's
        NodeRemoved for the nodes of the run that died, a reopening of submissions). Then the executor
        is told of the trials that ended before (``Executor.trial_ended``): a rerun submits every trial
        of the log, and a reopening in ``first`` has revived those it runs again."""
        self._handle(list(first), everything=True)
        for trial in self.scheduler.trials.values() if self._tells_ended else ():
            if runs_no_more(trial):
                self.executor.trial_ended(trial.trial_id)
        while not self.scheduler.finished:
            self._handle(self._next_batch())

    def _handle(self, events: list[Event], *, everything: bool = False) -> None:
        """Events through the core and the listeners, each followed by what was posted meanwhile (until
        the core is finished, unless ``everything``); then the listeners that keep what they saw
        flush it (the store: one commit for the lot); then the executor acts on each, in order."""
        pending = deque(events)
        handled: list[tuple[Event, list[Decision]]] = []
        while pending and (everything or not self.scheduler.finished):
            event = pending.popleft()
            decisions = self.scheduler.handle(event)
            for listener in self.listeners:
                listener(event, decisions)
            handled.append((event, decisions))
            if not self.scheduler.finished:
                pending.extendleft(reversed(self._take_posts()))
        for flush in self._flushes:
            flush()
        for event, decisions in handled:
            for decision in decisions:
                self.executor.apply(decision, event.at)
            for trial_id in ended_trials(self.scheduler, event, decisions) if self._tells_ended else ():
                self.executor.trial_ended(trial_id)
            self.executor.settled(event)

    def _take_posts(self) -> list[Event]:
        if not self._inbox:  # read without the lock: a post that lands just after is taken at the next look
            return []
        with self._posted:
            posts = list(self._inbox)
            self._inbox.clear()
        return posts

    def _next_batch(self) -> list[Event]:
        while True:
            interrupt, self._interrupt = self._interrupt, None
            if interrupt is not None:  # between batches: what the executor reported since stays with it
                raise interrupt
            submitter = self.submitter if self.submitter is not None and self.submitter.asks_due else None
            if submitter is not None:  # its next turn: what the executor has is taken without waiting for more
                self.executor.wake()
            events = self.executor.next_events()
            if submitter is not None and not events and not self._inbox:
                events = submitter.submissions(self.executor.now())
            if events and not self._inbox:  # the usual case, without the lock (as in _take_posts)
                return events
            with self._posted:
                events.extend(self._inbox)
                self._inbox.clear()
                if events:
                    return events
                if not self.executor.idle():
                    continue  # woken, with nothing new yet
                if not self.waits_for_posts:
                    raise HermesError("the executor has nothing left to report but the experiment is unfinished")
                self._posted.wait_for(lambda: self._inbox)


def runs_no_more(trial: Trial) -> bool:
    """Whether the core will not run ``trial`` again (``Executor.trial_ended``): it ended, or was told to stop."""
    return trial.state.is_terminal or trial.stop_requested


def ended_trials(scheduler: Scheduler, event: Event, decisions: list[Decision]) -> list[str]:
    """The trials that ``event`` and its ``decisions`` name and the core will not run again. No trial ends
    unnamed: one told to stop and then lost with its node was named by its Stop."""
    named = [decision.trial_id for decision in decisions]
    trial_id = getattr(event, "trial_id", None)
    if trial_id is not None:
        named.append(trial_id)
    return [trial_id for trial_id in dict.fromkeys(named) if runs_no_more(scheduler.trials[trial_id])]
