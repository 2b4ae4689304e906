"""Hermes: convergence-aware priority with time-sharing and preemption.

The paper (HERMES.md) fixes the idea: time-share GPUs so that every trial reports early, and at
every scheduling period give each GPU to the trial that converges best. It leaves open how to
measure convergence, how long a turn lasts and whether to stop trials (HERMES.md, section 3).
This module decides them as follows; every number below has the reason next to it.

What runs first
    A trial that has not reported yet has the highest priority (``UNMEASURED``), and a trial's
    turn ends at its first report. So every trial reports once before any trial trains further.
    Among the new trials the one expected to report soonest goes first: the shortest-first rule
    minimises the mean time to first feedback. How long a first report takes is predicted from
    the hyper-parameters by ``DurationModel`` (hermes.policies.duration), fitted on the trials
    that reported; until it predicts held-out trials better than chance (or with no
    hyper-parameters) the order is the arrival order. A new trial's key is its submission time
    plus its predicted duration, so a long trial submitted early still goes before short ones
    submitted after its key: nothing waits forever. On nasbench (epoch time follows model
    size) this gives first feedback 17% sooner than arrival order, and on lcbench 12%.

The convergence measure: a trial's standing, rung by rung
    A trial's history is summarised at *rungs*: its first report, then steps ``f * 2**k`` where
    ``f`` is the first reported step (doubling, so each rung costs as much training as all the
    rungs before it, and a trial's information about itself doubles from rung to rung; a
    factor 3 did worse on the synthetic traces, as it ranks too coarsely early), and last the
    trial's budget, where the doubling would pass it. Without that last rung everything after the
    last doubling went unseen: the last 20 of LCBench's 52 epochs and 34 of NAS-Bench-301's 98,
    where late risers overtake (lcbench_168330's final best stands 4th after 32 epochs and first
    from epoch 40), so the standings a search learned to predict were not where trials end; with
    it, time to best over FIFO went from 3.95x to 4.44x on 168330 and 0.98x to 1.22x on nb301
    (4 GPUs, warm costs, 10 seeds; docs/policy.md, "The last rung is the budget"). The value at
    a rung is where the trial's curve stands at the rung, estimated from the reports since the
    previous rung (``_rung_value``): their mean, moved towards the end of their least-squares
    line as far as the stretch's trend stands out of the reports' noise. The mean alone smooths
    noise but lags: with doubling rungs a stretch is half of the trial's training so far, so a
    trial still rising steeply, the fast converger Hermes wants to find, was valued a quarter of
    its training in the past, and on lcbench a late riser ranked below flat trials it had passed.
    The noise is the median scatter of a report about the chord of its neighbours, pooled over
    the search (the median, because curves bend hard in their first epochs); the weight,
    ``1 - v / rise**2`` (positive part), is the one that minimises the expected squared error.
    So clean curves are valued at their end, as ASHA does with the last report, and noisy ones at
    their mean, as before (docs/policy.md, "The value at a rung").

    A trial's *standing* at a rung is the rank-based normal score of that value among the
    trials that reached the rung, so any metric compares (min or max, any scale, outliers, a
    diverged trial's -inf). Everyone reaches rung 0, so standings there are against the whole
    population. Deeper rungs are reached by a selected few; their within-group ranks are put
    back on the population scale by a *link*: a regression of the within-group scores on the
    standings at the rung before (selection on the regressor does not bias a regression, so the
    fitted line gives the population mean and spread of the deeper scores: the textbook
    correction for range restriction). A trial that converges faster than its peers climbs in
    standing from rung to rung; one that converges slowly sinks. That change of standing per
    rung, a doubling of GPU time, is the convergence measure, normalised across trials by
    construction.

The priority: an optimistic prediction whose width is learned online
    What matters is where a trial will stand at the end, and how well early standings predict
    that differs between experiments (on nasbench a trial's first epoch ranks it well; on
    lcbench the first epoch is noise and ranks change completely by the second). So Hermes
    learns it: the *horizon* is the deepest rung that ``min_trials`` trials have reached; for
    every shallower rung it regresses the standing at the horizon on a trial's standing and its
    latest change (see below) over the trials that got there. The fit's
    population correlation R says how much early standings tell; it is shrunk by one standard
    error on Fisher's z scale, so a handful of lucky trials cannot create trust. The priority is
    the optimistic prediction ``mean + optimism * sqrt(1 - R**2)`` (``optimism`` 1: one
    standard deviation; less for a trial dearer than most, see "What a trial costs"): a trial
    whose future is uncertain gets turns until it is known; a trial
    known to be behind waits; a trial known to lead runs to the end. With R near 0 (lcbench's
    first epoch) every trial gets a second stretch before any is trained deep; with R near 1
    (nasbench) the leaders go on at once. When early ranks turn out to anti-predict (curves that
    cross late), R comes with a negative weight and the trials behind get the turns.
    ``min_trials`` is 20: the standard error of a correlation from 20 trials is about 0.24 on
    Fisher's z scale; with 10, horizons rested on too few trials and did worse on varied
    synthetic traces. A search of fewer than twice ``min_trials`` trials asks half the trials it
    has (at least 5): a horizon of 20 would form there only once nearly every trial reached the
    rung, so Hermes served trials in turns with nothing learned, which is round robin; with 16
    trials on 4 GPUs it was slower than FIFO to the best on every shipped trace (0.6-1.05x), and
    with half 1.1-3.4x (the shrinkage by one standard error already discounts the smaller fit).
    Adding the latest change (``momentum``) is what lets a trial whose second epoch jumped ahead
    of its first be recognised (lcbench: best fully trained after 1.8 h instead of 2.0 h). From
    the third rung on the change is the trial's *rise*: how far its value climbed since the rung
    before, as a normal score among the trials at the rung. That is the slope of its curve per
    doubling of its training, the simplest learning-curve extrapolation, made scale-free by the
    rank: a trial still climbing where its peers have flattened ends higher (late risers, curves
    that cross), which a change of standing shows only as far as the ranks between the two
    standings allow, and through the errors of two links. Its weight is fitted like the others,
    so where the rise tells nothing it counts for nothing. On synthetic curves that cross, time to
    best over FIFO went from 1.43x to 2.00x (50 epochs; 1.41x to 1.90x without hyper-parameters),
    over the five synthetic kinds from 2.50x to 2.64x, and on the recorded searches by 0-1% (4 or
    16 GPUs, warm costs; docs/policy.md, "The latest change: a rise"). Into the second rung the
    change stays one of standing: there one end of the rise would be the first report, a single
    report that also pays the start-up and on LCBench is mostly noise, so the trials with a poor
    first epoch rose most; measured as a rise there too, lcbench_167104 with process costs fell
    from 2.35x to 1.74x FIFO.

    Before the first link is fitted there is no information: all measured trials tie and ageing
    serves them in turn, so the first trials to go deeper are a random sample, which is what
    fits the first links without bias. Trials at or beyond the horizon are ranked by their
    standing there, trusted as much as the last fitted link (nothing says yet that deeper ranks
    change more).

What the hyper-parameters say
    A trial's first report has no standing before it, so momentum has nothing to add there, and
    on some searches the first report ranks trials no better than chance (lcbench_189866 and
    189873: R squared 0.0-0.03 from rung 0 to the horizon). There every trial at rung 0 tied and
    second looks went in arrival order: the final best of a 400-trial search waited behind 346
    others. But the hyper-parameters are known for every trial, and the trials at the horizon
    say what they are worth. So at every refit the standings at the horizon are regressed on the
    hyper-parameters, with the duration model's ridge regression (hermes.policies.duration: the
    same features, penalty and leave-one-out trust check). Where it predicts held-out trials
    better than chance by one standard error, its prediction, the *prior*, is a regressor of
    every predictor: at the first report beside the standing there (the slot momentum fills
    deeper), and at deeper rungs beside the last two standings. The horizon trials' leave-one-out
    priors are used, so that a weight does not credit the prior with its own overfit, and the
    width shrinks by what the prior adds (the prior is first put on the standings' scale,
    variance 1, as the predictor counts it; its population correlations with the standings are
    read over every trial at the rung). Where the hyper-parameters tell nothing, the fit is not
    trusted and nothing changes; searches without hyper-parameters (a bare list of commands) keep
    the arrival order. It is learned per search, like the links: nothing in it is set for a trace.
    At the first report, with 4 GPUs and warm costs over 40 seeds, it took time to best over FIFO
    from 10.7x to 25.3x on lcbench_189873 and 4.7x to 6.8x to the target on 189908, but from
    6.9x to 4.4x on lcbench_189866, whose best its hyper-parameters place 23rd to 82nd of 400.
    Deeper, it counts where the standings so far do not yet show what the hyper-parameters say:
    on the late risers a trial's standing keeps changing at every depth, and where it ends follows
    its configuration more than its first epochs (lcbench_146212: the final best stands 142nd
    after two epochs and 46th after four, where the hyper-parameters of 40 random finished trials
    place it 2nd to 11th). There, at 4 GPUs and warm costs over 10 seeds, time to best
    over FIFO went from 2.49x to 2.94x on 146212, 2.30x to 2.49x on 167104, 4.79x to 6.36x on
    189866 and 11.8x to 13.1x on 189908, the others within 1% (docs/policy.md, "What the
    hyper-parameters say").

What a trial costs
    Time to the best is measured in GPU seconds, not epochs, and trials differ in what an epoch
    costs (a small batch size, a wide layer): on the real workload of ``bench/frameworks``, the
    batch-16 trials lead per epoch, but one of their epochs costs five of a batch-128 trial's, and
    the final best is a cheap trial that waited behind dear leaders trained to their end. So the
    optimism is priced. ``mean + optimism * width`` is Weitzman's reservation value of a normal
    prize (the trial's standing at the horizon) whose price to open is ``E[max(Z - optimism, 0)]``
    widths; Hermes sets that price in proportion to the trial's remaining GPU seconds over the
    mean known trial's whole budget, and takes the reservation value for it
    (``stats.reservation_offset``): a trial twice as dear as the mean, at the same prediction, gets
    less optimism; a known one (narrow width) pays nearly its price in full. Two limits, each
    measured (docs/policy.md):
    - never more optimism than ``optimism``: a turn does not open the prize, it shows one more
      rung, so a cheap trial would keep a larger bonus turn after turn; lifting cheap trials had
      dozens of them trained to their end before the best on LCBench, whose costs span two orders
      of magnitude (lcbench_189873: time to best 11.5x FIFO down to 6.8x);
    - only where the prediction carries information: before the first links, cost would order the
      second look, and the first trials to go deeper, which fit the links, would be the cheap ones
      instead of a random sample; and "cheap first" with no information is a bet that quality does
      not depend on cost, which holds on some searches and not on others (the rank correlation of
      cost with the final metric runs from -0.60 to +0.53 across the shipped traces).
    On the real workload's trace this takes time to best from 3.0x to 4.4x FIFO (4 GPUs, warm
    costs); lcbench_189866 goes from 4.3x to 6.8x, and six traces lose 0-10%.

Ageing
    A waiting trial's priority grows by one population standard deviation for every ``ageing``
    round-robin cycles it waits (a cycle is trials per GPU times the mean run: the time in
    which round robin would have served it). No trial waits forever, even with endless
    submissions. ``ageing`` 3: on varied synthetic traces 1
    makes Hermes nearly round robin, and 3 to 30 perform alike. A trial that has run only its
    first turn waits since its submission, not since its first report: the first reports come
    shortest first, and waiting since them would give second turns shortest first too, so the
    first trials to go deeper, which fit the first links, would all be short ones (on lcbench
    that kept the best trial, a slow one, waiting: time to best 2.1 h instead of 1.85 h).
    Counted from submission, they tie and go in arrival order, a random sample. That holds
    until the first links are fitted. From then on the measured trials are ranked and tie no
    longer, and a trial waits since its last run whatever its turns: counted from submission,
    a wait included the whole first sweep, so hours into a 400-trial search ageing lifted the
    trials not yet looked at again above better ranked ones that had run since
    (lcbench_189866, seed 0, 3 h in: 216 trials ahead of the final best, among them trials
    that end 389th to 395th of 400). Counting from the last run there took time to best over
    FIFO from 5.02x to 5.25x in the geometric mean of the ten traces, and no trace lost (4
    GPUs, warm costs, 10 seeds; docs/policy.md, "Ageing, once trials are ranked").

Trials clearly behind lose the benefit of the doubt
    Optimism is a hedge against a ranking that is wrong, and in a search of hundreds it also
    lifts, turn after turn, trials that every report puts far behind, while a late riser that
    stands merely among the plausible waits for its next look. So a trial whose best score so
    far is below the others' median at the same step, with 95% confidence, is judged behind and
    loses its optimism: it is ranked by its prediction (or lower, where the price of its GPU
    seconds already sets it lower: a judgement never lifts a trial). Where that prediction too
    puts it below the average (a predicted standing below 0, the population's mean), the two
    pieces of evidence agree and it waits last: its priority drops by ``DEFERRED``, so it waits
    until no trial that is not so judged waits. A judgement is revised only on evidence as
    strong as the one that made it: a judged trial whose best rises above the others' median at
    a later step with the same confidence (above the median's upper bound) is judged no longer,
    so a slow starter that catches up gets its optimism back. It still ages like every waiting
    trial, so the order of waiting trials does not change as time passes (the core sorts them
    once, see ``SchedulingPolicy.order_version``); and it is never stopped. The judge is the
    median stopping rule (Golovin et al., Google Vizier; Optuna's default pruner) as
    ``MedianStopper`` implements it: the bar is a distribution-free lower confidence bound of
    the median of the others' running averages (hermes.policies.stopping), resting on at least
    ``min_trials`` others at the step, as much evidence as a link. Nothing in it has a scale or
    a unit: it compares scores at equal steps. The prediction is what keeps it adaptive. The
    others at a step are those the policy trained there first, so where curves cross (slow
    starters end best) the rule judges the final leaders behind; a first form that made judged
    trials wait last took time to best on synthetic crossing curves from 1.35x FIFO to 0.91x.
    Ranked by its prediction, a judged trial still goes ahead wherever the links or its
    hyper-parameters say it ends high (1.16x there). Revising the judgement took that to 1.29x
    (1.43x with 50 epochs, where no rule gives 1.28x), and waiting last where the prediction
    agrees took nb301, where hundreds of trials stay plausible, from 1.75x to 1.64x FIFO with
    both (1.86x without the revision; 4 GPUs, warm costs). Every trial is trained to its budget,
    so the final best is trained in every search even where the rule misjudges it, and the
    makespan does not change (docs/policy.md, "Trials clearly behind lose the benefit of the
    doubt").

The scheduling period and the switch price: learned, not set
    A switch (suspend and resume) costs GPU time. Its price starts at the engine's figure
    (``ExecutionProfile.switch_cost``, which each executor derives from how it runs trials; the
    simulator's from its cost model, hermes.sim.costs) and is then learned: two reports with a
    suspend and resume between them took the steps' time plus the switch, so the excess is what
    that switch cost here, whatever the device or the state size. A resume on another GPU than the
    one the trial left also spills the state to disk and reads it back (0.62 s at 100 MB with warm
    workers, 6.4 s at 1 GB, against 0.018 s and 0.17 s on one GPU), so the two paths are priced
    apart: each is the mean of its observed switches, the engine's figure counting as one
    (``ExecutionProfile.migration_cost`` for a migration), and a turn costs the first plus the
    second times the share of resumes that migrated so far. A suspended trial resumes on its own
    GPU where priorities allow: a GPU that frees goes to the best trial that left it when that
    trial is within ``migration_penalty`` of the best waiting one, a migration's price converted
    at the ageing rate (a migration is worth as much as waiting as long as it costs). So ties, such
    as the first sweep's before any link, stay put, and a trial clearly ahead still moves; with 1 GB
    trials, where both were missing, hermes was 0.70-0.80x FIFO to the best (docs/policy.md,
    "Migrations, priced and avoided"). A running trial's
    turn is over when it reached a new rung in this run (its priority changed), or after one of
    its own reports' worth of GPU time (its observed seconds per step times the report interval)
    and at least ``price / overhead_budget``: so the period follows the observed epoch lengths
    and nobody tunes it (a ``period`` given explicitly replaces the report). Time-sharing is
    priced switch by switch:
    - never when the trial's remaining work costs less than the switch (nobody would wait less);
    - at a trial's first report whenever the rest of it costs more than the switch: every new
      trial would otherwise wait for that rest, so the first sweep pays off under any cost model
      where trials are longer than a switch (with a process per run and epochs of a second or
      two this is what keeps first feedback far ahead of FIFO and ASHA);
    - later, only while the remaining work is at least ``1 / overhead_budget`` switches and the
      switches so far stay within ``overhead_budget`` (2%) of the estimated total training time.
    With epochs shorter than a switch trials run to their end, and the makespan stays within the
    overhead budget of FIFO's; that bound, not the time to best, is what holds by design.

Stopping
    Hermes never stops or pauses a trial itself: a hopeless trial just waits at a low priority,
    without optimism once it is clearly behind (last, where its prediction agrees), and every
    trial is trained to its budget in the end, so the final-best trial is always fully trained.
    When the budget must be cut, an early stopper of the core (``asha``, ``median``) composes
    with this policy; the median rule judges with 95% confidence, since the trials that reach a
    deep step first are hermes's leaders (stopping.py), and so keeps the final best in every
    seed of the panel (docs/policy.md).

Where it stands (bench/policy_panel.py, docs/policy.md; warm-worker costs, 4 GPUs, 10 seeds)
    On the ten shipped traces it gives first feedback 11-160x sooner than FIFO, sooner than
    ASHA on every one, and trains the final-best trial in every seed. Time to best is 4.5-22x
    sooner than FIFO in the mean where early ranks or the hyper-parameters carry the ranking
    (nasbench, lcbench 189908, 34539, 189866, 189873, the real workload) and on lcbench_168330,
    whose final best overtakes after epoch 32, but 1.5-3.6x where the final best stays hidden
    deep into its training (lcbench 146212, 167104; NAS-Bench-301), and slower than FIFO in some
    seed on most traces: a late riser waits at a low priority until ageing, its deeper rungs or
    its hyper-parameters lift it. In searches of 16 of their trials (``--trials 16``) it is
    1.1-3.4x sooner to the best than FIFO, where a clairvoyant oracle gets 1.5-4.2x.

Cost
    ``observe`` costs a few list operations, one histogram count (the report's scatter) and the
    median rule's sorted insert of the trial's running average (O(trials at the step)); a
    trial that reaches a rung is valued in one pass over the stretch's reports (at most
    ``WINDOW``), the noise read from the histogram's few hundred bins at most, its rise inserted
    in the rung's sorted rises, and ranked with binary searches (its last two standings, or its
    standing and its rise); every 5% growth of the rung records the model is
    refitted with numpy in O(records), and the budgets are recounted in one pass over the known
    trials; while trials wait for their first report, the duration model is refitted at the same
    moments (a ridge regression over the reported trials, O(trials)); pricing a trial's optimism
    is one table interpolation; ``priority``, which the core calls most, is a dictionary lookup,
    a set lookup and one multiply-add.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from hermes.core.states import RUNNING, SUSPENDING
from hermes.core.trial import Trial
from hermes.core.policy import CONTINUE, ExecutionProfile, SchedulingPolicy, Verdict
from hermes.policies.duration import DurationModel
from hermes.policies.stopping import MedianStopper
from hermes.policies.stats import expected_excess, normal_scores, reservation_offset, reservation_offset_of, shrink

# GPU seconds of a suspend and resume until the engine's profile says (ExecutionProfile); that of a
# process per run, the dearest, so an unconfigured policy never under-prices a switch.
DEFAULT_SWITCH_COST = 3.2
UNMEASURED = 1e12
"""Trials that have not reported yet have priorities just below this, far above every measured
trial's (standings are a few units, and ageing adds one per ``ageing`` round-robin cycles waited):
``UNMEASURED`` less their submission time and predicted first-report seconds, both in seconds."""

DEFERRED = 1e6
"""Subtracted from the priority of a trial clearly behind whose prediction agrees (see "Trials clearly behind
lose the benefit of the doubt"): standings are a few units and ageing adds one per ``ageing`` round-robin cycles,
so it waits behind every trial that is not so judged."""

FEWEST_TRIALS = 5
"""The fewest trials a link or a prediction rests on, and the least ``min_trials`` may be: a prediction
from two standings on 5 trials keeps one spare degree of freedom for the standard error it is shrunk by."""

REFIT_GROWTH = 0.05
"""The model is refitted when the rung records have grown by this fraction since the last fit."""

MIN_RUNG_FACTOR = 1.1
"""The finest ``rung_factor``: a rung per 10% more training. A report costs a record per rung it crosses and a refit
one pass per rung, and a trial has ``log(budget) / log(rung_factor)`` rungs: at most 227 at the largest budget
(2**31 steps) here, 7 times the default's, where a factor of 1.000001 gave a 4-step trial 1.4 million (a shared
server's pool stalled for 40 s). Closer rungs tell nothing new, as rungs are at whole steps: at 1.01, 70 of them
fall between steps 1 and 2, each valued from the same report."""

WINDOW = 64
"""At most this many reports are averaged into a rung value, which bounds the cost of a report."""

NOISE_BINS = 4
"""Histogram bins per doubling of a squared scatter: the pooled noise variance is read to within 19%."""

NOISE_RANGE = 10_000
"""The bins of an exact fit (-NOISE_RANGE) and of an infinite scatter (+NOISE_RANGE): beyond every finite scatter's,
whose key is at most NOISE_BINS times the 2,100 doublings a float spans from the search's first."""

CHI2_MEDIAN = 0.454936
"""Median of a chi-squared variable with one degree of freedom: a squared normal scatter's median over its variance."""

_inverse_normal = NormalDist().inv_cdf


@dataclass(frozen=True, slots=True)
class Link:
    """Within-group scores at a rung, as a line in the population standings at the rung before."""

    intercept: float
    spread: float  # population standard deviation of the scores: sqrt(slope**2 + residual variance)
    correlation: float  # population correlation of consecutive standings: slope / spread
    trials: int


@dataclass(frozen=True, slots=True)
class Predictor:
    """Standing at the horizon predicted from the standing, its latest change and the prior; optimistic = mean +
    optimism * width."""

    now: float  # weight of the standing at the trial's last rung
    before: float  # weight of the standing at the rung before (momentum at rung 1; 0 elsewhere)
    width: float  # standard deviation of the prediction, in population standard deviations
    prior: float = 0.0  # weight of the score the hyper-parameters predict (see "What the hyper-parameters say")
    rise: float = 0.0  # weight of the rise's normal score among the rung's trials (rung 2 on, where ``before`` is 0)


NO_INFORMATION = Predictor(0.0, 0.0, 1.0)

FIRST_RISE = 2
"""The first rung whose latest change is a rise: into rung 1 it is a change of standing (see "The priority")."""


def fit_link(previous: np.ndarray, scores: np.ndarray, least: int) -> Link | None:
    """Regress within-group ``scores`` on population standings ``previous`` (None below ``least`` trials)."""
    n = len(previous)
    if n < least:
        return None
    xc, gc = previous - previous.mean(), scores - scores.mean()
    sxx = float(xc @ xc)
    if sxx <= 1e-12:
        return None
    slope = float(xc @ gc) / sxx
    residual = gc - slope * xc
    spread = math.sqrt(slope * slope + float(residual @ residual) / (n - 2))
    if spread <= 1e-12:
        return None
    return Link(float(scores.mean()) - slope * float(previous.mean()), spread, slope / spread, n)


def fit_predictor(
    regressors: np.ndarray, correlation: np.ndarray, scores: np.ndarray, least: int
) -> tuple[np.ndarray, float] | None:
    """Regress the horizon's within-group ``scores`` on population-scale ``regressors`` (trials x columns).

    ``correlation`` is the regressors' population correlation matrix; with it the fitted weights
    give the prediction's population variance, hence its population correlation R with the
    outcome. R is shrunk by one standard error; the width is sqrt(1 - R**2). Returns the weights
    and the width, or None where there is nothing to trust (too few trials, nothing explained).
    """
    n, columns = regressors.shape
    if n < least:
        return None
    x = regressors - regressors.mean(axis=0)
    gc = scores - scores.mean()
    gram = x.T @ x
    if np.linalg.cond(gram) > 1e8:
        return None
    weights = np.linalg.solve(gram, x.T @ gc)
    residual = gc - x @ weights
    noise = float(residual @ residual) / (n - 1 - columns)
    explained = float(weights @ correlation @ weights)
    if explained <= 1e-12:
        return None
    spread = math.sqrt(explained + noise)
    fit = math.sqrt(explained) / spread
    trusted = shrink(fit, n, columns)
    return weights * (trusted / fit / spread), math.sqrt(1.0 - trusted * trusted)


class HermesPolicy(SchedulingPolicy):
    name = "hermes"

    def __init__(
        self,
        period: float | None = None,
        *,
        optimism: float = 1.0,
        ageing: float = 3.0,
        switch_cost: float | None = None,
        overhead_budget: float = 0.02,
        min_trials: int = 20,
        rung_factor: float = 2.0,
        momentum: bool = True,
        shortest_first: bool = True,
        cost_aware: bool = True,
        prior: bool = True,
        defer_behind: bool = True,
    ) -> None:
        """``period``: a fixed time-sharing turn in GPU seconds (None: learned; the module docstring gives the rest).

        ``optimism``: standard deviations added to a prediction; ``ageing``: round-robin cycles of
        waiting worth one standard deviation (0: no ageing); ``switch_cost``: GPU seconds a
        suspend and resume cost, the prior of the learned price (None: the engine's, see ``configure``);
        ``overhead_budget``: the share of training time switching after the first reports may take;
        ``min_trials``: trials a link or the horizon needs (half the known trials, if fewer);
        ``rung_factor``: growth of the steps between rungs (at least ``MIN_RUNG_FACTOR``); ``momentum``: predict
        from the latest change too (of standing into rung 1, the rise deeper), not the standing only;
        ``shortest_first``: order unmeasured trials by predicted first-report time (else by arrival);
        ``cost_aware``: less optimism for trials dearer than most (see "What a trial costs"); ``prior``: predict from
        the hyper-parameters too where a first report tells little (see "What the hyper-parameters say");
        ``defer_behind``: a trial clearly behind the others' median loses its optimism, and waits last
        where its prediction is below the average too (see "Trials clearly behind lose the benefit of
        the doubt").
        """
        super().__init__(60.0 if period is None else period)
        self._period_given = period is not None  # else a turn lasts one of the trial's own reports
        if not optimism >= 0:
            raise ValueError(f"optimism must be >= 0, got {optimism}")
        if not ageing >= 0:
            raise ValueError(f"ageing must be >= 0, got {ageing}")
        if switch_cost is not None and not switch_cost >= 0:
            raise ValueError(f"switch_cost must be >= 0, got {switch_cost}")
        if not 0 < overhead_budget < 1:
            raise ValueError(f"overhead_budget must be in (0, 1), got {overhead_budget}")
        if min_trials < FEWEST_TRIALS:
            raise ValueError(f"min_trials must be at least {FEWEST_TRIALS}, got {min_trials}")
        if not rung_factor >= MIN_RUNG_FACTOR:
            raise ValueError(f"rung_factor must be at least {MIN_RUNG_FACTOR} (closer rungs fall on the same whole "
                             f"steps and multiply the cost of a report), got {rung_factor}")
        self.optimism = optimism
        self.ageing = ageing
        self._switch_cost_given = switch_cost is not None  # else the engine's profile sets it
        self.switch_cost = DEFAULT_SWITCH_COST if switch_cost is None else switch_cost
        self.migration_cost = 0.0  # what a resume on another GPU adds to a switch, as the engine says (configure)
        self.overhead_budget = overhead_budget
        self.min_trials = int(min_trials)
        self.rung_factor = rung_factor
        self.momentum = bool(momentum)
        self.shortest_first = bool(shortest_first)
        self.cost_aware = bool(cost_aware)
        self.prior = bool(prior)
        self.defer_behind = bool(defer_behind)
        self._excess = expected_excess(self.optimism)  # the price, in widths, that buys exactly ``optimism``
        # What the policy has seen; state_dict saves it.
        self._first_step: int | None = None  # the first reported step, the unit of the rungs
        self._index: dict[str, int] = {}  # trial -> row of the per-trial lists below
        self._values: list[list[float]] = []  # row -> its value at rungs 0, 1, ...
        self._step_seconds: list[float] = []  # row -> GPU seconds per step, latest estimate (0: unknown)
        self._step_clean: list[bool] = []  # row -> whether that estimate came from two reports of one run
        self._crossed_run: list[int] = []  # row -> the run (trial.starts) in which it last reached a rung
        self._starts_seen: list[int] = []  # row -> trial.starts at its last report
        self._migrations_seen: list[int] = []  # row -> trial.migrations at its last report
        self._params: list[dict[str, Any]] = []  # row -> the trial's hyper-parameters
        self._first_seconds: list[float] = []  # row -> GPU seconds its first report took (0: none yet)
        self._durations_fitted_on = 0  # first reports the duration model was last fitted on
        self._owed_fit: tuple[int, int] | None = None  # (first reports, rows) of a fit not made yet
        self._age_rate = 0.0  # priority gained per second of waiting
        self._work = 0.0  # estimated GPU seconds to train every known trial to its budget
        self._switch_seen = [0.0, 0]  # GPU seconds that observed switches on one GPU cost, and how many
        self._migration_seen = [0.0, 0]  # the same of switches whose resume landed on another GPU
        self._noise_bins: dict[int, int] = {}  # NOISE_BINS * log2 of a report's squared scatter (scaled) -> count
        self._noise_anchor: float | None = None  # the first positive scatter: bins count from it (see _measure_noise)
        self._switch_price = self.switch_cost  # what a switch on one GPU costs, as of the last refresh (the prior till then)
        self._migration_price = 0.0  # what a resume on another GPU adds to that, as of the last refresh
        self._turn_price = self.switch_cost  # what ending a turn costs: a switch, and a migration as often as they come
        self._suspensions = 0  # switches so far, counting suspended trials' pending resumes
        self._cost_reference = 0.0  # GPU seconds of the mean known trial's whole budget, as of the last refresh
        self._behind = MedianStopper(min_trials=self.min_trials)  # who is clearly behind: never stopped
        self._judged_behind: set[str] = set()  # judged clearly behind: no optimism, last if predicted below 0
        # Derived from the above by _rebuild and _refit.
        self._live: dict[int, Trial] = {}  # row -> live record, read for the budgets; refilled after a restart
        self._rung_rows: list[list[int]] = []  # rung -> rows that reached it, in order
        self._rung_values: list[list[float]] = []  # rung -> their values, same order
        self._sorted: list[list[float]] = []  # rung -> values ascending, for ranks between refits
        self._rung_rises: list[list[float]] = []  # rung -> its rows' rise since the rung before (FIRST_RISE on)
        self._sorted_rises: list[list[float]] = []  # rung -> those rises ascending
        self._links: list[Link | None] = []  # rung k -> link from rung k - 1 (None: too few trials)
        self._predictors: list[Predictor] = []  # rung k < horizon -> prediction of the standing at the horizon
        self._frontier = NO_INFORMATION  # prediction for trials at or beyond the horizon
        self._prior: list[float] = []  # row -> score at the horizon predicted from its hyper-parameters ([]: none)
        self._prediction: dict[str, float] = {}  # measured trial -> predicted standing at the horizon
        self._priority: dict[str, float] = {}  # measured trial -> the same, optimistic
        self._durations = DurationModel()  # first-report seconds from the hyper-parameters
        self._predicted: list[float] = []  # row -> predicted first-report seconds (0: no trusted prediction)
        self._records_at_refit = 0
        self._records = 0
        self.order_version = 0

    # ------------------------------------------------------------------ reports
    def observe(self, trial: Trial, now: float) -> Verdict:
        row = self._row(trial)
        if self.defer_behind:
            verdict = self._behind.judge(trial)
            if verdict:
                self._judged_behind.add(trial.trial_id)
            elif verdict is False:  # clearly ahead of the others' median now: the judgement is revised
                self._judged_behind.discard(trial.trial_id)
        if self._first_step is None:
            self._first_step = max(trial.steps[0], 1)
        self._time_steps(row, trial)
        self._measure_noise(trial)
        values = self._values[row]
        crossed = False
        while not values or trial.step >= self._rung_step(len(values), trial.budget):
            previous_rung = self._rung_step(len(values) - 1, trial.budget) if values else -math.inf
            self._record(row, len(values), _rung_value(trial, previous_rung, self._noise_variance()))
            crossed = True
        if crossed:
            self._crossed_run[row] = trial.starts
            if self._records - self._records_at_refit >= max(1.0, REFIT_GROWTH * self._records):
                self._refit()
                self._refresh_budgets(now)
                self.order_version += 1  # every waiting trial was re-ranked, and ageing may be faster
            else:
                self._rank(trial.trial_id, row)
        return CONTINUE

    def _rung_step(self, k: int, budget: int) -> float:
        """The step of rung ``k`` for a trial of ``budget`` steps: a doubling, the last one cut at the budget."""
        if k and self._first_step * self.rung_factor ** (k - 1) >= budget:
            return math.inf  # the rung before already reached the budget
        return min(self._first_step * self.rung_factor ** k, budget)

    def _row(self, trial: Trial) -> int:
        row = self._index.get(trial.trial_id)
        if row is None:
            row = self._index[trial.trial_id] = len(self._values)
            self._values.append([])
            self._step_seconds.append(0.0)
            self._step_clean.append(False)
            self._crossed_run.append(-1)
            self._starts_seen.append(0)
            self._migrations_seen.append(0)
            self._params.append(dict(trial.params))
            self._first_seconds.append(0.0)
            self._durations.add(trial.params)
            self._predicted.append(0.0)
            if self.shortest_first:
                self._predict_first_report(row)
        self._live[row] = trial
        return row

    def _record(self, row: int, rung: int, value: float) -> None:
        self._values[row].append(value)
        while len(self._rung_rows) <= rung:
            self._rung_rows.append([])
            self._rung_values.append([])
            self._sorted.append([])
            self._rung_rises.append([])
            self._sorted_rises.append([])
        self._rung_rows[rung].append(row)
        self._rung_values[rung].append(value)
        insort(self._sorted[rung], value)
        if rung >= FIRST_RISE:
            rise = _rise(self._values[row], rung)
            self._rung_rises[rung].append(rise)
            insort(self._sorted_rises[rung], rise)
        self._records += 1

    def _time_steps(self, row: int, trial: Trial) -> None:
        """GPU seconds per step, from consecutive reports with no switch between them; and what switches cost.

        The first report also paid the trial's start, which costs about a switch. Two reports with a
        suspend and resume between them took the steps' time plus the switch: the excess is what
        that switch cost, whatever the engine, the device or the state size (see "Switch price").
        """
        resumed = trial.starts != self._starts_seen[row]
        migrated = trial.migrations != self._migrations_seen[row]
        self._starts_seen[row] = trial.starts
        self._migrations_seen[row] = trial.migrations
        if len(trial.steps) == 1:
            took = self._first_seconds[row] = trial.report_gpu_time[0]
            self._step_seconds[row] = max(took - self._switch_price, 0.1 * took) / max(trial.steps[0], 1)
            return
        took = trial.report_gpu_time[-1] - trial.report_gpu_time[-2]
        steps = max(trial.steps[-1] - trial.steps[-2], 1)
        if not resumed:
            self._step_seconds[row] = took / steps
            self._step_clean[row] = True
        elif self._step_clean[row]:  # a step time free of start-up, so the excess is the switch's alone
            seen = self._migration_seen if migrated else self._switch_seen
            seen[0] += max(took - steps * self._step_seconds[row], 0.0)
            seen[1] += 1

    def _measure_noise(self, trial: Trial) -> None:
        """Count the scatter of the middle one of the trial's last three reports about the chord of the other two.

        For reports ``y = curve + noise`` the residual's variance is the noise variance times
        ``1 + a**2 + (1 - a)**2`` (``a``: where the middle step lies between the other two), plus the curve's
        bend. The bend is large in the first epochs (LCBench: a scatter of 1-9 points of accuracy there,
        0.01-0.04 after epoch 8), so the pooled level is the median, kept in a histogram of log-spaced bins
        counted from the search's first scatter (so that a metric's scale moves no bin edge, and with it no
        decision); it is the noise that ``_rung_value`` weighs a stretch's trend against."""
        steps, scores = trial.steps, trial.scores
        if len(steps) < 3:
            return
        s0, s1, s2 = steps[-3], steps[-2], steps[-1]
        if not s0 < s1 < s2:  # a restore from an older checkpoint repeats steps
            return
        y0 = scores[-3]
        a = (s1 - s0) / (s2 - s0)
        residual = scores[-2] - (y0 + a * (scores[-1] - y0))
        if not math.isfinite(residual):  # a score was not finite (0 < a < 1: infinities never cancel)
            return
        scaled = residual * residual / (1.0 + a * a + (1.0 - a) * (1.0 - a))
        if scaled <= 0:
            key = -NOISE_RANGE
        elif math.isfinite(scaled):
            if self._noise_anchor is None:
                self._noise_anchor = scaled  # bins count from it, so that a metric's scale moves no bin edge
            # Unbounded: an odd first scatter (a diverged trial's, one at float precision) crowds no others into an
            # end bin, where bins of a bounded range would have held them
            key = math.floor(NOISE_BINS * (math.log2(scaled) - math.log2(self._noise_anchor)))
        else:
            key = NOISE_RANGE
        self._noise_bins[key] = self._noise_bins.get(key, 0) + 1

    def _noise_variance(self) -> float:
        """Variance of a report about its trial's curve: the median scatter over the search, over the median of a
        chi-squared variable with one degree of freedom (infinite before ``FEWEST_TRIALS`` scatters)."""
        bins = self._noise_bins
        count = sum(bins.values())
        if count < FEWEST_TRIALS:
            return math.inf
        seen = 0
        for key in sorted(bins):
            seen += bins[key]
            if 2 * seen >= count:
                if abs(key) == NOISE_RANGE:
                    return 0.0 if key < 0 else math.inf
                doublings = math.log2(self._noise_anchor or 1.0) + (key + 0.5) / NOISE_BINS
                return math.inf if doublings > 1023 else 2.0**doublings / CHI2_MEDIAN
        raise AssertionError("unreachable: the bins sum to count")

    # ------------------------------------------------------------------ the model
    def _refit(self) -> None:
        """Refit links and predictors on every rung record, and rank every measured trial again."""
        self._records_at_refit = self._records
        rungs = len(self._rung_rows)
        standing = np.full((rungs, len(self._values)), np.nan)  # rung x row -> population standing
        rises = np.zeros((rungs, len(self._values)))  # rung x row -> normal score of its rise among the rung's trials
        deepest = np.full(len(self._values), -1)  # row -> the deepest rung it reached (-1: none yet)
        groups = []
        self._links = [None] * rungs
        horizon = 0
        least = min(self.min_trials, max(FEWEST_TRIALS, len(self._index) // 2))  # see "The priority"
        for k in range(rungs):
            members = np.array(self._rung_rows[k], dtype=int)
            scores = normal_scores(np.array(self._rung_values[k], dtype=float))
            groups.append((members, scores))
            deepest[members] = k
            if k == 0:
                standing[0, members] = scores
                continue
            if k >= FIRST_RISE:
                rises[k, members] = normal_scores(np.array(self._rung_rises[k], dtype=float))
            previous = standing[k - 1, members]
            link = self._links[k] = fit_link(previous, scores, least)
            if link is None:
                standing[k, members] = previous  # too few trials got here to compare: keep the last standing
            else:
                standing[k, members] = (scores - link.intercept) / link.spread
                horizon = k
        self._predictors = []
        self._frontier = NO_INFORMATION
        self._prior = []
        if horizon:
            members, scores = groups[horizon]
            held_out = self._fit_prior(members, scores)
            self._predictors = [self._fit_predictor(k, members, scores, standing, rises, held_out, least)
                                for k in range(horizon)]
            link = self._links[horizon]
            trusted = max(0.0, shrink(link.correlation, link.trials, 1))
            self._frontier = Predictor(trusted, 0.0, math.sqrt(1.0 - trusted * trusted))
        rows = np.flatnonzero(deepest >= 0)
        k = deepest[rows]
        table = [*self._predictors, self._frontier]
        pick = np.minimum(k, len(table) - 1)
        w_now = np.array([p.now for p in table])[pick]
        w_before = np.array([p.before for p in table])[pick]
        width = np.array([p.width for p in table])[pick]
        w_prior = np.array([p.prior for p in table])[pick]
        w_rise = np.array([p.rise for p in table])[pick]
        before = np.where(k > 0, standing[np.maximum(k - 1, 0), rows], 0.0)
        predicted = (w_now * standing[k, rows] + w_before * before + w_prior * self._prior_of(rows)
                     + w_rise * rises[k, rows])
        optimistic = predicted + width * self._offsets(rows.tolist(), width)
        ids = list(self._index)
        names = [ids[row] for row in rows.tolist()]
        self._prediction = dict(zip(names, predicted.tolist()))
        self._priority = dict(zip(names, optimistic.tolist()))
        measured = self._rung_rows[0]
        if self.shortest_first and len(measured) not in (len(self._index), self._durations_fitted_on):
            self._fit_durations(measured)  # some trials still wait for their first report

    def _fit_predictor(self, k: int, members: np.ndarray, scores: np.ndarray, standing: np.ndarray,
                       rises: np.ndarray, held_out: np.ndarray | None, least: int) -> Predictor:
        """Predict the horizon's ``scores`` of its ``members`` from rung ``k``: the standing there, the latest
        change (where a link leads into rung ``k``; else the standings are one): at rung 1 the standing
        before, deeper the rise since the rung before (see "The priority"), and the prior, if any.

        The regressors' population correlations are read over every trial at rung ``k``, but that of the two
        standings, which the link into rung ``k`` gives without the selection of who went further."""
        rows = np.array(self._rung_rows[k], dtype=int)
        names, fitted_on, population = ["now"], [standing[k, members]], [standing[k, rows]]
        link = self._links[k] if k else None
        change = link is not None and self.momentum
        if change and k < FIRST_RISE:
            names.append("before")
            fitted_on.append(standing[0, members])
            population.append(standing[0, rows])
        elif change:
            names.append("rise")
            fitted_on.append(rises[k, members])
            population.append(rises[k, rows])
        if held_out is not None:
            names.append("prior")
            fitted_on.append(held_out)
            population.append(self._prior_of(rows))
        correlation = np.atleast_2d(np.nan_to_num(np.corrcoef(np.stack(population))))  # a constant column: 0
        np.fill_diagonal(correlation, 1.0)
        if change and k < FIRST_RISE:
            correlation[0, 1] = correlation[1, 0] = link.correlation
        fitted = fit_predictor(np.stack(fitted_on, axis=1), correlation, scores, least)
        if fitted is None:
            return NO_INFORMATION
        weights, width = fitted
        weight = dict(zip(names, weights.tolist()))
        return Predictor(weight["now"], weight.get("before", 0.0), width, weight.get("prior", 0.0),
                         weight.get("rise", 0.0))

    def _fit_prior(self, members: np.ndarray, scores: np.ndarray) -> np.ndarray | None:
        """The horizon's ``scores`` of its ``members`` regressed on their hyper-parameters (see "What the
        hyper-parameters say"): their held-out predictions, and every trial's in ``_prior``; None, and no
        prior, unless it predicts held-out trials better than chance.

        The prior is put on the standings' scale (population mean 0, variance 1 over the measured trials):
        ``fit_predictor`` counts its regressors' variance as 1, and a prediction's variance is only the share
        of the outcome it explains, so on its own scale a weak but calibrated prior (weight near 1) would
        claim nearly full trust."""
        fitted = self._durations.regress(members.tolist(), scores) if self.prior else None
        if fitted is None:
            return None
        held_out, everyone = fitted
        measured = everyone[self._rung_rows[0]]
        if measured.std() == 0:
            return None
        centre, scale = float(measured.mean()), float(measured.std())
        self._prior = ((everyone - centre) / scale).tolist()
        return (held_out - centre) / scale

    def _prior_of(self, rows: np.ndarray) -> np.ndarray:
        """The rows' prior predictions (``_prior_of_row``)."""
        return np.array([self._prior_of_row(r) for r in rows.tolist()])

    def _prior_of_row(self, row: int) -> float:
        """The row's prior prediction, 0 (the population mean) where there is none (a row newer than the fit)."""
        prior = self._prior
        return prior[row] if row < len(prior) else 0.0

    def _predict_first_report(self, row: int) -> None:
        """A new trial's predicted first-report seconds.

        ``_refit`` keeps the model current only while trials wait for their first report; when
        this one is the only such trial, the model is refitted first (no other trial's order moves)."""
        measured = self._rung_rows[0] if self._rung_rows else []
        if len(measured) == row and len(measured) != self._durations_fitted_on:
            self._fit_durations(measured)
        elif self._fitted_durations().trusted:
            self._predicted[row] = float(self._durations.predict([row])[0])

    def _fit_durations(self, measured: list[int]) -> None:
        """Fit the first-report durations on the ``measured`` rows (the first of ``_rung_rows[0]``), and predict
        those of the others: when a prediction is next read (``_fitted_durations``). A fit that nothing reads
        before the next one costs nothing: recovery, which replays a log without ranking, owed one per trial
        (a fit reads every trial measured so far: quadratic in the trials, minutes at 10^4)."""
        self._durations_fitted_on = len(measured)
        self._owed_fit = (len(measured), len(self._index))

    def _fitted_durations(self) -> DurationModel:
        """The duration model, with ``_predicted``, once the fit owed is made; read them through it."""
        if self._owed_fit is not None:
            (fitted_on, rows), self._owed_fit = self._owed_fit, None
            measured = self._rung_rows[0][:fitted_on]
            predicted = np.zeros(rows)
            if self._durations.fit(measured, [self._first_seconds[row] for row in measured]):
                waiting = np.ones(rows, dtype=bool)
                waiting[measured] = False
                unmeasured = np.flatnonzero(waiting)
                predicted[unmeasured] = self._durations.predict(unmeasured)
            self._predicted[:rows] = predicted.tolist()
        return self._durations

    def _rank(self, trial_id: str, row: int) -> None:
        """Rank one trial that reached a rung, with the links and predictors of the last refit."""
        values = self._values[row]
        k = len(values) - 1
        predictor = self._predictors[k] if k < len(self._predictors) else self._frontier
        before = self._standing(values, k - 1) if k else 0.0
        width = predictor.width
        offset = self._offset(row, width)
        mean = predictor.now * self._standing(values, k) + predictor.before * before
        if predictor.prior:
            mean += predictor.prior * self._prior_of_row(row)
        if predictor.rise:
            mean += predictor.rise * _score_among(self._sorted_rises[k], _rise(values, k))
        self._prediction[trial_id] = mean
        self._priority[trial_id] = mean + width * offset

    def _offsets(self, rows: list[int], width: np.ndarray) -> np.ndarray:
        """Widths of optimism added to each row's prediction: ``optimism``, less for a trial dearer than most.

        See "What a trial costs": the reservation value of the trial as a prize whose price is its
        remaining GPU seconds, where the prediction carries information, and never above ``optimism``."""
        plain = np.full(len(rows), self.optimism)
        reference = self._cost_reference
        if not self.cost_aware or reference <= 0:
            return plain
        remaining = np.array([self._remaining_seconds(r) for r in rows])
        informed = width < 1.0 - 1e-9
        price = self._excess * remaining / reference / np.maximum(width, 1e-9)
        return np.where(informed, np.minimum(plain, reservation_offset(price)), plain)

    def _offset(self, row: int, width: float) -> float:
        """``_offsets`` of one row, as ``_rank`` asks at every rung between refits, without numpy's cost per call."""
        reference = self._cost_reference
        if not self.cost_aware or reference <= 0 or width >= 1.0 - 1e-9:
            return self.optimism
        price = self._excess * self._remaining_seconds(row) / reference / max(width, 1e-9)
        return min(self.optimism, reservation_offset_of(price))

    def _remaining_seconds(self, row: int) -> float:
        """GPU seconds the row's trial has left at its observed step time (the mean trial's budget if unknown)."""
        trial, step_seconds = self._live.get(row), self._step_seconds[row]
        if trial is None or step_seconds <= 0:
            return self._cost_reference
        return (trial.budget - trial.step) * step_seconds

    def _standing(self, values: list[float], k: int) -> float:
        """Population standing at rung ``k`` of a trial whose rung values are ``values``.

        Where no link leads into a rung (too few trials reached it), the standing is that of the
        rung before, as in ``_refit``; so only the rung that sets it is ranked."""
        links = self._links
        while k and (k >= len(links) or links[k] is None):
            k -= 1
        score = _score_among(self._sorted[k], values[k])
        if k == 0:
            return score
        return (score - links[k].intercept) / links[k].spread

    def _refresh_budgets(self, now: float) -> None:
        """Ageing rate and switching budget, from the live records of the known trials (one pass).

        Switches so far: every run ended (or is ending) in a suspension, except a run still going
        and the last run of a trial that ended; the pass counts those out of all runs."""
        step_seconds = self._step_seconds
        known = len(step_seconds) - step_seconds.count(0.0)  # rows with a step time (they are never negative)
        mean_step = sum(step_seconds) / known if known else 0.0
        runs = holding = ended = not_suspended = resumes = migrations = 0
        gpu = work = 0.0
        for row, trial in self._live.items():
            starts, since = trial.starts, trial.running_since
            runs += starts
            resumes += max(starts - 1, 0)
            migrations += trial.migrations
            gpu += trial.gpu_time if since is None else trial.gpu_time + now - since
            work += trial.budget * (step_seconds[row] or mean_step)
            if trial.waiting:
                continue
            state = trial.state
            if state is RUNNING:
                holding += 1
                not_suspended += 1
            elif state is SUSPENDING:
                holding += 1
            else:  # ended: its last run, if it ran, ended in an exit
                ended += 1
                not_suspended += starts > 0
        self._work = work
        self._cost_reference = work / len(self._live) if self._live else 0.0
        self._suspensions = runs - not_suspended
        total, count = self._switch_seen
        self._switch_price = (self.switch_cost + total) / (1 + count)  # the prior counts as one switch
        total, count = self._migration_seen
        migrated = (self.switch_cost + self.migration_cost + total) / (1 + count)
        self._migration_price = max(migrated - self._switch_price, 0.0)
        share = migrations / (1 + resumes)  # the prior, one resume on its own GPU (resumes go there where they can)
        self._turn_price = self._switch_price + share * self._migration_price
        active = len(self._live) - ended
        if holding and runs and gpu > 0 and self.ageing > 0:
            cycle = active / holding * gpu / runs  # trials per GPU x mean run: a round-robin cycle
            self._age_rate = 1.0 / (self.ageing * cycle)

    # ------------------------------------------------------------------ decisions
    def priority(self, trial: Trial, now: float) -> float:
        base = self._priority.get(trial.trial_id)
        if base is None:
            row = self._index.get(trial.trial_id)
            if row is None:
                row = self._row(trial)  # known from now on: its budget counts in the work estimate
            self._fitted_durations()
            return UNMEASURED - trial.submitted_at - self._predicted[row]
        if trial.trial_id in self._judged_behind:  # no benefit of the doubt: no optimism
            predicted = self._prediction[trial.trial_id]
            base = min(base, predicted) - (DEFERRED if predicted < 0 else 0.0)  # last where the prediction agrees
        if trial.running_since is None:
            informed = trial.starts > 1 or bool(self._predictors)  # see "Ageing": first turns tie until the first links
            waiting_since = trial.idle_since if informed else trial.submitted_at
            return base + (now - waiting_since) * self._age_rate
        return base

    def migration_penalty(self, trial: Trial, now: float) -> float:
        return self._migration_price * self._age_rate  # a migration's GPU seconds, priced as a wait

    def turn_over(self, trial: Trial, now: float) -> bool:
        row = self._index.get(trial.trial_id)
        if trial.running_since is None or row is None:
            return False
        run = now - trial.running_since
        cost = self._turn_price
        if run < cost:
            return False  # a switch would cost more than the run it ends
        remaining = (trial.budget - trial.step) * self._step_seconds[row]
        if remaining < cost:
            return False  # finishing costs less than the switch: nobody waits less for it
        if len(self._values[row]) == 1 and self._crossed_run[row] == trial.starts:
            return True  # its first report: the switch costs less than the rest of it, which new trials would wait for
        if remaining * self.overhead_budget < cost:
            return False  # finishing costs about as little as switching
        if (self._suspensions + 1) * cost > self.overhead_budget * self._work:
            return False  # the switching budget is spent
        if self._crossed_run[row] == trial.starts:
            return True  # it reached a rung in this run: its priority changed
        turn = self.period if self._period_given else self._step_seconds[row] * self._first_step  # one own report
        return run >= max(turn, cost / self.overhead_budget)

    # ------------------------------------------------------------------ restart
    def configure(self, profile: ExecutionProfile) -> None:
        self.migration_cost = profile.migration_cost
        if not self._switch_cost_given:
            self.switch_cost = profile.switch_cost
            if not self._switch_seen[1]:
                self._switch_price = self.switch_cost
        if not self._migration_seen[1]:
            self._migration_price = self.migration_cost
        self._turn_price = self._switch_price  # until resumes are seen (they go to their own GPU where they can)

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_step": self._first_step,
            "trials": list(self._index),
            "values": [[_json_number(v) for v in values] for values in self._values],
            "rungs": [list(rows) for rows in self._rung_rows],  # arrival order at each rung breaks ties
            "step_seconds": list(self._step_seconds),
            "step_clean": list(self._step_clean),
            "crossed_run": list(self._crossed_run),
            "starts_seen": list(self._starts_seen),
            "migrations_seen": list(self._migrations_seen),
            "params": [dict(params) for params in self._params],
            "first_seconds": list(self._first_seconds),
            "durations_fitted_on": self._durations_fitted_on,
            "age_rate": self._age_rate,
            "work": self._work,
            "suspensions": self._suspensions,
            "switch_seen": list(self._switch_seen),
            "switch_price": self._switch_price,
            "migration_seen": list(self._migration_seen),
            "migration_price": self._migration_price,
            "turn_price": self._turn_price,
            "noise_bins": {str(key): count for key, count in self._noise_bins.items()},
            "noise_anchor": self._noise_anchor,
            "cost_reference": self._cost_reference,
            # the last fit and the ranks made with it, so that a restart decides exactly as before
            "records_at_refit": self._records_at_refit,
            "links": [None if link is None else [link.intercept, link.spread, link.correlation, link.trials]
                      for link in self._links],
            "predictors": [[p.now, p.before, p.width, p.prior, p.rise] for p in self._predictors],
            "frontier": [self._frontier.now, self._frontier.before, self._frontier.width, self._frontier.prior,
                         self._frontier.rise],
            "prior": list(self._prior),
            "prediction": dict(self._prediction),
            "priority": dict(self._priority),
            "behind": self._behind.state_dict(),
            "judged_behind": sorted(self._judged_behind),
        }

    def attach(self, trials: Mapping[str, Trial]) -> None:
        """Refill the live records of the known trials, in the order they first reported."""
        self._live = {row: trials[trial_id] for trial_id, row in sorted(self._index.items(), key=lambda item: item[1])
                      if trial_id in trials}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._first_step = state["first_step"]
        self._index = {trial_id: row for row, trial_id in enumerate(state["trials"])}
        self._values = [[-math.inf if v is None else float(v) for v in values] for values in state["values"]]
        self._step_seconds = [float(s) for s in state["step_seconds"]]
        self._step_clean = [bool(c) for c in state["step_clean"]]
        self._crossed_run = [int(r) for r in state["crossed_run"]]
        self._starts_seen = [int(s) for s in state["starts_seen"]]
        self._migrations_seen = [int(m) for m in state.get("migrations_seen", [0] * len(self._starts_seen))]
        self._params = [dict(params) for params in state["params"]]
        self._first_seconds = [float(s) for s in state["first_seconds"]]
        self._age_rate = float(state["age_rate"])
        self.order_version += 1
        self._work = float(state["work"])
        self._suspensions = int(state["suspensions"])
        self._switch_seen = [float(state["switch_seen"][0]), int(state["switch_seen"][1])]
        self._switch_price = float(state["switch_price"])
        seen = state.get("migration_seen", [0.0, 0])  # this and the two below: absent from states saved before
        self._migration_seen = [float(seen[0]), int(seen[1])]
        self._migration_price = float(state.get("migration_price", 0.0))
        self._turn_price = float(state.get("turn_price", self._switch_price))
        bins = state.get("noise_bins", {})  # absent from states saved before it existed
        self._noise_bins = {int(key): int(count) for key, count in bins.items()}
        self._noise_anchor = state.get("noise_anchor", 1.0 if bins else None)  # states saved before: bins from 1
        self._cost_reference = float(state.get("cost_reference", 0.0))  # absent from states saved before it existed
        self._live = {}
        self._rung_rows = [[int(row) for row in rows] for rows in state["rungs"]]
        self._rung_values = [[self._values[row][rung] for row in rows] for rung, rows in enumerate(self._rung_rows)]
        self._sorted = [sorted(values) for values in self._rung_values]
        self._rung_rises = [[_rise(self._values[row], rung) for row in rows] if rung >= FIRST_RISE else []
                            for rung, rows in enumerate(self._rung_rows)]
        self._sorted_rises = [sorted(rises) for rises in self._rung_rises]
        self._records = sum(len(rows) for rows in self._rung_rows)
        self._records_at_refit = int(state["records_at_refit"])
        self._links = [None if link is None else Link(float(link[0]), float(link[1]), float(link[2]), int(link[3]))
                       for link in state["links"]]
        self._predictors = [Predictor(*map(float, p)) for p in state["predictors"]]
        if self._predictors and len(state["predictors"][0]) == 3:  # saved when the prior was rung 0's ``before``
            first = self._predictors[0]
            self._predictors[0] = Predictor(first.now, 0.0, first.width, first.before)
        self._frontier = Predictor(*map(float, state["frontier"]))
        self._prior = [float(p) for p in state.get("prior", [])]  # absent from states saved before it existed
        self._priority = {trial_id: float(value) for trial_id, value in state["priority"].items()}
        # absent from states saved before it existed: their optimistic standings stand in for it
        self._prediction = {trial_id: float(value)
                            for trial_id, value in state.get("prediction", state["priority"]).items()}
        self._behind = MedianStopper(min_trials=self.min_trials)
        if "behind" in state:  # absent from states saved before it existed
            self._behind.load_state_dict(state["behind"])
        self._judged_behind = set(state.get("judged_behind", []))
        self._durations = DurationModel()
        for params in self._params:
            self._durations.add(params)
        self._durations_fitted_on = fitted_on = int(state["durations_fitted_on"])
        self._owed_fit = None
        self._predicted = [0.0] * len(self._params)
        if fitted_on:  # the same fit as before the restart: on the same first reports
            self._fit_durations(self._rung_rows[0][:fitted_on])


def _rung_value(trial: Trial, after: float, noise: float) -> float:
    """The trial's level at its last report, from its reports after step ``after`` (at most ``WINDOW``).

    The stretch's mean, moved towards the end of its least-squares line as far as the trend stands out of
    the ``noise`` (variance of one report): by ``max(0, 1 - v / t**2)`` of the way, where ``t`` is the
    estimated rise from the stretch's mean to its end and ``v`` that estimate's variance. That weight
    minimises the expected squared error of mean plus weighted trend (positive-part James-Stein). See
    "The value at a rung" for why the mean alone lags.
    """
    steps: list[float] = []
    scores: list[float] = []
    for step, score in zip(reversed(trial.steps), reversed(trial.scores)):
        if step <= after or len(steps) == WINDOW:
            break
        steps.append(step)
        scores.append(score)
    n = len(scores)
    try:
        total = math.fsum(scores)
    except OverflowError:  # finite scores whose sum is not (a metric that blew up to 1e308): their mean, no trend
        return math.fsum(score / n for score in scores)
    if not math.isfinite(total):
        return -math.inf
    mean = total / n
    if n < 2 or not math.isfinite(noise):
        return mean
    mean_step = math.fsum(steps) / n
    sxx = math.fsum((x - mean_step) ** 2 for x in steps)
    if sxx <= 0:
        return mean
    try:
        slope = math.fsum((x - mean_step) * (y - mean) for x, y in zip(steps, scores)) / sxx
    except (OverflowError, ValueError):  # products past the float range, of both signs: no trend to measure
        return mean
    lead = steps[0] - mean_step  # from the stretch's centre to its last report
    rise = slope * lead
    if rise * rise == 0:  # no trend, or one too small to square (below 1e-154): the mean is where it stands
        return mean
    weight = max(0.0, 1.0 - noise * lead * lead / sxx / (rise * rise))
    value = mean + weight * rise
    return value if math.isfinite(value) else mean  # a trend past the float range (near 1e308) is none to trust


def _score_among(ordered: list[float], value: float) -> float:
    """The normal score of ``value``'s mid-rank in ``ordered`` (ascending, holding it), as ``normal_scores`` gives
    it at a refit: a trial ranked between refits with binary searches."""
    middle = (bisect_left(ordered, value) + bisect_right(ordered, value) - 1) / 2
    return _inverse_normal((middle + 0.5) / len(ordered)) if len(ordered) > 1 else 0.0


def _rise(values: list[float], rung: int) -> float:
    """How far a trial's value rose from rung ``rung - 1`` to ``rung`` (-inf where it diverged)."""
    rise = values[rung] - values[rung - 1]
    return rise if not math.isnan(rise) else -math.inf


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None
