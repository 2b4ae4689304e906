"""Unmodified programs whose metrics line is redrawn in place with \\r, read without a step group: a line is one step,
so a bar over all the epochs is one report; the trial's stderr.log says so. Real ``hermes run``, real processes, the
real store (helpers of test_scripts.py and test_run.py)."""

from __future__ import annotations

from pathlib import Path

from hermes.core.states import TrialState
from tests.test_run import load_view, run_ok
from tests.test_scripts import program_spec, values_of

REDRAWN = r"""
import sys, time
if sys.argv[1] == "bar":  # a tqdm bar over the epochs, its postfix set after each: one line until the program ends
    for epoch in range(1, 5):
        for redraw in range(2):  # drawn again as it moves, and as its postfix is set: the same value, said once
            sys.stdout.write(f"\rtrain: {epoch}/4 [{'#' * epoch:4}] accuracy={epoch / 10:.2f}")
            sys.stdout.flush()
            time.sleep(0.01)
    sys.stdout.write("\n")
    sys.stderr.write("\rsaving: 3/3")  # a bar on stderr, tqdm's stream, that leaves its line open
else:  # Keras' fit(verbose=1): a line an epoch, redrawn with \r after every batch as its running value changes
    for epoch in range(1, 4):
        for batch in range(1, 4):
            sys.stdout.write(f"\r{batch}/3 [{'=' * batch:3}] - accuracy={epoch / 10 + batch / 100:.2f}")
            sys.stdout.flush()
            time.sleep(0.01)
        sys.stdout.write("\n")
"""


def test_a_bar_over_all_the_epochs_read_without_a_step_group_is_said_in_the_trials_log(tmp_path: Path) -> None:
    """Before, the bar's trial completed at 1/4 steps, its one report epoch 4's value, and nothing said why: the
    policy had no report until the program ended. A Keras line an epoch is a step each, as it should: not said."""
    path = program_spec(tmp_path, "redrawn", REDRAWN, r"accuracy=(?P<accuracy>[\d.]+)", 4,
                        space={"kind": ["bar", "keras"]})
    run_ok(path)
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)] * 2
    assert values_of(tmp_path / "runs") == {"0": [(1, 0.4)], "1": [(1, 0.13), (2, 0.23), (3, 0.33)]}
    trials = tmp_path / "runs" / "redrawn" / "trials"
    bar = (trials / "0" / "stderr.log").read_bytes().decode()  # its \r as written
    assert bar == ("\rsaving: 3/3\n"  # the note on a line of its own: it was appended to the bar's
                   "hermes: trial 0: its only report (of budget.steps 4) is the last of 4 values of accuracy that a "
                   "line redrawn with \\r showed in turn: without a step group in trial.metrics_regex, a line is one "
                   "step (one epoch's batches: nothing is wrong). If the line shows one epoch after another (a tqdm "
                   "bar over the epochs), print the epoch in it (set_postfix(epoch=epoch + 1, ...)) and read it with "
                   "a step group (epoch=(?P<step>\\d+))\n"), bar
    assert (trials / "1" / "stderr.log").read_text() == ""
