"""What ordinary training code does, run in a warm worker as in a process of its own: a loop in a thread of its own
that migrates, unseeded random numbers, process-level stream and signal calls, a working directory of its own, links
in a checkpoint. Real workers, real executors; each trial module is written to the test's folder."""

from __future__ import annotations

import os
import random
import textwrap
from pathlib import Path

import numpy as np

from hermes.core.decisions import Resume, Start, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.watchdog import TrialLimits
from tests.test_warm_workers import until_ended

LIMITS = TrialLimits(stall_after=30.0)  # a trial that hangs fails the test instead of hanging it


def module(directory: Path, name: str, code: str) -> str:
    (directory / f"{name}.py").write_text(textwrap.dedent(code))
    return f"{name}:train"


def next_event(executor: LocalExecutor) -> Event:
    """The executor's next event, the only one."""
    [event] = executor.next_events()
    return event


def park(executor: LocalExecutor, trial_id: str) -> TrialReported:
    """Suspend ``trial_id`` at the report it waits on, which this returns: it parks in its worker."""
    [report] = executor.next_events()
    assert isinstance(report, TrialReported) and report.trial_id == trial_id, report
    executor.apply(Suspend(trial_id), executor.now())
    executor.settled(report)
    [suspended] = executor.next_events()
    assert isinstance(suspended, TrialSuspended) and suspended.trial_id == trial_id, suspended
    return report


THREADED = """
    import json
    import threading

    from hermes import trial


    def train(config):
        state = {"step": 0}
        saver = trial.Files(lambda d: (d / "s.json").write_text(json.dumps(state)),
                            lambda d: state.update(json.loads((d / "s.json").read_text())))
        start = saver.restore()

        def loop():  # suspended, its SuspendExit ends this thread quietly, as Python ends a thread on SystemExit
            for step in range(start + 1, trial.budget() + 1):
                state["step"] = step
                trial.report(step, score=float(step))

        thread = threading.Thread(target=loop)
        thread.start()
        thread.join()
        if config["report_after"]:  # a last report of the main thread: after a suspension its run is over
            trial.report(score=-1.0)
"""


def test_a_trial_whose_loop_runs_in_its_own_thread_migrates_and_trains_every_step(tmp_path: Path) -> None:
    """The thread's SuspendExit at the spill ended that thread only; the function then returned, and the trial,
    which had trained one step of three, was marked completed."""
    function = module(tmp_path, "threaded", THREADED)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id, report_after in (("a", False), ("b", True)):
            executor.submit(trial_id, TrialLaunch(3, function=function, config={"report_after": report_after},
                                                  cwd=str(tmp_path)))
            executor.apply(Start(trial_id, "local/cpu0"), executor.now())
            park(executor, trial_id)
            executor.apply(Resume(trial_id, "local/cpu1", migrated=True), executor.now())  # spilled on cpu0
            moved = next_event(executor)
            assert isinstance(moved, TrialReported) and (moved.trial_id, moved.step) == (trial_id, 2), moved
            executor.settled(moved)
            events = until_ended(executor, 1)
            assert [e.step for e in events if isinstance(e, TrialReported)] == [3]
            assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]


SEEDED_OR_NOT = """
    import random

    import numpy as np
    import torch

    from hermes import trial


    def train(config):
        if config["seed"] is not None:
            random.seed(config["seed"])
            np.random.seed(config["seed"])
            torch.manual_seed(config["seed"])
        for step in range(1, trial.budget() + 1):
            trial.report(step, score=float(step), python=random.random(), numpy=float(np.random.rand()),
                         torch=float(torch.rand(1)))
"""


def test_trials_of_one_worker_draw_random_numbers_of_their_own(tmp_path: Path) -> None:
    """An unseeded trial that started while another was parked drew where the parked one left off: the parked one's
    next numbers, its step k those of the other's step k + 1. A parked trial still resumes with its own generators."""
    function = module(tmp_path, "seeded_or_not", SEEDED_OR_NOT)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id, seed in (("seeded", 0), ("unseeded", None)):
            executor.submit(trial_id, TrialLaunch(3, function=function, config={"seed": seed}, cwd=str(tmp_path)))
        executor.apply(Start("seeded", "local/cpu0"), executor.now())
        first = park(executor, "seeded")
        executor.apply(Start("unseeded", "local/cpu0"), executor.now())
        unseeded = [e for e in until_ended(executor, 1) if isinstance(e, TrialReported)]
        executor.apply(Resume("seeded", "local/cpu0"), executor.now())
        seeded = [first, *(e for e in until_ended(executor, 1) if isinstance(e, TrialReported))]
    import torch

    python, numpy, generator = random.Random(0), np.random.RandomState(0), torch.Generator().manual_seed(0)
    expected = [(python.random(), float(numpy.rand()), float(torch.rand(1, generator=generator))) for _ in range(3)]
    assert [(e.metrics["python"], e.metrics["numpy"], e.metrics["torch"]) for e in seeded] == expected
    for generator in ("python", "numpy", "torch"):
        assert not {e.metrics[generator] for e in unseeded} & {e.metrics[generator] for e in seeded}, generator


