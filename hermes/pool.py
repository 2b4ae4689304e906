"""A pool session: many experiments from one store, on one engine's GPUs, shared fairly.

What ``hermes server`` runs behind its API. The experiments are the store's: submit one with
``store.submit_experiment(name, spec, owner, weight)`` (or ``PoolSession.submit``), and the
running pool takes it up within ``poll`` seconds; ``store.set_weight``, ``store.set_owner_weight``
and ``store.request_cancel`` act on a running pool the same way. Public API::

    pool = PoolSession(store, "/srv/hermes", engine="local", resources=ResourcesSpec(cpu_slots=4))
    threading.Thread(target=pool.run).start()   # run() blocks until stop()
    PoolSession.submit(store, spec, owner="ann", weight=2.0)
    pool.shares()                               # from any thread: GPUs and GPU seconds per experiment
    pool.stop()                                 # from any thread; run() returns once trials are stopped

Each experiment is an ``ExperimentSession`` hosted by this loop (its sampler, budget, policy and
store log as under ``hermes run``); ``hermes.core.pool.PoolScheduler`` divides the GPUs between
them. Every event an experiment's core handles, grants and reclaims of GPUs included, goes to
that experiment's log with its decisions before any decision is carried out. After ``kill -9``,
a new session on the same store continues every experiment: each log is replayed into a fresh
core, the trials the dead pool ran fall back to their checkpoints, and the GPUs are shared anew.

Statuses: queued (submitted) -> running -> finished, cancelled or failed (``error`` says why: a
spec this machine cannot run, a policy that raised, say). One whose spec, as ``read_spec`` reads it, names a
workdir or trial module that is missing (``SpecFilesMissing``: the server's, a shared mount not up yet, say) waits,
queued or interrupted, its ``error`` saying so, and is taken up at the first look at the store that finds it back;
an experiment ended without being taken up has its old runs ended first. A policy or stopper that raises, or answers
what the core cannot use, fails its own experiment as under ``hermes run`` (recorded failed at once,
with its ``PluginError``): its trials are stopped, and the others go on with its GPUs.
Relative paths in a stored spec start at ``directory``; trials keep their files where ``hermes
run`` keeps them (``<storage.dir>/<name>/trials/<id>``). The pool follows no link out of an experiment's folder: one
whose trials folder, a trial's folder or ``hermes.lock`` resolves outside it fails (``FolderLeadsOut``), writing
nothing there; a user's link below their own experiment's folder had the pool write into another user's experiment.
Function trials run in warm workers of their experiment's own (``TrialLaunch.worker_group``): its
code and working directory serve no other experiment, and its workers end with it. The pool runs on
this machine (``engine="local"``) or on every node of a Ray cluster (``engine="ray"``).
"""

from __future__ import annotations

import logging
import posixpath
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.core.decisions import Decision
from hermes.core.events import Event, ExperimentCancelled, NodeRemoved, TrialSubmitted
from hermes.core.policy import PluginError
from hermes.core.pool import PoolScheduler, Tenant, qualify
from hermes.core.scheduler import Scheduler
from hermes.errors import HermesError, SpecError, start_thread
from hermes.execution.contract import Executor
from hermes.execution.engine import ended_trials, runs_no_more
from hermes.experiment import ExperimentSpec, parse_spec
from hermes.experiment.locate import installed_files, workdir_files
from hermes.experiment.spec import ResourcesSpec, refuse_shell_words
from hermes.local.executor import LocalExecutor
from hermes.local.engine import slots_for, tick_period
from hermes.local.launch import TrialLaunch
from hermes.policies import make_policy
from hermes.recovery import replay
from hermes.server.area import place_problem
from hermes.session import ExperimentSession
from hermes.store.base import WAITING_FOR_FILES, ExperimentRecord, ExperimentStatus, ExperimentStore, WriterLost
from hermes.store.lock import PoolLock, describe
from hermes.store.recorder import StoreRecorder
from hermes.store.sql import differing_fields

if TYPE_CHECKING:
    from hermes.ray.executor import RayExecutor

log = logging.getLogger(__name__)

_OPEN = (ExperimentStatus.QUEUED, ExperimentStatus.RUNNING, ExperimentStatus.INTERRUPTED)


@dataclass(frozen=True, slots=True)
class Share:
    """Where one running experiment stands in the pool's fair share (``PoolSession.shares``)."""

    experiment_id: int
    name: str
    owner: str
    weight: float
    gpus: int  # GPUs it holds now
    share: float  # GPUs it is owed now (a fraction of the pool, by the weights)
    used_gpu_seconds: float  # GPU seconds it held in the pool (across restarts)
    owed_gpu_seconds: float  # GPU seconds its share came to over the same time


@dataclass(eq=False)
class _Member:
    """One hosted experiment: its session (core, searcher, budget) and its store recorder."""

    record: ExperimentRecord
    session: ExperimentSession
    recorder: StoreRecorder
    key: str
    folder: Path  # its folder, <storage.dir>/<name>, as resolved when the pool took it up: nothing below leads out
    checkpoints: str | None = None  # on Ray, its durable checkpoints' folder under the storage URI (``_checkpoints``)
    inbox: deque[Event] = field(default_factory=deque)  # submissions its session posted, for the pool core
    tenant: Tenant | None = None  # its accounts in the pool core, kept once it leaves it: its last ones are saved
    cancelled: bool = False
    failed: bool = False  # a plug-in of its failed: recorded failed, its trials are stopping (``_fail``)
    lost: bool = False  # another writer took it: nothing more is written, its trials are stopping (``_drop``)


