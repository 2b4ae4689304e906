"""Hung trials: a trial that runs too long in all, or stops reporting, is killed and fails.

A trial is *watched* while it holds its slot: from a Start or Resume until it is suspended or
ends. Two limits apply to a watched trial (``TrialLimits``, from the spec's ``trial`` section):

- ``timeout``: seconds of running time in all, summed over its runs (time suspended is free);
- stall: seconds without a report. ``stall_after`` is a fixed limit that also covers the time
  before its first report (imports, loading data); ``stall_factor`` measures the trial against
  itself: silent for that many times its slowest step so far (two reports of one run apart),
  but never less than ``stall_min`` seconds, so a short pause (an evaluation) is not a hang.

A trial that committed its suspension only has to exit: it is overdue ``EXIT_GRACE`` seconds later (a thread
that is no daemon keeps its process alive). Killed then, or past a limit once it reported its budget's last step
(a stuck teardown, a slow final save), it lost nothing: the executor counts it suspended, or completed.

The executor asks ``deadline`` how long its loop may sleep, and ``overdue`` which trials to kill.
Running time is counted by this runner: a rerun after a crash counts anew. On Ray, each node's
agent counts its own runs, and the driver adds those a trial ran on other nodes (``TrialLaunch.ran``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes.errors import HermesError

EXIT_GRACE = 30.0  # seconds a trial that committed its suspension has to exit


@dataclass(frozen=True, slots=True)
class TrialLimits:
    timeout: float | None = None  # seconds of running time in all; None: no limit
    stall_factor: float = 20.0  # silent for this many times its slowest step; 0: off
    stall_min: float = 60.0  # ...but never less than this many seconds of silence
    stall_after: float | None = None  # silent this many seconds, whatever its steps; None: off

    def __post_init__(self) -> None:
        for name in ("timeout", "stall_after"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise HermesError(f"{name} must be positive or None, got {value}")
        if self.stall_factor < 0 or self.stall_min < 0:
            raise HermesError("stall_factor and stall_min must not be negative")


@dataclass(slots=True)
class _Watch:
    ran: float = 0.0  # running seconds of the runs that ended
    since: float | None = None  # the run in progress began; None while not watched
    heard_at: float = 0.0  # its last report, or the start of the run
    last_report_at: float | None = None  # its last report in this run: the next one times a step
    slowest_step: float = 0.0
    limits: TrialLimits | None = None  # the trial's own; None: the watchdog's
    exit_by: float | None = None  # it committed its suspension in this run, and must exit by then


@dataclass(slots=True)
class Watchdog:
    limits: TrialLimits
    _watches: dict[str, _Watch] = field(default_factory=dict)  # every trial that ran and has not ended
    _watched: dict[str, _Watch] = field(default_factory=dict)  # those holding their slot now

    def started(self, trial_id: str, now: float, limits: TrialLimits | None = None, ran: float = 0.0) -> None:
        """A run began (or a suspended trial continues): its clocks run from now, against ``limits``
        (the trial's own, else the watchdog's); a trial new here ``ran`` seconds elsewhere before."""
        watch = self._watches.setdefault(trial_id, _Watch(ran=ran, limits=limits))
        if watch.since is None:
            watch.since = watch.heard_at = now
            watch.last_report_at = watch.exit_by = None
            self._watched[trial_id] = watch

    def reported(self, trial_id: str, now: float) -> None:
        watch = self._watched.get(trial_id)
        if watch is None:
            return
        if watch.last_report_at is not None:
            watch.slowest_step = max(watch.slowest_step, now - watch.last_report_at)
        watch.heard_at = watch.last_report_at = now

    def exiting(self, trial_id: str, now: float) -> None:
        """It committed its suspension: all it has left to do is exit, within ``EXIT_GRACE`` seconds."""
        watch = self._watched.get(trial_id)
        if watch is not None and watch.exit_by is None:
            watch.exit_by = now + EXIT_GRACE

    def stopped(self, trial_id: str, now: float, *, ended: bool = False) -> None:
        """It gave up its slot (suspended, lost, or killed by the watchdog), or ``ended``: not watched."""
        watch = self._watched.pop(trial_id, None)
        if watch is not None:
            watch.ran += now - (watch.since or now)
            watch.since = None
        if ended:
            self._watches.pop(trial_id, None)

    def deadline(self) -> float | None:
        """The earliest moment a watched trial breaks a limit, if nothing is heard from it before."""
        moments = [moment for watch in self._watched.values() for moment, _ in self._limits(watch)]
        return min(moments, default=None)

    def overdue(self, now: float) -> list[tuple[str, str]]:
        """(trial id, why) of every watched trial past a limit; they are no longer watched."""
        found = []
        for trial_id, watch in self._watched.items():
            reasons = [reason for moment, reason in self._limits(watch) if moment <= now]
            if reasons:
                found.append((trial_id, reasons[0]))
        for trial_id, _ in found:
            self.stopped(trial_id, now)
        return found

    def _limits(self, watch: _Watch) -> list[tuple[float, str]]:
        if watch.since is None:
            return []
        limits, found = watch.limits or self.limits, []
        if limits.timeout is not None:
            found.append((watch.since + limits.timeout - watch.ran,
                          f"timed out: it ran {limits.timeout:g}s in all (trial.timeout)"))
        if limits.stall_after is not None:
            found.append((watch.heard_at + limits.stall_after,
                          f"hung: no report for {limits.stall_after:g}s (trial.stall.after)"))
        if limits.stall_factor and watch.slowest_step > 0:
            silence = max(limits.stall_factor * watch.slowest_step, limits.stall_min)
            found.append((watch.heard_at + silence,
                          f"hung: no report for {silence:.3g}s, while its slowest step took {watch.slowest_step:.3g}s "
                          f"(trial.stall: factor {limits.stall_factor:g}, min {limits.stall_min:g}s)"))
        if watch.exit_by is not None:
            found.append((watch.exit_by, f"it did not exit within {EXIT_GRACE:g}s of committing its suspension"))
        return found
