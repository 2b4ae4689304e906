"""The frameworks comparison (``bench/frameworks/compare.py``) at a tiny size, end to end.

The real command runs FIFO and Hermes (real runner, real warm workers, real store), Optuna with
its median pruner (two spawned workers on a journal file) and Ray Tune with ASHA (a real local Ray),
on 4 configurations of the real workload for 2 epochs each: 25-40 s on the 2-core development
machine, most of it Ray (4-6 s to start, 1.5 s to shut down, its first report 6-8 s after
``Tuner.fit``). Then again with ``--search tpe``: the same systems, each proposing its 4 trials
with Optuna's TPE (Hermes through its spec, Optuna in ``study.optimize``, Ray Tune through
``OptunaSearch``), as long again.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("optuna")
pytest.importorskip("ray")

from bench.frameworks import compare  # noqa: E402  (the repository root is on pytest's pythonpath)
from bench.frameworks.systems import Record, Size, Timeline  # noqa: E402
from bench.frameworks.workload import SPACE  # noqa: E402

SYSTEMS = ["fifo", "hermes", "optuna_median", "ray_asha"]
PRUNING = {"ray_asha"}  # ASHA may stop trials after their first epoch; the median pruner waits for 5 trials
SIZE = Size(trials=4, epochs=2)


def run_compare(path: Path, search: str, unit: str) -> tuple[dict[str, Any], str]:
    """The command's JSON and its printed output."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        compare.main([
            "--trials", str(SIZE.trials), "--epochs", str(SIZE.epochs), "--systems", ",".join(SYSTEMS),
            "--search", search, "--ratio-to", unit, "--json", str(path),
            # Trials this short never pay for a switch under the default 2% budget: allow switching so
            # that Hermes suspends and resumes them.
            "--hermes-param", "overhead_budget=0.5",
        ])
    return json.loads(path.read_text()), printed.getvalue()


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    return run_compare(tmp_path_factory.mktemp("frameworks") / "compare.json", "grid", "fifo")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    return run_compare(tmp_path_factory.mktemp("frameworks") / "compare-tpe.json", "tpe", "hermes")


def timeline_of(data: dict[str, Any], system: str) -> Timeline:
    raw = data["rounds"][0][system]
    return Timeline(system, [Record(**record) for record in raw["records"]], raw["wall"], raw["setup"])


