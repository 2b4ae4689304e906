"""Rank statistics shared by the policies: normal scores of ranks, and honest correlations."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np


def probit(p: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF, vectorised (Acklam's rational approximation, error below 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    p = np.asarray(p, dtype=float)
    out = np.empty_like(p)
    tail = np.minimum(p, 1.0 - p)
    central = tail >= 0.02425
    q = p[central] - 0.5
    r = q * q
    out[central] = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)
    outer = ~central
    t = np.sqrt(-2.0 * np.log(tail[outer]))
    value = (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / (
        (((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1.0)
    out[outer] = np.where(p[outer] < 0.5, value, -value)
    return out


def normal_scores(values: np.ndarray) -> np.ndarray:
    """Rank-based normal scores: only the order of the values matters, not their scale."""
    n = len(values)
    if n == 1:
        return np.zeros(1)
    ranks = np.empty(n)
    ranks[np.argsort(values, kind="stable")] = np.arange(n)
    return probit((ranks + 0.5) / n)


def shrink(correlation: float, trials: int, predictors: int) -> float:
    """The correlation's magnitude less one standard error on Fisher's z scale (never past 0)."""
    spare = trials - predictors - 2
    if spare < 1:
        return 0.0
    z = math.atanh(min(abs(correlation), 0.999999)) - 1.0 / math.sqrt(spare)
    return math.copysign(math.tanh(max(0.0, z)), correlation)


def expected_excess(t: float) -> float:
    """E[max(Z - t, 0)] for a standard normal Z: phi(t) - t * (1 - Phi(t))."""
    return math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi) - t * 0.5 * math.erfc(t / math.sqrt(2.0))


_OFFSETS = np.linspace(12.0, -12.0, 4801)  # ascending in their expected excess
_EXCESSES = np.array([expected_excess(float(t)) for t in _OFFSETS])


def reservation_offset(excess: np.ndarray) -> np.ndarray:
    """Weitzman's reservation value of a normal prize, in widths above its mean (the inverse of ``expected_excess``).

    A prize N(mean, width**2) that costs ``excess * width`` to open is worth opening before any
    other prize whose value is below ``mean + width * offset``, where
    E[max(Z - offset, 0)] = ``excess``: the dearer the opening, the lower the offset."""
    excess = np.asarray(excess, dtype=float)
    return np.where(excess >= _EXCESSES[-1], -excess, np.interp(excess, _EXCESSES, _OFFSETS))


_EXCESS_LIST, _OFFSET_LIST = _EXCESSES.tolist(), _OFFSETS.tolist()


def reservation_offset_of(excess: float) -> float:
    """``reservation_offset`` of one value, the same to the last bit, without numpy's cost per call."""
    xs, ys = _EXCESS_LIST, _OFFSET_LIST
    if excess >= xs[-1]:
        return -excess
    if excess <= xs[0]:
        return ys[0]
    j = bisect_right(xs, excess) - 1  # xs[j] <= excess < xs[j + 1]
    if xs[j] == excess:
        return ys[j]
    return (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]) * (excess - xs[j]) + ys[j]  # np.interp's formula
