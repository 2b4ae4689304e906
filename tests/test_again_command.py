"""The command an interrupted `hermes run` prints to continue it, pasted into bash as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hermes.core.states import TrialState
from tests.test_run import RUN_TIMEOUT, count_reports, environment, load_view, run_until, search, spec_of, write_spec


def test_the_command_to_continue_a_run_whose_spec_path_is_not_utf8_runs_it_when_pasted(tmp_path: Path) -> None:
    """A folder whose name holds bytes that are not UTF-8 (a name made on another system, say): the command printed
    them as the text "\\udcff", and pasted it named no file. Each such byte is now ``\\xff`` in bash's ``$'...'``."""
    folder = Path(os.fsdecode(bytes(tmp_path) + "/sp ace 'q' ünï".encode() + b"\xff\xfe dir"))
    path = write_spec(folder, spec_of("not-utf8", search=search(2, 0, 0.05), budget={"steps": 6}))
    storage = folder / "runs"
    returncode, stderr = run_until(path, lambda: count_reports(storage / "hermes.db") >= 1, "a report")
    assert returncode == 130, stderr
    printed = re.search(r"interrupted: run `(.*)` again to continue", stderr)
    assert printed is not None, stderr

    hermes = f"hermes() {{ {sys.executable} -m hermes.cli \"$@\"; }}"  # what `hermes` runs on a PATH of its own
    pasted = subprocess.run(["bash", "-c", f"{hermes}\n{printed.group(1)} --no-live"], cwd=tmp_path,
                            env=environment(), capture_output=True, errors="replace", timeout=RUN_TIMEOUT, check=False)
    assert pasted.returncode == 0 and "not-utf8: finished (continued)" in pasted.stdout, pasted.stdout + pasted.stderr
    view, _ = load_view(storage)
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2
