"""Runners that meet: a `hermes run` and a pool on one experiment folder, a pool killed under `hermes status`, a Ctrl-C
at the very start or end of a run, a plot rewritten under its viewer.

Real processes throughout: pools are ``python -m hermes.pool``, runs ``hermes run``, the trials tests/trials/curve.py.
A Ctrl-C at an exact moment is a real SIGINT the runner sends itself there (``INTERRUPT_AT``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes.cli import main
from hermes.core.events import (
    NodeAdded,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
)
from hermes.experiment import parse_spec
from hermes.pool import stored_form
from hermes.store import ExperimentStatus, SqlStore
from hermes.store.lock import LOCK_FILE, ExperimentLock, holder
from tests.test_run import (
    count_reports,
    environment,
    hermes,
    hermes_command,
    search,
    spec_of,
    trial_processes,
    wait_for,
    write_spec,
)

TIMEOUT = 60


def one_slot_spec(name: str, trials: int, steps: int, sleep: float) -> dict[str, Any]:
    return spec_of(name, search=search(trials, 0, sleep), budget={"steps": steps},
                   resources={"gpus": "none", "cpu_slots": 1}, storage={"dir": "runs", "checkpoint_every": 1})


@contextmanager
def pool_process(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A pool of one CPU slot whose root (its store, ``hermes.db``, and its folder, ``pool/``) is ``root``, as a
    server's; ended with SIGTERM (or killed) after the block, unless it ended in it."""
    command = [sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{root / 'hermes.db'}", "--dir", str(root),
               "--cpu-slots", "1", "--poll", "0.1"]
    pool = subprocess.Popen(command, cwd=root, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield pool
    finally:
        if pool.poll() is None:
            pool.terminate()
            try:
                pool.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pool.kill()
                pool.communicate()


def submit(root: Path, spec: dict[str, Any]) -> tuple[SqlStore, int]:
    store = SqlStore(f"sqlite:///{root / 'hermes.db'}")
    return store, store.submit_experiment(spec["name"], stored_form(parse_spec(spec)), owner="ann")


def test_a_run_of_the_spec_a_pool_runs_is_refused_naming_the_pool_which_frees_the_folder_at_its_end(
    tmp_path: Path,
) -> None:
    """The pool runs the experiment from its store, `hermes run` from the spec's own: the storage dir's lock kept
    neither from the other, and both wrote its trials' folders (the run resumed from the pool's checkpoints, and
    deleted them under it). The folder is the pool's while it runs the experiment, and free once it has ended."""
    spec = one_slot_spec("shared", 2, 6, 0.1)
    spec["search"]["space"]["hold_save"] = {"type": "choice", "values": [1]}  # the pool holds on until let go
    path = write_spec(tmp_path, spec)
    store, experiment_id = submit(tmp_path, spec)

    def let_go() -> bool:
        """Let every trial that holds its first checkpoint go on; whether the pool has finished."""
        for saving in tmp_path.glob("runs/shared/trials/*/saving-1"):  # not `**`: checkpoints vanish under it
            (saving.parent / "go-1").touch()
        return store.experiment(experiment_id).status is ExperimentStatus.FINISHED

    with pool_process(tmp_path) as pool:
        # The pool runs the experiment until the refusal is checked: under load, its 1.2 s of training had ended
        # before `hermes run` started, which then found the folder free and ran the experiment again
        wait_for(lambda: any(tmp_path.glob("runs/shared/trials/*/saving-1")), TIMEOUT, "the pool's first checkpoint")
        refused = hermes("run", str(path), "--no-live", cwd=tmp_path, timeout=TIMEOUT)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(
            f"hermes: error: the experiment folder {tmp_path / 'runs' / 'shared'} is in use by another runner, "
            f"pid {pool.pid} on "), refused.stderr
        assert "-m hermes.pool --store" in refused.stderr, refused.stderr
        assert not (tmp_path / "runs" / "hermes.db").exists()  # refused before it made an experiment of its own
        wait_for(let_go, TIMEOUT, "the pool to finish the experiment")
        assert pool.poll() is None
        assert holder(tmp_path / "runs" / "shared" / LOCK_FILE) is None  # the pool goes on, the folder is free
    assert [trial.state.value for trial in store.trials(experiment_id)] == ["completed"] * 2
    store.close()


def test_a_pools_experiment_whose_folder_a_run_holds_fails_naming_the_run(tmp_path: Path) -> None:
    """The other way round: the pool takes up an experiment whose folder a `hermes run` writes; it fails alone, and
    its error names the runner."""
    spec = one_slot_spec("held", 1, 200, 0.1)
    path = write_spec(tmp_path, spec)
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: count_reports(tmp_path / "runs" / "hermes.db") >= 1, TIMEOUT, "the run's first report")
        store, experiment_id = submit(tmp_path, spec)
        with pool_process(tmp_path):
            wait_for(lambda: store.experiment(experiment_id).status is not ExperimentStatus.QUEUED, TIMEOUT,
                     "the pool to take the experiment up")
            failed = store.experiment(experiment_id)
        assert failed.status is ExperimentStatus.FAILED, failed
        assert (failed.error or "").startswith(
            f"the experiment folder {tmp_path / 'runs' / 'held'} is in use by another runner, pid {runner.pid} on "
        ), failed.error
        assert f"hermes.cli run {path} --no-live" in (failed.error or "")
        assert runner.poll() is None  # the run goes on
        store.close()
    finally:
        runner.send_signal(signal.SIGINT)
        _, stderr = runner.communicate(timeout=TIMEOUT)
    assert runner.returncode == 130, stderr


