"""The ``hermes`` command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Sequence

from hermes.errors import HermesError

GPUS_PER_NODE = 8  # default node size when --nodes is not given, like a DGX-class server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hermes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_simulate(commands)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except HermesError as error:
        print(f"hermes: error: {error}", file=sys.stderr)
        return 2


def _add_simulate(commands: argparse._SubParsersAction) -> None:
    from hermes.policies import POLICIES, STOPPERS

    sim = commands.add_parser(
        "simulate",
        help="replay a recorded learning-curve trace under a scheduling policy",
        description="Replay a learning-curve trace in simulated time with the real scheduling core.",
    )
    sim.add_argument("--trace", required=True, help="CSV with header trial,epoch,metric,seconds[,param_*]")
    sim.add_argument("--mode", required=True, choices=("max", "min"), help="direction in which the metric improves")
    sim.add_argument("--gpus", required=True, type=int)
    sim.add_argument("--nodes", type=int, help=f"default: one node per {GPUS_PER_NODE} GPUs")
    sim.add_argument("--policy", default="hermes", choices=sorted(POLICIES))
    sim.add_argument("--stopper", choices=sorted(STOPPERS), help="optional early stopping")
    sim.add_argument("--period", type=float, help="scheduling period in seconds (default: the policy's)")
    sim.add_argument("--seed", type=int, default=0, help="seed of the random arrival order")
    sim.add_argument("--target-tolerance", default="1%", help="time to target: absolute (0.5) or relative (1%%)")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--compare", help="comma-separated policies to compare, e.g. fifo,rr,slaq,hermes")
    sim.add_argument("--seeds", type=int, default=10, help="with --compare: seeds 0..K-1 to average over")
    sim.add_argument("--workers", type=int, default=1, help="with --compare: processes to use")
    sim.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from hermes.sim.compare import Setting, compare, format_table, run_one
    from hermes.sim.simulate import Tolerance
    from hermes.sim.trace import load_trace

    trace = load_trace(args.trace, args.mode)
    nodes = args.nodes or math.ceil(args.gpus / GPUS_PER_NODE)
    try:
        setting = Setting(
            gpus=args.gpus, nodes=nodes, period=args.period, stopper=args.stopper,
            target=Tolerance.parse(args.target_tolerance),
        )
    except ValueError as error:
        raise HermesError(str(error)) from None
    if args.compare:
        policies = [name.strip() for name in args.compare.split(",") if name.strip()]
        summaries = compare(trace, policies, range(args.seeds), setting, workers=args.workers)
        if args.json:
            print(json.dumps([s.__dict__ if hasattr(s, "__dict__") else _as_dict(s) for s in summaries]))
        else:
            print(f"{trace.path}: {len(trace.trials)} trials, {args.gpus} GPUs on {nodes} node(s), {args.seeds} seeds")
            print(format_table(summaries))
        return 0
    result = run_one(trace, args.policy, args.seed, setting)
    figures = result.figures()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            if key != "best_curve":
                print(f"{key:>24}: {value}")
    return 0


def _as_dict(summary: object) -> dict:
    return {name: getattr(summary, name) for name in summary.__slots__}  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
