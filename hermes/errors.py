"""One root error class, so callers can catch everything Hermes raises on purpose."""

from __future__ import annotations


class HermesError(Exception):
    """Root of every error Hermes raises deliberately."""


class TraceError(HermesError):
    """A learning-curve trace file is malformed; the message names the file and line."""


class SpecError(HermesError):
    """An experiment specification is invalid; the message names the field.

    ``problems``: each problem as (dotted field path, what is wrong), for callers that place them (the server's 422).
    """

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class IllegalTransition(HermesError):
    """A trial was asked to move between two states that the state table does not connect."""
