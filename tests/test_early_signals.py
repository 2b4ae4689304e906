"""`hermes run` in its first second, and what its lines say of a crash.

SIGTERM and SIGHUP are taken like Ctrl-C from the start of a run, not only once its engine loop runs: before, one
that came as the run imported its modules or set up its store ended the process at once, in the middle of the store's
first write. Each run is a real `hermes run` that sends itself the signal at a set point (an import, a store write, a
store call), so that the moment does not depend on timing. Nothing of Hermes's is mocked.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hermes.report import summarise_error
from tests.test_run import RUN_TIMEOUT, environment, hermes, search, spec_of, write_spec

# `hermes run SPEC --no-live` that sends itself the signal SIGNAL at the moment WHEN: as it first imports SQLAlchemy
# (the store's), as the store's first write transaction creates its first table, or right after the store made the
# experiment (where its stderr is a terminal, once it said so there and the terminal closed)
SIGNALLED_RUN = """
import os, signal, sys, time

signum, when, spec = getattr(signal, sys.argv[1]), sys.argv[2], sys.argv[3]
sent = []

def send():
    if not sent:
        sent.append(signum)
        os.kill(os.getpid(), signum)

if when == "import":
    class Importing:
        def find_spec(self, name, path=None, target=None):
            if name == "sqlalchemy":
                send()
            return None

    sys.meta_path.insert(0, Importing())
elif when == "first write":
    import sqlalchemy

    def executing(connection, cursor, statement, *args):
        if statement.lstrip().upper().startswith("CREATE TABLE"):
            send()

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", executing)
elif when == "experiment made":
    from hermes.store.sql import SqlStore

    made = SqlStore.create_or_open_experiment

    def making(self, *args, **kwargs):
        experiment_id = made(self, *args, **kwargs)
        if os.isatty(2):
            os.write(2, b"made\\n")
            while os.isatty(2):
                time.sleep(0.01)
        send()
        return experiment_id

    SqlStore.create_or_open_experiment = making
elif when == "view":  # the experiment made, its run not begun: the progress view is being built
    import rich.console

    class Signalling(rich.console.Console):
        def __init__(self, *args, **kwargs):
            send()
            super().__init__(*args, **kwargs)

    rich.console.Console = Signalling
from hermes.cli import main

sys.exit(main(["run", spec, "--no-live"]))
"""


def signalled_run(tmp_path: Path, signame: str, when: str, stdout: int = subprocess.PIPE,
                  stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    path = write_spec(tmp_path, spec_of("early", search=search(1, 0, 0.0), budget={"steps": 2},
                                        resources={"gpus": "none", "cpu_slots": 1}))
    return subprocess.Popen([sys.executable, "-c", SIGNALLED_RUN, signame, when, str(path)], cwd=tmp_path,
                            env=environment(), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, text=True)


def ended(runner: subprocess.Popen[str]) -> tuple[int, str]:
    """The run's exit code and its stderr, once it ended."""
    try:
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    return runner.returncode, stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_as_the_run_imports_its_modules_is_taken_like_ctrl_c(tmp_path: Path, signame: str) -> None:
    """Building its parser imported the store's modules (most of a second) before `hermes run` took any signal:
    one sent then ended it (exit -15), saying nothing."""
    returncode, stderr = ended(signalled_run(tmp_path, signame, "import"))
    assert returncode == 128 + getattr(signal, signame), stderr
    assert stderr.splitlines()[-1] == "interrupted before the experiment started", stderr
    assert not (tmp_path / "runs").exists()  # nothing was written


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_in_the_stores_first_write_rolls_it_back_and_is_taken_like_ctrl_c(tmp_path: Path,
                                                                                    signame: str) -> None:
    """It ended the runner in the middle of the transaction that makes the store's tables (a hot journal was left
    beside a store with no tables); now the transaction is rolled back, and the run says it was interrupted."""
    returncode, stderr = ended(signalled_run(tmp_path, signame, "first write"))
    assert returncode == 128 + getattr(signal, signame), stderr
    assert stderr.splitlines()[-1] == "interrupted before the experiment started", stderr
    left = {path.name for path in (tmp_path / "runs").iterdir()}
    assert left <= {"hermes.db", "hermes.lock", "early"}, left  # no journal, no -wal, no store half made aside


def test_a_signal_between_the_set_up_and_the_run_records_the_experiment_interrupted(tmp_path: Path) -> None:
    """Once the session was made and before its run began (the progress view being built) a SIGTERM ended the run with
    143 and no word, the experiment left running (its runner shown killed) and its locks held."""
    returncode, stderr = ended(signalled_run(tmp_path, "SIGTERM", "view"))
    assert returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines()[-1].startswith("interrupted: run `hermes run "), stderr
    status = hermes("status", "runs", cwd=tmp_path)
    assert status.stdout.splitlines()[0] == "experiment  early (id 1): interrupted", status.stdout


