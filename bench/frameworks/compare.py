"""Hermes against FIFO, Ray Tune's ASHA and Optuna's pruners on one real workload, side by side.

    python bench/frameworks/compare.py [--rounds R] [--systems fifo,hermes,hermes_median,ray_asha,optuna_median,...]
                                       [--search grid|tpe] [--ratio-to fifo] [--epochs 30] [--trials 48]
                                       [--json PATH]
                                       [--hermes-period S] [--hermes-param NAME=VALUE ...]

Every system tunes ``workload.py`` (a PyTorch MLP on ~20k digits) on 2 slots of one torch thread
each, ``--trials`` trials of ``--epochs`` epochs at most; rounds alternate the order of the
systems (the given order, then reversed, ...), so a machine that slows down over time favours none.

- ``--search grid`` (the default): every system trains the same configurations, in the same
  arrival order within a round, a permutation drawn from the round's number: FIFO's time to
  target depends on where the good configurations arrive, so rounds average that luck out
  instead of repeating one draw.
- ``--search tpe``: every system proposes its trials with Optuna's TPE sampler (seeded with the
  round's number) over the workload's space: Hermes through ``search.sampler: tpe``, Optuna with
  its pruner in its own ``study.optimize``, Ray Tune with ``OptunaSearch`` and ASHA (``systems.py``).

Per system, averaged over rounds:

- time to target: when a trial first finishes all epochs within 0.5 accuracy points of the best
  final accuracy of the round (any system's; with ``grid`` that is FIFO's, which trains every
  configuration to the end);
- mean first feedback: the mean over configurations of the time of their first report (a
  configuration never reported counts as the system's wall time);
- best accuracy at 30 s and at 60 s: the best validation accuracy reported until then;
- training share: the epochs' training time over the slot time until the last report (2 slots);
- final quality: the best accuracy of a trial that finished all epochs;
- each figure over FIFO's, or over the figure of the system given by ``--ratio-to`` (times: below
  1 is faster; with ``tpe`` FIFO may never reach the round's target, ``--ratio-to hermes`` then
  gives every time to target a ratio);
- and, to judge the others, the epoch time over FIFO's (so ``fifo`` must be among the systems)
  for the configurations both trained
  (training is deterministic, so the same configuration is the same computation; with ``tpe``
  only those the systems happen to share, such as the sampler's first random proposals, and
  "n/a" when there are none): the machine may be shared, and a run it slowed down has all its
  times inflated (run several rounds).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

if not __package__:  # run as a script: make `bench` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.frameworks.systems import SEARCHES, SLOTS, SYSTEMS, Setting, Size, Timeline  # noqa: E402
from bench.frameworks.workload import machine  # noqa: E402
from hermes.policies import make_policy  # noqa: E402

TARGET_POINTS = 0.005  # accuracy is in [0, 1]: 0.5 points
MILESTONES = (30.0, 60.0)  # seconds at which the best accuracy so far is read
# Hermes runs with its defaults: its turns follow the observed epoch lengths and its switch price the
# observed switches (the runner's prior is what a switch of a warm worker costs).
FIGURES = ("time_to_target", "first_feedback", "best_at_30s", "best_at_60s", "training_share", "final_quality")


@dataclass(frozen=True, slots=True)
class Figures:
    """One system's figures in one round; None where it never got there."""

    time_to_target: float | None  # seconds
    first_feedback: float  # seconds, mean over configurations
    best_at_30s: float | None
    best_at_60s: float | None
    training_share: float
    final_quality: float | None
    wall: float  # seconds


def reference_best(timelines: dict[str, Timeline], epochs: int) -> float:
    """The best final accuracy of the round, any system's (with ``grid``, FIFO's: it trains every configuration)."""
    finals = [r.accuracy for timeline in timelines.values() for r in timeline.records if r.epoch == epochs]
    if not finals:
        raise RuntimeError("no system finished a trial: no reference for the time to target")
    return max(finals)