class _SharedExecutor:
    """An experiment's view of the pool's executor: its trial ids qualified, its settings on each trial.
    ``folder``: the experiment's folder as the pool took it up (``_Member.folder``); a trial whose folder leads out
    of it is refused (FolderLeadsOut). ``checkpoints``: on Ray, the folder of its durable checkpoints under the
    storage URI ('': the URI itself)."""

    def __init__(
        self, executor: LocalExecutor | RayExecutor, key: str, spec: ExperimentSpec, folder: Path,
        checkpoints: str | None = None,
    ) -> None:
        self._executor, self._key, self._spec, self._folder = executor, key, spec, folder
        self._checkpoints = checkpoints

    def submit(
        self, trial_id: str, work: TrialLaunch, *, at: float | None = None, reported_step: int = 0
    ) -> TrialSubmitted:
        spec = self._spec
        confine_below(spec, self._folder, f"trials/{trial_id}")
        qualified = qualify(self._key, trial_id)
        work = replace(
            work,
            worker_group=self._key,
            metric=spec.metric.name,
            checkpoint_every=spec.storage.checkpoint_every,
            directory=str(spec.storage_dir / spec.name / "trials" / trial_id),
            durable=None if self._checkpoints is None else posixpath.join(self._checkpoints, qualified),
        )
        event = self._executor.submit(qualified, work, at=at, reported_step=reported_step)
        return replace(event, trial_id=trial_id)

    def now(self) -> float:
        return self._executor.now()


