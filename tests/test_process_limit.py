"""Hermes's own threads on a host that has none to give (a limit of processes: ``ulimit -u``, a container's pids limit),
on the real command line.

A thread that cannot start raises RuntimeError "can't start new thread" in Python. A warm worker that could not start
a trial's thread, or a checkpoint whose fsyncs could not start theirs, crashed the trial, which failed for good once
its retries were used up; the run ended finished (or "every trial failed") and never said why. The limit is the host's:
as a fork that fails for it, the run stops interrupted, saying which limit to raise, and a rerun continues it.

``ulimit -u`` is not enforced for root, whom these tests may run as, so thread starts are made to fail otherwise, the
same way: each thread's stack (from the stack limit, or ``threading.stack_size``) is larger than what the address-space
limit leaves of the process's memory.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes.core.decisions import Resume, Start
from hermes.core.states import TrialState
from hermes.errors import NoSpaceError
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_run import (
    RUN_TIMEOUT,
    environment,
    hermes_command,
    load_view,
    run_ok,
    spec_of,
    trial_dir,
    write_spec,
)
from tests.test_warm_trial_edges import park

NO_THREADS = "HERMES_TEST_NO_THREADS"  # where this test's trial makes its process unable to start a thread
THREADLESS_TRIAL = f'''
import os
import resource
import threading

from hermes import trial


def no_threads_from_now_on():
    """As a limit of processes reached: each new thread's stack, 1 GiB, is past the 256 MiB left of the address
    space."""
    threading.stack_size(1 << 30)
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))


if os.environ.get("{NO_THREADS}") == "worker":  # at the warm worker's import of the module, before any trial
    no_threads_from_now_on()


def train(config):
    if os.environ.get("{NO_THREADS}") == "trial":  # in the trial, before its first checkpoint
        no_threads_from_now_on()
    state = trial.Checkpoint()
    for step in range(state.restore(), trial.budget()):
        trial.report(step + 1, score=config["rate"] * (step + 1))
'''
PROCESSES_HINT = "raise the limit of processes (`ulimit -u`, or a container's pids limit), then run `hermes run "


def threadless_spec(tmp_path: Path, name: str, warm: bool) -> Path:
    (tmp_path / "threadless.py").write_text(THREADLESS_TRIAL)
    spec = spec_of(
        name,
        trial={"function": "threadless:train", "workdir": str(tmp_path), "warm_workers": warm},
        search={"sampler": "random", "trials": 1, "seed": 0,
                "space": {"rate": {"type": "uniform", "low": 0.1, "high": 0.9}}},
        budget={"steps": 3},
        resources={"gpus": "none", "cpu_slots": 1},
        storage={"dir": "runs", "checkpoint_every": 1},
    )
    return write_spec(tmp_path, spec)


def run(path: Path, env: dict[str, str] | None = None, limits: Any = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=path.parent, env=env or environment(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, preexec_fn=limits, check=False)


def test_a_warm_worker_that_cannot_start_its_trials_thread_interrupts_the_run_and_a_rerun_completes_it(
    tmp_path: Path,
) -> None:
    """The worker died of its RuntimeError, its trial crashed: retried in a new worker that did the same, it failed for
    good, and the run ended "every trial failed" (a search lost its best configuration so)."""
    path = threadless_spec(tmp_path, "threadless-worker", warm=True)
    limited = run(path, {**environment(), NO_THREADS: "worker"})
    assert limited.returncode == 2 and "Traceback" not in limited.stderr, limited.stdout + limited.stderr
    assert limited.stderr.startswith(
        "hermes: error: this machine ran out of what a trial needs: trial 0: its warm worker cannot start its thread: "
        "can't start new thread (trial-0) (errno EAGAIN)\ninterrupted: " + PROCESSES_HINT), limited.stderr
    assert "crashed" not in limited.stdout + limited.stderr, limited.stdout
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status.value == "interrupted"

    assert "threadless-worker: finished (continued)" in run_ok(path).stdout  # the limit lifted
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]


SAID = "HERMES_TEST_SAID"  # the folder where each trial of ``ENDS_AT_ONCE`` leaves its worker's pid as it ends
ENDS_AT_ONCE = f"""
    import errno
    import os
    import threading
    from pathlib import Path

    HOW = os.environ["{SAID}"].partition(":")[0]  # how each trial ends: "threads" or "no space"
    SAID = Path(os.environ["{SAID}"].partition(":")[2])
    python_start = threading.Thread.start


    def start(thread):
        \"\"\"A trial's thread cannot start, as under a limit of processes.\"\"\"
        if thread.name.startswith("trial-"):
            (SAID / str(os.getpid())).touch()
            raise RuntimeError("can't start new thread")
        python_start(thread)


    if HOW == "threads":  # at the warm worker's import of the module, before any trial
        threading.Thread.start = start


    def train(config):
        (SAID / str(os.getpid())).touch()
        raise OSError(errno.ENOSPC, "No space left on device")
