"""A FIFO, or a folder, where a trial's config or logs go: that trial fails, saying which file, and nothing else waits.

The engine's thread wrote config.json and opened the logs itself: the open of a FIFO waits for its other end, so in
a server one user's FIFO froze every user's trials, the server ignored SIGTERM (``Hermes.close`` waited for the pool),
and every restart froze again. A folder there raised from the engine's thread, which stopped the pool. Real executor,
pool, server and trial processes; real FIFOs (os.mkfifo). Each test has a hard timeout: the old code hung in them.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import hermes
import hermes.server.app as server_app
from hermes.core.decisions import Decision
from hermes.core.events import Event, SubmissionsClosed, TrialExited
from hermes.core.scheduler import Scheduler
from hermes.execution.engine import Engine
from hermes.experiment.spec import ResourcesSpec
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.watchdog import TrialLimits
from hermes.policies import make_policy
from hermes.pool import PoolSession
from hermes.store import ExperimentStatus, SqlStore
from tests.test_pool import pool_spec, running, status, submit
from tests.test_run import TESTS, spec_of, wait_for

LIMITS = TrialLimits(stall_after=10.0)  # a trial that hangs fails (and the test says so) within the timeout
COUNTS = "from hermes import trial\nfor step in range(1, trial.budget() + 1):\n    trial.report(step, score=0.1 * step)\n"
COOPERATIVE = (sys.executable, "-c", COUNTS)
UNMODIFIED = (sys.executable, "-c", "print('epoch 1 score 0.1'); print('epoch 2 score 0.2')")
LAUNCHES = {  # each launcher: a warm worker, a process per run, a cooperative command, an unmodified program
    "warm": TrialLaunch(2, function="trials.curve:train", config={"sleep": 0}, cwd=str(TESTS), limits=LIMITS),
    "process": TrialLaunch(2, function="trials.curve:train", config={"sleep": 0}, cwd=str(TESTS), warm=False,
                           limits=LIMITS),
    "command": TrialLaunch(2, command=COOPERATIVE, limits=LIMITS),
    "unmodified": TrialLaunch(2, command=UNMODIFIED, metric_pattern=r"epoch (?P<step>\d+) score (?P<score>[\d.]+)",
                              limits=LIMITS),
}
# trial -> (the file, made a FIFO or a folder, before it starts; the error's start)
PLANTED = {
    "config-fifo": ("config.json", os.mkfifo, "cannot write its config"),
    "config-folder": ("config.json", os.mkdir, "cannot write its config"),
    "stdout-fifo": ("stdout.log", os.mkfifo, "cannot open its log"),
    "stderr-fifo": ("stderr.log", os.mkfifo, "cannot open its log"),
    "stdout-folder": ("stdout.log", os.mkdir, "cannot open its log"),
}


def run_to_the_end(executor: LocalExecutor, launches: dict[str, TrialLaunch]) -> dict[str, TrialExited]:
    """Run the trials with the real core to the end: how each ended last."""
    ended: dict[str, TrialExited] = {}

    def note(event: Event, _decisions: list[Decision]) -> None:
        if isinstance(event, TrialExited):
            ended[event.trial_id] = event

    engine = Engine(Scheduler(make_policy("fifo")), executor, [note])
    for trial_id, launch in launches.items():
        engine.post(executor.submit(trial_id, launch, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    return ended


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(LAUNCHES))
def test_a_fifo_or_a_folder_where_a_trials_file_goes_fails_that_trial_alone(tmp_path: Path, kind: str) -> None:
    """Each trial with something other than a regular file where its config or a log goes fails, naming the file;
    the FIFO stays as it was; the trial beside them completes. Before, the FIFOs hung the executor (a warm worker's
    log hung its trial) and the folders stopped it."""
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        for trial_id, (name, plant, _) in PLANTED.items():
            (executor.directory / "trials" / trial_id).mkdir(parents=True)
            plant(executor.directory / "trials" / trial_id / name)
        ended = run_to_the_end(executor, {trial_id: LAUNCHES[kind] for trial_id in [*PLANTED, "fine"]})
    for trial_id, (name, _, says) in PLANTED.items():
        path = executor.directory / "trials" / trial_id / name
        assert (ended[trial_id].succeeded, ended[trial_id].error) == (False, f"{says}: {path}: not a regular file")
    assert stat.S_ISFIFO(os.lstat(executor.directory / "trials" / "config-fifo" / "config.json").st_mode)
    assert ended["fine"].succeeded, ended["fine"]


SWAPS_ITS_LOG = """
    import os

    from hermes import trial


    def train(config):
        log = trial.trial_dir() / "stderr.log"
        os.remove(log)
        os.mkfifo(log)  # what its crash's error would quote from
        raise RuntimeError("made its log a FIFO")
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("warm", [True, False])
def test_a_crashed_trial_whose_log_became_a_fifo_fails_without_its_tail(tmp_path: Path, warm: bool) -> None:
    """The tail of stderr.log that a crash's error quotes was read from the engine's thread: a FIFO's open for reading
    waited for a writer. Now the error goes without it."""
    (tmp_path / "swaps.py").write_text(textwrap.dedent(SWAPS_ITS_LOG))
    launch = TrialLaunch(1, function="swaps:train", cwd=str(tmp_path), warm=warm, limits=LIMITS)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        ended = run_to_the_end(executor, {"a": launch})
    said = "uncaught RuntimeError: made its log a FIFO" if warm else "exit code 1"
    assert (ended["a"].succeeded, ended["a"].crashed, ended["a"].error) == (False, True, said)


