"""How an unmodified program's numbers are read: a pattern that reads before the number group must not take the
number's start (its sign, its first digits), and the documented number reads ``nan`` and ``inf`` and leaves the
point that ends a sentence. Real ``hermes run``, real processes, the real store (helpers of test_run.py and
test_scripts.py)."""

from __future__ import annotations

from pathlib import Path

from hermes.core.states import TrialState
from hermes.local.launchers.process import NUMBER
from tests.test_run import hermes, load_view, run_ok, trial_dir
from tests.test_scripts import program_spec, values_of

REWARDS = ("import sys\n"
           "base = float(sys.argv[1])\n"
           "for e in range(1, 4):  # an RL loop's mean reward, and the batches it averaged (a range: no sign)\n"
           "    print(f'iter {e} (batches {e}-{e + 9}) episode_reward_mean: {base + 10 * e:.1f}', flush=True)\n")
BATCHES = r"iter (?P<step>\d+) \(batches \d+-(?P<last>\d+)\) episode_reward_mean"


def cut_error(read: str, base: int) -> str:
    return (f"trial.metrics_regex's group 'accuracy' read {read!r} in the line 'iter 1 (batches 1-10) "
            f"episode_reward_mean: {base + 10.0}', where the number begins before it (a .* or \\D* before the group "
            f"took its start: make it lazy, .*?): read it whole, with (?P<accuracy>{NUMBER})")


def test_a_pattern_that_eats_the_sign_of_the_number_fails_the_trial(tmp_path: Path) -> None:
    """Before, ``\\D*`` ate the - of -190.0: the worst trial was recorded best. The - of a range (1-10) is no sign."""
    path = program_spec(tmp_path, "rewards", REWARDS, rf"{BATCHES}\D*(?P<accuracy>{NUMBER})", 3,
                        space={"base": [-200, 50]})
    hermes("run", str(path), "--no-live", cwd=tmp_path)
    view, _ = load_view(tmp_path / "runs")
    assert sorted((trial.params["base"], trial.state, trial.error) for trial in view.trials) == [
        (-200, TrialState.FAILED, cut_error("190.0", -200)), (50, TrialState.COMPLETED, None)]
    assert [(record.step, record.values) for record in view.metrics] == [
        (e, {"accuracy": 50 + 10.0 * e, "last": e + 9.0}) for e in (1, 2, 3)]


def test_a_greedy_pattern_before_the_number_fails_the_trial_and_the_lazy_one_it_suggests_reads_it(
    tmp_path: Path,
) -> None:
    """Before, a greedy ``.*`` left the group only the last 0 of every reward, recorded as 0."""
    (tmp_path / "greedy").mkdir()
    path = program_spec(tmp_path / "greedy", "rewards", REWARDS, rf"{BATCHES}.*(?P<accuracy>{NUMBER})", 3,
                        space={"base": [50]})
    hermes("run", str(path), "--no-live", cwd=path.parent)
    view, _ = load_view(path.parent / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, cut_error("0", 50))]
    assert view.metrics == []

    (tmp_path / "lazy").mkdir()
    run_ok(program_spec(tmp_path / "lazy", "rewards", REWARDS, rf"{BATCHES}.*?(?P<accuracy>{NUMBER})", 3,
                        space={"base": [-200, 50]}))
    view, _ = load_view(tmp_path / "lazy" / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)] * 2
    bases = {trial.trial_id: trial.params["base"] for trial in view.trials}
    assert sorted((bases[record.trial_id], record.step, record.values["accuracy"]) for record in view.metrics) == [
        (base, e, base + 10.0 * e) for base in (-200, 50) for e in (1, 2, 3)]


LEADERS = ("for e in range(1, 4):  # a report's fields joined by points: leader dots, a step after a word's point\n"
           "    print(f'epoch.{e} Accuracy.....{0.5 + e / 10:.3f}', flush=True)\n")


def test_points_before_the_group_that_are_not_the_number_s_are_no_cut(tmp_path: Path) -> None:
    """A point after a letter or after another point ends a word or leads to the number: the first form of the
    check failed ``Accuracy\\.+(?P<accuracy>...)`` on ``Accuracy.....0.600`` and ``epoch\\.(?P<step>...)`` on
    ``epoch.12``, suggesting the pattern the user had written."""
    run_ok(program_spec(tmp_path, "leaders", LEADERS, rf"epoch\.(?P<step>\d+) Accuracy\.+(?P<accuracy>{NUMBER})", 3,
                        space={"base": [0]}))
    view, _ = load_view(tmp_path / "runs")
    assert [(record.step, record.values["accuracy"]) for record in view.metrics] == [(1, 0.6), (2, 0.7), (3, 0.8)]


PRINTS = ("for epoch, (loss, accuracy) in enumerate([  # Python's floats: small, negative, diverged, in sentences\n"
          "        ('0.5', '0.25.'), ('1.', '.5'), ('1e-3', '0.75.'), ('nan', '-inf'), ('-Infinity', 'NaN'),\n"
          "        ('inf', 'nan.')], 1):\n"
          "    print(f'epoch {epoch} loss {loss} accuracy {accuracy}', flush=True)\n")


def test_the_documented_pattern_reads_nan_and_inf_and_leaves_a_sentence_s_point(tmp_path: Path) -> None:
    """Before, the documented pattern missed ``nan`` and ``inf`` (a diverged trial was shown completed with its last
    finite value) and read ``0.25.`` as no number (the step was lost)."""
    docs = (Path(__file__).parents[1] / "docs" / "trials.md").read_text()
    pattern = docs.split("Example, for `examples/scripts/print_metrics.py`:\n\n```\n")[1].split("\n")[0]
    assert pattern.count(NUMBER) == 2  # the number Hermes's own messages suggest
    run_ok(program_spec(tmp_path, "diverged", PRINTS, pattern.replace("<value>", "<accuracy>"), 6))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert [(record.step, {name: str(value) for name, value in record.values.items()}) for record in view.metrics] == [
        (1, {"loss": "0.5", "accuracy": "0.25"}), (2, {"loss": "1.0", "accuracy": "0.5"}),
        (3, {"loss": "0.001", "accuracy": "0.75"}), (4, {"loss": "nan", "accuracy": "-inf"}),
        (5, {"loss": "-inf", "accuracy": "nan"}), (6, {"loss": "inf", "accuracy": "nan"})]


UNREAD = ("import time\n"
          "for epoch in range(1, 4):\n"
          "    print(f'epoch {epoch} accuracy {epoch / 4}' + ('.' if epoch < 3 else ''), flush=True)\n"
          "    time.sleep(0.05)\n")


def test_an_objective_that_reads_no_number_is_said_once_in_the_trial_s_stderr_log_while_it_runs(
    tmp_path: Path,
) -> None:
    """Before, a line whose objective read no number was said only if the program ended with no report at all: one
    that went on printing so reported nothing for those steps, without a word."""
    path = program_spec(tmp_path, "unread", UNREAD, r"epoch (?P<step>\d+) accuracy (?P<accuracy>\S+)", 3)
    run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert values_of(tmp_path / "runs") == {"0": [(3, 0.75)]}
    log = (trial_dir(tmp_path / "runs", {"name": "unread"}, "0") / "stderr.log").read_text()
    assert log == ("hermes: trial 0: a line that matched trial.metrics_regex is no report: its group 'accuracy' read "
                   "'0.25.', not a number, in the line 'epoch 1 accuracy 0.25.'\n")
