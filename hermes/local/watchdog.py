"""Hung trials: a trial that runs too long in all, or stops reporting, is killed and fails.

A trial is *watched* while it holds its slot: from a Start or Resume until it is suspended or
ends. Two limits apply to a watched trial (``TrialLimits``, from the spec's ``trial`` section):

- ``timeout``: seconds of running time in all, summed over its runs (time suspended is free);
- stall: seconds without a report. ``stall_after`` is a fixed limit that also covers the time
  before its first report (imports, loading data); ``stall_factor`` measures the trial against
  itself: silent for that many times its slowest step so far, but never less than ``stall_min``
  seconds, so a short pause (an evaluation) is not a hang.

A step is the running time between two of its reports, in one run or across two: a preemptive policy
may suspend a trial at each of its reports, so that no run of it reports twice (it had no step then, and
hung for ever). A step across two runs counts the saving, start-up and restore between them too, so it
errs only long (an unmodified program's, stopped and continued mid-step, is the step's own); the time a
process lingers after committing its suspension is no step's. Until its first report a run is measured
against the longest any of its runs took to a first report (from its start, or from the report before it),
start-ups against start-ups, so a restore slower than the steps is not taken for a hang.

A trial that committed its suspension, or a thread of which ended with its StopExit (``protocol.LOOP_STOPPED``), only
has to exit: it is overdue ``EXIT_GRACE`` seconds later (a thread that is no daemon keeps its process alive, a main
thread waits on that stopped loop). A stop alone arms nothing: a stopped trial's final save takes what it takes.
Killed then, or past a limit once it reported its budget's last step (a stuck teardown, a slow final save),
it lost nothing: the executor counts it suspended, stopped, or completed.

Only a trial's own time counts, for its limits and its step times alike: not the wait for the answer to a report (a
cooperative trial is blocked until the core has decided: ``awaiting``, ``answered``; on Ray, until the driver has, which
a stopped driver never does), nor a pause of its runner (``paused``, told by ``hermes.local.loop``: its process was
stopped, by Ctrl-Z or with its trials, as Slurm's ``scontrol suspend`` does). Its clocks skip that time as though it had
not passed; they counted it, and on SIGCONT failed every running trial as hung, with the pause for a step.

The executor asks ``deadline`` how long its loop may sleep, and ``overdue`` which trials to kill.
Running time is counted by this runner: a rerun after a crash counts anew. On Ray, each node's
agent counts its own runs, and the driver adds those a trial ran on other nodes (``TrialLaunch.ran``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes.errors import HermesError

EXIT_GRACE = 30.0  # seconds a trial that committed its suspension, or whose loop thread was stopped, has to exit
# what left a trial only to exit, as the reason for killing it says
SUSPENSION_COMMITTED = "committing its suspension"
TOLD_TO_STOP = "its loop thread being stopped"  # protocol.LOOP_STOPPED


@dataclass(frozen=True, slots=True)
class TrialLimits:
    timeout: float | None = None  # seconds of running time in all; None: no limit
    stall_factor: float = 20.0  # silent for this many times its slowest step; 0: off
    stall_min: float = 600.0  # ...but never less than this many seconds of silence
    stall_after: float | None = None  # silent this many seconds, whatever its steps; None: off

    def __post_init__(self) -> None:
        for name in ("timeout", "stall_after"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise HermesError(f"{name} must be positive or None, got {value}")
        if self.stall_factor < 0 or self.stall_min < 0:
            raise HermesError("stall_factor and stall_min must not be negative")


NO_LIMITS = TrialLimits(stall_factor=0.0)  # what a trial awaiting its answer is held to


@dataclass(slots=True)
class _Watch:
    ran: float = 0.0  # running seconds of the runs that ended
    since: float | None = None  # the run in progress began; None while not watched
    heard_at: float = 0.0  # its last report, or the start of the run
    ran_at_report: float | None = None  # its running seconds at its last report: the next one times a step
    reported_in_run: bool = False  # the run in progress reported: it no longer starts up
    slowest_step: float = 0.0  # running seconds between two reports
    slowest_start: float = 0.0  # ...to a run's first report, from its start or the report before: start-up included
    limits: TrialLimits | None = None  # the trial's own; None: the watchdog's
    exiting_since: float | None = None  # it committed its suspension or its loop thread stopped: exits in EXIT_GRACE
    told: str = SUSPENSION_COMMITTED  # which of the two
    awaiting_since: float | None = None  # it reported, and waits for the answer

    def running(self, now: float) -> float:
        """Its running seconds in all by ``now``."""
        return self.ran + (now - self.since if self.since is not None else 0.0)

    def skip(self, gap: float, now: float) -> None:
        """Let the ``gap`` seconds before ``now`` not have passed for its run: what its clocks mark before them moves on
        by as much, what they mark within them moves to ``now`` (a report heard there counts as heard at ``now``)."""
        def moved(moment: float) -> float:
            return moment + min(gap, now - moment)

        self.since, self.heard_at = moved(self.since), moved(self.heard_at)
        if self.exiting_since is not None:
            self.exiting_since = moved(self.exiting_since)
        if self.awaiting_since is not None:
            self.awaiting_since = moved(self.awaiting_since)
        if self.ran_at_report is not None:
            self.ran_at_report = min(self.ran_at_report, self.running(now))

    def answered(self, now: float) -> None:
        """The wait for its answer ends: it was no silence, and no running time."""
        if self.awaiting_since is not None:
            self.skip(now - self.awaiting_since, now)
            self.awaiting_since = None


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
            watch.reported_in_run, watch.exiting_since, watch.awaiting_since = False, None, None
            self._watched[trial_id] = watch

    def reported(self, trial_id: str, now: float) -> None:
        watch = self._watched.get(trial_id)
        if watch is None:
            return
        ran = watch.running(now)
        step = None if watch.ran_at_report is None else ran - watch.ran_at_report
        if step is not None:
            watch.slowest_step = max(watch.slowest_step, step)
        if not watch.reported_in_run:
            watch.slowest_start = max(watch.slowest_start, step if step is not None else ran - watch.ran)
        watch.heard_at, watch.ran_at_report, watch.reported_in_run = now, ran, True

    def awaiting(self, trial_id: str, now: float) -> None:
        """It reported, and waits for the core's answer: neither its stall nor its timeout runs out till then."""
        watch = self._watched.get(trial_id)
        if watch is not None and watch.awaiting_since is None:
            watch.awaiting_since = now

    def answered(self, trial_id: str, now: float) -> None:
        """The report it waited on is answered: its clocks skip the wait."""
        watch = self._watched.get(trial_id)
        if watch is not None:
            watch.answered(now)

    def paused(self, gap: float, now: float) -> None:
        """Its runner was stopped (or held up) for the ``gap`` seconds before ``now``: they pass for no watched trial,
        which could not be heard, or was stopped too."""
        for watch in self._watched.values():
            watch.skip(gap, now)

    def exiting(self, trial_id: str, now: float, told: str = SUSPENSION_COMMITTED) -> None:
        """It committed its suspension, or a thread of it ended with its StopExit (``told``): all it has left to do is
        exit, within ``EXIT_GRACE`` seconds of the first such word (a stop alone arms nothing)."""
        watch = self._watched.get(trial_id)
        if watch is not None and watch.exiting_since is None:
            watch.exiting_since, watch.told = now, told

    def stopped(self, trial_id: str, now: float, *, ended: bool = False) -> None:
        """It gave up its slot (suspended, lost, or killed by the watchdog), or ``ended``: not watched."""
        watch = self._watched.pop(trial_id, None)
        if watch is not None:
            watch.answered(now)
            if watch.exiting_since is not None and watch.ran_at_report is not None:  # lingering is no step's time
                watch.ran_at_report += now - watch.exiting_since
            watch.ran = watch.running(now)
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
        # a trial awaiting its answer waits on the runner: none of its limits runs out
        limits = NO_LIMITS if watch.awaiting_since is not None else watch.limits or self.limits
        found = []
        if limits.timeout is not None:
            found.append((watch.since + limits.timeout - watch.ran,
                          f"timed out: it ran {limits.timeout:g}s in all (trial.timeout)"))
        if limits.stall_after is not None:
            found.append((watch.heard_at + limits.stall_after,
                          f"hung: no report for {limits.stall_after:g}s (trial.stall.after)"))
        if limits.stall_factor and watch.slowest_step > 0:  # it reported twice
            if watch.reported_in_run:
                silence = max(limits.stall_factor * watch.slowest_step, limits.stall_min)
                why = f"its slowest step took {watch.slowest_step:.3g}s"
            else:
                # a resumed run's first report holds a whole step at least: its earlier runs' first reports may have
                # been quick (a baseline evaluation before any training)
                slowest = max(watch.slowest_start, watch.slowest_step)
                silence = max(limits.stall_factor * slowest, limits.stall_min)
                why = (f"its slowest run took {watch.slowest_start:.3g}s to its first report"
                       if watch.slowest_start >= watch.slowest_step else f"its slowest step took {slowest:.3g}s")
            found.append((watch.heard_at + silence,
                          f"hung: no report for {silence:.3g}s, while {why} "
                          f"(trial.stall: factor {limits.stall_factor:g}, min {limits.stall_min:g}s)"))
        if watch.exiting_since is not None:
            found.append((watch.exiting_since + EXIT_GRACE, f"it did not exit within {EXIT_GRACE:g}s of {watch.told}"))
        return found
