"""Name the damaged record when a report cannot read a store.

A report that meets a record it cannot decode (JSON cut short, an unknown state, text where a
number belongs) stops with an error naming the table, the row and the column, rather than skipping
the row: a leaderboard or a status that silently lacks a trial would mislead, and a damaged store
needs someone's attention anyway. The scan runs only after a read has failed, so it costs nothing
on a sound store, and it reads the SQLite file in read-only mode.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hermes.errors import HermesError
from hermes.store import ExperimentStatus
from hermes.store.base import DamagedRecord
from hermes.store.sql import (
    METRICS_CHECK,
    PARAMS_CHECK,
    RECORD_CHECK,
    STATE_CHECK,
    Check,
    connect_read_only,
    json_check,
    number_problem,
    one_of,
    optional,
    whole_number_problem,
)


@contextmanager
def naming_damage(database: Path) -> Iterator[None]:
    """Turn a failure to decode a record of ``database`` into a HermesError that names the record, and what to do.

    A failure for which the scan finds no damaged record is passed on as it is.
    """
    fix = f"correct that value, or restore {database.name} from a backup"
    try:
        yield
    except DamagedRecord as error:  # the store named it as it read it
        raise HermesError(f"{database} has a damaged record: {error.record}; {fix}") from None
    except (HermesError, ValueError, TypeError, KeyError, AttributeError) as error:
        damage = find_damage(database)
        if damage is None:
            raise
        raise HermesError(
            f"{database} has a damaged record: {damage} ({type(error).__name__}: {error}); {fix}"
        ) from None


def find_damage(database: Path) -> str | None:
    """The first record of ``database`` that a report cannot decode, described; None when all decode."""
    try:
        connection = connect_read_only(Path(database).resolve())
    except (sqlite3.Error, HermesError):
        return None
    try:
        for table, keys, checks in _TABLES:
            columns = ", ".join([*keys, *checks])
            for row in connection.execute(f"SELECT {columns} FROM {table} ORDER BY {', '.join(keys)}"):  # noqa: S608
                key, values = row[: len(keys)], row[len(keys):]
                for (column, check), value in zip(checks.items(), values, strict=True):
                    problem = check(value)
                    if problem is not None:
                        where = ", ".join(f"{name} {value!r}" for name, value in zip(keys, key, strict=True))
                        return f"table {table}, row with {where}: column {column} {problem}"
    except sqlite3.Error:
        return None  # not the schema this scan knows: leave the original error to speak
    finally:
        connection.close()
    return None


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"holds {value!r}, not text"


_TABLES: list[tuple[str, tuple[str, ...], dict[str, Check]]] = [
    ("experiments", ("id",), {
        "name": _text, "spec": json_check(dict), "created_at": number_problem,
        "status": one_of({status.value for status in ExperimentStatus}),
    }),
    ("events", ("experiment_id", "seq"), {"at": number_problem, "data": RECORD_CHECK}),
    ("decisions", ("experiment_id", "event_seq", "position"), {"at": number_problem, "data": RECORD_CHECK}),
    ("trials", ("experiment_id", "trial_id"), {
        "params": PARAMS_CHECK, "state": STATE_CHECK, "budget": whole_number_problem,
        "step": whole_number_problem, "checkpoint_step": whole_number_problem, "gpu": optional(_text), "error": optional(_text),
        "submitted_at": number_problem, "started_at": optional(number_problem), "ended_at": optional(number_problem),
    }),
    ("metrics", ("experiment_id", "id"), {
        "trial_id": _text, "step": whole_number_problem, "at": number_problem, "metric_values": METRICS_CHECK,
    }),
]
