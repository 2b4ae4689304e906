"""The policy panel's oracle: the most any policy can gain over FIFO on a trace (bench/policy_panel.py)."""

from __future__ import annotations

from pathlib import Path

from bench.policy_panel import clairvoyant
from hermes.policies import make_policy
from hermes.sim.simulate import simulate
from hermes.sim.trace import load_trace

# trial -> (metric per epoch, seconds per epoch): "best" ends best, "near" ends within 1% of it, sooner
TRIALS = {
    "slow": ([0.1, 0.2], [5.0, 5.0]),
    "best": ([0.5, 0.9], [4.0, 6.0]),
    "near": ([0.8, 0.895], [2.0, 2.0]),
    "poor": ([0.3, 0.4], [0.5, 0.5]),
}


def write(path: Path) -> Path:
    rows = ["trial,epoch,metric,seconds"]
    rows += [f"{name},{epoch},{metric},{seconds}" for name, (metrics, times) in TRIALS.items()
             for epoch, (metric, seconds) in enumerate(zip(metrics, times), start=1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_the_oracle_trains_the_best_and_the_quickest_trial_on_target_first(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "tiny.csv"), "max")
    assert clairvoyant(trace) == (10.0, 4.0)


def test_no_policy_beats_the_oracle(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "tiny.csv"), "max")
    best, target = clairvoyant(trace)
    for policy in ("fifo", "hermes", "asha"):
        for seed in range(6):
            result = simulate(trace, make_policy(policy), gpus=1, seed=seed)
            if result.time_to_best_s is not None:
                assert result.time_to_best_s >= best
            assert result.time_to_target_s is not None and result.time_to_target_s >= target
