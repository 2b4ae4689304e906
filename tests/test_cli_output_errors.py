"""The commands that give their output on stdout, where it cannot be written (a full disk under ``> file``): one
line that says so, as ``--out`` says it, where each printed a traceback ("OSError: [Errno 28] No space left on
device"). The real command line in real processes; /dev/full answers every write as a full disk does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.test_run import (
    RUN_TIMEOUT,
    environment,
    hermes,
    hermes_command,
    search,
    spec_of,
    write_spec,
)

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")

UNWRITABLE = "hermes: error: cannot write the output: No space left on device\n"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose runs/ holds a finished experiment."""
    folder = tmp_path_factory.mktemp("full")
    run = hermes("run", str(write_spec(folder, spec_of("full", search=search(2, 0, 0.0), budget={"steps": 2}))),
                 "--no-live", cwd=folder)
    assert run.returncode == 0, run.stderr
    return folder


def into_full(*args: str, cwd: Path, buffered: bool = True) -> subprocess.CompletedProcess[str]:
    with open("/dev/full", "w") as full:
        return subprocess.run(hermes_command(*args), cwd=cwd, env={**environment(), "PYTHONUNBUFFERED": "" if
                              buffered else "1"}, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=RUN_TIMEOUT, check=False)


@pytest.mark.parametrize("command", [
    ["status", "runs"], ["list", "runs"], ["results", "runs"], ["results", "runs", "--format", "csv"],
    ["results", "runs", "--format", "json"], ["trace", "runs"], ["simulate", "--trace", "runs", "--gpus", "2"],
], ids=" ".join)
def test_an_output_that_cannot_be_written_is_said_in_a_line(stored: Path, command: list[str]) -> None:
    done = into_full(*command, cwd=stored)
    assert (done.returncode, done.stderr) == (2, UNWRITABLE)


def test_unbuffered_too_and_an_error_of_the_commands_own_is_still_its_own(stored: Path) -> None:
    """Only stdout's write errors are the output's: a file of --out that cannot be written says so, as it did."""
    done = into_full("results", "runs", cwd=stored, buffered=False)
    assert (done.returncode, done.stderr) == (2, UNWRITABLE)
    done = into_full("trace", "runs", "--out", "/dev/full", cwd=stored)
    said = "hermes: error: --out /dev/full: cannot write it: No space left on device\n"
    assert (done.returncode, done.stderr) == (2, said)


@pytest.mark.parametrize("command", [["results", "runs"], ["trace", "runs"], ["status", "runs"]])
def test_a_closed_stdout_is_no_traceback(stored: Path, command: list[str]) -> None:
    """`hermes results runs >&-`: Python has no sys.stdout then, and the output's wrapper failed on it
    ("'NoneType' object has no attribute 'write'"), as the trace's writer did."""
    result = subprocess.run(hermes_command(*command), check=False, cwd=stored, env=environment(),
                            stderr=subprocess.PIPE, text=True, timeout=RUN_TIMEOUT, preexec_fn=lambda: os.close(1))
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr
