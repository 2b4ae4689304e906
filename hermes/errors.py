"""One root error class, so callers can catch everything Hermes raises on purpose."""

from __future__ import annotations

import errno

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # what a full disk, or a full quota, raises


class HermesError(Exception):
    """Root of every error Hermes raises deliberately."""


class TraceError(HermesError):
    """A learning-curve trace file is malformed; the message names the file and line."""


class SpecError(HermesError):
    """An experiment specification is invalid; the message names the field."""


class NoSpaceError(HermesError):
    """A disk that Hermes or a trial writes to is full. Not the experiment's fault: the run stops,
    recorded as interrupted, and running it again once there is room continues it."""


class IllegalTransition(HermesError):
    """A trial was asked to move between two states that the state table does not connect."""
