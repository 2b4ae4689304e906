"""The experiment spec: one YAML file says what to train, what to search, and how to schedule it.

Every problem is reported as a SpecError naming the file and the field path, e.g.
``spec.yaml: search.space.lr.low: must be > 0 for loguniform``, all problems at once.

Search space semantics (see ``hermes.search``):

- ``uniform`` / ``loguniform``: a float in [low, high] (loguniform: uniform in log space);
  ``int``: an integer in [low, high], both included (``log: true``: uniform in log space; ``step``: low, low + step,
  ... up to high, as Optuna's ``suggest_int``); ``choice``: one of ``values``, drawn per trial.
- A bare value (``lr: 0.1``, as Ray Tune's ``param_space`` takes one) is fixed: every trial gets it, and no
  sampler searches it.
- ``grid``: every value is tried. Grid parameters are crossed (all combinations). ``search.trials``
  counts all trials and must be a multiple of the number of combinations: trial ``i`` takes
  combination ``i mod combinations`` (so the first trials cover the grid once, then it repeats),
  and draws its other parameters afresh.
- ``sampler: grid`` allows only grid parameters, and ``trials`` defaults to one pass over the grid;
  Optuna's samplers (``tpe``, ``cmaes``, ``gp``, ``qmc``, or any by class path) allow no grid parameters;
  ``sampler: list`` tries ``configs``, the given configurations, in order (``docs/search.md``).
- The budget (``trials``, ``max_time``, ``max_gpu_hours``) ends the proposals, whichever comes first.

Relative paths (``trial.workdir``, ``storage.dir``) are relative to the spec file's folder, a leading ``~`` is your
home, and an environment variable in one is refused (nothing expands it); the spec keeps them as written so that a
moved project still matches its stored spec, and a rerun compares ``trial.workdir`` by the folder it names
(``ExperimentSpec.same_workdir``).
"""

from __future__ import annotations

import errno
import math
import os
import re
import urllib.parse
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import regex
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails

from hermes.errors import SpecError
from hermes.experiment.command import CommandError, check_shell_words, parse_template, validate_template
from hermes.experiment.locate import missing_function
from hermes.plugins import construct, importable_from
from hermes.trial.protocol import MAX_STEP

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a directory's name, and the store's key with its owner
_NAME_RULE = "must start with a letter or digit and use only letters, digits, '.', '_' and '-', 128 characters at most"
# What Hermes keeps in a storage dir beside the experiments' folders (<storage.dir>/<name>): the store, SQLite's files
# beside it, the runner's lock and reserve (hermes.store.lock), `hermes plot`'s default folder; and in a server's
# root, which `hermes run` may use as its storage dir: the pool's folder and the users' areas.
_TAKEN_NAMES = ("hermes.db", "hermes.db-journal", "hermes.db-wal", "hermes.db-shm", "hermes.lock", "hermes.reserve",
                "plots", "pool", "users")
# Whole numbers, numbers and switches are taken as written: true is not 1, 2.0 is not 2, "3" is not 3, and
# "0.1" is not 0.1 (a float field takes a whole number as a float; a string only as _yaml_float says).
_EXPONENT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")
EXACT_INTS = 2**53  # a float holds every whole number from -EXACT_INTS to EXACT_INTS, and not all beyond


def _yaml_float(value: Any) -> Any:
    """Text in exponent notation (1e-4, 1.0e4) as the float it spells, where only a number may go (low, high, a
    duration) and in a policy's or sampler's arguments: a spec read by a YAML 1.1 loader (``yaml.safe_load``, which
    reads a float only with a dot and a signed exponent) holds 1e-4 as text; the spec file's own loader reads it as
    the float. A value a trial receives (a choice's, a fixed one, a config's) stays the text it is. Anything else as
    it is."""
    return float(value) if isinstance(value, str) and _EXPONENT.fullmatch(value) else value


def _path_text(value: Any) -> Any:
    """A ``pathlib.Path`` (any os.PathLike) as the text it holds: a spec built in Python names its folders so, and
    the stored spec keeps text. Anything else as it is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[^}]*\}?)")  # $HOME, ${HOME}


def _no_variables(path: str, info: ValidationInfo) -> str:
    """Refuse an environment variable in a path: nothing expands it, and ``$HOME/runs`` made a folder named
    ``$HOME`` beside the spec. A leading ``~`` is your home (``_place``), as a shell's and Ray Tune's storage_path.
    Not in a stored spec read back (``parse_spec(stored=True)``): its experiment ran with that folder before."""
    variable = _VARIABLE.search(path)
    if variable is not None and not _stored(info):
        raise ValueError(f"{path!r} holds {variable[0]}, an environment variable, but Hermes does not expand "
                         "environment variables: write the path out (a leading ~ is your home)")
    return path


def _stored(info: ValidationInfo) -> bool:
    """Whether the spec is a stored one read back (a pool taking it up, its old runs ended), not new input: checks
    added since it was stored must not fail an experiment that ran as it was."""
    return bool(info.context and info.context.get("stored"))


# a path field: text, or a pathlib.Path from Python
PathText = Annotated[str, BeforeValidator(_path_text), AfterValidator(_no_variables)]
FiniteFloat = Annotated[float, BeforeValidator(_yaml_float), Strict(), Field(allow_inf_nan=False)]
# finite: JSON has no infinity, so a stored inf would read back as null (no limit set, or a required field missing)
StrictPositiveFloat = Annotated[float, BeforeValidator(_yaml_float), Strict(), Field(gt=0, allow_inf_nan=False)]
StrictPositiveInt = Annotated[int, Strict(), Field(gt=0)]
_CLASS_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # package.module.Class
MAX_SLOTS = 1024  # CPU slots (or threads per slot) of one machine: far above its cores, well below a hang
MAX_TRIALS = 1_000_000  # per experiment; their configurations are drawn up front
DEFAULT_MAX_FAILURES = 2  # runs of a trial that may crash before it fails (trial.max_failures)


class _PathError(ValueError):
    """A complaint about a field below the one whose validator raised it; ``path`` is relative to that field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class _Section(BaseModel):
    """A mapping of the spec: unknown keys are errors that list the known ones (typos fail loudly), and a bare value
    given for it (``metric: accuracy``) says what it must hold, where pydantic named its class (MetricSpec)."""

    model_config = ConfigDict(extra="forbid")
    _example: ClassVar[str] = ""  # the section written out, for that error; else its fields are listed

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict | BaseModel):
            such = f"such as {cls._example}" if cls._example else f"of {', '.join(cls.model_fields)}"
            raise ValueError(f"must be a mapping {such}, got {data!r}")
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise _PathError(str(key), f"unknown field; expected one of {', '.join(cls.model_fields)}")
        return data