"""


@pytest.mark.parametrize("how", ["threads", "no space"])
def test_warm_workers_whose_trials_end_at_once_for_the_hosts_limit_close_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Two workers said together that the host's limit ended their trials: the first end read stopped the run, and the
    second, read as the executor closed, raised out of its close, which it cut short. ``hermes run`` ended with three
    chained tracebacks, exit code 1, in place of its one line."""
    (tmp_path / "at_once.py").write_text(textwrap.dedent(ENDS_AT_ONCE))
    said = tmp_path / "said"
    said.mkdir()
    monkeypatch.setenv(SAID, f"{how}:{said}")
    executor = LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score")
    try:
        executor.next_events()  # the node's NodeAdded
        for trial_id, slot in (("a", "local/cpu0"), ("b", "local/cpu1")):
            executor.submit(trial_id, TrialLaunch(3, function="at_once:train", cwd=str(tmp_path)))
            executor.apply(Start(trial_id, slot), executor.now())
        deadline = time.monotonic() + 20
        while len(list(said.iterdir())) < 2:
            assert time.monotonic() < deadline, "the trials did not end"
            time.sleep(0.01)
        time.sleep(0.5)  # both ends are said before the executor reads either
        with pytest.raises(NoSpaceError if how == "no space" else BlockingIOError) as raised:
            executor.next_events()
        assert "trial " in str(raised.value)
    finally:
        executor.close()
    for worker in said.iterdir():  # collected by the close, which went to its end
        with pytest.raises(ProcessLookupError):
            os.kill(int(worker.name), 0)


@pytest.mark.parametrize("warm", [True, False])
def test_checkpoints_whose_fsyncs_cannot_start_threads_are_written_all_the_same(tmp_path: Path, warm: bool) -> None:
    """The pool that syncs a checkpoint's files at once could not start a thread: the trial crashed at each of its
    checkpoints, and failed for good. The fsyncs need no thread: one after another, in the trial's, they are done."""
    path = threadless_spec(tmp_path, "threadless-fsync", warm=warm)
    result = run(path, {**environment(), NO_THREADS: "trial"})
    assert result.returncode == 0 and "crashed" not in result.stdout + result.stderr, result.stdout + result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    checkpoints = trial_dir(tmp_path / "runs", {"name": "threadless-fsync"}, "0") / "checkpoints"
    assert (checkpoints / "latest").read_text() == "step-3"


SETUP_LIMITS = {  # how the runner is limited: its first thread, or one of its first open files, is past the limit
    # every thread's stack, 1 GiB, is past the address space
    "threads": [((resource.RLIMIT_STACK, 1 << 30), (resource.RLIMIT_AS, 768 << 20))],
    # the store's files are open, the executor's guard and event loop's pipes are not (at 16 or so, they are: its
    # limit is met a moment later)
    "open files": [((resource.RLIMIT_NOFILE, files),) for files in (10, 12, 14)],
}


