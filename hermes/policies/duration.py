"""How long a trial takes to report for the first time, predicted from its hyper-parameters.

Why: before a trial reports, the only thing a scheduler can order it by is what it knows in
advance. Running the shortest first reports first minimises the mean time to first feedback
(the shortest-processing-time rule), and the length of a first epoch usually follows the
hyper-parameters (model size, batch size, depth). When it does not, the model says so and the
caller keeps the arrival order.

How: ridge regression of log seconds on the hyper-parameters. A numeric parameter enters
standardised, with its logarithm too when it is positive (sizes act multiplicatively); any
other value (a string, a bool, a choice) enters one-hot. The ridge penalty is the one with the
smallest leave-one-out error (closed form, from one SVD), and the model is trusted only when
its leave-one-out predictions correlate with the measured times by more than one standard
error: a model that cannot predict held-out trials orders nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from hermes.policies.stats import shrink

PENALTIES = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
"""Ridge penalties tried at every fit, on standardised features; leave-one-out error picks one."""

_blas: ThreadpoolController | None = None


def one_blas_thread() -> Any:
    """A context in which BLAS runs on one thread. The policy's matrices are small (trials x hyper-parameters):
    OpenBLAS's threads cost more than they share, 10x on a busy 2-core machine (a 400 x 120 SVD: 58 ms, 5 ms
    on one thread), and the policy runs beside the trials that use the cores."""
    global _blas
    if _blas is None:
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


@dataclass(frozen=True, slots=True)
class _Feature:
    """One input of the regression: a raw column, transformed, then standardised."""

    column: int
    transform: str  # "value", "log" (of a positive number) or "level" (1 where the category code is ``code``)
    mean: float
    std: float
    code: float = math.nan

    def of(self, raw: np.ndarray) -> np.ndarray:
        values = raw[:, self.column]
        if self.transform == "level":
            return ((values == self.code) - self.mean) / self.std
        usable = ~np.isnan(values)  # an absent value counts as the mean
        if self.transform == "log":
            usable &= values > 0
            values = np.log(np.where(usable, values, 1.0))
        return (np.where(usable, values, self.mean) - self.mean) / self.std


@dataclass(frozen=True, slots=True)
class _Fit:
    features: tuple[_Feature, ...]
    weights: np.ndarray
    intercept: float


class DurationModel:
    """Items (one per trial) are registered with their hyper-parameters; some get a measured time.

    ``least`` items must be measured before a fit is tried: below it, the leave-one-out check
    has too little to go on.
    """

    def __init__(self, least: int = 10) -> None:
        self.least = least
        self._columns: dict[str, int] = {}  # parameter name -> column of _raw
        self._numeric: list[bool] = []  # column -> every value seen so far is a real number
        self._codes: list[dict[Any, float]] = []  # column -> value -> category code (used once it is not numeric)
        self._raw = np.full((16, 0), math.nan)  # item x column: the number, or the category code; NaN: absent
        self._items = 0
        self._fit: _Fit | None = None

    @property
    def trusted(self) -> bool:
        return self._fit is not None

    def add(self, params: Mapping[str, Any]) -> int:
        """Register an item's hyper-parameters; returns its index (0, 1, ...)."""
        item = self._items
        if item == len(self._raw):
            self._raw = np.vstack([self._raw, np.full(self._raw.shape, math.nan)])
        for name, value in params.items():
            column = self._columns.get(name)
            if column is None:
                column = self._columns[name] = len(self._numeric)
                self._numeric.append(True)
                self._codes.append({})
                self._raw = np.hstack([self._raw, np.full((len(self._raw), 1), math.nan)])
            number = _number(value)
            if number is None and self._numeric[column]:
                self._to_categories(column)
            if not self._numeric[column]:
                self._raw[item, column] = self._code(column, value)
            elif math.isfinite(number):
                self._raw[item, column] = number  # NaN and infinities stay absent
        self._items += 1
        return item

    def fit(self, items: Sequence[int], seconds: Sequence[float]) -> bool:
        """Fit on the measured ``items`` (their first-report ``seconds``); returns whether it is trusted."""
        times = np.asarray(seconds, dtype=float)
        keep = times > 0
        fitted = self._regress(np.asarray(items, dtype=int)[keep], np.log(times[keep]))
        self._fit = fitted[0] if fitted else None
        return self._fit is not None

    def regress(self, items: Sequence[int], target: Sequence[float]) -> tuple[np.ndarray, np.ndarray] | None:
        """Any ``target`` of the ``items`` as a ridge regression on their hyper-parameters, as it is (no log).

        Returns the leave-one-out predictions of the ``items`` and the predictions of every item
        registered so far; None when the regression does not predict held-out items better than
        chance (by one standard error), or with fewer than ``least`` items. The duration fit is untouched."""
        fitted = self._regress(np.asarray(items, dtype=int), np.asarray(target, dtype=float))
        if fitted is None:
            return None
        fit, held_out = fitted
        raw = self._raw[: self._items]
        return held_out, np.column_stack([f.of(raw) for f in fit.features]) @ fit.weights + fit.intercept

    def _regress(self, rows: np.ndarray, target: np.ndarray) -> tuple[_Fit, np.ndarray] | None:
        """The trusted ridge fit of ``target`` on the rows' hyper-parameters, and its held-out predictions."""
        if len(rows) < self.least:
            return None
        raw = self._raw[rows]
        features = [feature for column in range(len(self._numeric)) for feature in self._features_of(raw, column)]
        if not features:
            return None
        with one_blas_thread():
            weights, intercept, correlation, held_out = _ridge(np.column_stack([f.of(raw) for f in features]), target)
        if shrink(correlation, len(rows), 1) <= 0:
            return None
        return _Fit(tuple(features), weights, intercept), held_out

    def _features_of(self, raw: np.ndarray, column: int) -> list[_Feature]:
        """The features a column gives on the measured rows ``raw`` (none when it does not vary)."""
        values = raw[:, column]
        present = values[~np.isnan(values)]
        if not self._numeric[column]:
            levels = [(code, float(np.mean(values == code))) for code in np.unique(present)]
            return [_Feature(column, "level", share, math.sqrt(share * (1 - share)), code)
                    for code, share in levels if 0 < share < 1]
        if len(present) < 2:
            return []
        with np.errstate(over="ignore", invalid="ignore"):  # values near the float limit: the log serves alone
            spread = float(present.std())
        features = [_Feature(column, "value", float(present.mean()), spread)] if 0 < spread < math.inf else []
        if present.min() > 0 and np.log(present).std() > 0:
            logs = np.log(present)
            features.append(_Feature(column, "log", float(logs.mean()), float(logs.std())))
        return features

    def predict(self, items: Sequence[int]) -> np.ndarray:
        """Predicted first-report seconds of ``items``; only after a trusted fit."""
        fit = self._fit
        if fit is None:
            raise RuntimeError("the duration model is not trusted; check `trusted` first")
        raw = self._raw[np.asarray(items, dtype=int)]
        return np.exp(np.column_stack([feature.of(raw) for feature in fit.features]) @ fit.weights + fit.intercept)

    def _code(self, column: int, value: Any) -> float:
        codes = self._codes[column]
        key = value if _hashable(value) else repr(value)
        return codes.setdefault(key, float(len(codes)))

    def _to_categories(self, column: int) -> None:
        """A non-numeric value arrived in a numeric column: recode the numbers seen so far as categories."""
        self._numeric[column] = False
        values = self._raw[: self._items, column]
        for item in np.flatnonzero(~np.isnan(values)):
            self._raw[item, column] = self._code(column, float(values[item]))


