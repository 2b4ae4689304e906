"""Edges a user meets: a trial's error that holds a lone surrogate (a file name that is not UTF-8) hung the run under
warm workers; a storage dir moved elsewhere could not be continued; control characters of a trial's error reached
the terminal raw in `hermes status` and in `hermes run`'s lines; a storage dir too long for SQLite, a store's file
that is a folder, and a spec file without end got a misleading error or a traceback. Real ``hermes run``, real
processes, the real store (helpers of test_run.py)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from hermes.core.states import TrialState
from hermes.errors import SpecError
from hermes.experiment.spec import (
    MAX_SPEC_BYTES,
    SQLITE_MAX_PATHNAME,
    load_spec,
    read_spec,
)
from hermes.store.lock import LOCK_FILE
from tests.test_run import (
    hermes,
    load_view,
    run_on_a_terminal,
    search,
    spec_of,
    write_spec,
)
from tests.test_spec_paths import project

ENDS_WITHIN = 30  # seconds: a run of a few one-step trials takes a few; one that hangs fails its test instead


def failing_spec(folder: Path, name: str, code: str, failing: int = 2, **trial: Any) -> Path:
    """A spec of one-step function trials in ``folder``: for x from 1 to ``failing`` its ``fail`` module's trial runs
    ``code`` (``x`` in scope), for x == 0 it reports."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fail.py").write_text(
        f"import os, sys\nfrom hermes import trial\n\n\ndef fail(x):\n{textwrap.indent(code.strip(), '    ')}\n\n\n"
        "def train(config):\n    if config['x']:\n        fail(config['x'])\n    trial.report(1, score=1.0)\n")
    return write_spec(folder, {
        "name": name,
        "trial": {"function": "fail:train", "workdir": ".", "max_failures": 0, **trial},
        "search": {"sampler": "grid", "space": {"x": {"type": "grid", "values": list(range(failing + 1))}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 1},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 2, "threads_per_slot": 1},
        "storage": {"dir": "runs"},
    })


