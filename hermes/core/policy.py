"""The two plug-in points of the core: a scheduling policy and an optional early stopper.

Both only answer questions; the core turns their answers into decisions. Their state that must
survive a restart is plain data (``state_dict``), never a pickled object. They live with the core
because the core calls them; the implementations (``hermes.policies``) depend on this module,
never the other way round.
"""

from __future__ import annotations

import json
import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from numbers import Real
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from hermes.core.trial import Trial
from hermes.errors import HermesError

if TYPE_CHECKING:
    from collections.abc import Callable

    from hermes.core.decisions import Decision


class Verdict(str, Enum):
    """A policy's answer to a report, as in Ray Tune's TrialScheduler."""

    CONTINUE = "continue"  # keep running; preemption follows the usual turn rules
    PAUSE = "pause"  # suspend now (resumable)
    STOP = "stop"  # end the trial for good


# The members under plain names, for the core's hot paths (see hermes.core.states).
CONTINUE = Verdict.CONTINUE
PAUSE = Verdict.PAUSE
STOP = Verdict.STOP


@dataclass(frozen=True, slots=True)
class ExecutionProfile:
    """What the engine that carries out the decisions costs, told to the policy before it decides.

    An executor describes itself (``Executor.profile``); the runner hands that to
    ``SchedulingPolicy.configure``, so no policy needs to know which engine it runs on.
    """

    switch_cost: float  # typical seconds of GPU time one suspend plus resume costs
    migration_cost: float = 0.0  # what a resume on another GPU than the one the trial left adds to that


class SchedulingPolicy(ABC):
    """Decides which waiting trial gets a free GPU and when a running one must yield.

    ``time_sharing`` policies admit more trials than GPUs and may preempt a running trial once
    its turn (``period`` seconds of GPU time since it last started) is over and a waiting trial
    has a higher priority. Other policies run each trial to completion.
    """

    name: ClassVar[str]  # in results and logs; a subclass that sets none is named after its class
    time_sharing: ClassVar[bool] = True
    order_version: int | None = None
    """A promise that lets the core sort waiting trials once instead of scanning them at every
    decision: the relative order of waiting trials does not change as time passes, only when this
    counter changes (the policy bumps it). None: no such promise."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # its own body's: a parent's name would make it pass for its parent
            cls.name = cls.__name__

    def __init__(self, period: float = 60.0) -> None:
        if not period > 0:
            raise ValueError(f"the scheduling period must be positive, got {period}")
        self.period = period

    @abstractmethod
    def priority(self, trial: Trial, now: float) -> float | None:
        """Higher runs first; None means the trial must not run now. Ties go to the earlier arrival.

        A number (int, float or any ``numbers.Real``) that is not NaN, or None: the core refuses anything else
        (``PluginError``), NaN included, since it compares false with everything."""

    def observe(self, trial: Trial, now: float) -> Verdict:
        """Called after each report of ``trial`` (already recorded on it). Anything but a ``Verdict`` (the string
        "stop", None) is refused (``PluginError``)."""
        return Verdict.CONTINUE

    def configure(self, profile: ExecutionProfile) -> None:
        """Adapt to the engine's costs before the first event; settings the user gave explicitly win.

        The default ignores the profile; a policy that weighs switches against their cost uses it."""

    def migration_penalty(self, trial: Trial, now: float) -> float:
        """Priority that waiting ``trial`` gives up to resume on another GPU than the one it left: a GPU that frees
        goes to a trial of its own within that of the best (0, the default: placement follows priority alone)."""
        return 0.0

    def turn_over(self, trial: Trial, now: float) -> bool:
        """Whether a running trial has had its turn and may be preempted by a better one."""
        return trial.running_since is not None and now - trial.running_since >= self.period

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def submissions_closed(self, closed: bool) -> None:
        """Told when submissions close (every trial that will come is the core's) and when they reopen (a larger
        budget): a policy that holds trials back for ones to come may then let them go."""

    def attach(self, trials: Mapping[str, Trial]) -> None:
        """The core's trials, a live mapping, when the core is made and after ``load_state_dict``: for a policy that
        keeps references to them or looks at them all (they are core objects, not plain data, so ``state_dict``
        cannot hold them)."""


class EarlyStopper(ABC):
    """Ends hopeless trials; composes with any scheduling policy."""

    name: ClassVar[str]  # a subclass that sets none is named after its class

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # as for SchedulingPolicy
            cls.name = cls.__name__

    @abstractmethod
    def should_stop(self, trial: Trial) -> bool:
        """Called after each report of ``trial`` (already recorded on it). True or False (a numpy bool too): the core
        refuses anything else (``PluginError``), since "no" would stop the trial."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class PluginError(HermesError):
    """A policy or an early stopper raised, or answered what the core cannot use. It names the plug-in (its import
    path), the method and the problem, so that the experiment's failure says whose code to fix. ``decisions``: what
    the core had decided about the event before it failed (``Scheduler.handle``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.decisions: list[Decision] = []


def plugin_raised(plugin: SchedulingPolicy | EarlyStopper, method: str, error: Exception,
                  trial: Trial | None = None) -> PluginError:
    """``error``, raised by the plug-in's ``method``, as the plug-in's error (the caller chains the original)."""
    about = f" (trial {trial.trial_id})" if trial is not None else ""
    return PluginError(f"{_described(plugin)}: {method}() raised {type(error).__name__}: {error}{about}")


def plugin_answered(plugin: SchedulingPolicy | EarlyStopper, method: str, trial: Trial, answer: object,
                    expected: str) -> PluginError:
    """An answer of the plug-in's ``method`` that the core cannot use, said with what it must be."""
    return PluginError(f"{_described(plugin)}: {method}() returned {answer!r} ({type(answer).__name__}) for trial "
                       f"{trial.trial_id}; it must return {expected}")