class PoolSession:
    """Runs every open experiment of ``store`` on one engine until ``stop``; see the module docstring.

    ``directory``: where relative paths of stored specs start, and the pool's own files (worker
    logs). ``engine``: ``local`` (this machine) or ``ray`` (every node of the Ray cluster at
    ``ray_address``, one agent per node as under ``engine: ray``; trials keep their files where
    their spec says, so the users' folders must be a shared mount on every node, and durable
    checkpoints go to ``storage_uri``, by default ``<directory>/pool/checkpoints``, each experiment's in a folder of
    its own there, named after its creation in the store: other stores' pools may share the URI).
    ``resources``: the pool's GPUs or CPU slots (default: the GPUs, else this machine's CPU slots;
    on Ray, ``gpus: none`` with ``cpu_slots`` runs that many on every node). ``poll``: seconds
    between looks at the store for submissions, cancellations and weights.
    ``quantum``: GPU seconds an experiment may be owed before the pool preempts for it.
    ``read_spec``: how a stored spec is read when the pool takes its experiment up (default: with
    relative paths from ``directory``; the server's places those of a root that moved, and the pool checks that
    the rest reads as stored); its SpecError fails the experiment (the server checks there
    that the spec still names only files in its owner's area), its SpecFilesMissing leaves it waiting (the
    server's, ``parse_present``: a workdir or module that is not there now may be back in a moment).
    """

    def __init__(
        self,
        store: ExperimentStore,
        directory: str | Path,
        *,
        engine: str = "local",
        resources: ResourcesSpec | None = None,
        ray_address: str = "auto",
        storage_uri: str | None = None,
        poll: float = 0.5,
        quantum: float = 60.0,
        read_spec: Callable[[ExperimentRecord], ExperimentSpec] | None = None,
    ) -> None:
        if engine not in ("local", "ray"):
            raise HermesError(f"a pool runs on the local or the ray engine, not {engine!r}")
        if not poll > 0:
            raise HermesError(f"poll must be positive, got {poll}")
        self.store = store
        self.directory = Path(directory).resolve()
        self.engine = engine
        self.resources = resources or ResourcesSpec()
        self.slots = slots_for(self.resources) if engine == "local" else []
        if storage_uri is not None and "://" not in storage_uri:  # a path: this process's, not each node's cwd's
            storage_uri = str(Path(storage_uri).resolve())
        self.storage_uri = storage_uri or str(self.directory / "pool" / "checkpoints")
        if engine == "ray":
            from hermes.ray.engine import connect
            from hermes.ray.storage import checked_store

            checked_store(self.storage_uri, "the pool's storage URI")
            connect(ray_address, "the pool's Ray address")
        self.poll = poll
        self.read_spec = read_spec or self._read_spec
        self.scheduler = PoolScheduler(quantum=quantum)
        self.members: dict[str, _Member] = {}
        self.executor: LocalExecutor | RayExecutor | None = None
        self._stopped = threading.Event()
        self._run_over = threading.Event()  # ``run`` has returned: its trials have ended, its sessions run no more
        self.running = threading.Event()  # ``run`` has taken up the store's open experiments, and has not stopped
        self.ran = False  # ``run`` took them up: an error after that is a new outage, not the same one again
        self._last_sync = -float("inf")
        self._shares: list[Share] = []  # replaced whole at each sync, so any thread may read it
        self._lock = PoolLock(self.directory / "pool")
        self._draining = False  # ``_drain`` runs: the calls it makes leave draining to it
        self._unsettled: dict[str, _Member] = {}  # experiments told events since their last commit (``_settle``)
        self._ended: list[str] = []  # experiments that ended since decisions were last carried out (``_apply``)
        self._trials_ended: list[str] = []  # trials the core runs no more, to tell the executor in ``_apply``
        self._waiting: dict[int, str] = {}  # experiments whose files are missing (``_wait``), by id: why
        self._started = 0.0  # the pool's clock when it started: the old pool's runs had ended by then

    @staticmethod
    def submit(store: ExperimentStore, spec: ExperimentSpec, *, owner: str = "", weight: float = 1.0) -> int:
        """Queue ``spec`` for a pool, stored as ``stored_form`` has it; return its experiment id. New input: its
        command's shell words are refused here, as ``hermes run`` and a server's submission refuse them."""
        refuse_shell_words(spec, f"experiment {spec.name}")
        return store.submit_experiment(spec.name, stored_form(spec), owner=owner, weight=weight)

    def gpus(self) -> int:
        """How many GPUs (or CPU slots) the pool has now; any thread. On Ray, those of the nodes that joined."""
        return len(self.scheduler.gpu_node) if self.executor is not None else len(self.slots)

    def shares(self) -> list[Share]:
        """The running experiments' fair share, as of the last look at the store (``poll``); any thread."""
        return self._shares

    def stop(self) -> None:
        """Make ``run`` return soon: its trials are stopped, its experiments stay open in the store."""
        self._stopped.set()
        executor = self.executor
        if executor is not None:
            executor.wake()

    def claim(self) -> None:
        """Hold the pool's directory and its store (``run`` does, if not done before): a second pool of the same
        directory or of the same store, a second server started by mistake, is refused before it takes over any
        experiment (StorageInUse, naming the first). Two pools on one store took each other's experiments."""
        if self._lock.held:
            return
        self._lock.acquire()
        try:
            self.store.claim_pool(self._lock.who)
        except BaseException:
            self._lock.release()
            raise

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Continue every open experiment of the store, take up new ones, until ``stop``."""
        self.claim()
        try:
            self._run()
        finally:
            self._run_over.set()
            self.store.release_pool()
            self._lock.release()

    def _run(self) -> None:
        # Every timeline goes on from there, none overlaps: the old pool's runs ended by then, before the new one's
        # nodes came (those of an experiment that cannot be taken up too, ``_end_old_runs``).
        started = self._started = self.store.latest_event_at()
        opened = [member for member in map(self._open, self._pool_records(_OPEN)) if member is not None]
        executor = self.executor = self._executor(started)
        stopped = False  # ``stop`` ended the loop, every call settled: no error left the core and the log apart
        try:
            # in the try: a host's thread limit left the executor (its guard process, its files) open at each restart
            start_thread(threading.Thread(target=self._tick, name="hermes-pool-poll", daemon=True))
            for member in opened:
                self._attach(member, started)
            self.ran = True
            self.running.set()
            while not self._stopped.is_set():
                self._sync()
                asking = any(member.session.asks_due for member in self.members.values())
                if asking:  # a search's next batch of submissions: no waiting for its trials' next event
                    executor.wake()
                events = executor.next_events()
                for event in events:
                    self._apply(self._call(lambda: self.scheduler.handle(event)), event.at)
                    executor.settled(event)
                if asking:
                    self._apply(self._drain(), executor.now())
                elif not events and executor.idle():
                    self._stopped.wait(self.poll)
            stopped = True
        finally:
            self.running.clear()
            self._stopped.set()
            executor.close()
            stopped_at = executor.now() if stopped else None  # its trials' processes have ended
            for member in self.members.values():
                if member.session.scheduler.finished or member.failed or member.lost:
                    continue
                try:
                    self.store.set_status(member.record.experiment_id, ExperimentStatus.INTERRUPTED)
                except HermesError:
                    log.exception("could not mark experiment %s interrupted", member.record.full_name)
            if stopped_at is not None:
                self._end_runs(stopped_at)
            try:  # after the marks: a store gone (the error that stopped the pool, say) fails this too
                self._save_accounts(stopped_at)
            except HermesError:
                log.exception("could not save the pool's fair-share accounts")

    def _end_runs(self, at: float) -> None:
        """Record in each experiment's log that this pool's nodes left at ``at``, its stop, as a restarted pool records
        the dead pool's (``_attach``, deciding nothing): the runs it stopped end when they stopped. Left to the next
        pool, they ended at the store's last event, and the GPU time after their last report (an epoch of minutes)
        was in neither the timeline nor the accounts. The next pool's clock starts after it. After an error the
        core and the log may differ (a write that failed): they are left to the next pool."""
        for member in self.members.values():
            scheduler = member.session.scheduler
            if member.lost or not scheduler.cluster.nodes:
                continue
            try:
                member.session.lose_old_nodes(tuple(NodeRemoved(at, node) for node in scheduler.cluster.nodes),
                                              member.recorder)
            except HermesError:
                log.exception("could not record the end of experiment %s's runs", member.record.full_name)

    def _executor(self, clock: float) -> LocalExecutor | RayExecutor:
        directory = self.directory / "pool"
        if self.engine == "local":
            return LocalExecutor(directory, slots=self.slots, clock_offset=clock)
        from hermes.ray.executor import RayExecutor

        resources = self.resources
        return RayExecutor(directory, storage_uri=self.storage_uri, clock_offset=clock,
                           cpu_slots=resources.cpu_slots if resources.gpus == "none" else None,
                           threads_per_slot=resources.threads_per_slot)

    def _tick(self) -> None:
        """Wake the executor every ``poll`` seconds, so that the store is read even while trials are quiet."""
        while not self._stopped.wait(self.poll):
            executor = self.executor
            if executor is not None:
                executor.wake()

    # ------------------------------------------------------------------ experiments in and out
    def _pool_records(self, statuses: tuple[ExperimentStatus, ...]) -> list[ExperimentRecord]:
        return [record for record in self.store.experiments(status=statuses) if record.owner is not None]

    def _read_spec(self, record: ExperimentRecord) -> ExperimentSpec:
        return parse_spec(record.spec, source=f"experiment {record.name}", base_dir=self.directory,
                          stored=ran_before(record))

    def _open(self, record: ExperimentRecord) -> _Member | None:
        """Build the experiment's session and replay its log; None if it cannot run (marked failed) or waits for
        its files (``_wait``). Any other error fails this experiment alone, with its reason: one experiment's files
        (links that loop, say) stopped the pool, and every start from the store met the same record again."""
        waited = self._waiting.pop(record.experiment_id, None)
        if record.cancel_requested and record.status is ExperimentStatus.QUEUED:
            self.store.set_status(record.experiment_id, ExperimentStatus.CANCELLED)
            return None
        try:
            spec = self.read_spec(record)
            if not ran_before(record):  # new input still, written to the store by any route: checked as such
                refuse_shell_words(spec, f"experiment {record.name}")
            if spec.name != record.name:
                raise HermesError(f"experiment {record.name}: its spec is named {spec.name!r}")
            if _paths_aside(record.spec) not in _read_forms(spec):
                raise HermesError(_read_differently(record, spec))
            if spec.engine != "local":
                raise HermesError(f"experiment {record.name}: engine: {spec.engine!r}; the pool decides where its "
                                  "trials run (leave engine out)")
            spec = spec.model_copy(update={"resources": self.resources})  # the pool's run it, not its spec's
            folder = (spec.storage_dir / spec.name).resolve()
            for below in ("hermes.lock", "trials"):  # before its session takes the lock
                confine_below(spec, folder, below)
            # Until this pool stops, its sessions keep their folders from each other (two experiments' folders may
            # coincide: one user's name linked to another's folder); a pool started again in this process takes
            # them over from a stopped one's sessions, which live on until collected.
            session = ExperimentSession(spec, store=self.store, experiment_id=record.experiment_id,
                                        host_runs=lambda: not self._run_over.is_set())
            session.replay()
            for trial_id in session.scheduler.trials:  # the folders its trials ran in, which they go on in
                confine_below(spec, folder, f"trials/{trial_id}")
            checkpoints = self._checkpoints(record) if self.engine == "ray" else None
        except SpecFilesMissing as error:
            self._wait(record, str(error), waited)
            return None
        except HermesError as error:
            log.warning("experiment %s cannot run: %s", record.full_name, error)
            reason = str(error)
        except Exception as error:  # a bug, or the machine's refusal: the traceback to the log, the kind to the record
            log.exception("experiment %s cannot run", record.full_name)
            why = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
            reason = f"the pool could not take it up: {why} (the traceback is in the pool's log)"
        else:
            return _Member(record, session, StoreRecorder(self.store, record.experiment_id, session.scheduler),
                           f"e{record.experiment_id}", folder, checkpoints)
        self._end_unopened(record, ExperimentStatus.FAILED, reason)
        return None

    def _checkpoints(self, record: ExperimentRecord) -> str:
        """The folder of the experiment's durable checkpoints under the storage URI: one of its own, named after its
        creation in this store (``experiment_uri``, as ``hermes run``'s). Keyed by its trials' qualified ids alone
        (``e1.0``), two servers' pools sharing one URI, or a store made anew beside the old checkpoints, overwrote
        each other's, and one's trial resumed from the other's state. One that ran before these folders keeps its
        checkpoints in the URI itself: ''."""
        from hermes.ray.storage import experiment_uri

        continued = bool(self.store.events_after(record.experiment_id, 0, limit=1))
        uri = experiment_uri(self.storage_uri, record.created_at, continued)
        return "" if uri == self.storage_uri else uri.rpartition("/")[2]

    def _wait(self, record: ExperimentRecord, missing: str, waited: str | None) -> None:
        """A file its spec names is missing (``SpecFilesMissing``): the experiment waits, queued or interrupted,
        its old runs ended, the reason in its ``error``, and the next look at the store tries again. Failed, it
        could never continue from its checkpoints, though the file was back a moment later (a shared mount not up
        yet when the server started). A cancel needs no files: it ends it."""
        if record.cancel_requested:
            self._end_unopened(record, ExperimentStatus.CANCELLED, None)
            return
        self._waiting[record.experiment_id] = missing
        if missing == waited:  # said at an earlier look
            return
        log.warning("experiment %s waits for its files: %s", record.full_name, missing)
        status = ExperimentStatus.QUEUED if record.status is ExperimentStatus.QUEUED else ExperimentStatus.INTERRUPTED
        self.store.claim_writer(record.experiment_id, describe(self._lock.who))
        self._end_old_runs(record, None)
        self.store.set_status(record.experiment_id, status, error=f"{WAITING_FOR_FILES}: {missing}; it continues "
                              f"once they are back (the pool looks every {self.poll:g} s)")

    def _end_unopened(self, record: ExperimentRecord, status: ExperimentStatus, reason: str | None) -> None:
        """Record the experiment ``status`` without taking it up: it may have run under a pool that died, so this
        pool writes its end now (or would stop on its claim), its old runs ended and its trials stopped first."""
        self.store.claim_writer(record.experiment_id, describe(self._lock.who))
        self._end_old_runs(record, reason or "cancelled on request")
        self.store.set_status(record.experiment_id, status, error=reason)

    def _end_old_runs(self, record: ExperimentRecord, stop: str | None) -> None:
        """Write the removal of the old pool's nodes into the log of an experiment this pool does not take up, as
        ``_attach`` does for one it takes up, and with ``stop`` a cancel that stops its trials: its runs stayed open,
        and the GPU timeline showed its owner holding those GPUs for ever, beside every later run on them. The log is
        replayed into a core of its own, deciding nothing (``hermes.recovery``); one that does not replay is left as
        it is."""
        at = self.executor.now() if self.executor is not None else self._started
        try:
            spec = parse_spec(record.spec, source=f"experiment {record.name}", stored=True)
            scheduler = Scheduler(make_policy("fifo"), max_failures=spec.trial.max_failures)
            replay(self.store, record.experiment_id, scheduler, lambda *_: None)
            if not scheduler.trials:
                return  # it never ran
            recorder = StoreRecorder(self.store, record.experiment_id, scheduler)
            for node in list(scheduler.cluster.nodes):
                removed = NodeRemoved(at, node)
                scheduler.replay(removed, ())
                recorder(removed, [])
            if stop is not None and not scheduler.finished:
                cancel = ExperimentCancelled(at, stop)
                recorder(cancel, scheduler.handle(cancel))
            recorder.flush()
        except Exception:  # as under ``_open``: one experiment's record never stops the pool
            log.exception("experiment %s: its old runs could not be ended", record.full_name)

    def _attach(self, member: _Member, now: float) -> None:
        """Resubmit its trials to the pool's executor, drop the old pool's nodes (at ``now``: for those the pool
        found open, when it started, before its own nodes came, so that no old run seems to end after a new one
        began on its GPU), and let it share the GPUs."""
        session, scheduler = member.session, member.session.scheduler
        experiment_id = member.record.experiment_id
        shared: Executor = _SharedExecutor(self.executor, member.key, session.spec,  # type: ignore[assignment]
                                           member.folder, member.checkpoints)
        session.host(shared, member.inbox.append)
        for trial in scheduler.trials.values():  # those it ran fall back to their checkpoints: the core knows that step
            shared.submit(trial.trial_id, session.engine.work(trial.params), at=trial.submitted_at,
                          reported_step=trial.catch_up_step)
        if not scheduler.finished:
            # the dead pool's runs died with it: its nodes go all at once, deciding nothing (as under ``hermes run``)
            session.lose_old_nodes(tuple(NodeRemoved(now, node) for node in scheduler.cluster.nodes), member.recorder)
        for trial in scheduler.trials.values():  # it submitted those that ended before too (``Engine.run``)
            if runs_no_more(trial):
                self.executor.trial_ended(qualify(member.key, trial.trial_id))
        if scheduler.finished:  # ended before, or its last trials were ending when the pool stopped: a cancel's stops
            self._finished(member)
            self._apply([], now)  # nothing to carry out: the executor forgets its trials now
            return
        self.members[member.key] = member
        self._set_period()
        self.store.set_status(experiment_id, ExperimentStatus.RUNNING)
        decisions = self._call(lambda: self.scheduler.add_experiment(
            member.key, scheduler, at=now, weight=member.record.weight, owner=member.record.owner or "",
            used=member.record.gpu_seconds_used, owed=member.record.gpu_seconds_owed,
        ))
        member.tenant = self.scheduler.tenants.get(member.key)  # None: it ended at once, charged nothing here
        self._apply(decisions + self._drain(), now)
        if member.record.cancel_requested:
            self._cancel(member, now)

    def _sync(self) -> None:
        """At most every ``poll`` seconds: take up submissions, cancellations and weight changes."""
        now = self.executor.now()
        if now - self._last_sync < self.poll:
            return
        self._last_sync = now
        known = {member.record.experiment_id: member for member in self.members.values()}
        for record in self._pool_records(_OPEN):
            member = known.get(record.experiment_id)
            if member is None:
                if record.status is ExperimentStatus.QUEUED or record.experiment_id in self._waiting:
                    opened = self._open(record)
                    if opened is not None:
                        self._attach(opened, self.executor.now())
                continue
            member.record = record
            tenant = self.scheduler.tenants.get(member.key)
            if record.cancel_requested and not member.cancelled:
                self._cancel(member, now)
            elif tenant is not None and tenant.weight != record.weight:
                self._apply(self._call(lambda: self.scheduler.set_weight(member.key, record.weight, now)), now)
        for owner, weight in self.store.owner_weights().items():
            if self.scheduler.owner_weights.get(owner, 1.0) != weight:
                self._apply(self._call(lambda: self.scheduler.set_owner_weight(owner, weight, now)), now)
        self._save_accounts(now)
        self._shares = [
            Share(member.record.experiment_id, member.record.name, tenant.owner, tenant.weight, len(tenant.gpus),
                  tenant.share, *self.scheduler.accounts(tenant, now))
            for member in self.members.values()
            for tenant in [self.scheduler.tenants.get(member.key)]
            if tenant is not None
        ]

    def _set_period(self) -> None:
        """Tick as often as the running experiment that asks most often (as under ``hermes run``): unmodified
        scripts that print rarely are preempted between their lines. Every experiment's core sees the ticks."""
        periods = [period for member in self.members.values()
                   if (period := tick_period(member.session.spec)) is not None]
        self.executor.set_period(min(periods, default=None))

    def _save_accounts(self, at: float | None) -> None:
        """Save the accounts charged up to ``at`` (``PoolScheduler.accounts``; None: up to the pool core's last call)."""
        self.store.save_accounts({
            member.record.experiment_id: self.scheduler.accounts(tenant, at)
            for member in self.members.values()
            for tenant in [self.scheduler.tenants.get(member.key)]
            if tenant is not None and not member.lost
        })

    def _cancel(self, member: _Member, now: float) -> None:
        member.cancelled = True
        if member.key in self.scheduler.tenants:
            event = ExperimentCancelled(now, "cancelled on request")
            self._apply(self._call(lambda: self.scheduler.tell(member.key, event)), now)

    # ------------------------------------------------------------------ the pool core's calls
    def _call(self, call: Any) -> list[Decision]:
        """One call of the pool core: record what each experiment's core handled, tell its session,
        fail the experiments whose plug-in failed, and hand the submissions that follow to the core too;
        return every decision to apply."""
        decisions: list[Decision] = call()
        failed = self.scheduler.failed  # the next call replaces it
        for routed in self.scheduler.routed:
            member = self._unsettled[routed.experiment] = self.members[routed.experiment]
            if not member.lost:
                member.recorder(routed.event, routed.decisions)
            member.session.after(routed.event, routed.decisions)
            ended = ended_trials(member.session.scheduler, routed.event, routed.decisions)
            self._trials_ended += [qualify(routed.experiment, trial_id) for trial_id in ended]
        for key, error in failed.items():  # its stops after what its core decided before it failed: each is answered
            decisions += self._fail(self.members[key], error)
        if self._draining:  # the drain settles once it has told its batch: a commit per batch, not per submission
            return decisions
        decisions += self._settle()
        return decisions + self._drain()

    def _settle(self) -> list[Decision]:
        """One commit per experiment touched, before any decision is applied; an experiment whose core finished
        ends. One that another writer took is dropped: return the stops of its trials."""
        unsettled, self._unsettled = self._unsettled, {}
        decisions: list[Decision] = []
        for member in unsettled.values():
            try:
                if not member.lost:
                    member.recorder.flush()
            except WriterLost as error:
                decisions += self._drop(member, error)
            if member.session.scheduler.finished and member.key in self.members:  # not ended by the drop already
                self._finished(member)
        return decisions

    def _drain(self) -> list[Decision]:
        """Tell each experiment's core what its session posted, then the submissions its searcher makes
        now: asked only once every event before them is told, as a replay of its log asks. A loop, not a
        recursion (the calls it makes leave draining to it): a search of thousands of trials submits them
        all at once."""
        if self._draining:
            return []
        self._draining = True
        decisions: list[Decision] = []
        asked: set[str] = set()  # one batch of submissions per experiment and drain: a big search goes in by turns
        try:
            told = True
            while told:
                told = False
                for member in list(self.members.values()):
                    while member.key in self.scheduler.tenants and not member.session.scheduler.finished:
                        if not member.inbox and member.key not in asked:
                            asked.add(member.key)
                            try:
                                member.inbox.extend(member.session.submissions(self.executor.now()))
                            except FolderLeadsOut as error:  # before the executor wrote anything there
                                decisions += self._fail(member, error)
                        if not member.inbox:
                            break
                        event = member.inbox.popleft()
                        decisions += self._call(lambda: self.scheduler.tell(member.key, event))
                        told = True
                    if member.key not in self.scheduler.tenants:
                        member.inbox.clear()
        finally:
            self._draining = False
        return decisions + self._settle()

    def _fail(self, member: _Member, error: PluginError | FolderLeadsOut) -> list[Decision]:
        """A policy or stopper of the experiment raised, or answered what its core cannot use, or a new trial's
        folder leads out of the experiment's: it fails alone, as under ``hermes run`` (recorded failed at once,
        with the error), and its core stops its trials, asking its plug-ins nothing more (a policy that raised may
        raise again, at the cancellation; FIFO never does)."""
        reason = f"{type(error).__name__}: {error}" if isinstance(error, PluginError) else str(error)
        log.warning("experiment %s failed: %s", member.record.full_name, reason)
        member.failed = True
        try:
            self.store.set_status(member.record.experiment_id, ExperimentStatus.FAILED, error=reason)
        except WriterLost as lost:
            return self._drop(member, lost)
        return self._stop_trials(member, reason)

    def _drop(self, member: _Member, error: WriterLost) -> list[Decision]:
        """Another writer took the experiment (a pool on the same store that was not refused, say): this pool
        writes to it no more, and stops its trials here as a cancel would; the others go on. The error stopped the
        whole pool, every user's experiments, at each of its restarts."""
        log.error("experiment %s leaves this pool, its trials here stop: %s", member.record.full_name, error)
        member.lost = True
        return self._stop_trials(member, str(error))

    def _stop_trials(self, member: _Member, reason: str) -> list[Decision]:
        """End the experiment, ``reason`` its failure: its core stops its trials, asking its plug-ins nothing more."""
        member.inbox.clear()  # trials it asked for that the core has not had: they never ran
        scheduler = member.session.scheduler
        scheduler.restore_policy(make_policy("fifo"), {})
        scheduler.stopper = None
        cancel = member.session.fail(reason, self.executor.now())
        if member.key not in self.scheduler.tenants:
            return []
        return self._call(lambda: self.scheduler.tell(member.key, cancel))

    def _apply(self, decisions: list[Decision], at: float) -> None:
        """Carry ``decisions`` out, then tell the executor which trials the calls that made them ended
        (``Executor.trial_ended``, after every decision, as ``Engine`` does); then the executor forgets the experiments
        that ended, their workers and their trials, once nothing more is carried out for them (a Stop of the call that
        ended one, say). It kept every trial of every experiment a server's pool ran: a KB each, for the pool's life."""
        for decision in decisions:
            self.executor.apply(decision, at)
        trials_ended, self._trials_ended = self._trials_ended, []
        for trial_id in trials_ended:
            self.executor.trial_ended(trial_id)
        ended, self._ended = self._ended, []
        for key in ended:
            self.executor.end_worker_group(key)

    def _finished(self, member: _Member) -> None:
        cancelled = member.cancelled or member.record.cancel_requested  # asked before the pool restarted, too
        status = ExperimentStatus.CANCELLED if cancelled else ExperimentStatus.FINISHED
        if member.session.failure is not None:  # its searcher raised
            status = ExperimentStatus.FAILED
        try:
            if not member.lost:
                if member.tenant is not None:  # charged up to its end; the last look at the store saved less
                    self.store.save_accounts({member.record.experiment_id: self.scheduler.accounts(member.tenant)})
                self.store.set_status(member.record.experiment_id, status, error=member.session.failure)
        except WriterLost as error:
            log.error("experiment %s leaves this pool: %s", member.record.full_name, error)
            member.lost = True
        self.members.pop(member.key, None)
        self.scheduler.finished_experiments.clear()  # the pool goes by each experiment's own core: it reads none
        self._ended.append(member.key)
        self._set_period()
        log.info("experiment %s %s", member.record.full_name, "left this pool" if member.lost else status.value)


def _read_differently(record: ExperimentRecord, spec: ExperimentSpec) -> str:
    """Why a stored spec that reads differently now cannot run, naming where: an older Hermes read YAML 1.1, where
    ``1e1`` is text and ``010`` is 8, so the same file gave another spec than this Hermes runs."""
    fields = min((differing_fields(_paths_aside(record.spec), form) for form in _read_forms(spec)), key=len)
    named = ", ".join(fields[:3]) + (f" and {len(fields) - 3} more" if len(fields) > 3 else "")
    return (f"experiment {record.name}: its stored spec reads differently now (in {named}): an older Hermes recorded "
            "it, which read the same text differently (YAML 1.1: 1e1 as text, 010 as 8), or it was stored by other "
            "means than PoolSession.submit; it cannot continue: submit it again under a new name (--name NEW)")


def _read_forms(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """The forms a stored spec that reads as ``spec`` may have (``stored_form``; ``model_dump``, before the limits
    were stored), its paths aside (``_paths_aside``)."""
    return [_paths_aside(stored_form(spec)), _paths_aside(spec.model_dump(mode="json"))]


def _paths_aside(data: dict[str, Any]) -> dict[str, Any]:
    """A stored spec less its workdir and storage dir, which ``read_spec`` places and checks where they lead: the
    server's reads those of a spec stored before its root moved in the owner's area now (``hermes.server.app``)."""
    aside = dict(data)
    for section, field in (("trial", "workdir"), ("storage", "dir")):
        part = aside.get(section)
        if isinstance(part, dict):
            aside[section] = {key: value for key, value in part.items() if key != field}
    return aside


class FolderLeadsOut(SpecError):
    """A folder or file that the pool makes below an experiment's folder resolves outside it (a link there)."""


def confine_below(spec: ExperimentSpec, folder: Path, below: str) -> None:
    """Raise FolderLeadsOut where ``below`` (a path under the spec's ``<storage.dir>/<name>``) resolves outside
    ``folder``, that folder as the pool took it up, or cannot be read; worded as the server's spec check words a
    refusal, never naming where a link leads: a user's link below their own experiment's folder to another user's
    had the pool write its trials there (their checkpoints deleted), or take that experiment's lock."""
    problem = place_problem(spec.storage_dir / spec.name / below, folder, named="the experiment's folder")
    if problem is not None:
        raise FolderLeadsOut(f"experiment {spec.name}: storage.dir: {f'{spec.name}/{below}'!r} {problem}; the pool "
                             "follows no link out of <storage.dir>/<name>: remove it, or give the experiment another "
                             "name")


class SpecFilesMissing(SpecError):
    """A file the spec names is not there now: its trial's workdir, or the module of its function. A pool takes
    that for a moment's absence (a shared mount not up yet, a ``git checkout`` under way): the experiment waits."""


def ran_before(record: ExperimentRecord) -> bool:
    """Whether a pool took the experiment up before: its stored spec ran as it is, and checks added since leave it so
    (``parse_spec(stored=True)``); a queued one never ran, and is checked as new input."""
    return record.status is not ExperimentStatus.QUEUED


def parse_present(data: dict[str, Any], *, source: str, base_dir: Path, stored: bool = False) -> ExperimentSpec:
    """``parse_spec`` against this machine from ``base_dir``; SpecFilesMissing where it fails for a missing file
    alone, its message that of the SpecError."""
    try:
        return parse_spec(data, source=source, base_dir=base_dir, stored=stored)
    except SpecError as error:
        if not _files_missing(data, source, base_dir, stored):
            raise
        raise SpecFilesMissing(str(error), error.problems) from None


def _files_missing(data: dict[str, Any], source: str, base_dir: Path, stored: bool) -> bool:
    """Whether the spec's document is sound and its workdir, or its function's module, is nowhere: not a loop of
    links or a folder that may not be searched, which stay as they are until someone mends them."""
    try:
        spec = parse_spec(data, source=source, stored=stored)
    except SpecError:
        return False
    try:
        workdir = base_dir / Path(spec.trial.workdir).expanduser()
        workdir.stat()
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, RuntimeError):  # RuntimeError: ~user of no user here
        return False
    function = spec.trial.function
    return function is not None and not workdir_files(function, workdir) and not installed_files(function)


def stored_form(spec: ExperimentSpec) -> dict[str, Any]:
    """A spec as a pool's store keeps it: as a runner's (``model_dump``), and with the limits of its trials
    (``trial.timeout`` and ``trial.stall``), which a runner's store leaves out so that a rerun may change
    them; a pool has only the store to read them from."""
    data = spec.model_dump(mode="json")
    data["trial"] |= {"timeout": spec.trial.timeout, "stall": spec.trial.stall.model_dump(mode="json")}
    return data


def main(argv: list[str] | None = None) -> None:
    """``python -m hermes.pool --store URL --dir DIR [--ray ADDRESS]``: a pool session until SIGTERM or Ctrl-C.
    A usage error ends it as the ``hermes`` command does: one ``hermes: error:`` line naming the option, exit 2."""
    import argparse
    import math
    import signal
    import sys

    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from hermes.store.sql import SqlStore

    parser = argparse.ArgumentParser(
        prog="python -m hermes.pool",
        description="Run a pool session: every experiment of a store (those submitted to it), shared fairly on "
                    "this machine's GPUs or CPU slots, or on every node of a Ray cluster, until SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--store", required=True, help="database URL, e.g. sqlite:///srv/hermes/hermes.db")
    parser.add_argument("--dir", required=True, help="where relative paths of specs start")
    parser.add_argument("--cpu-slots", type=int, help="run this many CPU slots instead of the GPUs (on Ray: each node)")
    parser.add_argument("--ray", metavar="ADDRESS", help="run on every node of this Ray cluster (auto: this machine's)")
    parser.add_argument("--storage-uri", help="on Ray, where durable checkpoints go (default: DIR/pool/checkpoints)")
    parser.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                        help="how often the store is read for new experiments, weights and cancels (default: 0.5)")
    args = parser.parse_args(argv)
    store: SqlStore | None = None
    try:
        if not 0 < args.poll < math.inf:
            raise HermesError(f"--poll: must be a positive number of seconds, got {args.poll:g}")
        if not Path(args.dir).is_dir():
            raise HermesError(f"--dir: {args.dir!r} is not a folder")
        try:
            resources = ResourcesSpec(gpus="none", cpu_slots=args.cpu_slots) if args.cpu_slots is not None else None
        except ValidationError as error:
            raise HermesError(f"--cpu-slots: {error.errors()[0]['msg']}, got {args.cpu_slots}") from None
        try:
            store = SqlStore(args.store)
        except (SQLAlchemyError, OSError) as error:  # not a URL (ArgumentError), no driver, a database not there
            raise HermesError(f"--store: {str(error).splitlines()[0]}") from None
        pool = PoolSession(store, args.dir, engine="ray" if args.ray else "local", resources=resources,
                           ray_address=args.ray or "auto", storage_uri=args.storage_uri, poll=args.poll)
        signal.signal(signal.SIGTERM, lambda *_: pool.stop())
        signal.signal(signal.SIGINT, lambda *_: pool.stop())
        if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # its terminal closed; under nohup, ignored still
            signal.signal(signal.SIGHUP, lambda *_: pool.stop())
        pool.run()
    except HermesError as error:
        print(f"hermes: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # before the pool took Ctrl-C over (while Ray started, say)
        raise SystemExit(130) from None
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    main()
