"""One adapter per system: each trains the same configurations of ``workload.py`` on 2 slots and
returns the same timeline, so that ``compare.py`` computes every figure the same way.

Every system gets the configurations by index (``workload.configuration``), in the same arrival
order (``order``, drawn per round by compare.py): Hermes's spec lists the configurations in that
order (``sampler: list``, each with its index and its hyper-parameters, which the policy sees); Ray
Tune searches a grid over the index; Optuna has the indices enqueued in that order. A timeline's times are seconds since the system's
start: the call that runs the experiment (``ExperimentSession.run``, ``Tuner.fit``, or the start of
Optuna's worker processes); set-up before it (``ray.init``, creating the Optuna study) is reported
separately as ``setup``.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 2  # trials at once, one torch thread each


@dataclass(frozen=True, slots=True)
class Record:
    """One report: configuration ``index`` reached ``accuracy`` after ``epoch`` epochs."""

    at: float  # seconds since the system's start
    index: int
    epoch: int
    accuracy: float
    train_seconds: float  # wall time of that epoch's training and evaluation, measured in the trial


@dataclass(slots=True)
class Timeline:
    """What one system did: every report, in time order, and how long it ran."""

    system: str
    records: list[Record]
    wall: float  # seconds from the system's start until it returned
    setup: float = 0.0  # seconds spent before the start (not on the timeline)
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.records.sort(key=lambda record: record.at)


@dataclass(frozen=True, slots=True)
class Size:
    trials: int = 48
    epochs: int = 30


# ---------------------------------------------------------------------- Hermes (fifo and hermes policies)
def run_hermes(
    policy: str, size: Size, order: list[int], period: float | None = None, params: dict[str, Any] | None = None
) -> Timeline:
    """Hermes's own runner with ``policy``, storage in a temporary directory; the timeline is read
    back from its store (each report's metrics and the executor's time of the report)."""
    from bench.frameworks.workload import configuration
    from hermes.core.decisions import Suspend
    from hermes.experiment import parse_spec
    from hermes.session import ExperimentSession

    with tempfile.TemporaryDirectory(prefix=f"bench-{policy}-") as scratch:
        spec = parse_spec(
            {
                "name": f"frameworks-{policy}",
                "trial": {"function": "bench.frameworks.workload:hermes_trial", "workdir": str(ROOT)},
                # the configurations as a list, with their real hyper-parameters for the policy to see
                "search": {"sampler": "list", "configs": [{"index": index, **configuration(index)} for index in order]},
                "metric": {"name": "accuracy", "mode": "max"},
                "budget": {"steps": size.epochs},
                "policy": {"name": policy, **({} if period is None else {"period": period}), "params": params or {}},
                "resources": {"gpus": "none", "cpu_slots": SLOTS, "threads_per_slot": 1},
                # Checkpoints only when suspended and at the end: the other systems write none either.
                "storage": {"dir": scratch, "checkpoint_every": size.epochs},
            },
            source=f"frameworks-{policy}",
        )
        setup_start = time.time()
        runner = ExperimentSession(spec)
        start = time.time()
        runner.run()  # its executor's clock, which times the reports, starts within milliseconds of this
        wall = time.time() - start
        store, experiment = runner.store, runner.experiment_id
        try:
            index = {trial.trial_id: int(trial.params["index"]) for trial in store.trials(experiment)}
            records = [
                Record(m.at, index[m.trial_id], m.step, m.values["accuracy"], m.values["train_seconds"])
                for m in store.metrics(experiment)
            ]
            suspends = sum(isinstance(d.decision, Suspend) for d in store.decisions(experiment))
        finally:
            store.close()
    return Timeline(policy, records, wall, setup=start - setup_start, notes={"suspends": suspends})


# ---------------------------------------------------------------------- Ray Tune with ASHA
def _ray_trainable(config: dict[str, Any]) -> None:
    """A Ray Tune function trainable; it times its own reports so that Ray's delays count."""
    from ray import tune

    from bench.frameworks.workload import Trainer, configuration

    trainer = Trainer(configuration(config["index"]))
    for epoch in range(1, config["epochs"] + 1):
        accuracy, seconds = trainer.train_epoch()
        at = time.time() - config["start"]
        metrics = {"accuracy": accuracy, "epoch": epoch, "train_seconds": seconds, "at": at, "index": config["index"]}
        tune.report(metrics)