def plugin_call(plugin: SchedulingPolicy | EarlyStopper, method: str, *args: Any) -> Any:
    """``plugin.method(*args)``, for the calls made outside the hot paths (``configure``, ``attach``,
    ``load_state_dict``): what it raises is the plug-in's ``PluginError``, not a traceback through the caller."""
    try:
        return getattr(plugin, method)(*args)
    except Exception as error:
        raise plugin_raised(plugin, method, error) from error


def plugin_state(plugin: SchedulingPolicy | EarlyStopper) -> dict[str, Any]:
    """``plugin.state_dict()`` after a round trip through JSON, as a restored plug-in gets it: its state must be
    plain data. What it raises, or a state that JSON cannot hold (a set, a ``Trial``), is its ``PluginError``."""
    state = plugin_call(plugin, "state_dict")
    try:
        return json.loads(json.dumps(state))
    except (TypeError, ValueError) as error:
        raise PluginError(f"{_described(plugin)}: state_dict() returned what JSON cannot hold ({error}); it must "
                          "return plain data: dicts, lists, strings, numbers, booleans, None") from error


def checked_priority(policy: SchedulingPolicy, trial: Trial, now: float) -> float | None:
    """``policy.priority``, where the core asks it: what it raises, or an answer that does not rank (not a number;
    NaN, whose place would depend on the order trials are looked at), fails as the policy's ``PluginError``."""
    try:
        priority = policy.priority(trial, now)
    except Exception as error:
        raise plugin_raised(policy, "priority", error, trial) from error
    if priority is None or type(priority) is int or (type(priority) is float and not math.isnan(priority)):
        return priority  # the common cases, cheaply
    if isinstance(priority, Real) and not math.isnan(priority):  # numpy's floats, a bool, a Fraction
        return priority
    raise plugin_answered(policy, "priority", trial, priority, "a number (not NaN), or None for not now")


def checked_migration_penalty(policy: SchedulingPolicy, trial: Trial, now: float) -> float:
    """``policy.migration_penalty``, where the core asks it: what it raises, or an answer that is not a number of at
    least 0 (NaN included), fails as the policy's ``PluginError``."""
    try:
        penalty = policy.migration_penalty(trial, now)
    except Exception as error:
        raise plugin_raised(policy, "migration_penalty", error, trial) from error
    if isinstance(penalty, Real) and penalty >= 0:  # NaN is not >= 0
        return float(penalty)
    raise plugin_answered(policy, "migration_penalty", trial, penalty, "a number >= 0")


def checked_should_stop(stopper: EarlyStopper, trial: Trial) -> bool:
    """``stopper.should_stop``, where the core asks it: True or False (numpy's bools too); what it raises, or any
    other answer ("no" is true, a numpy array has no truth), fails as the stopper's ``PluginError``."""
    return _checked_bool(stopper, "should_stop", trial, lambda: stopper.should_stop(trial))


def checked_turn_over(policy: SchedulingPolicy, trial: Trial, now: float) -> bool:
    """``policy.turn_over``, where the node scheduler asks it: True or False (numpy's bools too); what it raises, or any
    other answer ("no" would preempt at every turn, a forgotten return never), fails as the policy's ``PluginError``."""
    return _checked_bool(policy, "turn_over", trial, lambda: policy.turn_over(trial, now))


def _checked_bool(plugin: SchedulingPolicy | EarlyStopper, method: str, trial: Trial, ask: Callable[[], object]) -> bool:
    try:
        answer = ask()
    except Exception as error:
        raise plugin_raised(plugin, method, error, trial) from error
    if answer is False or answer is True:
        return answer
    numpy = sys.modules.get("numpy")  # imported already wherever a numpy bool can come from: the core imports none
    if numpy is not None and type(answer) is numpy.bool_:
        return bool(answer)
    raise plugin_answered(plugin, method, trial, answer, "True or False")


def held_back(policy: SchedulingPolicy) -> str:
    """Why the core stopped a trial that ``policy`` said not now to (priority None) when nothing ran and no trial could
    come: no event was left to ask it again. The trial's error, so that the run's outcome names the policy."""
    return (f"{_described(policy)} answered priority() None (not now) with nothing running and no trial to come: no "
            "event was left to ask it again")


def _described(plugin: SchedulingPolicy | EarlyStopper) -> str:
    """The plug-in by kind and import path: what a spec names it by, and where its code is."""
    kind = "policy" if isinstance(plugin, SchedulingPolicy) else "early stopper"
    return f"{kind} {type(plugin).__module__}:{type(plugin).__qualname__}"
