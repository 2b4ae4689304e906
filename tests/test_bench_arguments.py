"""The benchmarks refuse a bad argument in one line (exit code 2, as `hermes`) before anything runs, not in a
traceback or after the run; bench/policy_sweep.py's speed-ups pair the seeds as `hermes simulate --compare` does;
the simulator's target tolerance refuses an amount that overflows to infinity as it refuses ``inf``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.policy_sweep import sweep, table
from hermes.cli import main
from hermes.sim.compare import Setting, compare
from hermes.sim.simulate import Tolerance
from hermes.sim.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parent.parent
SECONDS = 20  # starting Python and importing hermes takes about a second; any run takes longer


def refused(script: str, *args: str, cwd: Path = ROOT) -> str:
    """Run ``bench/<script>`` with ``args``: it must exit 2 at once, having printed nothing, with one error line
    and no traceback. That line."""
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=cwd, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert time.monotonic() - started < SECONDS and run.stdout == ""  # nothing ran
    assert "Traceback" not in run.stderr
    [error] = [line for line in run.stderr.splitlines() if "error:" in line]
    assert error.startswith(f"{script}: error: ")
    return error


def test_policy_panel_refuses_a_json_path_it_cannot_write_before_the_run(tmp_path: Path) -> None:
    """It was tried after the whole panel (12 minutes by default) ran: a traceback, and the results lost."""
    small = ("--traces", "digits_mlp", "--seeds", "1", "--gpus", "2", "--costs", "warm", "--policies", "fifo",
             "--workers", "1")
    missing = tmp_path / "no" / "such" / "panel.json"
    assert f"--json {missing}: cannot write: No such file or directory" in refused(
        "policy_panel.py", *small, "--json", str(missing))
    assert not missing.parent.exists()
    assert f"--json {tmp_path}: cannot write: Is a directory" in refused(
        "policy_panel.py", *small, "--json", str(tmp_path))


@pytest.mark.parametrize(("script", "args", "says"), [
    ("policy_sweep.py", ["--only", "nasbench", "--policies", "fifo,hermes", "--set", "nope=1"],
     "argument --set: HermesPolicy.__init__() got an unexpected keyword argument 'nope'"),
    ("policy_sweep.py", ["--only", "nasbench", "--set", "optimism=x"], "argument --set: optimism must be a number"),
    ("policy_sweep.py", ["--only", "nasbench", "--set", "optimism"],
     "argument --set: must be NAME=VALUE, got 'optimism'"),
    ("policy_sweep.py", ["--only", "nasbench", "--policies", "fifo,asha", "--set", "optimism=1.5"],
     "argument --set: only hermes takes settings"),
    ("policy_sweep.py", ["--only", "nasbench", "--policies", "fifo,nope"],
     "argument --policies: unknown policy 'nope'"),
    ("policy_sweep.py", ["--only", "nasbench", "--seeds", "0"], "argument --seeds: must be a positive whole number"),
    ("policy_sweep.py", ["--only", "nasbench", "--gpus", "0"], "argument --gpus: must be a positive whole number"),
    ("policy_sweep.py", ["--only", "no-such-trace"],
     "argument --only: no trace of the real suite has 'no-such-trace' in its title"),
    ("paper_comparison.py", ["--gpus", "4,0"], "argument --gpus: must be a positive whole number, got '0'"),
    ("paper_comparison.py", ["--policies", "nope"], "argument --policies: unknown policy 'nope'"),
    ("paper_comparison.py", ["--seeds", "0"], "argument --seeds: must be a positive whole number"),
    ("best_curve.py", ["--seeds", "0"], "argument --seeds: must be a positive whole number"),
    ("scale.py", ["--trials", "50", "--gpus", "10", "--mode", "maximize"], "argument --mode: invalid choice"),
    ("scale.py", ["--trials", "50", "--gpus", "10", "--policy", "nope"], "argument --policy: unknown policy 'nope'"),
    ("scale.py", ["--trials", "50", "--gpus", "10", "--trace", "no-such.csv"],
     "argument --trace: no-such.csv: cannot open"),
    ("scale.py", ["--trials", "0"], "argument --trials: must be a positive whole number"),
])
def test_a_bench_script_refuses_a_bad_argument_in_one_line(script: str, args: list[str], says: str,
                                                           tmp_path: Path) -> None:
    """They gave a traceback (or, for ``--only`` that matches nothing, ran nothing and said so by saying nothing)."""
    out = ["--out", str(tmp_path)] if script == "best_curve.py" else []  # the old script made its plots' folder
    assert says in refused(script, *args, *out)


def test_scale_finds_its_default_trace_from_any_folder(tmp_path: Path) -> None:
    """Its default ``--trace`` was data/... in the current folder, so it ran only from the repository's. A cluster
    of fewer than 8 GPUs is one node (it was none: a traceback)."""
    for gpus in ("10", "4"):
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--trials", "30", "--gpus", gpus],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith(f"30 trials on {gpus} GPUs (1 nodes), policy hermes\n")


def test_policy_sweep_pairs_the_seeds_as_simulate_compare_does() -> None:
    """It set FIFO's mean over all seeds against the policy's over only those where it trained the best: for
    hyperband on lcbench_189908, 4 GPUs, 10 seeds, 3.2x where `hermes simulate --compare` said 3.37x. Here, on 40 of
    its trials, hyperband trains the best in 1 seed of 3: 3.22x unpaired, 3.50x paired."""
    full = load_trace(ROOT / "data" / "lcbench_189908.csv", "max")
    trace = Trace(full.path, "max", full.trials[:40])
    rows = sweep(trace, ["fifo", "hyperband"], 3, 4, {}, 1)
    fifo, hyperband = compare(trace, ["fifo", "hyperband"], range(3), Setting(gpus=4))
    paired = hyperband.speedup(fifo, "time_to_best_s")
    assert hyperband.best_reached < fifo.best_reached  # so pairing matters:
    assert round(paired, 2) != round(fifo.time_to_best_s / hyperband.time_to_best_s, 2)
    printed = table("small", rows).splitlines()
    [line] = [line for line in printed if line.startswith("hyperband")]
    assert line.split()[3] == f"{paired:.2f}x"


@pytest.mark.parametrize("amount", ["1e400", "1e400%", "inf"])
def test_a_target_tolerance_that_overflows_is_refused_as_inf_is(amount: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``1e400`` was read as infinity, which put every trial on target, while ``inf`` was refused."""
    with pytest.raises(ValueError, match="target tolerance must be a number or a percentage"):
        Tolerance.parse(amount)
    simulate = ["simulate", "--trace", str(ROOT / "data" / "digits_mlp.csv"), "--mode", "max", "--gpus", "2",
                "--policy", "fifo"]
    assert main([*simulate, "--target-tolerance", amount]) == 2
    assert f"target tolerance must be a number or a percentage, got {amount!r}" in capsys.readouterr().err
    assert Tolerance.parse("1e300") == Tolerance(1e300, relative=False)  # large, but a number
