"""What `hermes run` prints of its trials. It said "trial N completed" before the store had committed that end: after
a kill -9 at that moment the store had the trial still running, and the rerun trained it on and said it again. And a
line it could not write (a full disk under its output) stopped the experiment, saying "no space left: a file". Real
sessions, their real engine, store recorder and printers, real trials."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hermes.cli import _progress_printer
from hermes.experiment import load_spec
from hermes.session import ExperimentSession
from hermes.store import ExperimentStatus
from tests.test_run import (
    RUN_TIMEOUT,
    TESTS,
    environment,
    hermes_command,
    load_view,
    spec_of,
    write_spec,
)

LINE = re.compile(r"^\[ *[\d.]+s\] trial (\S+) (\w+) at step (\d+)")


def test_each_line_of_a_trials_end_is_printed_once_the_store_has_that_end(tmp_path: Path) -> None:
    spec = spec_of(
        "said",
        trial={"function": "trials.curve:train", "workdir": str(TESTS), "max_failures": 0},
        search={"sampler": "list", "configs": [
            {"rate": 0.5, "crash": "none"},
            {"rate": 0.5, "crash": "raise"},  # at step 2
            {"rate": 0.9, "crash": "none"},
        ]},
        budget={"steps": 3},
    )
    session = ExperimentSession(load_spec(write_spec(tmp_path, spec)))
    said: list[tuple[str, str, int, str, int]] = []  # trial, state and step said, and as the store had them then

    def stored_as_said(line: str) -> None:
        trial_id, state, step = LINE.match(line).groups()  # type: ignore[union-attr]
        stored = {record.trial_id: record for record in session.store.trials(session.experiment_id)}.get(trial_id)
        said.append((trial_id, state, int(step), stored.state.value if stored else "absent",
                     stored.step if stored else -1))

    # without the live view, and with it (only the failures)
    session.listeners += [_progress_printer(session, stored_as_said),
                          _progress_printer(session, stored_as_said, only_errors=True)]
    try:
        session.run()
    finally:
        session.store.close()
    assert sorted(said) == sorted([
        ("0", "completed", 3, "completed", 3),
        ("1", "failed", 1, "failed", 1),
        ("1", "failed", 1, "failed", 1),  # the live view's line
        ("2", "completed", 3, "completed", 3),
    ]), said


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_output_that_cannot_be_written_is_dropped_and_the_experiment_goes_on(tmp_path: Path, buffered: bool) -> None:
    """/dev/full answers every write as a full disk does (ENOSPC). Buffered, the lines it kept made the interpreter's
    last flush fail too."""
    path = write_spec(tmp_path, spec_of("full", budget={"steps": 2}))
    env = {**environment(), "PYTHONUNBUFFERED": "" if buffered else "1"}
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        run = subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=env, stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=RUN_TIMEOUT, check=False)
    warning = ("hermes: warning: its output cannot be written (No space left on device): what it prints there is "
               "dropped from here on, and the experiment goes on\n")
    assert (run.returncode, run.stderr) == (0, warning)
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert {trial.state.value for trial in view.trials} == {"completed"}
