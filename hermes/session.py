"""One experiment, from its spec to its end: what `hermes run` runs, and what a server hosts many of.

The session wires the shells around the core: the sampler proposes trials, the engine chosen by
``spec.engine`` runs them, the engine loop feeds what happens to the scheduling core, and the
store recorder writes every event, with the decisions it caused, before any decision is carried
out. A session started on a store that already holds the experiment continues it
(``hermes.recovery``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hermes.core.decisions import Decision
from hermes.core.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    SubmissionsClosed,
    TrialExited,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.errors import HermesError
from hermes.execution.contract import Executor
from hermes.execution.engine import Engine
from hermes.execution.registry import make_engine
from hermes.experiment import ExperimentSpec, Sampler, make_sampler
from hermes.policies import make_policy, make_stopper
from hermes.recovery import replay
from hermes.store.base import ExperimentStatus, ExperimentStore
from hermes.store.recorder import StoreRecorder
from hermes.store.sql import SqlStore

STORE_FILE = "hermes.db"
Listener = Callable[[Event, list[Decision]], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    experiment_id: int
    resumed: bool  # continued an experiment found in the store
    status: ExperimentStatus


class ExperimentSession:
    """Runs ``spec`` to the end, or continues it from its store.

    ``store``: where the experiment is kept (default: SQLite in the spec's storage directory).
    ``listeners`` see every event and its decisions after the store has them.
    """

    def __init__(
        self, spec: ExperimentSpec, *, store: ExperimentStore | None = None, listeners: list[Listener] | None = None
    ) -> None:
        self.spec = spec
        self.storage = spec.storage_dir
        # Before the store: a spec this machine cannot run (a GPU it lacks) must leave no experiment
        # behind, or the corrected spec would clash with it under the same name.
        self.engine = make_engine(spec)
        policy = make_policy(spec.policy.name, period=spec.policy.period, **spec.policy.params)
        policy.configure(self.engine.profile())
        stopper = spec.policy.stopper
        self.objective = Objective(spec.metric.mode)
        self.scheduler = Scheduler(
            policy, objective=self.objective, stopper=make_stopper(stopper.name, **stopper.params) if stopper else None
        )
        self.sampler: Sampler = make_sampler(spec)
        self.store = store or SqlStore(f"sqlite:///{self.storage / STORE_FILE}")
        self.experiment_id = self.store.create_or_open_experiment(spec.name, spec.model_dump(mode="json"))
        self.listeners = listeners or []
        self.executor: Executor | None = None
        self._loop: Engine | None = None
        self._closed = False  # SubmissionsClosed is in the log
        self._told: set[str] = set()  # trials whose result the sampler has been told
        self._width = len(str(max((spec.search.trials or 1) - 1, 1)))

    # ------------------------------------------------------------------ the run
    def run(self) -> Outcome:
        recovered = replay(
            self.store, self.experiment_id, self.scheduler, lambda e, ds: self._follow(e, ds, replaying=True)
        )
        executor = self.executor = self.engine.executor(self.storage / self.spec.name, recovered.now)
        try:
            for trial in self.scheduler.trials.values():
                executor.submit(  # the trials it ran fall back to their checkpoints, so the core knows that step
                    trial.trial_id,
                    self.engine.work(trial.params),
                    at=trial.submitted_at,
                    reported_step=trial.checkpoint_step,
                )
            if self.scheduler.finished:
                self.store.set_status(self.experiment_id, ExperimentStatus.FINISHED)
                return Outcome(self.experiment_id, True, ExperimentStatus.FINISHED)
            loop = self._loop = Engine(
                self.scheduler, executor, [StoreRecorder(self.store, self.experiment_id, self.scheduler), self._after, *self.listeners]
            )
            for submission in self._submissions(recovered.now):
                loop.post(submission)
            self.store.set_status(self.experiment_id, ExperimentStatus.RUNNING)
            try:
                loop.run(first=recovered.lost_nodes)
            except KeyboardInterrupt:
                self.store.set_status(self.experiment_id, ExperimentStatus.INTERRUPTED)
                raise
            except BaseException:
                self.store.set_status(self.experiment_id, ExperimentStatus.FAILED)
                raise
        finally:
            executor.close()
        self.store.set_status(self.experiment_id, ExperimentStatus.FINISHED)
        return Outcome(self.experiment_id, recovered.events > 0, ExperimentStatus.FINISHED)

    # ------------------------------------------------------------------ trials from the sampler
    def _submissions(self, now: float) -> list[Event]:
        """New trials while fewer than the sampler's concurrency are unfinished; then close submissions."""
        events: list[Event] = []
        if self._closed:
            return events
        unfinished = sum(not t.state.is_terminal for t in self.scheduler.trials.values())
        while unfinished < self._concurrency():
            config = self.sampler.ask()
            if config is None:
                events.append(SubmissionsClosed(now))
                self._closed = True
                break
            trial_id = f"{config.index:0{self._width}d}"
            events.append(self.executor.submit(trial_id, self.engine.work(config.params), at=now))
            unfinished += 1
        return events

    def _concurrency(self) -> int:
        """Trials in flight: all of them for samplers that chose up front; a few per slot for TPE,
        which learns from finished trials."""
        if self.spec.search.sampler != "tpe":
            return self.spec.search.trials or 1 << 30
        return 4 * self.engine.capacity()

    def _after(self, event: Event, decisions: list[Decision]) -> None:
        """After the store has the event: tell the sampler, and submit more trials when some ended."""
        self._follow(event, decisions, replaying=False)
        ended = isinstance(event, TrialExited) or any(
            self.scheduler.trials[d.trial_id].state.is_terminal for d in decisions
        )
        if ended:
            for submission in self._submissions(event.at):
                self._loop.post(submission)

    def _follow(self, event: Event, decisions: list[Decision], *, replaying: bool) -> None:
        """Keep the sampler in step with the log: one ask per submission, one tell per finished trial."""
        if isinstance(event, TrialSubmitted) and replaying:
            config = self.sampler.ask()
            if config is None or config.params != dict(event.params):
                raise HermesError(
                    f"the store's trial {event.trial_id} does not match what the sampler proposes now; "
                    "was the spec or the code of the sampler changed?"
                )
        elif isinstance(event, SubmissionsClosed):
            self._closed = True
        if isinstance(event, (NodeAdded, NodeRemoved, GpuAdded, GpuRemoved)):
            touched = set(self.scheduler.trials)  # a lost trial told to stop ends without a decision
        else:
            touched = {decision.trial_id for decision in decisions}
            touched.update([event.trial_id] if hasattr(event, "trial_id") else [])
        for trial in (self.scheduler.trials[trial_id] for trial_id in sorted(touched)):
            if trial.state.is_terminal and trial.trial_id not in self._told:
                self._told.add(trial.trial_id)
                best = trial.best_score
                value = None if best is None else self.objective.value(best)
                self.sampler.tell(int(trial.trial_id), value)