# ---------------------------------------------------------------------- search space
class Uniform(_Section):
    type: Literal["uniform"]
    low: FiniteFloat
    high: FiniteFloat

    @field_validator("high")
    @classmethod
    def _above_low(cls, high: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and not high > low:
            raise ValueError(f"must be greater than low ({low})")
        if low is not None and not math.isfinite(high - low):
            raise ValueError(f"high - low must be a finite number: floats cannot sample from {low} to {high}")
        return high

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high


class LogUniform(Uniform):
    type: Literal["loguniform"]  # type: ignore[assignment]

    @field_validator("low")
    @classmethod
    def _positive(cls, low: float) -> float:
        if not low > 0:
            raise ValueError("must be > 0 for loguniform")
        return low


class IntRange(_Section):
    type: Literal["int"]
    low: StrictInt
    high: StrictInt
    log: StrictBool = False  # uniform in log space, as Optuna's suggest_int(log=True)
    step: StrictInt = 1  # the values are low, low + step, ... up to high (which need not be one of them)

    @field_validator("high")
    @classmethod
    def _above_low(cls, high: int, info: ValidationInfo) -> int:
        low = info.data.get("low")
        if low is not None and not high > low:
            raise ValueError(f"must be greater than low ({low})")
        return high

    @field_validator("step")
    @classmethod
    def _whole_step(cls, step: int) -> int:
        if step < 1:
            raise ValueError(f"must be a whole number of at least 1, got {step}")
        return step

    @model_validator(mode="after")
    def _log_fits(self) -> IntRange:
        """Optuna's rules for a log-uniform integer, so that every sampler takes the same space."""
        if self.log and self.step != 1:
            raise _PathError("step", "cannot be combined with log: true (as in Optuna's suggest_int); give one of them")
        if self.log and self.low < 1:
            raise _PathError("low", f"must be at least 1 for log: true, got {self.low}")
        if self.log and self.high > EXACT_INTS:
            raise _PathError("high", f"must be at most 2**53 ({EXACT_INTS}) for log: true, got {self.high}: a "
                                     "log-uniform integer is drawn through floats, which hold every whole number only "
                                     "that far")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave out log and step at their defaults, so specs stored before they existed still match."""
        data = handler(self)
        return {key: value for key, value in data.items() if (key, value) not in (("log", False), ("step", 1))}

    @property
    def top(self) -> int:
        """The largest value on the step: high itself when high - low is a multiple of step."""
        return self.low + (self.high - self.low) // self.step * self.step

    def contains(self, value: Any) -> bool:
        return (isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high
                and (value - self.low) % self.step == 0)


class Choice(_Section):
    type: Literal["choice"]
    values: list[Any]
    _typed_values: frozenset[tuple[type, Any]] = PrivateAttr()  # for contains: each value with its type

    @field_validator("values", mode="before")
    @classmethod
    def _ordered(cls, values: Any) -> Any:
        """A set's order follows its strings' hashes, which change with every process: the trials' configs would too,
        and a rerun would find its stored spec changed."""
        if isinstance(values, (set, frozenset)):
            raise ValueError("a set has no order: give a list (sorted(...), say)")
        return values

    @field_validator("values")
    @classmethod
    def _scalars(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise ValueError("must list at least one value")
        values = [_plain(value) for value in values]  # as given: "1e3" is text (1e3 unquoted in YAML, the float)
        first: dict[Any, Any] = {}  # each value by equality, as first listed (a dict: a long list is checked fast)
        for index, value in enumerate(values):
            if not _scalar(value):
                raise _PathError(str(index), f"must be a string, a finite number or a boolean, got {value!r}")
            if value in first:  # Optuna finds a choice by equality: 1, 1.0 and True would be one
                earlier = first[value]
                twice = f"{value!r} is listed twice" if _same(value, earlier) else f"{value!r} equals {earlier!r}"
                raise _PathError(str(index), f"{twice}; a choice's values must differ")
            first[value] = value
        return values

    def model_post_init(self, context: Any) -> None:
        self._typed_values = frozenset(map(_typed_key, self.values))

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one of the values, as written: true is not 1, and 2.0 is not 2. By a set, since a
        config list checks each config's values (the pool checks a stored list of thousands again)."""
        return isinstance(value, Hashable) and _typed_key(value) in self._typed_values


class Grid(Choice):
    type: Literal["grid"]  # type: ignore[assignment]


class Constant(Choice):
    """A fixed parameter, written as its bare value (``lr: 0.1``, as Ray Tune's ``param_space`` takes one): every
    trial gets it and no sampler searches it. A choice of one value, so that what reads a choice's values
    (a command's placeholders, a config's check) reads it too; stored as the bare value it was written as."""

    type: Literal["constant"]  # type: ignore[assignment]

    @model_serializer(mode="plain")
    def _bare(self) -> Any:
        return self.value

    @property
    def value(self) -> Any:
        return self.values[0]


def _same(value: Any, other: Any) -> bool:
    return type(value) is type(other) and value == other


def _typed_key(value: Any) -> tuple[type, Any]:
    """``value`` with its type, so that keys are equal where ``_same`` holds: 1, 1.0 and True stay apart."""
    return type(value), value


def _scalar(value: Any) -> bool:
    """A value a trial can take from the spec: a string, a boolean or a finite number."""
    return isinstance(value, (str, int, float)) and not (isinstance(value, float) and not math.isfinite(value))


def _plain(value: Any) -> Any:
    """A NumPy scalar (np.int64(32), np.float32(0.1), np.bool_(True)) as the Python value it holds, so that a spec
    built in Python with NumPy is checked, compared and stored as plain JSON; anything else as it is."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def _plain_tree(value: Any) -> Any:
    """``_plain`` throughout a spec built in Python: its numbers (seed, a policy's params) may be NumPy's."""
    if isinstance(value, dict):
        return {key: _plain_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_tree(item) for item in value)
    return _plain(value)


def _json_value(value: Any, path: str) -> Any:
    """``value`` (a sampler's argument) as plain JSON, NumPy scalars as the values they hold; a _PathError at
    ``path`` for what a stored spec cannot hold (a callable, an object)."""
    value = _plain(value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise _PathError(path, f"must have text keys, got {key!r}")
        return {key: _json_value(item, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{path}.{index}") for index, item in enumerate(value)]
    if value is None or isinstance(value, str) or _scalar(value):
        return value
    what = "a callable" if callable(value) else type(value).__name__
    raise _PathError(path, f"must be a plain value (text, a finite number, a boolean, null, or a list or mapping of "
                           f"them) that the stored spec can hold, got {what}: {value!r}")


Parameter = Annotated[Uniform | LogUniform | IntRange | Choice | Grid | Constant, Field(discriminator="type")]
PARAMETER_TYPES = ("uniform", "loguniform", "int", "choice", "grid")  # and "constant", written as the bare value


class SearchSpec(_Section):
    _example = "{sampler: random, trials: 20, space: {lr: {type: loguniform, low: 1e-4, high: 0.1}}}"
    # A name (random, grid, list, tpe, cmaes, gp, qmc), {name: ..., args: {...}}, any Optuna
    # sampler by class path: {optuna: optuna.samplers.NSGAIISampler, args: {...}}, or a searcher of
    # one's own (a hermes.search.BaseSearcher) as module:Class.
    sampler: str | dict[str, Any] = "random"
    # The budget, whichever ends first; a rerun may change it. trials defaults to one pass for grid and list.
    trials: Annotated[int, Strict(), Field(gt=0, le=MAX_TRIALS)] | None = None
    max_time: StrictPositiveFloat | None = None  # seconds of wall-clock time, or "90m", "2h", "1d"
    max_gpu_hours: StrictPositiveFloat | None = None
    max_pending: StrictPositiveInt | None = None  # unfinished trials in flight; default in hermes.search.make_searcher
    seed: Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)] = 0  # what NumPy's and Optuna's generators take
    space: dict[str, Parameter] = {}  # for sampler list, derived from configs when not given
    configs: list[dict[str, Any]] | None = None  # sampler list: the configurations, in trial order

    @field_validator("sampler", mode="before")
    @classmethod
    def _sampler_shape(cls, sampler: Any) -> Any:
        """Checked before pydantic's union, whose errors would name its branches (search.sampler.str: ...)."""
        if isinstance(sampler, str):
            return sampler
        if not isinstance(sampler, dict):
            raise ValueError("must be a sampler's name, module:Class, or a mapping with name or optuna")
        unknown = [key for key in sampler if key not in ("name", "optuna", "args")]
        if unknown:
            raise _PathError(str(unknown[0]), "unknown field; expected one of name, optuna, args")
        if ("name" in sampler) == ("optuna" in sampler):
            raise ValueError("give exactly one of name (a registered sampler) or optuna (a sampler class path)")
        name, path = sampler.get("name"), sampler.get("optuna")
        if "name" in sampler and not (isinstance(name, str) and name):
            raise _PathError("name", f"must be a sampler's name (tpe, say) or a searcher's module:Class, got {name!r}")
        if "optuna" in sampler and not (isinstance(path, str) and _CLASS_PATH.fullmatch(path)):
            raise _PathError("optuna", f"must be a sampler class's dotted path like "
                                       f"optuna.samplers.NSGAIISampler, got {path!r}")
        if not isinstance(sampler.get("args", {}), dict):
            raise _PathError("args", "must be a mapping of argument names to values")
        return {**sampler, "args": _yaml_floats(_json_value(sampler["args"], "args"))} if "args" in sampler else sampler

    @field_validator("max_time", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return _seconds(value)

    @field_validator("space", mode="before")
    @classmethod
    def _constants(cls, space: Any) -> Any:
        """A bare value is a fixed parameter (``Constant``); anything else but a mapping says what may be given."""
        if not isinstance(space, dict):
            return space
        fixed = {}
        for name, parameter in space.items():
            if not isinstance(name, str):  # `on:` was YAML 1.1's true, and the error named it "1"
                raise _PathError(str(name), f"a parameter's name must be text, got {_typed(name)}: quote it")
            value = _plain(parameter)
            if isinstance(value, (dict, BaseModel)):
                continue
            if not _scalar(value):
                raise _PathError(str(name), f"must be a parameter (a mapping with a type: {', '.join(PARAMETER_TYPES)})"
                                            f" or a fixed value (text, a finite number or a boolean), got {value!r}")
            fixed[name] = {"type": "constant", "values": [value]}
        return {**space, **fixed}

    @field_validator("space")
    @classmethod
    def _names(cls, space: dict[str, Any]) -> dict[str, Any]:
        if not space:
            raise ValueError("must define at least one parameter")
        for name in space:
            if not _IDENTIFIER.fullmatch(name):
                raise _PathError(name, "parameter names must be ASCII Python identifiers (letters, digits, _)")
        return space

    @field_validator("configs")
    @classmethod
    def _configs(cls, configs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if configs is not None and not configs:
            raise ValueError("must list at least one configuration")
        if configs is not None:
            configs = [{name: _plain(value) for name, value in config.items()} for config in configs]
        for index, config in enumerate(configs or []):
            if not config:
                raise _PathError(str(index), "sets no parameter")
            for name, value in config.items():
                if not _IDENTIFIER.fullmatch(name):
                    raise _PathError(f"{index}.{name}", "parameter names must be ASCII Python identifiers")
                if not _scalar(value):
                    raise _PathError(f"{index}.{name}", f"must be a string, a finite number or a boolean: {value!r}")
        return configs

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave out the fields added with hermes.search while unset, so specs stored before still match."""
        data = handler(self)
        added = ("max_time", "max_gpu_hours", "max_pending", "configs")
        return {key: value for key, value in data.items() if value is not None or key not in added}

    @property
    def sampler_name(self) -> str:
        """The registered name, or the Optuna class path."""
        if isinstance(self.sampler, str):
            return self.sampler
        return str(self.sampler["name"] if "name" in self.sampler else self.sampler["optuna"])

    @property
    def sampler_args(self) -> dict[str, Any]:
        return {} if isinstance(self.sampler, str) else dict(self.sampler.get("args", {}))

    @property
    def grid(self) -> dict[str, list[Any]]:
        """The grid parameters and their values, in spec order."""
        return {name: p.values for name, p in self.space.items() if isinstance(p, Grid)}

    @property
    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.grid.values())

    @model_validator(mode="after")
    def _sampler_fits_space(self) -> SearchSpec:
        from hermes import search  # the searchers' registry, loaded when a spec is checked

        if self.configs is not None and "sampler" not in self.model_fields_set:
            self.sampler = "list"
        name = self.sampler_name
        try:
            search.check_sampler(self)
        except search.SamplerError as error:
            raise _PathError(error.field, error.reason) from None
        if (name == "list") != (self.configs is not None):
            raise _PathError("configs", "required for sampler list" if name == "list" else "only for sampler list")
        if self.configs is not None:
            self._fit_configs()
        if not self.space:
            raise _PathError("space", "required")
        for param, parameter in self.space.items():
            if name == "grid" and not isinstance(parameter, (Grid, Constant)):
                raise _PathError(f"space.{param}", "sampler grid takes grid parameters only; use sampler random")
            if isinstance(parameter, Grid) and search.hermes_searcher(self) is None:
                raise _PathError(f"space.{param}", f"sampler {name} takes no grid parameters; use type choice")
        if self.trials is None and name in ("grid", "list"):
            self.trials = len(self.configs) if self.configs is not None else self.grid_size
        if self.trials is None and self.max_time is None and self.max_gpu_hours is None:
            raise _PathError("trials", f"required for sampler {name}, unless max_time or max_gpu_hours is given")
        if self.configs is not None:  # the configs say what runs; a grid parameter is a set of values they keep to
            if self.trials is not None and self.trials > len(self.configs):
                raise _PathError("trials", f"must be at most the {len(self.configs)} configs")
            return self
        size = self.grid_size  # each sampler that takes grid parameters lists their combinations up front
        if size > MAX_TRIALS:
            raise _PathError("trials", f"the grid has {size} combinations, more than the {MAX_TRIALS} trials an "
                                       "experiment may have")
        if self.trials is not None and self.trials % size:
            lower, upper = self.trials // size * size, (self.trials // size + 1) * size
            example = f"{lower} or {upper}" if lower else f"{upper}"
            raise _PathError(
                "trials",
                f"must be a multiple of the {size} grid combinations, so each is tried equally often (e.g. {example})",
            )
        return self

    def _fit_configs(self) -> None:
        """Derive the space from the configs (each parameter a choice of its values), or check them against it."""
        assert self.configs is not None
        # A fixed parameter a config may leave out or give (as written): the others, each config sets alike (a
        # configs.0 of fixed ones alone lacks the space's others, as the check against the space says)
        fixed = [name for name, parameter in self.space.items() if isinstance(parameter, Constant)]
        first = [name for name in self.configs[0] if name not in fixed]
        for index, config in enumerate(self.configs):
            if first and set(config) - set(fixed) != set(first):
                also = f"; it may set the fixed ones ({', '.join(fixed)}) too" if fixed else ""
                raise _PathError(f"configs.{index}", f"must set the same parameters as configs.0 ({', '.join(first)})"
                                                     f"{also}")
        if not self.space:
            # Each value once, as its first config wrote it; one equal to an earlier value but of another type
            # (1, 1.0, true) is refused, as a choice written so is: merged, the space held one of them, and the
            # stored spec failed its own check (the pool reads it again).
            seen: dict[str, dict[Any, Any]] = {name: {} for name in self.configs[0]}
            for index, config in enumerate(self.configs):
                for name, value in config.items():
                    earlier = seen[name].setdefault(value, value)
                    if not _same(value, earlier):
                        raise _PathError(f"configs.{index}.{name}", (
                            f"{_typed(value)} equals the {_typed(earlier)} of an earlier config: write a parameter's "
                            "values alike, as the choice derived from configs takes values that differ by equality"))
            self.space = {name: Choice(type="choice", values=list(values)) for name, values in seen.items()}
            return
        searched = [name for name in self.space if name not in fixed]
        for index, config in enumerate(self.configs):
            if not set(searched) <= set(config) <= set(self.space):
                also = f"; it may set the fixed ones ({', '.join(fixed)}) too" if fixed else ""
                raise _PathError(f"configs.{index}", f"must set exactly the parameters of space ({', '.join(searched)})"
                                                     f"{also}")
            for param, value in config.items():
                problem = _misfit(self.space[param], value, f"search.space.{param}")
                if problem is not None:
                    raise _PathError(f"configs.{index}.{param}", problem)


def _typed(value: Any) -> str:
    """A value with its type, for messages where the type is the difference: float 3.0, bool True."""
    return f"{type(value).__name__} {value!r}"


def _misfit(parameter: Parameter, value: Any, where: str) -> str | None:
    """Why a config's value lies outside its parameter ``where``, or None: a value of the wrong type says so, where
    "outside" sent users looking at the range. The messages start "<value> is out", as they did."""
    if parameter.contains(value):
        return None
    if isinstance(parameter, Constant):
        return f"{value!r} is out of {where}: it is fixed at {_typed(parameter.value)}"
    if isinstance(parameter, IntRange) and type(value) is not int:
        return f"{value!r} is out of {where}'s type: must be an int, got {_typed(value)}"
    if isinstance(parameter, IntRange) and parameter.low <= value <= parameter.high:
        return f"{value!r} is off {where}'s step: must be {parameter.low} plus a multiple of {parameter.step}"
    if isinstance(parameter, Uniform) and type(value) not in (int, float):
        return f"{value!r} is out of {where}'s type: must be a number, got {_typed(value)}"
    if isinstance(parameter, Choice):
        equal = next((listed for listed in parameter.values if listed == value), None)
        if equal is not None:  # 2.0 where 2 is listed, true where 1 is
            return f"{value!r} is out of {where}'s values as written: they hold {_typed(equal)}, not {_typed(value)}"
        return f"{value!r} is outside {where}: not one of its values"
    return f"{value!r} is outside {where} [{parameter.low}, {parameter.high}]"


def _seconds(value: Any) -> Any:
    """A duration like '90m', '2h', '1d' in seconds; anything else as it is, for the field to check."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*((?:[0-9]*\.)?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([smhd]?)\s*", value)
        if not match:
            raise ValueError(f"must be seconds or a duration like '90m', '2h', '1d', got {value!r}")
        return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    return value


# ---------------------------------------------------------------------- the rest of the spec
class StallSpec(_Section):
    """When a running trial that stops reporting counts as hung (it is killed and fails): silent
    for ``factor`` times its slowest step so far but at least ``min`` seconds, or ``after`` seconds
    whatever its steps (which also covers the time before its first report)."""

    factor: Annotated[float, BeforeValidator(_yaml_float), Strict(), Field(ge=0, allow_inf_nan=False)] = 20.0  # 0: off
    min: StrictPositiveFloat = 600.0  # an evaluation or a save between fast steps may take minutes
    after: StrictPositiveFloat | None = None

    @field_validator("min", "after", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return _seconds(value)


class TrialSpec(_Section):
    """What one trial runs: a Python function, or a command line with ``{param}`` placeholders (and ``{trial_dir}``,
    the trial's own folder)."""

    _example = "{function: train:main} or {command: 'python train.py --lr {lr}'}"  # quoted: {lr} ends a flow map
    function: str | None = None  # "package.module:function"
    command: str | None = None
    metrics_regex: str | None = None  # for unmodified scripts: parses their output lines
    workdir: PathText = "."
    # A function runs in its slot's warm worker, parked in memory when suspended; false: a process
    # per trial and per resume (slower switches, but a trial can never disturb another's process).
    warm_workers: StrictBool = True
    # How long a trial may take: seconds (or '90m', '2h') of running time in all, suspended time
    # not counted; and when a silent one is hung. How to run, not what the experiment is: a rerun
    # may change them, so they stay out of the stored spec.
    timeout: StrictPositiveFloat | None = Field(default=None, exclude=True)
    stall: StallSpec = Field(default_factory=StallSpec, exclude=True)
    # How often a trial whose run crashed after reporting runs again from its checkpoint before it is
    # failed (Ray Tune's max_failures, Determined's max_restarts). Part of what the experiment is: a
    # rerun replays its log under the same rule.
    max_failures: Annotated[int, Strict(), Field(ge=0)] = DEFAULT_MAX_FAILURES

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        return _seconds(value)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave out max_failures at its default, so specs stored before it existed still match."""
        data = handler(self)
        if data.get("max_failures") == DEFAULT_MAX_FAILURES:
            del data["max_failures"]
        return data

    @field_validator("function")
    @classmethod
    def _module_function(cls, function: str | None) -> str | None:
        if function is None:
            return None
        module, _, name = function.partition(":")
        if not (name and all(_IDENTIFIER.fullmatch(part) for part in [*module.split("."), name])):
            raise ValueError(f"must be 'package.module:function', got {function!r}")
        return function

    @field_validator("command")
    @classmethod
    def _command(cls, command: str | None) -> str | None:
        if command is not None:
            try:
                parse_template(command)
            except CommandError as error:
                raise ValueError(str(error)) from None
        return command

    @field_validator("metrics_regex")
    @classmethod
    def _regex(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:  # Python's re syntax, and the regex package, which searches it with a time limit, takes it too
            re.compile(pattern)
            regex.compile(pattern)
        except (re.error, regex.error) as error:
            raise ValueError(f"does not compile: {error}") from None
        return pattern

    @model_validator(mode="after")
    def _one_kind(self) -> TrialSpec:
        if (self.function is None) == (self.command is None):
            raise ValueError("give exactly one of function or command")
        if self.metrics_regex is not None and self.command is None:
            raise _PathError("metrics_regex", "only for command trials; a function reports through hermes.trial")
        return self

    @property
    def placeholders(self) -> list[str]:
        """The placeholders the command line uses, in order of first use: parameter names, and trial_dir."""
        return [] if self.command is None else list(parse_template(self.command).placeholders)


class MetricSpec(_Section):
    _example = "{name: accuracy, mode: max}"
    name: str = Field(min_length=1)
    mode: Literal["max", "min"]


class BudgetSpec(_Section):
    _example = "{steps: 20}"
    # steps (usually epochs) a trial trains unless the scheduler stops it; one that reports past them is stopped there
    steps: Annotated[StrictPositiveInt, Field(le=MAX_STEP)]


def _yaml_floats(value: Any) -> Any:
    """_yaml_float throughout a policy's or stopper's params, lists and mappings included: their numbers are read as
    the rest of the spec's are (optimism: 1e-1 reached the policy as text)."""
    if isinstance(value, list):
        return [_yaml_floats(item) for item in value]
    if isinstance(value, dict):
        return {key: _yaml_floats(item) for key, item in value.items()}
    return _yaml_float(value)


Params = Annotated[dict[str, Any], AfterValidator(_yaml_floats)]


class StopperSpec(_Section):
    name: str
    params: Params = {}


class PolicySpec(_Section):
    name: str = "hermes"
    # seconds (or '30s', '5m') of GPU time a trial runs before a better one may preempt it; None: the policy's own
    # (60 s, and hermes lets a turn last one of the trial's own reports)
    period: StrictPositiveFloat | None = None
    params: Params = {}
    stopper: StopperSpec | None = None

    @field_validator("stopper", mode="before")
    @classmethod
    def _stopper_shape(cls, stopper: Any) -> Any:
        """A bare name is ``{name: ...}``, as ``search.sampler: tpe`` is, and stored as that: the docs write
        ``policy.stopper: median``, which pydantic refused naming an internal class (StopperSpec)."""
        if isinstance(stopper, str):
            return {"name": stopper}
        if stopper is None or isinstance(stopper, dict | StopperSpec):
            return stopper
        names = ", ".join(_registered_names("STOPPERS"))
        raise ValueError(f"must be a stopper's name ({names}, or module:Class of your own) or a mapping with name and "
                         f"params, got {stopper!r}")

    @field_validator("period", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return _seconds(value)

    @model_validator(mode="after")
    def _period_once(self, info: ValidationInfo) -> PolicySpec:
        """``settings`` passes params over period: given both, the run took params.period without a word (a stored
        spec read back ran so, and goes on so: ``_stored``)."""
        if self.period is not None and "period" in self.params and not _stored(info):
            raise _PathError("params.period", f"{self.params['period']!r}, while policy.period is {self.period:g}: "
                                              "both set the policy's period; give it once, as policy.period")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unset period is left out of the dump, as fields added later are."""
        data = handler(self)
        return {key: value for key, value in data.items() if key != "period" or value is not None}

    @property
    def settings(self) -> dict[str, Any]:
        """The policy's constructor arguments: its params, and the period where one is set."""
        return {**({} if self.period is None else {"period": self.period}), **self.params}

    @model_validator(mode="after")
    def _registered(self) -> PolicySpec:
        """Build the policy and stopper once, so that a wrong name or parameter fails now, not hours in."""
        # The registries import every policy: do that only when a spec is checked.
        from hermes import policies

        try:
            policy = policies.policy_class(self.name)
        except ValueError as error:
            raise _PathError("name", str(error)) from None
        _build_once(policy, self.settings, "params", f"policy {self.name}")
        if self.stopper is not None:
            try:
                stopper = policies.stopper_class(self.stopper.name)
            except ValueError as error:
                raise _PathError("stopper.name", str(error)) from None
            _build_once(stopper, self.stopper.params, "stopper.params", f"stopper {self.stopper.name}")
        return self


def _registered_names(registry: str) -> list[str]:
    """The names in ``hermes.policies``' ``registry`` (POLICIES, STOPPERS), imported only when a spec is wrong."""
    from hermes import policies

    return list(getattr(policies, registry))


def _build_once(cls: type, params: dict[str, Any], field: str, what: str) -> None:
    """Build a plug-in as the run will, so that it fails here as a spec error naming ``field``: a wrong parameter
    (TypeError, ValueError) says so, and whatever else its constructor raises (a file it reads is missing) is said
    as its ``__init__``'s, as a failing ``configure()`` is said as that method's."""
    try:
        construct(cls, params)
    except (TypeError, ValueError) as error:
        raise _PathError(field, f"{what}: {error}") from None
    except Exception as error:  # noqa: BLE001 - a plug-in's constructor may raise anything
        raise _PathError(field, f"{what}: {cls.__name__}.__init__() raised {type(error).__name__}: {error}") from None


class ResourcesSpec(_Section):
    _example = "{gpus: none, cpu_slots: 4}"
    gpus: Literal["all", "none"] | list[int] = "all"  # or the indices of the GPUs to use
    # trials run at once where there is no GPU; each slot's warm worker starts with the first trial
    cpu_slots: Annotated[StrictPositiveInt, Field(le=MAX_SLOTS)] = 1
    threads_per_slot: Annotated[StrictPositiveInt, Field(le=MAX_SLOTS)] = 1

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, gpus: Any) -> Any:
        if gpus in ("all", "none"):
            return gpus
        if not isinstance(gpus, list) or not gpus:
            raise ValueError(f"must be 'all', 'none' or a list of GPU indices like [0, 1], got {gpus!r}")
        for index, gpu in enumerate(gpus):
            if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
                raise _PathError(str(index), f"must be a GPU index (0, 1, ...), got {gpu!r}")
            if gpu in gpus[:index]:
                raise _PathError(str(index), f"GPU {gpu} is listed twice")
        return gpus


class StorageSpec(_Section):
    _example = "{dir: runs}"
    dir: PathText = "runs"  # holds hermes.db (all experiments, by name), checkpoints and logs
    checkpoint_every: StrictPositiveInt = 1  # steps between checkpoints (its cost: docs/trials.md)
    # engine: ray: where durable checkpoints go so that any node can resume any trial (an fsspec URI:
    # file:// or a path on a shared mount, relative to the spec's folder as dir is, s3://, gs://), each
    # experiment's in a folder named after it there, and in that one named after its creation
    # (hermes.ray.storage.experiment_uri); default: <dir>/<name>/checkpoints on the driver
    # (``ExperimentSpec.checkpoint_uri``).
    # Where the checkpoints are is not what the experiment is (they may move), so it stays out of the stored spec.
    uri: PathText | None = Field(default=None, exclude=True)
    # A dir outside the spec's folder, the trial's workdir and the home is refused unless this says
    # so (a stray absolute path, "/" say, is a typo far more often than a wish). Not part of what
    # the experiment is, so it stays out of the stored spec.
    allow_outside: StrictBool = Field(default=False, exclude=True)

    @field_validator("uri")
    @classmethod
    def _file_uri_without_host(cls, uri: str | None) -> str | None:
        """``file://mnt/x`` names the host ``mnt``: its path alone, ``/x``, was used (RFC 8089 allows localhost)."""
        if uri is not None and uri.startswith("file://") and urllib.parse.urlparse(uri).netloc not in ("", "localhost"):
            raise ValueError(f"{uri!r}: a file URI has no host; did you mean 'file:///{uri[len('file://'):]}'?")
        return uri


class RaySpec(_Section):
    """The Ray engine's settings (docs/ray.md); used with ``engine: ray`` only."""

    _example = "{address: local}"
    # ray.init's: "auto" on a cluster's node, "<ip>:<port>", or "local" for a Ray of this run's own
    address: str = Field(default="auto", min_length=1)
    poll: StrictPositiveFloat = 0.25  # seconds between reads of Ray's node table, for joining and lost nodes


class ExperimentSpec(_Section):
    name: str  # also its key in the store: reusing a name with another spec is refused
    description: str = ""
    trial: TrialSpec
    search: SearchSpec
    metric: MetricSpec
    budget: BudgetSpec
    policy: PolicySpec = Field(default={}, validate_default=True)  # validated: the default policy must exist
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    engine: Literal["local", "ray"] = "local"
    ray: RaySpec = Field(default_factory=RaySpec, exclude=True)  # where it runs, not what it is: not stored

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _plugins_from: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _plain_numbers(cls, data: Any) -> Any:
        """A spec built in Python may hold NumPy's numbers anywhere (seed=np.int64(3), a policy's params): they are
        the numbers they hold, where strict fields refused them and a sampler's reached the store as objects."""
        return _plain_tree(data)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_shape(cls, policy: Any) -> Any:
        """A bare name is ``{name: ...}``, as ``search.sampler: tpe`` is, and stored as that."""
        if isinstance(policy, str):
            return {"name": policy}
        if isinstance(policy, dict | PolicySpec):
            return policy
        names = ", ".join(_registered_names("POLICIES"))
        raise ValueError(f"must be a policy's name ({names}, or module:Class of your own) or a mapping of name, "
                         f"period, params and stopper, got {policy!r}")

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        problem = _name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _objective_printed(self) -> ExperimentSpec:
        """An unmodified program's pattern names the objective: a group called ``value``, or the metric's name."""
        pattern = self.trial.metrics_regex
        groups = set(re.compile(pattern).groupindex) if pattern is not None else set()
        if pattern is not None and not {"value", self.metric.name} & groups:
            named = self.metric.name
            if not named.isidentifier():  # no group can be named so: only value reads it
                raise _PathError("trial.metrics_regex", f"needs a named group for the metric: (?P<value>...), which "
                                                        f"reads {named!r} (a group's name is a Python identifier, "
                                                        f"which {named!r} is not); (?P<step>...) is optional")
            raise _PathError("trial.metrics_regex", f"needs a named group for the metric: (?P<{named}>...) "
                                                    "or (?P<value>...); (?P<step>...) is optional")
        if {"value", self.metric.name} <= groups and self.metric.name != "value":  # which would rank it? one rule
            raise _PathError("trial.metrics_regex", f"has both (?P<value>...) and (?P<{self.metric.name}>...): name "
                                                    "the objective once")
        return self

    @model_validator(mode="after")
    def _placeholders_exist(self) -> ExperimentSpec:
        if self.trial.command is None:
            return self
        try:
            names = validate_template(self.trial.command, self.search.space).placeholders
        except CommandError as error:
            raise _PathError("trial.command", str(error)) from None
        for name in (name for name in names if name in self.search.space):  # not {trial_dir}, the trial's folder
            for index, value in enumerate(getattr(self.search.space[name], "values", ())):
                if isinstance(value, str) and "\0" in value:
                    raise _PathError(f"search.space.{name}.values.{index}",
                                     "holds a NUL character, which no argument of trial.command can carry")
        return self

    @model_validator(mode="after")
    def _fits_this_machine(self, info: ValidationInfo) -> ExperimentSpec:
        """Where the spec's folder is known (``load_spec``): the workdir, the trial's function and
        the storage dir are checked on this machine now, before anything is written."""
        base_dir = (info.context or {}).get("base_dir")
        if base_dir is None:
            return self
        base_dir = self._base_dir = Path(base_dir).resolve()
        workdir = _usable("trial.workdir", base_dir, self.trial.workdir)
        if not workdir.is_dir():
            relative = "" if Path(self.trial.workdir).is_absolute() else f" (relative to the spec's folder {base_dir})"
            problem = "is not a directory" if workdir.exists() else "does not exist"
            raise _PathError("trial.workdir", f"{workdir}{relative} {problem}")
        if self.trial.function is not None:
            problem = missing_function(self.trial.function, workdir)
            if problem is not None:
                raise _PathError("trial.function", problem)
        storage = _usable("storage.dir", base_dir, self.storage.dir)
        if self.storage.uri is not None and "://" not in self.storage.uri:  # a path, which checkpoint_uri resolves
            _usable("storage.uri", base_dir, self.storage.uri)
        if storage.exists() and not storage.is_dir():
            raise _PathError("storage.dir", f"{storage} is not a directory")
        _store_fits(storage)
        folder = _usable("storage.dir", base_dir, str(Path(self.storage.dir) / self.name))  # the experiment's own
        if folder.exists() and not folder.is_dir():
            raise _PathError("storage.dir", f"{folder}, the experiment's folder, is not a directory; move it away")
        roots = {"the spec's folder": self._base_dir, "the trial's workdir": workdir, "your home": _home()}
        inside = any(root is not None and storage.is_relative_to(root) for root in roots.values())
        if not inside and not self.storage.allow_outside:
            places = ", ".join(f"{what} ({root})" for what, root in roots.items() if root is not None)
            raise _PathError("storage.dir", f"{storage} is outside {places}; set storage.allow_outside: true "
                                            "to write there")
        return self

    @field_validator("search", "policy", mode="wrap")
    @classmethod
    def _plugins_beside_trial(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """A searcher, policy or stopper of one's own (``module:Class``) is loaded, to be checked, from where the
        session will load it (``plugins_from``): the trial's code and a scheduler kept beside it are one project."""
        context = info.context or {}
        trial = info.data.get("trial")  # validated before search and policy, which follow it; None where it failed
        folder = None
        if context.get("plugins_beside_trial") and isinstance(trial, TrialSpec):
            base_dir = context.get("base_dir")
            try:
                folder = _place(Path.cwd() if base_dir is None else Path(base_dir), trial.workdir)
            except (RuntimeError, OSError):  # ~user of no user here, a loop of links: _fits_this_machine says so
                folder = None
        with importable_from(folder):
            return handler(value)

    @model_validator(mode="after")
    def _plugins_from_workdir(self, info: ValidationInfo) -> ExperimentSpec:
        if (info.context or {}).get("plugins_beside_trial"):
            self._plugins_from = self.workdir
        return self

    @model_validator(mode="after")
    def _ray_settings_on_ray(self) -> ExperimentSpec:
        """``ray:`` and ``storage.uri`` are the Ray engine's: the local engine ignored them without a word, and a
        spec that lacked ``engine: ray`` ran on this machine alone."""
        if self.engine == "ray":
            return self
        if "ray" in self.model_fields_set:
            raise _PathError("ray", "is read only with engine: ray; add engine: ray, or remove it")
        if self.storage.uri is not None:
            raise _PathError("storage.uri", "is read only with engine: ray (the local engine keeps checkpoints in "
                                            "storage.dir); add engine: ray, or remove it")
        return self

    @property
    def workdir(self) -> Path:
        """Where a trial runs: ``trial.workdir`` resolved against the spec file's folder (``~`` is your home)."""
        return _place(self._base_dir, self.trial.workdir)

    def same_workdir(self, stored: dict[str, Any]) -> bool:
        """Whether a stored spec (``model_dump``'s) names, by its ``trial.workdir`` read from this spec's folder, the
        folder this spec's trials run in: another spelling of that folder ('.', './', its absolute path) runs the
        same code, so a rerun that respells it continues the experiment; another folder may hold other code."""
        trial = stored.get("trial")
        written = trial.get("workdir") if isinstance(trial, dict) else None
        try:
            return isinstance(written, str) and _place(self._base_dir, written) == self.workdir
        except (RuntimeError, OSError):  # ~user of no user here, a loop of links: not known to be the same
            return False

    @property
    def plugins_from(self) -> Path | None:
        """The folder a policy, stopper or searcher of one's own is imported from first
        (``hermes.plugins.importable_from``): the trial's workdir for a spec run here (``load_spec``, ``parse_spec``
        asked to), where a trial's process finds its module; None, Python's path alone, for a pool's: its experiments
        share one process, where one workdir's module would serve every other's of that name."""
        return self._plugins_from

    @property
    def storage_dir(self) -> Path:
        return _place(self._base_dir, self.storage.dir)

    @property
    def checkpoint_uri(self) -> str:
        """Where durable checkpoints go on Ray: ``<storage.uri>/<name>``, whose path without a scheme is relative to
        the spec file's folder as ``storage.dir`` is (every node's own working directory would take it otherwise);
        default ``<storage dir>/<name>/checkpoints``. Named after the experiment, as Ray Tune keeps a run's under
        its name: experiments that shared one URI (the documented setup) overwrote each other's trials'
        checkpoints, and a continued one resumed from another's state. Under a ``storage.uri`` that other stores'
        experiments of the same name may share, the Ray engine keeps each one's in a folder of its own below this
        (``hermes.ray.storage.experiment_uri``); the default is this store's alone."""
        uri = self.storage.uri
        if uri is None:
            return str(self.storage_dir / self.name / "checkpoints")
        if "://" in uri:
            return f"{uri.rstrip('/')}/{self.name}"
        return str(_place(self._base_dir, uri) / self.name)


def _place(base_dir: Path, written: str) -> Path:
    """A path of the spec as this machine reads it: relative to the spec's folder, ``~`` your home, links resolved."""
    return (base_dir / Path(written).expanduser()).resolve()


_UNUSABLE = {errno.ELOOP: "a symbolic link loop; fix or remove the link",
             errno.ENAMETOOLONG: "name too long for the file system; shorten it"}


def _usable(field: str, base_dir: Path, written: str) -> Path:
    """``_place(base_dir, written)``, or a _PathError at ``field`` where this machine cannot use that path: pathlib
    raises a loop of links (RuntimeError before Python 3.13), a name too long or a folder it may not search from
    resolve(), is_dir() or exists(), which was a traceback. A path not made yet is fine."""
    try:
        unresolved = base_dir / Path(written).expanduser()
    except RuntimeError:  # ~user of no user on this machine, or ~ where it has no home
        raise _PathError(field, f"{written!r}: this machine has no home folder for {written.split('/')[0]}; "
                                "give the path in full") from None
    try:
        path = unresolved.resolve()
    except RuntimeError:  # the links loop (an OSError of ELOOP from path.stat() below, from Python 3.13 on)
        raise _PathError(field, f"{unresolved} cannot be used: {_UNUSABLE[errno.ELOOP]}") from None
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):  # not made yet; what it must be is checked where it matters
        pass
    except OSError as error:
        raise _PathError(field, f"{unresolved} cannot be used: {_UNUSABLE.get(error.errno, error.strerror)}") from None
    return path


# SQLite's longest path (SQLITE_MAX_PATHNAME, its unix VFS's mxPathname), in bytes: it refuses to open a store whose
# journal's path, the store's and "-journal", would be longer
SQLITE_MAX_PATHNAME = 512


def _store_fits(storage: Path) -> None:
    """A _PathError at storage.dir where the store cannot be a file there: SQLite's path limit, or a folder in its
    place; the runner wrote its lock and the experiment's folder before SQLite failed, and said the store's folder
    was removed."""
    store = storage / "hermes.db"
    journal = os.fsencode(f"{store}-journal")
    if len(journal) > SQLITE_MAX_PATHNAME:
        raise _PathError("storage.dir", f"{storage} is too long for SQLite's store in it: the path of its "
                                        f"hermes.db-journal takes {len(journal)} bytes, SQLite's limit is "
                                        f"{SQLITE_MAX_PATHNAME}; shorten it")
    if os.path.isdir(store):  # False too where the folder may not be searched: the runner's lock says so
        raise _PathError("storage.dir", f"{store}, the store's file, is a directory; move it away")


def load_spec(path: str | Path, name: str | None = None) -> ExperimentSpec:
    """Read and validate a YAML spec, and check it against this machine (its workdir, trial function
    and storage dir); any problem raises SpecError naming the file and the fields. ``name``: in place of
    the spec's own (``hermes run --name``); a wrong one is blamed on it, not on the file, which holds no fault."""
    problem = None if name is None else _name_problem(name) if isinstance(name, str) else _NAME_RULE
    if problem is not None:
        raise SpecError(f"the name given in place of the spec's (--name), {name!r}: {problem}", [("name", problem)])
    data = read_spec(path)
    if name is not None:
        data["name"] = name
    return parse_spec(data, source=str(path), base_dir=Path(path).resolve().parent, plugins_beside_trial=True)


MAX_SPEC_BYTES = 10 * 2**20  # a spec is a page of YAML: a far larger file is none (/dev/zero was read to no memory)


def read_spec(path: str | Path) -> dict[str, Any]:
    """A spec file's YAML as a dict, not yet validated: ``hermes submit`` sends it so, and reads it as ``hermes run``
    does. A file that cannot be read, decoded or parsed raises SpecError naming the file."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise SpecError(f"{path}: cannot read: {error.strerror or error}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than {MAX_SPEC_BYTES // 2**20} MiB, which no spec is; give the spec's YAML "
                        "file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = error.object.count(b"\n", 0, error.start) + 1
        raise SpecError(f"{path}: not valid UTF-8 (byte {error.object[error.start]:#04x} at position {error.start}, "
                        f"line {line}); save it as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: must be a YAML mapping with name, trial, search, metric and budget")
    return data


_BOOL, _INT, _FLOAT, _MERGE, _TIMESTAMP, _VALUE = (
    f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float", "merge", "timestamp", "value"))


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without the YAML 1.1 readings that surprise: a key given twice is refused (1.1 keeps
    the last silently), and plain scalars are read as YAML 1.2 reads them: 010 as 10 (1.1: octal 8), 0o10 as 8
    (1.1: text), 1:30 as the text it is (1.1: 90, base 60), 1e-4 as a float (1.1: text), only true and false (also
    True, TRUE, False, FALSE) as booleans (1.1: also yes, no, on, off, y, n: the country code NO was false), and
    dates and = as text (1.1: a date, and an error). Numbers that YAML 1.1 reads and 1.2 does not stay numbers:
    0b11, 1_000, 1_0.5, -0x1F (1.2: text); a spec stored from them reads the same on a rerun."""

    # PyYAML's resolvers, less its bool, int and float patterns (ours are added below the class), its dates and =
    yaml_implicit_resolvers: ClassVar[dict[Any, list[Any]]] = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_BOOL, _INT, _FLOAT, _TIMESTAMP, _VALUE)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Refuse a key given twice, naming both lines: YAML 1.1 keeps the last and drops the first unseen."""
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:  # <<: keys it merges in may be overridden, as YAML says
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # refused as such by PyYAML's construct_mapping
                continue
            line = key_node.start_mark.line + 1
            if key in lines:
                raise yaml.constructor.ConstructorError(
                    problem=f"line {line}: duplicate key {key!r} (first on line {lines[key]}); give each key once")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An int of ``_INT_FORM``: its leading zeros a decimal's; 0o octal (YAML 1.2), 0x hex, 0b binary; underscores
        skipped. ``!!int`` on other text is refused as a YAML error, which names its line."""
        value = str(self.construct_scalar(node))
        if not _INT_FORM.fullmatch(value):  # match's $ let a last newline pass ("12\n" was 12)
            raise yaml.constructor.ConstructorError(problem=f"line {node.start_mark.line + 1}: {value!r} is no int")
        digits = value.replace("_", "").lstrip("+-")
        base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2], 10)
        number = int(digits[2:] if base != 10 else digits, base)
        return -number if value.startswith("-") else number

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        """A bool of ``_BOOL_FORM``; ``!!bool`` on other text is refused as a YAML error naming its line (PyYAML's
        read yes, on, off and n as YAML 1.1 booleans, which untagged are text)."""
        value = str(self.construct_scalar(node))
        if not _BOOL_FORM.fullmatch(value):
            raise yaml.constructor.ConstructorError(problem=f"line {node.start_mark.line + 1}: {value!r} is no bool")
        return value.lower() == "true"

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        """A float of ``_FLOAT_FORM``, or a decimal int (``!!float 10`` is 10.0); underscores skipped. ``!!float`` on
        other text is refused as a YAML error naming its line: PyYAML's YAML 1.1 float read 1:30 as 90.0 (base 60),
        nan and infinity as floats, and raised a bare ValueError or IndexError on abc or ''."""
        value = str(self.construct_scalar(node))
        if not (_FLOAT_FORM.fullmatch(value) or _DECIMAL_INT_FORM.fullmatch(value)):
            raise yaml.constructor.ConstructorError(problem=f"line {node.start_mark.line + 1}: {value!r} is no float")
        return super().construct_yaml_float(node)


# YAML 1.2's decimal, 0o and 0x ints, and YAML 1.1's 0b, signed 0x and underscores (1_000), each with a digit
_INT_FORM = re.compile(r"[-+]?(?:0b_*[01][01_]*|0o_*[0-7][0-7_]*|0x_*[0-9a-fA-F][0-9a-fA-F_]*|[0-9][0-9_]*)$")
_SpecLoader.add_constructor(_INT, _SpecLoader.construct_yaml_int)
_SpecLoader.add_constructor(_FLOAT, _SpecLoader.construct_yaml_float)
_SpecLoader.add_implicit_resolver(_INT, _INT_FORM, list("-+0123456789"))
_BOOL_FORM = re.compile(r"(?:true|True|TRUE|false|False|FALSE)$")
_SpecLoader.add_constructor(_BOOL, _SpecLoader.construct_yaml_bool)
_SpecLoader.add_implicit_resolver(_BOOL, _BOOL_FORM, list("tTfF"))
# A sign may lead each form (-.5 was text while .5 was a number), and an exponent needs neither a dot nor a sign
# (1e-4 and 1.5e3 were text). A whole number without one is an int (resolved first).
_EXPONENT_PART = r"[eE][-+]?[0-9]+"
_FLOAT_FORM = re.compile(rf"""(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*(?:{_EXPONENT_PART})?|{_EXPONENT_PART})
    |\.[0-9][0-9_]*(?:{_EXPONENT_PART})?)|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.VERBOSE)
_DECIMAL_INT_FORM = re.compile(r"[-+]?[0-9][0-9_]*")
_SpecLoader.add_implicit_resolver(_FLOAT, _FLOAT_FORM, list("-+0123456789."))


def parse_spec(data: dict[str, Any], source: str = "<spec>", base_dir: str | Path | None = None, *,
               plugins_beside_trial: bool = False, stored: bool = False) -> ExperimentSpec:
    """Validate a spec already read into a dict; ``source`` names it in error messages.

    With ``base_dir`` (the spec file's folder), relative paths start there and the spec is also
    checked against this machine, as ``load_spec`` does; without it (specs built in code) they start
    at the current directory and only the document is checked. ``plugins_beside_trial``: a policy, stopper or
    searcher of one's own is looked for in the trial's workdir first (``ExperimentSpec.plugins_from``), as
    ``hermes run`` looks; never for a pool's spec (``ExperimentSpec.plugins_from`` says why). ``stored``: a stored
    spec read back, which checks added since it was stored leave as it ran (``_stored``).
    """
    context = {"base_dir": base_dir, "plugins_beside_trial": plugins_beside_trial, "stored": stored}
    try:
        return ExperimentSpec.model_validate(data, context=context)
    except ValidationError as error:
        located = [_describe(detail) for detail in error.errors()]
        problems = [f"{path}: {message}" for path, message in located]
        if len(problems) == 1:
            raise SpecError(f"{source}: {problems[0]}", located) from None
        raise SpecError(f"{source}: {len(problems)} problems:\n  " + "\n  ".join(problems), located) from None


def refuse_shell_words(spec: ExperimentSpec, source: str) -> None:
    """Refuse a word of ``trial.command`` that a shell would act on (``check_shell_words``), naming the field as
    ``parse_spec`` does. For new input alone: a new experiment, a submission. ``parse_spec`` leaves it out, as it reads
    back stored specs too, whose commands ran as written before this check was made, and are continued so."""
    if spec.trial.command is None:
        return
    try:
        check_shell_words(spec.trial.command)
    except CommandError as error:
        raise SpecError(f"{source}: trial.command: {error}", [("trial.command", str(error))]) from None


def _describe(detail: ErrorDetails) -> tuple[str, str]:
    """The problem's dotted field path and what is wrong there."""
    path = [str(part) for part in detail["loc"]]
    # Pydantic puts the tag of a tagged union in the path (search.space.lr.loguniform.low): drop it.
    if path[:2] == ["search", "space"] and len(path) > 3 and path[3] in (*PARAMETER_TYPES, "constant"):
        del path[3]
    cause = detail.get("ctx", {}).get("error")
    if isinstance(cause, _PathError):
        path += cause.path.split(".")
    if isinstance(cause, ValueError):
        message = str(cause)
    elif detail["type"] == "union_tag_invalid":
        message = f"unknown type {detail['ctx']['tag']!r}; choose one of {', '.join(PARAMETER_TYPES)}"
    elif detail["type"] == "union_tag_not_found":
        message = f"needs a type, one of {', '.join(PARAMETER_TYPES)}"
    elif detail["type"] == "missing":
        message = "required"
    else:
        message = detail["msg"]
    return ".".join(path) or "(top level)", message


def _name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an experiment, whose folder is ``<storage.dir>/<name>``; None when it can."""
    if not _NAME.fullmatch(name):
        return _NAME_RULE
    if name.lower() in _TAKEN_NAMES:  # a file system that ignores case (macOS's) takes Hermes.DB for hermes.db
        return (f"must not be one of the files and folders Hermes keeps in a storage dir beside the experiments' own "
                f"({', '.join(_TAKEN_NAMES)}); choose another name")
    return None


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except RuntimeError:  # no HOME and no password entry
        return None