def test_a_later_lock_of_a_folder_in_the_same_process_takes_it_over_and_another_process_is_refused(
    tmp_path: Path,
) -> None:
    """A pool started again in the process of one that stopped (a server's, after a store error) takes its
    experiments up again, while the stopped pool's sessions, which hold their folders, live on until collected."""
    folder = tmp_path / "runs" / "taken"
    first = ExperimentLock(folder, "taken").acquire()
    (tmp_path / "link").symlink_to(tmp_path / "runs")
    later = ExperimentLock(tmp_path / "link" / "taken", "taken").acquire()  # one folder, under another path
    assert later.held and not first.held
    first.release()  # the earlier one's end frees nothing: the later one holds it
    assert holder(folder / LOCK_FILE) == later.who
    asks = f"from hermes.store.lock import ExperimentLock; ExperimentLock({str(folder)!r}, 'taken').acquire()"
    refused = subprocess.run([sys.executable, "-c", asks], env=environment(), capture_output=True, text=True,
                             timeout=TIMEOUT, check=False)
    assert f"StorageInUse: the experiment folder {folder} is in use by another runner, pid {os.getpid()}" in (
        refused.stderr), refused.stderr
    later.release()
    assert holder(folder / LOCK_FILE) is None


def test_a_pool_killed_shows_its_experiment_ended_with_no_gpu_busy(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """After `kill -9` of a server, `hermes status ROOT` showed its experiment running on busy GPUs for ever: the
    pool's lock in ROOT/pool says whether a pool runs it."""
    store, experiment_id = submit(tmp_path, one_slot_spec("cut", 1, 200, 0.1))

    def status() -> list[str]:
        assert main(["status", str(tmp_path), "--experiment", "ann/cut"]) == 0
        return capsys.readouterr().out.splitlines()

    with pool_process(tmp_path) as pool:
        wait_for(lambda: count_reports(tmp_path / "hermes.db") >= 2, TIMEOUT, "the pool's reports")
        shown = status()
        assert shown[0] == f"experiment  cut (id {experiment_id}): running", shown
        assert "GPUs        1 of 1 busy" in shown, shown
        pool.kill()
        pool.wait(timeout=TIMEOUT)
    wait_for(lambda: not trial_processes(tmp_path / "runs"), 5, "the killed pool's trial to die")
    shown = status()
    assert shown[0] == (f"experiment  cut (id {experiment_id}): running when its pool ended without a word (killed?): "
                        "starting its server (or pool) again continues it"), shown
    assert "trials      1: 1 interrupted" in shown and "GPUs        0 of 1 busy" in shown, shown
    assert main(["list", str(tmp_path)]) == 0
    assert "running when its pool died" in capsys.readouterr().out
    store.close()


# `hermes run SPEC --no-live` with a Ctrl-C sent to itself right before or after the n-th call of SqlStore.METHOD
INTERRUPT_AT = """
import os, signal, sys
from hermes.store.sql import SqlStore

method, when, nth, spec = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
signal.signal(signal.SIGINT, signal.default_int_handler)  # a Ctrl-C raises, as in a terminal
original, calls = getattr(SqlStore, method), []

def interrupted(self, *args, **kwargs):
    calls.append(method)
    if len(calls) == nth and when == "before":
        os.kill(os.getpid(), signal.SIGINT)
    result = original(self, *args, **kwargs)
    if len(calls) == nth and when == "after":
        os.kill(os.getpid(), signal.SIGINT)
    return result

setattr(SqlStore, method, interrupted)
from hermes.cli import main
sys.exit(main(["run", spec, "--no-live"]))
"""


def interrupted_run(tmp_path: Path, method: str, when: str, nth: int) -> tuple[subprocess.CompletedProcess[str], str]:
    """The run's outcome, and the first line of `hermes status` after it."""
    path = write_spec(tmp_path, one_slot_spec("edge", 1, 2, 0.0))
    run = subprocess.run([sys.executable, "-c", INTERRUPT_AT, method, when, str(nth), str(path)], cwd=tmp_path,
                         env=environment(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    status = hermes("status", str(tmp_path / "runs"), cwd=tmp_path)
    return run, status.stdout.splitlines()[0]


def test_a_ctrl_c_as_the_run_writes_its_end_leaves_it_finished_and_says_so(tmp_path: Path) -> None:
    """Right before the final status (its second write, after "running"): it said "interrupted: run again" and the
    experiment stayed "running when its runner ended without a word (killed?)", though every trial completed."""
    run, status = interrupted_run(tmp_path, "set_status", "before", 2)
    assert run.returncode == 130, run.stderr
    assert run.stderr.splitlines()[-1] == (f"interrupted as it ended: edge is finished; `hermes results "
                                           f"{tmp_path / 'runs'} --experiment edge` shows its trials"), run.stderr
    assert status == "experiment  edge (id 1): finished"


def test_a_ctrl_c_right_after_the_experiment_is_made_records_it_interrupted(tmp_path: Path) -> None:
    """The store makes a new experiment running: a Ctrl-C before the run began left it "running when its runner
    ended without a word (killed?)"."""
    run, status = interrupted_run(tmp_path, "create_or_open_experiment", "after", 1)
    assert run.returncode == 130, run.stderr
    assert run.stderr.splitlines()[-1] == "interrupted before the experiment started", run.stderr
    assert status == "experiment  edge (id 1): interrupted"


def test_a_plot_replaces_its_png_whole_under_a_viewer_that_has_it_open(tmp_path: Path) -> None:
    """`hermes plot` wrote its PNGs in place: a viewer reloading one meanwhile read half an image. The new one is
    written beside it and renamed over it: what a viewer opened stays whole, and nothing is left beside it."""
    pytest.importorskip("matplotlib")
    from tests.test_plot import record

    events = [NodeAdded(0.0, "n0", ("n0/g0",)), TrialSubmitted(0.0, "a", 2), SubmissionsClosed(0.0),
              TrialReported(1.0, "a", 1, 0.5), TrialReported(2.0, "a", 2, 0.7), TrialExited(2.5, "a", succeeded=True)]
    record(tmp_path, "drawn", events, ExperimentStatus.FINISHED)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "drawn_curves.png").write_bytes(b"the image a viewer shows")
    with open(plots / "drawn_curves.png", "rb") as viewed:
        result = hermes("plot", str(tmp_path), "--out", str(plots), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert viewed.read() == b"the image a viewer shows"
    assert sorted(path.name for path in plots.iterdir()) == ["drawn_curves.png", "drawn_gpus.png"]
    for path in plots.iterdir():
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82"), path
