"""Early stoppers: end trials that are clearly behind, whatever policy schedules them.

Both judge a trial only against what other trials reported at the same step, and keep those
records incrementally (sorted lists per step), so a report costs little however many trials ran.
"""

from __future__ import annotations

import math
from bisect import insort
from typing import Any

from hermes.core.trial import Trial
from hermes.core.policy import EarlyStopper


class AshaStopper(EarlyStopper):
    """Asynchronous successive halving (Li et al., MLSys 2020) as a stopping rule.

    Rungs sit at ``min_steps * reduction_factor**k`` steps. A trial reaching a rung goes on only
    if its score is among the top ``1/reduction_factor`` of the scores recorded there so far.
    Being asynchronous, it cannot wait for the others: until a rung holds ``reduction_factor``
    scores every trial passes it.
    """

    name = "asha"

    def __init__(self, min_steps: int = 1, reduction_factor: int = 3) -> None:
        if min_steps < 1:
            raise ValueError(f"min_steps must be at least 1, got {min_steps}")
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor must be at least 2, got {reduction_factor}")
        self.min_steps = min_steps
        self.reduction_factor = reduction_factor
        self._rungs: list[list[float]] = []  # rung k -> scores recorded there, ascending
        self._next_rung: dict[str, int] = {}  # trial -> index of the next rung it has to pass

    def _rung_step(self, k: int) -> int:
        return self.min_steps * self.reduction_factor**k

    def should_stop(self, trial: Trial) -> bool:
        k = self._next_rung.get(trial.trial_id, 0)
        if trial.step < self._rung_step(k):
            return False
        while self._rung_step(k + 1) <= trial.step:  # reports may skip rungs: judge at the highest reached
            k += 1
        self._next_rung[trial.trial_id] = k + 1
        while len(self._rungs) <= k:
            self._rungs.append([])
        scores = self._rungs[k]
        score = trial.scores[-1]
        insort(scores, score)
        top = len(scores) // self.reduction_factor
        return top > 0 and score < scores[-top]

    def state_dict(self) -> dict[str, Any]:
        return {"rungs": [list(scores) for scores in self._rungs], "next_rung": dict(self._next_rung)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rungs = [list(scores) for scores in state["rungs"]]
        self._next_rung = dict(state["next_rung"])


class MedianStopper(EarlyStopper):
    """Median stopping rule (Golovin et al., Google Vizier, KDD 2017), judged with confidence.

    After ``grace_steps`` steps, a trial stops if its best score so far is worse than the median
    of the running-average scores other trials had at the same step, once at least
    ``min_trials`` others got there. Best against averages makes it lenient: only trials clearly
    behind stop. Each trial is judged and recorded once per step, so steps trained again after
    a lost GPU are not counted twice.

    "Worse than the median" must hold with ``confidence``: the bar is a distribution-free lower
    confidence bound of the others' median, the ``k``-th lowest of their ``n`` averages with the
    largest ``k`` for which ``P(Binomial(n, 1/2) < k) <= 1 - confidence`` (the chance that fewer
    than ``k`` of ``n`` draws fall below the median). Why: the others at a step are not a random
    sample under a scheduler that prioritises, since the leaders get there first, and at a deep
    step a handful of them set the bar. With the plain median (``confidence`` 0.5, the lower
    median) a search's final-best trial was stopped behind five leaders in 1 of 100 simulated
    searches on 4 GPUs and 2 of 100 on 16 (hermes, bench/policy_panel.py); with 0.95, the usual
    one-sided level, in none of them, and the bar needs at least 5 others (``0.5**5 < 0.05``).

    ``judge`` gives the verdict both ways, for a policy that ranks rather than stops: behind (below
    that lower bound), clearly not behind (above the matching upper bound, the ``k``-th highest), or
    undecided, so that a judgement is revised only on evidence as strong as the one that made it.
    """

    name = "median"

    def __init__(self, grace_steps: int = 1, min_trials: int = 3, confidence: float = 0.95) -> None:
        if grace_steps < 0:
            raise ValueError(f"grace_steps must be >= 0, got {grace_steps}")
        if min_trials < 1:
            raise ValueError(f"min_trials must be at least 1, got {min_trials}")
        if not 0.5 <= confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
        self.grace_steps = grace_steps
        self.min_trials = min_trials
        self.confidence = confidence
        self._averages: dict[int, list[float]] = {}  # step -> running averages recorded there, ascending
        # trial -> (reports summed, their sum, best score, last step judged)
        self._trials: dict[str, tuple[int, float, float, int]] = {}
        self._bar_rank: list[int] = [0]  # others at a step -> 1-based rank of the bar among them (0: none)
        self._below = 0.0  # P(Binomial(n, 1/2) < k) for the last n and k of that table

    def should_stop(self, trial: Trial) -> bool:
        return self.judge(trial) is True

    def judge(self, trial: Trial) -> bool | None:
        """Record the trial's new reports; at a step it has not been judged at, whether it is clearly behind
        the others' median (True) or clearly ahead of it (False), with ``confidence``. None: undecided, or
        not judged (the grace steps, a step judged before, fewer than ``min_trials`` others there)."""
        scores, step = trial.scores, trial.step
        counted, total, best, judged = self._trials.get(trial.trial_id, (0, 0.0, -math.inf, 0))
        if counted == len(scores) - 1:  # the usual call: one new report (the same sum and best as below)
            score = scores[-1]
            total += score
            best = score if score > best else best
        else:  # every report since the last call, even one this missed
            new = scores[counted:]
            total += math.fsum(new)
            best = max([best, *new])
        self._trials[trial.trial_id] = (len(scores), total, best, judged if step <= judged else step)
        if step <= judged:
            return None
        others = self._averages.get(step)
        if others is None:
            others = self._averages[step] = []
        n = len(others)
        verdict = None
        if step > self.grace_steps and n >= self.min_trials:
            rank = self._rank_of_bar(n)
            if rank > 0:
                if best < others[rank - 1]:
                    verdict = True
                elif best > others[n - rank]:
                    verdict = False
        insort(others, total / len(scores))
        return verdict

    def _rank_of_bar(self, n: int) -> int:
        """The rank ``k`` of the median's lower confidence bound among ``n`` values (see the class docstring).

        ``k`` never falls as ``n`` grows, so the table grows one ``n`` at a time from the last one, keeping
        ``P(Binomial(n, 1/2) < k)``: O(1) per new ``n``, however many trials a step collects."""
        ranks, level = self._bar_rank, 1.0 - self.confidence + 1e-12
        while len(ranks) <= n:
            size, k = len(ranks), ranks[-1]
            below = self._below - 0.5 * _half_binomial(size - 1, k - 1)  # one more draw: P(B_size < k)
            while below + _half_binomial(size, k) <= level:
                below += _half_binomial(size, k)
                k += 1
            self._below = below
            ranks.append(k)
        return ranks[n]

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: a diverged trial's -inf is saved as None."""
        return {
            "averages": {str(step): [_finite_or_none(v) for v in values] for step, values in self._averages.items()},
            "trials": {trial_id: [_finite_or_none(v) for v in record] for trial_id, record in self._trials.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._averages = {int(step): [_none_as_minus_inf(v) for v in values]
                          for step, values in state["averages"].items()}
        self._trials = {}
        for trial_id, (counted, total, best, judged) in state["trials"].items():
            self._trials[trial_id] = (int(counted), _none_as_minus_inf(total), _none_as_minus_inf(best), int(judged))


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _none_as_minus_inf(value: float | None) -> float:
    return -math.inf if value is None else float(value)


def _half_binomial(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) == k), in logarithms so that no power of 2 underflows for large ``n``."""
    if not 0 <= k <= n:
        return 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0))