def figures(timeline: Timeline, best: float, size: Size) -> Figures:
    """The figures of one system's run, from its timeline alone."""
    records = timeline.records
    finals = [r for r in records if r.epoch == size.epochs]
    on_target = [r.at for r in finals if r.accuracy >= best - TARGET_POINTS]
    first: dict[int, float] = {}
    for record in records:  # in time order
        first.setdefault(record.index, record.at)
    feedback = statistics.fmean(first.get(index, timeline.wall) for index in range(size.trials))
    until = records[-1].at if records else 0.0
    share = sum(r.train_seconds for r in records) / (SLOTS * until) if until > 0 else 0.0
    best_at = [max((r.accuracy for r in records if r.at <= t), default=None) for t in MILESTONES]
    return Figures(
        time_to_target=min(on_target, default=None),
        first_feedback=feedback,
        best_at_30s=best_at[0],
        best_at_60s=best_at[1],
        training_share=share,
        final_quality=max((r.accuracy for r in finals), default=None),
        wall=timeline.wall,
    )


def epoch_time_vs_fifo(timeline: Timeline, fifo: Timeline) -> float | None:
    """How fast the machine trained for this system: the median over the configurations both
    trained of its median epoch time over FIFO's for the same configuration (the same
    computation); None when they share none. Near 1 when both ran alike; far from 1 when the
    machine, shared with other work, was slower or faster during one of the runs, which then
    skews every time in the table."""
    mine, base = _median_epoch_seconds(timeline), _median_epoch_seconds(fifo)
    shared = [key for key in mine if key in base]
    return statistics.median(mine[key] / base[key] for key in shared) if shared else None


def _median_epoch_seconds(timeline: Timeline) -> dict[str, float]:
    """Per configuration trained (its values, as JSON), the median of its epoch times."""
    seconds: dict[str, list[float]] = {}
    for record in timeline.records:
        key = json.dumps(timeline.configs[record.index], sort_keys=True)
        seconds.setdefault(key, []).append(record.train_seconds)
    return {key: statistics.median(values) for key, values in seconds.items()}


def run_rounds(
    systems: list[str],
    rounds: int,
    size: Size,
    period: float | None = None,
    params: dict[str, Any] | None = None,
    search: str = "grid",
) -> list[dict[str, Timeline]]:
    """Every system once per round, in the given order in even rounds and reversed in odd ones."""
    params = params or {}
    check(systems, rounds, period, params, search)
    results = []
    for round_index in range(rounds):
        order = tuple(arrival_order(size.trials, round_index))
        setting = Setting(size, search, order, seed=round_index, period=period, params=params)
        timelines = {}
        for name in systems if round_index % 2 == 0 else systems[::-1]:
            began = time.time()
            timelines[name] = SYSTEMS[name](setting)
            timeline = timelines[name]
            print(
                f"round {round_index + 1}: {name} ran {timeline.wall:.1f} s (set-up {timeline.setup:.1f} s, "
                f"{time.time() - began:.1f} s in all), {len(timeline.records)} reports"
                + "".join(f", {key} {value:.4g}" for key, value in timeline.notes.items()),
                flush=True,
            )
        results.append(timelines)
    return results


def arrival_order(trials: int, round_index: int) -> list[int]:
    """The order in which the configurations arrive in a round: a permutation seeded by the round."""
    return random.Random(round_index).sample(range(trials), trials)


