"""ExperimentStore on SQLAlchemy Core: SQLite by default, any SQL database SQLAlchemy speaks by URL.

JSON columns are plain text written by Python's ``json`` (NaN and infinities allowed, since a
diverged trial reports them), so every backend stores them alike.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.pool import StaticPool

from hermes import __version__
from hermes.core.decisions import Decision
from hermes.core.events import Event, TrialReported
from hermes.core.share import MAX_WEIGHT, MIN_WEIGHT
from hermes.core.states import TrialState
from hermes.errors import NO_SPACE_ERRNOS, HermesError
from hermes.faults import crash_point
from hermes.store.base import (
    DamagedRecord,
    DecisionRecord,
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    NameTaken,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TooManyExperiments,
    TrialRecord,
    WriterLost,
)
from hermes.store.codec import from_dict, to_dict
from hermes.store.lock import LOCK_FILE, RunnerLock, StorageInUse, describe, holder

log = logging.getLogger(__name__)

METADATA = sa.MetaData()

# The layout of the tables below. One more at each change that an older Hermes would misread or miswrite (a column it
# would not fill, an event type or a status it does not know): it then refuses the store (``_check_version``) instead.
# A store made before the stamp holds no version (``_ensure_layout``).
SCHEMA_VERSION = 1
SCHEMA = sa.Table(  # one row: the version of the store's layout. A table, not SQLite's user_version: PostgreSQL too
    "hermes_schema",
    METADATA,
    sa.Column("version", sa.Integer, nullable=False),
)

EXPERIMENTS = sa.Table(
    "experiments",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False, unique=True),  # its key: ``_key``
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
)
EVENTS = sa.Table(
    "events",
    METADATA,
    sa.Column("experiment_id", sa.ForeignKey("experiments.id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("data", sa.Text, nullable=False),
)
DECISIONS = sa.Table(
    "decisions",
    METADATA,
    sa.Column("experiment_id", sa.Integer, primary_key=True),
    sa.Column("event_seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),  # order among the event's decisions
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("trial_id", sa.String(255), nullable=False),
    sa.Column("gpu", sa.String(255)),  # Start and Resume only
    sa.Column("data", sa.Text, nullable=False),
    sa.ForeignKeyConstraint(["experiment_id", "event_seq"], ["events.experiment_id", "events.seq"]),
)
TRIALS = sa.Table(
    "trials",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),  # insertion order
    sa.Column("experiment_id", sa.ForeignKey("experiments.id"), nullable=False),
    sa.Column("trial_id", sa.String(255), nullable=False),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("budget", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("checkpoint_step", sa.Integer, nullable=False),
    sa.Column("gpu", sa.String(255)),
    sa.Column("error", sa.Text),
    sa.Column("submitted_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    sa.UniqueConstraint("experiment_id", "trial_id"),
)
METRICS = sa.Table(
    "metrics",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),  # report order
    sa.Column("experiment_id", sa.ForeignKey("experiments.id"), nullable=False),
    sa.Column("trial_id", sa.String(255), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("metric_values", sa.Text, nullable=False),
    sa.Index("metrics_once_per_step", "experiment_id", "trial_id", "step", unique=True),
)

WRITERS = sa.Table(
    "writers",
    METADATA,
    sa.Column("experiment_id", sa.ForeignKey("experiments.id"), primary_key=True),
    sa.Column("epoch", sa.Integer, nullable=False),  # one more at each claim: the latest claimant writes
    sa.Column("holder", sa.Text, nullable=False),  # who claimed it, for the error its predecessor gets
    sa.Column("since", sa.Float, nullable=False),
)

# The statements of every recorded event, built once: building one costs more than running it.
_UPDATE_TRIAL = TRIALS.update().where(
    TRIALS.c.experiment_id == sa.bindparam("of_experiment"), TRIALS.c.trial_id == sa.bindparam("of_trial")
)
_INSERT_METRICS_ONCE = {  # by dialect; another dialect looks for the step first
    "sqlite": sqlite_insert(METRICS).on_conflict_do_nothing(),
    "postgresql": postgresql_insert(METRICS).on_conflict_do_nothing(),
}
_IDS_PER_QUERY = 500  # trial ids in one IN (...): well below every backend's limit on bound parameters
_LAST_SEQ = sa.select(EVENTS.c.experiment_id, sa.func.max(EVENTS.c.seq).label("seq")).group_by(
    EVENTS.c.experiment_id
).subquery()
_LAST_EVENTS = sa.select(EVENTS.c.experiment_id, EVENTS.c.seq, EVENTS.c.at).join(  # each log's last, on the primary key
    _LAST_SEQ, (EVENTS.c.experiment_id == _LAST_SEQ.c.experiment_id) & (EVENTS.c.seq == _LAST_SEQ.c.seq)
)
_WRITER = sa.select(WRITERS.c.epoch, WRITERS.c.holder).where(WRITERS.c.experiment_id == sa.bindparam("of_experiment"))

# What a pool needs besides the experiment (owner, weight, a cancellation asked for) and why an
# experiment failed: a table of its own, so that stores written before it existed open unchanged.
EXPERIMENT_SETTINGS = sa.Table(
    "experiment_settings",
    METADATA,
    sa.Column("experiment_id", sa.ForeignKey("experiments.id"), primary_key=True),
    sa.Column("owner", sa.String(255)),  # NULL: not a pool's experiment
    sa.Column("weight", sa.Float, nullable=False),
    sa.Column("cancel_requested", sa.Boolean, nullable=False),
    sa.Column("error", sa.Text),
    # added after the table: a server default, so that ALTER TABLE can add them to a store without them; and written
    # by each insert, as the releases before did: their tables have no server default (an insert without them failed)
    sa.Column("gpu_seconds_used", sa.Float, nullable=False, default=0.0, server_default="0"),
    sa.Column("gpu_seconds_owed", sa.Float, nullable=False, default=0.0, server_default="0"),
)
OWNER_WEIGHTS = sa.Table(
    "owner_weights",
    METADATA,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("weight", sa.Float, nullable=False),
)

_SETTINGS_READ = ("owner", "weight", "cancel_requested", "error", "gpu_seconds_used", "gpu_seconds_owed")


def _select_experiments(settings: Collection[str] = tuple(EXPERIMENT_SETTINGS.c.keys())) -> sa.Select[Any]:
    """Experiments with their settings, of a store whose settings table holds the columns ``settings`` (none: it has
    no such table): a setting it lacks, as a store an older Hermes wrote does, reads as NULL, its default."""
    columns = [EXPERIMENT_SETTINGS.c[name] if name in settings else sa.null().label(name) for name in _SETTINGS_READ]
    if "experiment_id" not in settings:
        return sa.select(EXPERIMENTS, *columns)
    joined = EXPERIMENTS.outerjoin(EXPERIMENT_SETTINGS, EXPERIMENT_SETTINGS.c.experiment_id == EXPERIMENTS.c.id)
    return sa.select(EXPERIMENTS, *columns).select_from(joined)


_EXPERIMENT_ROWS = _select_experiments()

_MISSING = object()

SQLITE_MAX_PATHNAME = 512  # SQLite's longest path, in bytes (as ``hermes.experiment.spec`` checks a runner's store)
POOL_LOCK_SUFFIX = ".pool.lock"  # beside a SQLite file: ``hermes.db.pool.lock``, held by the store's pool
POOL_LOCK_KEY = int.from_bytes(b"hermpool")  # PostgreSQL's advisory lock that the store's pool holds
ACTIVE_LOCK_SPACE = int.from_bytes(b"hact")  # PostgreSQL's advisory locks that count an owner's experiments
SCHEMA_LOCK_KEY = int.from_bytes(b"hermschm")  # and the one held while a store's tables are made or brought up
_POOL_HOLDER = sa.text(  # who holds that lock: the session, and its application name (``_pool_name``)
    "SELECT a.application_name, a.client_addr, a.backend_start "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::bigint = :high AND l.objid::bigint = :low"
).bindparams(high=POOL_LOCK_KEY >> 32, low=POOL_LOCK_KEY & 0xFFFFFFFF)


class SqlStore(ExperimentStore):
    """``SqlStore("sqlite:///runs/hermes.db")``; ``"sqlite://"`` keeps everything in memory.

    SQLite runs in WAL mode with ``synchronous=FULL``: readers (a dashboard) never block the
    runner, and each commit is on disk before the call returns. Calls from the threads of one
    process are serialised by a lock; write transactions take SQLite's write lock up front
    (``BEGIN IMMEDIATE``) so that concurrent processes wait for each other instead of failing.

    Opening a store brings an older layout up to this one (``_ensure_layout``), and refuses one a newer Hermes
    stamped (``SCHEMA_VERSION``) before writing anything to it.
    """

    _experiment_rows = _EXPERIMENT_ROWS  # experiments with their settings

    def __init__(self, url: str = "sqlite:///hermes.db") -> None:
        parsed = sa.make_url(url)
        # in messages: a file name that is not UTF-8 (its lone surrogates, ``os.fsdecode``) cannot be quoted as it is
        shown = parsed.set(database=_storable(parsed.database)) if parsed.database else parsed
        self.url = shown.render_as_string(hide_password=True)
        options: dict[str, Any] = {"pool_pre_ping": True}  # a server's connections outlive a PostgreSQL restart
        new_file = None  # a SQLite file not made yet
        if parsed.get_backend_name() == "sqlite":
            if parsed.database in (None, "", ":memory:"):
                # One shared connection, or each thread would see its own empty database.
                options = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
            else:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
                options = {"connect_args": {"timeout": 60.0}}
                new_file = None if Path(parsed.database).exists() else Path(parsed.database)
        self._engine = sa.create_engine(parsed, **options)
        if parsed.get_backend_name() == "sqlite":
            _configure_sqlite(self._engine)
        self._lock = threading.RLock()
        self._epochs: dict[int, int] = {}  # experiment id -> the epoch this object claimed it with
        self._last_seq: dict[int, int] = {}  # of the experiments claimed: the last event's sequence number
        self._pool_claim: RunnerLock | sa.Connection | None = None  # ``claim_pool``'s lock file, or its session
        self._left_out: set[tuple[int, str]] = set()  # damaged experiments ``experiments`` warned of
        try:
            if new_file is not None:
                self._make_whole(parsed, new_file)
            with self._writing() as connection:  # one writer at a time creates the tables, or brings them up to date
                _ensure_layout(connection, self.location)
        except StoreError:
            self._engine.dispose()
            raise

    def _make_whole(self, parsed: sa.URL, path: Path) -> None:
        """Make a new SQLite store, its tables and WAL mode in place, in a file of its own beside ``path``, and only
        then link it there: made in place, it held no tables at first, and a rollback journal while it switched to
        WAL, so that a runner killed then left a store that readers (`hermes status`) refused for a false reason (a
        copy without its -wal, a read-only file). One that another process placed there meanwhile is kept. Where the
        folder takes no second name for a file (no hard links: some network and FUSE file systems), or where that
        file's journal would pass SQLite's longest path, the store is made in place, as before."""
        made = path.with_name(f".{path.name}.{secrets.token_hex(4)}")  # hidden: no experiment's name
        if len(os.fsencode(f"{made.absolute()}-journal")) > SQLITE_MAX_PATHNAME:
            return
        engine = sa.create_engine(parsed.set(database=str(made)), connect_args={"timeout": 60.0})
        _configure_sqlite(engine)
        try:
            with self._failures_as_store_errors(), engine.connect() as connection:
                connection.execution_options(hermes_write=True)
                with connection.begin():
                    _ensure_layout(connection, self.location)
            engine.dispose()  # its last connection closes: SQLite moves the -wal into the file, and removes it
            os.link(made, path)
            made.unlink()
            _sync_folder(path.parent)
        except OSError:  # FileExistsError: another process made it first; any other: no hard links here
            pass
        finally:
            engine.dispose()
            for leftover in ("", "-wal", "-shm", "-journal"):
                Path(f"{made}{leftover}").unlink(missing_ok=True)

    @classmethod
    def open_read_only(cls, path: str | Path) -> SqlStore:
        """The store in an existing SQLite file, for readers (reports): opened read-only (``connect_read_only``),
        so nothing is ever written to it, not even the schema; a missing file, one that holds no
        Hermes store, or one a newer Hermes wrote, raises StoreError. Its write methods raise StoreError too.
        An older layout is read as it is."""
        path = Path(path).resolve()
        store = cls.__new__(cls)
        store.url = f"sqlite:///{path}"
        store._engine = sa.create_engine("sqlite://", creator=lambda: connect_read_only(path))

        @sa.event.listens_for(store._engine, "connect")
        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # so that each read is one snapshot (BEGIN below)

        @sa.event.listens_for(store._engine, "begin")
        def on_begin(connection: sa.Connection) -> None:
            connection.exec_driver_sql("BEGIN")

        store._lock = threading.RLock()
        store._epochs, store._last_seq, store._pool_claim, store._left_out = {}, {}, None, set()
        try:
            with store._reading() as connection:
                inspector = sa.inspect(connection)
                found = inspector.has_table(EXPERIMENTS.name)
                if found:
                    _check_version(connection, store.location)
                    # read as it is: what an older Hermes did not write reads as its default
                    store._experiment_rows = _select_experiments(_columns(inspector, EXPERIMENT_SETTINGS.name))
            if not found:  # a copy of the file alone, made while a run wrote, has its tables still in the -wal file
                wal = "" if Path(f"{path}-wal").exists() else (
                    f"; a copy made while a run wrote needs {Path(path).name}-wal beside it (or `sqlite3 "
                    f"{Path(path).name} .backup copy.db` makes one whole)")
                raise StoreError(f"{path} holds no Hermes store (it has no {EXPERIMENTS.name} table){wal}")
        except StoreError:
            store.close()
            raise
        return store

    # ------------------------------------------------------------------ experiments
    def create_or_open_experiment(self, name: str, spec: Mapping[str, Any], may_change: Collection[str] = ()) -> int:
        if not name:
            raise StoreError("an experiment needs a non-empty name")
        spec_json = _dumps(spec)
        with self._writing() as connection:
            row = connection.execute(self._experiment_rows.where(EXPERIMENTS.c.name == name)).first()
            if row is None:
                inserted = connection.execute(
                    EXPERIMENTS.insert().values(
                        name=name, spec=spec_json, created_at=time.time(), status=ExperimentStatus.RUNNING.value
                    )
                )
                return int(inserted.inserted_primary_key[0])  # type: ignore[index]  # set by a one-row insert
            try:
                stored = self._experiment(row)
            except DamagedRecord as error:
                raise DamagedRecord(f"{error}; experiment {name!r} cannot go on from it, and was left as it was: "
                                    "correct that value, or restore the store from a backup", error.record) from None
            differences = differing_fields(stored.spec, json.loads(spec_json))
            allowed = (*may_change, *_FREE)
            # Only what may not change is named: listing an allowed change too would ask to undo it.
            refused = [d for d in differences if not (d in allowed or d.startswith(tuple(f"{a}." for a in allowed)))]
            if refused:
                given = json.loads(spec_json)
                held = "; ".join(shown for path in refused if (shown := _stored_and_given(stored.spec, given, path)))
                reordered = {path: orders for path, orders in _reordered(stored.spec, given).items()
                             if _order_field(path) in refused}
                orders = "; ".join(f"its store orders {path} as {', '.join(before)} (now {', '.join(after)})"
                                   for path, (before, after) in reordered.items())
                read_otherwise = len(refused) > len(reordered)  # YAML 1.1 read values otherwise, never an order
                raise StoreError(
                    f"experiment {name!r} already exists in {self.url} with a different spec "
                    f"(differs in {', '.join(refused)}); give it a new name (hermes run SPEC --name NEW, or "
                    "hermes.run(spec, name=...)) or use another storage dir to start anew"
                    + (f"; its store holds {held}: a spec that gives those, as Hermes reads them now, continues it"
                       if held else "")
                    + (f"; {orders}: a spec in that order continues it" if orders else "")
                    + ("; a spec not edited since may have been read differently by the Hermes that recorded it "
                       "(YAML 1.1: 010, 1e-4, yes/no/on/off)" if read_otherwise else "")
                )
            if differences:
                connection.execute(EXPERIMENTS.update().where(EXPERIMENTS.c.id == row.id).values(spec=spec_json))
            return int(row.id)

    def experiment(self, experiment_id: int) -> ExperimentRecord:
        with self._reading() as connection:
            row = connection.execute(self._experiment_rows.where(EXPERIMENTS.c.id == experiment_id)).first()
        if row is None:
            raise StoreError(f"no experiment with id {experiment_id} in {self.url}")
        return self._experiment(row)

    def experiments(
        self, status: ExperimentStatus | Collection[ExperimentStatus] | None = None
    ) -> list[ExperimentRecord]:
        """A damaged one is left out, named in a warning: a runner looks for its own experiment here, and a pool or a
        server lists every user's, so one experiments row edited by hand stopped them all."""
        query = self._experiment_rows.order_by(EXPERIMENTS.c.id)
        if status is not None:
            wanted = [status] if isinstance(status, (str, ExperimentStatus)) else list(status)
            query = query.where(EXPERIMENTS.c.status.in_([ExperimentStatus(one).value for one in wanted]))
        with self._reading() as connection:
            rows = connection.execute(query).all()
        records = []
        for row in rows:
            try:
                records.append(self._experiment(row))
            except DamagedRecord as error:
                self._leave_out(row.id, error)
        return records

    def _leave_out(self, experiment_id: int, error: DamagedRecord) -> None:
        """Say once per store object that ``experiments`` leaves the experiment out, and why: a pool or a server
        lists them every few seconds."""
        if (experiment_id, error.record) not in self._left_out:
            self._left_out.add((experiment_id, error.record))
            log.warning("experiment %s is left out of the experiments listed: %s; correct that value, or restore "
                        "the store from a backup", experiment_id, error)

    def set_status(self, experiment_id: int, status: ExperimentStatus, error: str | None = None) -> None:
        with self._writing() as connection:
            self._require_writer(connection, experiment_id)
            updated = connection.execute(
                EXPERIMENTS.update()
                .where(EXPERIMENTS.c.id == experiment_id)
                .values(status=ExperimentStatus(status).value)
            )
            if not updated.rowcount:
                raise StoreError(f"no experiment with id {experiment_id} in {self.url}")
            if error is not None:
                self._set_settings(connection, experiment_id, error=_storable(error))
            elif ExperimentStatus(status) is not ExperimentStatus.FAILED:  # why it failed is past: it ran on
                connection.execute(
                    EXPERIMENT_SETTINGS.update()
                    .where(EXPERIMENT_SETTINGS.c.experiment_id == experiment_id)
                    .values(error=None)
                )

    # ------------------------------------------------------------------ a pool's experiments
    def submit_experiment(self, name: str, spec: Mapping[str, Any], owner: str = "", weight: float = 1.0,
                          max_active: int | None = None) -> int:
        if not name:
            raise StoreError("an experiment needs a non-empty name")
        _check_weight(weight)
        spec_json = _dumps(spec)
        if "/" in str(owner):
            raise StoreError(f"an owner's name cannot hold a '/': {owner!r}")
        key = _key(name, str(owner))
        with self._writing() as connection:
            # Before names were per owner, a pool's experiment was keyed by its name alone.
            taken = connection.execute(self._experiment_rows.where(EXPERIMENTS.c.name.in_({key, name}))).all()
            already = NameTaken(f"an experiment named {name!r} exists already in {self.url}"
                                + (f" (of {owner})" if owner else ""))
            if any(row.name == key or row.owner == owner for row in taken):
                raise already
            if max_active is not None:
                self._check_active(connection, str(owner), max_active)
            try:
                inserted = connection.execute(
                    EXPERIMENTS.insert().values(
                        name=key, spec=spec_json, created_at=time.time(), status=ExperimentStatus.QUEUED.value
                    )
                )
            except sa.exc.IntegrityError as error:  # a submission of that name committed since: its unique key
                if _unique_violation(error):
                    raise already from error
                raise
            experiment_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]  # set by a one-row insert
            self._set_settings(connection, experiment_id, owner=str(owner), weight=float(weight))
            return experiment_id

    def set_weight(self, experiment_id: int, weight: float) -> None:
        _check_weight(weight)
        with self._writing() as connection:
            self._require(connection, experiment_id)
            self._set_settings(connection, experiment_id, weight=float(weight))

    def request_cancel(self, experiment_id: int) -> None:
        with self._writing() as connection:
            self._require(connection, experiment_id)
            self._set_settings(connection, experiment_id, cancel_requested=True)

    def save_accounts(self, accounts: Mapping[int, tuple[float, float]]) -> None:
        with self._writing() as connection:
            for experiment_id, (used, owed) in accounts.items():
                self._require(connection, experiment_id)
                self._set_settings(
                    connection, experiment_id, gpu_seconds_used=float(used), gpu_seconds_owed=float(owed)
                )

    def set_owner_weight(self, owner: str, weight: float) -> None:
        _check_weight(weight)
        with self._writing() as connection:
            updated = connection.execute(
                OWNER_WEIGHTS.update().where(OWNER_WEIGHTS.c.owner == owner).values(weight=float(weight))
            )
            if not updated.rowcount:
                connection.execute(OWNER_WEIGHTS.insert().values(owner=owner, weight=float(weight)))

    def owner_weights(self) -> dict[str, float]:
        with self._reading() as connection:
            rows = connection.execute(sa.select(OWNER_WEIGHTS).order_by(OWNER_WEIGHTS.c.owner)).all()
        return {row.owner: row.weight for row in rows}

    @staticmethod
    def _check_active(connection: sa.Connection, owner: str, max_active: int) -> None:
        if connection.dialect.name == "postgresql":  # SQLite's write transactions are one at a time already
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:owner))"),
                               {"space": ACTIVE_LOCK_SPACE, "owner": owner})
        unfinished = [status.value for status in ExperimentStatus if not status.is_final]
        active = connection.execute(
            sa.select(sa.func.count())
            .select_from(EXPERIMENTS.join(EXPERIMENT_SETTINGS, EXPERIMENT_SETTINGS.c.experiment_id == EXPERIMENTS.c.id))
            .where(EXPERIMENT_SETTINGS.c.owner == owner, EXPERIMENTS.c.status.in_(unfinished))
        ).scalar_one()
        if active >= max_active:
            raise TooManyExperiments(f"{owner} has {active} experiments queued, running or interrupted, the most "
                                     f"allowed ({max_active})")

    @staticmethod
    def _set_settings(connection: sa.Connection, experiment_id: int, **values: Any) -> None:
        updated = connection.execute(
            EXPERIMENT_SETTINGS.update().where(EXPERIMENT_SETTINGS.c.experiment_id == experiment_id).values(**values)
        )
        if not updated.rowcount:
            connection.execute(
                EXPERIMENT_SETTINGS.insert().values(
                    **{"experiment_id": experiment_id, "weight": 1.0, "cancel_requested": False, **values}
                )
            )

    def claim_writer(self, experiment_id: int, holder: str) -> None:
        with self._writing() as connection:
            self._require(connection, experiment_id)
            epoch = connection.execute(
                sa.select(WRITERS.c.epoch).where(WRITERS.c.experiment_id == experiment_id)
            ).scalar_one_or_none()
            values = {"epoch": (epoch or 0) + 1, "holder": _storable(holder), "since": time.time()}
            if epoch is None:
                connection.execute(WRITERS.insert().values(experiment_id=experiment_id, **values))
            else:
                connection.execute(WRITERS.update().where(WRITERS.c.experiment_id == experiment_id).values(**values))
        self._epochs[experiment_id] = values["epoch"]
        self._last_seq.pop(experiment_id, None)

    # ------------------------------------------------------------------ the store's pool
    def claim_pool(self, who: dict[str, Any]) -> None:
        """SQLite: an exclusive lock on a file beside the database (``POOL_LOCK_SUFFIX``), as a runner holds its
        storage dir; PostgreSQL: a session-level advisory lock, on a connection of its own. Either ends with its
        process, however it ends. An in-memory database is this object's alone."""
        if self._pool_claim is not None:
            return
        url = self._engine.url
        if url.get_backend_name() == "postgresql":
            self._pool_claim = self._advisory_lock(who)
        elif url.get_backend_name() != "sqlite":
            raise StoreError(f"{self.url}: a pool runs on SQLite or PostgreSQL, not {url.get_backend_name()}")
        elif url.database not in (None, "", ":memory:"):
            self._pool_claim = self._pool_file_lock(Path(url.database).resolve(), who)

    @staticmethod
    def _pool_file_lock(database: Path, who: dict[str, Any]) -> RunnerLock:
        lock = RunnerLock(database.parent)
        lock.path, lock.who = database.with_name(database.name + POOL_LOCK_SUFFIX), who
        try:
            return lock.acquire()
        except StorageInUse:
            raise StorageInUse(f"the store {database} is in use by another pool, {describe(holder(lock.path))}; "
                               "one pool per store: stop it, or give this pool a store of its own") from None

    def _advisory_lock(self, who: dict[str, Any]) -> sa.Connection:
        with self._failures_as_store_errors():
            connection = self._engine.connect()
            try:
                connection.execute(sa.text("SELECT set_config('application_name', :name, false)"),
                                   {"name": _pool_name(who)})
                held = connection.execute(sa.text("SELECT pg_try_advisory_lock(CAST(:key AS bigint))"),
                                          {"key": POOL_LOCK_KEY}).scalar_one()
                by = None if held else connection.execute(_POOL_HOLDER).first()
                connection.commit()  # no transaction open for the pool's life
            except BaseException:
                connection.invalidate()  # its session ends: the lock, if taken, with it
                connection.close()
                raise
        if held:
            return connection
        connection.invalidate()
        connection.close()
        named = "a session that is ending" if by is None else (
            f"{by.application_name or 'a session'} (its PostgreSQL session from {by.client_addr or 'a local socket'}, "
            f"since {by.backend_start:%Y-%m-%d %H:%M:%S})")
        raise StorageInUse(f"the store {self.url} is in use by another pool, {named}; "
                           "one pool per store: stop it, or give this pool a store of its own")

    def release_pool(self) -> None:
        claim, self._pool_claim = self._pool_claim, None
        if isinstance(claim, RunnerLock):
            claim.release()
        elif claim is not None:
            claim.invalidate()  # its session ends, and the advisory lock with it
            claim.close()

    # ------------------------------------------------------------------ event log and decisions
    def append_event(self, experiment_id: int, event: Event, decisions: Sequence[Decision] = ()) -> int:
        data = _dumps(to_dict(event, defaults=False))
        rows = _decision_rows(experiment_id, decisions, event.at)
        with self._writing() as connection:
            self._require_writer(connection, experiment_id)
            seq = self._last_seq_in(connection, experiment_id) + 1
            self._insert_event(connection, experiment_id, seq, event, data, rows)
        self._committed(experiment_id, seq)
        return seq

    def record_events(
        self, experiment_id: int, records: Sequence[tuple[Event, Sequence[Decision], Sequence[TrialRecord]]]
    ) -> list[int]:
        """One transaction, a statement per table: a search of 20,000 trials is submitted as one batch of
        events, and a statement per row took most of its start."""
        prepared = [self._prepared(experiment_id, *record) for record in records]
        seqs: list[int] = []
        events: list[dict[str, Any]] = []
        decisions: list[dict[str, Any]] = []
        metrics: list[dict[str, Any]] = []
        trials: dict[str, dict[str, Any]] = {}  # each trial's newest record, in the order trials first appear
        with self._writing() as connection:
            self._require_writer(connection, experiment_id)
            seq = self._last_seq_in(connection, experiment_id)
            for event, data, rows, values, trial_values in prepared:
                seq += 1
                if values is not None:
                    metrics.append({"experiment_id": experiment_id, "trial_id": event.trial_id, "step": event.step,
                                    "at": event.at, "metric_values": values})
                events.append({"experiment_id": experiment_id, "seq": seq, "at": event.at,
                               "type": type(event).__name__, "data": data})
                decisions.extend({**row, "event_seq": seq} for row in rows)
                trials.update(trial_values)
                seqs.append(seq)
            if metrics:
                self._record_metrics(connection, metrics)
                crash_point("report")  # between reports' metrics and their events, in one transaction
            connection.execute(EVENTS.insert(), events)
            if decisions:
                connection.execute(DECISIONS.insert(), decisions)
            self._upsert_trials(connection, experiment_id, trials)
        self._committed(experiment_id, seq)
        return seqs

    @staticmethod
    def _prepared(
        experiment_id: int, event: Event, decisions: Sequence[Decision], trials: Sequence[TrialRecord]
    ) -> tuple[Any, str, list[dict[str, Any]], str | None, list[tuple[str, dict[str, Any]]]]:
        """What an event's rows hold, encoded before the transaction begins."""
        encoded = to_dict(event, defaults=False)
        metrics = None
        if isinstance(event, TrialReported):  # its metrics go to the metrics table, not twice into the log
            metrics = _metric_values(event.trial_id, event.step, encoded.pop("metrics", None) or {"value": event.value})
        rows = _decision_rows(experiment_id, decisions, event.at)
        return event, _dumps(encoded), rows, metrics, [(trial.trial_id, _trial_values(trial)) for trial in trials]

    def _committed(self, experiment_id: int, seq: int) -> None:
        if experiment_id in self._epochs:  # nobody else appends to it: the next number is known
            self._last_seq[experiment_id] = seq

    def _last_seq_in(self, connection: sa.Connection, experiment_id: int) -> int:
        last = self._last_seq.get(experiment_id)
        if last is None:
            last = connection.execute(
                sa.select(sa.func.max(EVENTS.c.seq)).where(EVENTS.c.experiment_id == experiment_id)
            ).scalar_one()
        return last or 0

    @staticmethod
    def _insert_event(
        connection: sa.Connection, experiment_id: int, seq: int, event: Event, data: str, rows: list[dict[str, Any]]
    ) -> None:
        connection.execute(
            EVENTS.insert(), {"experiment_id": experiment_id, "seq": seq, "at": event.at, "type": type(event).__name__,
                              "data": data}
        )
        if rows:
            connection.execute(DECISIONS.insert(), [{**row, "event_seq": seq} for row in rows])

    def events(self, experiment_id: int) -> list[Event]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(
                sa.select(EVENTS.c.seq, EVENTS.c.data).where(EVENTS.c.experiment_id == experiment_id)
                .order_by(EVENTS.c.seq)
            ).all()
        return [self._event(experiment_id, seq, data) for seq, data in rows]

    def decisions(self, experiment_id: int) -> list[DecisionRecord]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(
                sa.select(DECISIONS.c.event_seq, DECISIONS.c.position, DECISIONS.c.at, DECISIONS.c.data)
                .where(DECISIONS.c.experiment_id == experiment_id)
                .order_by(DECISIONS.c.event_seq, DECISIONS.c.position)
            ).all()
        return [self._decision(experiment_id, *row) for row in rows]

    def events_after(self, experiment_id: int, after: int, limit: int | None = None) -> list[tuple[int, Event]]:
        query = (
            sa.select(EVENTS.c.seq, EVENTS.c.data)
            .where(EVENTS.c.experiment_id == experiment_id, EVENTS.c.seq > after)
            .order_by(EVENTS.c.seq)
            .limit(limit)
        )
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(query).all()
        return [(seq, self._event(experiment_id, seq, data)) for seq, data in rows]

    def decisions_after(self, experiment_id: int, after: int, upto: int | None = None) -> list[DecisionRecord]:
        query = sa.select(DECISIONS.c.event_seq, DECISIONS.c.position, DECISIONS.c.at, DECISIONS.c.data).where(
            DECISIONS.c.experiment_id == experiment_id, DECISIONS.c.event_seq > after
        )
        if upto is not None:
            query = query.where(DECISIONS.c.event_seq <= upto)
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(query.order_by(DECISIONS.c.event_seq, DECISIONS.c.position)).all()
        return [self._decision(experiment_id, *row) for row in rows]

    # ------------------------------------------------------------------ trials and metrics
    def upsert_trial(self, experiment_id: int, trial: TrialRecord) -> None:
        values = _trial_values(trial)
        with self._writing() as connection:
            self._require_writer(connection, experiment_id)
            self._upsert_trials(connection, experiment_id, {trial.trial_id: values})

    @staticmethod
    def _upsert_trials(connection: sa.Connection, experiment_id: int, trials: dict[str, dict[str, Any]]) -> None:
        """Update the trials the store holds, insert the others in the order given."""
        ids = list(trials)
        known: set[str] = set()
        for start in range(0, len(ids), _IDS_PER_QUERY):
            known.update(connection.execute(
                sa.select(TRIALS.c.trial_id).where(
                    TRIALS.c.experiment_id == experiment_id, TRIALS.c.trial_id.in_(ids[start:start + _IDS_PER_QUERY])
                )
            ).scalars())
        updates = [{**values, "of_experiment": experiment_id, "of_trial": trial_id}
                   for trial_id, values in trials.items() if trial_id in known]
        inserts = [{**values, "experiment_id": experiment_id, "trial_id": trial_id}
                   for trial_id, values in trials.items() if trial_id not in known]
        if updates:
            connection.execute(_UPDATE_TRIAL, updates)
        if inserts:
            connection.execute(TRIALS.insert(), inserts)

    def trials(self, experiment_id: int) -> list[TrialRecord]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(
                sa.select(TRIALS).where(TRIALS.c.experiment_id == experiment_id).order_by(TRIALS.c.id)
            ).all()
        return [self._trial(experiment_id, row) for row in rows]

    def _experiment(self, row: sa.Row[Any]) -> ExperimentRecord:
        """The record of an ``experiments`` row and its settings, each column checked: SQLite keeps whatever a hand
        edit wrote."""

        def column(name: str, check: Check, decode: Callable[[Any], Any] | None = None) -> Any:
            return self._decoded("experiments", (row.id,), name, getattr(row, name), decode or _passing(check), check)

        def setting(name: str, check: Check, default: Any) -> Any:  # NULL: no settings row, or an older layout's
            value = getattr(row, name)
            checked = self._decoded("experiment_settings", (row.id,), name, value, _passing(check), check)
            return default if checked is None else checked

        return ExperimentRecord(
            row.id,
            column("name", text_problem).rpartition("/")[2],
            column("spec", SPEC_CHECK, _json_object),
            column("created_at", number_problem),
            column("status", EXPERIMENT_STATUS_CHECK, ExperimentStatus),
            owner=setting("owner", optional(text_problem), None),
            weight=setting("weight", optional(number_problem), 1.0),
            cancel_requested=bool(row.cancel_requested),
            error=setting("error", optional(text_problem), None),
            gpu_seconds_used=setting("gpu_seconds_used", optional(number_problem), 0.0),
            gpu_seconds_owed=setting("gpu_seconds_owed", optional(number_problem), 0.0),
        )

    def _trial(self, experiment_id: int, row: sa.Row[Any]) -> TrialRecord:
        """The record of a ``trials`` row, each column checked: SQLite keeps whatever a hand edit wrote."""

        def column(name: str, check: Check, decode: Callable[[Any], Any] | None = None) -> Any:
            value = getattr(row, name)
            return self._decoded("trials", (experiment_id, row.trial_id), name, value, decode or _passing(check), check)

        return TrialRecord(
            trial_id=row.trial_id,
            params=column("params", PARAMS_CHECK, _json_object),
            state=column("state", STATE_CHECK, TrialState),
            budget=column("budget", whole_number_problem),
            submitted_at=column("submitted_at", number_problem),
            step=column("step", whole_number_problem),
            checkpoint_step=column("checkpoint_step", whole_number_problem),
            gpu=row.gpu,
            error=row.error,
            started_at=column("started_at", optional(number_problem)),
            ended_at=column("ended_at", optional(number_problem)),
        )

    def record_metrics(
        self, experiment_id: int, trial_id: str, step: int, at: float, metrics: Mapping[str, float]
    ) -> None:
        values = _metric_values(trial_id, step, metrics)
        with self._writing() as connection:
            self._require_writer(connection, experiment_id)
            self._record_metrics(connection, [{"experiment_id": experiment_id, "trial_id": trial_id, "step": step,
                                               "at": at, "metric_values": values}])

    @staticmethod
    def _record_metrics(connection: sa.Connection, rows: list[dict[str, Any]]) -> None:
        """Once per (experiment, trial, step): a step reported again, after a rollback to an older
        checkpoint, is in the event log twice but keeps its first metrics (the unique key holds)."""
        insert_once = _INSERT_METRICS_ONCE.get(connection.dialect.name)
        if insert_once is not None:  # one statement: INSERT ... ON CONFLICT DO NOTHING, on the unique key
            connection.execute(insert_once, rows)
            return
        for row in rows:
            known = connection.execute(
                sa.select(METRICS.c.id).where(
                    METRICS.c.experiment_id == row["experiment_id"], METRICS.c.trial_id == row["trial_id"],
                    METRICS.c.step == row["step"],
                )
            ).first()
            if known is None:
                connection.execute(METRICS.insert(), row)

    def metrics(self, experiment_id: int, trial_id: str | None = None) -> list[MetricRecord]:
        query = sa.select(METRICS).where(METRICS.c.experiment_id == experiment_id).order_by(METRICS.c.id)
        if trial_id is not None:
            query = query.where(METRICS.c.trial_id == trial_id)
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(query).all()
        return [self._metric(experiment_id, row.id, row.trial_id, row.step, row.at, row.metric_values) for row in rows]

    def metrics_after(
        self, experiment_id: int, after: int, limit: int | None = None, trial_id: str | None = None,
    ) -> list[tuple[int, MetricRecord]]:
        query = (
            sa.select(METRICS.c.id, METRICS.c.trial_id, METRICS.c.step, METRICS.c.at, METRICS.c.metric_values)
            .where(METRICS.c.experiment_id == experiment_id, METRICS.c.id > after)
            .order_by(METRICS.c.id)
            .limit(limit)
        )
        if trial_id is not None:
            query = query.where(METRICS.c.trial_id == trial_id)
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(query).all()  # unpacked as tuples: a dashboard reads tens of thousands
        return [
            (cursor, self._metric(experiment_id, cursor, trial, step, at, values))
            for cursor, trial, step, at, values in rows
        ]

    def latest_event_at(self) -> float:
        """The latest time of the logs' last events, each checked: SQL's max took a hand-edited text for the
        latest (text sorts after numbers in SQLite), which float() then failed on."""
        with self._reading() as connection:
            rows = connection.execute(_LAST_EVENTS).all()
        return float(max(
            (self._decoded("events", (experiment_id, seq), "at", at, _NUMBER, number_problem)
             for experiment_id, seq, at in rows),
            default=0.0,
        ))

    def close(self) -> None:
        self.release_pool()
        self._engine.dispose()

    # ------------------------------------------------------------------ decoding, naming what is damaged
    def _event(self, experiment_id: int, seq: int, data: Any) -> Event:
        return self._decoded("events", (experiment_id, seq), "data", data, _record, RECORD_CHECK)  # type: ignore[return-value]

    def _decision(self, experiment_id: int, seq: int, position: int, at: Any, data: Any) -> DecisionRecord:
        key = (experiment_id, seq, position)
        decision = self._decoded("decisions", key, "data", data, _record, RECORD_CHECK)
        at = self._decoded("decisions", key, "at", at, _NUMBER, number_problem)
        return DecisionRecord(seq, at, decision)  # type: ignore[arg-type]

    def _metric(self, experiment_id: int, row_id: int, trial_id: str, step: Any, at: Any, text: Any) -> MetricRecord:
        """The record of a ``metrics`` row, its step and time checked too: SQLite keeps whatever a hand edit wrote.
        Only a value of another type than the columns' is checked: a dashboard reads tens of thousands of rows."""
        key = (experiment_id, row_id)
        if type(step) is not int or type(at) is not float:
            step = self._decoded("metrics", key, "step", step, _WHOLE_NUMBER, whole_number_problem)
            at = self._decoded("metrics", key, "at", at, _NUMBER, number_problem)
        values = self._decoded("metrics", key, "metric_values", text, _metrics, METRICS_CHECK)
        return MetricRecord(trial_id, step, at, values)

    def _decoded(
        self, table: str, key: tuple[Any, ...], column: str, value: Any, decode: Callable[[Any], Any], check: Check
    ) -> Any:
        """``decode(value)``; where it fails, a DamagedRecord that names the table, the row and the column (what
        ``hermes status`` says of it too: ``hermes.report.integrity``), rather than a traceback far from the cause."""
        try:
            return decode(value)
        except (HermesError, ValueError, TypeError, KeyError, AttributeError) as error:
            problem = check(value) or f"does not decode ({type(error).__name__}: {error})"
        names = _KEYS[table]
        where = ", ".join(f"{name} {part!r}" for name, part in zip(names, key, strict=True))
        record = f"table {table}, row with {where}: column {column} {problem}"
        raise DamagedRecord(f"{self.location} has a damaged record: {record}", record)

    @property
    def location(self) -> str:
        """The SQLite file, or the database's URL (without its password)."""
        url = sa.make_url(self.url)
        return url.database if url.get_backend_name() == "sqlite" and url.database else self.url

    # ------------------------------------------------------------------ plumbing
    def _require(self, connection: sa.Connection, experiment_id: int) -> None:
        found = connection.execute(sa.select(EXPERIMENTS.c.id).where(EXPERIMENTS.c.id == experiment_id)).first()
        if found is None:
            raise StoreError(f"no experiment with id {experiment_id} in {self.url}")

    def _require_writer(self, connection: sa.Connection, experiment_id: int) -> None:
        """The experiment exists, and this store object is its writer: the one that claimed it last
        (``claim_writer``), or any while nobody ever did."""
        row = connection.execute(_WRITER, {"of_experiment": experiment_id}).first()
        if row is None:
            self._require(connection, experiment_id)  # a writers row names an existing experiment
        if (row.epoch if row is not None else None) != self._epochs.get(experiment_id):
            raise WriterLost(
                f"experiment {experiment_id} in {self.url} has another writer now ({row.holder}); "
                "this one may write no more"
            )

    @contextmanager
    def _reading(self) -> Iterator[sa.Connection]:
        """One read transaction: a consistent snapshot, rolled back at the end."""
        with self._lock, self._failures_as_store_errors(), self._engine.connect() as connection:
            yield connection

    @contextmanager
    def _writing(self) -> Iterator[sa.Connection]:
        """One write transaction, committed when the block ends without an error."""
        with self._lock, self._failures_as_store_errors(), self._engine.connect() as connection:
            connection.execution_options(hermes_write=True)
            with connection.begin():
                yield connection

    @contextmanager
    def _failures_as_store_errors(self) -> Iterator[None]:
        try:
            yield
        except sa.exc.SQLAlchemyError as error:
            if _disk_full(error):
                raise StoreFull(f"{self.url}: the disk is full: {error.orig}") from error
            why = _unavailable(error)
            if why is not None:
                raise StoreUnavailable(f"{self.url}: {why} ({error.orig})") from error
            if _damaged(error):
                raise StoreError(f"{self.location} is damaged ({error.orig}): restore it from a backup, "
                                 "or use another storage dir") from error
            raise StoreError(f"{self.url}: {getattr(error, 'orig', None) or error}") from error


