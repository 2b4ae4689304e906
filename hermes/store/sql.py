"""ExperimentStore on SQLAlchemy Core: SQLite by default, any SQL database SQLAlchemy speaks by URL.

JSON columns are plain text written by Python's ``json`` (NaN and infinities allowed, since a
diverged trial reports them), so every backend stores them alike.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import StaticPool

from hermes.core.decisions import Decision
from hermes.core.events import Event, TrialReported
from hermes.core.states import TrialState
from hermes.store.base import (
    DecisionRecord,
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    StoreError,
    TrialRecord,
)
from hermes.store.codec import from_dict, to_dict

METADATA = sa.MetaData()

EXPERIMENTS = sa.Table(
    "experiments",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False, unique=True),
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
    sa.Index("metrics_by_trial", "experiment_id", "trial_id"),
)

_MISSING = object()


class SqlStore(ExperimentStore):
    """``SqlStore("sqlite:///runs/hermes.db")``; ``"sqlite://"`` keeps everything in memory.

    SQLite runs in WAL mode with ``synchronous=FULL``: readers (a dashboard) never block the
    runner, and each commit is on disk before the call returns. Calls from the threads of one
    process are serialised by a lock; write transactions take SQLite's write lock up front
    (``BEGIN IMMEDIATE``) so that concurrent processes wait for each other instead of failing.
    """

    def __init__(self, url: str = "sqlite:///hermes.db") -> None:
        parsed = sa.make_url(url)
        self.url = parsed.render_as_string(hide_password=True)
        options: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            if parsed.database in (None, "", ":memory:"):
                # One shared connection, or each thread would see its own empty database.
                options = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
            else:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
                options = {"connect_args": {"timeout": 60.0}}
        self._engine = sa.create_engine(parsed, **options)
        if parsed.get_backend_name() == "sqlite":
            _configure_sqlite(self._engine)
        self._lock = threading.RLock()
        with self._writing() as connection:  # one writer at a time creates the tables
            METADATA.create_all(connection)

    @classmethod
    def open_read_only(cls, path: str | Path) -> SqlStore:
        """The store in an existing SQLite file, for readers (reports): opened with ``mode=ro``, so
        nothing is ever written to it, not even the schema; a missing file, or one that holds no
        Hermes store, raises StoreError. Its write methods raise StoreError too."""
        path = Path(path).resolve()
        store = cls.__new__(cls)
        store.url = f"sqlite:///{path}"
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        store._engine = sa.create_engine(
            "sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=60.0, check_same_thread=False)
        )

        @sa.event.listens_for(store._engine, "connect")
        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # so that each read is one snapshot (BEGIN below)

        @sa.event.listens_for(store._engine, "begin")
        def on_begin(connection: sa.Connection) -> None:
            connection.exec_driver_sql("BEGIN")

        store._lock = threading.RLock()
        try:
            with store._reading() as connection:
                found = sa.inspect(connection).has_table(EXPERIMENTS.name)
            if not found:
                raise StoreError(f"{path} holds no Hermes store (it has no {EXPERIMENTS.name} table)")
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
            row = connection.execute(
                sa.select(EXPERIMENTS.c.id, EXPERIMENTS.c.spec).where(EXPERIMENTS.c.name == name)
            ).first()
            if row is None:
                inserted = connection.execute(
                    EXPERIMENTS.insert().values(
                        name=name, spec=spec_json, created_at=time.time(), status=ExperimentStatus.RUNNING.value
                    )
                )
                return int(inserted.inserted_primary_key[0])  # type: ignore[index]  # set by a one-row insert
            differences = _differences(json.loads(row.spec), json.loads(spec_json))
            if differences and all(difference in may_change for difference in differences):
                connection.execute(EXPERIMENTS.update().where(EXPERIMENTS.c.id == row.id).values(spec=spec_json))
            elif differences:
                raise StoreError(
                    f"experiment {name!r} already exists in {self.url} with a different spec "
                    f"(differs in {', '.join(differences)}); give it a new name or use another storage dir"
                )
            return int(row.id)

    def experiment(self, experiment_id: int) -> ExperimentRecord:
        with self._reading() as connection:
            row = connection.execute(sa.select(EXPERIMENTS).where(EXPERIMENTS.c.id == experiment_id)).first()
        if row is None:
            raise StoreError(f"no experiment with id {experiment_id} in {self.url}")
        return _experiment(row)

    def experiments(self) -> list[ExperimentRecord]:
        with self._reading() as connection:
            rows = connection.execute(sa.select(EXPERIMENTS).order_by(EXPERIMENTS.c.id)).all()
        return [_experiment(row) for row in rows]

    def set_status(self, experiment_id: int, status: ExperimentStatus) -> None:
        with self._writing() as connection:
            updated = connection.execute(
                EXPERIMENTS.update()
                .where(EXPERIMENTS.c.id == experiment_id)
                .values(status=ExperimentStatus(status).value)
            )
            if not updated.rowcount:
                raise StoreError(f"no experiment with id {experiment_id} in {self.url}")

    # ------------------------------------------------------------------ event log and decisions
    def append_event(self, experiment_id: int, event: Event, decisions: Sequence[Decision] = ()) -> int:
        data = _dumps(to_dict(event))
        rows = _decision_rows(experiment_id, decisions, event.at)
        with self._writing() as connection:
            self._require(connection, experiment_id)
            return self._append_event(connection, experiment_id, event, data, rows)

    def record_event(
        self, experiment_id: int, event: Event, decisions: Sequence[Decision], trials: Sequence[TrialRecord]
    ) -> int:
        encoded = to_dict(event)
        metrics = None
        if isinstance(event, TrialReported):  # its metrics go to the metrics table, not twice into the log
            metrics = _metric_values(event.trial_id, event.step, encoded.pop("metrics") or {"value": event.value})
        data = _dumps(encoded)
        rows = _decision_rows(experiment_id, decisions, event.at)
        trial_values = [(trial.trial_id, _trial_values(trial)) for trial in trials]
        with self._writing() as connection:
            self._require(connection, experiment_id)
            if metrics is not None:
                connection.execute(
                    METRICS.insert().values(
                        experiment_id=experiment_id, trial_id=event.trial_id, step=event.step, at=event.at,
                        metric_values=metrics,
                    )
                )
            seq = self._append_event(connection, experiment_id, event, data, rows)
            for trial_id, values in trial_values:
                self._upsert_trial(connection, experiment_id, trial_id, values)
        return seq

    @staticmethod
    def _append_event(
        connection: sa.Connection, experiment_id: int, event: Event, data: str, rows: list[dict[str, Any]]
    ) -> int:
        last = connection.execute(
            sa.select(sa.func.max(EVENTS.c.seq)).where(EVENTS.c.experiment_id == experiment_id)
        ).scalar_one()
        seq = (last or 0) + 1
        connection.execute(
            EVENTS.insert().values(experiment_id=experiment_id, seq=seq, at=event.at, type=type(event).__name__, data=data)
        )
        if rows:
            connection.execute(DECISIONS.insert(), [{**row, "event_seq": seq} for row in rows])
        return seq

    def events(self, experiment_id: int) -> list[Event]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            data = connection.execute(
                sa.select(EVENTS.c.data).where(EVENTS.c.experiment_id == experiment_id).order_by(EVENTS.c.seq)
            ).scalars()
            return [from_dict(json.loads(item)) for item in data]  # type: ignore[misc]

    def decisions(self, experiment_id: int) -> list[DecisionRecord]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(
                sa.select(DECISIONS.c.event_seq, DECISIONS.c.at, DECISIONS.c.data)
                .where(DECISIONS.c.experiment_id == experiment_id)
                .order_by(DECISIONS.c.event_seq, DECISIONS.c.position)
            ).all()
        return [DecisionRecord(row.event_seq, row.at, from_dict(json.loads(row.data))) for row in rows]  # type: ignore[arg-type]

    # ------------------------------------------------------------------ trials and metrics
    def upsert_trial(self, experiment_id: int, trial: TrialRecord) -> None:
        values = _trial_values(trial)
        with self._writing() as connection:
            self._require(connection, experiment_id)
            self._upsert_trial(connection, experiment_id, trial.trial_id, values)

    @staticmethod
    def _upsert_trial(connection: sa.Connection, experiment_id: int, trial_id: str, values: dict[str, Any]) -> None:
        updated = connection.execute(
            TRIALS.update().where(TRIALS.c.experiment_id == experiment_id, TRIALS.c.trial_id == trial_id).values(**values)
        )
        if not updated.rowcount:
            connection.execute(TRIALS.insert().values(experiment_id=experiment_id, trial_id=trial_id, **values))

    def trials(self, experiment_id: int) -> list[TrialRecord]:
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(
                sa.select(TRIALS).where(TRIALS.c.experiment_id == experiment_id).order_by(TRIALS.c.id)
            ).all()
        return [
            TrialRecord(
                trial_id=row.trial_id,
                params=json.loads(row.params),
                state=TrialState(row.state),
                budget=row.budget,
                submitted_at=row.submitted_at,
                step=row.step,
                checkpoint_step=row.checkpoint_step,
                gpu=row.gpu,
                error=row.error,
                started_at=row.started_at,
                ended_at=row.ended_at,
            )
            for row in rows
        ]

    def record_metrics(
        self, experiment_id: int, trial_id: str, step: int, at: float, metrics: Mapping[str, float]
    ) -> None:
        values = _metric_values(trial_id, step, metrics)
        with self._writing() as connection:
            self._require(connection, experiment_id)
            connection.execute(
                METRICS.insert().values(
                    experiment_id=experiment_id, trial_id=trial_id, step=step, at=at, metric_values=values
                )
            )

    def metrics(self, experiment_id: int, trial_id: str | None = None) -> list[MetricRecord]:
        query = sa.select(METRICS).where(METRICS.c.experiment_id == experiment_id).order_by(METRICS.c.id)
        if trial_id is not None:
            query = query.where(METRICS.c.trial_id == trial_id)
        with self._reading() as connection:
            self._require(connection, experiment_id)
            rows = connection.execute(query).all()
        return [MetricRecord(row.trial_id, row.step, row.at, json.loads(row.metric_values)) for row in rows]

    def close(self) -> None:
        self._engine.dispose()

    # ------------------------------------------------------------------ plumbing
    def _require(self, connection: sa.Connection, experiment_id: int) -> None:
        found = connection.execute(sa.select(EXPERIMENTS.c.id).where(EXPERIMENTS.c.id == experiment_id)).first()
        if found is None:
            raise StoreError(f"no experiment with id {experiment_id} in {self.url}")

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
            raise StoreError(f"{self.url}: {error}") from error


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


def _decision_rows(experiment_id: int, decisions: Sequence[Decision], at: float) -> list[dict[str, Any]]:
    return [
        {
            "experiment_id": experiment_id,
            "position": position,
            "at": at,
            "type": type(decision).__name__,
            "trial_id": decision.trial_id,
            "gpu": getattr(decision, "gpu", None),
            "data": _dumps(to_dict(decision)),
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
        "error": trial.error,
        "submitted_at": trial.submitted_at,
        "started_at": trial.started_at,
        "ended_at": trial.ended_at,
    }


def _metric_values(trial_id: str, step: int, metrics: Mapping[str, float]) -> str:
    try:
        return _dumps({str(name): float(value) for name, value in metrics.items()})
    except (TypeError, ValueError):
        raise StoreError(f"trial {trial_id} step {step}: metrics must be numbers, got {dict(metrics)!r}") from None


def _experiment(row: sa.Row[Any]) -> ExperimentRecord:
    return ExperimentRecord(row.id, row.name, json.loads(row.spec), row.created_at, ExperimentStatus(row.status))


def _dumps(data: Any) -> str:
    try:
        return json.dumps(data)
    except (TypeError, ValueError) as error:
        raise StoreError(f"cannot store {data!r} as JSON: {error}") from None


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths where two JSON documents differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [*old, *(key for key in new if key not in old)]
        return [
            difference
            for key in keys
            for difference in _differences(
                old.get(key, _MISSING), new.get(key, _MISSING), f"{path}.{key}" if path else str(key)
            )
        ]
    return [] if old == new else [path or "the whole spec"]
