"""Trace loading, its error messages, and the synthetic curve families."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hermes.errors import TraceError
from hermes.sim.synthetic import CURVES, synthetic_trace
from hermes.sim.trace import Trace, load_trace, write_trace

DATA = Path(__file__).resolve().parent.parent / "data"
HEADER = "trial,epoch,metric,seconds\n"


@pytest.fixture(scope="module")
def lcbench() -> Trace:
    return load_trace(DATA / "lcbench_189908.csv", "max")


@pytest.fixture(scope="module")
def nasbench() -> Trace:
    return load_trace(DATA / "nasbench_nlp_wt2.csv", "min")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    def rank(x: np.ndarray) -> np.ndarray:
        return np.argsort(np.argsort(x))

    return float(np.corrcoef(rank(a), rank(b))[0, 1])


def metric_matrix(trace: Trace) -> np.ndarray:
    """Trials x epochs, for traces without diverged trials; larger is better in either mode."""
    sign = 1.0 if trace.mode == "max" else -1.0
    return sign * np.array([trial.metrics for trial in trace.trials])


# Real traces.


def test_lcbench_shape(lcbench: Trace) -> None:
    assert len(lcbench.trials) == 500
    assert all(t.epochs == 52 and len(t.metrics) == 52 and not t.diverged for t in lcbench.trials)
    assert [t.name for t in lcbench.trials[:3]] == ["0", "1", "2"]
    assert lcbench.trials[0].metrics[:2] == (10.098, 50.476)
    assert lcbench.trials[0].seconds[0] == 19.097
    assert lcbench.trials[0].params["batch_size"] == 29.0
    assert set(lcbench.trials[0].params) == {
        "batch_size", "learning_rate", "momentum", "weight_decay", "num_layers", "max_units", "max_dropout",
    }


def test_nasbench_shape(nasbench: Trace) -> None:
    assert len(nasbench.trials) == 345
    diverged = [t for t in nasbench.trials if t.diverged]
    assert len(diverged) == 4
    assert all(len(t.seconds) == len(t.metrics) + 1 for t in diverged)
    assert all(t.epochs == 50 for t in nasbench.trials if not t.diverged)
    assert Counter(t.epochs for t in diverged) == {1: 2, 19: 1, 23: 1}


def test_best_final(lcbench: Trace, nasbench: Trace) -> None:
    assert lcbench.best_final().name == "45"
    assert lcbench.best_final().metrics[-1] == max(t.metrics[-1] for t in lcbench.trials)
    best = nasbench.best_final()
    assert not best.diverged
    assert best.metrics[-1] == min(t.metrics[-1] for t in nasbench.trials if not t.diverged)


def test_best_final_skips_diverged_and_prefers_first_on_ties(tmp_path: Path) -> None:
    path = tmp_path / "ties.csv"
    path.write_text(HEADER + "a,1,5,1\nb,1,9,1\nb,2,,1\nc,1,5,1\n")
    assert load_trace(path, "max").best_final().name == "a"
    assert load_trace(path, "min").best_final().name == "a"
    assert [t.name for t in load_trace(path, "min").best_finals()] == ["a", "c"]  # every trial tied for best
    assert [t.name for t in load_trace(path, "max").best_finals()] == ["a", "c"]


def test_best_final_needs_a_finished_trial() -> None:
    trace = synthetic_trace(3, 4, seed=0, diverge_fraction=1.0)
    with pytest.raises(TraceError, match="every trial diverged"):
        trace.best_final()


def test_shuffled_is_a_seeded_permutation(lcbench: Trace) -> None:
    order = lcbench.shuffled(7)
    assert sorted(order, key=lambda t: int(t.name)) == list(lcbench.trials)
    assert order != lcbench.trials
    assert order == lcbench.shuffled(7)
    assert order != lcbench.shuffled(8)


def test_params_keep_text_that_is_not_a_number(tmp_path: Path) -> None:
    path = tmp_path / "params.csv"
    path.write_text("trial,epoch,metric,seconds,param_opt,param_lr\nx,1,0.5,2,adam,1e-3\nx,2,0.6,2,adam,1e-3\n")
    assert dict(load_trace(path, "max").trials[0].params) == {"opt": "adam", "lr": 0.001}


def test_movable_column_is_optional_and_read_from_a_trials_first_row(tmp_path: Path, lcbench: Trace) -> None:
    """An unmodified program's trial (suspended in place, state in its process) is marked 0, so the simulator does not
    migrate it; without the column, or with an empty cell, a trial is movable, as every shipped trace's is."""
    path = tmp_path / "movable.csv"
    path.write_text(HEADER.rstrip("\n") + ",movable\na,1,0.1,1,0\na,2,0.2,1,0\nb,1,0.3,1,1\nc,1,0.4,1,\n")
    trace = load_trace(path, "max")
    assert [t.movable for t in trace.trials] == [False, True, True]
    written = tmp_path / "written.csv"
    write_trace(trace, written)
    assert written.read_text().splitlines()[:2] == ["trial,epoch,metric,seconds,movable", "a,1,0.1,1.0,0"]
    assert load_trace(written, "max").trials == trace.trials
    assert all(t.movable for t in lcbench.trials)
    write_trace(lcbench, written)  # all movable: no column, the file as before
    assert "movable" not in written.read_text().partition("\n")[0]


