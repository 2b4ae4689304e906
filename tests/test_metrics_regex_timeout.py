"""A trial.metrics_regex that backtracks without end fails its trial after a bounded search, and the run goes on.

Before, ``re`` searched each line in the runner's thread holding the GIL: ``(a|a)+(?P<value>\\d+)`` on a line of 40
``a`` froze ``hermes run`` (and ``hermes server``'s API, for every user) for hours. Now the ``regex`` package searches
with a time limit. Real ``hermes run``, real processes, the real store."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hermes.core.states import TrialState
from tests.test_run import hermes, load_view
from tests.test_scripts import program_spec

# seed 0 prints a line the pattern almost matches, then a report; seed 1 a report only
PROGRAM = ("import sys\n"
           "if sys.argv[1] == '0':\n"
           "    print('a' * 40, flush=True)\n"
           "print('a7', flush=True)\n")


@pytest.mark.parametrize("pattern", [r"(?:a|a)+(?P<value>\d+)", r".*?(?:a|a)+(?P<value>\d+)"])
def test_a_pattern_that_backtracks_without_end_fails_its_trial_and_the_run_goes_on(tmp_path: Path,
                                                                                   pattern: str) -> None:
    """Searched, or led by a repeat and so matched at a few starts (``_search``): one time limit for the line."""
    path = program_spec(tmp_path, "redos", PROGRAM, pattern, 1, space={"seed": [0, 1]})
    result = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=30)  # before: no end
    assert "Traceback" not in result.stderr, result.stderr
    view, _ = load_view(tmp_path / "runs")
    states = {trial.params["seed"]: (trial.state, trial.error) for trial in view.trials}
    assert states[1] == (TrialState.COMPLETED, None)  # the same pattern on a line that matches reads it
    state, error = states[0]
    assert state == TrialState.FAILED
    assert error.startswith("trial.metrics_regex took over its limit of 2 s to search one line "
                            "(of 40 characters"), error
    assert "nested repeats such as (a+)+" in error and "repeat each part once (a+)" in error, error
    assert [(record.trial_id, record.values["value"]) for record in view.metrics] == [
        (trial.trial_id, 7.0) for trial in view.trials if trial.params["seed"] == 1]


def test_the_pattern_that_froze_a_server_reads_its_reports(tmp_path: Path) -> None:
    """``(?:a+)+`` froze the server with ``re``; ``regex`` fails it on the line of 40 ``a`` at once."""
    path = program_spec(tmp_path, "nested", PROGRAM, r"(?:a+)+(?P<value>\d+)", 1, space={"seed": [0, 1]})
    result = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)] * 2
    assert sorted(record.values["value"] for record in view.metrics) == [7.0, 7.0]


@pytest.mark.parametrize("pattern", [r"\p{L}(?P<value>\d)", r"(?|(?P<value>\d))"])
def test_the_spec_takes_python_re_syntax_only(pattern: str) -> None:
    """What the spec accepts is what runs: Python's re syntax, which regex reads alike, not regex's extensions."""
    from hermes.experiment.spec import TrialSpec
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="does not compile"):
        TrialSpec(command=f"{sys.executable} x.py", metrics_regex=pattern)


def test_a_sound_pattern_on_a_long_line_beside_busy_threads_is_searched_well_within_the_limit() -> None:
    """A pattern led by a repeat was matched at each place it could start, one timed match each: on a line of 16,000
    characters with no metric, beside two busy threads (a server's), the GIL handed over at each took the search past
    its limit (1 s then), and a sound pattern failed its trial as backtracking without end."""
    import re
    import threading

    from hermes.local.launchers.process import _search

    line = ("per-class recall " + ", ".join(f"class_{index}" for index in range(3000)))[:16000]
    busy = threading.Event()

    def spin() -> None:
        while not busy.is_set():
            pass

    threads = [threading.Thread(target=spin) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        assert _search(re.compile(r"\s*val_acc[:=]\s*(?P<value>[\d.]+)"), line, 0) is None  # before: TimeoutError
        assert _search(re.compile(r"\s*val_acc[:=]\s*(?P<value>[\d.]+)"), line + " val_acc: 0.93", 0)["value"] == "0.93"
    finally:
        busy.set()
        for thread in threads:
            thread.join()
