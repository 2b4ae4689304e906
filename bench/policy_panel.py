"""The policy panel: fifo, asha, hyperband and hermes (alone and with a stopper) on every shipped trace.

    python bench/policy_panel.py            # 4 and 16 GPUs, 10 seeds, warm and process costs (a few minutes)
    python bench/policy_panel.py --quick    # 4 GPUs, 3 seeds, warm costs: for iterating on a policy

Every policy replays the same random arrival orders (seeds 0..K-1) of every trace in ``data/``.
Per trace, cluster and cost profile the table gives, for each policy: in how many seeds the
trace's final-best trial was fully trained; time to best and time to target as speed-ups over
FIFO, the mean (FIFO's mean over the policy's, over the seeds where both got there) and the worst
seed (FIFO's time over the policy's in the same seed; 0 where the policy never got there); the
mean time to first feedback (hours, and its speed-up over FIFO); and the switching overhead.
A policy named ``hermes+median`` is hermes with the median early stopper composed. The ``oracle``
line is the most any policy can gain over FIFO: a clairvoyant oracle that trains the final-best
trial (or the quickest trial on target) first, alone on a GPU. The ``sweep first`` line is the
most a policy gains (mean and worst seed) if it gives every trial its first report before training
any deeper, as first feedback asks, even if it knows the winner then. The ``halving*`` line is a
reference, not a bound: successive halving that knows at every rung how many trials to keep
(``halving_in_hindsight``), as if Hyperband's share kept per rung were set in hindsight to just keep
the winner. The last lines check hermes against the targets of issue 14 (warm costs, 4 GPUs), and
say which no policy can meet.
``--trials N`` judges small searches instead: in each seed, N trials drawn from the trace (seeded
by the seed), the oracle's figures over the same draws; a draw of failed trials only has its last one
swapped for a finished trial, drawn by the same seed, so every search has a best to reach.
``--noise SHARE`` judges the policies on noisy metrics: every report but a trial's last scatters
around its recorded curve by SHARE times the spread of the trace's final metrics (``noisy``).
``--epochs N`` judges other searches: every trial's budget cut at N epochs, so the final metric, the
best trial and the target are those at epoch N (``cut``). ``--traces`` chooses among the shipped
traces, or judges any search recorded in the trace format: ``--traces path/to/search.csv:max``
(``:min`` for a metric that falls as it improves); the same file may be judged both ways
(``a.csv:max,a.csv:min``), each a block of its own. ``--json PATH`` also writes every block and every
per-seed figure, each with its trace, direction, cluster size and costs (a figure that is no number as null).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from hermes.cli import listed, number_type, positive_int
from hermes.errors import TraceError
from hermes.policies import policy_class, stopper_class
from hermes.sim.compare import Setting, run_one
from hermes.sim.costs import PROFILES, SwitchCosts
from hermes.sim.trace import Trace, TraceTrial, load_trace

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data")
TRACES = (  # every trace in data/ and the direction of its metric (data/README.md)
    ("nasbench_nlp_wt2", "min"),
    ("lcbench_189908", "max"),
    ("lcbench_34539", "max"),
    ("lcbench_146212", "max"),
    ("lcbench_167104", "max"),
    ("lcbench_168330", "max"),
    ("lcbench_189866", "max"),
    ("lcbench_189873", "max"),
    ("nb301_cifar10_panel", "max"),
    ("digits_mlp", "max"),
)
POLICIES = ("fifo", "asha", "hyperband", "hermes", "hermes+median")
GPUS_PER_NODE = 8  # as `hermes simulate`: 16 GPUs are two nodes, so migrations may cross nodes


@dataclass(frozen=True, slots=True)
class Run:
    """The figures of one simulated run."""

    best: float | None
    target: float | None
    first_feedback: float
    overhead: float


# A trace to judge: a shipped trace's name or a trace file's absolute path, and the direction of its metric.
TraceKey = tuple[str, str]
# A block of the panel: the trace, the cluster size and the cost profile.
BlockKey = tuple[str, str, int, str]

_traces: dict[tuple[str, str, float, int | None], Trace] = {}  # per process: each trace is read once


def noisy(trace: Trace, share: float) -> Trace:
    """``trace`` with every report but each trial's last moved by a normal scatter of ``share`` times the
    spread of the final metrics, drawn once per trace (seeded by its file name).

    Recorded curves are nearly smooth (LCBench: 0.01-0.04 points of accuracy from epoch to epoch
    after the first few), while a validation metric on a small set, or a training loss per batch,
    scatters; this judges how a policy ranks through that. The last report is kept, so the final
    best and the targets stay where they were."""
    finals = [t.metrics[-1] for t in trace.trials if t.metrics and math.isfinite(t.metrics[-1])]
    scale = share * statistics.pstdev(finals)
    draw = random.Random(os.path.basename(trace.path))
    return Trace(trace.path, trace.mode, tuple(
        dataclasses.replace(t, metrics=tuple(m + draw.gauss(0.0, scale) for m in t.metrics[:-1]) + t.metrics[-1:])
        for t in trace.trials))


def cut(trace: Trace, epochs: int) -> Trace:
    """``trace`` with every trial's budget cut at ``epochs``: another search, whose final ranking is that at
    the cut. On LCBench the final best of 52 epochs is a late riser; at 12 or 26 other trials win."""
    return Trace(f"{trace.path}@{epochs}", trace.mode, tuple(
        dataclasses.replace(t, metrics=t.metrics[:epochs], seconds=t.seconds[:epochs],
                            diverged=t.diverged and t.epochs <= epochs)  # one that failed later finishes at the cut
        for t in trace.trials))


def chosen_traces(entries: str) -> list[TraceKey]:
    """An argparse type: the traces named in ``entries`` (comma-separated), each a shipped trace's name or
    ``PATH:max`` / ``PATH:min`` of any trace file, so that a search that is not in data/ is judged alike; one
    named twice is judged once."""
    shipped, chosen = dict(TRACES), []
    for entry in entries.split(","):
        path, colon, mode = entry.rpartition(":")
        if entry in shipped:
            chosen.append((entry, shipped[entry]))
        elif colon and mode in ("max", "min") and os.path.isfile(path):
            chosen.append((os.path.abspath(path), mode))
        else:
            raise argparse.ArgumentTypeError(f"{entry!r} is no shipped trace ({', '.join(shipped)}) and no trace "
                                             "file given as PATH:max or PATH:min")
    return list(dict.fromkeys(chosen))


def trace_label(name: str) -> str:
    """How the panel names a trace: a shipped one by its name, a file by its name without the extension."""
    return os.path.splitext(os.path.basename(name))[0]


def trace_labels(traces: list[TraceKey]) -> dict[TraceKey, str]:
    """Each trace's ``trace_label``, with its direction (``t1:min``) where another trace has the same label, and
    its whole name or path too where that is still not enough: no two blocks of one panel look alike."""
    short = {key: trace_label(key[0]) for key in traces}
    directed = {key: f"{short[key]}:{key[1]}" for key in traces}
    shared, shared_directed = Counter(short.values()), Counter(directed.values())
    return {key: short[key] if shared[short[key]] == 1 else directed[key] if shared_directed[directed[key]] == 1
            else f"{key[0]}:{key[1]}" for key in traces}


def _trace(name: str, mode: str, trials: int | None = None, seed: int = 0, noise: float = 0.0,
           epochs: int | None = None) -> Trace:
    """The shipped trace ``name``, or the trace file at the absolute path ``name`` (``epochs``: ``cut``; ``noise``:
    ``noisy``), or (``trials``) the search of that many of its trials that ``seed`` draws, with at least one
    finished trial. TraceError for a file that is no valid trace, or has no finished trial."""
    key = (name, mode, noise, epochs)
    if key not in _traces:
        loaded = load_trace(name if os.path.isabs(name) else os.path.join(DATA, f"{name}.csv"), mode)
        loaded.best_finals()  # refuses a search with no finished trial, which has no best to reach
        loaded = cut(loaded, epochs) if epochs else loaded
        _traces[key] = noisy(loaded, noise) if noise else loaded
    full = _traces[key]
    if trials is None or trials >= len(full.trials):
        return full
    draw = random.Random(seed)
    chosen = draw.sample(full.trials, trials)
    if all(t.diverged for t in chosen):  # no best to reach: a finished trial, drawn by the same seed, takes a place
        chosen[-1] = draw.choice([t for t in full.trials if not t.diverged])
    return Trace(full.path, mode, tuple(chosen))


def _run(job: tuple[str, str, str, int, int, str, int | None, float, int | None]) -> Run:
    name, mode, entry, seed, gpus, profile, trials, noise, epochs = job
    policy, _, stopper = entry.partition("+")  # "hermes+median": the policy with an early stopper composed
    setting = Setting(
        gpus=gpus, nodes=math.ceil(gpus / GPUS_PER_NODE), stopper=stopper or None, costs=SwitchCosts.profile(profile)
    )
    result = run_one(_trace(name, mode, trials, seed, noise, epochs), policy, seed, setting)
    return Run(result.time_to_best_s, result.time_to_target_s, result.mean_first_feedback_s, result.overhead_fraction)


def clairvoyant(trace: Trace) -> tuple[float, float]:
    """GPU seconds in which an oracle has the final best (any one tied for it), and a trial on target, fully trained.

    It trains the one trial first, alone on a GPU, so no policy that schedules this trace can do
    better: FIFO's time over these seconds is the most any policy can gain over FIFO here."""
    return min(sum(t.seconds) for t in trace.best_finals()), min(sum(t.seconds) for t in _on_target(trace))


