"""The policy panel (bench/policy_panel.py): its oracle, the most any policy can gain over FIFO, and its small searches."""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.policy_panel import _trace, clairvoyant, halving_in_hindsight, sweep_first, targets
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


ROOT = Path(__file__).resolve().parent.parent


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


def test_a_small_search_draws_its_trials_by_the_seed() -> None:
    full = _trace("lcbench_34539", "max")
    draws = [_trace("lcbench_34539", "max", 16, seed) for seed in (0, 0, 1)]
    assert [len(d.trials) for d in draws] == [16, 16, 16]
    assert draws[0].trials == draws[1].trials != draws[2].trials
    assert set(draws[2].trials) <= set(full.trials)
    assert _trace("lcbench_34539", "max", 10_000, 3) is full


def test_noise_scatters_every_report_but_the_last_by_its_share_of_the_final_spread() -> None:
    clean = _trace("lcbench_34539", "max")
    scattered = _trace("lcbench_34539", "max", noise=0.1)
    assert _trace("lcbench_34539", "max", noise=0.1) is scattered  # drawn once per trace
    assert [t.metrics[-1] for t in scattered.trials] == [t.metrics[-1] for t in clean.trials]
    assert scattered.best_final().name == clean.best_final().name
    moves = [a - b for s, c in zip(scattered.trials, clean.trials) for a, b in zip(s.metrics[:-1], c.metrics[:-1])
             if math.isfinite(b)]
    spread = statistics.pstdev(t.metrics[-1] for t in clean.trials if t.metrics and math.isfinite(t.metrics[-1]))
    assert abs(statistics.fmean(moves)) < 0.01 * spread
    assert statistics.pstdev(moves) == pytest.approx(0.1 * spread, rel=0.02)


def test_a_cut_budget_is_another_search_with_its_own_final_best() -> None:
    full = _trace("lcbench_168330", "max")
    short = _trace("lcbench_168330", "max", epochs=12)
    assert _trace("lcbench_168330", "max", epochs=12) is short
    assert {len(t.metrics) for t in short.trials} == {12}
    assert all(s.metrics == c.metrics[:12] and s.seconds == c.seconds[:12] for s, c in zip(short.trials, full.trials))
    assert short.best_final().name != full.best_final().name  # this trace's final best rises late
    assert _trace("lcbench_168330", "max", epochs=100).best_final().name == full.best_final().name


def test_the_panel_judges_small_searches(tmp_path: Path) -> None:
    """``--trials 16``: every seed's 16 trials, FIFO and hermes on them, and the oracle over the same draws."""
    out = tmp_path / "panel.json"
    run = subprocess.run(
        [sys.executable, "bench/policy_panel.py", "--quick", "--seeds", "2", "--traces", "lcbench_34539",
         "--trials", "16", "--policies", "fifo,hermes", "--workers", "1", "--json", str(out)],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300, check=True,
    )
    assert "== lcbench_34539, 16 of its trials, 4 GPUs, warm costs, 2 seeds" in run.stdout
    [block] = json.loads(out.read_text())["panel"]
    assert (block["trace"], block["mode"], block["gpus"], block["costs"]) == ("lcbench_34539", "max", 4, "warm")
    rows = {r["policy"]: r for r in block["rows"]}
    assert rows["fifo"]["best_mean_x"] == 1.0 and rows["hermes"]["best_trained"] == 2
    assert block["oracle"]["best_mean_x"] >= rows["hermes"]["best_mean_x"]