@pytest.mark.parametrize("kind", SETUP_LIMITS)
def test_a_limit_met_as_the_run_sets_up_is_said_in_a_line_and_a_rerun_completes_it(tmp_path: Path, kind: str) -> None:
    """Met as the executor was built (its guard's process, its event loop's pipe or thread), a limit gave a raw
    traceback: the OSError EMFILE or the RuntimeError, where a moment later the same limit is said in a line."""
    path = threadless_spec(tmp_path, "limited-setup", warm=True)
    said = {"open files": "Too many open files (errno EMFILE)\ninterrupted: raise the limit (`ulimit -n` for open "
                          "files) from ",
            "threads": "can't start new thread (hermes-pause-watch) (errno EAGAIN)\ninterrupted: " + PROCESSES_HINT}
    for limits in SETUP_LIMITS[kind]:

        def limited() -> None:
            for which, value in limits:  # soft and hard: the executor raises the soft limit of open files to the hard
                resource.setrlimit(which, (value, value))

        result = run(path, limits=limited)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (limits, result.stderr)
        assert result.stderr.startswith(f"hermes: error: this machine ran out of what a trial needs: {said[kind]}"), (
            limits, result.stderr)
    assert "limited-setup: finished" in run_ok(path).stdout
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED]


# The warm worker's timers cannot start, as under a limit of processes
NO_TIMERS = """
    import threading

    from hermes import trial


    def no_thread(timer):
        raise RuntimeError("can't start new thread")


    threading.Timer.start = no_thread  # in the warm worker that imports this


    def train(config):
        state = trial.Checkpoint()
        for step in range(state.restore(), trial.budget()):
            trial.report(step + 1, score=float(step + 1))
"""


def test_a_spilled_trial_whose_exit_timer_cannot_start_stops_the_run_for_the_hosts_limit(tmp_path: Path) -> None:
    """The timer that ends a worker whose spilled trial never returns could not start: a traceback in the trial's
    log, and the worker went on unwatched. As a trial's thread that cannot start, its end is the host's limit."""
    (tmp_path / "no_timers.py").write_text(textwrap.dedent(NO_TIMERS))
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score") as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(3, function="no_timers:train", cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        park(executor, "a")
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # spilled on cpu0
        with pytest.raises(BlockingIOError, match="trial a: its warm worker cannot start its exit timer: can't start "
                                                  r"new thread \(exit-timer-a\)"):
            for _ in range(20):  # before, the trial went on on cpu1 and completed
                for event in executor.next_events():
                    executor.settled(event)
    assert "Traceback" not in (tmp_path / "run" / "trials" / "a" / "stderr.log").read_text()


def test_a_server_whose_pool_cannot_start_its_thread_says_so_in_a_line(tmp_path: Path) -> None:
    """The pool's thread started in the application's startup, whose failure uvicorn said in a traceback."""
    pytest.importorskip("fastapi", reason="the server needs the server extra")

    def limited() -> None:
        for which, value in SETUP_LIMITS["threads"][0]:
            resource.setrlimit(which, (value, value))

    result = subprocess.run(hermes_command("server", "--root", str(tmp_path / "server"), "--port", "0", "--cpu-slots",
                                           "1"), env=environment(), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT, preexec_fn=limited, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.endswith(
        "hermes: error: the pool cannot start: can't start new thread (hermes-pool) (errno EAGAIN); raise the limit "
        "of processes (`ulimit -u`, or a container's pids limit)\n"), result.stderr


@pytest.mark.parametrize("thread", ["hermes-agent-pump", "hermes-upload-1"])
def test_a_ray_node_agent_that_cannot_start_its_threads_refuses_in_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread: str
) -> None:
    """Its pump's RuntimeError refused the node with Python's bare words, its executor left open; an upload's thread
    started at the first checkpoint, its RuntimeError in the pump, which died, and the driver waited for ever."""
    pytest.importorskip("ray", reason="the Ray agent needs the ray extra")
    from hermes.ray.agent import NodeAgent

    start = threading.Thread.start

    def refused(started: threading.Thread) -> None:
        if started.name == thread:
            raise RuntimeError("can't start new thread")
        start(started)

    monkeypatch.setattr(threading.Thread, "start", refused)
    before = children()
    with pytest.raises(OSError) as raised:
        NodeAgent("node", str(tmp_path / "node"), "score", 1, str(tmp_path / "durable"), cpu_slots=1)
    assert raised.value.errno == errno.EAGAIN and str(raised.value) == f"[Errno 11] can't start new thread ({thread})"
    assert children() <= before  # its executor closed, its guard process collected


def children() -> set[int]:
    """This process's child processes, collected or not."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == os.getpid():
                found.add(int(stat.parent.name))
        except (OSError, ValueError):
            pass  # gone meanwhile
    return found
