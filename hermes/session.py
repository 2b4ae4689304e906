"""One experiment, from its spec to its end: what `hermes run` runs, and what a server hosts many of.

The session wires the shells around the core: the sampler proposes trials, the engine chosen by
``spec.engine`` runs them, the engine loop feeds what happens to the scheduling core, and the
store recorder writes every event, with the decisions it caused, before any decision is carried
out. A session started on a store that already holds the experiment continues it
(``hermes.recovery``).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.core.decisions import Decision
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    SubmissionsClosed,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.core.policy import plugin_call
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import FAILED, STOPPED
from hermes.errors import (
    HOST_LIMIT_ERRNOS,
    STORAGE_LIMIT_ERRNOS,
    ClusterLost,
    HermesError,
    HostLimit,
    NoSpaceError,
    start_thread,
)
from hermes.execution.contract import Executor
from hermes.execution.engine import Engine
from hermes.execution.registry import make_engine
from hermes.experiment import ExperimentSpec
from hermes.experiment.spec import refuse_shell_words
from hermes.plugins import importable_from
from hermes.policies import make_policy, make_stopper
from hermes.recovery import Recovered, replay
from hermes.report.files import note_checkpoint_location
from hermes.search import (
    BUDGET_FIELDS,
    BaseSearcher,
    Budget,
    Config,
    make_searcher,
    max_pending_for,
)
from hermes.search.errors import SamplerFailed
from hermes.store.base import (
    ExperimentStatus,
    ExperimentStore,
    StoreError,
    StoreUnavailable,
)
from hermes.store.lock import ExperimentLock, RunnerLock, SpaceReserve, describe
from hermes.store.recorder import StoreRecorder
from hermes.store.sql import SqlStore

STORE_FILE = "hermes.db"
SUBMISSIONS_AT_ONCE = 100  # trials asked for in one go; more follow once the core has these (``submissions``)
BUDGET_SPENT = "its budget of time or GPU hours is spent"  # why such an experiment ended: its log and its status say
Listener = Callable[[Event, list[Decision]], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    experiment_id: int
    resumed: bool  # continued an experiment found in the store
    status: ExperimentStatus
    ran: bool = True  # False where it had ended before and nothing ran: an error is its earlier run's


class ExperimentSession:
    """Runs ``spec`` to the end, or continues it from its store.

    ``store``: where the experiment is kept (default: SQLite in the spec's storage directory).
    ``experiment_id``: the stored experiment a host (``hermes.pool``) runs, whose spec is ``spec``;
    None: the one called ``spec.name`` that a pool does not own, made if missing.
    ``listeners`` see every event and its decisions as the store's recorder does, before its commit; one with a
    ``flush`` method is flushed after that commit (``Engine``), where what it says of them is in the store.
    ``host_runs``: for a host's session, whether the host still runs (a pool's sessions outlive its stop until
    collected): while it does, no other session of this process takes the experiment's folder (``ExperimentLock``);
    without it, the session keeps its folder until it releases it.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        store: ExperimentStore | None = None,
        experiment_id: int | None = None,
        listeners: list[Listener] | None = None,
        host_runs: Callable[[], bool] | None = None,
    ) -> None:
        self.spec = spec
        self.storage = spec.storage_dir
        # One runner per storage dir (flock: released by the kernel however this process ends), and
        # the store refuses any earlier writer of the experiment, should a second runner get past it.
        # A host that passes its store (hermes.pool) holds the directory itself. One session per experiment
        # folder too, pooled or not: a pool runs a spec from a store of its own, and a `hermes run` of the same spec
        # wrote into its trials' folders. A second runner is refused before it starts an engine (a Ray instance
        # takes seconds); where the directory does not exist yet, no runner holds it, and none is made before the
        # engine has accepted the spec.
        self._lock = RunnerLock(self.storage, spec.name)
        self._folder_lock = ExperimentLock(self.storage / spec.name, spec.name, live=host_runs or (lambda: True))
        self._hosted = False  # a host's loop drives it (``host``), not ``run``
        self._building = False  # ``run`` builds an executor that starts at once: an interrupt waits for it
        self._deferring = False  # an interrupt waits (``interrupt``): ``run`` writes how it ended, or releases
        self._deferred: BaseException | None = None  # an interrupt that came meanwhile, raised once that is done
        if store is None and not (self.storage / STORE_FILE).exists():
            # a new experiment, as no store holds it yet: its command is refused before anything is made
            # (``_open_store`` checks one that a store does not hold)
            refuse_shell_words(spec, f"experiment {spec.name}")
        if store is None and self.storage.is_dir():
            self._lock.acquire()
        try:
            if (self.storage / spec.name).is_dir():
                self._folder_lock.acquire()
            self._set_up(spec, store, experiment_id)
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt) and store is None:
                self._record_interrupted_set_up()
            if store is None and (opened := getattr(self, "store", None)) is not None:
                # closed whole: a notebook's process held hermes.db, -wal and -shm open for ever, and a lost store's
                # empty -wal was left beside the store put back (``_refuse_a_lost_store``)
                opened.close()
            self._folder_lock.release()
            self._lock.release()
            raise
        self.listeners = listeners or []
        self.executor: Executor | None = None
        self._post: Callable[[Event], None] | None = None  # where new submissions go: the engine loop, or a host's
        self._loop: Engine | None = None  # the engine loop while ``run`` runs it
        self.interrupted_by: int | None = None  # the signal that interrupted the run (``interrupts_between_batches``)
        self._closed = False  # SubmissionsClosed is in the log
        self._cancelled = False  # ExperimentCancelled is in the log
        self._ended_by_budget = False  # the log's last ExperimentCancelled was its budget's, and nothing reopened it
        self._told: set[str] = set()  # trials whose end the searcher has been told
        self._revived: set[str] = set()  # of those, the ones a reopening runs again, until they end again
        self.out_of_step: str | None = None  # why the searcher does not propose what the log holds (``replay``)
        self._asks_due = True  # an event since the last asks may let the searcher propose more
        self._deadline: float | None = None  # when the time or GPU budget may be spent next, on the engine's clock
        self._alarm: _Alarm | None = None  # wakes ``run``'s loop at ``_deadline``
        self._in_transit = 0  # events ``submissions`` gave that the core has not handled yet
        self._cancel_lock = threading.Lock()
        self._cancel_reason: str | None = None  # cancel() was called
        self.ended_by: str | None = None  # why it ended before its searcher did: its budget of time or GPU hours
        self.failure: str | None = None  # why the experiment failed as a whole (its searcher raised)
        self._origin: float | None = None  # when its first event happened, on the engine's clock
        self._width = len(str(max((spec.search.trials or 1000) - 1, 1)))

    def _set_up(self, spec: ExperimentSpec, store: ExperimentStore | None, experiment_id: int | None) -> None:
        """The engine, the core, the searcher and the store. Before the store: a spec this machine cannot run (a
        GPU it lacks) must leave no experiment behind, or the corrected spec would clash with it under the same
        name."""
        self.engine = make_engine(spec)
        try:
            self._set_up_after_engine(spec, store, experiment_id)
        except BaseException:
            self.engine.close()
            raise

    def _set_up_after_engine(self, spec: ExperimentSpec, store: ExperimentStore | None,
                             experiment_id: int | None) -> None:
        if store is None and not self._lock.held:
            self._lock.acquire()
        if not self._folder_lock.held:
            self._folder_lock.acquire()
        with importable_from(spec.plugins_from):  # a class of one's own is loaded from where validation found it
            policy = make_policy(spec.policy.name, **spec.policy.settings)
            plugin_call(policy, "configure", self.engine.profile())
            stopper = spec.policy.stopper
            self.objective = Objective(spec.metric.mode)
            self.scheduler = Scheduler(
                policy,
                objective=self.objective,
                stopper=make_stopper(stopper.name, **stopper.params) if stopper else None,
                max_failures=spec.trial.max_failures,
            )
            self.searcher: BaseSearcher = make_searcher(spec.search, spec.metric.mode, slots=self.engine.capacity())
        self.budget = Budget.of(spec.search)
        self.reserve = SpaceReserve(self.storage)
        self._open_store(spec, store, experiment_id)

    def _open_store(self, spec: ExperimentSpec, store: ExperimentStore | None, experiment_id: int | None) -> None:
        self.store = store or SqlStore(f"sqlite:///{self.storage / STORE_FILE}")
        self._store_file = None if store is not None else _identity(self.storage / STORE_FILE)
        if experiment_id is not None:
            self._budget_changed = False  # a host runs the spec as stored
            self.experiment_id = experiment_id
            self.store.claim_writer(experiment_id, describe(self._lock.who))
            return
        found = next((e for e in self.store.experiments() if e.name == spec.name and not e.owner), None)
        if found is None:
            self._refuse_a_lost_store(spec)
        stored = found.spec if found is not None else None
        budget = {field: getattr(spec.search, field) for field in BUDGET_FIELDS}
        self._budget_changed = stored is not None and any(
            stored.get("search", {}).get(field) != value for field, value in budget.items()
        )
        document = spec.model_dump(mode="json")
        # A rerun may extend the budget, or change the policy: the new one continues from the log's
        # decisions (``hermes.recovery``) and decides from there. Its storage.dir may name the same folder otherwise
        # (./runs/ for runs) or one it was moved to: the store found there holds this experiment by definition. Its
        # trial.workdir may name the same folder otherwise (./ for ., its absolute path), not another: a module found
        # in another folder may be other code.
        may_change: tuple[str, ...] = (*(f"search.{field}" for field in BUDGET_FIELDS), "policy", "storage.dir")
        if found is not None and spec.same_workdir(found.spec):
            may_change += ("trial.workdir",)
        new_command = found is None  # given now: a stored one runs as written, as before the check was made
        if found is not None and not self.store.events_after(found.experiment_id, 0, limit=1):
            # Nothing of it ever ran (its engine could not start: a Ray node that could not write storage.uri, say),
            # so nothing ties it to its spec: the corrected one replaces it, under the same name.
            may_change = tuple({*found.spec, *document})
            new_command = found.spec.get("trial", {}).get("command") != spec.trial.command
        elif found is not None and all(trial.started_at is None for trial in self.store.trials(found.experiment_id)):
            # Its trials were drawn, and none ever started (on Ray it waited for GPUs the cluster lacks, and said to
            # set resources.gpus: none): where they are to run may change, as what they are may not.
            may_change += ("resources",)
        if new_command:
            refuse_shell_words(spec, f"experiment {spec.name}")
        self.experiment_id = self.store.create_or_open_experiment(spec.name, document, may_change=may_change)
        self.store.claim_writer(self.experiment_id, describe(self._lock.who))

    def _refuse_a_lost_store(self, spec: ExperimentSpec) -> None:
        """The store holds no experiment of this name, yet its folder holds trials of an earlier run: the store was
        lost (deleted, emptied, or copied without its ``-wal`` file, which holds a small experiment's whole log).
        Made anew, the experiment started over in silence, and each trial's start deleted its checkpoints."""
        trials = self.storage / spec.name / "trials"
        if not trials.is_dir() or not any(path.is_dir() for path in trials.iterdir()):
            return
        raise HermesError(
            f"{self.storage / STORE_FILE} holds no experiment {spec.name}, but {trials} holds the trials of an earlier "
            f"run of it: its store was lost (deleted, emptied, or copied without its {STORE_FILE}-wal file); put the "
            f"store back with its -wal file to continue it, run it under another --name or storage.dir, or remove "
            f"{self.storage / spec.name} to start it over")

    def _record_interrupted_set_up(self) -> None:
        """Ctrl-C (or SIGTERM or SIGHUP, which `hermes run` takes alike) while the session was set up, once the store
        had its experiment (a new one is made running): it is recorded interrupted, not left for `hermes status` to
        call its runner killed. Found by name: the interrupt may have come before the store said its id. This runner
        holds the storage dir, so none other runs it."""
        store: ExperimentStore | None = getattr(self, "store", None)
        if store is None:
            return
        try:
            found = next((e for e in store.experiments() if e.name == self.spec.name and not e.owner), None)
            if found is not None and found.status is ExperimentStatus.RUNNING:
                store.set_status(found.experiment_id, ExperimentStatus.INTERRUPTED)
        except StoreError:  # another writer took it over: left as it is
            pass

    def abandon(self, *, interrupted: bool = True) -> None:
        """Give the experiment up before ``run`` ran anything (Ctrl-C while its caller prepared, an engine that cannot
        start): one shown running is recorded ``interrupted``, and its engine and locks are let go."""
        if interrupted:
            self._record_end(ExperimentStatus.INTERRUPTED, only_if=ExperimentStatus.RUNNING)
        self.engine.close()
        self._folder_lock.release()
        self._lock.release()

    # ------------------------------------------------------------------ the run
    def run(self) -> Outcome:
        replayed = False
        try:
            recovered = self.replay()
            replayed = True
            # A Ctrl-C amid the start of its threads and processes left them running in this process (a notebook's)
            # for good: one that starts at once takes it when it is built (Ray's waits for its cluster: not there).
            self._building = self.engine.starts_at_once
            try:
                executor = self.executor = self.engine.executor(self.storage / self.spec.name, recovered.now)
            finally:
                self._building = False
                deferred, self._deferred = self._deferred, None
            if deferred is not None:
                raise deferred
        except BaseException as error:
            # Nothing ran. A log that does not replay leaves the experiment as it was; an engine that cannot start (a
            # Ray node's agent that failed) or Ctrl-C leaves no runner: one shown running is interrupted (a rerun that
            # gets past it continues it; one that never ran takes a corrected spec, ``_open_store``).
            if self.executor is not None:
                self.executor.close()
            self.abandon(interrupted=replayed or isinstance(error, KeyboardInterrupt))
            if isinstance(error, OSError) and error.errno in HOST_LIMIT_ERRNOS:  # its pipes, guard or thread: as below
                raise HostLimit(f"{error.strerror} (errno {errno.errorcode.get(error.errno)})") from error
            raise
        self._lock.note_clock(executor.now())  # reports count a running experiment's time from it
        try:
            # where an executor that keeps durable checkpoints (Ray's) keeps this experiment's, for the reports
            note_checkpoint_location(self.storage / self.spec.name, getattr(executor, "storage_uri", None))
            for trial in self.scheduler.trials.values():
                executor.submit(  # the trials it ran fall back to their checkpoints, so the core knows that step
                    trial.trial_id,
                    self.engine.work(trial.params),
                    at=trial.submitted_at,
                    reported_step=trial.catch_up_step,
                )
            first: list[Event] = []
            if self._reopens(recovered.now):  # a larger budget
                first.append(SubmissionsReopened(recovered.now))  # after the lost nodes: none gets a new trial
                self._closed = self._cancelled = False
            elif self.scheduler.finished:
                return self._ended_before()
            self.reserve.acquire()
            recorder = StoreRecorder(self.store, self.experiment_id, self.scheduler)
            loop = Engine(self.scheduler, executor, [recorder, self._after, *self.listeners], submitter=self)
            try:
                if self.budget.seconds is not None or self.budget.gpu_seconds is not None:
                    self._alarm = _Alarm(executor.now, executor.wake)  # its thread may meet the host's limit
                self.store.set_status(self.experiment_id, ExperimentStatus.RUNNING)
                with self._cancel_lock:  # from here on, cancel() posts to the loop itself
                    self._post = loop.post
                    if self._cancel_reason is not None:
                        loop.post(ExperimentCancelled(recovered.now, self._cancel_reason))
                self._loop = loop
                self.lose_old_nodes(recovered.lost_nodes, recorder)  # before anything the new executor reports
                loop.run(first=first)  # an interrupt after its last batch is raised once its end is written
            # Not the experiment's fault, running it again continues it: Ctrl-C, a full disk, a lost cluster, the
            # output's reader gone, a store locked by another process or made read-only
            except (KeyboardInterrupt, NoSpaceError, ClusterLost, BrokenPipeError, StoreUnavailable):
                self._record_end(ExperimentStatus.INTERRUPTED)
                self._check_store_file()  # a rerun would not continue it, but start over
                raise
            except OSError as error:
                if error.errno in HOST_LIMIT_ERRNOS:
                    self._record_end(ExperimentStatus.INTERRUPTED)
                    self._check_store_file()
                    raise HostLimit(f"{error.strerror} (errno {errno.errorcode.get(error.errno)})") from error
                if error.errno not in STORAGE_LIMIT_ERRNOS:
                    self._record_end(ExperimentStatus.FAILED, f"{type(error).__name__}: {error}")
                    raise
                self._record_end(ExperimentStatus.INTERRUPTED)
                self._check_store_file()
                raise NoSpaceError(f"{error.filename or 'a file'}: {error.strerror}") from error
            except BaseException as error:  # a bug of ours, most likely: `hermes status` says what it was
                self._record_end(ExperimentStatus.FAILED, f"{type(error).__name__}: {error}")
                raise
            # cancel() ends it as cancelled; a spent budget of time or GPU hours ends it as finished
            status = ExperimentStatus.FINISHED if self._cancel_reason is None else ExperimentStatus.CANCELLED
            if self.failure is not None:
                status = ExperimentStatus.FAILED
            with self._interrupts_deferred():  # a Ctrl-C here left a finished experiment shown running
                # one that came after the last batch waits with those that come now: a script running experiments
                # one after another went on to the next, its Ctrl-C lost
                self._deferred = self._deferred or loop.take_interrupt()
                self._loop = None
                self.store.set_status(self.experiment_id, status, error=self.failure)
            self._check_store_file()
        except KeyboardInterrupt:  # before the loop started (in it, those above recorded it): a new one says running
            self._record_end(ExperimentStatus.INTERRUPTED, only_if=ExperimentStatus.RUNNING)
            raise
        finally:
            self._loop = None
            if self._alarm is not None:
                self._alarm.close()  # before the executor closes: no wake reaches it after
                self._alarm = None
            self._release(executor)
        return Outcome(self.experiment_id, recovered.events > 0, status)

    def lose_old_nodes(self, lost: tuple[NodeRemoved, ...], recorder: StoreRecorder) -> None:
        """Tell the core, the store and the listeners that the dead runner's nodes are gone (a dead pool's too:
        ``hermes.pool``), all of them before the core decides anything: the core takes them as it replays the log,
        deciding nothing, and once they are all gone there is no GPU left to decide about. Handled one at a time, a
        node's removal placed its trials on another old node not removed yet, and that start went to the new
        executor: on the same Ray cluster, whose node of that name ran it, the next removal took that run for lost
        and the trial was started a second time (its reports crashed the core); on another cluster, the executor
        did not know the GPU; a pool recorded the start and never carried it out."""
        for event in lost:
            self.scheduler.replay(event, ())
            for listener in (recorder, self._follow_live, *self.listeners):
                listener(event, [])
        recorder.flush()

    def _release(self, executor: Executor) -> None:
        """End every trial's processes and release the storage dir, whatever interrupt comes meanwhile
        (``interrupt`` defers it): a second Ctrl-C that cut this short left the lock held and the workers
        alive in a process that lives on, a notebook's, which could then run no experiment of that dir."""
        with self._interrupts_deferred():
            executor.close()
            self.engine.close()
            self.reserve.release()
            self._folder_lock.release()
            self._lock.release()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred

    @contextmanager
    def _interrupts_deferred(self) -> Iterator[None]:
        """While the block runs, an interrupt waits (``interrupt``); ``_release`` raises it, at the end of ``run``."""
        before, self._deferring = self._deferring, True
        try:
            yield
        finally:
            self._deferring = before

    def _ended_before(self) -> Outcome:
        """Run again once it has ended: it stays as it ended. A search that failed stays failed, with its reason
        (one that a crash of the runner marked failed has none, and ran to its end, or would not be here: it
        finished); a cancelled one stays cancelled."""
        stored = self.store.experiment(self.experiment_id)
        status = ExperimentStatus.FINISHED
        if stored.status is ExperimentStatus.CANCELLED or (stored.status is ExperimentStatus.FAILED and stored.error):
            status = stored.status
        self.failure = stored.error if status is ExperimentStatus.FAILED else None
        self.store.set_status(self.experiment_id, status)
        return Outcome(self.experiment_id, True, status, ran=False)

    def _check_store_file(self) -> None:
        """SQLite writes on into a store file deleted (or replaced) under it: the run would end "finished" with
        its record gone. Say so instead."""
        path = self.storage / STORE_FILE
        if self._store_file is not None and _identity(path) != self._store_file:
            raise HermesError(f"{path} was deleted or replaced while the experiment ran: what the run recorded is "
                              f"lost with it; remove {self.storage / self.spec.name} and run it again to start over")

    def interrupt(self, exception: BaseException, at_once: bool = False) -> bool:
        """Have ``run`` raise ``exception`` between two of its engine loop's batches, so that no store
        transaction is cut in half (``Engine.interrupt``; safe from a signal handler of the thread that
        runs it); while it writes how the run ended or releases what it holds at its end, once that is done. False
        where neither is so (or ``at_once``, outside those): the caller may raise it at once there, in the setup
        before the loop, where ``run`` writes nothing but that the experiment was interrupted; while its executor
        is built (``_building``), all but one ``at_once``: a second Ctrl-C stops a start that hangs."""
        if self._deferring or (self._building and not at_once):
            self._deferred = self._deferred or exception
            return True
        if self._loop is None or at_once:
            return False
        self._loop.interrupt(exception)
        return True

    def cancel(self, reason: str) -> None:
        """Stop every trial and end the experiment, from any thread, before or while ``run`` runs."""
        with self._cancel_lock:
            self._cancel_reason = reason
            if self._post is not None and self.executor is not None:
                self._post(ExperimentCancelled(self.executor.now(), reason))

    def _record_end(self, status: ExperimentStatus, error: str | None = None,
                    only_if: ExperimentStatus | None = None) -> None:
        """Record how the run ended (and why it failed), so that it is not shown as running (``only_if``: where
        it is stored so); on a full disk, with the room the reserve kept for this. A store that refuses
        (another writer took over) is left as is: the error being raised says why. A second Ctrl-C waits for
        this write (``interrupt``), as for the release that follows: it left the run shown as running."""
        with self._interrupts_deferred():
            try:
                self.reserve.release()
                if only_if is not None and self.store.experiment(self.experiment_id).status is not only_if:
                    return
                self.store.set_status(self.experiment_id, status, error=error)
            except StoreError:
                pass

    # ------------------------------------------------------------------ hosted by another loop (hermes.pool)
    def replay(self) -> Recovered:
        """Rebuild the core and the searcher from the store's log; ``run`` does this first. Trials asked from
        here on are numbered as the log's are (a rerun with more trials went from 7 to 08). A searcher that does
        not propose what the log holds (``out_of_step``) is refused only where it would be asked again: a search
        that had stopped asking, a finished one say, is shown as it ended, however its searcher changed since; so is
        one that raises as it replays (``_follow_replayed``)."""
        try:
            recovered = replay(self.store, self.experiment_id, self.scheduler, self._follow_replayed)
            if self.scheduler.trials:
                self._width = len(next(iter(self.scheduler.trials)))
            asked_again = not self._closed or self._reopens(recovered.now)
            if self.out_of_step is not None and asked_again:
                raise HermesError(self.out_of_step)
            if self.failure is not None and asked_again:
                raise SamplerFailed(self.failure)
        except BaseException:
            self._folder_lock.release()  # it cannot run: a host fails it, and goes on without this session
            raise
        return recovered

    def host(self, executor: Executor, post: Callable[[Event], None]) -> None:
        """Let a host's loop drive this experiment instead of ``run``: its trials are submitted to
        ``executor``, and the events of new submissions go to ``post``. The host records each
        event the core handled, then calls ``after``."""
        self.executor, self._post = executor, post
        self._hosted = True
        self._free_folder_once_ended()

    def after(self, event: Event, decisions: list[Decision]) -> None:
        """After the store has the event: tell the searcher. More trials are asked for by ``submissions``."""
        self._follow_live(event, decisions)

    def submissions(self, now: float) -> list[Event]:
        """The submissions the searcher and the budget allow now, when an event since the last call may
        allow more, or the budget's deadline has come. A host posts them to the core before any other event: a
        replay asks where the log holds them, so the searcher must have been told exactly the events before them
        when it was asked. At most ``SUBMISSIONS_AT_ONCE``: the rest come at the next call (``asks_due`` stays), so
        that a search of a hundred thousand trials does not hold a pool's every other experiment, and its own
        cancel, for minutes."""
        if not (self._asks_due or self._deadline_passed(now)) or self._in_transit:  # the last batch first: a host
            return []                                                                # may handle posts out of order
        self._asks_due = False
        submissions = self._submissions(now)
        self._in_transit = len(submissions)
        return submissions

    @property
    def asks_due(self) -> bool:
        """Whether ``submissions`` may have more to give now. A host that asks this between events (a pool, at
        each of its polls) ends an experiment whose budget is spent while its trials are in long steps."""
        return self._asks_due or (self._deadline is not None and self._deadline_passed(self.executor.now()))

    def _deadline_passed(self, now: float) -> bool:
        return self._deadline is not None and now >= self._deadline

    # ------------------------------------------------------------------ trials from the searcher
    def _submissions(self, now: float) -> list[Event]:
        """New trials while the searcher wants more in flight and the budget allows; else close
        submissions, or cancel the experiment once its time or GPU budget is spent."""
        events: list[Event] = []
        if self._cancelled:
            self._arm(None)
            return events
        if self._budget_spent(now):
            self._cancelled = self._closed = True
            self.ended_by = BUDGET_SPENT
            self._arm(None)
            return [ExperimentCancelled(now, BUDGET_SPENT)]
        self._arm(self._budget_deadline(now))
        if self._closed:
            return events
        searcher, budget = self.searcher, self.budget
        elapsed = self._elapsed(now)  # both stand still while it asks; the GPU time sums every trial's: once
        used = self._gpu_seconds(now) if budget.gpu_seconds is not None else 0.0
        while self._wants_more() or (not events and self._stalled()):
            if len(events) == SUBMISSIONS_AT_ONCE:
                self._asks_due = True
                break
            allowed = budget.may_ask(searcher.asked, elapsed, used)
            try:
                config = searcher.ask() if allowed else None
            except SamplerFailed as failure:
                return [*events, self._fail_search(failure, now)]
            if config is None:
                events.append(SubmissionsClosed(now))
                self._closed = True
                break
            trial_id = f"{config.index:0{self._width}d}"
            events.append(self.executor.submit(trial_id, self.engine.work(config.params), at=now))
        return events

    def _wants_more(self) -> bool:
        """The searcher's ``wants_more``, with the trials a reopening runs again counted in flight: it was told they
        ended as the spent budget stopped them, so its ``max_pending`` left them out, and it asked as many new ones
        at once, which waited."""
        searcher = self.searcher
        limit = searcher.max_pending
        return searcher.wants_more and (limit is None or searcher.pending + len(self._revived) < limit)

    def _more_in_flight(self) -> None:
        """GPUs joined (a Ray node, a pool's grant): a searcher kept to a few trials per slot gets as many more in
        flight; its number came from the slots the engine had at the start, and the new GPUs stayed idle."""
        searcher = self.searcher
        wanted = max_pending_for(self.spec.search, searcher.learns, self.scheduler.cluster.gpu_count)
        if wanted is not None and searcher.max_pending is not None and wanted > searcher.max_pending:
            searcher.max_pending = wanted
            self._asks_due = True

    def _stalled(self) -> bool:
        """No GPU of the experiment works while it has some: the trials it has in flight wait and none may run
        (ASHA's, paused at a rung until others reach it). A searcher's ``max_pending`` counts them, so it asked
        for no more and the run ended with "nothing left to report": one more is asked beyond it instead."""
        scheduler = self.scheduler
        return scheduler.busy == 0 and scheduler.cluster.gpu_count > 0 and scheduler.submissions_open

    def _fail_search(self, failure: SamplerFailed, now: float) -> ExperimentCancelled:
        """The searcher raised: end the experiment (its trials stopped, what they reported kept), recorded failed."""
        return self.fail(str(failure), now)

    def fail(self, reason: str, now: float) -> ExperimentCancelled:
        """The cancellation that ends the experiment as failed for ``reason``: its trials stopped, what they reported
        kept, its searcher asked and told nothing more (a host's, whose plug-in failed: ``hermes.pool``)."""
        self.failure = reason
        self._cancelled = self._closed = True
        return ExperimentCancelled(now, reason)

    def _reopens(self, now: float) -> bool:
        """Whether this rerun's larger budget allows what the log's experiment had stopped asking for, or running
        again the trials its end stopped (``Scheduler.to_run_again``: those a spent time budget stopped, some before
        they ever ran). The log's trials count, not the searcher's asks: one out of step with the log was asked no
        more once it differed. An experiment its budget ended continues once its budget is not spent, the stored spec
        aside: a rerun that failed before it ran (a plug-in that raised, Ctrl-C as its engine started) has stored the
        larger budget already. Otherwise the budget must have changed: a cancelled experiment is not run again by a
        plain rerun."""
        if not self._closed or self._budget_spent(now) or not (self._budget_changed or self._ended_by_budget):
            return False
        return bool(self.scheduler.to_run_again) or self.budget.may_ask(
            len(self.scheduler.trials), self._elapsed(now), self._gpu_seconds(now)
        )

    def _budget_spent(self, now: float) -> bool:
        """Time is the experiment's clock (it stands still while no runner runs), as the log has it."""
        budget = self.budget
        return (budget.seconds is not None and self._elapsed(now) >= budget.seconds) or (
            budget.gpu_seconds is not None and self._gpu_seconds(now) >= budget.gpu_seconds
        )

    def _budget_deadline(self, now: float) -> float | None:
        """The earliest moment the budget may be spent if no event comes before: the time budget's end, or when the
        trials running now use up the GPU seconds left. No event may come for long (every trial in a long step),
        and a hard limit must not wait for one (``submissions``, ``_Alarm``)."""
        budget, moments = self.budget, []
        if budget.seconds is not None:
            moments.append(now + budget.seconds - self._elapsed(now))
        if budget.gpu_seconds is not None:
            running = sum(trial.running_since is not None for trial in self.scheduler.trials.values())
            if running:
                moments.append(now + (budget.gpu_seconds - self._gpu_seconds(now)) / running)
        return min(moments, default=None)

    def _arm(self, deadline: float | None) -> None:
        self._deadline = deadline
        if self._alarm is not None:
            self._alarm.set(deadline)

    def _elapsed(self, now: float) -> float:
        """Seconds since the experiment's first event: a pool's clock was running before it came."""
        return now - (self._origin if self._origin is not None else now)

    def _gpu_seconds(self, now: float) -> float:
        return sum(
            trial.gpu_time + (now - trial.running_since if trial.running_since is not None else 0.0)
            for trial in self.scheduler.trials.values()
        )

    def _after(self, event: Event, decisions: list[Decision]) -> None:
        """The engine loop's listener: what ``after`` does, then the submissions that follow, which the loop
        handles next (``Engine`` takes a listener's posts before any other event). A turn's own submissions ask
        for no next turn: the loop asks for it between batches, so that trials start, reports come and an
        interrupt is taken between turns (a search of 100,000 trials held SIGTERM for 9 s, a million for minutes)."""
        self._follow_live(event, decisions)
        if isinstance(event, (TrialSubmitted, SubmissionsClosed)):
            return
        for submission in self.submissions(event.at):
            self._post(submission)

    def _free_folder_once_ended(self) -> None:
        """A host's experiment whose core has finished frees its folder, for a `hermes run` of it, say: the host
        goes on, and drops the session. ``run`` frees it as it ends."""
        if self._hosted and self.scheduler.finished:
            self._folder_lock.release()

    def _follow_live(self, event: Event, decisions: list[Decision]) -> None:
        self._free_folder_once_ended()
        if self._in_transit and isinstance(event, (TrialSubmitted, SubmissionsClosed, ExperimentCancelled)):
            self._in_transit -= 1
        if self.failure is not None:
            return  # the experiment is ending: its searcher is told nothing more
        try:
            self._follow(event, decisions, replaying=False)
        except SamplerFailed as failure:
            self._post(self._fail_search(failure, event.at))
            return
        if isinstance(event, (NodeAdded, GpuAdded)):
            self._more_in_flight()
        ended = isinstance(event, TrialExited) or any(
            self.scheduler.trials[d.trial_id].state.is_terminal for d in decisions
        )
        if ended or self._stalled() or (self.budget.seconds is not None or self.budget.gpu_seconds is not None):
            self._asks_due = True

    def _follow_replayed(self, event: Event, decisions: list[Decision]) -> None:
        """A searcher that raises as the log replays (a sampler that failed the experiment when it ran fails alike
        again) is told nothing more, and the experiment ends failed: shown as it ended where it had, its stopping trials
        left to stop where a crash cut that short. Refused only where it would be asked again (``replay``)."""
        try:
            self._follow(event, decisions, replaying=True)
        except SamplerFailed as failure:
            self.failure = str(failure)

    def _follow(self, event: Event, decisions: list[Decision], *, replaying: bool) -> None:
        """Keep the searcher in step with the log: one ask per submission, every report, one end per trial."""
        if self._origin is None:
            self._origin = event.at
        # Once it differs from the log or failed, the searcher is told nothing more: it is not asked again (``replay``).
        in_step = self.out_of_step is None and self.failure is None
        if isinstance(event, TrialSubmitted) and replaying:
            if in_step:
                config = self.searcher.ask()
                if config is None or _fixed_added(config.params, event.params, self.spec) != dict(event.params):
                    self.out_of_step = _out_of_step(event, config)
        elif isinstance(event, TrialReported) and in_step and event.trial_id not in self._told:
            # a trial run again after a reopening (``_reopens``) was told ended as it stopped: a searcher takes
            # no report after a trial's end
            self.searcher.on_report(int(event.trial_id), event.step, event.value)
        elif isinstance(event, SubmissionsClosed):
            self._closed = True
        elif isinstance(event, SubmissionsReopened):
            self._closed = self._cancelled = self._ended_by_budget = False
            trials = self.scheduler.trials
            self._revived = {trial_id for trial_id in self._told if not trials[trial_id].state.is_terminal}
        elif isinstance(event, ExperimentCancelled):
            self._closed = self._cancelled = True
            self._ended_by_budget = event.reason == BUDGET_SPENT
        if isinstance(event, (NodeAdded, NodeRemoved, GpuAdded, GpuRemoved)):
            touched = set(self.scheduler.trials)  # a lost trial told to stop ends without a decision
        else:
            touched = {decision.trial_id for decision in decisions}
            touched.update([event.trial_id] if hasattr(event, "trial_id") else [])
        for trial in (self.scheduler.trials[trial_id] for trial_id in sorted(touched)):
            if trial.state.is_terminal:
                self._revived.discard(trial.trial_id)
            if trial.state.is_terminal and trial.trial_id not in self._told:
                self._told.add(trial.trial_id)
                best = trial.best_score  # a failed trial's partial best is no result (Optuna: FAIL)
                value = None if best is None or trial.state is FAILED else self.objective.value(best)
                if in_step:
                    self.searcher.on_end(int(trial.trial_id), value, stopped=trial.state is STOPPED)


