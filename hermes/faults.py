"""Crash points: where a test makes this process die at once, as ``kill -9`` would, to prove that
nothing is lost or stored twice whatever the moment.

``HERMES_CRASH_AT=name:n`` ends the process with ``os._exit(137)`` the n-th time (1-based) it
passes ``crash_point(name)``. Unset (always, outside tests), a crash point costs one comparison.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL
_name, _, _count = os.environ.get("HERMES_CRASH_AT", "").partition(":")
_remaining = int(_count or 1) if _name else 0


def crash_point(name: str) -> None:
    global _remaining
    if _remaining and name == _name:
        _remaining -= 1
        if not _remaining:
            os._exit(CRASH_EXIT_CODE)
