"""The local engine: a spec's trials as processes on this machine's GPUs, or its CPU slots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError
from hermes.execution.registry import ExecutionEngine
from hermes.experiment.command import command_argv
from hermes.local.executor import LocalExecutor
from hermes.local.launch import PROCESS_SWITCH_COST, SIGSTOP_SWITCH_COST, WARM_SWITCH_COST, TrialLaunch
from hermes.local.resources import Slot, discover_gpus, local_slots
from hermes.local.watchdog import TrialLimits

if TYPE_CHECKING:
    from hermes.experiment.spec import ExperimentSpec, ResourcesSpec


class LocalEngine(ExecutionEngine):
    starts_at_once = True

    def __init__(self, spec: ExperimentSpec) -> None:
        super().__init__(spec)
        self.slots = slots_for(spec.resources)

    def capacity(self) -> int:
        return len(self.slots)

    def profile(self) -> ExecutionProfile:
        return trial_profile(self.spec)

    def work(self, params: Mapping[str, Any]) -> TrialLaunch:
        return trial_launch(self.spec, params, self.workdir)

    def executor(self, directory: Path, clock_offset: float) -> LocalExecutor:
        spec = self.spec
        return LocalExecutor(
            directory,
            slots=self.slots,
            metric=spec.metric.name,
            checkpoint_every=spec.storage.checkpoint_every,
            period=tick_period(spec),
            clock_offset=clock_offset,
            cwd=Path(self.workdir),
        )


MIN_TICK_S = 0.01  # no process switches faster: a policy.period of 1e-4 s wrote 1,200 ticks a second to the store


def tick_period(spec: ExperimentSpec) -> float | None:
    """Seconds between the executor's PeriodElapsed events for the spec's trials, or None for none.

    Unmodified scripts may print rarely: period ticks let the core preempt them between reports.
    Cooperative trials yield at reports anyway, as in the simulator."""
    return max(spec.policy.settings.get("period") or 60.0, MIN_TICK_S) if spec.trial.metrics_regex else None


def trial_profile(spec: ExperimentSpec) -> ExecutionProfile:
    """What a switch of the spec's trials costs when they run as processes (here, or on a Ray node)."""
    trial = spec.trial
    if trial.function is not None:
        cost = WARM_SWITCH_COST if trial.warm_workers else PROCESS_SWITCH_COST
    else:
        cost = SIGSTOP_SWITCH_COST if trial.metrics_regex else PROCESS_SWITCH_COST
    return ExecutionProfile(switch_cost=cost)


def trial_launch(spec: ExperimentSpec, params: Mapping[str, Any], workdir: str) -> TrialLaunch:
    """What runs for a trial of the spec with these hyper-parameters, in ``workdir`` (the spec's, resolved once
    by the engine: resolving it for each of a large search's trials took longer than the rest of a submission)."""
    trial = spec.trial
    limits = TrialLimits(timeout=trial.timeout, stall_factor=trial.stall.factor, stall_min=trial.stall.min,
                         stall_after=trial.stall.after)  # carried by each launch: a pool's or a Ray node's too
    common = dict(budget=spec.budget.steps, config=dict(params), cwd=workdir, limits=limits)
    if trial.function is not None:
        return TrialLaunch(function=trial.function, warm=trial.warm_workers, **common)
    return TrialLaunch(command=command_argv(trial.command, params), metric_pattern=trial.metrics_regex, **common)


def slots_for(resources: ResourcesSpec) -> list[Slot]:
    """The GPUs the spec asks for when this machine has them, else its CPU slots."""
    if resources.gpus != "none":
        found = discover_gpus()
        if isinstance(resources.gpus, list):
            missing = [index for index in resources.gpus if index >= len(found)]
            if missing:
                raise HermesError(f"resources.gpus: no GPU {missing[0]} on this machine ({len(found)} found)")
            found = [found[index] for index in resources.gpus]
        if found:
            return local_slots(gpus=found)
    return local_slots(cpu_slots=resources.cpu_slots, threads_per_slot=resources.threads_per_slot)