@pytest.mark.timeout(30)
def test_a_fifo_in_one_users_trial_folder_leaves_the_pool_running_for_everyone(tmp_path: Path) -> None:
    """The defect as a server's users met it: bob's FIFO where his trial's config.json goes froze the pool (alice's
    experiment with it), and its stop waited for ever. Now that trial fails, naming the file, and the rest run."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.05)
    fifo = tmp_path / "runs" / "bobs" / "trials" / "0" / "config.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    bobs = submit(store, pool_spec("bobs", 2, 0.01, budget=2), owner="bob")
    alices = submit(store, pool_spec("alices", 2, 0.01, budget=2), owner="alice")
    with running(pool) as runner:
        for experiment in (alices, bobs):
            wait_for(lambda experiment=experiment: status(store, experiment).is_final, 30, "the experiments to end")
        pool.stop()
        runner.join(10)
        assert not runner.is_alive(), "the pool did not stop"
    trials = {name: {trial.trial_id: trial for trial in store.trials(experiment)}
              for name, experiment in (("alices", alices), ("bobs", bobs))}
    assert status(store, alices) is ExperimentStatus.FINISHED
    assert [trial.state.value for trial in trials["alices"].values()] == ["completed", "completed"]
    assert trials["bobs"]["0"].error == f"cannot write its config: {fifo}: not a regular file"
    assert trials["bobs"]["1"].state.value == "completed"
    store.close()


PLANTS_A_FIFO = """
    import os

    from hermes import trial


    def train(config):
        if config["plant"]:  # where the next trial's config goes, before it starts (one slot: after this one)
            folder = trial.trial_dir().parent / "1"
            folder.mkdir()
            os.mkfifo(folder / "config.json")
        trial.report(1, score=1.0)
"""


@pytest.mark.timeout(30)
def test_hermes_run_fails_the_trial_whose_config_is_a_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hermes run`` runs the same executor in its own process, which the FIFO hung."""
    (tmp_path / "plants.py").write_text(textwrap.dedent(PLANTS_A_FIFO))
    monkeypatch.chdir(tmp_path)
    result = hermes.run(spec_of("piped", trial={"function": "plants:train", "workdir": str(tmp_path)},
                                search={"sampler": "list", "configs": [{"plant": True}, {"plant": False}]},
                                budget={"steps": 1}, resources={"gpus": "none", "cpu_slots": 1}))
    by_id = {trial.trial_id: trial for trial in result.trials}
    fifo = tmp_path / "runs" / "piped" / "trials" / "1" / "config.json"
    assert by_id["0"].state == "completed"
    assert (by_id["1"].state, by_id["1"].error) == ("failed", f"cannot write its config: {fifo}: not a regular file")


@pytest.mark.timeout(30)
def test_a_server_whose_pool_does_not_stop_exits_all_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """``Hermes.close`` (the server's SIGTERM) waited for the pool's thread without a limit: a pool stuck (here in
    a write to a store another process holds locked, which waits out SQLite's 60 s at each write) kept the server
    from exiting. Now it waits ``POOL_STOP_S``, says so, and the server exits; the pool's claim ends with it."""
    monkeypatch.setattr(server_app, "POOL_STOP_S", 0.5)
    hermes_app = server_app.Hermes(server_app.ServerConfig(root=tmp_path, poll=0.05,
                                                           resources=ResourcesSpec(gpus="none", cpu_slots=1)))
    hermes_app.start()
    wait_for(lambda: hermes_app.pool.executor is not None, 30, "the pool to run")
    holder = sqlite3.connect(tmp_path / "hermes.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # an administrator's sqlite3 shell in a transaction, say
    try:
        began = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="hermes.server"):
            hermes_app.close()
        assert time.monotonic() - began < 5
        assert any(thread.name == "hermes-pool" for thread in threading.enumerate()), "the pool was not stuck"
        assert "the pool did not stop within 0.5 s: the server exits without it" in caplog.text
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_for(lambda: not any(thread.name == "hermes-pool" for thread in threading.enumerate()), 20, "the pool to end")
    hermes_app.store.close()
