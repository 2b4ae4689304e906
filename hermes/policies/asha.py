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
stops it. A rung that holds fewer than ``reduction_factor`` scores promotes no share of them; once
the search is spent (submissions closed, and every trial not ended paused at a rung: none trains or
waits to start), the best of such a rung is promoted all the same, deepest rung first, as Ray Tune's
and Optuna's ASHA let it go on: a search of 8 trials with 9 steps and a factor of 3 ended with none
past step 3. While trials may still come, a new one is asked for instead, as ASHA does.
ASHA never preempts a trial between rungs.

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
from typing import Any, Mapping

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
        self._trials: Mapping[str, Trial] = {}  # the core's, to tell when every trial is paused or ended
        self._closed = False  # submissions closed: no trial comes beyond those of ``_trials``
        self._active: str | None = None  # a trial last seen neither paused nor ended: usually still so

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
        if better < top:
            return depth + 0.5 * (1.0 - better / top)
        if top == 0 and better == 0 and self._spent():  # the best of a rung too small to promote a share
            return depth
        return None

    def _spent(self) -> bool:
        """Whether no trial comes and every one not ended is paused at a rung: none trains or waits to start. A
        trial found active is checked first next time (it mostly still is), so a search in full swing costs no scan."""
        if not self._closed:
            return False
        trials = self._trials
        if self._active is not None and self._active in trials and self._is_active(trials[self._active]):
            return False
        self._active = next((trial_id for trial_id, trial in trials.items() if self._is_active(trial)), None)
        return self._active is None

    def _is_active(self, trial: Trial) -> bool:
        return not trial.state.is_terminal and trial.trial_id not in self._paused

    def turn_over(self, trial: Trial, now: float) -> bool:
        return False  # a trial yields only at its rungs

    def submissions_closed(self, closed: bool) -> None:
        self._closed = closed

    def attach(self, trials: Mapping[str, Trial]) -> None:
        self._trials = trials

    # ------------------------------------------------------------------ restart
    def state_dict(self) -> dict[str, Any]:
        return {
            "scores": {key: [_json_score(s) for s in scores] for key, scores in self._scores.items()},
            "rung": dict(self._rung),
            "paused": sorted(self._paused),
            "closed": self._closed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scores = {key: [-math.inf if s is None else float(s) for s in scores] for key, scores in state["scores"].items()}
        self._rung = {trial_id: int(rung) for trial_id, rung in state["rung"].items()}
        self._paused = set(state["paused"])
        self._closed = bool(state["closed"])


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
