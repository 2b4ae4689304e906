"""The YAML experiment spec: what it accepts, how it names what is wrong, and the configurations it yields."""

from __future__ import annotations

import copy
import math
import typing
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import HermesError, SpecError
from hermes.experiment import ExperimentSpec, load_spec, parse_spec
from hermes.experiment.spec import read_spec
from hermes.plugins import construct
from hermes.search import make_searcher

ROOT = Path(__file__).resolve().parent.parent
SPEC: dict[str, Any] = {
    "name": "digits-mlp",
    "trial": {"function": "examples.digits.train:train", "workdir": str(ROOT)},
    "search": {
        "sampler": "random",
        "trials": 16,
        "seed": 0,
        "space": {
            "lr": {"type": "loguniform", "low": 1.0e-4, "high": 1.0e-1},
            "width": {"type": "choice", "values": [32, 64, 128]},
            "weight_decay": {"type": "uniform", "low": 0.0, "high": 1.0e-3},
            "layers": {"type": "int", "low": 1, "high": 3},
            "optimizer": {"type": "grid", "values": ["sgd", "adam"]},
        },
    },
    "metric": {"name": "accuracy", "mode": "max"},
    "budget": {"steps": 30},
    "policy": {"name": "rr", "period": 10.0, "stopper": {"name": "asha", "params": {"min_steps": 2}}},
    "resources": {"gpus": [0, 1], "cpu_slots": 2, "threads_per_slot": 1},
    "storage": {"dir": "runs/digits", "checkpoint_every": 1},
    "engine": "local",
}
COMMAND = {
    "command": "python train.py --lr {lr} --width {width} --opt {optimizer} --json '{{\"x\": 1}}'",
    "metrics_regex": r"epoch=(?P<step>\d+) accuracy=(?P<value>[0-9.]+)",
    "workdir": "scripts",
}