# Bad files: each error names the file and the line.

BAD_FILES = {
    "empty": ("", 1, "empty file"),
    "header_only": (HEADER, 1, "not followed by any rows"),
    "missing_column": ("trial,epoch,metric\n0,1,0.5\n", 1, "missing column 'seconds'"),
    "column_twice": (HEADER.rstrip("\n") + ",metric\n0,1,0.5,3,0.9\n", 1, "column 'metric' appears twice"),
    "ragged_row": (HEADER + "0,1,0.5,3\n0,2,0.6\n", 3, "expected 4 fields"),
    "epoch_not_integer": (HEADER + "0,1,0.5,3\n0,two,0.6,3\n", 3, "epoch must be an integer, got 'two'"),
    "metric_not_number": (HEADER + "0,1,high,3\n", 2, "metric must be a number, got 'high'"),
    "seconds_not_number": (HEADER + "0,1,0.5,\n", 2, "seconds must be a number, got ''"),
    "negative_seconds": (HEADER + "0,1,0.5,3\n0,2,0.6,-1\n", 3, "seconds must be finite and >= 0"),
    "nan_seconds": (HEADER + "0,1,0.5,nan\n", 2, "seconds must be finite and >= 0"),
    "infinite_seconds": (HEADER + "0,1,0.5,inf\n", 2, "seconds must be finite and >= 0"),
    "nan_metric": (HEADER + "0,1,0.5,3\n0,2,nan,3\n", 3, "metric must be finite"),
    "infinite_metric": (HEADER + "0,1,-inf,3\n", 2, "metric must be finite"),
    "epoch_skipped": (HEADER + "5,1,0.5,3\n5,3,0.6,3\n", 3, "epoch 3 of trial 5 follows epoch 1"),
    "epoch_not_from_1": (HEADER + "0,1,0.5,3\n1,2,0.6,3\n", 3, "epoch 2 of trial 1 is its first row"),
    "epoch_repeated": (HEADER + "0,1,0.5,3\n0,2,0.6,3\n0,2,0.6,3\n", 4, "epoch 2 of trial 0 follows epoch 2"),
    "not_contiguous": (HEADER + "0,1,0.5,3\n1,1,0.5,3\n0,2,0.6,3\n", 4, "trial 0 continues after other trials"),
    "row_after_divergence": (HEADER + "0,1,0.5,3\n0,2,,3\n0,3,0.7,3\n", 4, "row after it diverged in epoch 2"),
    "movable_not_a_flag": (HEADER.rstrip("\n") + ",movable\n0,1,0.5,3,yes\n", 2, "movable must be 1 or 0, got 'yes'"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_file(tmp_path: Path, case: str) -> None:
    text, line, message = BAD_FILES[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as error:
        load_trace(path, "max")
    assert str(error.value).startswith(f"{path}:{line}: ")
    assert message in str(error.value)


def test_a_file_that_is_not_utf8_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(HEADER.encode() + "\xe9,1,0.5,3\n".encode("latin-1"))
    with pytest.raises(TraceError, match=f"^{path}: not UTF-8 text"):
        load_trace(path, "max")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.csv"
    with pytest.raises(TraceError, match="absent.csv: cannot open"):
        load_trace(path, "max")


def test_bad_mode() -> None:
    with pytest.raises(TraceError, match="lcbench_189908.csv: mode must be 'max' or 'min', got 'best'"):
        load_trace(DATA / "lcbench_189908.csv", "best")


def test_blank_lines_are_skipped_and_do_not_shift_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "blank.csv"
    path.write_text(HEADER + "0,1,0.5,3\n\n0,3,0.6,3\n")
    with pytest.raises(TraceError, match=r"blank.csv:4: epoch 3 of trial 0 follows epoch 1"):
        load_trace(path, "max")


# Synthetic traces.


@pytest.mark.parametrize("mode", ["max", "min"])
def test_synthetic_round_trip(tmp_path: Path, mode: str) -> None:
    trace = synthetic_trace(40, 12, seed=3, mode=mode, diverge_fraction=0.25, noise=0.02)
    path = tmp_path / "synthetic.csv"
    write_trace(trace, path)
    loaded = load_trace(path, mode)
    assert loaded.trials == trace.trials
    assert loaded.mode == mode


def test_synthetic_is_deterministic_per_seed() -> None:
    def make(seed: int) -> Trace:
        return synthetic_trace(30, 10, seed=seed, diverge_fraction=0.2, noise=0.01)

    assert make(5) == make(5)
    assert make(5).trials != make(6).trials


@pytest.mark.parametrize("kind", ["saturating", "crossing", "misleading_first", "noisy", "mixed"])
@pytest.mark.parametrize("mode", ["max", "min"])
def test_synthetic_basics(kind: str, mode: str) -> None:
    trace = synthetic_trace(50, 20, seed=1, mode=mode, kind=kind, epoch_seconds=(5.0, 8.0))
    assert [t.name for t in trace.trials] == [str(i) for i in range(50)]
    assert all(t.epochs == 20 and not t.diverged for t in trace.trials)
    seconds = np.array([t.seconds for t in trace.trials])
    assert seconds.min() >= 5.0 * 0.95 and seconds.max() <= 8.0 * 1.05
    assert np.all(seconds.std(axis=1) < 0.05 * seconds.mean(axis=1))  # constant per trial, up to jitter
    assert np.all(np.isfinite(metric_matrix(trace)))


@pytest.mark.parametrize("mode", ["max", "min"])
def test_saturating_improves_monotonically_and_few_trials_are_good(mode: str) -> None:
    trace = synthetic_trace(200, 30, seed=0, mode=mode, kind="saturating")
    metrics = metric_matrix(trace)
    assert np.all(np.diff(metrics, axis=1) >= 0)  # accuracy rises, loss falls
    final = metrics[:, -1]
    halfway = (np.median(final) + final.max()) / 2
    assert np.mean(final >= halfway) < 0.15


@pytest.mark.parametrize("mode", ["max", "min"])
def test_crossing_slow_starter_ends_best(mode: str) -> None:
    trace = synthetic_trace(100, 30, seed=0, mode=mode, kind="crossing")
    metrics = metric_matrix(trace)
    assert int(trace.best_final().name) != int(np.argmax(metrics[:, 0]))
    assert spearman(metrics[:, 0], metrics[:, -1]) < -0.5


def test_misleading_first_epoch_only() -> None:
    metrics = metric_matrix(synthetic_trace(200, 30, seed=0, kind="misleading_first"))
    assert spearman(metrics[:, 0], metrics[:, -1]) < 0.1
    assert spearman(metrics[:, 15], metrics[:, -1]) > 0.8


def test_noisy_curves_often_go_the_wrong_way() -> None:
    metrics = metric_matrix(synthetic_trace(100, 30, seed=0, kind="noisy"))
    assert np.mean(np.diff(metrics, axis=1) < 0) > 0.3


def test_mixed_uses_every_kind() -> None:
    trace = synthetic_trace(100, 5, seed=0)
    assert {t.params["kind"] for t in trace.trials} == set(CURVES)


def test_diverge_fraction() -> None:
    trace = synthetic_trace(100, 20, seed=2, diverge_fraction=0.1)
    diverged = [t for t in trace.trials if t.diverged]
    assert len(diverged) == 10
    assert all(len(t.seconds) == len(t.metrics) + 1 and 1 <= t.epochs <= 20 for t in diverged)
    assert len({t.epochs for t in diverged}) > 1


@pytest.mark.parametrize("correlation", [0.7, -0.7])
def test_sized_trials_width_sets_epoch_time_and_tracks_quality(correlation: float) -> None:
    plain = synthetic_trace(200, 20, seed=4, epoch_seconds=(10.0, 60.0))
    trace = synthetic_trace(200, 20, seed=4, epoch_seconds=(10.0, 60.0), size_quality=correlation)
    assert [t.metrics for t in trace.trials] == [t.metrics for t in plain.trials]  # the same curves
    widths = np.array([t.params["width"] for t in trace.trials])
    seconds = np.array([t.seconds[0] for t in trace.trials])
    assert spearman(widths, seconds) > 0.85
    assert spearman(widths, metric_matrix(trace)[:, -1]) * np.sign(correlation) > 0.5
    assert seconds.min() >= 10.0 * 0.95 and seconds.max() <= 60.0 * 1.05


@pytest.mark.parametrize(
    "arguments",
    [
        {"trials": 0},
        {"epochs": 0},
        {"mode": "best"},
        {"kind": "spiky"},
        {"epoch_seconds": (5.0, 1.0)},
        {"diverge_fraction": 1.5},
        {"noise": -0.1},
        {"size_quality": 1.5},
    ],
)
def test_synthetic_rejects_bad_arguments(arguments: dict) -> None:
    with pytest.raises(ValueError):
        synthetic_trace(**{"trials": 5, "epochs": 5, "seed": 0, **arguments})