class _Alarm:
    """A thread that calls ``wake`` once ``clock`` reaches the moment last ``set`` (None: none): the engine loop
    waits for its executor's next event, and a budget spent while every trial is in a long step must end the
    experiment then, not at the next report. The core keeps no clock; this shell of it does."""

    def __init__(self, clock: Callable[[], float], wake: Callable[[], None]) -> None:
        self._clock, self._wake = clock, wake
        self._at: float | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hermes-budget-alarm", daemon=True)
        start_thread(self._thread)

    def set(self, at: float | None) -> None:
        with self._changed:
            if at != self._at:
                self._at = at
                self._changed.notify()

    def close(self) -> None:
        """Stop the thread; once this returns, ``wake`` is not called again."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                left = None if self._at is None else self._at - self._clock()
                if left is not None and left <= 0:
                    self._at = None
                    self._wake()
                else:
                    self._changed.wait(left)


def _fixed_added(proposed: Mapping[str, Any], stored: Mapping[str, Any], spec: ExperimentSpec) -> dict[str, Any]:
    """``proposed`` as the log stored it: a searcher of the user's that left fixed parameters out has them added, and a
    proposal stored before that (without them) is the same proposal."""
    fixed = {name for name, parameter in spec.search.space.items() if parameter.type == "constant"}
    return {name: value for name, value in proposed.items() if name in stored or name not in fixed}


def _out_of_step(submitted: TrialSubmitted, proposed: Config | None) -> str:
    """Why a replayed searcher cannot continue the log, and what to do: the likely cause is not an edit of the
    user's, but the Hermes that recorded the log."""
    now = "nothing more" if proposed is None else proposed.params
    return (f"the store's trial {submitted.trial_id} was proposed as {dict(submitted.params)} but the searcher "
            f"proposes {now} now: the spec's search, the searcher's code or the Hermes that recorded it differs "
            "(before 2026-12-06 a trial that reported no finite value was told COMPLETE to Optuna, now FAIL; before "
            "2026-12-07 an infinite report was told as it was, now NaN); run "
            "it under a new name (--name NEW: it starts over), or continue it with the Hermes that recorded it")