def test_the_panel_judges_a_search_from_any_trace_file_and_refuses_an_unknown_name(tmp_path: Path) -> None:
    """A search that is not in data/ (here a shipped one cut to 20 epochs, written elsewhere) is judged like a
    shipped one: the same rows, the oracle, and issue 14's targets; a name that is neither is refused."""
    trace = load_trace("data/lcbench_189873.csv", "max")
    rows = ["trial,epoch,metric,seconds"] + [f"{t.name},{epoch},{t.metrics[epoch - 1]},{t.seconds[epoch - 1]}"
                                              for t in trace.trials[:60] for epoch in range(1, 21)]
    (tmp_path / "elsewhere.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "panel.json"
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [sys.executable, "bench/policy_panel.py", "--quick", "--seeds", "2", "--traces",
         f"{tmp_path / 'elsewhere.csv'}:max,lcbench_34539", "--trials", "40", "--policies", "fifo,hermes",
         "--workers", "1", "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    )
    assert "== elsewhere, 40 of its trials, 4 GPUs, warm costs, 2 seeds" in run.stdout
    assert "== lcbench_34539, 40 of its trials" in run.stdout and "\n  elsewhere " in run.stdout  # its targets
    blocks = {block["trace"]: block for block in json.loads(out.read_text())["panel"]}
    rows = {r["policy"]: r for r in blocks[str(tmp_path / "elsewhere.csv")]["rows"]}
    assert rows["fifo"]["best_mean_x"] == 1.0 and rows["hermes"]["best_trained"] == 2
    for bad in ("no_such_trace", f"{tmp_path / 'elsewhere.csv'}", f"{tmp_path / 'missing.csv'}:max"):
        refused = subprocess.run([sys.executable, "bench/policy_panel.py", "--quick", "--traces", bad], cwd=root,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "no shipped trace" in refused.stderr and "PATH:max" in refused.stderr


def test_the_targets_name_what_hermes_misses_and_what_no_policy_can_reach() -> None:
    def figures(policy: str, best: float, target: float, feedback_h: float, trained: int = 10) -> dict:
        return {"policy": policy, "best_trained": trained, "seeds": 10, "best_mean_x": best, "best_worst_x": 1.0,
                "target_mean_x": target, "target_worst_x": 1.0, "first_feedback_h": feedback_h,
                "first_feedback_x": 1.0 / feedback_h}

    oracle = {"best_mean_x": 50.0, "best_worst_x": 2.0, "target_mean_x": 2.0, "target_worst_x": 1.5}
    panel = {
        ("good", "max", 4, "warm"): [figures("asha", 1.0, 1.0, 0.5), figures("hermes", 5.0, 4.5, 0.05),
                                     figures("hermes+median", 6.0, 5.0, 0.05)],
        ("late", "max", 4, "warm"): [figures("asha", 1.0, 1.0, 0.04), figures("hermes", 2.0, 1.5, 0.05),
                                     figures("hermes+median", 3.0, 2.0, 0.05, trained=9)],
        ("late", "max", 16, "warm"): [figures("hermes", 0.5, 0.5, 1.0)],  # another cluster size: not judged
    }
    lines = targets(panel, {key: oracle for key in panel}, 4, "warm")
    assert lines[0].split() == ["good", "met"]
    assert lines[1].split(None, 1)[1] == (
        "to best 2.00x < 4x; to target 1.50x < 4x (out of reach: an oracle gets 2.00x); first feedback not sooner "
        "than asha; hermes+median best trained 9/10")
    assert len(lines) == 2


def test_a_policy_that_sweeps_first_never_beats_the_sweep_first_bound(tmp_path: Path) -> None:
    """Hermes gives every trial its first report before any goes deeper."""
    trace = load_trace(write(tmp_path / "tiny.csv"), "max")
    # first reports 5 + 4 + 2 + 0.5 = 11.5 s on 1 GPU, less the longest (5 s), then the best's last epoch (6 s),
    # or the last epoch of "near", the trial on target (2 s)
    assert sweep_first(trace, 1) == (11.5 - 5.0 + 6.0, 11.5 - 5.0 + 2.0)
    # on 2 GPUs the sweep (0.75 s) ends before the trial's own first epoch (4 s for the best, 2 s for "near"): the
    # bound is then the oracle's
    assert sweep_first(trace, 2) == (4.0 + 6.0, 2.0 + 2.0) == clairvoyant(trace)
    for gpus in (1, 2):
        for seed in range(6):
            result = simulate(trace, make_policy("hermes"), gpus=gpus, seed=seed)
            best, target = sweep_first(trace, gpus)
            assert result.time_to_best_s is not None and result.time_to_best_s >= best
            assert result.time_to_target_s is not None and result.time_to_target_s >= target


def test_a_target_out_of_reach_when_sweeping_first_says_so() -> None:
    hermes = {"policy": "hermes", "best_trained": 10, "seeds": 10, "best_mean_x": 3.0, "best_worst_x": 1.0,
              "target_mean_x": 5.0, "target_worst_x": 1.0, "first_feedback_h": 0.1, "first_feedback_x": 12.0}
    oracle = {"best_mean_x": 26.0, "best_worst_x": 1.5, "target_mean_x": 20.0, "target_worst_x": 1.5,
              "sweep_best_mean_x": 3.7}
    key = ("swept", "max", 4, "warm")
    line = targets({key: [hermes]}, {key: oracle}, 4, "warm")[0]
    assert line.split(None, 1)[1] == "to best 3.00x < 4x (out of reach when sweeping first: at most 3.70x)"


def test_halving_in_hindsight_keeps_exactly_the_trials_ahead_and_waits_for_the_longest(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "tiny.csv"), "max")
    # first epochs 5 + 4 + 2 + 0.5 s: on 2 GPUs 5.75 s (the longest, 5 s, is shorter). Only "near" is ahead of "best"
    # after one epoch, so their second epochs follow (6 + 2 s: the longest, 6 s, decides); nobody is ahead of "near",
    # the quickest trial on target, which trains its second epoch alone (2 s).
    assert halving_in_hindsight(trace, 2) == (5.75 + 6.0, 5.75 + 2.0)
    assert halving_in_hindsight(trace, 1) == (11.5 + 8.0, 11.5 + 2.0)


def test_halving_in_hindsight_sweeps_first() -> None:
    """Every trial gets its first epoch before the first cut, so the sweep-first bound holds for it too."""
    for name in ("lcbench_34539", "digits_mlp"):
        for trials in (16, None):
            trace = _trace(name, "max", trials, seed=1)
            for gpus in (1, 4, 16):
                halved, swept = halving_in_hindsight(trace, gpus), sweep_first(trace, gpus)
                assert halved[0] >= swept[0] and halved[1] >= swept[1]


def panel(*args: str) -> subprocess.CompletedProcess[str]:
    """bench/policy_panel.py as a user runs it, small: fifo and hermes, 2 seeds, 1 GPU, warm costs, 1 worker."""
    return subprocess.run(
        [sys.executable, "bench/policy_panel.py", "--seeds", "2", "--gpus", "1", "--costs", "warm", "--policies",
         "fifo,hermes", "--workers", "1", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_one_file_judged_both_ways_is_two_blocks_each_with_its_own_figures(tmp_path: Path) -> None:
    """``a.csv:min,a.csv:max``: each block has the figures of that direction alone (both had the first's), its
    oracle too, and says which it is; a '|' in the path is a name like any other."""
    trace = write(tmp_path / "a|b.csv")
    out = tmp_path / "panel.json"
    alone = {}
    for mode in ("max", "min"):
        run = panel("--traces", f"{trace}:{mode}", "--json", str(out))
        assert run.returncode == 0, run.stderr
        [alone[mode]] = json.loads(out.read_text())["panel"]
    assert alone["max"]["rows"] != alone["min"]["rows"] and alone["max"]["oracle"] != alone["min"]["oracle"]
    run = panel("--traces", f"{trace}:min,{trace}:max", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "== a|b:min, 1 GPUs" in run.stdout and "== a|b:max, 1 GPUs" in run.stdout
    written = json.loads(out.read_text())
    assert {block["mode"]: block for block in written["panel"]} == alone
    assert sorted((r["mode"], r["policy"], r["seed"]) for r in written["runs"]) == sorted(
        (mode, policy, seed) for mode in ("max", "min") for policy in ("fifo", "hermes") for seed in (0, 1))


def test_a_trace_file_named_as_a_shipped_trace_is_a_block_of_its_own(tmp_path: Path) -> None:
    own = write(tmp_path / "digits_mlp.csv")
    out = tmp_path / "panel.json"
    run = panel("--traces", f"digits_mlp,{own}:max", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "== digits_mlp:max, 1 GPUs" in run.stdout and f"== {own}:max, 1 GPUs" in run.stdout
    shipped, mine = json.loads(out.read_text())["panel"]
    assert (shipped["trace"], mine["trace"]) == ("digits_mlp", str(own))
    assert shipped["oracle"] != mine["oracle"]


@pytest.mark.parametrize(("args", "says"), [
    (["--policies", "fifo,nope"], "argument --policies: unknown policy 'nope'; choose one of fifo,"),
    (["--policies", "hermes+nope"], "argument --policies: unknown early stopper 'nope'; choose one of"),
    (["--costs", "cold"], "argument --costs: unknown switch-cost profile 'cold'; choose one of warm, process"),
    (["--gpus", "4,0"], "argument --gpus: must be a positive whole number, got '0'"),
    (["--workers", "0"], "argument --workers: must be a positive whole number, got '0'"),
    (["--seeds", "0"], "argument --seeds: must be a positive whole number, got '0'"),
    (["--trials", "0"], "argument --trials: must be a positive whole number, got '0'"),
    (["--epochs", "-1"], "argument --epochs: must be a positive whole number, got '-1'"),
    (["--noise", "nan"], "argument --noise: must be a number >= 0, got 'nan'"),
])
def test_a_bad_argument_is_a_usage_error_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    run = panel("--traces", f"{write(tmp_path / 'tiny.csv')}:max", *args)
    assert (run.returncode, run.stdout) == (2, "") and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1].startswith(f"policy_panel.py: error: {says}")


def test_a_bad_trace_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """As ``hermes simulate`` says it, not a worker's traceback."""
    bad, failed = tmp_path / "bad.csv", tmp_path / "failed.csv"
    bad.write_text("trial,epoch,metric,seconds\na,1,nan,10\n")
    failed.write_text("trial,epoch,metric,seconds\na,1,,10\n")
    for path, says in ((bad, f"{bad}:2: metric must be finite, got 'nan'"),
                       (failed, f"{failed}: every trial diverged, so none has a final metric")):
        for more in ([], ["--trials", "1"], ["--epochs", "1", "--noise", "0.1"]):
            run = panel("--traces", f"{path}:max", *more)
            assert (run.returncode, run.stdout, run.stderr) == (2, "", f"policy_panel.py: error: {says}\n")


def test_every_drawn_search_holds_a_finished_trial(tmp_path: Path) -> None:
    """Two of three trials failed: a seed that draws those two swaps its last for the finished one, by the same
    seed; every other draw is as it was. The panel judges every seed (it died: "every trial diverged")."""
    path = tmp_path / "failing.csv"
    path.write_text("trial,epoch,metric,seconds\na,1,,10\nb,1,0.5,5\nb,2,0.6,5\nc,1,0.7,4\nc,2,,4\n")
    full = _trace(str(path), "max")
    failed_draws = 0
    for seed in range(20):
        drawn, plain = _trace(str(path), "max", 2, seed), random.Random(seed).sample(full.trials, 2)
        assert drawn == _trace(str(path), "max", 2, seed)
        assert [t.name for t in drawn.trials if not t.diverged] == ["b"]
        if all(t.diverged for t in plain):
            failed_draws += 1
            assert drawn.trials[0] == plain[0]
        else:
            assert list(drawn.trials) == plain
    assert failed_draws
    run = panel("--traces", f"{path}:max", "--trials", "2", "--seeds", "8")
    assert run.returncode == 0, run.stderr
    assert "\nfifo             8/8" in run.stdout


def test_a_trial_that_fails_after_the_cut_is_finished_there(tmp_path: Path) -> None:
    path = tmp_path / "late_failure.csv"
    path.write_text("trial,epoch,metric,seconds\nrises,1,0.9,1\nrises,2,0.95,1\nrises,3,,1\n"
                    "steady,1,0.5,1\nsteady,2,0.6,1\nsteady,3,0.7,1\n")
    assert _trace(str(path), "max").best_final().name == "steady"
    assert _trace(str(path), "max", epochs=3).trials[0].diverged
    short = _trace(str(path), "max", epochs=2)
    assert not short.trials[0].diverged and short.best_final().name == "rises"
