"""Optuna's samplers behind the searcher interface, through Optuna's ask-and-tell API.

Each proposal is an Optuna trial of one in-memory study, asked with the spec's distributions.
A trial stays RUNNING while Hermes time-shares it; its reports go to ``trial.report(value, step)``
as they arrive (a diverged one, +inf or -inf, as NaN, which Optuna ranks worst), so samplers that
read running trials or intermediate values see partial standings. No provisional value is ever told:
``study.tell`` ends a trial for good, and a partial curve's value is not comparable to a final one.
At its end a trial is told COMPLETE with its value, PRUNED when the scheduler stopped it early
(Optuna then ranks it by its last report and how far it got), or FAIL (it failed, or never
reported a finite value). The space's fixed parameters are no part of the study: each proposal gets
them as they are. ``docs/search.md`` says which samplers use what.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
import types
import typing
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hermes.errors import install_extra
from hermes.plugins import import_plugin_module, plugin_hint
from hermes.search.base import BaseSearcher, _as_declared, _outside
from hermes.search.errors import SamplerError, SamplerFailed

if TYPE_CHECKING:
    import optuna

    from hermes.experiment.spec import IntRange, Parameter, SearchSpec

# Packages an Optuna sampler needs beyond Optuna itself, so that a missing one fails at spec check.
_NEEDS = {
    "optuna.samplers.CmaEsSampler": "cmaes",
    "optuna.samplers.GPSampler": "torch",
    "optuna.samplers.QMCSampler": "scipy",
}
# GPSampler lays out every value of an int range as float64s at each proposal after its startup trials (Optuna 5.1,
# optuna/_gp/search_space.py, get_choices_of_discrete_params: np.arange over the range, normalised into an array of
# the same size; optim_mixed.py then takes np.diff of it): 16 bytes per value at the peak, so a range of 10**15
# values asked for 14 PiB and failed the run with MemoryError. 2**26 values keep the peak to 1 GiB (log: true does
# not help: it lays out every value too).
GP_MAX_INT_VALUES = 2**26
# The spec check asks a sampler this many times, telling each proposal a made-up result, so that the model-based
# proposals after the startup trials (10 by default in TPE and GP) run too: many arguments are read only there.
CHECK_ASKS = 12
# A sampler of a longer startup (n_startup_trials: 12, or 1,000) is checked through a throwaway one built alike but for
# this startup, so that the last two asks are model-based whatever its own: made-up finished trials that reached past a
# startup of 1,000 made a TPE of 1,000 candidates over 30 parameters take 10 s a check, which the server runs in a
# request thread and again at every poll while an experiment waits for its files.
CHECK_STARTUP = CHECK_ASKS - 2
# Asked only once at the check, their arguments checked against the constructor's annotations instead: past its
# startup, CmaEsSampler imports cmaes (1.7 s), GPSampler imports torch (3 s) and fits a GP (1 s an ask), and from
# its second proposal QMCSampler imports scipy (2.6 s).
_SLOW_TO_CHECK = ("CmaEsSampler", "GPSampler", "QMCSampler")


class OptunaSearcher(BaseSearcher):
    """One Optuna sampler over an in-memory study; the same calls in the same order give the same proposals."""

    def __init__(
        self, search: SearchSpec, sampler: optuna.samplers.BaseSampler, *, mode: str, max_pending: int | None
    ) -> None:
        import optuna

        super().__init__(max_pending=max_pending)
        self._states = optuna.trial.TrialState
        self._study = _quiet_study(optuna, sampler, "maximize" if mode == "max" else "minimize")
        self._space = search.space
        self._distributions = _distributions(optuna, search, sampler)
        self._fixed = {name: p.values[0] for name, p in search.space.items() if p.type == "constant"}
        self.sampler_name = search.sampler_name
        self._has_args = bool(search.sampler_args)
        self._trials: dict[int, optuna.trial.Trial] = {}
        self._steps: dict[int, set[int]] = {}  # steps reported, per running trial

    @property
    def study(self) -> optuna.Study:
        """The study, for reading (best trial, plots); calls on it bypass the replay rule."""
        return self._study

    def _propose(self, index: int) -> dict[str, Any]:
        with self._failing(f"proposing trial {index}"):
            trial = self._trials[index] = self._study.ask(self._distributions)
        self._steps[index] = set()
        params = _as_declared(self._space, trial.params)
        problem = _outside(self._space, params)
        if problem is not None:
            raise SamplerFailed(f"search.sampler {self.sampler_name} failed proposing trial {index}: it gave a value "
                                f"outside the spec's space: {problem}")
        return {name: self._fixed[name] if name in self._fixed else params[name] for name in self._space}

    def _report(self, index: int, step: int, value: float) -> None:
        if step in self._steps[index]:  # a trial resumed from an older checkpoint reports a step again: keep the first
            return
        self._steps[index].add(step)
        with self._failing(f"when told trial {index}'s step {step}"):
            # +inf was a maximised trial's best report (TPE ranks a PRUNED trial by its last one): a diverged report
            # goes as NaN, which Optuna's samplers and pruners rank worst, as a NaN report always went
            self._trials[index].report(value if math.isfinite(value) else math.nan, step)

    def _end(self, index: int, value: float | None, stopped: bool) -> None:
        trial = self._trials.pop(index)
        del self._steps[index]
        with self._failing(f"when told trial {index}'s end"):
            if value is None:
                self._study.tell(trial, state=self._states.FAIL)
            elif stopped:
                self._study.tell(trial, state=self._states.PRUNED)
            else:
                self._study.tell(trial, value)

    @contextmanager
    def _failing(self, doing: str) -> Iterator[None]:
        """Whatever the sampler raises ends the experiment with a reason that names it, not a traceback."""
        try:
            yield
        except Exception as error:
            wrong = ("a value of the wrong type" if isinstance(error, TypeError)
                     else "a wrong value" if isinstance(error, ValueError) else None)
            hint = (f"search.sampler.args may hold {wrong}" if wrong and self._has_args
                    else "a sampler of Hermes's own may suit: docs/search.md")
            raise SamplerFailed(f"search.sampler {self.sampler_name} failed {doing}: {type(error).__name__}: {error} "
                                f"({hint})") from error


def build_sampler(class_path: str, args: dict[str, Any], seed: int, field: str, *,
                  quiet: bool = False) -> optuna.samplers.BaseSampler:
    """An Optuna sampler from its class path and arguments, seeded from the spec unless ``args`` seeds it.

    ``field`` names the spec field that gave the class path, for errors. ``quiet``: without Optuna's
    ExperimentalWarning (QMC, BruteForce, NSGA-III), for the spec check's build: the run's build says it.
    """
    try:
        import optuna
    except ImportError:
        raise SamplerError(field, f"{class_path} needs Optuna, which is not installed: "
                                  f"{install_extra('tpe')}") from None

    module, _, name = class_path.rpartition(".")
    found = "not found"
    try:
        cls = getattr(import_plugin_module(module), name, None) if module else None
    except Exception as error:  # the module's own import may raise anything
        if not _is_missing(error, module):  # it is there, but something it runs or imports fails
            raise SamplerError(field, f"cannot import {module}: {type(error).__name__}: {error}") from None
        cls, found = None, f"not found: {error}; {plugin_hint()}"
    if not (isinstance(cls, type) and issubclass(cls, optuna.samplers.BaseSampler)):
        found = found if cls is None else "not a subclass of optuna.samplers.BaseSampler"
        raise SamplerError(field, f"unknown Optuna sampler class {class_path!r} ({found})")
    needed = _NEEDS.get(class_path)
    if needed and importlib.util.find_spec(needed) is None:
        raise SamplerError(field, f"{class_path} needs the Python package {needed!r} (pip install {needed})")
    if "seed" in args and (not isinstance(args["seed"], int) or isinstance(args["seed"], bool)):
        raise SamplerError("sampler.args.seed", (
            f"must be an int, got {args['seed']!r}: an unseeded sampler proposes anew when a rerun replays the store, "
            "which then cannot continue the experiment; leave it out and Hermes seeds it from search.seed"))
    if "seed" in inspect.signature(cls).parameters and "seed" not in args:
        args = {**args, "seed": seed}
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return cls(**args)
    except (TypeError, ValueError) as error:
        raise SamplerError("sampler.args", f"{class_path}: {error}") from None


def ask_once(sampler: optuna.samplers.BaseSampler, search: SearchSpec, field: str) -> None:
    """Check ``sampler`` on a throwaway study with the spec's space, so that what fails only when asked fails at the
    spec check, naming ``field``: it is asked ``CHECK_ASKS`` times, each proposal told a made-up result (an argument
    of the wrong type, ``n_startup_trials: "5"`` or ``n_ei_candidates: 1e2``, fails when asked, some only after the
    startup trials, which a longer startup reaches through a sampler built alike with a short one), each proposal must
    lie in the space, and its arguments are checked against the constructor's annotations. A sampler that takes no
    ``seed`` gets none from ``search.seed``: a second one built alike must propose the same, or a rerun could not
    replay the store."""
    import optuna

    slow = any(cls.__name__ in _SLOW_TO_CHECK and cls.__module__.startswith("optuna.") for cls in type(sampler).__mro__)
    with warnings.catch_warnings():  # the run's build says it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        checked, args = (sampler, search.sampler_args) if slow else _short_started(sampler, search)
        twin = None if "seed" in inspect.signature(type(sampler)).parameters else type(sampler)(**args)
    studies = [_quiet_study(optuna, each, "minimize") for each in (checked, twin) if each is not None]
    distributions = _distributions(optuna, search, sampler)
    cut = f", with n_startup_trials: {CHECK_STARTUP} for the check" if checked is not sampler else ""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # warnings about made-up trials (CmaEs's fallbacks) are no news
    try:
        with warnings.catch_warnings():  # nor numpy's on them (TPE's log1p of 0 on a huge range)
            warnings.simplefilter("ignore", RuntimeWarning)
            for index in range(1 if slow else CHECK_ASKS):
                which = f"proposal {index + 1} (after {index} made-up results{cut})" if index else "a first proposal"
                proposals = [_ask(study, distributions, search, field, which) for study in studies]
                if any(proposal.params != proposals[0].params for proposal in proposals):
                    raise SamplerError(field, (
                        f"sampler {search.sampler_name} proposes differently each time it is built alike (it takes no "
                        "seed, so Hermes cannot seed it from search.seed): a rerun could not continue its experiment; "
                        "give the sampler a seed argument"))
                try:
                    for study, proposal in zip(studies, proposals, strict=True):
                        study.tell(proposal, math.sin(index))  # made-up results that neither rise nor fall throughout
                except Exception:  # noqa: BLE001 (what fails when told fails the run, as documented: Grid's stop)
                    break
    finally:
        optuna.logging.set_verbosity(verbosity)
    _check_annotations(type(sampler), search.sampler_args, search.sampler_name)


def _ask(study: optuna.Study, distributions: dict[str, Any], search: SearchSpec, field: str, which: str
         ) -> optuna.Trial:
    """The study's proposal that ``which`` names, for errors, which must lie in the spec's space."""
    try:
        proposal = study.ask(distributions)
    except Exception as error:  # a sampler is anyone's code
        raise SamplerError(field, f"sampler {search.sampler_name} failed {which} on the spec's space: "
                                  f"{type(error).__name__}: {error}") from None
    problem = _outside(search.space, _as_declared(search.space, proposal.params))
    if problem is not None:
        raise SamplerError(field, f"sampler {search.sampler_name} gave {which} outside the spec's space: {problem}")
    return proposal


def _short_started(sampler: optuna.samplers.BaseSampler, search: SearchSpec
                   ) -> tuple[optuna.samplers.BaseSampler, dict[str, Any]]:
    """The sampler the check asks and the arguments it was built with: ``sampler`` and the spec's, or, where its
    startup is more than ``CHECK_STARTUP``, a throwaway one built alike but for ``n_startup_trials: CHECK_STARTUP``,
    so that the check's last two asks are past it at the cost of a short startup; the run's sampler keeps its own."""
    cls, args = type(sampler), search.sampler_args
    if _startup(cls, args) <= CHECK_STARTUP:
        return sampler, args
    short = {**args, "n_startup_trials": CHECK_STARTUP}
    seeded = {"seed": search.seed, **short} if "seed" in inspect.signature(cls).parameters else short
    try:
        return cls(**seeded), short
    except Exception:  # noqa: BLE001 (a class of one's own that refuses a startup so short, by any error, or assert)
        return sampler, args  # its first proposals only


def _startup(cls: type, args: dict[str, Any]) -> int:
    """The trials a sampler proposes before its model reads them, as ``args`` or its constructor's default gives
    ``n_startup_trials`` (TPE, GP, CMA-ES, and samplers written alike); 0 for a sampler without it."""
    parameter = inspect.signature(cls).parameters.get("n_startup_trials")
    count = args.get("n_startup_trials", parameter.default if parameter else 0)
    return count if type(count) is int else 0  # another type fails when asked, or at the annotations' check


def _check_annotations(cls: type, args: dict[str, Any], sampler: str) -> None:
    """SamplerError naming the argument when it is not of its plain type (int, float, bool, str, None or a union of
    them) in the constructor's annotations, as Optuna's samplers give them; other annotations are not checked."""
    annotations = {name: p.annotation for name, p in inspect.signature(cls).parameters.items()}
    for name, value in args.items():
        kinds = _plain_kinds(annotations.get(name, inspect.Parameter.empty), cls)
        if kinds and not any(_is_of(value, kind) for kind in kinds):
            wanted = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            raise SamplerError(f"sampler.args.{name}", (
                f"sampler {sampler} takes {wanted}, got {value!r} ({type(value).__name__})"))


def _plain_kinds(annotation: Any, cls: type) -> tuple[type, ...]:
    """The types that ``annotation`` allows when it is made of plain ones only, else none."""
    if isinstance(annotation, str):  # from __future__ import annotations, as in Optuna
        try:
            annotation = eval(annotation, vars(sys.modules[cls.__init__.__module__]))
        except (NameError, AttributeError, SyntaxError):  # a name imported only for type checkers (Callable in Optuna)
            return ()
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    kinds = typing.get_args(annotation) if union else (annotation,)
    return kinds if all(kind in (int, float, bool, str, type(None)) for kind in kinds) else ()


def _is_of(value: Any, kind: type) -> bool:
    if kind is float:  # an int is a float's value too, as in Optuna's own arithmetic
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _is_missing(error: Exception, module: str) -> bool:
    """Whether importing ``module`` failed because it (or a package above it) does not exist, not because of
    something it imports or runs."""
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    return missing is not None and f"{module}.".startswith(f"{missing}.")


def _quiet_study(optuna: Any, sampler: optuna.samplers.BaseSampler, direction: str) -> optuna.Study:
    """An in-memory study, without Optuna's "A new study created in memory" (Hermes's own doing, not news)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(sampler=sampler, direction=direction)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _distributions(
    optuna: Any, search: SearchSpec, sampler: optuna.samplers.BaseSampler
) -> dict[str, optuna.distributions.BaseDistribution]:
    """What Optuna searches: the space less its fixed parameters. SamplerError, naming the parameter, for an int
    range beyond what ``sampler`` can draw."""
    for name, parameter in search.space.items():
        if parameter.type == "int":
            _check_exact(name, parameter, search.sampler_name)
            _check_fits(optuna, name, parameter, search.sampler_name, sampler)
    return {name: _distribution(optuna, p) for name, p in search.space.items() if p.type != "constant"}