def check(
    systems: list[str], rounds: int, period: float | None, params: dict[str, Any], search: str = "grid",
    unit: str = "fifo",
) -> None:
    """Refuse a comparison that could not finish, before minutes of runs: ValueError says why."""
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; choose from {', '.join(SEARCHES)}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if "fifo" not in systems:
        raise ValueError("the systems must include fifo: the epoch times are to its own")
    if unit not in systems:
        raise ValueError(f"the ratios are to {unit!r}, which is not among the systems")
    unknown = [name for name in systems if name not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
    try:
        make_policy("hermes", **({} if period is None else {"period": period}), **params)
    except (TypeError, ValueError) as error:
        raise ValueError(f"hermes policy: {error}") from None


def round_figures(results: list[dict[str, Timeline]], size: Size) -> list[dict[str, Figures]]:
    """Every system's figures in each round, against that round's best final accuracy. Printed per round for
    the time to target: where the arrival order put the trials on target decides FIFO's, so the spread
    between rounds says how much the mean rests on luck."""
    per_round = []
    for timelines in results:
        best = reference_best(timelines, size.epochs)
        per_round.append({name: figures(timeline, best, size) for name, timeline in timelines.items()})
    return per_round


def summarise(results: list[dict[str, Timeline]], size: Size, unit: str = "fifo") -> dict[str, dict[str, Any]]:
    """Per system: each figure's mean over rounds (None when never reached), the rounds that reached
    it, and its ratio to the mean of system ``unit``; and the mean epoch time relative to FIFO's."""
    per_round = round_figures(results, size)
    table: dict[str, dict[str, Any]] = {}
    for name in results[0]:
        row: dict[str, Any] = {}
        for figure in (*FIGURES, "wall"):
            values = [getattr(one_round[name], figure) for one_round in per_round]
            reached = [value for value in values if value is not None]
            row[figure] = statistics.fmean(reached) if reached else None
            row[f"{figure}_rounds"] = len(reached)
        ratios = [epoch_time_vs_fifo(timelines[name], timelines["fifo"]) for timelines in results]
        known = [ratio for ratio in ratios if ratio is not None]
        row["epoch_time_vs_fifo"] = statistics.fmean(known) if known else None
        table[name] = row
    for row in table.values():
        for figure in FIGURES:
            base, mine = table[unit][figure], row[figure]
            row[f"{figure}_ratio"] = mine / base if mine is not None and base else None
    return table


def markdown(table: dict[str, dict[str, Any]], rounds: int) -> str:
    """The table, one row per system; ``(x)`` is the ratio to the unit of ``summarise``."""
    header = [
        "system", "time to target s", "mean first feedback s", "best acc at 30 s", "best acc at 60 s",
        "training share", "final quality", "wall s", "epoch time vs fifo",
    ]
    digits = {"time_to_target": 1, "first_feedback": 1, "training_share": 3}
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in table.items():
        cells = [name]
        for figure in FIGURES:
            value = row[figure]
            if value is None:
                cells.append("never")
                continue
            ratio = row[f"{figure}_ratio"]  # None where the unit never got there
            cell = f"{value:.{digits.get(figure, 4)}f} ({'n/a' if ratio is None else f'{ratio:.2f}x'})"
            if row[f"{figure}_rounds"] < rounds:
                cell += f" [{row[f'{figure}_rounds']}/{rounds} rounds]"
            cells.append(cell)
        epoch_time = row["epoch_time_vs_fifo"]
        cells += [f"{row['wall']:.1f}", "n/a" if epoch_time is None else f"{epoch_time:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _param(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, yaml.safe_load(value)  # numbers and booleans as such


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--search", default="grid", choices=SEARCHES, help="what every system searches (see above)")
    parser.add_argument("--ratio-to", default="fifo", metavar="SYSTEM", help="the system every ratio is to")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--json", type=Path, help="also write the figures and every timeline here")
    parser.add_argument("--hermes-period", type=float, help="hermes policy's period, seconds (default: its own, learned)")
    parser.add_argument(
        "--hermes-param", type=_param, action="append", default=[], metavar="NAME=VALUE",
        help="a hermes policy parameter (hermes/policies/hermes.py), repeatable; default: Hermes's defaults",
    )
    args = parser.parse_args(argv)
    size = Size(args.trials, args.epochs)
    systems = args.systems.split(",")
    params = dict(args.hermes_param)
    try:
        check(systems, args.rounds, args.hermes_period, params, args.search, args.ratio_to)
    except ValueError as error:
        parser.error(str(error))
    proposed = "the same configurations" if args.search == "grid" else "proposals of Optuna's TPE"
    where = machine()
    print(f"{size.trials} trials x {size.epochs} epochs on {SLOTS} slots, {proposed}; hermes period "
          f"{args.hermes_period or 'learned'}, params {params or 'as Hermes sets them'}; torch {where['torch']}, "
          f"CPU kernels {where['cpu_capability']}", flush=True)
    results = run_rounds(systems, args.rounds, size, args.hermes_period, params, args.search)
    table = summarise(results, size, args.ratio_to)
    print(f"\nratios to {args.ratio_to}:")
    print(markdown(table, args.rounds))
    per_round = round_figures(results, size)
    for name in systems:
        setups = [timelines[name].setup for timelines in results]
        targets = [one_round[name].time_to_target for one_round in per_round]
        print(f"{name}: wall {', '.join(f'{t[name].wall:.1f}' for t in results)} s; "
              f"set-up before its start {statistics.fmean(setups):.1f} s; time to target "
              f"{', '.join('never' if t is None else f'{t:.1f}' for t in targets)} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "trials": size.trials,
                    "epochs": size.epochs,
                    "search": args.search,
                    "ratio_to": args.ratio_to,
                    "hermes": {"period": args.hermes_period, "params": params},
                    "machine": where,
                    "figures": table,
                    "rounds": [{name: asdict(line) for name, line in timelines.items()} for timelines in results],
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