def spec_with(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    data = copy.deepcopy(SPEC)
    change(data)
    return data


def write(tmp_path: Path, data: object, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------------- accepted specs
def test_full_spec_loads_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "project" / "scripts").mkdir(parents=True)
    spec = load_spec(write(tmp_path / "project", spec_with(lambda d: d["trial"].update(COMMAND, function=None))))
    assert spec.trial.placeholders == ["lr", "width", "optimizer"]
    assert spec.workdir == tmp_path / "project" / "scripts"
    assert spec.storage_dir == tmp_path / "project" / "runs" / "digits"
    assert spec.storage.dir == "runs/digits"  # kept as written: a moved project still matches its stored spec
    assert spec.search.grid == {"optimizer": ["sgd", "adam"]} and spec.search.grid_size == 2


def test_model_dump_round_trips_through_yaml(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    dumped = spec.model_dump()
    assert ExperimentSpec.model_validate(dumped).model_dump() == dumped
    assert load_spec(write(tmp_path, dumped)).model_dump() == dumped
    assert spec.model_dump(mode="json") == dumped  # plain JSON already: the store keeps it as is


def test_minimal_spec_gets_defaults() -> None:
    data = {key: SPEC[key] for key in ("name", "trial", "search", "metric", "budget")}
    data["policy"] = {"name": "fifo"}
    spec = parse_spec(data)
    assert spec.policy.period is None and spec.policy.stopper is None  # the policy's own period
    assert "period" not in spec.model_dump(mode="json")["policy"]  # as specs stored with a 60 s default compare
    assert parse_spec({**data, "policy": {"name": "rr", "period": 5}}).policy.settings == {"period": 5.0}
    assert spec.resources.gpus == "all" and spec.resources.cpu_slots == 1
    assert spec.storage.dir == "runs" and spec.engine == "local"
    assert spec.ray.address == "auto" and spec.storage.uri is None


def test_the_ray_engine_takes_an_address_and_a_checkpoint_uri() -> None:
    data = {key: SPEC[key] for key in ("name", "trial", "search", "metric", "budget")}
    data |= {"engine": "ray", "ray": {"address": "10.0.0.1:6379"}, "storage": {"uri": "s3://bucket/hermes"}}
    spec = parse_spec(data)
    assert (spec.engine, spec.ray.address, spec.storage.uri) == ("ray", "10.0.0.1:6379", "s3://bucket/hermes")
    with pytest.raises(SpecError, match="ray.adress"):
        parse_spec(data | {"ray": {"adress": "auto"}})


def test_floats_are_numbers_as_written_and_yaml_exponents_are_floats(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e-4 (no dot, or no exponent sign) as text: still a float, though "0.001" and true are not."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_with(lambda d: d["search"].update(max_gpu_hours=2)), sort_keys=False)
                    .replace("low: 0.0001", "low: 1e-4").replace("max_gpu_hours: 2", "max_gpu_hours: 1.5e1"))
    assert "low: 1e-4" in path.read_text() and yaml.safe_load(path.read_text())["search"]["max_gpu_hours"] == "1.5e1"
    search = load_spec(path).search
    assert (search.space["lr"].low, search.max_gpu_hours) == (1e-4, 15.0)
    decay = parse_spec(spec_with(put("search", "space", "weight_decay", "low", value=0))).search.space["weight_decay"]
    assert decay.low == 0.0 and type(decay.low) is float  # a whole number is a float


def test_numpy_scalars_are_taken_as_the_python_values_they_hold() -> None:
    """A spec built in Python with NumPy: np.int64(32) was refused, np.float32 refused while np.float64 passed."""
    np = pytest.importorskip("numpy")
    space = {"width": {"type": "choice", "values": list(np.arange(32, 129, 32))},
             "lr": {"type": "choice", "values": list(np.array([0.5, 0.25], dtype=np.float32))},
             "on": {"type": "grid", "values": [np.bool_(True), np.False_]},
             "wd": {"type": "uniform", "low": np.float64(0.0), "high": np.float32(0.5)}}
    spec = parse_spec(spec_with(lambda d: d["search"].update(space=space)))
    stored = spec.model_dump(mode="json")["search"]["space"]
    assert stored["width"]["values"] == [32, 64, 96, 128] and stored["lr"]["values"] == [0.5, 0.25]
    types = [type(value) for name in ("width", "lr", "on") for value in stored[name]["values"]]
    assert types == [int] * 4 + [float] * 2 + [bool] * 2
    assert (stored["wd"]["low"], stored["wd"]["high"]) == (0.0, 0.5)
    listed = spec_with(lambda d: d.update(search={"configs": [{"width": np.int64(32), "lr": np.float32(0.5)}]}))
    configs = parse_spec(listed).model_dump(mode="json")["search"]["configs"]
    assert configs == [{"width": 32, "lr": 0.5}] and [type(v) for v in configs[0].values()] == [int, float]


def test_numpy_numbers_are_taken_wherever_a_python_spec_gives_them() -> None:
    """Beyond a choice's values and configs, NumPy's numbers were refused ("search.seed: Input should be a valid
    integer", "reduction_factor must be a whole number, got np.int64(3)"), and a sampler's argument passed the check
    and then failed to be stored (PydanticSerializationError, after hermes.db was made)."""
    np = pytest.importorskip("numpy")

    def change(data: dict[str, Any]) -> None:
        data["search"].update(seed=np.int64(3), trials=np.int64(4), sampler={"name": "tpe", "args": {
            "n_startup_trials": np.int64(2), "multivariate": np.bool_(True)}})
        data["search"]["space"] = {"lr": {"type": "loguniform", "low": np.float64(1e-4), "high": 0.1},
                                   "layers": {"type": "int", "low": np.int32(1), "high": np.int64(3)}, "w": np.int8(7)}
        data["budget"]["steps"] = np.int64(2)
        data["resources"] = {"cpu_slots": np.int64(2), "gpus": [np.int64(0)]}
        data["policy"] = {"name": "asha", "params": {"reduction_factor": np.int64(3)},
                          "stopper": {"name": "median", "params": {"grace_steps": np.int64(1),
                                                                   "confidence": np.float32(0.5)}}}

    spec = parse_spec(spec_with(change))
    assert (spec.search.seed, spec.search.trials, spec.budget.steps, spec.resources.cpu_slots) == (3, 4, 2, 2)
    assert spec.search.sampler_args == {"n_startup_trials": 2, "multivariate": True}
    assert spec.policy.params == {"reduction_factor": 3}
    assert spec.policy.stopper is not None and spec.policy.stopper.params == {"grace_steps": 1, "confidence": 0.5}
    stored = spec.model_dump(mode="json")
    assert stored["search"]["space"]["w"] == 7 and stored["search"]["space"]["layers"] == {"type": "int", "low": 1,
                                                                                           "high": 3}
    assert type(stored["search"]["sampler"]["args"]["n_startup_trials"]) is int
    assert parse_spec(stored).model_dump(mode="json") == stored


def test_grid_sampler_defaults_to_one_pass_over_the_grid() -> None:
    space = {
        "optimizer": {"type": "grid", "values": ["sgd", "adam"]},
        "width": {"type": "grid", "values": [32, 64, 128]},
    }
    spec = parse_spec(spec_with(lambda d: d.update(search={"sampler": "grid", "space": space})))
    assert spec.search.trials == 6
    assert parse_spec(spec.model_dump()).search.trials == 6


# ---------------------------------------------------------------------- rejected specs, one field each
def put(*path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def drop(*path: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


LR = ("search", "space", "lr")
BAD = [
    (put(*LR, "low", value=0.0), "search.space.lr.low: must be > 0 for loguniform"),
    (put(*LR, "high", value=1e-5), "search.space.lr.high: must be greater than low"),
    (put(*LR, "low", value="small"), "search.space.lr.low: Input should be a valid number"),
    (put(*LR, "low", value=float("inf")), "search.space.lr.low: Input should be a finite number"),
    (put(*LR, "low", value="0.001"), "search.space.lr.low: Input should be a valid number"),  # "0.1" is not 0.1
    (put("search", "space", "weight_decay", "low", value=False),
     "search.space.weight_decay.low: Input should be a valid number"),  # YAML's off is not 0.0
    (put("search", "space", "weight_decay", "high", value=True),
     "search.space.weight_decay.high: Input should be a valid number"),
    (put("search", "max_time", value=True), "search.max_time: Input should be a valid number"),
    (put("search", "max_gpu_hours", value=True), "search.max_gpu_hours: Input should be a valid number"),
    (put("search", "sampler", value=[1]), "search.sampler: must be a sampler's name, module:Class, or a mapping"),
    (put(*LR, "type", value="normal"), "search.space.lr: unknown type 'normal'; choose one of uniform, loguniform"),
    (drop(*LR, "type"), "search.space.lr: needs a type"),
    (put(*LR, "step", value=2), "search.space.lr.step: unknown field; expected one of type, low, high"),
    (put("search", "space", "layers", "high", value=1), "search.space.layers.high: must be greater than low"),
    (put("search", "space", "width", "values", value=[]), "search.space.width.values: must list at least one"),
    (put("search", "space", "width", "values", value=[32, [64]]), "search.space.width.values.1: must be a string"),
    (put("search", "space", "width", "values", value=[32, 32]), "search.space.width.values.1: 32 is listed twice;"),
    (put("search", "space", value={}), "search.space: must define at least one parameter"),
    (
        put("search", "space", "learning-rate", value={"type": "int", "low": 1, "high": 2}),
        "search.space.learning-rate: parameter names must be ASCII Python identifiers",
    ),
    (
        put("search", "space", "λ", value={"type": "int", "low": 1, "high": 2}),
        "search.space.λ: parameter names must be ASCII Python identifiers",
    ),
    (put("search", "space", "width", "values", value=[1, 1.0]), "search.space.width.values.1: 1.0 equals 1; a"),
    (put(*LR, value={"type": "uniform", "low": -1e308, "high": 1e308}), "search.space.lr.high: high - low must be a"),
    (put("search", "seed", value=-1), "search.seed: Input should be greater than or equal to 0"),
    (put("search", "seed", value=2**32), "search.seed: Input should be less than or equal to 4294967295"),
    (put("name", value="x" * 129), "name: must start with a letter or digit and use only letters, digits, '.', '_' and "
                                   "'-', 128 characters at most"),
    (put("budget", "steps", value=2**31), "budget.steps: Input should be less than or equal to 2147483647"),
    (put("search", "trials", value=15), "search.trials: must be a multiple of the 2 grid combinations"),
    (put("search", "trials", value=0), "search.trials: Input should be greater than 0"),
    (drop("search", "trials"), "search.trials: required for sampler random"),
    (put("search", "sampler", value="grid"), "search.space.lr: sampler grid takes grid parameters only"),
    (put("search", "sampler", value="tpe"), "search.space.optimizer: sampler tpe takes no grid parameters"),
    (put("search", "sampler", value="bayes"), "search.sampler: unknown sampler 'bayes'; choose one of random, grid, list, tpe"),
    (put("search", "samples", value=3), "search.samples: unknown field; expected one of sampler, trials, max_time"),
    (put("trial", "command", value="python train.py"), "trial: give exactly one of function or command"),
    (put("trial", value={}), "trial: give exactly one of function or command"),
    (put("trial", "function", value="train.py"), "trial.function: must be 'package.module:function'"),
    (put("trial", "function", value="pkg.2mod:train"), "trial.function: must be 'package.module:function'"),
    (
        put("trial", value={"command": "train --lr {lr} --depth {depth}"}),
        "trial.command: placeholder {depth} is not in search.space",
    ),
    (put("trial", value={"command": "train --lr {}"}), "trial.command: {}: placeholders must name a parameter"),
    (put("trial", value={"command": "train --lr {lr"}), "trial.command: unclosed placeholder in '{lr'"),
    (put("trial", value={"command": "train 'unclosed"}), "trial.command: cannot parse"),
    (put("trial", value={"command": "  "}), "trial.command: must not be empty"),
    (put("trial", value={"command": "train", "metrics_regex": "acc=(\\d+"}), "trial.metrics_regex: does not compile"),
    (
        put("trial", value={"command": "train", "metrics_regex": "loss=(?P<loss>\\d+)"}),
        "trial.metrics_regex: needs a named group for the metric: (?P<accuracy>...) or (?P<value>...)",
    ),
    (put("trial", "metrics_regex", value="acc=(?P<value>.*)"), "trial.metrics_regex: only for command trials"),
    (put("metric", "mode", value="maximize"), "metric.mode: Input should be 'max' or 'min'"),
    (put("metric", "name", value=""), "metric.name: String should have at least 1 character"),
    (drop("metric"), "metric: required"),
    (put("budget", "steps", value=0), "budget.steps: Input should be greater than 0"),
    (put("policy", "name", value="gandiva"), "policy.name: unknown policy 'gandiva'; choose one of fifo, rr"),
    (put("policy", "period", value=0), "policy.period: Input should be greater than 0"),
    (put("policy", "params", value={"quantum": 3}), "policy.params: policy rr: "),
    (put("policy", "stopper", value={"name": "hyperband"}), "policy.stopper.name: unknown early stopper 'hyperband'"),
    (put("policy", "stopper", "params", value={"rungs": 3}), "policy.stopper.params: stopper asha: "),
    # Types as the constructor's hints say: 2.5 passed the range check and failed hours in (a float is no index)
    (put("policy", "stopper", "params", value={"reduction_factor": 2.5}),
     "policy.stopper.params: stopper asha: reduction_factor must be a whole number, got 2.5"),
    (put("policy", value={"name": "asha", "params": {"min_steps": True}}),
     "policy.params: policy asha: min_steps must be a whole number, got True"),
    (put("policy", "period", value=True), "policy.period: "),
    (put("trial", "stall", value={"factor": True}), "trial.stall.factor: "),  # it ran as a factor of 1
    (put("policy", "name", value="nosuch.module:Policy"),
     "policy.name: policy 'nosuch.module:Policy': cannot load nosuch.module:Policy: ModuleNotFoundError"),
    (put("policy", "name", value="pygments.__main__:Policy"),  # a module that runs a command line when imported:
     "policy.name: policy 'pygments.__main__:Policy': cannot load pygments.__main__:Policy: SystemExit"),  # it exits
    (put("policy", "name", value="hermes.policies.rr:NoSuchPolicy"),
     "policy.name: policy 'hermes.policies.rr:NoSuchPolicy': cannot load hermes.policies.rr:NoSuchPolicy: "
     "AttributeError"),
    (put("policy", "name", value="hermes.policies.stopping:AshaStopper"),
     "policy.name: policy 'hermes.policies.stopping:AshaStopper': hermes.policies.stopping:AshaStopper is not a "
     "subclass of hermes.core.policy.SchedulingPolicy"),
    (put("policy", "stopper", value={"name": "hermes.policies.rr:RoundRobinPolicy"}),
     "policy.stopper.name: early stopper 'hermes.policies.rr:RoundRobinPolicy': hermes.policies.rr:RoundRobinPolicy is "
     "not a subclass of hermes.core.policy.EarlyStopper"),
    (put("search", "sampler", value="nosuch.module:Searcher"),
     "search.sampler: cannot load nosuch.module:Searcher: ModuleNotFoundError"),
    (put("search", "sampler", value={"name": "hermes.policies.rr:RoundRobinPolicy"}),
     "search.sampler.name: hermes.policies.rr:RoundRobinPolicy is not a subclass of hermes.search.BaseSearcher"),
    (put("resources", "gpus", value="any"), "resources.gpus: must be 'all', 'none' or a list of GPU indices"),
    (put("resources", "gpus", value=[]), "resources.gpus: must be 'all', 'none' or a list of GPU indices"),
    (put("resources", "gpus", value=[0, -1]), "resources.gpus.1: must be a GPU index"),
    (put("resources", "gpus", value=[1, 1]), "resources.gpus.1: GPU 1 is listed twice"),
    (put("resources", "cpu_slots", value=0), "resources.cpu_slots: Input should be greater than 0"),
    (put("resources", "cpu_slots", value=10**8), "resources.cpu_slots: Input should be less than or equal to 1024"),
    (put("storage", "checkpoint_every", value=0), "storage.checkpoint_every: Input should be greater than 0"),
    (put("engine", value="kubernetes"), "engine: Input should be 'local' or 'ray'"),
    (put("trial", "command", value="train {lr:>99999999}"), "trial.command: {lr:>99999999}: format specs are not"),
    (put("trial", "command", value="train {lr.__class__}"), "trial.command: {lr.__class__}: attribute access is"),
    (put("trial", "command", value="train {lr!r}"), "trial.command: {lr!r}: conversions are not allowed"),
    (put("trial", "command", value="train --name it's"), "trial.command: cannot parse"),
    (put("search", "trials", value=1e12), "search.trials: Input should be a valid integer"),
    (put("search", "trials", value=16.0), "search.trials: Input should be a valid integer"),
    (put("search", "trials", value=2_000_000), "search.trials: Input should be less than or equal to 1000000"),
    (put("search", "seed", value=True), "search.seed: Input should be a valid integer"),
    (put("search", "space", "layers", "low", value="1"), "search.space.layers.low: Input should be a valid integer"),
    (put("resources", "cpu_slots", value=True), "resources.cpu_slots: Input should be a valid integer"),
    (put("resources", "threads_per_slot", value=2.0), "resources.threads_per_slot: Input should be a valid integer"),
    (put("budget", "steps", value="30"), "budget.steps: Input should be a valid integer"),
    (put("storage", "checkpoint_every", value=False), "storage.checkpoint_every: Input should be a valid integer"),
    (put("storage", "allow_outside", value="yes"), "storage.allow_outside: Input should be a valid boolean"),
    (put("trial", "warm_workers", value=1), "trial.warm_workers: Input should be a valid boolean"),
    (put("name", value="my experiment"), "name: must start with a letter or digit"),
    (put("sheduler", value={}), "sheduler: unknown field; expected one of name, description, trial"),
]


@pytest.mark.parametrize(
    ("change", "message"), BAD, ids=[message.split(":")[0] + f"-{i}" for i, (_, message) in enumerate(BAD)]
)
def test_each_problem_names_the_file_and_the_field(tmp_path: Path, change: Callable[..., None], message: str) -> None:
    path = write(tmp_path, spec_with(change), "bad.yaml")
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value).startswith(f"{path}: {message}")


def test_all_problems_are_reported_at_once() -> None:
    def two_problems(data: dict[str, Any]) -> None:
        data["budget"]["steps"] = -1
        data["metric"]["mode"] = "up"

    with pytest.raises(SpecError, match=r"^exp.yaml: 2 problems:\n  metric.mode: .*\n  budget.steps: ") as raised:
        parse_spec(spec_with(two_problems), source="exp.yaml")
    assert isinstance(raised.value, HermesError)


@pytest.mark.parametrize(
    ("text", "message"),
    [("name: [unclosed\n", "not valid YAML"), ("- a list\n", "must be a YAML mapping"), ("", "must be a YAML mapping")],
)
def test_unreadable_files_raise_spec_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_spec(path)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_a_file_that_is_not_utf8_is_refused_by_run_and_submit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Latin-1 é ended hermes run and hermes submit with a UnicodeDecodeError traceback."""
    from hermes.cli import main

    text = yaml.safe_dump(SPEC, sort_keys=False).encode()
    path = tmp_path / "spec.yaml"
    path.write_bytes(text + b"description: caf\xe9\n")
    where = f"byte 0xe9 at position {len(text) + 16}, line {len(text.splitlines()) + 1}"
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == f"{path}: not valid UTF-8 ({where}); save it as UTF-8"
    assert main(["run", str(path), "--no-live"]) == 2
    assert main(["submit", str(path), "--server", "http://127.0.0.1:9", "--token", "t"]) == 2  # refused before sent
    assert capsys.readouterr().err == f"hermes: error: {path}: not valid UTF-8 ({where}); save it as UTF-8\n" * 2


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path: Path) -> None:
    """YAML 1.1 keeps the last of two equal keys silently: a second lr, or metric, replaced the first unseen."""
    text = yaml.safe_dump(SPEC, sort_keys=False)
    first = text.splitlines().index("metric:") + 1
    path = tmp_path / "spec.yaml"
    path.write_text(text + "metric: {name: loss, mode: min}\n")
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == (f"{path}: not valid YAML: line {len(text.splitlines()) + 1}: duplicate key 'metric' "
                                 f"(first on line {first}); give each key once")
    path.write_text("a:\n  x: 1\n  y: {x: 2, x: 3}\n")
    with pytest.raises(SpecError, match=r"line 3: duplicate key 'x' \(first on line 3\)"):
        read_spec(path)
    path.write_text("a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\nc: {<<: [*a, {x: 4}], z: 5}\n")  # merged: may be overridden
    assert read_spec(path) == {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}, "c": {"x": 1, "y": 2, "z": 5}}


def test_numbers_are_read_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    """YAML 1.1 read 010 as octal 8 and 1:30 as 90 (base 60): 10 and the text, as YAML 1.2 and its readers mean."""
    path = tmp_path / "spec.yaml"
    path.write_text("a: 010\nb: 1:30\nc: 1:30.5\nd: -007\ne: 0x10\nf: 0b11\ng: 1_000\nh: 2.5\ni: .inf\n")
    assert read_spec(path) == {"a": 10, "b": "1:30", "c": "1:30.5", "d": -7, "e": 16, "f": 3, "g": 1000, "h": 2.5,
                               "i": math.inf}
    path.write_text(yaml.safe_dump(SPEC, sort_keys=False).replace("trials: 16", "trials: 010"))
    assert load_spec(path).search.trials == 10


def test_a_signed_float_is_a_number_as_the_unsigned_one_is(tmp_path: Path) -> None:
    """-.5 and +.5 were text while .5 was a number: a grid gave the trial '-.5', and low: -.5 was refused."""
    path = tmp_path / "spec.yaml"
    path.write_text("a: -.5\nb: +.5\nc: -.5e-3\nd: +.5E+3\ne: -.inf\nf: +.inf\ng: +1.5\nh: -1.\ni: -1.5e+3\n")
    assert read_spec(path) == {"a": -0.5, "b": 0.5, "c": -5e-4, "d": 500.0, "e": -math.inf, "f": math.inf, "g": 1.5,
                               "h": -1.0, "i": -1500.0}
    space = {"wd": {"type": "uniform", "low": "LOW", "high": "HIGH"}, "m": {"type": "grid", "values": "VALUES"}}
    path.write_text(yaml.safe_dump(spec_with(lambda d: d["search"].update(space=space, trials=12)), sort_keys=False)
                    .replace("LOW", "-.5").replace("HIGH", "+.5")
                    .replace("VALUES", "[-.5, .25, +.5, +1.5e3, -1.5e3, -.5e-3]"))
    spec = load_spec(path)
    assert (spec.search.space["wd"].low, spec.search.space["wd"].high) == (-0.5, 0.5)
    assert spec.search.grid == {"m": [-0.5, 0.25, 0.5, 1500.0, -1500.0, -5e-4]}
    assert {type(config[name]) for config in configs_of(spec) for name in ("wd", "m")} == {float}


def test_policy_and_stopper_params_read_numbers_as_the_spec_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """YAML 1.1 reads optimism: 1e-1 as text, which was refused ("must be a number, got '1e-1'") or, for
    switch_cost (float | None, unchecked), failed inside the policy; switch_cost: true was taken."""
    path = tmp_path / "spec.yaml"
    policy = {"name": "hermes", "params": {"optimism": "O", "switch_cost": "S"},
              "stopper": {"name": "median", "params": {"confidence": "C"}}}
    path.write_text(yaml.safe_dump(spec_with(put("policy", value=policy)), sort_keys=False)
                    .replace("optimism: O", "optimism: 1e-1").replace("switch_cost: S", "switch_cost: 1e3")
                    .replace("confidence: C", "confidence: 9e-1"))
    spec = load_spec(path)
    assert spec.policy.params == {"optimism": 0.1, "switch_cost": 1000.0}
    assert spec.policy.stopper is not None and spec.policy.stopper.params == {"confidence": 0.9}
    unset = parse_spec(spec_with(put("policy", value={"name": "hermes", "params": {"switch_cost": None}})))
    assert unset.policy.params == {"switch_cost": None}
    with pytest.raises(SpecError, match="policy.params: policy hermes: switch_cost must be a number or null, got True"):
        parse_spec(spec_with(put("policy", value={"name": "hermes", "params": {"switch_cost": True}})))
    # a plug-in's params that are lists or mappings hold numbers read so too
    package(tmp_path / "code", {"open_policy.py": "from hermes.policies.rr import RoundRobinPolicy\n"
                                                  "class Open(RoundRobinPolicy):\n"
                                                  "    def __init__(self, **params):\n        super().__init__()\n"})
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    params = {"rungs": ["1e3", ["2.5E-1"]], "limits": {"a": "1e2"}, "label": "fast"}
    spec = parse_spec(spec_with(put("policy", value={"name": "open_policy:Open", "params": params})))
    assert spec.policy.params == {"rungs": [1000.0, [0.25]], "limits": {"a": 100.0}, "label": "fast"}
    search = {"sampler": {"name": "tpe", "args": {"prior_weight": "1e0", "seed": 3}},  # a sampler's arguments too
              "trials": 4, "space": {"lr": {"type": "uniform", "low": 0, "high": 1}}}
    assert parse_spec(spec_with(put("search", value=search))).search.sampler_args == {"prior_weight": 1.0, "seed": 3}


def test_construct_checks_optional_numbers_and_skips_hints_it_cannot_check() -> None:
    """A parameter annotated float | None (Optional[int]) takes a number of its kind or None, nothing else."""

    class Plugin:
        def __init__(self, cost: float | None = None, text: int | str = 0, items: list[int] | None = None,
                     count: typing.Optional[int] = None) -> None:  # noqa: UP045 (typing.Union's form, read too)
            self.cost, self.count, self.text, self.items = cost, count, text, items

    built = construct(Plugin, {"cost": 2, "count": None, "text": "x", "items": "anything"})
    assert (built.cost, built.count, built.text, built.items) == (2, None, "x", "anything")
    assert construct(Plugin, {"cost": None, "count": 3}).count == 3
    for params, message in [({"cost": True}, "cost must be a number or null, got True"),
                            ({"cost": "1e3"}, "cost must be a number or null, got '1e3'"),
                            ({"count": 2.5}, "count must be a whole number or null, got 2.5"),
                            ({"count": False}, "count must be a whole number or null, got False")]:
        with pytest.raises(TypeError, match=f"^{message}$"):
            construct(Plugin, params)


# ---------------------------------------------------------------------- configurations
def configs_of(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """What the spec's searcher proposes for its trial budget (random and grid choose without results)."""
    searcher = make_searcher(spec.search, spec.metric.mode)
    return [searcher.ask().params for _ in range(spec.search.trials)]


def test_random_configs_are_seeded_in_range_and_typed() -> None:
    spec = parse_spec(SPEC)
    configs = configs_of(spec)
    assert configs == configs_of(parse_spec(SPEC)) and len(configs) == 16
    assert configs[0]["lr"] == pytest.approx(0.005676772048204307)  # the stream is pinned across machines
    for config in configs:
        assert list(config) == list(SPEC["search"]["space"])
        assert 1e-4 <= config["lr"] <= 1e-1 and 0.0 <= config["weight_decay"] <= 1e-3
        assert config["width"] in (32, 64, 128) and type(config["layers"]) is int and 1 <= config["layers"] <= 3
    assert {config["layers"] for config in configs} == {1, 2, 3}  # high is included
    lrs = sorted(math.log10(config["lr"]) for config in configs)
    assert lrs[0] < -3 and lrs[-1] > -2  # spread in log space, not crowded near the top
    reseeded = configs_of(parse_spec(spec_with(put("search", "seed", value=1))))
    assert [c["lr"] for c in reseeded] != [c["lr"] for c in configs]


def test_exponents_in_choices_grids_and_configs_are_floats_as_in_low_and_high(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e-4 as text: low and high took it as the float, while a choice, a grid and configs passed the
    text on to the trial. The spec file's loader reads an unquoted exponent as the float it is, wherever it is."""
    space = {"lr": {"type": "choice", "values": "LR"}, "wd": {"type": "grid", "values": "WD"}, "eps": "EPS",
             "decay": {"type": "loguniform", "low": "LOW", "high": 0.1}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_with(lambda d: d["search"].update(space=space, trials=4)), sort_keys=False)
                    .replace("LR", "[1e-4, 1.5e3]").replace("WD", "[5E-4, 0.0]").replace("EPS", "1e-8")
                    .replace("LOW", "1e-5"))
    spec = load_spec(path)
    assert spec.search.space["lr"].values == [1e-4, 1.5e3] and spec.search.grid == {"wd": [5e-4, 0.0]}
    assert spec.search.space["decay"].low == 1e-5
    assert {type(config[name]) for config in configs_of(spec) for name in ("lr", "wd", "eps")} == {float}
    assert {config["eps"] for config in configs_of(spec)} == {1e-8}
    path.write_text("search:\n  configs: [{lr: 1e-4}, {lr: 1e-3}]\n")
    listed = parse_spec(spec_with(lambda d: d.update(search=read_spec(path)["search"]))).search
    assert listed.configs == [{"lr": 1e-4}, {"lr": 1e-3}] and listed.space["lr"].values == [1e-4, 1e-3]
    given = {"configs": [{"lr": 1e-3}], "space": {"lr": {"type": "loguniform", "low": "1e-5", "high": 0.1}}}
    assert parse_spec(spec_with(lambda d: d.update(search=given))).search.configs == [{"lr": 1e-3}]  # low: text too


def test_text_that_looks_like_an_exponent_stays_text_where_a_trial_receives_it(tmp_path: Path) -> None:
    """A choice's "1e3" (a tag, a version), quoted in the file or a str in Python, reached the trial as 1000.0."""
    space = {"tag": {"type": "choice", "values": ["1e3", "abc"]}, "ver": "2E5", "run": {"type": "grid",
                                                                                      "values": ["1e1", "1e2"]}}
    spec = parse_spec(spec_with(lambda d: d["search"].update(space=space, trials=4)))
    assert spec.search.space["tag"].values == ["1e3", "abc"] and spec.search.grid == {"run": ["1e1", "1e2"]}
    assert {config["ver"] for config in configs_of(spec)} == {"2E5"}
    assert spec.model_dump(mode="json")["search"]["space"]["ver"] == "2E5"  # stored as the text it is
    path = tmp_path / "spec.yaml"
    path.write_text("search:\n  configs: [{tag: '1e3', n: 1e3}, {tag: \"2e3\", n: 2.0e3}]\n")
    listed = parse_spec(spec_with(lambda d: d.update(search=read_spec(path)["search"]))).search
    assert listed.configs == [{"tag": "1e3", "n": 1000.0}, {"tag": "2e3", "n": 2000.0}]
    assert listed.space["tag"].values == ["1e3", "2e3"]
    with pytest.raises(SpecError, match="search.configs.0.lr: '1e-3' is out of search.space.lr's type: must be a nu"):
        parse_spec(spec_with(lambda d: d.update(search={"configs": [{"lr": "1e-3"}], "space": {"lr": SPEC["search"][
            "space"]["lr"]}})))


def test_yaml_1_1_switches_are_text_and_only_true_and_false_are_booleans(tmp_path: Path) -> None:
    """YAML 1.1 read the country code NO as false, on/off and yes as booleans, and a parameter named on as true (its
    error named it "1"); YAML 1.2, which the loader follows, reads them as text, and dates too."""
    path = tmp_path / "spec.yaml"
    text = yaml.safe_dump(spec_with(lambda d: d["search"].update(space={"country": "C", "amp": "A", "verbose": "V"},
                                                                  sampler="grid", trials=None)), sort_keys=False)
    path.write_text(text.replace("country: C", "country: {type: grid, values: [NO, SE, DK]}")
                    .replace("amp: A", "amp: {type: grid, values: [on, off]}").replace("verbose: V", "verbose: yes"))
    spec = load_spec(path)
    assert spec.search.grid == {"country": ["NO", "SE", "DK"], "amp": ["on", "off"]}
    configs = configs_of(spec)
    assert configs[0] == {"country": "NO", "amp": "on", "verbose": "yes"} and len(configs) == 6
    path.write_text("a: [true, True, TRUE, false, False, FALSE]\nb: [y, n, Yes, NO, On, OFF, tRue]\nc: 2024-01-01\n"
                    "d: =\non: 1\n")
    assert read_spec(path) == {"a": [True] * 3 + [False] * 3, "b": ["y", "n", "Yes", "NO", "On", "OFF", "tRue"],
                               "c": "2024-01-01", "d": "=", "on": 1}
    alone = text.replace("    amp: A\n", "").replace("    verbose: V\n", "")
    path.write_text(alone.replace("country: C", "on: {type: grid, values: [1, 2]}"))
    assert load_spec(path).search.grid == {"on": [1, 2]}
    path.write_text(alone.replace("country: C", "true: {type: grid, values: [1, 2]}"))
    with pytest.raises(SpecError, match=r"search\.space\.True: a parameter's name must be text, got bool True: quote"):
        load_spec(path)


def test_a_rerun_of_a_spec_stored_under_yaml_1_1_is_refused_naming_the_field(tmp_path: Path) -> None:
    """An older Hermes stored [NO, SE] as [false, "SE"]: the same file, read now, is another experiment, refused by
    name rather than run with other values; the stored spec itself reads as stored (JSON)."""
    from hermes.store import SqlStore, StoreError

    old = spec_with(lambda d: d["search"].update(space={"country": {"type": "grid", "values": [False, "SE"]}},
                                                 sampler="grid", trials=None))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(old, sort_keys=False).replace("- false", "- NO"))
    stored = parse_spec(old).model_dump(mode="json")
    assert parse_spec(stored).model_dump(mode="json") == stored
    store = SqlStore("sqlite://")
    try:
        store.create_or_open_experiment("exp", stored)
        with pytest.raises(StoreError, match=r"\(differs in search\.space\.country\.values\); give it a new name"):
            store.create_or_open_experiment("exp", load_spec(path).model_dump(mode="json"), may_change=("policy",))
    finally:
        store.close()


@pytest.mark.parametrize(("parameter", "value", "message"), [
    ({"type": "int", "low": 1, "high": 5}, 3.0, "3.0 is out of search.space.n's type: must be an int, got float 3.0"),
    ({"type": "int", "low": 1, "high": 5}, True, "True is out of search.space.n's type: must be an int, got bool True"),
    ({"type": "loguniform", "low": 1e-5, "high": 0.1}, "fast",
     "'fast' is out of search.space.n's type: must be a number, got str 'fast'"),
    ({"type": "choice", "values": [1, 2]}, True,
     "True is out of search.space.n's values as written: they hold int 1, not bool True"),
    ({"type": "choice", "values": [1, 2]}, 3, "3 is outside search.space.n: not one of its values"),
    ({"type": "int", "low": 1, "high": 5}, 6, "6 is outside search.space.n [1, 5]"),
], ids=["float-for-int", "bool-for-int", "text-for-number", "bool-for-listed-int", "not-listed", "out-of-range"])
def test_a_config_outside_its_space_says_why(parameter: dict[str, Any], value: object, message: str) -> None:
    """A value of the wrong type (3.0 for an int) was "outside search.space.n", which sent users to its range."""
    data = spec_with(lambda d: d.update(search={"configs": [{"n": value}], "space": {"n": parameter}}))
    with pytest.raises(SpecError) as raised:
        parse_spec(data, source="s.yaml")
    assert str(raised.value) == f"s.yaml: search.configs.0.n: {message}"


def test_the_space_derived_from_configs_keeps_values_apart_by_type() -> None:
    """1, 1.0 and true made one choice of 1, so the space held one of three values and the stored spec failed its
    own check when read again (as the pool does)."""
    configs = [{"x": 1}, {"x": 2.5}, {"x": 1}, {"x": "1"}, {"x": False}]
    spec = parse_spec(spec_with(lambda d: d.update(search={"configs": configs})))
    assert spec.search.space["x"].values == [1, 2.5, "1", False]
    assert parse_spec(spec.model_dump(mode="json")).model_dump() == spec.model_dump()
    for other, typed in [(1.0, "float 1.0"), (True, "bool True")]:
        mixed = spec_with(put("search", value={"configs": [*configs, {"x": other}]}))
        with pytest.raises(SpecError) as raised:
            parse_spec(mixed, source="s.yaml")
        assert str(raised.value) == (f"s.yaml: search.configs.5.x: {typed} equals the int 1 of an earlier config: "
                                     "write a parameter's values alike, as the choice derived from configs takes "
                                     "values that differ by equality")


def test_a_rerun_that_changes_a_values_type_is_another_experiment() -> None:
    """[2, true] then [2.0, 1] compared equal (2 == 2.0, True == 1): the rerun continued, mixing the types."""
    from hermes.store import SqlStore, StoreError

    def stored(values: list[Any]) -> dict[str, Any]:
        return parse_spec(spec_with(put("search", "space", "width", "values", value=values))).model_dump(mode="json")

    store = SqlStore("sqlite://")
    try:
        experiment = store.create_or_open_experiment("exp", stored([2, True]))
        for values in ([2.0, 1], [2, 1], [2.0, True]):
            with pytest.raises(StoreError, match=r"\(differs in search\.space\.width\.values\); give it a new name"):
                store.create_or_open_experiment("exp", stored(values))
        assert store.create_or_open_experiment("exp", stored([2, True])) == experiment
        listed = {"search": {"configs": [{"x": 1, "y": "a"}]}}
        store.create_or_open_experiment("listed", listed)
        with pytest.raises(StoreError, match=r"\(differs in search\.configs\)"):  # a mapping inside a list
            store.create_or_open_experiment("listed", {"search": {"configs": [{"x": 1.0, "y": "a"}]}})
        assert store.create_or_open_experiment("listed", {"search": {"configs": [{"y": "a", "x": 1}]}})
    finally:
        store.close()


def test_more_trials_keep_the_configs_already_drawn() -> None:
    more = configs_of(parse_spec(spec_with(put("search", "trials", value=32))))
    assert more[:16] == configs_of(parse_spec(SPEC))


def test_grid_values_are_crossed_and_cycled_evenly() -> None:
    def grid(data: dict[str, Any]) -> None:
        data["search"]["space"]["width"]["type"] = "grid"
        data["search"]["trials"] = 12

    configs = configs_of(parse_spec(spec_with(grid)))
    first_pass = [(c["optimizer"], c["width"]) for c in configs[:6]]
    assert first_pass == [(o, w) for w in (32, 64, 128) for o in ("sgd", "adam")]  # spec order, last fastest
    assert [(c["optimizer"], c["width"]) for c in configs[6:]] == first_pass
    assert len({c["lr"] for c in configs}) == 12  # other parameters are drawn afresh for every trial
    assert Counter(c["optimizer"] for c in configs) == {"sgd": 6, "adam": 6}


def test_a_random_searcher_numbers_its_configs_and_learns_nothing() -> None:
    spec = parse_spec(SPEC)
    searcher = make_searcher(spec.search, spec.metric.mode)
    asked = [searcher.ask() for _ in range(16)]
    assert [config.index for config in asked] == list(range(16))
    assert [config.params for config in asked] == configs_of(spec)
    searcher.on_end(0, 0.9)  # nothing to learn, nothing to complain about


def tpe_spec(trials: int = 12) -> ExperimentSpec:
    def tpe(data: dict[str, Any]) -> None:
        data["search"].update(sampler="tpe", trials=trials)
        data["search"]["space"]["optimizer"]["type"] = "choice"

    return parse_spec(spec_with(tpe))


def objective(params: dict[str, Any]) -> float:
    return -abs(math.log10(params["lr"]) + 2) + (params["optimizer"] == "adam")


def test_tpe_asks_and_learns_deterministically() -> None:
    runs = []
    for _ in range(2):
        spec = tpe_spec()
        searcher = make_searcher(spec.search, spec.metric.mode)
        asked = []
        while len(asked) < spec.search.trials:
            config = searcher.ask()
            asked.append(config)
            searcher.on_end(config.index, None if config.index == 3 else objective(config.params))
        runs.append(asked)
    assert runs[0] == runs[1] and len(runs[0]) == 12
    for config in runs[0]:
        assert 1e-4 <= config.params["lr"] <= 1e-1 and type(config.params["layers"]) is int
        assert config.params["optimizer"] in ("sgd", "adam")


def test_tpe_refuses_unknown_or_repeated_ends() -> None:
    spec = tpe_spec(trials=2)
    searcher = make_searcher(spec.search, spec.metric.mode)
    config = searcher.ask()
    searcher.on_end(config.index, float("nan"))  # a diverged trial counts as failed
    with pytest.raises(HermesError, match="told already"):
        searcher.on_end(config.index, 1.0)
    with pytest.raises(HermesError, match="never asked"):
        searcher.on_end(7, 1.0)


# ---------------------------------------------------------------------- checks against this machine (load_spec)
def test_a_huge_grid_is_refused_before_any_configuration_is_drawn() -> None:
    space = {f"p{i}": {"type": "grid", "values": list(range(8))} for i in range(7)}  # 8**7 = 2,097,152
    with pytest.raises(SpecError, match=r"search.trials: the grid has 2097152 combinations, more than the 1000000"):
        parse_spec(spec_with(lambda d: d.update(search={"sampler": "grid", "space": space})))


def load_in(tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> ExperimentSpec:
    return load_spec(write(tmp_path, spec_with(change)))


def test_a_workdir_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as raised:
        load_in(tmp_path, put("trial", "workdir", value="code"))
    assert str(raised.value) == (
        f"{tmp_path / 'spec.yaml'}: trial.workdir: {tmp_path / 'code'} (relative to the spec's folder {tmp_path}) "
        "does not exist"
    )
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecError, match=f"trial.workdir: {tmp_path / 'file'} is not a directory"):
        load_in(tmp_path, put("trial", "workdir", value=str(tmp_path / "file")))


def package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("nosuch.train:train", "trial.function: no module 'nosuch' in the trial's workdir ({w}) or on Python's path"),
        ("proj.trian:train", "trial.function: package proj ({w}/proj) has no module 'trian'"),
        ("proj.train.sub:train", "trial.function: proj.train ({w}/proj/train.py) is a module, not a package"),
        ("proj.train:trian", "trial.function: module proj.train ({w}/proj/train.py) defines no 'trian'; did you mean"),
        ("proj.train:helper", "trial.function: module proj.train ({w}/proj/train.py) defines no 'helper' (its "
                              "functions: train)"),
        ("proj.broken:train", "trial.function: {w}/proj/broken.py does not parse: "),
        ("__main__:train", "trial.function: a trial's function runs in a process of its own, which imports it from a "
                           "module: not from __main__"),
        ("types:train", "trial.function: {w}/types.py has the name of Python's own module 'types', which a trial's "
                        "process imports before it, so it would never import this one: rename it"),
        ("guarded:train", "trial.function: module guarded ({w}/guarded.py) defines 'train' only under `if __name__ == "
                          "\"__main__\":`, whose body a trial's process never runs (it imports the module): define it "
                          "at the module's top level"),
    ],
)
def test_a_trial_function_that_cannot_be_found(tmp_path: Path, function: str, message: str) -> None:
    workdir = package(tmp_path / "code", {
        "proj/__init__.py": "",
        "proj/train.py": "import torch\nRAN = open(__file__ + '.ran', 'w')\ndef train(config):\n    pass\n",
        "proj/broken.py": "def train(config)\n",
        "types.py": "def train(config):\n    pass\n",  # every trial failed: "module 'types' has no attribute"
        # every trial failed: "module 'guarded' has no attribute 'train'"
        "guarded.py": "import sys\nif '__main__' == __name__:\n    from os import *\n    def train(config):\n"
                      "        pass\n    train(sys.argv)\n",
    })
    with pytest.raises(SpecError) as raised:
        load_in(tmp_path, put("trial", value={"function": function, "workdir": "code"}))
    assert str(raised.value).startswith(f"{tmp_path / 'spec.yaml'}: {message.format(w=workdir)}")
    assert not (workdir / "proj" / "train.py.ran").exists()  # checked without running the module


