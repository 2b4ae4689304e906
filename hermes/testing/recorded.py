"""A simulated experiment recorded into a store exactly as a runner records one, for tests and benchmarks
of what reads the store (the server, the dashboard): the real core, engine loop and StoreRecorder,
with simulated time, so thousands of trials take seconds.
"""

from __future__ import annotations

from dataclasses import replace

from hermes.core.events import SubmissionsClosed
from hermes.core.scheduler import Objective, Scheduler
from hermes.execution.engine import Engine
from hermes.experiment import parse_spec
from hermes.policies import make_policy
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.synthetic import synthetic_trace
from hermes.store import ExperimentStatus, ExperimentStore
from hermes.store.recorder import StoreRecorder

LAYOUT = {"n0": ("n0/g0", "n0/g1"), "n1": ("n1/g0", "n1/g1")}


def experiment_spec(name: str, trials: int, epochs: int) -> dict[str, object]:
    """A valid spec as the store keeps one (the trial function is never run)."""
    spec = parse_spec({
        "name": name,
        "trial": {"function": "examples.digits.train:train"},
        "search": {"trials": trials, "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
                                               "width": {"type": "choice", "values": [32, 64, 128]}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": epochs},
        "policy": {"name": "hermes", "period": 30.0},
    })
    return spec.model_dump(mode="json")


def record_simulated(
    store: ExperimentStore, experiment_id: int, trials: int, epochs: int = 8, *, seed: int = 0,
    policy: str = "hermes",
) -> Scheduler:
    """Run a synthetic trace of ``trials`` trials on four simulated GPUs into the store; return the core."""
    trace = synthetic_trace(trials, epochs, seed=seed, epoch_seconds=(5.0, 20.0), diverge_fraction=0.1)
    scheduler = Scheduler(make_policy(policy, period=30.0), objective=Objective("max"))
    executor = SimulatedExecutor(LAYOUT)
    engine = Engine(scheduler, executor, [StoreRecorder(store, experiment_id, scheduler)])
    widths = (32, 64, 128)
    for index, curve in enumerate(trace.trials):
        curve = replace(curve, params={"lr": 10.0 ** -(1 + (index * 7 % 30) / 10), "width": widths[index % 3]})
        engine.post(executor.submit(curve.name, curve))
    engine.post(SubmissionsClosed(0.0))
    store.set_status(experiment_id, ExperimentStatus.RUNNING)
    engine.run()
    store.set_status(experiment_id, ExperimentStatus.FINISHED)
    return scheduler