def _on_target(trace: Trace) -> list[TraceTrial]:
    """The trials whose final metric is within the panel's target tolerance of the best."""
    tolerance, best = Setting(gpus=1).target, trace.best_final()
    return [t for t in trace.trials if not t.diverged and tolerance.within(t.metrics[-1], best.metrics[-1])]


def sweep_first(trace: Trace, gpus: int) -> tuple[float, float]:
    """Seconds before which a policy that sweeps first cannot have the final best, and a trial on
    target, fully trained.

    Sweeping first means that no trial trains past its first report while another trial's first
    report has not started, as a policy must to give first feedback soon (hermes does). The last
    first report starts once all but at most ``gpus`` of them are done, so no sooner than their total
    over ``gpus`` less the longest one; only then, and once its own first report is done, may the trial
    train on, for the rest of its budget. Even knowing which trial ends best, such a policy gains at most
    FIFO's time over this bound."""
    firsts = [t.seconds[0] for t in trace.trials if t.seconds]
    swept = max(sum(firsts) / gpus - max(firsts), 0.0)

    def trained(trial: TraceTrial) -> float:
        return max(swept, trial.seconds[0]) + sum(trial.seconds[1:])

    return min(map(trained, trace.best_finals())), min(trained(t) for t in _on_target(trace))


