"""One root error class, so callers can catch everything Hermes raises on purpose."""

from __future__ import annotations


class HermesError(Exception):
    """Root of every error Hermes raises deliberately."""


class TraceError(HermesError):
    """A learning-curve trace file is malformed; the message names the file and line."""


class SpecError(HermesError):
    """An experiment specification is invalid; the message names the field."""


class IllegalTransition(HermesError):
    """A trial was asked to move between two states that the state table does not connect."""
