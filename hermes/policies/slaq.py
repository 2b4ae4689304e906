"""SLAQ (Zhang et al., SoCC 2017): quality-driven time-sharing, one of the paper's baselines.

Each turn goes to the trial whose metric is predicted to improve most during the next period.
The prediction comes from a saturating fit of the trial's own recent curve and is divided by
the spread of scores seen in the experiment, so that trials compare on one scale whatever the
metric. Fits happen once per report (``observe``); ``priority``, which the core calls far more
often, only reads the cached prediction.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from hermes.core.trial import Trial
from hermes.core.policy import SchedulingPolicy, Verdict

EXPONENTS = np.geomspace(0.1, 3.0, 16)
"""Candidate decay exponents c of score(k) = a + s * k**-c; a grid keeps the fit linear and cheap."""

MAX_WINDOW = 1_000
"""The most reports a fit may use: a fit costs len(EXPONENTS) numbers per report it uses, at every report, so a
window as long as the history made a trial's reports cost quadratically in their number (20,000 reports took 94 s
of the scheduler's time at a window of 10**6, 6 s at 1,000 and 1.1 s at the default 20: 0.3 ms a fit at most)."""


def predicted_gain(steps: Sequence[int], scores: Sequence[float], horizon: float, window: int) -> float:
    """Score increase expected over the next ``horizon`` steps, never negative.

    Fits score(k) = a + s * k**-c to the last ``window`` finite reports by least squares for each
    exponent of the grid and keeps the best; with two points, extrapolates the last slope.
    """
    k = np.asarray(steps, dtype=float)
    y = np.asarray(scores, dtype=float)
    finite = np.isfinite(y)
    k, y = k[finite][-window:], y[finite][-window:]
    if len(y) < 2:
        return 0.0
    if len(y) == 2:
        run = k[1] - k[0]
        return max(0.0, (y[1] - y[0]) / run * horizon) if run > 0 else 0.0
    x = k[None, :] ** -EXPONENTS[:, None]
    x -= x.mean(axis=1, keepdims=True)
    covariance = x @ (y - y.mean())
    variance = (x * x).sum(axis=1)
    if not variance.any():
        return 0.0  # every point at the same step
    best = int(np.argmax(covariance**2 / variance))  # the exponent that explains the most variance
    slope = covariance[best] / variance[best]
    c, now = EXPONENTS[best], k[-1]
    return max(0.0, float(slope * ((now + horizon) ** -c - now**-c)))


class SlaqPolicy(SchedulingPolicy):
    name = "slaq"

    def __init__(self, period: float = 60.0, *, window: int = 20, prior: float = 1.0) -> None:
        """``window``: recent reports the fit uses; ``prior``: normalised gain assumed after one report."""
        super().__init__(period)
        if not 3 <= window <= MAX_WINDOW:
            raise ValueError(f"window must hold 3 to {MAX_WINDOW} reports, got {window}")
        if not prior >= 0:
            raise ValueError(f"the prior gain must be >= 0, got {prior}")
        self.window = window
        self.prior = prior
        self._gains: dict[str, float] = {}  # trial -> predicted score gain over its next period
        self._seen: tuple[float, float] | None = None  # lowest and highest finite score: the spread
        # trial -> (its reports read, the last ``window`` finite ones as (step, score)): a report reads only itself
        self._recent: dict[str, tuple[int, deque[tuple[int, float]]]] = {}

    def priority(self, trial: Trial, now: float) -> float:
        gain = self._gains.get(trial.trial_id)
        if gain is None:
            # SLAQ measures new jobs first; one report gives no slope yet, so assume a large one.
            return self.prior if trial.scores else math.inf
        spread = self._seen[1] - self._seen[0] if self._seen else 0.0
        return gain / spread if spread > 0 else 0.0

    def observe(self, trial: Trial, now: float) -> Verdict:
        score = trial.scores[-1]
        if math.isfinite(score):
            low, high = self._seen or (score, score)
            self._seen = (min(low, score), max(high, score))
        if len(trial.scores) >= 2:
            seconds_per_step = trial.report_gpu_time[-1] / trial.step
            left = trial.budget - trial.step  # no gain beyond the budget
            horizon = min(self.period / seconds_per_step, left) if seconds_per_step > 0 else left
            recent = self._recent_reports(trial)
            self._gains[trial.trial_id] = predicted_gain([s for s, _ in recent], [y for _, y in recent], horizon,
                                                         self.window)
        return Verdict.CONTINUE

    def _recent_reports(self, trial: Trial) -> deque[tuple[int, float]]:
        """The trial's last ``window`` finite reports, the points ``predicted_gain`` fits, read from its reports since
        the last call only: converting its whole history at every report cost quadratically in its reports."""
        read, recent = self._recent.get(trial.trial_id, (0, deque(maxlen=self.window)))
        for step, score in zip(trial.steps[read:], trial.scores[read:]):
            if math.isfinite(score):
                recent.append((step, score))
        self._recent[trial.trial_id] = (len(trial.scores), recent)
        return recent

    def state_dict(self) -> dict[str, Any]:
        return {"gains": dict(self._gains), "seen": list(self._seen) if self._seen else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._gains = {trial_id: float(gain) for trial_id, gain in state["gains"].items()}
        self._seen = (float(state["seen"][0]), float(state["seen"][1])) if state["seen"] else None
