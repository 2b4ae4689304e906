"""`hermes simulate` from the command line: what --compare's table says, which seeds it runs, the options it
refuses, where it finds a policy of one's own, and the trials a policy never ran."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.core.policy import SchedulingPolicy
from hermes.core.trial import Trial
from hermes.plugins import load_class
from hermes.sim.compare import Setting, run_one
from hermes.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
DIGITS = str(ROOT / "data" / "digits_mlp.csv")
SIMULATE = ["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2"]


def _rows(out: str, policies: int) -> dict[str, list[str]]:
    """The table's rows by policy, under the line that heads the output, the header and its rule."""
    return {line.split()[0]: line.split() for line in out.splitlines()[3:3 + policies]}


def test_compare_gives_speed_ups_over_the_same_seeds_and_how_many_reached_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ASHA reaches digits' target in 6 of 10 arrival orders: its x divided FIFO's mean over all 10 by its own over
    those 6 (1.22x, as if faster than FIFO); over the same 6 seeds it is 0.83x. The table did not say 6/10."""
    trace, setting, seeds = load_trace(DIGITS, "max"), Setting(gpus=2), range(10)
    fifo = [run_one(trace, "fifo", seed, setting).time_to_target_s for seed in seeds]
    asha = [run_one(trace, "asha", seed, setting).time_to_target_s for seed in seeds]
    both = [(f, a) for f, a in zip(fifo, asha) if f is not None and a is not None]
    paired = statistics.fmean(f for f, _ in both) / statistics.fmean(a for _, a in both)
    assert len(both) == 6 and round(paired, 2) == 0.83  # the case this test is about

    assert main([*SIMULATE, "--compare", "fifo,asha", "--seeds", "10"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out, 2)  # policy, best, to best, x, to target, x, target, ...
    assert float(rows["asha"][5]) == round(paired, 2), rows
    assert "to target min      x  target" in out.splitlines()[1]
    assert rows["asha"][6] == "6/10" and rows["fifo"][6] == "10/10"
    assert "x: fifo's mean over the policy's, over the seeds where both got there" in out


def test_compare_runs_the_seeds_from_seed_on(capsys: pytest.CaptureFixture[str]) -> None:
    """--seed was ignored with --compare: --seeds 1 --seed 5 ran seed 0."""
    assert main([*SIMULATE, "--policy", "fifo", "--seed", "5", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*SIMULATE, "--compare", "fifo", "--seeds", "1", "--seed", "5", "--json"]) == 0
    [compared] = json.loads(capsys.readouterr().out)
    assert main([*SIMULATE, "--compare", "fifo", "--seeds", "1", "--json"]) == 0
    [first] = json.loads(capsys.readouterr().out)
    assert compared["time_to_target_s"] == alone["time_to_target_s"] != first["time_to_target_s"]
    assert main([*SIMULATE, "--compare", "fifo", "--seeds", "2", "--seed", "5"]) == 0
    assert "2 seeds from 5\n" in capsys.readouterr().out


@pytest.mark.parametrize(("options", "told"), [
    (["--policy", "fifo", "--seeds", "3"], "--seeds: only with --compare (a single run is of --seed 0)"),
    (["--workers", "2", "--seeds", "3"], "--seeds and --workers: only with --compare"),
    (["--compare", "fifo,asha", "--policy", "hermes"], "--policy hermes: --compare names the policies"),
    (["--experiment", "sweep"], "--experiment sweep: only with a storage dir as --trace, not a CSV"),
], ids=["seeds", "workers", "policy", "experiment"])
def test_options_that_would_change_nothing_are_refused(
    options: list[str], told: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SIMULATE, *options]) == 2
    assert capsys.readouterr().err.startswith(f"hermes: error: {told}")


POLICY = """
from hermes.core.policy import SchedulingPolicy

class ShortestFirst(SchedulingPolicy):
    def priority(self, trial, now):
        return -trial.step
