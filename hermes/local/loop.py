"""The local executor's event loop: one selector over every pipe and pidfd, a wake pipe, a period timer."""

from __future__ import annotations

import math
import os
import selectors
import threading
import time
from typing import Any, Callable

from hermes.errors import HermesError, start_thread

Handler = Callable[[Any], None]

# A beat of the pause watch (``_PauseWatch``) that comes this many seconds late was a stop of the whole process (Ctrl-Z,
# Slurm's suspend, SIGSTOP, a frozen cgroup): a busy host delays a sleeping thread by milliseconds.
PAUSE_MARGIN = 1.0
BEAT_S = 0.25  # how often the pause watch wakes


class _PauseWatch:
    """A thread that sleeps ``BEAT_S`` at a time and sums how late it wakes beyond ``PAUSE_MARGIN``: the seconds its
    process was stopped. A runner busy in its own loop (a slow stopper, a store's commit) or blocked is no pause: the
    GIL lets this thread run meanwhile, so only a stop of every thread makes it late (a single C call that holds the
    GIL for over a second would pass for one, leaving a trial's limits that much longer)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._stopped = 0.0  # not yet taken
        self._beat_at = now()  # the last beat, or the last look at a beat overdue
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hermes-pause-watch", daemon=True)
        start_thread(self._thread)

    def take(self) -> float:
        """The seconds the process was stopped since the last call; a stop that the watch, continued with the rest,
        has not woken to see yet included (its beat is overdue)."""
        with self._lock:
            self._late(self._now())
            stopped, self._stopped = self._stopped, 0.0
        return stopped

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._closed.wait(BEAT_S):
            with self._lock:
                self._late(self._now())

    def _late(self, now: float) -> None:
        late = now - self._beat_at - BEAT_S
        if late > PAUSE_MARGIN:
            self._stopped += late
        if late > PAUSE_MARGIN or now - self._beat_at >= BEAT_S:  # counted once: the next beat is due from now
            self._beat_at = now


class EventLoop:
    """Waits on file descriptors and calls their handlers, in the order they were registered with
    ``rank`` (channels before exits, so what a process said is read before its death is handled).

    ``wake`` (from any thread) makes a wait return at once, even when it comes first; ``period``
    seconds after ``started`` and every period after, ``tick`` reports True once.

    ``paused(seconds)`` is told, as a wait returns and before its handlers run (so that what they read is not timed
    across it), of the seconds its process was stopped since the last wait (Ctrl-Z, a whole job suspended:
    ``_PauseWatch``).
    """

    def __init__(
        self, period: float | None, now: Callable[[], float], paused: Callable[[float], None] | None = None
    ) -> None:
        self.period = period
        self.now = now
        self.paused = paused
        self._pauses = _PauseWatch(now) if paused is not None else None
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
        """Wait for something (or the next tick, or ``deadline``), run the handlers of what is ready; True if woken."""
        moments = [moment for moment in (self._next_tick, deadline) if moment is not None]
        timeout = max(0.0, min(moments) - self.now()) if moments else None
        ready = self._selector.select(timeout)
        if self._pauses is not None and self.paused is not None and (stopped := self._pauses.take()) > 0:
            self.paused(stopped)
        woken = False
        for key, _ in sorted(ready, key=lambda item: item[0].data[0]):
            rank, handler, source = key.data
            if handler is None:
                woken = True
                self._drain_wakes()
            else:
                handler(source)
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
        if self._pauses is not None:
            self._pauses.close()
        self._selector.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

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
