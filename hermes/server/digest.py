"""What the dashboard shows of one experiment, kept up to date by reading only what the store added.

A digest follows the store's cursors (events by sequence number, reports by cursor) and keeps,
per trial, its record with its best and last value and its first report, and the runs of the
GPU timeline with the reason of the decisions that began and ended them. Every change bumps a
version, and each trial and run remembers the version it last changed at, so a client that
polls with the version it has gets only what changed since: with 5,000 trials a poll of a
running experiment carries a few rows, not the whole table.

Versions are counted from the event log alone, event by event (the runs each event changed, then
the trials whose records the store rewrote with it), never from when a digest happened to read
the store: a digest built again (after a restart of the server, or dropped and rebuilt) numbers
every change as the earlier one did, so a client's version still means the same point of the log.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict
from typing import Any

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuReclaimed,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    SubmissionsClosed,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.scheduler import NO_REPORT
from hermes.report import Target
from hermes.report.results import can_be_best
from hermes.store import (
    DecisionRecord,
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    RunTimeline,
    TrialRecord,
)

STOPPED_ERROR = "stopped"  # the error of the TrialExited that answers a Stop (hermes.execution.contract)
NO_REPORT_REASON = NO_REPORT.partition(":")[0]  # "ended without a report": why the core fails a trial that exits so
REFRESH_INTERVAL = 0.5  # seconds: polls from many tabs within this share one read of the store


class ExperimentDigest:
    def __init__(self, store: ExperimentStore, experiment: ExperimentRecord) -> None:
        self.store = store
        self.experiment_id = experiment.experiment_id
        self.target = Target.of(experiment)
        self.pooled = experiment.owner is not None  # a pool's experiment: its GPUs come and go as the pool decides
        self.version = 0
        self.now = 0.0  # the latest time on the experiment's clock seen in its log
        self.trials: dict[str, dict[str, Any]] = {}  # trial id -> summary, with the version it changed at
        self.timeline = RunTimeline()
        self.run_versions: list[int] = []
        self.run_reasons: list[dict[str, str]] = []  # per run: why it began ("start"), why it was asked to end
        self.gpus: list[str] = []  # in order of arrival
        self._records: dict[str, TrialRecord] = {}
        self._reported: set[str] = set()  # trials with a report in the log: one that exits without any failed
        self._last_reported: dict[str, int] = {}  # trial id -> the last step it reported (its reports read)
        self._records_read = False  # the trials' records, since the events that may change them were followed
        self._seq = 0
        self._metric_cursor = 0
        self._read_at = -math.inf
        self._status: tuple[ExperimentStatus, str | None] | None = None  # as last read
        self._lock = threading.Lock()

    def refresh(self, status: ExperimentStatus, error: str | None = None) -> None:
        """Read what the store added since the last refresh: at most every REFRESH_INTERVAL, and at once when the
        experiment's status or error changed (so a finished experiment shows all it recorded, and one a pool set
        waiting shows the runs it ended before saying so, its status unchanged)."""
        with self._lock:
            if time.monotonic() - self._read_at < REFRESH_INTERVAL and (status, error) == self._status:
                return
            read_at = time.monotonic()
            events = self.store.events_after(self.experiment_id, self._seq)
            if events:
                self._follow(events, self.store.decisions_after(self.experiment_id, self._seq, events[-1][0]))
                self._records_read = False
            self._read_reports()
            if not self._records_read:
                self._read_records()
                self._records_read = True
            # only once all was read: a damaged record (DamagedRecord) is said at every poll, not once and then
            # followed by trials without their records
            self._status, self._read_at = (status, error), read_at

    @classmethod
    def ended_overview(cls, store: ExperimentStore, experiment: ExperimentRecord) -> dict[str, Any]:
        """``overview`` of an ended experiment, read from its trial records and reports alone: its event log and
        decisions, most of a digest's work (5,000 trials, 73,000 reports: a digest in 1.8 s, this in 0.7 s), only make
        the timeline and number the changes, and an ended experiment has nothing left to follow. Its trials come in
        the order of their first records, which is the order of their submissions, as in a digest."""
        digest = cls(store, experiment)
        digest._read_records()
        digest._read_reports()
        return digest.overview()

    # Readers take the lock and return copies: requests are served from several threads while one refreshes.
    def trials_since(self, version: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to ``limit`` trials changed after ``version``, in the order they changed, and the version
        to ask from next (the digest's version once nothing is left)."""
        with self._lock:
            changed = sorted((s for s in self.trials.values() if s["version"] > version), key=lambda s: s["version"])
            if len(changed) <= limit:
                return [dict(summary) for summary in changed], self.version
            return [dict(summary) for summary in changed[:limit]], changed[limit - 1]["version"]

    def trial(self, trial_id: str) -> dict[str, Any] | None:
        with self._lock:
            summary = self.trials.get(trial_id)
            return None if summary is None else dict(summary)

    def runs_since(self, version: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """As ``trials_since``, for the runs of the GPU timeline."""
        with self._lock:
            versions = self.run_versions
            changed = sorted((i for i, v in enumerate(versions) if v > version), key=versions.__getitem__)
            next_version = self.version if len(changed) <= limit else self.run_versions[changed[limit - 1]]
            runs = self.timeline.runs
            return [
                {"index": i, **_run_fields(runs[i]), **self.run_reasons[i], "version": self.run_versions[i]}
                for i in changed[:limit]
            ], next_version

    def overview(self) -> dict[str, Any]:
        """Trials by state, and the best trial with its best value (never a failed one: ``can_be_best``)."""
        with self._lock:
            by_state: dict[str, int] = {}
            for summary in self.trials.values():
                by_state[summary["state"]] = by_state.get(summary["state"], 0) + 1
            scored = [summary for summary in self.trials.values()
                      if summary["best"] is not None and can_be_best(summary["state"])]
            best = max(scored, key=lambda summary: self.target.objective.score(summary["best"]), default=None)
            return {"trials": len(self.trials), "by_state": by_state,
                    "best": best and best["best"], "best_trial": best and best["trial"]}

    # ------------------------------------------------------------------ following the store
    def _read_reports(self) -> None:
        reports = self.store.metrics_after(self.experiment_id, self._metric_cursor)
        if reports:
            self._metric_cursor = reports[-1][0]
        for _cursor, report in reports:
            self._take_report(report.trial_id, report.step, report.at, report.values)

    def _read_records(self) -> None:
        for record in self.store.trials(self.experiment_id):
            if self._records.get(record.trial_id) != record:
                self._records[record.trial_id] = record
                summary = self._summary(record.trial_id)
                summary.update(_record_fields(record))
                summary["step"] = self._step(record.trial_id)

    def _follow(self, events: list[tuple[int, Event]], decisions: list[DecisionRecord]) -> None:
        by_event: dict[int, list[DecisionRecord]] = {}
        for record in decisions:
            by_event.setdefault(record.event_seq, []).append(record)
        for seq, event in events:
            self.now = max(self.now, event.at)
            if isinstance(event, TrialReported):
                self._reported.add(event.trial_id)
            reported = getattr(event, "trial_id", None) in self._reported
            if isinstance(event, NodeAdded):
                self.gpus += [gpu for gpu in event.gpus if gpu not in self.gpus]
            elif isinstance(event, GpuAdded) and event.gpu not in self.gpus:
                self.gpus.append(event.gpu)
            records = by_event.get(seq, [])
            changed = self.timeline.feed(event, records)
            self.run_reasons += [{} for _ in range(len(self.timeline.runs) - len(self.run_reasons))]
            for record in records:
                index = self.timeline.open_run(record.decision.trial_id)
                if index is not None:
                    key = "start_reason" if isinstance(record.decision, (Start, Resume)) else "yield_reason"
                    self.run_reasons[index].setdefault(key, explain(event, record.decision, self.pooled, reported))
            for index in changed:
                run = self.timeline.runs[index]
                if "end_reason" not in self.run_reasons[index] and run.ended_at is not None:
                    self.run_reasons[index]["end_reason"] = describe(
                        event, self.pooled, stopped=run.ended_by == "stopped", reported=reported
                    )
            self.run_versions += [0] * (len(self.timeline.runs) - len(self.run_versions))
            for index in sorted(changed):  # a version each, so that pages of runs end between two versions
                self.version += 1
                self.run_versions[index] = self.version
            for trial_id in self._rewritten(event, records):
                self._touch(trial_id)
            self._seq = seq

    def _rewritten(self, event: Event, records: list[DecisionRecord]) -> list[str]:
        """The trials whose records the store may have rewritten with ``event`` (a superset of
        ``StoreRecorder.changed_records``), in an order fixed by the log: their reports and records are read
        apart from the events, so the event is what gives their changes a version."""
        changed = {record.decision.trial_id for record in records}
        trial_id = getattr(event, "trial_id", None)
        if trial_id is not None:
            changed.add(trial_id)
        if isinstance(event, (NodeAdded, NodeRemoved, GpuRemoved)):  # rewrites those running, or lost: any logged
            changed.update(t for t, summary in self.trials.items() if summary["version"])
        return sorted(changed)

    def _take_report(self, trial_id: str, step: int, at: float, values: dict[str, float]) -> None:
        value = self.target.value(values)
        summary = self._summary(trial_id)
        summary["reports"] += 1
        self._last_reported[trial_id] = max(step, self._last_reported.get(trial_id, 0))
        summary["step"] = self._step(trial_id)
        summary["metrics"] = _json_numbers(values)
        if summary["first_report_at"] is None:
            summary["first_report_at"] = at
        if value is not None:
            summary["last"] = _json_number(value)  # a diverged trial's last is "nan", not "never reported"
            score = self.target.objective.score(value)
            if summary["best"] is None or score > self.target.objective.score(summary["best"]):
                if math.isfinite(value):
                    summary["best"], summary["best_step"] = value, step
        self.now = max(self.now, at)

    def _step(self, trial_id: str) -> int:
        """The trial's steps, as ``hermes results`` counts them: the last step it reported, where that is ahead of its
        record's step, which falls back to its checkpoint's when a run ends before saving (a kill -9 of the server,
        a crash), so that its best (``best_step``) was at a step past its steps."""
        record = self._records.get(trial_id)
        return max(0 if record is None else record.step, self._last_reported.get(trial_id, 0))

    def _summary(self, trial_id: str) -> dict[str, Any]:
        summary = self.trials.get(trial_id)
        if summary is None:
            summary = self.trials[trial_id] = {
                "trial": trial_id, "state": "pending", "params": {}, "budget": 0, "step": 0, "gpu": None,
                "error": None, "submitted_at": None, "started_at": None, "ended_at": None, "best": None,
                "best_step": None, "last": None, "reports": 0, "first_report_at": None, "metrics": {},
                "checkpoint_step": 0, "version": 0,
            }
        return summary

    def _touch(self, trial_id: str) -> None:
        self.version += 1
        self._summary(trial_id)["version"] = self.version


# ---------------------------------------------------------------------- reasons of decisions
def describe(event: Event, pooled: bool = False, stopped: bool = False, reported: bool = True) -> str:
    """What happened, in words, for the timeline's tooltips. ``pooled``: in a pool's experiment, GPUs come as the
    pool's grants, not as nodes that join. ``stopped``: the trial that exited had been told to stop (a Stop
    decision), which the core records as stopped whatever its process said. ``reported``: the trial that exited
    had reported (the core fails one that ends without a report, however its process ended)."""
    at = f"at {event.at:.1f}s"
    if pooled and isinstance(event, (NodeAdded, GpuAdded)):
        gpus = event.gpus if isinstance(event, NodeAdded) else (event.gpu,)
        return f"the pool gave the experiment {', '.join(gpus)} {at}"
    if isinstance(event, TrialSubmitted):
        return f"trial {event.trial_id} was submitted {at}"
    if isinstance(event, TrialReported):
        return f"trial {event.trial_id} reported {event.value:.4g} at step {event.step} ({at})"
    if isinstance(event, TrialSuspended):
        return f"trial {event.trial_id} released its GPU after step {event.step} ({at})"
    if isinstance(event, TrialExited):
        return f"trial {event.trial_id} {_exit(event, stopped, reported)} {at}"
    if isinstance(event, PeriodElapsed):
        return f"the scheduling period elapsed {at}: the policy ranked the trials again"
    if isinstance(event, NodeAdded):
        return f"node {event.node} joined with {len(event.gpus)} GPU(s) {at}"
    if isinstance(event, NodeRemoved):
        return f"node {event.node} left {at}"
    if isinstance(event, GpuAdded):
        return f"GPU {event.gpu} was added {at}"
    if isinstance(event, GpuRemoved):
        return f"GPU {event.gpu} was removed {at}"
    if isinstance(event, GpuReclaimed):  # only a pool takes a GPU back (hermes.core.pool)
        if event.preempt:
            return f"the pool took GPU {event.gpu} back for an experiment below its fair share {at}"
        return f"the pool took GPU {event.gpu} back as its trial released it {at}"
    if isinstance(event, ExperimentCancelled):
        return f"the experiment was cancelled {at}: {event.reason}"
    if isinstance(event, SubmissionsClosed):
        return f"the searcher proposed its last trial {at}"
    if isinstance(event, SubmissionsReopened):
        return f"a larger budget reopened submissions {at}"
    return f"{type(event).__name__} {at}"


def _exit(event: TrialExited, stopped: bool, reported: bool) -> str:
    """How a trial's process ended. The execution contract answers a Stop with ``TrialExited(succeeded=False,
    error="stopped")``: that is the trial obeying, no failure (the core records it stopped, as it does any trial
    it told to stop). ``crashed``: its code or process failed, and the core may run it again from its checkpoint;
    any other error (a limit, a launch that failed, a misuse of the protocol) fails it, as does a process that
    ended well without ever reporting (``reported``: nothing to rank it by)."""
    if event.succeeded and reported:
        return "completed"
    if event.error == STOPPED_ERROR or stopped:
        return "stopped"
    if event.succeeded:
        return f"failed ({NO_REPORT_REASON})"
    reason = ((event.error or "").strip().splitlines() or ["no reason given"])[0][:80]
    return f"{'crashed' if event.crashed else 'failed'} ({reason})"


def explain(event: Event, decision: Decision, pooled: bool = False, reported: bool = True) -> str:
    """Why the core decided ``decision``: the verb and the event that caused it (``pooled``, ``reported``: see
    ``describe``)."""
    if isinstance(decision, Start):
        verb = f"started on {decision.gpu}"
    elif isinstance(decision, Resume):
        verb = f"{'migrated to' if decision.migrated else 'resumed on'} {decision.gpu}"
    elif isinstance(decision, Suspend):
        verb = "asked to suspend"
    elif isinstance(decision, Stop):
        verb = "asked to stop"
    else:
        verb = type(decision).__name__
    return f"{verb} because {describe(event, pooled, reported=reported)}"


def _record_fields(record: TrialRecord) -> dict[str, Any]:
    return {
        "state": record.state.value, "params": record.params, "budget": record.budget, "step": record.step,
        "gpu": record.gpu, "error": record.error, "submitted_at": record.submitted_at,
        "started_at": record.started_at, "ended_at": record.ended_at, "checkpoint_step": record.checkpoint_step,
    }


def _run_fields(run: Any) -> dict[str, Any]:
    fields = asdict(run)
    fields["trial"] = fields.pop("trial_id")
    return fields


def _json_number(value: float) -> float | str:
    """JSON has no NaN or infinity: those travel as the strings Python's float() reads back."""
    return value if math.isfinite(value) else str(value)


def _json_numbers(values: dict[str, float]) -> dict[str, float | str]:
    return {name: _json_number(value) for name, value in values.items()}
