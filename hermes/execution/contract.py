"""The execution contract: what every engine (simulator, local processes, Ray) promises the core.

An executor carries out the core's decisions on real or simulated GPUs and reports what happened
as events. The engine loop (``hermes.execution.engine``) is its only caller, from one thread,
except for ``wake``. The rules below are what the scheduling core relies on; the conformance suite
(``hermes.testing.executor_conformance``) checks them on every implementation, and
``ContractMonitor`` checks any event sequence against them.

Which events answer each decision (``ANSWERS``):

============  ==========================================================================
decision      the trial's next events
============  ==========================================================================
Start         TrialReported*, then TrialExited (succeeded: it trained its whole budget;
              failed: it crashed, could not launch or was killed, with ``error``). After a
              ``crashed`` one, the core may Resume the trial from its checkpoint, as after a
              lost GPU: the executor counts the steps past it as not reported
Resume        as Start; the trial goes on from its checkpoint (or from memory, parked on
              the same GPU) and never re-reports a step the core already has
Suspend       TrialReported* (the step in progress), then TrialSuspended at the next step
              boundary; or TrialExited if the trial ended first (its last step, a crash)
Stop          running or suspending: TrialReported*, then TrialExited (error "stopped");
              or TrialSuspended if it had already saved its checkpoint. Suspended or
              parked (the core holds no run for it): no event at all, ever
============  ==========================================================================

Further rules:

- A report is answered (the trial trains on) only after ``settled`` was called with its event,
  so every decision about it is applied first: a Suspend or Stop always lands on that report.
- Catch-up: a trial that fell back to an older checkpoint re-trains steps the core already has;
  the executor answers those reports itself and never emits them. ``submit``'s ``reported_step``
  tells it where the core stands for a trial that ran before. A trial that is not movable keeps no
  checkpoint (its state is its process): started again from its beginning, it catches up every step
  it reported (``Trial.catch_up_step``), although the core falls back to its last suspension.
- ``TrialReported`` carries every metric of the report in ``metrics``; ``value`` is the
  objective among them. There is no side channel.
- Cluster membership comes out of ``next_events`` like any other event: the first call returns
  ``NodeAdded`` for the resources the executor has; later ``NodeAdded``/``GpuAdded`` when some
  join, ``GpuRemoved``/``NodeRemoved`` when some are lost. After a removal, no event is ever
  emitted about the runs that were there (the core falls them back to their checkpoints), and
  the executor makes sure no process of theirs survives.
- ``next_events`` blocks until something happens, or returns promptly (possibly with ``[]``)
  once ``wake`` was called, even if ``wake`` came first. ``idle()`` tells whether anything can
  still come: when it is true, ``next_events`` returns ``[]`` at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError

Work = TypeVar("Work")
"""What an engine runs for a trial: a ``TrialLaunch`` for real engines, a recorded curve for the simulator."""


class Executor(ABC, Generic[Work]):
    """Carries out decisions and reports what happened; owns the clock. See the module docstring."""

    profile: ExecutionProfile
    """What a switch costs on this engine, for ``SchedulingPolicy.configure``."""

    @abstractmethod
    def submit(self, trial_id: str, work: Work, *, at: float | None = None, reported_step: int = 0) -> TrialSubmitted:
        """Register what to run for ``trial_id`` and return the event that tells the core about it.

        ``at``: the submission's time (default ``now()``); a restarted runner passes the original.
        ``reported_step``: the last step the core already knows of a trial that ran before: later
        reports up to it are catch-up (see the module docstring). Submitting an id twice raises.
        """

    @abstractmethod
    def apply(self, decision: Decision, at: float) -> None:
        """Start carrying out ``decision``, made at ``at``; its outcome comes back as events (``ANSWERS``)."""

    def settled(self, event: Event) -> None:
        """Every decision about ``event`` has been applied: a trial waiting on this report may go on."""

    def trial_ended(self, trial_id: str) -> None:
        """The core will not run ``trial_id`` again, unless a later Start or Resume says so: it ended, or was told to
        Stop. Told once the decisions of the event that ended it were applied (perhaps more than once), and as a run
        begins for each trial of the log that ended before (a rerun submits them all), after a larger budget revived
        those it runs again. For an executor that asks for resources by the trials still to run (Ray's autoscaler)."""

    @abstractmethod
    def next_events(self) -> list[Event]:
        """Wait for the next events, in the order they happened; see the module docstring for ``[]``."""

    @abstractmethod
    def idle(self) -> bool:
        """Whether nothing can come any more: no run can report, no membership change is pending."""

    @abstractmethod
    def now(self) -> float:
        """The engine's clock in seconds: the only time the core ever sees."""

    @abstractmethod
    def wake(self) -> None:
        """Make a blocked (or the next) ``next_events`` return promptly. Safe from any thread."""

    def close(self) -> None:
        """Release everything: kill what runs, drop pending events. Idempotent."""

    def __enter__(self) -> Executor[Work]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Phase(str, Enum):
    """Where a trial stands as the executor sees it (not the core's TrialState)."""

    IDLE = "idle"  # submitted, or its run ended: no event may come
    RUNNING = "running"  # after Start or Resume
    SUSPENDING = "suspending"  # after Suspend while running
    STOPPING = "stopping"  # after Stop while running or suspending
    PARKED = "parked"  # TrialSuspended: its state is saved; no event may come
    ENDED = "ended"  # TrialExited, or stopped while idle or parked


ANSWERS: dict[Phase, frozenset[type]] = {
    Phase.IDLE: frozenset(),
    Phase.RUNNING: frozenset({TrialReported, TrialExited}),
    Phase.SUSPENDING: frozenset({TrialReported, TrialSuspended, TrialExited}),
    Phase.STOPPING: frozenset({TrialReported, TrialSuspended, TrialExited}),
    Phase.PARKED: frozenset(),
    Phase.ENDED: frozenset(),
}
"""The trial events an executor may emit in each phase."""


class ContractViolation(HermesError):
    """An executor emitted an event the contract does not allow, or was given an impossible decision."""


@dataclass(slots=True)
class _Watched:
    phase: Phase = Phase.IDLE
    step: int = 0  # the last step the core has
    checkpoint: int = 0  # the last step known to be checkpointed
    gpu: str | None = None


class ContractMonitor:
    """Checks an executor's event stream against the contract, as an engine listener.

    Fed every event with the decisions the core made about it (``Engine`` listeners get exactly
    that), it raises ``ContractViolation`` at the first event the contract forbids: a report of a
    parked trial, a step reported twice, an event after a stop of a parked trial, an event about a
    run whose GPU was removed, a Suspended that answers no Suspend.
    """

    def __init__(self) -> None:
        self.trials: dict[str, _Watched] = {}
        self.gpus: dict[str, str] = {}  # GPU -> node
        self.history: list[tuple[str, str]] = []  # (trial, event or decision name), for messages

    def __call__(self, event: Event, decisions: list[Decision]) -> None:
        self.observe(event)
        for decision in decisions:
            self.decided(decision)

    def observe(self, event: Event) -> None:
        if isinstance(event, TrialSubmitted):
            if event.trial_id in self.trials:
                raise ContractViolation(f"trial {event.trial_id} submitted twice")
            self.trials[event.trial_id] = _Watched()
        elif isinstance(event, (TrialReported, TrialSuspended, TrialExited)):
            self._trial_event(event)
        elif isinstance(event, NodeAdded):
            self.gpus.update(dict.fromkeys(event.gpus, event.node))
        elif isinstance(event, GpuAdded):
            self.gpus[event.gpu] = event.node
        elif isinstance(event, (GpuRemoved, NodeRemoved)):
            lost = {event.gpu} if isinstance(event, GpuRemoved) else {g for g, n in self.gpus.items() if n == event.node}
            for gpu in lost:
                self.gpus.pop(gpu, None)
            for watched in self.trials.values():
                if watched.gpu in lost and watched.phase in (Phase.RUNNING, Phase.SUSPENDING, Phase.STOPPING):
                    watched.phase = Phase.ENDED if watched.phase is Phase.STOPPING else Phase.IDLE
                    watched.step, watched.gpu = watched.checkpoint, None

    def _trial_event(self, event: TrialReported | TrialSuspended | TrialExited) -> None:
        watched = self._watched(event.trial_id)
        kind = type(event)
        self.history.append((event.trial_id, kind.__name__))
        if kind not in ANSWERS[watched.phase]:
            raise ContractViolation(
                f"{kind.__name__} of trial {event.trial_id} while {watched.phase.value}: the contract allows "
                f"{', '.join(sorted(k.__name__ for k in ANSWERS[watched.phase])) or 'no event'} there"
            )
        if isinstance(event, TrialReported):
            if event.step <= watched.step:
                raise ContractViolation(
                    f"trial {event.trial_id} reported step {event.step} after step {watched.step}: catch-up "
                    "reports are the executor's to answer"
                )
            watched.step = event.step
            if event.checkpointed:
                watched.checkpoint = event.step
        elif isinstance(event, TrialSuspended):
            watched.step = watched.checkpoint = event.step
            watched.phase = Phase.ENDED if watched.phase is Phase.STOPPING else Phase.PARKED
            watched.gpu = None
        elif event.crashed and watched.phase is not Phase.STOPPING:  # the core may run it again
            watched.phase, watched.gpu, watched.step = Phase.IDLE, None, watched.checkpoint
        else:
            watched.phase, watched.gpu = Phase.ENDED, None

    def decided(self, decision: Decision) -> None:
        watched = self._watched(decision.trial_id)
        self.history.append((decision.trial_id, type(decision).__name__))
        if isinstance(decision, (Start, Resume)):
            if watched.phase not in (Phase.IDLE, Phase.PARKED):
                raise ContractViolation(f"{type(decision).__name__} of trial {decision.trial_id} while {watched.phase.value}")
            if isinstance(decision, Start):
                watched.step = watched.checkpoint = 0
            watched.phase, watched.gpu = Phase.RUNNING, decision.gpu
        elif isinstance(decision, Suspend):
            if watched.phase is not Phase.RUNNING:
                raise ContractViolation(f"Suspend of trial {decision.trial_id} while {watched.phase.value}")
            watched.phase = Phase.SUSPENDING
        elif isinstance(decision, Stop):
            running = watched.phase in (Phase.RUNNING, Phase.SUSPENDING, Phase.STOPPING)
            watched.phase = Phase.STOPPING if running else Phase.ENDED

    def _watched(self, trial_id: str) -> _Watched:
        try:
            return self.trials[trial_id]
        except KeyError:
            raise ContractViolation(f"event or decision about trial {trial_id}, which was never submitted") from None