def _identity(path: Path) -> tuple[int, int] | None:
    """The file's device and inode; None where it is gone."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, taken as Ctrl-C: the runner records the experiment as interrupted and stops its trials."""


@contextmanager
def interrupts_between_batches(session: ExperimentSession, hangups: bool | None = None) -> Iterator[None]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt, and SIGTERM and SIGHUP (its terminal or SSH session
    closed) Terminated, between two batches of the session's engine loop (``ExperimentSession.interrupt``): raised
    inside one, in the middle of a store transaction, the exception left SQLite's write lock held and the
    interrupted status waited 60 s to be written. A second Ctrl-C raises at once, wherever the run is, except while
    it releases its trials' processes and its storage dir at its end (once that is done; a third raises at once
    there too); a second SIGTERM or SIGHUP ends the process. ``hangups``: whether SIGHUP is taken; by default, where
    it would end the process (`hermes run`, whose own handler has it from its start, says)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    terminals = [fd for fd in (1, 2) if os.isatty(fd)]  # known now: a hung-up terminal answers no question

    def interrupt(signum: int, _frame: Any) -> None:
        session.interrupted_by = session.interrupted_by or signum  # whatever a library makes of the exception
        signal.signal(signum, again if signum == signal.SIGINT else signal.SIG_DFL)
        if signum == signal.SIGHUP:
            _leave_terminal(terminals)
        exception = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(
            f"stopped by {signal.Signals(signum).name}: the experiment is recorded interrupted, and running it again "
            "continues it")
        if not session.interrupt(exception):
            raise exception

    def again(signum: int, _frame: Any) -> None:
        signal.signal(signum, signal.default_int_handler)
        if not session.interrupt(KeyboardInterrupt(), at_once=True):
            raise KeyboardInterrupt

    # Ctrl-C only where Python raises on it (a background job started by a shell ignores SIGINT); a hangup only
    # where it would end the process (under nohup it is ignored, and stays so)
    handled = [signal.SIGTERM] + [signal.SIGINT] * (signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    handled += [signal.SIGHUP] * (signal.getsignal(signal.SIGHUP) is signal.SIG_DFL if hangups is None else hangups)
    previous = {signum: signal.signal(signum, interrupt) for signum in handled}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _leave_terminal(fds: list[int]) -> None:
    """After a hangup, send what the run writes to ``fds``, its closed terminal, to /dev/null: each write there
    fails (EIO), and the live view's last one raised a traceback over the interrupted run's end."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