def _ridge(features: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, float, float, np.ndarray]:
    """Ridge fit with the penalty of least leave-one-out error: (weights, intercept, LOO correlation, LOO predictions)."""
    n = len(target)
    mean = float(target.mean())
    centred = target - mean
    centre = features.mean(axis=0)
    u, s, vt = np.linalg.svd(features - centre, full_matrices=False)
    projected = u.T @ centred
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for penalty in PENALTIES:
        shrinkage = s * s / (s * s + penalty)
        fitted = u @ (shrinkage * projected)
        leverage = 1.0 / n + (u * u) @ shrinkage
        held_out = (centred - fitted) / np.maximum(1.0 - leverage, 1e-9)
        error = float(held_out @ held_out)
        if best is None or error < best[0]:
            weights = vt.T @ (s / (s * s + penalty) * projected)
            best = (error, weights, centred - held_out)
    _, weights, predicted = best
    intercept = mean - float(centre @ weights)
    if predicted.std() == 0 or centred.std() == 0:  # no variation to predict
        return weights, intercept, 0.0, predicted + mean
    return weights, intercept, float(np.corrcoef(predicted, centred)[0, 1]), predicted + mean


def _number(value: Any) -> float | None:
    """The value as a float if it is a real number (bools, strings and ints beyond a float are categories)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past 1.8e308: its size cannot enter a regression
        return None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
