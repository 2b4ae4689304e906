"""Name the damaged record when a report cannot read a store.

A report that meets a record it cannot decode (JSON cut short, an unknown state, text where a
number belongs) stops with an error naming the table, the row and the column, rather than skipping
the row: a leaderboard or a status that silently lacks a trial would mislead, and a damaged store
needs someone's attention anyway. The scan runs only after a read has failed, so it costs nothing
on a sound store, and it reads the SQLite file in read-only mode.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hermes.core.states import TrialState
from hermes.errors import HermesError
from hermes.store import ExperimentStatus
from hermes.store.codec import from_dict

Check = Callable[[Any], str | None]  # a problem with a column's value, or None


@contextmanager
def naming_damage(database: Path) -> Iterator[None]:
    """Turn a failure to decode a record of ``database`` into a HermesError that names the record.

    A failure for which the scan finds no damaged record is passed on as it is.
    """
    try:
        yield
    except (HermesError, ValueError, TypeError, KeyError, AttributeError) as error:
        damage = find_damage(database)
        if damage is None:
            raise
        raise HermesError(f"{database} has a damaged record: {damage} ({type(error).__name__}: {error})") from None


def find_damage(database: Path) -> str | None:
    """The first record of ``database`` that a report cannot decode, described; None when all decode."""
    uri = f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=60.0)
    except sqlite3.Error:
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


def _json(expected: type, inner: Check | None = None) -> Check:
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


def _one_of(values: set[str]) -> Check:
    return lambda value: None if value in values else f"holds {value!r}, not one of {', '.join(sorted(values))}"


def _integer(value: Any) -> str | None:
    return None if isinstance(value, int) else f"holds {value!r}, not a whole number"


def _number(value: Any) -> str | None:
    return None if isinstance(value, (int, float)) else f"holds {value!r}, not a number"


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"holds {value!r}, not text"


def _event_or_decision(data: dict[str, Any]) -> str | None:
    try:
        from_dict(data)
    except HermesError as error:
        return f"does not decode: {error}"
    return None


def _metric_values(values: dict[str, Any]) -> str | None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"holds {value!r} for metric {name!r}, not a number"
    return None


_TABLES: list[tuple[str, tuple[str, ...], dict[str, Check]]] = [
    ("experiments", ("id",), {
        "name": _text, "spec": _json(dict), "created_at": _number,
        "status": _one_of({status.value for status in ExperimentStatus}),
    }),
    ("events", ("experiment_id", "seq"), {"at": _number, "data": _json(dict, _event_or_decision)}),
    ("decisions", ("experiment_id", "event_seq", "position"), {"at": _number, "data": _json(dict, _event_or_decision)}),
    ("trials", ("experiment_id", "trial_id"), {
        "params": _json(dict), "state": _one_of({state.value for state in TrialState}), "budget": _integer,
        "step": _integer, "checkpoint_step": _integer, "gpu": _optional(_text), "error": _optional(_text),
        "submitted_at": _number, "started_at": _optional(_number), "ended_at": _optional(_number),
    }),
    ("metrics", ("experiment_id", "id"), {
        "trial_id": _text, "step": _integer, "at": _number, "metric_values": _json(dict, _metric_values),
    }),
]