def run_ray_asha(size: Size, order: list[int]) -> Timeline:
    """Ray Tune's ASHA (grace period 1, reduction factor 3, max_t the budget) over a grid of the
    indices, one CPU per trial on a local Ray with 2 CPUs. Actors are reused between trials
    (``reuse_actors``), Ray's own remedy for start-up costs."""
    import logging

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no progress tables on the terminal
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as scratch:
        setup_start = time.time()
        # Workers import this package by name; they inherit the environment of ray.init's caller.
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        ray.init(
            num_cpus=SLOTS,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        )
        try:
            start = time.time()
            tuner = tune.Tuner(
                tune.with_resources(_ray_trainable, {"cpu": 1}),
                param_space={
                    "index": tune.grid_search(order), "epochs": size.epochs, "start": start
                },
                tune_config=tune.TuneConfig(
                    scheduler=ASHAScheduler(
                        metric="accuracy", mode="max", max_t=size.epochs, grace_period=1, reduction_factor=3
                    ),
                    num_samples=1,  # one pass over the grid: each configuration once
                    reuse_actors=True,
                ),
                run_config=tune.RunConfig(storage_path=scratch, name="asha", verbose=0),
            )
            results = tuner.fit()
            wall = time.time() - start
            records = [
                Record(float(row.at), int(row.index), int(row.epoch), float(row.accuracy), float(row.train_seconds))
                for result in results
                for row in result.metrics_dataframe.itertuples()
            ]
        finally:
            shutdown_start = time.time()
            ray.shutdown()
    return Timeline(
        "ray_asha", records, wall, setup=start - setup_start, notes={"shutdown": time.time() - shutdown_start}
    )


# ---------------------------------------------------------------------- Optuna with a pruner
def _make_pruner(name: str, epochs: int) -> Any:
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner()  # defaults: 5 startup trials, no warm-up steps
    return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs, reduction_factor=3)


def _journal(path: str) -> Any:
    """A journal file: Optuna's recommended storage for processes of one machine sharing a study."""
    import optuna

    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))


def _optuna_worker(journal: str, pruner: str, size: Size, start: float) -> list[Record]:
    """One worker process: takes enqueued trials until none is left; returns its reports."""
    import optuna

    from bench.frameworks.workload import Trainer, configuration

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner_object = _make_pruner(pruner, size.epochs)  # a study's pruner lives in its process, not in the storage
    study = optuna.load_study(study_name="frameworks", storage=_journal(journal), pruner=pruner_object)
    records: list[Record] = []

    def objective(trial: optuna.Trial) -> float:
        if trial.number >= size.trials:  # both workers saw the last enqueued trial; this one got a new one
            trial.study.stop()
            raise optuna.TrialPruned()
        index = trial.suggest_int("index", 0, size.trials - 1)  # the enqueued value
        trainer = Trainer(configuration(index))
        for epoch in range(1, size.epochs + 1):
            accuracy, seconds = trainer.train_epoch()
            records.append(Record(time.time() - start, index, epoch, accuracy, seconds))
            trial.report(accuracy, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return accuracy

    def stop_when_queue_empty(study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            study.stop()

    study.optimize(objective, callbacks=[stop_when_queue_empty])
    return records


def run_optuna(pruner: str, size: Size, order: list[int]) -> Timeline:
    """Optuna with ``pruner``: the indices enqueued in one study on a journal file, 2 worker
    processes (spawned, so each starts clean) running ``study.optimize`` until the queue is empty."""
    import optuna

    with tempfile.TemporaryDirectory(prefix=f"bench-optuna-{pruner}-") as scratch:
        setup_start = time.time()
        journal = str(Path(scratch) / "journal.log")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            study_name="frameworks",
            storage=_journal(journal),
            direction="maximize",
            sampler=optuna.samplers.RandomSampler(seed=0),  # never consulted: every trial is enqueued
        )
        for index in order:
            study.enqueue_trial({"index": index})
        start = time.time()
        with multiprocessing.get_context("spawn").Pool(SLOTS) as pool:
            parts = pool.starmap(_optuna_worker, [(journal, pruner, size, start)] * SLOTS)
        wall = time.time() - start
    return Timeline(f"optuna_{pruner}", [r for part in parts for r in part], wall, setup=start - setup_start)


SYSTEMS: dict[str, Callable[..., Timeline]] = {
    "fifo": lambda size, order, period, params: run_hermes("fifo", size, order),
    "hermes": lambda size, order, period, params: run_hermes("hermes", size, order, period, params),
    "ray_asha": lambda size, order, period, params: run_ray_asha(size, order),
    "optuna_median": lambda size, order, period, params: run_optuna("median", size, order),
    "optuna_hyperband": lambda size, order, period, params: run_optuna("hyperband", size, order),
}
"""Every system by name: ``SYSTEMS[name](size, arrival_order, hermes_period, hermes_params)``."""