def halving_in_hindsight(trace: Trace, gpus: int) -> tuple[float, float]:
    """Seconds in which successive halving that knows where to cut has the final best, and a trial on
    target, fully trained: a reference for the rung-based policies, not a bound on hermes.

    At every doubling rung (epochs 1, 2, 4, ... below the kept trial's budget) it keeps exactly the
    trials ahead of the one it must keep and trains them to the next rung; the kept trial trains to its
    end with those still ahead of it at its last rung. Each stretch between rungs ends when its work,
    packed perfectly on ``gpus``, is done, or its longest trial is, as synchronous halving waits for it.
    Successive halving (Hyperband's brackets) keeps a fixed share at each rung instead, which must be at
    least this to keep the trial. Hermes ranks rather than cuts (a trial behind waits, it is not
    stopped), so it can do better."""
    sign = 1.0 if trace.mode == "max" else -1.0

    def seconds(kept: TraceTrial) -> float:
        alive, trained, elapsed, rung = list(trace.trials), 0, 0.0, 1
        while True:
            until = min(rung, kept.epochs)
            stretches = [sum(t.seconds[trained:until]) for t in alive]
            elapsed += max(sum(stretches) / gpus, max(stretches))
            if until == kept.epochs:
                return elapsed
            bar = sign * kept.metrics[until - 1]
            alive = [t for t in alive if t is kept or (t.epochs > until and len(t.metrics) >= until
                                                       and sign * t.metrics[until - 1] > bar)]
            trained, rung = until, rung * 2

    return min(map(seconds, trace.best_finals())), min(seconds(t) for t in _on_target(trace))