def test_a_hangup_right_after_the_experiment_is_made_records_it_interrupted(tmp_path: Path) -> None:
    """The store makes a new experiment running: a SIGHUP there ended the runner (exit -1), and left it "running
    when its runner ended without a word (killed?)". Its output is a terminal that is gone: saying it was
    interrupted raises nothing (EIO) there."""
    leader, follower = pty.openpty()
    try:
        runner = signalled_run(tmp_path, "SIGHUP", "experiment made", stdout=follower, stderr=follower)
        os.close(follower)
        said = b""
        while b"made" not in said and select.select([leader], [], [], RUN_TIMEOUT)[0]:
            said += os.read(leader, 1024)
        assert b"made" in said, said
    finally:
        os.close(leader)  # the terminal closed: what the run writes to it fails
    assert runner.wait(timeout=RUN_TIMEOUT) == 128 + signal.SIGHUP
    status = hermes("status", "runs", cwd=tmp_path)
    assert status.stdout.splitlines()[0] == "experiment  early (id 1): interrupted", status.stdout


def test_a_crash_after_a_park_says_it_runs_again_from_its_saved_checkpoint(tmp_path: Path) -> None:
    """Two trials share a slot (rr) and park in their warm workers' memory in turn, which the core counts as a
    checkpoint; none is saved (checkpoint_every is past the budget). A crash said "it runs again from step N", the
    parked step, though the trial retrains from its beginning."""
    spec = spec_of("parked", search=search(2, 0, 0.05, crash={"type": "choice", "values": ["raise"]},
                                           crash_step={"type": "choice", "values": [4]},
                                           crash_runs={"type": "choice", "values": [1]}),
                   budget={"steps": 5}, policy={"name": "rr", "period": 0.15},
                   resources={"gpus": "none", "cpu_slots": 1}, storage={"dir": "runs", "checkpoint_every": 100})
    run = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    crashes = [line for line in run.stdout.splitlines() if " crashed (" in line]
    assert len(crashes) == 2 and not any("runs again from step" in line for line in crashes), run.stdout
    assert ", it runs again from its last saved checkpoint (or its beginning), catching up to step " in run.stdout


def test_a_segfault_in_a_warm_worker_is_summarised_at_the_trials_line(tmp_path: Path) -> None:
    """The one-line error named the worker's main thread (`<frozen runpy>`, line 198), the last line of the
    faulthandler dump, not the line of the trial's thread that crashed."""
    (tmp_path / "segv.py").write_text(
        "import ctypes\n"
        "from hermes import trial\n"
        "\n"
        "def train(config):\n"
        "    trial.report(1, score=0.5)\n"
        "    ctypes.string_at(0)\n"
    )
    spec = spec_of("segv", trial={"function": "segv:train", "workdir": str(tmp_path), "max_failures": 0},
                   search=search(1, 0, 0.0), budget={"steps": 2}, resources={"gpus": "none", "cpu_slots": 1})
    run = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert "trial 0 failed at step 1, score 0.5 (its worker died, exit code -11 (SIGSEGV), at segv.py:6)" in \
        run.stdout, run.stdout


DUMP = """its worker died, exit code -11 (SIGSEGV): Fatal Python error: Segmentation fault

Thread 0x00007f8e19a1b6c0 (most recent call first):
  File "{python}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f8e1aa1d6c0 (most recent call first):
  File "{python}/ctypes/__init__.py", line 519 in string_at
  File "/home/me/train.py", line 36 in train
  File "{hermes}/local/worker.py", line 373 in _call
  File "{python}/threading.py", line 1002 in _bootstrap

Thread 0x00007f8e1b9bbb80 (most recent call first):
  File "{hermes}/local/worker.py", line 237 in serve
  File "<frozen runpy>", line 198 in _run_module_as_main
"""


def test_a_faulthandler_dump_is_summarised_at_the_crashed_threads_own_frame() -> None:
    """Its innermost frame that is neither Hermes's nor Python's library's; a single thread's dump ("Stack") too;
    a Python traceback after a dump (a child process's crash the trial went on after) is what it raised."""
    dump = DUMP.format(hermes=Path(sys.modules["hermes"].__file__ or "").parent, python=sysconfig.get_path("stdlib"))
    assert summarise_error(dump) == "its worker died, exit code -11 (SIGSEGV), at train.py:36"
    alone = ('exit code -11 (SIGSEGV): Fatal Python error: Segmentation fault\n\nStack (most recent call first):\n'
             '  File "/home/me/native.py", line 3 in crash\n  File "/home/me/main.py", line 9 in <module>\n')
    assert summarise_error(alone) == "exit code -11 (SIGSEGV), at native.py:3"
    later = dump + 'Traceback (most recent call last):\n  File "/home/me/train.py", line 40, in train\nOSError: gone\n'
    assert summarise_error(later) == "its worker died, exit code -11 (SIGSEGV) ... OSError: gone, at train.py:40"
    # a dump the program asked for (faulthandler.dump_traceback()) is no crash: its own last words are the error
    asked = ('exit code 1: loading\nStack (most recent call first):\n  File "/home/me/main.py", line 1 in <module>\n'
             'error: dataset /data/x missing\n')
    assert summarise_error(asked) == "exit code 1 ... error: dataset /data/x missing"