PROCESS_LEVEL = """
    import faulthandler
    import signal
    import sys

    from hermes import trial


    def train(config):
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
        faulthandler.enable()
        print("text first")
        sys.stdout.buffer.write("then bytes \\u00e9\\n".encode(sys.stdout.encoding))
        sys.stdout.buffer.flush()
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # save a checkpoint on preemption, say
        trial.report(1, score=1.0, previous_default=float(previous == signal.SIG_DFL),
                     installed=float(signal.getsignal(signal.SIGTERM) != signal.SIG_DFL),
                     tty=float(sys.stdout.isatty()), fileno=float(sys.stderr.fileno()))
"""


def test_what_training_scripts_ask_of_the_process_works_in_a_warm_worker(tmp_path: Path) -> None:
    """sys.stdout.reconfigure, faulthandler.enable (sys.stderr.fileno), sys.stdout.buffer and .encoding, and
    signal.signal from the trial's thread each failed the trial; they work in a process of its own."""
    function = module(tmp_path, "process_level", PROCESS_LEVEL)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(1, function=function, cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        events = until_ended(executor, 1)
    [report] = [e for e in events if isinstance(e, TrialReported)]
    assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]
    # the handler was not installed (the worker's stays), and signal.signal answered as it does
    assert report.metrics == {"score": 1.0, "previous_default": 1.0, "installed": 0.0, "tty": 0.0, "fileno": 2.0}
    directory = executor.directory / "trials" / "a"
    assert (directory / "stdout.log").read_text(encoding="utf-8") == "text first\nthen bytes \u00e9\n"
    assert "signal.signal(SIGTERM, ...) is ignored" in (directory / "stderr.log").read_text()


CHDIR = """
    import os

    from hermes import trial


    def train(config):
        if config["chdir"]:
            os.chdir(trial.trial_dir())  # Ray Tune's default
        for step in range(1, trial.budget() + 1):
            with open("log.txt", "a") as log:  # meant for the trial's own directory
                log.write(f"{trial.trial_id()} {step}\\n")
            trial.report(step, score=float(step))
"""


def test_a_trials_working_directory_is_its_own(tmp_path: Path) -> None:
    """A trial's os.chdir held for every trial of its worker after it: the next one wrote its relative files into
    the other's folder, and a parked one resumed in the directory of the trial that ran meanwhile."""
    function = module(tmp_path, "chdir", CHDIR)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id, chdir in (("a", True), ("b", True), ("c", False)):
            executor.submit(trial_id, TrialLaunch(2, function=function, config={"chdir": chdir}, cwd=str(tmp_path)))
        for trial_id in "ab":
            executor.apply(Start(trial_id, "local/cpu0"), executor.now())
            park(executor, trial_id)
        for trial_id in "ab":
            executor.apply(Resume(trial_id, "local/cpu0"), executor.now())
            until_ended(executor, 1)
        executor.apply(Start("c", "local/cpu0"), executor.now())
        until_ended(executor, 1)
    trials = executor.directory / "trials"
    assert (trials / "a" / "log.txt").read_text() == "a 1\na 2\n"
    assert (trials / "b" / "log.txt").read_text() == "b 1\nb 2\n"
    assert (tmp_path / "log.txt").read_text() == "c 1\nc 2\n"  # where its worker's trials start: its workdir



GONE_FOLDER = """
    import os
    import tempfile

    from hermes import trial


    def train(config):
        with tempfile.TemporaryDirectory() as scratch:
            os.chdir(scratch)
        for step in range(1, trial.budget() + 1):  # in a folder removed: nothing here reads it
            trial.report(step, score=float(step))
"""


def test_a_trial_whose_working_directory_was_removed_parks_and_resumes(tmp_path: Path) -> None:
    """The worker saves a parked trial's working directory: one removed (a TemporaryDirectory it chdir'ed into and
    left) made os.getcwd raise at every park, and the trial failed."""
    function = module(tmp_path, "gone_folder", GONE_FOLDER)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(2, function=function, config={}, cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        park(executor, "a")
        executor.apply(Resume("a", "local/cpu0"), executor.now())
        [ended] = [event for event in until_ended(executor, 1) if isinstance(event, TrialExited)]
    assert ended.succeeded, ended

LINKS = """
    import os

    from hermes import trial


    def train(config):
        def save(directory):
            (directory / "weights.bin").write_bytes(b"weights")
            os.symlink("weights.bin", directory / "model.bin")
            os.symlink("../../blobs/abc123", directory / "config.json")  # copytree(symlinks=True) of a snapshot

        def load(directory):
            links = [os.readlink(directory / "model.bin"), os.readlink(directory / "config.json")]
            assert links == ["weights.bin", "../../blobs/abc123"], links

        saver = trial.Files(save, load)
        for step in range(saver.restore() + 1, trial.budget() + 1):
            trial.report(step, score=float(step))
"""


def test_a_checkpoint_keeps_its_links_dangling_or_not(tmp_path: Path) -> None:
    """A link whose target is not in the checkpoint failed it: syncing the checkpoint opened the link's target."""
    function = module(tmp_path, "links", LINKS)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score", checkpoint_every=1,
                       limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", TrialLaunch(2, function=function, cwd=str(tmp_path)))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        park(executor, "a")
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # from the checkpoint of step 1
        events = until_ended(executor, 1)
    assert [e.step for e in events if isinstance(e, TrialReported)] == [2]
    assert [(e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] == [(True, None)]
    kept = executor.directory / "trials" / "a" / "checkpoints" / "step-2" / "files"
    assert [os.readlink(kept / "model.bin"), os.readlink(kept / "config.json")] == ["weights.bin", "../../blobs/abc123"]