def _pool_name(who: dict[str, Any]) -> str:
    """The pool's application name in PostgreSQL, which names it to a refused pool (``_POOL_HOLDER``): at most
    63 bytes are kept."""
    return f"hermes pool: pid {who.get('pid')} on {who.get('host')}".encode()[:63].decode(errors="ignore")


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entries to its disk: a file linked into it is there after a power cut too."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file at ``path`` (``mode=ro``). SQLite reads a WAL store only where it
    finds its ``-shm`` file beside it or can make one, which a reader that cannot write the folder (another user's
    storage dir, a read-only mount) cannot; there the file is read as it is (``immutable=1``), as of the last
    write that reached it. That is safe only while nothing writes the file, so it is refused where something may:
    a runner that holds the storage dir's lock, or a ``-wal`` file that holds writes the file lacks (a runner that
    writes keeps ``-shm`` there, and then ``mode=ro`` works)."""
    uri = f"file:{urllib.parse.quote(os.fsencode(path))}?mode=ro"  # its bytes: a name that is not UTF-8 too
    connection = sqlite3.connect(uri, uri=True, timeout=60.0, check_same_thread=False)
    try:
        connection.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # SQLite opens the -shm here
        return connection
    except sqlite3.Error as error:
        connection.close()
        cannot = (getattr(error, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN)
        if not (cannot and os.access(path, os.R_OK) and not os.access(path.parent, os.W_OK)):
            raise
    unwritable = f"SQLite must make {path.name}-shm beside it, and {path.parent} cannot be written here"
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreUnavailable(f"{path}: cannot read the writes {wal.name} holds: {unwritable}; read it as a user "
                               f"who may write {path.parent}, or from a copy of the folder")
    who = holder(path.parent / LOCK_FILE)
    if who is not None:
        raise StoreUnavailable(f"{path}: cannot read it while {describe(who)} writes it: {unwritable}; "
                               "try again in a moment")
    return sqlite3.connect(f"{uri}&immutable=1", uri=True, timeout=60.0, check_same_thread=False)


# What is wrong with a column's value, or None: how a damaged record is described, by the store as it reads
# it and by the reports' scan of the whole file (``hermes.report.integrity``).
Check = Callable[[Any], str | None]


def json_check(expected: type, inner: Check | None = None) -> Check:
    def check(text: Any) -> str | None:
        if not isinstance(text, str):
            return f"holds {text!r}, not JSON text"
        try:
            value = json.loads(text)
        except ValueError as error:
            return f"is not valid JSON ({error})"
        if not isinstance(value, expected):
            return f"holds {type(value).__name__} JSON, not {expected.__name__}"
        return inner(value) if inner is not None else None

    return check


def one_of(values: Collection[str]) -> Check:
    return lambda value: None if value in values else f"holds {value!r}, not one of {', '.join(sorted(values))}"


def whole_number_problem(value: Any) -> str | None:
    return None if isinstance(value, int) else f"holds {value!r}, not a whole number"


def number_problem(value: Any) -> str | None:
    return None if isinstance(value, (int, float)) else f"holds {value!r}, not a number"


def text_problem(value: Any) -> str | None:
    return None if isinstance(value, str) else f"holds {value!r}, not text"


def optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _passing(check: Check) -> Callable[[Any], Any]:
    """A decoder of a plain column: its value as it is, where ``check`` finds nothing wrong with it."""

    def decode(value: Any) -> Any:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return decode


_WHOLE_NUMBER = _passing(whole_number_problem)
_NUMBER = _passing(number_problem)


def record_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with an event's or a decision's JSON object, or None."""
    try:
        from_dict(data)
    except (HermesError, TypeError, ValueError, KeyError, AttributeError) as error:
        return f"does not decode: {error}"
    return None