def caps(name: str, mode: str, fifo: list[Run], gpus: int, trials: int | None = None,
         noise: float = 0.0, epochs: int | None = None) -> dict[str, float]:
    """The clairvoyant oracle's speed-ups over FIFO, seed by seed on the seed's trials: in the mean
    and in FIFO's luckiest seed; and (``sweep_`` before those names) the same of the clairvoyant
    policy that sweeps first (``sweep_first``), and (``halving_``) of ``halving_in_hindsight``."""
    draws = [_trace(name, mode, trials, seed, noise, epochs) for seed in range(len(fifo))]
    oracle = [clairvoyant(trace) for trace in draws]
    swept = [sweep_first(trace, gpus) for trace in draws]
    halved = [halving_in_hindsight(trace, gpus) for trace in draws]
    out = {}
    for index, figure in enumerate(("best", "target")):
        for bound, prefix in ((oracle, ""), (swept, "sweep_"), (halved, "halving_")):
            pairs = [(getattr(run, figure), seconds[index]) for run, seconds in zip(fifo, bound)
                     if getattr(run, figure) is not None]
            out[f"{prefix}{figure}_mean_x"] = _ratio(statistics.fmean(t for t, _ in pairs),
                                                     statistics.fmean(o for _, o in pairs))
            out[f"{prefix}{figure}_worst_x"] = min(_ratio(t, o) for t, o in pairs)
    return out


def _ratio(fifo: float, bound: float) -> float:
    """FIFO's time over a bound's; a bound of no time at all (a trace of zero seconds) gives infinity."""
    return fifo / bound if bound else math.inf


def _mean_ratio(base: list[float | None], mine: list[float | None]) -> float:
    """FIFO's mean over the policy's, over the seeds where both got there (nan: none)."""
    pairs = [(b, m) for b, m in zip(base, mine) if b is not None and m is not None]
    return statistics.fmean(b for b, _ in pairs) / statistics.fmean(m for _, m in pairs) if pairs else math.nan


def _worst_ratio(base: list[float | None], mine: list[float | None]) -> float:
    """The worst seed's FIFO time over the policy's (0: the policy never got there in some seed)."""
    return min((b / m if m else 0.0) if b is not None else math.inf for b, m in zip(base, mine))