def _distribution(optuna: Any, parameter: Parameter) -> optuna.distributions.BaseDistribution:
    if parameter.type in ("uniform", "loguniform"):
        return optuna.distributions.FloatDistribution(parameter.low, parameter.high, log=parameter.type == "loguniform")
    if parameter.type == "int":  # its top, not high: Optuna would warn that high is not on the step
        return optuna.distributions.IntDistribution(parameter.low, parameter.top, log=parameter.log,
                                                    step=parameter.step)
    return optuna.distributions.CategoricalDistribution(parameter.values)  # choice (the spec bars grid here)


def _check_exact(name: str, parameter: IntRange, sampler: str) -> None:
    """Optuna's samplers compute in floats: beyond 2**53 an int range's values are not all drawn, and TPE, GP and
    Optuna's own conversions fail (a NaN, a float overflow), which was a traceback or blamed search.sampler."""
    from hermes.experiment.spec import EXACT_INTS

    for bound in ("low", "high"):
        value = getattr(parameter, bound)
        if not -EXACT_INTS <= value <= EXACT_INTS:
            raise SamplerError(f"space.{name}.{bound}", (
                f"must lie within -2**53 and 2**53 ({EXACT_INTS}) for sampler {sampler}, got {value}: "
                "Optuna's samplers draw integers through floats, which hold every whole number only that far "
                "(sampler random draws integers of any size)"))