@pytest.mark.parametrize(
    "text",
    [
        "def train(config):\n    pass\n",
        "from json import loads as train\n",
        "if True:\n    train = lambda config: None\n",
        "from os.path import *\n",  # names it cannot list: accepted, the worker will tell
        "def __getattr__(name):\n    return print\n",
        "globals()['train'] = print\n",
        "if __name__ == '__main__':\n    pass\nelse:\n    def train(config):\n        pass\n",  # imported: else runs
    ],
)
def test_a_trial_function_that_is_or_may_be_there(tmp_path: Path, text: str) -> None:
    package(tmp_path / "code", {"mod.py": text})
    spec = load_in(tmp_path, put("trial", value={"function": "mod:train", "workdir": "code"}))
    assert spec.workdir == tmp_path / "code"


def test_a_storage_dir_outside_the_project_needs_an_explicit_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    project.mkdir()
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(SpecError) as raised:
        load_in(project, put("storage", "dir", value="../elsewhere"))
    assert str(raised.value) == (
        f"{project / 'spec.yaml'}: storage.dir: {elsewhere} is outside the spec's folder ({project}), the trial's "
        f"workdir ({ROOT}), your home ({tmp_path / 'home'}); set storage.allow_outside: true to write there"
    )
    spec = load_in(project, put("storage", value={"dir": "../elsewhere", "allow_outside": True}))
    assert spec.storage_dir == elsewhere
    assert "allow_outside" not in spec.model_dump()["storage"]  # not part of the experiment's identity
    for inside in ("runs", str(ROOT / "runs"), str(tmp_path / "home" / "runs")):
        assert load_in(project, put("storage", "dir", value=inside)).storage_dir.name == "runs"
    (project / "taken").write_text("")
    with pytest.raises(SpecError, match=f"storage.dir: {project / 'taken'} is not a directory"):
        load_in(project, put("storage", "dir", value="taken"))
    # ~ is your home, as a shell would read it (a folder named "~" in the spec's folder before)
    assert load_in(project, put("storage", "dir", value="~/runs")).storage_dir == tmp_path / "home" / "runs"
    (tmp_path / "home" / "code").mkdir(parents=True)
    assert load_in(project, put("trial", "workdir", value="~/code")).workdir == tmp_path / "home" / "code"