def row(policy: str, runs: list[Run], fifo: list[Run]) -> dict[str, Any]:
    best, target = [r.best for r in runs], [r.target for r in runs]
    base_best, base_target = [r.best for r in fifo], [r.target for r in fifo]
    feedback = statistics.fmean(r.first_feedback for r in runs)
    return {
        "policy": policy,
        "best_trained": sum(b is not None for b in best),
        "seeds": len(runs),
        "best_mean_x": _mean_ratio(base_best, best),
        "best_worst_x": _worst_ratio(base_best, best),
        "target_mean_x": _mean_ratio(base_target, target),
        "target_worst_x": _worst_ratio(base_target, target),
        "first_feedback_h": feedback / 3600,
        "first_feedback_x": statistics.fmean(r.first_feedback for r in fifo) / feedback,
        "overhead": statistics.fmean(r.overhead for r in runs),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = (f"{'policy':<14}{'best':>6}{'to best x':>10}{'worst':>7}{'to target x':>12}{'worst':>7}"
              f"{'1st fb h':>10}{'x':>7}{'overhead':>10}")
    lines = [header]
    for r in rows:
        lines.append(
            f"{r['policy']:<14}{'%d/%d' % (r['best_trained'], r['seeds']):>6}"
            f"{r['best_mean_x']:>10.2f}{r['best_worst_x']:>7.2f}"
            f"{r['target_mean_x']:>12.2f}{r['target_worst_x']:>7.2f}{r['first_feedback_h']:>10.3f}"
            f"{r['first_feedback_x']:>7.1f}{r['overhead']:>10.2%}"
        )
    return "\n".join(lines)


def targets(
    panel: dict[BlockKey, list[dict[str, Any]]], limits: dict[BlockKey, dict[str, float]], gpus: int, profile: str
) -> list[str]:
    """Issue 14's targets for hermes, per trace: the unmet ones, or "met"; a target no policy can
    meet (the clairvoyant oracle's speed-up is below it, see ``caps``) says so. Hermes with a stopper
    composed (``hermes+median``) must still train the final best in every seed."""
    out = []
    labels = trace_labels(list(dict.fromkeys((name, mode) for name, mode, _, _ in panel)))
    for key, rows in panel.items():
        name, mode, key_gpus, key_profile = key
        if key_gpus != gpus or key_profile != profile:
            continue
        by = {r["policy"]: r for r in rows}
        mine, asha = by.get("hermes"), by.get("asha")
        if mine is None:
            continue
        cap = limits[key]
        misses = []
        if mine["best_trained"] < mine["seeds"]:
            misses.append(f"best trained {mine['best_trained']}/{mine['seeds']}")
        for figure, label in (("best", "to best"), ("target", "to target")):
            for kind, bar, what in (("mean", 4, ""), ("worst", 1, " worst seed")):
                got, most = mine[f"{figure}_{kind}_x"], cap[f"{figure}_{kind}_x"]
                if not got >= bar:
                    reach = f" (out of reach: an oracle gets {most:.2f}x)" if most <= bar else ""
                    swept = cap.get(f"sweep_{figure}_{kind}_x", math.inf)
                    if not reach and swept <= bar:
                        reach = f" (out of reach when sweeping first: at most {swept:.2f}x)"
                    misses.append(f"{label}{what} {got:.2f}x < {bar}x{reach}")
        if not mine["first_feedback_x"] >= 10:
            misses.append(f"first feedback {mine['first_feedback_x']:.1f}x < 10x")
        if asha and not mine["first_feedback_h"] < asha["first_feedback_h"]:
            misses.append("first feedback not sooner than asha")
        for stopped in (r for policy, r in by.items() if policy.startswith("hermes+")):
            if stopped["best_trained"] < stopped["seeds"]:
                misses.append(f"{stopped['policy']} best trained {stopped['best_trained']}/{stopped['seeds']}")
        out.append(f"  {labels[name, mode]:<22} " + ("met" if not misses else "; ".join(misses)))
    return out


# --seeds 0 would judge nothing, --noise nan feed NaN metrics to the policies
_share = number_type(float, lambda value: 0 <= value < math.inf, "a number >= 0")


def _profile(name: str) -> str:
    if name not in PROFILES:
        raise argparse.ArgumentTypeError(f"unknown switch-cost profile {name!r}; choose one of {', '.join(PROFILES)}")
    return name


def _policy(entry: str) -> str:
    """A policy, or a policy and an early stopper composed (``hermes+median``), that loads: refused here, in one
    line, rather than in every worker."""
    policy, plus, stopper = entry.partition("+")
    try:
        policy_class(policy)
        if plus:
            stopper_class(stopper)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return entry


def _size(trials: int | None, total: int) -> str:
    """How many of a trace's trials each seed's search holds, as the panel's header says: ``--trials 20`` of a
    trace of 4 judges all 4 (``_trace``)."""
    if trials is None:
        return ""
    return f", {trials} of its trials" if trials < total else f", all {total} of its trials"


def _standard(value: Any) -> Any:
    """``value`` with every figure that is no number (NaN: no seed got there; infinity: a bound of no time at
    all) as None, so the file is standard JSON (null), which strict parsers read: they refuse NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _standard(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_standard(item) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 GPUs, 3 seeds, warm costs")
    parser.add_argument("--seeds", type=positive_int, help="seeds 0..K-1 (default 10; 3 with --quick)")
    parser.add_argument("--gpus", type=listed(positive_int),
                        help="comma-separated cluster sizes (default 4,16; 4 with --quick)")
    parser.add_argument("--costs", type=listed(_profile),
                        help="comma-separated profiles (default warm,process; warm with --quick)")
    parser.add_argument("--traces", type=chosen_traces, default=list(TRACES),
                        help="comma-separated shipped trace names, or PATH:max|min of any trace file "
                             "(default: every shipped trace)")
    parser.add_argument("--trials", type=positive_int,
                        help="small searches: N trials of each trace per seed (default: all)")
    parser.add_argument("--noise", type=_share, default=0.0,
                        help="scatter every report but the last by this share of the final metrics' spread (default 0)")
    parser.add_argument("--epochs", type=positive_int, help="other searches: every trial's budget cut at N epochs")
    parser.add_argument("--policies", type=listed(_policy), default=list(POLICIES))
    parser.add_argument("--workers", type=positive_int, default=2, help="processes (default 2)")
    parser.add_argument("--json", help="also write the panel, with per-seed figures, to this file")
    args = parser.parse_args()
    seeds = args.seeds or (3 if args.quick else 10)
    gpu_counts = args.gpus or ([4] if args.quick else [4, 16])
    profiles = args.costs or (["warm"] if args.quick else ["warm", "process"])
    traces: list[TraceKey] = args.traces
    policies = args.policies
    if "fifo" not in policies:
        policies.insert(0, "fifo")
    trials, epochs = args.trials, args.epochs
    for name, mode in traces:  # read here, so that a bad file is one line naming it, not a worker's traceback
        try:
            _trace(name, mode, noise=args.noise, epochs=epochs)
        except TraceError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
    json_file = None
    if args.json:
        try:  # now, so that a path it cannot write is refused before the run, not after it; appending, so that a
            # file of an earlier panel stays as it was should this run be stopped
            json_file = open(args.json, "a", encoding="utf-8")
        except OSError as error:
            parser.error(f"--json {args.json}: cannot write: {error.strerror}")
    labels = trace_labels(traces)
    started = time.perf_counter()
    jobs = [(name, mode, policy, seed, gpus, profile, trials, args.noise, epochs)
            for name, mode in traces for profile in profiles for gpus in gpu_counts
            for policy in policies for seed in range(seeds)]  # the order in which the loop below reads them
    results: dict[tuple, Run] = {}
    panel: dict[BlockKey, list[dict[str, Any]]] = {}
    limits: dict[BlockKey, dict[str, float]] = {}  # the clairvoyant oracle's speed-ups, per panel block
    with ProcessPoolExecutor(args.workers) as pool:
        runs = pool.map(_run, jobs, chunksize=max(1, seeds // 2))  # in job order: print each block when done
        for name, mode in traces:
            for profile in profiles:
                for gpus in gpu_counts:
                    per = {p: [] for p in policies}
                    for policy in policies:
                        for seed in range(seeds):
                            job = (name, mode, policy, seed, gpus, profile, trials, args.noise, epochs)
                            run = results[job] = next(runs)
                            per[policy].append(run)
                    rows = [row(p, per[p], per["fifo"]) for p in policies]
                    key = (name, mode, gpus, profile)
                    cap = limits[key] = caps(name, mode, per["fifo"], gpus, trials, args.noise, epochs)
                    panel[key] = rows
                    size = _size(trials, len(_trace(name, mode, noise=args.noise, epochs=epochs).trials))
                    size += f", noise {args.noise}" if args.noise else ""
                    size += f", cut at {epochs} epochs" if epochs else ""
                    print(f"\n== {labels[name, mode]}{size}, {gpus} GPUs, {profile} costs, {seeds} seeds")
                    print(format_rows(rows))
                    for label, prefix in (("oracle", ""), ("sweep first", "sweep_"), ("halving*", "halving_")):
                        print(f"{label:<14}{'':>6}{cap[prefix + 'best_mean_x']:>10.2f}{cap[prefix + 'best_worst_x']:>7.2f}"
                              f"{cap[prefix + 'target_mean_x']:>12.2f}{cap[prefix + 'target_worst_x']:>7.2f}", flush=True)
    if 4 in gpu_counts and "warm" in profiles:
        print("\nissue 14 targets for hermes (warm costs, 4 GPUs):")
        print("\n".join(targets(panel, limits, 4, "warm")))
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)")
    if json_file:
        block = ("trace", "mode", "gpus", "costs")
        blocks = [{**dict(zip(block, key)), "rows": rows, "oracle": limits[key]} for key, rows in panel.items()]
        per_seed = [{**dict(zip(("trace", "mode", "policy", "seed", "gpus", "costs"), job)), **asdict(run)}
                    for job, run in results.items()]
        with json_file:
            if json_file.seekable():  # not a pipe, /dev/stdout say
                json_file.truncate(0)
            json.dump(_standard({"panel": blocks, "runs": per_seed}), json_file, indent=1, allow_nan=False)


if __name__ == "__main__":
    main()
