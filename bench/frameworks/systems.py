"""One adapter per system: each trains configurations of ``workload.py`` on 2 slots and returns the
same timeline, so that ``compare.py`` computes every figure the same way.

A round's ``Setting`` says what every system searches:

- ``grid``: the same configurations by index (``workload.configuration``), in the same arrival
  order (``order``, drawn per round by compare.py). Hermes's spec lists them in that order
  (``sampler: list``, each with its index and hyper-parameters, which the policy sees); Ray Tune
  searches a grid over the index; Optuna has the indices enqueued in that order.
- ``tpe``: Optuna's ``TPESampler`` (its defaults, seeded with the round's seed) over
  ``workload.SPACE``, ``size.trials`` trials each: Hermes through its spec (``search.sampler:
  tpe``), Optuna in its own ``study.optimize`` (each worker process seeded seed + its rank, so
  that they do not propose the same values), Ray Tune through its ``OptunaSearch`` with
  ``max_concurrent_trials`` the slots. Which trials the sampler proposes then depends on what
  each system told it, and when.

A timeline's times are seconds since the system's start: the call that runs the experiment
(``ExperimentSession.run``, ``Tuner.fit``, or the start of Optuna's worker processes); set-up
before it (``ray.init``, creating the Optuna study) is reported separately as ``setup``.
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
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)  # what each index trained (Trainer's config)

    def __post_init__(self) -> None:
        self.records.sort(key=lambda record: record.at)


@dataclass(frozen=True, slots=True)
class Size:
    trials: int = 48
    epochs: int = 30


@dataclass(frozen=True, slots=True)
class Setting:
    """What a round gives every system (see the module's docstring); ``period`` and ``params`` are Hermes's."""

    size: Size
    search: str = "grid"  # one of SEARCHES
    order: tuple[int, ...] = ()  # the grid's arrival order
    seed: int = 0  # the TPE sampler's
    period: float | None = None  # the hermes policy's (None: its own, learned)
    params: dict[str, Any] = field(default_factory=dict)  # the hermes policy's (fifo keeps its defaults)

    def configuration(self, index: int, params: dict[str, Any]) -> dict[str, Any]:
        """What trial ``index`` with proposal ``params`` trains."""
        from bench.frameworks.workload import configuration, searched

        return configuration(index) if self.search == "grid" else searched(params)


SEARCHES = ("grid", "tpe")


# ---------------------------------------------------------------------- Hermes (fifo and hermes policies)
def run_hermes(
    policy: str,
    setting: Setting,
    period: float | None = None,
    params: dict[str, Any] | None = None,
    stopper: str | None = None,
) -> Timeline:
    """Hermes's own runner with ``policy`` (its ``period`` and ``params``, and an early ``stopper``
    composed), storage in a temporary directory; the timeline is read back from its store (each
    report's metrics and the executor's time of the report)."""
    from bench.frameworks.workload import SPACE
    from hermes.core.decisions import Suspend
    from hermes.experiment import parse_spec
    from hermes.session import ExperimentSession

    size, grid = setting.size, setting.search == "grid"
    if grid:
        # the configurations as a list, each with its index and its hyper-parameters, which the policy sees
        search = {"sampler": "list", "configs": [{"index": i, **setting.configuration(i, {})} for i in setting.order]}
    else:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # as in the other systems: no line per study
        search = {"sampler": "tpe", "trials": size.trials, "seed": setting.seed, "space": SPACE}
    with tempfile.TemporaryDirectory(prefix=f"bench-{policy}-") as scratch:
        spec = parse_spec(
            {
                "name": f"frameworks-{policy}",
                "trial": {"function": "bench.frameworks.workload:hermes_trial", "workdir": str(ROOT)},
                "search": search,
                "metric": {"name": "accuracy", "mode": "max"},
                "budget": {"steps": size.epochs},
                "policy": {
                    "name": policy,
                    **({} if period is None else {"period": period}),
                    "params": params or {},
                    **({} if stopper is None else {"stopper": {"name": stopper}}),
                },
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
            # Grid: the index searched is the configuration's; TPE: a trial's id is its index in ask order.
            trials = store.trials(experiment)
            indices = {t.trial_id: int(t.params["index"] if grid else t.trial_id) for t in trials}
            configs = {indices[t.trial_id]: setting.configuration(indices[t.trial_id], t.params) for t in trials}
            records = [
                Record(m.at, indices[m.trial_id], m.step, m.values["accuracy"], m.values["train_seconds"])
                for m in store.metrics(experiment)
            ]
            suspends = sum(isinstance(d.decision, Suspend) for d in store.decisions(experiment))
        finally:
            store.close()
    name = policy if stopper is None else f"{policy}_{stopper}"
    return Timeline(name, records, wall, setup=start - setup_start, notes={"suspends": suspends}, configs=configs)


# ---------------------------------------------------------------------- Ray Tune with ASHA
def _ray_trainable(config: dict[str, Any]) -> None:
    """A Ray Tune function trainable; it times its own reports so that Ray's delays count."""
    from ray import tune

    from bench.frameworks.workload import Trainer, configuration, searched

    trainer = Trainer(configuration(config["index"]) if "index" in config else searched(config))
    for epoch in range(1, config["epochs"] + 1):
        accuracy, seconds = trainer.train_epoch()
        at = time.time() - config["start"]
        tune.report({"accuracy": accuracy, "epoch": epoch, "train_seconds": seconds, "at": at})