"""


def test_a_policy_beside_the_trials_code_is_simulated_from_its_folder(tmp_path: Path) -> None:
    """docs/extending.md: a module:Class needs no registration. `hermes simulate` (a console script, which does not
    put the current folder on Python's path) said ModuleNotFoundError for one in the folder it ran in; worker
    processes (--workers) import it too."""
    (tmp_path / "beside.py").write_text(POLICY)
    command = [sys.executable, "-P", "-m", "hermes.cli", *SIMULATE, "--json"]  # -P: no folder added to the path

    def simulate(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *options], cwd=tmp_path, capture_output=True, text=True, check=False,
                              timeout=60)

    one = simulate("--policy", "beside:ShortestFirst")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["policy"] == "ShortestFirst"
    compared = simulate("--compare", "fifo,beside:ShortestFirst", "--seeds", "2", "--workers", "2")
    assert compared.returncode == 0, compared.stderr
    assert [row["seeds"] for row in json.loads(compared.stdout)] == [2, 2]


def test_a_plug_in_folder_is_on_the_path_for_its_import_only(tmp_path: Path) -> None:
    """It cannot shadow Hermes's modules (found in Hermes's package, not on the path), and leaves the path as it
    was; a module found nowhere says where it was looked for, and how a run finds one."""
    from hermes.plugins import importable_from

    (tmp_path / "plug_in_folder_only.py").write_text(POLICY)
    (tmp_path / "hermes.py").write_text("raise SystemExit('shadowed')\n")
    path = list(sys.path)
    try:
        with importable_from(tmp_path):
            assert load_class("plug_in_folder_only:ShortestFirst", SchedulingPolicy).__name__ == "ShortestFirst"
            assert load_class("hermes.policies.fifo:FifoPolicy", SchedulingPolicy).__name__ == "FifoPolicy"
            with pytest.raises(ValueError, match=f"No module named 'absent_plug_in' .looked for in {tmp_path} and"):
                load_class("absent_plug_in:X", SchedulingPolicy)
    finally:
        sys.modules.pop("plug_in_folder_only", None)
    assert sys.path == path
    with pytest.raises(ValueError, match="not from trial.workdir: install its package, or add its folder to PYTHONP"):
        load_class("plug_in_folder_only:ShortestFirst", SchedulingPolicy)


class NeverA(SchedulingPolicy):
    """Never runs trial ``a``."""

    time_sharing = False

    def priority(self, trial: Trial, now: float) -> float | None:
        return None if trial.trial_id == "a" else 0.0


def test_trials_a_policy_never_ran_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulation ended quietly with "trials: 4" and first feedback over the 3 that ran; a real run says the
    fourth was stopped before its first report."""
    trace = tmp_path / "t.csv"
    trace.write_text("trial,epoch,metric,seconds\na,1,0.5,10\na,2,0.99,10\nb,1,0.7,5\nc,1,0.6,20\nd,1,0.9,1\n")
    simulate = ["simulate", "--trace", str(trace), "--mode", "max", "--gpus", "1"]
    assert main([*simulate, "--policy", f"{__name__}:NeverA", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    why = f"policy {__name__}:NeverA answered priority() None (not now) with nothing running and no trial to come"
    assert figures["stopped_before_first_report"] == ["a"]
    assert [text.startswith(why) for text in figures["stopped_before_first_report_why"]] == [True]
    assert main([*simulate, "--policy", f"{__name__}:NeverA"]) == 0
    assert f"stopped_before_first_report: 1 (a)\n                        why: {why}" in capsys.readouterr().out
    assert main([*simulate, "--compare", f"fifo,{__name__}:NeverA", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{__name__}:NeverA: 1 trial(s) per seed stopped before the first report" in out
    assert "fifo:" not in out


def test_a_trial_that_diverged_in_its_first_epoch_is_not_counted_as_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """FIFO ran b, which diverged in its first epoch and failed (a real run says "failed before its first
    report"); the simulation counted it as stopped before its first report, as if FIFO had never run it, and
    --compare said so of every policy."""
    trace = tmp_path / "t.csv"
    trace.write_text("trial,epoch,metric,seconds\na,1,0.5,10\na,2,0.6,10\nb,1,,4\nc,1,0.7,5\n")
    simulate = ["simulate", "--trace", str(trace), "--mode", "max", "--gpus", "1"]
    assert main([*simulate, "--policy", "fifo", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["stopped_before_first_report"] == figures["stopped_before_first_report_why"] == []
    assert main([*simulate, "--policy", f"{__name__}:NeverA", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stopped_before_first_report"] == ["a"]
    assert main([*simulate, "--compare", "fifo,rr", "--seeds", "2"]) == 0
    assert "stopped before the first report" not in capsys.readouterr().out
