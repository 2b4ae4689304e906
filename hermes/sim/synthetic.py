"""Synthetic learning-curve traces whose shapes are chosen to stress a scheduler.

Real traces show each difficulty only in passing; these families isolate one each,
so a test or benchmark can say which difficulty a policy fails on. Every curve is
built as a progress value ``u`` in [0, 1] that grows with the epoch, then mapped to
an accuracy-like ``100 * u`` for mode "max" or a loss-like ``0.5 + 4 * (1 - u)``
that decreases for mode "min", so both modes pose the same problem.

Kinds:

* ``"saturating"``: exponential approach to a per-trial asymptote at a per-trial
  rate. Asymptotes are skewed so only a few trials are good: the easy case, where
  stopping the bad ones early is safe.
* ``"crossing"``: the better a trial's asymptote, the slower it rises, so curves
  cross late and a slow starter ends best: punishes stopping on early ranks.
* ``"misleading_first"``: like saturating from epoch 2 on, but the first epoch is
  mostly noise and slightly anti-correlated with the final value, as in LCBench:
  punishes deciding after one epoch.
* ``"noisy"``: saturating with large per-epoch noise, so single readings mislead.
* ``"mixed"``: each trial draws one of the kinds above (seeded).

Each trial's epochs take a per-trial time drawn uniformly from ``epoch_seconds``,
jittered by up to 5% per epoch. With ``size_quality``, a ``width`` hyper-parameter sets
that time instead, and bigger trials tend to be better (or worse), as in real searches. A ``diverge_fraction`` of the trials fail at a
uniformly drawn epoch, which costs time and records an empty metric. Everything is
drawn from ``numpy.random.default_rng(seed)``, so a seed fixes the trace.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hermes.sim.trace import MODES, Trace, TraceTrial

Curve = Callable[[np.random.Generator, np.ndarray], np.ndarray]

NOISY_SD = 0.05
"""Per-epoch noise of the "noisy" kind, in progress units (a twentieth of the range)."""
SECONDS_JITTER = 0.05
"""Relative per-epoch spread of a trial's epoch time, as on a shared real machine."""


def _saturating(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    asymptote = 0.35 + 0.6 * rng.beta(1.0, 4.0)
    tau = len(t) * rng.uniform(0.05, 0.5)
    return asymptote * (1.0 - np.exp(-t / tau))


def _crossing(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    quality = rng.uniform()
    tau = len(t) * (0.03 + 0.6 * quality) * rng.uniform(0.9, 1.1)
    return (0.4 + 0.5 * quality) * (1.0 - np.exp(-t / tau))


def _misleading_first(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    quality = rng.uniform()
    tau = len(t) * rng.uniform(0.05, 0.3)
    curve = (0.4 + 0.5 * quality) * (1.0 - np.exp(-t / tau))
    curve[0] = rng.uniform(0.1, 0.5) - 0.1 * quality
    return curve


def _noisy(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    return _saturating(rng, t) + rng.normal(0.0, NOISY_SD, len(t))


CURVES: dict[str, Curve] = {
    "saturating": _saturating,
    "crossing": _crossing,
    "misleading_first": _misleading_first,
    "noisy": _noisy,
}
KINDS = (*CURVES, "mixed")


def synthetic_trace(
    trials: int,
    epochs: int,
    *,
    seed: int,
    mode: str = "max",
    kind: str = "mixed",
    epoch_seconds: tuple[float, float] = (10.0, 60.0),
    diverge_fraction: float = 0.0,
    noise: float = 0.0,
    size_quality: float | None = None,
) -> Trace:
    """A seeded trace of ``trials`` curves of ``epochs`` epochs, one difficulty per ``kind``.

    ``noise`` is the standard deviation of extra Gaussian noise on every epoch, in
    progress units (0.01 is one accuracy point in mode "max").

    ``size_quality`` (in [-1, 1]): each trial gets a ``width`` parameter that sets its epoch
    time (log-uniform over ``epoch_seconds`` by rank, with 20% noise between width and time),
    and width correlates with the trial's final quality by about this much. In both shipped
    traces the best trials are among the slowest fifth: bigger models do better and cost more.
    The curves are those of the same seed without it.
    """
    low, high = epoch_seconds
    if trials < 1 or epochs < 1:
        raise ValueError(f"need at least one trial and one epoch, got {trials} trials of {epochs} epochs")
    if mode not in MODES:
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if not 0.0 <= low <= high:
        raise ValueError(f"epoch_seconds must be (low, high) with 0 <= low <= high, got {epoch_seconds}")
    if not 0.0 <= diverge_fraction <= 1.0:
        raise ValueError(f"diverge_fraction must be in [0, 1], got {diverge_fraction}")
    if noise < 0.0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    if size_quality is not None and not -1.0 <= size_quality <= 1.0:
        raise ValueError(f"size_quality must be in [-1, 1], got {size_quality}")

    rng = np.random.default_rng(seed)
    t = np.arange(1.0, epochs + 1.0)
    kinds = rng.choice(list(CURVES), trials) if kind == "mixed" else [kind] * trials
    curves = []
    finals = []
    for trial_kind in kinds:
        progress = np.clip(CURVES[trial_kind](rng, t) + rng.normal(0.0, noise, epochs), 0.0, 1.0)
        metrics = 100.0 * progress if mode == "max" else 0.5 + 4.0 * (1.0 - progress)
        seconds = rng.uniform(low, high) * rng.uniform(1.0 - SECONDS_JITTER, 1.0 + SECONDS_JITTER, epochs)
        curves.append((str(trial_kind), metrics.round(4).tolist(), seconds.round(3).tolist()))
        finals.append(progress[-1])
    widths: list[float | None] = [None] * trials
    if size_quality is not None:
        widths = _sized(curves, np.array(finals), size_quality, epoch_seconds, np.random.default_rng([seed, 1]))

    diverging = rng.choice(trials, round(diverge_fraction * trials), replace=False)
    failed_epoch = dict(zip(diverging.tolist(), rng.integers(1, epochs + 1, len(diverging)).tolist()))

    made = []
    for i, (trial_kind, metrics, seconds) in enumerate(curves):
        stop, diverged = failed_epoch.get(i, epochs), i in failed_epoch
        params: dict[str, float | str] = {"kind": trial_kind}
        if widths[i] is not None:
            params["width"] = widths[i]
        made.append(TraceTrial(str(i), tuple(metrics[: stop - diverged]), tuple(seconds[:stop]), diverged, params))
    return Trace(f"<synthetic {kind} seed={seed}>", mode, tuple(made))


def _sized(
    curves: list[tuple[str, list[float], list[float]]],
    finals: np.ndarray,
    correlation: float,
    epoch_seconds: tuple[float, float],
    rng: np.random.Generator,
) -> list[float | None]:
    """Give each trial a width correlated with its final progress, and epochs whose time follows it."""
    low, high = epoch_seconds
    spread = finals.std() or 1.0
    latent = correlation * (finals - finals.mean()) / spread + np.sqrt(1.0 - correlation**2) * rng.normal(size=len(finals))
    rank = np.argsort(np.argsort(latent)) / max(len(finals) - 1, 1)
    base = low * (high / low) ** rank if low > 0 else low + (high - low) * rank
    widths: list[float | None] = []
    for i, (kind, metrics, seconds) in enumerate(curves):
        jitter = rng.uniform(1.0 - SECONDS_JITTER, 1.0 + SECONDS_JITTER, len(seconds))
        curves[i] = (kind, metrics, (base[i] * jitter).round(3).tolist())
        widths.append(round(float(base[i] * rng.lognormal(0.0, 0.2)), 2))
    return widths