def run_ray_asha(setting: Setting) -> Timeline:
    """Ray Tune's ASHA (grace period 1, reduction factor 3, max_t the budget), one CPU per trial on
    a local Ray with 2 CPUs, over a grid of the indices or with ``OptunaSearch`` (TPE). Actors are
    reused between trials (``reuse_actors``), Ray's own remedy for start-up costs."""
    import logging

    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    size = setting.size
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
            asha = ASHAScheduler(max_t=size.epochs, grace_period=1, reduction_factor=3)
            if setting.search == "grid":
                space = {"index": tune.grid_search(list(setting.order))}
                search: dict[str, Any] = {"num_samples": 1}  # one pass over the grid: each configuration once
            else:
                space = {}
                sampler = optuna.samplers.TPESampler(seed=setting.seed)
                searcher = OptunaSearch(optuna_space(), metric="accuracy", mode="max", sampler=sampler)
                # Without a limit Ray Tune keeps one trial pending for a searcher: at most 2 run, as elsewhere.
                search = {"num_samples": size.trials, "search_alg": searcher, "max_concurrent_trials": SLOTS}
            tuner = tune.Tuner(
                tune.with_resources(_ray_trainable, {"cpu": 1}),
                param_space={**space, "epochs": size.epochs, "start": start},
                tune_config=tune.TuneConfig(
                    metric="accuracy", mode="max", scheduler=asha, reuse_actors=True, **search
                ),
                run_config=tune.RunConfig(storage_path=scratch, name="asha", verbose=0),
            )
            results = tuner.fit()
            wall = time.time() - start
            records, configs = [], {}
            for ordinal, result in enumerate(results):
                index = int(result.config.get("index", ordinal))
                configs[index] = setting.configuration(index, result.config)
                records += [
                    Record(float(row.at), index, int(row.epoch), float(row.accuracy), float(row.train_seconds))
                    for row in result.metrics_dataframe.itertuples()
                ]
        finally:
            shutdown_start = time.time()
            ray.shutdown()
    return Timeline(
        "ray_asha", records, wall, setup=start - setup_start, notes={"shutdown": time.time() - shutdown_start},
        configs=configs,
    )


# ---------------------------------------------------------------------- Optuna with a pruner
def optuna_space() -> dict[str, Any]:
    """``workload.SPACE`` as Optuna distributions."""
    import optuna

    from bench.frameworks.workload import SPACE

    kinds = {
        "loguniform": lambda p: optuna.distributions.FloatDistribution(p["low"], p["high"], log=True),
        "uniform": lambda p: optuna.distributions.FloatDistribution(p["low"], p["high"]),
        "choice": lambda p: optuna.distributions.CategoricalDistribution(p["values"]),
    }
    return {name: kinds[parameter["type"]](parameter) for name, parameter in SPACE.items()}