# ---------------------------------------------------------------------- 1. a lone surrogate in a trial's error
SURROGATE = """
name = os.fsdecode(b"/data/img_\\xff.png")  # a file name that is not UTF-8, as os.listdir gives it
if x == 1:
    raise RuntimeError(f"cannot decode {name}")
if x == 2:
    sys.exit(f"no such file {name}")
class Unsayable(Exception):
    def __str__(self):
        raise ValueError("a bug in the trial's exception")
raise Unsayable()
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "process-per-run"])
def test_a_trial_error_holding_a_lone_surrogate_fails_the_trial_and_the_run_ends(tmp_path: Path, warm: bool) -> None:
    """Under warm workers the trial's traceback could not be written to its strict UTF-8 log (UnicodeEncodeError):
    the worker never said the trial ended, and `hermes run` waited for ever. The error is written escaped, as a
    process of its own writes it to its stderr.log. An exception whose ``__str__`` raises hung it too."""
    path = failing_spec(tmp_path, "surrogate", SURROGATE, failing=3, warm_workers=warm)
    run = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=ENDS_WITHIN)
    assert run.returncode == 0, run.stderr
    escaped = "cannot decode /data/img_\\udcff.png"
    said = next(line for line in run.stdout.splitlines() if "] trial 1 " in line)
    assert "trial 1 failed before its first report (" in said and f"RuntimeError: {escaped}, at fail.py:" in said
    view, _ = load_view(tmp_path / "runs")
    trials = {trial.trial_id: trial for trial in view.trials}
    assert [trials[key].state for key in "0123"] == [TrialState.COMPLETED, *[TrialState.FAILED] * 3]
    assert escaped in trials["1"].error
    assert trials["2"].error.startswith("exit code 1")
    assert "Unsayable: <exception str() failed>" in trials["3"].error  # its __str__ raised
    assert "no such file /data/img_\\udcff.png" in (tmp_path / "runs/surrogate/trials/2/stderr.log").read_text()
    status = hermes("status", "runs", cwd=tmp_path)
    assert f"RuntimeError: {escaped}, at fail.py:" in status.stdout


# ---------------------------------------------------------------------- 2. a storage dir moved
def test_a_storage_dir_moved_elsewhere_is_continued_there(tmp_path: Path) -> None:
    """A rerun whose storage.dir named the folder it was moved to (or the same one written otherwise: ./runs/ for
    runs) was refused, "differs in storage.dir": the store found there holds the experiment by definition."""
    spec = spec_of("moved", search=search(1, 0, 0.0), budget={"steps": 2}, policy={"name": "fifo"},
                   storage={"dir": "disk1/runs"})
    first = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "disk2").mkdir()
    shutil.move(tmp_path / "disk1/runs", tmp_path / "disk2/runs")
    spec |= {"search": search(2, 0, 0.0), "storage": {"dir": "./disk2/runs/"}}  # a larger budget, and moved
    again = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "trial 0" not in again.stdout and "trial 1 completed at step 2" in again.stdout  # only the new one ran
    view, _ = load_view(tmp_path / "disk2/runs")
    assert [(trial.trial_id, trial.state) for trial in view.trials] == [("0", TrialState.COMPLETED),
                                                                         ("1", TrialState.COMPLETED)]
    assert view.experiment.spec["storage"]["dir"] == "./disk2/runs/"


# ---------------------------------------------------------------------- 3. control characters in a trial's error
CONTROL = 'raise RuntimeError("disk \\x1b[2J\\x1b[31mOK\\x1b[0m bell\\x07 nul\\x00 bs\\x08X")'
ESCAPED = "disk \\x1b[2J\\x1b[31mOK\\x1b[0m bell\\x07 nul\\x00 bs\\x08X"
RAW = ("\x1b[2J", "\x1b[31mOK", "\x07", "\x00", "\x08")


def test_control_characters_of_a_trial_error_are_escaped_in_run_and_status(tmp_path: Path) -> None:
    """`hermes results` escaped them; `hermes run`'s lines and `hermes status` wrote them raw, and the terminal
    obeyed: cleared the screen, coloured what followed, rang."""
    path = failing_spec(tmp_path, "control", CONTROL)
    run = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=ENDS_WITHIN)
    status = hermes("status", "runs", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for output in (run.stdout, status.stdout):
        assert ESCAPED in output
        assert not any(raw in output for raw in RAW), repr(output)


def test_control_characters_of_a_trial_error_are_escaped_above_the_live_view(tmp_path: Path) -> None:
    """The live view says a failure in a line above its table, which wrote the error raw too."""
    path = failing_spec(tmp_path, "control", CONTROL)
    returncode, text = run_on_a_terminal(path, tmp_path, 400, ENDS_WITHIN)
    assert returncode == 0, text
    assert "leaderboard" in text and ESCAPED in text  # the live view was drawn, the error said above it
    assert not any(raw in text for raw in RAW), repr(text)


# ---------------------------------------------------------------------- 4. a store SQLite refuses, a spec without end
def quick_project(folder: Path, storage: str) -> Path:
    return project(folder, storage={"dir": storage})


def nested(length: int) -> str:
    """A relative path of ``length`` characters whose names are 61 characters at most, well under NAME_MAX."""
    names = []
    while length > 61:
        names.append("d" * 60)
        length -= 61
    return "/".join([*names, "d" * length])


def test_a_storage_dir_too_long_for_sqlite_is_refused_with_its_field_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Each name well under the file system's limit, the whole under PATH_MAX, but hermes.db-journal's path over
    SQLite's: the runner wrote its lock and the experiment's folder, then said the store's folder "was removed"."""
    base = tmp_path.resolve()
    longest = SQLITE_MAX_PATHNAME - len(f"{base}/") - len("/runs/hermes.db-journal")  # of the path between them
    path = quick_project(base, f"{nested(longest + 1)}/runs")
    refused = hermes("run", str(path), "--no-live", cwd=base)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith(f"hermes: error: {path}: storage.dir: {base / nested(longest + 1) / 'runs'} is "
                                     "too long for SQLite's store in it"), refused.stderr
    assert f"takes {SQLITE_MAX_PATHNAME + 1} bytes, SQLite's limit is {SQLITE_MAX_PATHNAME}; shorten" in refused.stderr
    assert sorted(os.listdir(base)) == ["quick.py", "spec.yaml"]  # no lock, no experiment's folder

    for length, opens in ((longest, True), (longest + 1, False)):  # the limit is SQLite's
        store = base / nested(length) / "runs/hermes.db"
        store.parent.mkdir(parents=True, exist_ok=True)
        try:
            with closing(sqlite3.connect(store)) as connection, connection:
                connection.execute("CREATE TABLE t (a)")
        except sqlite3.OperationalError:
            assert not opens
        else:
            assert opens
    load_spec(quick_project(base, f"{nested(longest)}/runs"))


def test_a_store_file_that_is_a_folder_is_refused_with_its_field(tmp_path: Path) -> None:
    path = quick_project(tmp_path, "runs")
    (tmp_path / "runs/hermes.db").mkdir(parents=True)
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert str(refused.value) == (f"{path}: storage.dir: {tmp_path.resolve() / 'runs/hermes.db'}, the store's file, "
                                  "is a directory; move it away")
    assert not (tmp_path / "runs" / LOCK_FILE).exists()


def test_a_spec_file_without_end_is_refused_by_its_size(tmp_path: Path) -> None:
    """`hermes run /dev/zero` read until memory ran out: a MemoryError's traceback. (A file just past the limit
    stands for it here: /dev/zero would take the machine's memory should the limit ever go.)"""
    large = tmp_path / "large.yaml"
    large.write_text("name: x\n" + "#" * MAX_SPEC_BYTES)
    with pytest.raises(SpecError, match=r"large.yaml: larger than 10 MiB, which no spec is; give the spec's YAML "):
        read_spec(large)
