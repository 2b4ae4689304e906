"""The local executor's event loop: one selector over every pipe and pidfd, a wake pipe, a period timer."""

from __future__ import annotations

import math
import os
import selectors
import time
from typing import Any, Callable

from hermes.errors import HermesError

Handler = Callable[[Any], None]

# A stretch of the loop that ends this many seconds later than it should have was a pause of its process (Ctrl-Z,
# Slurm's suspend, a frozen cgroup): a busy host delays it by milliseconds, a timer by 0.1% of its wait.
PAUSE_MARGIN = 1.0
# The longest a wait sleeps, so that a pause is told from a wait: one that a longer wait had hidden (stopped as it
# began, continued at its end) was taken for the silence of trials stopped with it. A pause of up to
# LOOK_EVERY + PAUSE_MARGIN seconds may go unseen.
LOOK_EVERY = 1.0


class EventLoop:
    """Waits on file descriptors and calls their handlers, in the order they were registered with
    ``rank`` (channels before exits, so what a process said is read before its death is handled).

    ``wake`` (from any thread) makes a wait return at once, even when it comes first; ``period``
    seconds after ``started`` and every period after, ``tick`` reports True once.

    ``paused(seconds)`` is told of a stretch that ended later than it should have (``PAUSE_MARGIN``): a wait (told
    before its handlers run, so that what they read is not timed across it), its handlers, or its caller's time
    between two waits. Its process was stopped some time in it (Ctrl-Z, a whole job suspended), or was held up; when
    in it cannot be told, so the whole stretch is.
    """

    def __init__(
        self, period: float | None, now: Callable[[], float], paused: Callable[[float], None] | None = None
    ) -> None:
        self.period = period
        self.now = now
        self.paused = paused
        self._done_at: float | None = None  # when the last wait was over: the next is due at once
        self._next_tick = now() + period if period is not None else None
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        for fd in (self._wake_read, self._wake_write):
            os.set_blocking(fd, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, (-1, None, None))

    def set_period(self, period: float | None) -> None:
        """Tick every ``period`` seconds from now on (None: no more ticks)."""
        if period != self.period:
            self.period = period
            self._next_tick = self.now() + period if period is not None else None

    def register(self, fd: int, rank: int, handler: Handler, source: Any) -> None:
        self._selector.register(fd, selectors.EVENT_READ, (rank, handler, source))

    def unregister(self, fd: int) -> None:
        self._selector.unregister(fd)

    def wait(self, deadline: float | None = None) -> bool:
        """Wait for something (or the next tick, or ``deadline``, or ``LOOK_EVERY`` seconds), run the handlers of what
        is ready; True if woken."""
        entered = self.now()
        if self._done_at is not None:  # its caller's time since the last wait
            self._note_late(entered - self._done_at, 0.0)
        moments = [moment for moment in (self._next_tick, deadline) if moment is not None]
        timeout = min(max(0.0, min(moments, default=math.inf) - entered), LOOK_EVERY)
        ready = self._selector.select(timeout)
        back = self.now()
        self._note_late(back - entered, timeout)
        woken = False
        for key, _ in sorted(ready, key=lambda item: item[0].data[0]):
            rank, handler, source = key.data
            if handler is None:
                woken = True
                self._drain_wakes()
            else:
                handler(source)
        self._done_at = self.now()
        self._note_late(self._done_at - back, 0.0)  # the handlers'
        return woken

    def tick(self) -> bool:
        """Whether a period has elapsed since the last tick (once per elapsed period)."""
        now = self.now()
        if self._next_tick is None or now < self._next_tick:
            return False
        missed = (now - self._next_tick) // self.period + 1  # counted, not stepped through: 500 + 1e-300 is 500
        self._next_tick = max(self._next_tick + missed * self.period, math.nextafter(now, math.inf))
        return True

    def wake(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except (BlockingIOError, OSError):
            pass  # a byte is pending already, or the loop is closed: the wait returns anyway

    def close(self) -> None:
        self._selector.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _note_late(self, took: float, meant: float) -> None:
        if took - meant > PAUSE_MARGIN and self.paused is not None:
            self.paused(took)

    def _drain_wakes(self) -> None:
        try:
            while os.read(self._wake_read, 1 << 10):
                pass
        except BlockingIOError:
            pass


def checked_period(period: float | None) -> float | None:
    """``period`` if it is None or positive; a HermesError otherwise."""
    if period is not None and not period > 0:
        raise HermesError(f"period must be positive, got {period}")
    return period


def monotonic_clock(offset: float) -> Callable[[], float]:
    """Seconds since now, plus ``offset`` (a restarted experiment's timeline goes on)."""
    started = time.monotonic() - offset
    return lambda: time.monotonic() - started