def _make_pruner(name: str, epochs: int) -> Any:
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner()  # defaults: 5 startup trials, no warm-up steps
    return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs, reduction_factor=3)


def _journal(path: str) -> Any:
    """A journal file: Optuna's recommended storage for processes of one machine sharing a study."""
    import optuna

    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))


def _suggest(trial: Any, distribution: Any, name: str) -> Any:
    """``trial``'s value of ``name``, drawn from ``distribution`` through the public suggest API."""
    import optuna

    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log)


def _optuna_worker(
    journal: str, pruner: str, setting: Setting, start: float, rank: int
) -> tuple[list[Record], dict[int, dict[str, Any]]]:
    """One worker process: takes trials until the budget is asked (``grid``: the enqueued ones);
    returns its reports and what each of its trials trained."""
    import optuna

    from bench.frameworks.workload import Trainer

    size = setting.size
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # A study's sampler and pruner live in its process, not in the storage.
    sampler = optuna.samplers.TPESampler(seed=setting.seed + rank) if setting.search == "tpe" else None
    study = optuna.load_study(
        study_name="frameworks", storage=_journal(journal), sampler=sampler, pruner=_make_pruner(pruner, size.epochs)
    )
    records: list[Record] = []
    configs: dict[int, dict[str, Any]] = {}
    space = optuna_space()

    def objective(trial: optuna.Trial) -> float:
        if trial.number >= size.trials:  # both workers saw the budget's last trial; this one got a new one
            trial.study.stop()
            raise optuna.TrialPruned()
        if setting.search == "grid":
            index = trial.suggest_int("index", 0, size.trials - 1)  # the enqueued value
            config = configs[index] = setting.configuration(index, {})
        else:
            index = trial.number
            config = configs[index] = setting.configuration(index, {n: _suggest(trial, d, n) for n, d in space.items()})
        trainer = Trainer(config)
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

    stop = stop_when_queue_empty if setting.search == "grid" else optuna.study.MaxTrialsCallback(size.trials, None)
    study.optimize(objective, callbacks=[stop])
    return records, configs


def run_optuna(pruner: str, setting: Setting) -> Timeline:
    """Optuna with ``pruner`` on one study on a journal file (``grid``: the indices enqueued), 2
    worker processes (spawned, so each starts clean) running ``study.optimize``."""
    import optuna

    with tempfile.TemporaryDirectory(prefix=f"bench-optuna-{pruner}-") as scratch:
        setup_start = time.time()
        journal = str(Path(scratch) / "journal.log")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(study_name="frameworks", storage=_journal(journal), direction="maximize")
        for index in setting.order if setting.search == "grid" else ():
            study.enqueue_trial({"index": index})
        start = time.time()
        with multiprocessing.get_context("spawn").Pool(SLOTS) as pool:
            parts = pool.starmap(_optuna_worker, [(journal, pruner, setting, start, rank) for rank in range(SLOTS)])
        wall = time.time() - start
    return Timeline(
        f"optuna_{pruner}", [r for part, _ in parts for r in part], wall, setup=start - setup_start,
        configs={index: config for _, configs in parts for index, config in configs.items()},
    )


SYSTEMS: dict[str, Callable[[Setting], Timeline]] = {
    "fifo": lambda setting: run_hermes("fifo", setting),
    "hermes": lambda setting: run_hermes("hermes", setting, setting.period, setting.params),
    "hermes_median": lambda setting: run_hermes("hermes", setting, setting.period, setting.params, "median"),
    "ray_asha": run_ray_asha,
    "optuna_median": lambda setting: run_optuna("median", setting),
    "optuna_hyperband": lambda setting: run_optuna("hyperband", setting),
}
"""Every system by name: ``SYSTEMS[name](setting)``."""