def test_hermes_run_refuses_a_broken_spec_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes.cli import main

    path = write(tmp_path, spec_with(put("trial", "function", value="examples.digits.train:trian")))
    assert main(["run", str(path), "--no-live"]) == 2
    assert capsys.readouterr().err == (
        f"hermes: error: {path}: trial.function: module examples.digits.train ({ROOT}/examples/digits/train.py) "
        "defines no 'trian'; did you mean 'train'?\n"
    )
    assert not (tmp_path / "runs").exists()


def test_a_wrong_name_in_place_of_the_specs_is_blamed_on_it_not_on_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hermes run spec.yaml --name team/x said "spec.yaml: name: ...", sending the user to a file without fault."""
    from hermes.cli import main

    path = write(tmp_path, SPEC)
    rule = "must start with a letter or digit and use only letters, digits, '.', '_' and '-', 128 characters at most"
    with pytest.raises(SpecError) as raised:
        load_spec(path, "team/x")
    assert str(raised.value) == f"the name given in place of the spec's (--name), 'team/x': {rule}"
    assert raised.value.problems == [("name", rule)]
    assert main(["run", str(path), "--name", "team/x", "--no-live"]) == 2
    assert capsys.readouterr().err == f"hermes: error: {raised.value}\n"
    assert not (tmp_path / "runs").exists()
    assert load_spec(path, "team-x").name == "team-x"


@pytest.mark.parametrize(("uri", "expected"), [
    (None, "{base}/runs/{name}/checkpoints"),  # the default: a plain path, not a file:// URI fsspec misreads
    ("ckpts", "{base}/ckpts/{name}"),  # as storage.dir: from the spec's folder, not each Ray node's working directory
    ("/mnt/shared ckpts", "/mnt/shared ckpts/{name}"),  # each experiment's apart: they shared one, and overwrote
    ("s3://bucket/prefix/", "s3://bucket/prefix/{name}"),  # each other's checkpoints
])
def test_the_checkpoint_uri_a_relative_path_starting_at_the_spec(tmp_path: Path, uri: str | None, expected: str) -> None:
    (tmp_path / "the spec").mkdir()

    def on_ray(data: dict[str, Any]) -> None:
        data["storage"] = {"dir": "runs", **({"uri": uri} if uri else {})}
        data["engine"] = "ray"

    spec = load_in(tmp_path / "the spec", on_ray)
    assert spec.checkpoint_uri == expected.format(base=(tmp_path / "the spec").resolve(), name=spec.name)


@pytest.mark.parametrize(("uri", "meant"), [("file://mnt/hermes/checkpoints", "file:///mnt/hermes/checkpoints"),
                                            ("file://ckpts/kd", "file:///ckpts/kd")])
def test_a_file_uri_with_a_host_is_refused(uri: str, meant: str) -> None:
    """``file://mnt/x`` names the host ``mnt``, and its path alone was used: the checkpoints went to /x."""
    with pytest.raises(SpecError) as raised:
        parse_spec(SPEC | {"engine": "ray", "storage": {"uri": uri}})
    assert raised.value.problems == [("storage.uri", f"{uri!r}: a file URI has no host; did you mean {meant!r}?")]
    assert parse_spec(SPEC | {"engine": "ray", "storage": {"uri": "file://localhost/mnt/x"}}).storage.uri  # RFC 8089