def _check_fits(optuna: Any, name: str, parameter: IntRange, sampler_name: str,
                sampler: optuna.samplers.BaseSampler) -> None:
    """What the range may hold for this sampler, found in Optuna's source: GPSampler's memory grows with the number
    of values (``GP_MAX_INT_VALUES``), and TPE puts a value on the step in floats (``low + round((x - low) / step) *
    step``, optuna/samplers/_tpe/probability_distributions.py), which is exact only while ``high - low`` is at most
    2**53: beyond, some of its values were off the step. GP failed only during the run, TPE silently."""
    from hermes.experiment.spec import EXACT_INTS

    span = parameter.top - parameter.low
    values = span // parameter.step + 1
    if isinstance(sampler, optuna.samplers.GPSampler) and values > GP_MAX_INT_VALUES:
        raise SamplerError(f"space.{name}", (
            f"holds {values} values, more than sampler {sampler_name} takes in an int range ({GP_MAX_INT_VALUES}, "
            "2**26): Optuna's GPSampler lays out every value of the range at each proposal, 16 bytes each (log: true "
            "too), which fails the run with MemoryError; give a step that leaves fewer values, search a uniform "
            "float and round it in the trial, or use another sampler (tpe, cmaes, qmc and random take any range)"))
    if isinstance(sampler, optuna.samplers.TPESampler) and parameter.step > 1 and span > EXACT_INTS:
        raise SamplerError(f"space.{name}", (
            f"spans {span} from low to its top value, more than 2**53 ({EXACT_INTS}), which "
            f"sampler {sampler_name} takes with a step: Optuna's TPESampler puts a value on the step in floats, "
            "exact only that far, and gave values off the step; narrow the range, or use another sampler (cmaes, qmc "
            "and random keep to the step over any range)"))