def metric_values_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with a report's metrics, or None: each must be a number (NaN and infinities included)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"holds {value!r} for metric {name!r}, not a number"
    return None


RECORD_CHECK = json_check(dict, record_problem)
METRICS_CHECK = json_check(dict, metric_values_problem)
PARAMS_CHECK = json_check(dict)
SPEC_CHECK = json_check(dict)
STATE_CHECK = one_of({state.value for state in TrialState})
EXPERIMENT_STATUS_CHECK = one_of({status.value for status in ExperimentStatus})
_KEYS = {  # each table's key, as a damaged record is named
    "experiments": ("id",),
    "experiment_settings": ("experiment_id",),
    "events": ("experiment_id", "seq"),
    "decisions": ("experiment_id", "event_seq", "position"),
    "trials": ("experiment_id", "trial_id"),
    "metrics": ("experiment_id", "id"),
}


def _record(text: str) -> Event | Decision:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"{type(data).__name__} JSON")
    return from_dict(data)


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"{type(value).__name__} JSON")
    return value


def _metrics(text: str) -> dict[str, float]:
    values = json.loads(text)
    if not isinstance(values, dict) or metric_values_problem(values) is not None:
        raise ValueError("not a JSON object of numbers")
    return values


def _unique_violation(error: sa.exc.IntegrityError) -> bool:
    """A unique key refused the row (SQLite's SQLITE_CONSTRAINT_UNIQUE, a server's SQLSTATE 23505), not another
    constraint (a trigger's, a check's)."""
    cause = error.orig
    if isinstance(cause, sqlite3.Error):
        return getattr(cause, "sqlite_errorcode", 0) in (sqlite3.SQLITE_CONSTRAINT_UNIQUE,
                                                         sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
    return getattr(cause, "sqlstate", None) == "23505"


def _disk_full(error: sa.exc.SQLAlchemyError) -> bool:
    """SQLite's SQLITE_FULL (13), a database server's disk_full (SQLSTATE 53100), or an OSError of a full disk or
    quota, underneath ``error``."""
    cause = getattr(error, "orig", None)
    if isinstance(cause, sqlite3.Error):
        return (getattr(cause, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
    if getattr(cause, "sqlstate", None) == "53100":
        return True
    return isinstance(cause, OSError) and cause.errno in NO_SPACE_ERRNOS


_UNAVAILABLE = {  # SQLite's primary result codes of a store that cannot be written now, and why
    sqlite3.SQLITE_BUSY: "another process held it locked for longer than the 60 s a write waits",
    sqlite3.SQLITE_LOCKED: "another process held it locked for longer than the 60 s a write waits",
    sqlite3.SQLITE_READONLY: "it cannot be written: its file, its folder or its disk is read-only",
    sqlite3.SQLITE_PERM: "it cannot be written: permission denied",
    sqlite3.SQLITE_IOERR: "its disk refused a write (a file-size limit, or a failing disk)",
    sqlite3.SQLITE_CANTOPEN: "its file cannot be opened (its folder was removed, or cannot be read)",
}


def _damaged(error: sa.exc.SQLAlchemyError) -> bool:
    """SQLite's SQLITE_CORRUPT or SQLITE_NOTADB underneath ``error``: its file was cut or overwritten, and no
    retry reads it."""
    cause = getattr(error, "orig", None)
    return isinstance(cause, sqlite3.Error) and (
        getattr(cause, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


_SERVER_UNAVAILABLE = {  # SQLSTATE classes and codes of a database server that cannot serve now, and why
    "08": "the database server cannot be reached (refused, or the connection was lost)",
    "57P": "the database server is shutting down or starting",
    "53300": "the database server has no connection to spare",
    "25006": "it cannot be written: the database is read-only (a standby, or set so)",
    "55P03": "another connection held the rows locked",
}


def _unavailable(error: sa.exc.SQLAlchemyError) -> str | None:
    """Why the store cannot be read or written now, or None for another failure: SQLite's codes (``_UNAVAILABLE``),
    a database server's SQLSTATE (``_SERVER_UNAVAILABLE``); a connection that failed before the server answered
    (PostgreSQL stopped: no SQLSTATE) counts as unreachable. A server and a pool answer these 503 and wait; any other
    StoreError is taken as a fault of the request or of the store itself."""
    cause = getattr(error, "orig", None)
    if isinstance(cause, sqlite3.Error):
        return _UNAVAILABLE.get(getattr(cause, "sqlite_errorcode", 0) & 0xFF)
    state = getattr(cause, "sqlstate", None) or ""
    for prefix, why in _SERVER_UNAVAILABLE.items():
        if state.startswith(prefix):
            return why
    if not state and isinstance(error, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return _SERVER_UNAVAILABLE["08"]
    if isinstance(error, sa.exc.TimeoutError):  # SQLAlchemy's pool had no connection to give within its wait
        return "every connection to the database stayed busy"
    return None


def _configure_sqlite(engine: sa.Engine) -> None:
    """WAL, durable commits, enforced foreign keys, and transactions that SQLAlchemy begins itself."""

    @sa.event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver must not emit its own (deferred) BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # an in-memory database answers "memory" and carries on
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def on_begin(connection: sa.Connection) -> None:
        write = connection.get_execution_options().get("hermes_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _ensure_layout(connection: sa.Connection, where: str) -> None:
    """Make the tables of a new store, or bring an older one up to this layout, and stamp it ``SCHEMA_VERSION``;
    refuse one that a newer Hermes stamped before anything is written to it. A store made before the stamp holds no
    version: what it lacks of this layout (tables, the metrics key, the settings' columns) is found by looking, and
    added, its records kept as they are. A later layout adds its own step here, for the versions before it."""
    if connection.dialect.name == "postgresql":  # two first opens at once both created the tables
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.cast(SCHEMA_LOCK_KEY, sa.BigInteger))))
    version = _check_version(connection, where)
    made_before_the_stamp = version is None and sa.inspect(connection).has_table(EXPERIMENTS.name)
    METADATA.create_all(connection)  # the tables it lacks
    _add_metrics_key(connection)
    if made_before_the_stamp:
        _add_columns(connection)
    if version != SCHEMA_VERSION:
        connection.execute(SCHEMA.delete())
        connection.execute(SCHEMA.insert().values(version=SCHEMA_VERSION))


def _check_version(connection: sa.Connection, where: str) -> int | None:
    """The version the store is stamped with, None where it is not (a new store, or one made before the stamp);
    StoreError where a newer Hermes stamped it: this one would misread its records, or write what it cannot read."""
    if not sa.inspect(connection).has_table(SCHEMA.name):
        return None
    version = connection.execute(sa.select(sa.func.max(SCHEMA.c.version))).scalar_one()
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} was written by a newer Hermes: its layout is version {version}, and this Hermes ({__version__}) "
            f"knows versions up to {SCHEMA_VERSION}; upgrade Hermes to use it (nothing was written to it)"
        )
    return version


def _add_columns(connection: sa.Connection) -> None:
    """Add the columns of this layout that a table made by an older Hermes lacks: each takes NULL or has a server
    default, which the rows already there get."""
    inspector = sa.inspect(connection)
    for table in METADATA.sorted_tables:
        present = _columns(inspector, table.name)
        for column in table.columns:
            if column.name not in present:
                definition = sa.schema.CreateColumn(column).compile(dialect=connection.dialect)
                connection.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {definition}")


def _columns(inspector: sa.Inspector, table: str) -> set[str]:
    """The names of the table's columns; none where the store has no such table."""
    return {column["name"] for column in inspector.get_columns(table)} if inspector.has_table(table) else set()


def _add_metrics_key(connection: sa.Connection) -> None:
    """A store made before metrics had their unique key gets it, keeping each step's first report."""
    (index,) = [index for index in METRICS.indexes if index.name == "metrics_once_per_step"]
    if index.name in {found["name"] for found in sa.inspect(connection).get_indexes(METRICS.name)}:
        return
    first = sa.select(sa.func.min(METRICS.c.id)).group_by(METRICS.c.experiment_id, METRICS.c.trial_id, METRICS.c.step)
    connection.execute(METRICS.delete().where(METRICS.c.id.not_in(first)))
    index.create(connection)


def _decision_rows(experiment_id: int, decisions: Sequence[Decision], at: float) -> list[dict[str, Any]]:
    return [
        {
            "experiment_id": experiment_id,
            "position": position,
            "at": at,
            "type": type(decision).__name__,
            "trial_id": decision.trial_id,
            "gpu": getattr(decision, "gpu", None),
            "data": _dumps(to_dict(decision, defaults=False)),
        }
        for position, decision in enumerate(decisions)
    ]


def _trial_values(trial: TrialRecord) -> dict[str, Any]:
    return {
        "params": _dumps(trial.params),
        "state": TrialState(trial.state).value,
        "budget": trial.budget,
        "step": trial.step,
        "checkpoint_step": trial.checkpoint_step,
        "gpu": trial.gpu,
        "error": None if trial.error is None else _storable(trial.error),
        "submitted_at": trial.submitted_at,
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
    }


def _metric_values(trial_id: str, step: int, metrics: Mapping[str, float]) -> str:
    try:
        return _dumps({str(name): float(value) for name, value in metrics.items()})
    except (TypeError, ValueError):
        raise StoreError(f"trial {trial_id} step {step}: metrics must be numbers, got {dict(metrics)!r}") from None


def _storable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\udcff``), which neither SQLite nor PostgreSQL can
    store, and each NUL as ``\\x00``, which PostgreSQL's text refuses (SQLite kept it): what a trial or a command
    line says of a file whose name is not UTF-8 (``os.fsdecode``) holds surrogates, and an error that quotes bytes
    (``b'\\x00'`` decoded) a NUL. Every free text a store writes goes through here (errors, holders), so that every
    backend keeps it alike; names and ids hold neither (Hermes makes them, or refuses such ones), and JSON columns
    (specs, params, metrics, events, decisions) hold both escaped (``_dumps``)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")


def _key(name: str, owner: str) -> str:
    """An experiment's key in the store: a pool's experiment names are per owner (``owner/name``),
    others' are their names. Neither a name nor an owner holds a '/', so keys never clash."""
    return f"{owner}/{name}" if owner else name


def _check_weight(weight: float) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise StoreError(f"a weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {weight!r}")


def _dumps(data: Any) -> str:
    """JSON in ASCII: a NUL or a lone surrogate anywhere in ``data`` is written as its escape (``\\u0000``), which
    every backend's text keeps."""
    try:
        return json.dumps(data)
    except (TypeError, ValueError) as error:
        raise StoreError(f"cannot store {data!r} as JSON: {error}") from None


_FREE = ("description",)  # what a rerun may always change in a spec: it changes no result


def _drawn_order(spec: Any) -> list[str]:
    """The parameters of a stored spec's space whose order its searcher sees: Hermes's random and grid searchers draw
    them in space order, and Optuna's samplers are asked them so, all without the fixed ones (stored as their bare
    value), which take no draw; a searcher of one's own (module:Class) is given the whole space, fixed ones in it."""
    space, sampler = _at(spec, "search.space"), _at(spec, "search.sampler")
    if not isinstance(space, dict):
        return []
    name = sampler.get("name") if isinstance(sampler, dict) else sampler
    own = isinstance(name, str) and ":" in name
    return [key for key, parameter in space.items() if own or isinstance(parameter, dict)]


# Mappings whose order is part of what they say, and the keys whose order counts in a spec: the same parameters drawn
# in another order propose other configurations than the log holds.
_ORDERED = {"search.space": ("the order of its parameters", _drawn_order)}


def _order_field(path: str) -> str:
    """How ``differing_fields`` names an ``_ORDERED`` path whose order differs."""
    return f"{path} ({_ORDERED[path][0]})"


def _reordered(old: Any, new: Any) -> dict[str, tuple[list[str], list[str]]]:
    """Each ``_ORDERED`` path whose keys that count, of those in both specs, come in another order: those keys in
    each."""
    found = {}
    for path, (_, order) in _ORDERED.items():
        before, after = order(old), order(new)
        before, after = [key for key in before if key in after], [key for key in after if key in before]
        if before != after:
            found[path] = (before, after)
    return found


def _stored_and_given(stored: Any, given: Any, path: str) -> str | None:
    """``path: <stored> (now <given>)`` for a dotted path of ``differing_fields``, at the first item or key that
    differs where the whole would not fit (80 characters); None where the path names no differing value (the order
    of a space)."""
    old, new = _at(stored, path), _at(given, path)
    while not _same_json(old, new) and max(_size(old), _size(new)) > 80:
        if isinstance(old, dict) and isinstance(new, dict):
            keys = [*old, *(key for key in new if key not in old)]
            step = next(key for key in keys if not _same_json(old.get(key, _MISSING), new.get(key, _MISSING)))
            path, old, new = f"{path}.{step}", old.get(step, _MISSING), new.get(step, _MISSING)
        elif isinstance(old, list) and isinstance(new, list):
            index = next(index for index in range(max(len(old), len(new)))
                         if index >= min(len(old), len(new)) or not _same_json(old[index], new[index]))
            path = f"{path}[{index}]"
            old, new = (items[index] if index < len(items) else _MISSING for items in (old, new))
        else:
            break
    return None if _same_json(old, new) else f"{path}: {_shown(old)} (now {_shown(new)})"


def _size(value: Any) -> int:
    return 0 if value is _MISSING else len(json.dumps(value))


def _at(document: Any, path: str) -> Any:
    """The value at a dotted path (a key may hold dots: the longest that fits is taken); _MISSING where none is."""
    if not path:
        return document
    if not isinstance(document, dict):
        return _MISSING
    for key in sorted(document, key=len, reverse=True):
        if path == key or path.startswith(f"{key}."):
            return _at(document[key], path[len(key) + 1:])
    return _MISSING


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    text = json.dumps(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def differing_fields(old: Any, new: Any) -> list[str]:
    """Dotted paths where two stored specs differ, types included (key order matters only as ``_ORDERED`` says)."""
    return [*_differing_values(old, new, ""), *map(_order_field, _reordered(old, new))]


def _differing_values(old: Any, new: Any, path: str) -> list[str]:
    """Dotted paths where two JSON documents differ, types included, key order aside."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [*old, *(key for key in new if key not in old)]
        return [
            difference
            for key in keys
            for difference in _differing_values(
                old.get(key, _MISSING), new.get(key, _MISSING), f"{path}.{key}" if path else str(key)
            )
        ]
    return [] if _same_json(old, new) else [path or "the whole spec"]


def _same_json(old: Any, new: Any) -> bool:
    """Equal and of one type, in lists and mappings too: 1 == 1.0 == True in Python, but a trial given true or 2.0
    where it was given 1 or 2 runs another experiment."""
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(map(_same_json, old, new))
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(_same_json(value, new[key]) for key, value in old.items())
    return type(old) is type(new) and old == new