@pytest.mark.parametrize(("section", "field"), [({"ray": {"address": "auto"}}, "ray"),
                                                ({"storage": {"uri": "s3://bucket/checkpoints"}}, "storage.uri"),
                                                ({"storage": {"uri": "/mnt/shared"}}, "storage.uri")])
def test_ray_settings_without_engine_ray_are_refused(section: dict[str, Any], field: str) -> None:
    """The local engine read neither: a spec that lacked ``engine: ray`` ran on this machine alone, unsaid."""
    with pytest.raises(SpecError) as raised:
        parse_spec(SPEC | section)
    assert [where for where, _ in raised.value.problems] == [field]
    assert raised.value.problems[0][1].startswith("is read only with engine: ray")
    assert raised.value.problems[0][1].endswith("; add engine: ray, or remove it")
    assert parse_spec(SPEC | section | {"engine": "ray"}).engine == "ray"


@pytest.mark.parametrize("kind", ["choice", "grid"])
@pytest.mark.parametrize("values", [{"adam", "sgd"}, frozenset({"adam", "sgd", "rmsprop", "lion"})])
def test_a_set_of_values_is_refused_for_its_order_changes_with_each_process(kind: str, values: object) -> None:
    """A set's order follows its strings' hashes: each run drew other configs, and a rerun found its stored spec
    changed (``differs in search.space.opt.values``)."""
    with pytest.raises(SpecError) as raised:
        parse_spec(spec_with(put("search", "space", "opt", value={"type": kind, "values": values})))
    assert raised.value.problems == [("search.space.opt.values", "a set has no order: give a list (sorted(...), say)")]
    ordered = parse_spec(spec_with(put("search", "space", "opt", value={"type": kind, "values": sorted(values)})))
    assert ordered.search.space["opt"].values == sorted(values)


