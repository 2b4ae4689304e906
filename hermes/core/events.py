"""Events: what happened, in the past tense, each stamped with the engine's clock.

The core has no clock of its own: ``at`` is the only source of time it sees. Events are values
that nothing modifies; they are not frozen dataclasses only because building a frozen one costs
several times as much, and a simulation builds one for every reported step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(slots=True)
class TrialSubmitted:
    at: float
    trial_id: str
    budget: int  # steps (epochs) the trial trains when it is never stopped
    params: Mapping[str, Any] = field(default_factory=dict)
    movable: bool = True  # False when suspension keeps the process resident: it resumes on its own GPU only


@dataclass(slots=True)
class TrialReported:
    """A running trial finished step ``step`` and measured ``value`` of the objective metric.

    ``metrics`` holds every metric of the report, the objective among them (None: the objective
    alone, as a simulator replays it)."""

    at: float
    trial_id: str
    step: int
    value: float
    checkpointed: bool = False  # a checkpoint of this step is durable: a crash resumes from here
    metrics: Mapping[str, float] | None = None


@dataclass(slots=True)
class TrialSuspended:
    """A suspending trial saved its checkpoint at ``step`` and released its GPU."""

    at: float
    trial_id: str
    step: int


@dataclass(slots=True)
class TrialExited:
    """The trial's process ended: it finished its budget, crashed, or obeyed a stop.

    ``crashed``: its code or process failed (an exception, a signal, an exit code, its worker's death), which
    running it again from its checkpoint may get past; not a limit that ended it (its timeout, a stall) nor a
    misuse of the protocol, which would end it the same way again."""

    at: float
    trial_id: str
    succeeded: bool
    error: str | None = None
    crashed: bool = False


@dataclass(slots=True)
class NodeAdded:
    at: float
    node: str
    gpus: tuple[str, ...]


@dataclass(slots=True)
class NodeRemoved:
    """The node left or died: every trial on its GPUs loses its process."""

    at: float
    node: str


@dataclass(slots=True)
class GpuAdded:
    at: float
    node: str
    gpu: str


@dataclass(slots=True)
class GpuRemoved:
    at: float
    gpu: str


@dataclass(slots=True)
class GpuReclaimed:
    """A shared pool takes ``gpu`` back from this experiment (``hermes.core.pool``): a free GPU
    leaves at once; a held one leaves when its trial releases it, and this experiment never
    refills it meanwhile."""

    at: float
    gpu: str
    preempt: bool = False  # suspend its running trial now (else the trial is leaving by itself)


@dataclass(slots=True)
class PeriodElapsed:
    """A scheduling period passed: running trials whose turn is over may be preempted."""

    at: float


@dataclass(slots=True)
class SubmissionsClosed:
    """No more trials will be submitted: the experiment ends once nothing is left to run."""

    at: float


@dataclass(slots=True)
class SubmissionsReopened:
    """A finished or closed experiment takes trials again (its budget was extended by a rerun)."""

    at: float


@dataclass(slots=True)
class ExperimentCancelled:
    """The experiment ends now (its time or GPU budget is spent, or a user cancelled it): no more
    submissions, and every unfinished trial is stopped."""

    at: float
    reason: str = ""


Event = (
    TrialSubmitted
    | TrialReported
    | TrialSuspended
    | TrialExited
    | NodeAdded
    | NodeRemoved
    | GpuAdded
    | GpuRemoved
    | GpuReclaimed
    | PeriodElapsed
    | SubmissionsClosed
    | SubmissionsReopened
    | ExperimentCancelled
)
