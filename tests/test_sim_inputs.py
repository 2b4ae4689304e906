"""What the simulator is given, read as meant: a trace's columns, a policy's period, a stopper composed with the
baseline of `--compare`, and the policy panel's header and JSON file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.policy import SchedulingPolicy
from hermes.core.trial import Trial
from hermes.errors import TraceError
from hermes.sim.compare import Setting, compare, format_table, run_one
from hermes.sim.trace import Trace, TraceTrial, load_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
DIGITS = str(ROOT / "data" / "digits_mlp.csv")
# a late riser: worst until its last epoch, where it ends best; ASHA stops it before, and never reaches the best
LATE = "trial,epoch,metric,seconds\nlate,1,0.1,1\nlate,2,0.2,1\nlate,3,0.3,1\nlate,4,0.99,1\n" + "".join(
    f"{name},{epoch},{0.4 + epoch / 10},1\n" for name in "abc" for epoch in range(1, 5))


@pytest.mark.parametrize(("column", "nearest"), [
    ("moveable", "movable"), ("state_MB", "state_mb"), ("Param_lr", "param_lr"), ("metrics", "metric"),
])
def test_a_misspelt_column_is_refused_naming_the_nearest_known_one(tmp_path: Path, column: str, nearest: str) -> None:
    """A `moveable` column of 0 left every trial movable, a `state_MB` of 2000 MB every trial at the default 100:
    the figures changed without a word, where a misspelt required column was refused."""
    path = tmp_path / "typo.csv"
    path.write_text(f"trial,epoch,metric,seconds,{column}\na,1,0.5,1,0\n")
    with pytest.raises(TraceError, match=f"^{path}:1: unknown column '{column}' \\(did you mean '{nearest}'\\?\\)"):
        load_trace(path, "max")


def test_every_column_a_trace_is_written_with_loads_and_every_shipped_trace_too(tmp_path: Path) -> None:
    trials = (TraceTrial("a", (0.1, 0.2), (1.0, 1.0), False, {"lr": 0.1, "opt": "adam"}, 12.5, False),
              TraceTrial("b", (0.3,), (2.0, 2.0), True, {"lr": 0.2, "opt": "sgd"}, None, True))
    written = tmp_path / "written.csv"
    write_trace(Trace(str(written), "max", trials), written)
    assert written.read_text().splitlines()[0] == "trial,epoch,metric,seconds,param_lr,param_opt,state_mb,movable"
    assert load_trace(written, "max").trials == trials
    for shipped in sorted((ROOT / "data").glob("*.csv")):
        assert load_trace(shipped, "max").trials
    blank = tmp_path / "trailing_comma.csv"  # a spreadsheet's export: a blank column names nothing
    blank.write_text("trial,epoch,metric,seconds,\na,1,0.5,1,\n")
    assert load_trace(blank, "max").trials[0].metrics == (0.5,)


class IntPeriod(SchedulingPolicy):
    """A policy whose period is annotated int, as `hermes run` builds it from a spec's ``period: 5``."""

    def __init__(self, period: int = 10) -> None:
        super().__init__(period)

    def priority(self, trial: Trial, now: float) -> float:
        return -trial.step


def test_a_period_annotated_int_is_given_a_whole_period_and_refuses_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--period 5` was read as 5.0, which the policy's int refused in a traceback (the pre-check built the class
    without the check); now 5 runs it as `hermes run` does, and 5.5 is one line naming the parameter."""
    policy = f"{__name__}:IntPeriod"
    simulate = ["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2"]
    assert main([*simulate, "--policy", policy, "--period", "5", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    expected = run_one(load_trace(DIGITS, "max"), policy, 0, Setting(gpus=2, period=5))
    assert (figures["policy"], figures["makespan_s"]) == ("IntPeriod", expected.makespan_s)
    assert main([*simulate, "--compare", f"fifo,{policy}", "--seeds", "1", "--period", "5", "--json"]) == 0
    assert [row["policy"] for row in json.loads(capsys.readouterr().out)] == ["fifo", policy]
    for options, option in ((["--policy", policy], f"--policy {policy}"),
                            (["--compare", f"fifo,{policy}"], f"--compare 'fifo,{policy}'")):
        assert main([*simulate, *options, "--period", "5.5"]) == 2
        assert capsys.readouterr().err == f"hermes: error: {option}: period must be a whole number, got 5.5\n"


def test_a_stopper_composed_with_the_baseline_too_is_named_in_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--stopper composes it with every policy of --compare, FIFO (the x baseline) too, but the rows read `fifo`
    and `hermes`, and x read as a speed-up over FIFO."""
    trace = load_trace(DIGITS, "max")
    summaries = compare(trace, ["fifo", "hermes"], range(2), Setting(gpus=2, stopper="median"))
    assert [s.policy for s in summaries] == ["fifo+median", "hermes+median"]
    table = format_table(summaries)
    assert table.splitlines()[2].startswith("fifo+median ")
    assert "\nx: fifo+median's mean over the policy's, over the seeds where both got there\n" in table
    assert table.endswith("\n+median: with the median early stopper composed, fifo too: x is no speed-up over "
                          "plain fifo")
    assert "1.00" in table.splitlines()[2]  # the baseline's own x: it is the baseline
    plain = format_table(compare(trace, ["fifo", "hermes"], range(2), Setting(gpus=2)))
    assert "x: fifo's mean" in plain and "+median" not in plain and "fifo+" not in plain
    options = ["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--compare", "fifo,hermes",
               "--seeds", "2", "--stopper", "median", "--json"]
    assert main(options) == 0
    assert [row["policy"] for row in json.loads(capsys.readouterr().out)] == ["fifo+median", "hermes+median"]


def panel(trace: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """bench/policy_panel.py as a user runs it, small: fifo and asha on ``trace``, 2 seeds, 1 GPU, warm costs."""
    return subprocess.run(
        [sys.executable, "bench/policy_panel.py", "--seeds", "2", "--gpus", "1", "--costs", "warm", "--policies",
         "fifo,asha", "--workers", "1", "--traces", f"{trace}:max", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_the_panel_writes_standard_json(tmp_path: Path) -> None:
    """ASHA never trains the late riser, so its speed-ups to best are no number: the file held NaN, which strict
    JSON parsers refuse."""
    trace, out = tmp_path / "late.csv", tmp_path / "panel.json"
    trace.write_text(LATE)
    run = panel(trace, "--json", str(out))
    assert run.returncode == 0, run.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"not standard JSON: {constant}")

    [block] = json.loads(out.read_text(), parse_constant=refuse)["panel"]
    asha = next(row for row in block["rows"] if row["policy"] == "asha")
    assert (asha["best_trained"], asha["best_mean_x"], asha["target_mean_x"]) == (0, None, None)


def test_the_panel_says_how_many_trials_it_judged(tmp_path: Path) -> None:
    """`--trials 20` of a trace of 4 said "20 of its trials"; it judges all 4."""
    trace = tmp_path / "late.csv"
    trace.write_text(LATE)
    run = panel(trace, "--trials", "20")
    assert run.returncode == 0, run.stderr
    assert "\n== late, all 4 of its trials, 1 GPUs, warm costs, 2 seeds\n" in run.stdout
    assert "\n== late, 3 of its trials, 1 GPUs" in panel(trace, "--trials", "3").stdout