@pytest.mark.parametrize("infinite", [math.inf, "1e999"])
@pytest.mark.parametrize("path", [("search", "max_time"), ("search", "max_gpu_hours"), ("policy", "period"),
                                  ("trial", "timeout"), ("trial", "stall", "min"), ("trial", "stall", "after"),
                                  ("ray", "poll")])
def test_an_infinite_limit_is_refused_naming_the_field(path: tuple[str, ...], infinite: object) -> None:
    """JSON has no infinity: a stored inf read back as null, so the stored spec no longer parsed (a pool re-reads it:
    ``search.trials: required``) or meant another one (no period set)."""
    data = copy.deepcopy(SPEC) | {"engine": "ray"}
    section = data
    for key in path[:-1]:
        section = section.setdefault(key, {})
    section[path[-1]] = infinite
    with pytest.raises(SpecError) as raised:
        parse_spec(data)
    assert raised.value.problems == [(".".join(path), "Input should be a finite number")]


def test_a_spec_limited_by_time_alone_reads_back_from_its_stored_form() -> None:
    data = spec_with(drop("search", "trials"))
    data["search"] |= {"max_time": "1e5h", "max_gpu_hours": 1e300}
    spec = parse_spec(data)
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_a_list_config_may_leave_a_fixed_parameter_out_as_the_docs_say() -> None:
    """docs/search.md: a config of sampler list "may leave it out or must give it as written"; one that gave it beside
    one that left it out was refused ("search.configs.1: must set the same parameters as configs.0 (lr, copies)")."""
    space = {"lr": {"type": "choice", "values": [0.1, 0.01]}, "copies": 1}
    listed = spec_with(lambda d: d.update(search={"space": space, "configs": [{"lr": 0.1, "copies": 1}, {"lr": 0.01}]}))
    assert configs_of(parse_spec(listed)) == [{"lr": 0.1, "copies": 1}, {"lr": 0.01, "copies": 1}]
    unlike = spec_with(lambda d: d.update(search={"space": space, "configs": [{"lr": 0.1, "copies": 1}, {"copies": 1}]}))
    with pytest.raises(SpecError, match=r"search.configs.1: must set the same parameters as configs.0 \(lr\); it may "
                                        r"set the fixed ones \(copies\) too$"):
        parse_spec(unlike)
    derived = spec_with(lambda d: d.update(search={"configs": [{"lr": 0.1, "copies": 1}, {"lr": 0.01}]}))
    with pytest.raises(SpecError, match=r"search.configs.1: must set the same parameters as configs.0 \(lr, copies\)$"):
        parse_spec(derived)  # no space: no parameter is fixed