@pytest.mark.timeout(180)
def test_every_system_reports_every_configuration_and_fifo_is_the_unit(outcome: tuple[dict[str, Any], str]) -> None:
    data, printed = outcome
    table = data["figures"]
    assert list(table) == SYSTEMS
    for system in SYSTEMS:
        timeline = timeline_of(data, system)
        epochs = {index: sorted(r.epoch for r in timeline.records if r.index == index) for index in range(SIZE.trials)}
        for index, reported in epochs.items():  # each configuration's first epochs, once each
            assert reported == list(range(1, len(reported) + 1)), (system, index, reported)
            assert len(reported) == SIZE.epochs or (system in PRUNING and reported), (system, index, reported)
        assert all(0 < r.at <= timeline.wall and r.train_seconds > 0 for r in timeline.records)
        assert 0 < table[system]["first_feedback"] < timeline.wall
        assert 0 < table[system]["training_share"] <= 1
        assert table[system]["epoch_time_vs_fifo"] > 0
        assert f"| {system} |" in printed
    for figure in compare.FIGURES:
        assert table["fifo"][f"{figure}_ratio"] == 1.0
    assert table["fifo"]["epoch_time_vs_fifo"] == 1.0
    import torch

    # the run names what its float results depend on, so runs on other machines are not mixed up with it
    assert data["machine"]["torch"] == torch.__version__
    assert data["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability() != ""
    assert f"CPU kernels {data['machine']['cpu_capability']}" in printed


@pytest.mark.timeout(180)
def test_training_is_the_same_in_every_system(outcome: tuple[dict[str, Any], str]) -> None:
    """Same configurations, seeds and thread count: every system reaches the same accuracies, and
    Hermes's suspended and resumed trials resume exactly."""
    data, _ = outcome
    assert data["rounds"][0]["hermes"]["notes"]["suspends"] > 0
    fifo = {(r.index, r.epoch): r.accuracy for r in timeline_of(data, "fifo").records}
    for system in SYSTEMS:
        assert {(r.index, r.epoch): r.accuracy for r in timeline_of(data, system).records}.items() <= fifo.items()


@pytest.mark.timeout(180)
def test_figures_follow_from_the_timelines(outcome: tuple[dict[str, Any], str]) -> None:
    data, printed = outcome
    fifo = timeline_of(data, "fifo")
    best = max(r.accuracy for r in fifo.records if r.epoch == SIZE.epochs)
    assert data["figures"]["fifo"]["final_quality"] == best
    for system in SYSTEMS:
        timeline, row = timeline_of(data, system), data["figures"][system]
        records = timeline.records
        finals = [r for r in records if r.epoch == SIZE.epochs]
        assert row["final_quality"] == max((r.accuracy for r in finals), default=None)
        hit = [r.at for r in finals if r.accuracy >= best - compare.TARGET_POINTS]
        assert row["time_to_target"] == (hit[0] if hit else None)
        # one round: the per-round line repeats the mean
        assert f"time to target {'never' if not hit else f'{hit[0]:.1f}'} s" in printed.split(f"\n{system}: wall")[1]
        firsts = [min(r.at for r in records if r.index == index) for index in range(SIZE.trials)]
        assert row["first_feedback"] == pytest.approx(statistics.fmean(firsts))
        assert row["training_share"] == pytest.approx(sum(r.train_seconds for r in records) / (2 * records[-1].at))
        for seconds, figure in zip(compare.MILESTONES, ("best_at_30s", "best_at_60s"), strict=True):
            reached = [r.accuracy for r in records if r.at <= seconds]
            assert row[figure] == (max(reached) if reached else None)
        fifo_feedback = data["figures"]["fifo"]["first_feedback"]
        assert row["first_feedback_ratio"] == pytest.approx(row["first_feedback"] / fifo_feedback)


def test_figures_of_a_timeline_with_gaps() -> None:
    """A configuration never reported counts as the wall time; a target never reached is None."""
    size = Size(trials=3, epochs=2)
    records = [
        Record(1.0, 0, 1, 0.5, 0.5),
        Record(2.0, 1, 1, 0.6, 0.5),
        Record(3.0, 0, 2, 0.7, 0.5),  # finishes below the target of 0.9 - 0.005
        Record(40.0, 1, 2, 0.897, 1.0),  # finishes within it
    ]
    figures = compare.figures(Timeline("x", records, wall=50.0), best=0.9, size=size)
    assert figures.time_to_target == 40.0
    assert figures.first_feedback == pytest.approx((1.0 + 2.0 + 50.0) / 3)
    assert (figures.best_at_30s, figures.best_at_60s) == (0.7, 0.897)
    assert figures.training_share == pytest.approx(2.5 / (2 * 40.0))
    assert figures.final_quality == 0.897
    never = compare.figures(Timeline("y", records[:3], wall=5.0), best=0.9, size=size)
    assert never.time_to_target is None and never.best_at_60s == 0.7 and not math.isnan(never.training_share)


def trained(data: dict[str, Any], system: str) -> dict[tuple[str, int], float]:
    """A system's accuracies by (configuration trained, epoch)."""
    configs = data["rounds"][0][system]["configs"]
    records = timeline_of(data, system).records
    return {(json.dumps(configs[str(r.index)], sort_keys=True), r.epoch): r.accuracy for r in records}


@pytest.mark.timeout(180)
def test_with_tpe_every_system_asks_its_own_trials_in_the_space(searched: tuple[dict[str, Any], str]) -> None:
    data, printed = searched
    assert data["search"] == "tpe" and list(data["figures"]) == SYSTEMS
    for system in SYSTEMS:
        timeline, configs = timeline_of(data, system), data["rounds"][0][system]["configs"]
        assert sorted(configs) == [str(index) for index in range(SIZE.trials)]  # the trial budget, no more
        for config in configs.values():
            assert set(config) == {*SPACE, "seed"}
            for name, parameter in SPACE.items():
                value = config[name]
                if parameter["type"] == "choice":
                    assert value in parameter["values"], (system, name, value)
                else:
                    assert parameter["low"] <= value <= parameter["high"], (system, name, value)
        for index in range(SIZE.trials):
            reported = sorted(r.epoch for r in timeline.records if r.index == index)
            assert reported == list(range(1, len(reported) + 1)), (system, index, reported)
            assert len(reported) == SIZE.epochs or (system in PRUNING and reported), (system, index, reported)
        assert f"| {system} |" in printed
    assert data["rounds"][0]["hermes"]["notes"]["suspends"] > 0
    assert data["ratio_to"] == "hermes" and "ratios to hermes:" in printed
    for figure in compare.FIGURES:  # Hermes need not reach the round's target with its own proposals
        unit, other = data["figures"]["hermes"][figure], data["figures"]["optuna_median"][figure]
        assert data["figures"]["hermes"][f"{figure}_ratio"] == (None if unit is None else 1.0)
        assert data["figures"]["optuna_median"][f"{figure}_ratio"] == (other / unit if unit and other else None)


@pytest.mark.timeout(180)
def test_with_tpe_the_seeded_sampler_proposes_alike_and_the_same_values_train_alike(
    searched: tuple[dict[str, Any], str],
) -> None:
    """4 trials are all TPE's random start-up proposals: one seeded stream, asked in turn by Hermes
    (either policy) and Ray Tune, so they train the same 4 configurations, to the same accuracies;
    Optuna's first worker, seeded alike, proposes from the same stream."""
    data, _ = searched
    fifo = trained(data, "fifo")
    configs = {system: sorted(data["rounds"][0][system]["configs"].values(), key=json.dumps) for system in SYSTEMS}
    assert configs["hermes"] == configs["fifo"] == configs["ray_asha"]
    assert any(config in configs["fifo"] for config in configs["optuna_median"])
    for system in SYSTEMS:
        mine = trained(data, system)
        shared = {key: accuracy for key, accuracy in mine.items() if key in fifo}
        assert shared and all(fifo[key] == accuracy for key, accuracy in shared.items()), system
        assert data["figures"][system]["epoch_time_vs_fifo"] > 0
    finals = {system: [r for r in timeline_of(data, system).records if r.epoch == SIZE.epochs] for system in SYSTEMS}
    best = max(r.accuracy for records in finals.values() for r in records)  # the round's best, any system's
    for system, records in finals.items():
        hit = [r.at for r in records if r.accuracy >= best - compare.TARGET_POINTS]
        assert data["figures"][system]["time_to_target"] == (hit[0] if hit else None)


def test_the_recorded_trace_is_what_the_workload_trains(tmp_path: Path) -> None:
    """``record_trace.py`` writes a trace the simulator loads, and the shipped ``data/digits_mlp.csv`` is
    its output: the first configurations, retrained here, reach the very accuracies recorded there in
    their first two epochs (later ones may drift where the CPU's instruction set differs from the
    recording machine's: ``workload.machine``)."""
    import subprocess
    import sys

    from bench.frameworks.workload import configurations
    from hermes.sim.trace import load_trace

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "digits.csv"
    subprocess.run(
        [sys.executable, str(root / "bench/frameworks/record_trace.py"), "--trials", "3", "--epochs", "2",
         "--out", str(out)],
        check=True, cwd=root, capture_output=True, timeout=300,
    )
    fresh = load_trace(out, "max")
    again = subprocess.run(  # its default was the shipped trace, replaced without a word
        [sys.executable, str(root / "bench/frameworks/record_trace.py"), "--trials", "1", "--epochs", "1",
         "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert again.returncode == 2 and "exists: give another path, or --force" in again.stderr
    assert load_trace(out, "max").trials == fresh.trials
    shipped = {trial.name: trial for trial in load_trace(root / "data/digits_mlp.csv", "max").trials}
    assert [trial.name for trial in fresh.trials] == ["0", "1", "2"]
    for trial, config in zip(fresh.trials, configurations(3)):
        assert trial.metrics == shipped[trial.name].metrics[:2]
        assert all(seconds > 0 for seconds in trial.seconds)
        assert 0 < trial.state_mb < 5  # a small MLP, its optimizer and the RNG state: well under a megabyte or two
        assert trial.params["lr"] == pytest.approx(config["lr"]) and trial.params["batch_size"] == config["batch_size"]
