"""Events and decisions <-> plain JSON-ready dicts, so that stores keep data, never pickles.

A dict is ``{"type": <class name>, <field>: <value>, ...}``. Tuples become lists in JSON and are
restored from the dataclass's type hints; mappings come back as plain dicts.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from hermes.core import decisions, events
from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.errors import HermesError

_TYPES: dict[str, type] = {
    cls.__name__: cls
    for module in (events, decisions)
    for cls in vars(module).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__
}
# Field names whose declared type is a tuple, per class: lists read back from JSON turn into tuples there.
_TUPLE_FIELDS: dict[type, frozenset[str]] = {
    cls: frozenset(name for name, hint in typing.get_type_hints(cls).items() if typing.get_origin(hint) is tuple)
    for cls in _TYPES.values()
}


def to_dict(item: Event | Decision, *, defaults: bool = True) -> dict[str, Any]:
    """The item's class name under ``type`` and its fields, as JSON-ready values; without ``defaults``, a field
    that holds its default is left out (``from_dict`` puts it back): what a store keeps, so that an older Hermes,
    which knows no field added since, still reads every record that does not use it."""
    if type(item) not in _TUPLE_FIELDS:
        raise HermesError(f"cannot encode {type(item).__name__}: not an event or a decision")
    data: dict[str, Any] = {"type": type(item).__name__}
    for field in dataclasses.fields(item):
        value = getattr(item, field.name)
        if not defaults and field.default is not dataclasses.MISSING and value == field.default:
            continue
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        data[field.name] = value
    return data


def from_dict(data: Mapping[str, Any]) -> Event | Decision:
    """Rebuild what ``to_dict`` produced; unknown types and fields raise HermesError."""
    fields = dict(data)
    name = fields.pop("type", None)
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise HermesError(f"cannot decode {name!r}: not an event or a decision type")
    for field in _TUPLE_FIELDS[cls] & fields.keys():
        fields[field] = tuple(fields[field])
    try:
        return cls(**fields)
    except TypeError as error:
        raise HermesError(f"cannot decode {name}: {error}") from None
