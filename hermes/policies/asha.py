"""ASHA and Hyperband as scheduling policies (Li et al., "A System for Massively Parallel
Hyperparameter Tuning", MLSys 2020), the promotion-based baselines Hermes is compared with.

ASHA sorts training into rungs at ``min_steps * reduction_factor**k`` steps (and the trial's
budget as the last rung). A trial trains until its next rung and pauses there (``PAUSE``). A
paused trial may be promoted, that is resumed towards its next rung, while it is among the top
``1/reduction_factor`` of all the scores recorded at its rung (trials already promoted from
there count in that top, so each rung promotes at most a ``1/reduction_factor`` share of what
reached it, but for ties at the cutoff, which are all promoted, as Ray Tune's and Optuna's ASHA do).
A trial whose score at its rung is not finite (NaN, infinite: diverged) is never promoted, as
Optuna prunes it: ranked among the worst, it was promoted while fewer than the top share were
strictly better, so diverged trials tied with each other trained to their budget. Whenever a GPU
frees up it goes to a promotion, deepest rung first and best score first within a rung; only when
nothing is promotable does a new trial start. A paused trial that
is not promotable gets priority ``None``: it waits, and at the end of the experiment the core
stops it. ASHA never preempts a trial between rungs.

Hyperband runs several ASHA brackets side by side; bracket ``b`` has its first rung at
``min_steps * reduction_factor**b`` steps, so later brackets judge trials after more training.
Trials go to brackets round-robin by arrival order, and each bracket promotes among its own
trials only. Promotions compare across brackets by the steps the promotion leads to.

All bookkeeping happens in ``observe`` (a sorted list of scores per rung); ``priority`` costs
one binary search.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from typing import Any

from hermes.core.trial import Trial
from hermes.core.policy import SchedulingPolicy, Verdict

NEW_TRIAL = 0.0
"""Priority of a trial that has not reached its first rung: below every promotion (which is >= 1)."""


class AshaPolicy(SchedulingPolicy):
    name = "asha"

    def __init__(self, period: float = 60.0, *, reduction_factor: int = 3, min_steps: int = 1) -> None:
        super().__init__(period)
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor must be at least 2, got {reduction_factor}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be at least 1, got {min_steps}")
        self.reduction_factor = reduction_factor
        self.min_steps = min_steps
        self._scores: dict[str, list[float]] = {}  # rung key -> scores recorded there, ascending
        self._rung: dict[str, int] = {}  # trial -> index of the last rung it reached
        self._paused: set[str] = set()  # trials paused at their last rung, awaiting promotion

    # ------------------------------------------------------------------ rungs
    def bracket(self, trial: Trial) -> int:
        """ASHA has one bracket; Hyperband overrides this."""
        return 0

    def rung_steps(self, trial: Trial) -> list[int]:
        """The steps at which ``trial`` is judged, ending with its budget."""
        steps = []
        step = self.min_steps * self.reduction_factor ** self.bracket(trial)
        while step < trial.budget:
            steps.append(step)
            step *= self.reduction_factor
        steps.append(trial.budget)
        return steps

    def _key(self, trial: Trial, rung: int) -> str:
        return f"{self.bracket(trial)}/{rung}"

    # ------------------------------------------------------------------ the policy
    def observe(self, trial: Trial, now: float) -> Verdict:
        trial_id = trial.trial_id
        self._paused.discard(trial_id)
        rungs = self.rung_steps(trial)
        reached = self._rung.get(trial_id, -1)
        if reached + 1 >= len(rungs) or trial.step < rungs[reached + 1]:
            return Verdict.CONTINUE
        rung = reached + 1
        while rung + 1 < len(rungs) and trial.step >= rungs[rung + 1]:  # reports may skip rungs
            rung += 1
        self._rung[trial_id] = rung
        if rung == len(rungs) - 1:
            return Verdict.CONTINUE  # the budget: the trial ends by itself
        insort(self._scores.setdefault(self._key(trial, rung), []), _finite(trial.scores[-1]))
        self._paused.add(trial_id)
        return Verdict.PAUSE

    def priority(self, trial: Trial, now: float) -> float | None:
        trial_id = trial.trial_id
        rung = self._rung.get(trial_id)
        if rung is None:
            return NEW_TRIAL
        rungs = self.rung_steps(trial)
        # How deep the next stretch of training goes, on a log scale shared by all brackets.
        depth = 1.0 + math.log(rungs[min(rung + 1, len(rungs) - 1)] / self.min_steps, self.reduction_factor)
        if trial_id not in self._paused:
            return depth + 1.0  # promoted and interrupted before its next rung: finish the promotion
        score = _finite(trial.scores[-1])
        if score == -math.inf:  # diverged
            return None
        scores = self._scores[self._key(trial, rung)]
        top = len(scores) // self.reduction_factor
        better = len(scores) - bisect_right(scores, score)
        if better >= top:
            return None
        return depth + 0.5 * (1.0 - better / top)

    def turn_over(self, trial: Trial, now: float) -> bool:
        return False  # a trial yields only at its rungs

    # ------------------------------------------------------------------ restart
    def state_dict(self) -> dict[str, Any]:
        return {
            "scores": {key: [_json_score(s) for s in scores] for key, scores in self._scores.items()},
            "rung": dict(self._rung),
            "paused": sorted(self._paused),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scores = {key: [-math.inf if s is None else float(s) for s in scores] for key, scores in state["scores"].items()}
        self._rung = {trial_id: int(rung) for trial_id, rung in state["rung"].items()}
        self._paused = set(state["paused"])


class HyperbandPolicy(AshaPolicy):
    """Asynchronous Hyperband: ASHA brackets with first rungs ``min_steps * reduction_factor**b``."""

    name = "hyperband"

    def bracket(self, trial: Trial) -> int:
        brackets = 1
        while self.min_steps * self.reduction_factor**brackets < trial.budget:
            brackets += 1
        return trial.seq % brackets


def _finite(score: float) -> float:
    return score if not math.isnan(score) else -math.inf


def _json_score(score: float) -> float | None:
    return score if math.isfinite(score) else None
