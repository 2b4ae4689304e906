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

import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hermes.core.states import TrialState
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
