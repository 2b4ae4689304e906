"""`hermes run`: one experiment on this machine, with nothing to set up.

The runner wires the shells around the core: the sampler proposes trials, the local executor
runs them, the engine loop feeds what happens to the scheduling core, and every event is written
to the store, with the decisions it caused, before any decision is carried out. The store's event
log is the source of truth: a restarted runner replays it into a fresh core (the core is
deterministic, so it reaches the same state), tells the core that the trials it believed running
were lost with the old runner, and carries on; they resume from their last checkpoints.
"""

from __future__ import annotations

import shlex
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
    TrialReported,
    TrialSubmitted,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.trial import Trial
from hermes.execution.engine import Engine
from hermes.errors import HermesError
from hermes.experiment import ExperimentSpec, Sampler, make_sampler
from hermes.experiment.spec import ResourcesSpec
from hermes.local.executor import LocalExecutor
from hermes.local.launch import TrialLaunch
from hermes.local.resources import Slot, discover_gpus, local_slots
from hermes.policies import make_policy, make_stopper
from hermes.store.base import ExperimentStatus, TrialRecord
from hermes.store.sql import SqlStore

STORE_FILE = "hermes.db"
Listener = Callable[[Event, list[Decision]], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    experiment_id: int
    resumed: bool  # continued an experiment found in the store
    status: ExperimentStatus


class ExperimentRunner:
    """Runs ``spec`` to the end, or continues it from its store."""

    def __init__(self, spec: ExperimentSpec, *, listeners: list[Listener] | None = None) -> None:
        if spec.engine != "local":
            raise HermesError(f"engine: {spec.engine!r} is not available in this version; use 'local'")
        self.spec = spec
        self.storage = spec.storage_dir
        policy = spec.policy
        params = dict(policy.params)
        if policy.name == "hermes":  # its switch budget needs what a switch costs here
            params.setdefault("switch_cost", switch_cost(spec))
        self.scheduler = Scheduler(
            make_policy(policy.name, period=policy.period, **params),
            objective=Objective(spec.metric.mode),
            stopper=make_stopper(policy.stopper.name, **policy.stopper.params) if policy.stopper else None,
        )
        self.sampler: Sampler = make_sampler(spec)
        # Before the store: a spec this machine cannot run (a GPU it lacks) must leave no experiment
        # behind, or the corrected spec would clash with it under the same name.
        self.slots = slots_for(spec.resources)
        self.store = SqlStore(f"sqlite:///{self.storage / STORE_FILE}")
        self.experiment_id = self.store.create_or_open_experiment(spec.name, spec.model_dump(mode="json"))
        self.listeners = listeners or []
        self.executor: LocalExecutor | None = None
        self._engine: Engine | None = None
        self._closed = False  # SubmissionsClosed is in the log
        self._told: set[str] = set()  # trials whose result the sampler has been told
        self._width = len(str(max((spec.search.trials or 1) - 1, 1)))

    # ------------------------------------------------------------------ the run
    def run(self) -> Outcome:
        history = self.store.events(self.experiment_id)
        for event in history:  # rebuild the core, the sampler and the launches from the log
            self._follow(event, self.scheduler.handle(event), replaying=True)
        if history:  # the old runner may have died before writing the trial records of its last event
            decisions = self.store.decisions(self.experiment_id)
            self._update_trials(history[-1], [d.decision for d in decisions if d.event_seq == len(history)])
        now = history[-1].at if history else 0.0
        executor = self.executor = LocalExecutor(
            self.storage / self.spec.name,
            slots=self.slots,
            metric=self.spec.metric.name,
            checkpoint_every=self.spec.storage.checkpoint_every,
            # Unmodified scripts may print rarely: period ticks let the core preempt them between
            # reports. Cooperative trials yield at reports anyway, as in the simulator.
            period=self.spec.policy.period if self.spec.trial.metrics_regex else None,
            clock_offset=now,
            cwd=self.spec.workdir,
        )
        for trial in self.scheduler.trials.values():
            executor.submit(  # the trials it ran fall back to their checkpoints, so the core knows that step
                trial.trial_id, self._launch(trial.params), at=trial.submitted_at, reported_step=trial.checkpoint_step
            )
        if self.scheduler.finished:
            self.store.set_status(self.experiment_id, ExperimentStatus.FINISHED)
            executor.shutdown()
            return Outcome(self.experiment_id, True, ExperimentStatus.FINISHED)

        initial: list[Event] = [NodeRemoved(now, node) for node in self.scheduler.cluster.nodes]
        initial += [NodeAdded(now, node, gpus) for node, gpus in executor.resources.items()]
        self._engine = Engine(self.scheduler, executor, [self._record, *self.listeners])
        self.store.set_status(self.experiment_id, ExperimentStatus.RUNNING)
        try:
            self._engine.run(initial + self._submissions(now))
        except KeyboardInterrupt:
            self.store.set_status(self.experiment_id, ExperimentStatus.INTERRUPTED)
            raise
        except BaseException:
            self.store.set_status(self.experiment_id, ExperimentStatus.FAILED)
            raise
        finally:
            executor.shutdown()
        self.store.set_status(self.experiment_id, ExperimentStatus.FINISHED)
        return Outcome(self.experiment_id, bool(history), ExperimentStatus.FINISHED)

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
            events.append(self.executor.submit(trial_id, self._launch(config.params), at=now))
            unfinished += 1
        return events

    def _concurrency(self) -> int:
        """Trials in flight: all of them for samplers that chose up front; a few per slot for TPE,
        which learns from finished trials."""
        if self.spec.search.sampler != "tpe":
            return self.spec.search.trials or 1 << 30
        return 4 * len(self.executor.slots) if self.executor else 1

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
                value = None if best is None else (best if self.spec.metric.mode == "max" else -best)
                self.sampler.tell(int(trial.trial_id), value)

    def _launch(self, params: dict) -> TrialLaunch:
        trial = self.spec.trial
        common = dict(budget=self.spec.budget.steps, config=params, cwd=str(self.spec.workdir))
        if trial.function is not None:
            return TrialLaunch(function=trial.function, warm=trial.warm_workers, **common)
        command = tuple(shlex.split(trial.command.format_map({k: str(v) for k, v in params.items()})))
        return TrialLaunch(command=command, metric_pattern=trial.metrics_regex, **common)

    # ------------------------------------------------------------------ the engine's listener
    def _record(self, event: Event, decisions: list[Decision]) -> None:
        """Write the event and its decisions, then what changed, before the executor acts.

        These are separate transactions, and the runner may die between any two. A report's
        metrics go first: a report the log then lacks is made again after the restart (its trial
        resumes from an earlier checkpoint), whereas metrics written after the event would be lost
        for good. The trial records of the last event are rewritten by the restarted runner.
        """
        store, experiment = self.store, self.experiment_id
        if isinstance(event, TrialReported):
            metrics = self.executor.reported_metrics.pop((event.trial_id, event.step), {self.spec.metric.name: event.value})
            store.record_metrics(experiment, event.trial_id, event.step, event.at, metrics)
        store.append_event(experiment, event, decisions)
        changed = self._update_trials(event, decisions)
        self._follow(event, decisions, replaying=False)
        if isinstance(event, TrialExited) or any(self.scheduler.trials[t].state.is_terminal for t in changed):
            for submission in self._submissions(event.at):
                self._engine.post(submission)

    def _update_trials(self, event: Event, decisions: list[Decision]) -> set[str]:
        """Write the records of the trials that ``event`` and its decisions changed, as the core has them
        now; return their ids."""
        changed = {decision.trial_id for decision in decisions}
        trial_id = getattr(event, "trial_id", None)
        if trial_id is not None:
            changed.add(trial_id)
        if isinstance(event, (NodeAdded, NodeRemoved)):
            changed.update(t.trial_id for t in self.scheduler.trials.values() if not t.state.is_terminal)
        for changed_id in sorted(changed):
            self.store.upsert_trial(self.experiment_id, _record_of(self.scheduler.trials[changed_id], event.at))
        return changed


# Seconds of slot time a suspend and resume cost, by how trials run (bench/switching.py, docs/trials.md).
WARM_SWITCH_COST = 0.05  # a warm worker: 0.3 ms on the same slot, 38 ms to migrate 10 MB of state
PROCESS_SWITCH_COST = 3.2  # a process per run: checkpoint, exit, start Python, import torch, restore
SIGSTOP_SWITCH_COST = 0.01  # an unmodified program: stopped and continued in place


def switch_cost(spec: ExperimentSpec) -> float:
    """What a switch typically costs for the spec's trials: the hermes policy's default ``switch_cost``."""
    trial = spec.trial
    if trial.function is not None:
        return WARM_SWITCH_COST if trial.warm_workers else PROCESS_SWITCH_COST
    return SIGSTOP_SWITCH_COST if trial.metrics_regex else PROCESS_SWITCH_COST


def slots_for(resources: ResourcesSpec) -> list[Slot]:
    """The GPUs the spec asks for when this machine has them, else its CPU slots."""
    if resources.gpus != "none":
        found = discover_gpus()
        if isinstance(resources.gpus, list):
            missing = [index for index in resources.gpus if index >= len(found)]
            if missing:
                raise HermesError(f"resources.gpus: no GPU {missing[0]} on this machine ({len(found)} found)")
            found = [found[index] for index in resources.gpus]
        if found:
            return local_slots(gpus=found)
    return local_slots(cpu_slots=resources.cpu_slots, threads_per_slot=resources.threads_per_slot)


def _record_of(trial: Trial, now: float) -> TrialRecord:
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
