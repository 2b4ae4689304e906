"""Warm workers: function trials run in long-lived worker processes, parked in memory when suspended.

Real worker processes, the real scheduling core and ``tests/trials/curve.py``, whose state (the
running sum of its scores and the pid of every process that ran it) is checkpointed with
``trial.Files``: a resume that loses or repeats a step shows in the sum, and the pids show where
the trial ran and whether it was restarted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_local_executor import StopAtStep, decisions_of, reports, run_experiment
from test_run import wait_for

from hermes.core.decisions import Resume, Start, Stop, Suspend
from hermes.core.events import Event, TrialExited, TrialReported, TrialSuspended
from hermes.core.states import TrialState
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.local.watchdog import TrialLimits
from hermes.trial import protocol

TESTS = Path(__file__).resolve().parent
BUDGET = 6


def curve(sleep: float = 0.05, **config: object) -> TrialLaunch:
    return TrialLaunch(BUDGET, function="trials.curve:train", config={"sleep": sleep, **config}, cwd=str(TESTS))


def expected_total(rate: float, steps: int = BUDGET) -> float:
    return sum(1.0 - math.exp(-rate * step) for step in range(1, steps + 1))


def result(executor: LocalExecutor, trial_id: str) -> dict:
    return json.loads((executor.directory / "trials" / trial_id / "result.json").read_text())


def checkpoints(executor: LocalExecutor, trial_id: str) -> bool:
    return (executor.directory / "trials" / trial_id / protocol.CHECKPOINTS_DIR).exists()


def test_a_suspended_trial_resumes_from_memory_in_its_worker(tmp_path: Path) -> None:
    rates = {"a": 0.3, "b": 0.7}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, log = run_experiment(executor, {t: curve(rate=r) for t, r in rates.items()}, period=0.05)
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    assert len(decisions_of(log, Suspend)) >= 2 and decisions_of(log, Resume)
    pids = {trial_id: result(executor, trial_id)["pids"] for trial_id in rates}
    assert len(pids["a"]) == len(pids["b"]) == 1  # each function ran once: never restarted
    assert pids["a"] == pids["b"]  # in the one worker of the slot
    for trial_id, rate in rates.items():
        assert result(executor, trial_id)["total"] == pytest.approx(expected_total(rate), abs=1e-12)
        assert not checkpoints(executor, trial_id)  # nothing was written to disk
        assert scheduler.trials[trial_id].steps == list(range(1, BUDGET + 1))
    for timing in executor.switch_timings:
        assert timing.suspend_latency is not None and timing.resume_latency is not None


def test_a_trial_resumed_on_another_slot_moves_through_a_checkpoint(tmp_path: Path) -> None:
    rates = {"a": 0.3, "b": 0.5, "c": 0.9}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=2), metric="score") as executor:
        scheduler, log = run_experiment(executor, {t: curve(rate=r) for t, r in rates.items()}, period=0.05)
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    moved = {decision.trial_id for decision in decisions_of(log, Resume) if decision.migrated}
    assert moved  # three trials on two slots: the core evens the load out
    workers = {pid for trial_id in rates for pid in result(executor, trial_id)["pids"]}
    assert len(workers) == 2  # one warm worker per slot served every start
    for trial_id in moved:
        assert len(result(executor, trial_id)["pids"]) >= 2 and checkpoints(executor, trial_id)
    for trial_id, rate in rates.items():
        assert result(executor, trial_id)["total"] == pytest.approx(expected_total(rate), abs=1e-12)


def test_short_memory_spills_parked_trials_to_disk(tmp_path: Path) -> None:
    rates = {"a": 0.3, "b": 0.7}
    # More memory in reserve than any machine has: every parked trial is short of it.
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score", memory_reserve=1 << 62) as executor:
        scheduler, log = run_experiment(executor, {t: curve(rate=r) for t, r in rates.items()}, period=0.05)
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    suspended = {decision.trial_id for decision in decisions_of(log, Suspend)}
    for trial_id in suspended:  # every resume started the function again, from its checkpoint
        restarts = sum(1 for d in decisions_of(log, Resume) if d.trial_id == trial_id)
        assert len(result(executor, trial_id)["pids"]) == restarts + 1 and checkpoints(executor, trial_id)
    for trial_id, rate in rates.items():
        assert result(executor, trial_id)["total"] == pytest.approx(expected_total(rate), abs=1e-12)


def test_a_worker_over_its_memory_limit_is_replaced(tmp_path: Path) -> None:
    rates = {"a": 0.3, "b": 0.7}
    launches = {t: curve(rate=r, leak_mb=20) for t, r in rates.items()}
    limit = 1 << 20  # a megabyte: a worker is over it as soon as it has imported anything
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score", worker_memory_limit=limit) as executor:
        scheduler, log = run_experiment(executor, launches, period=0.05)
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    assert decisions_of(log, Suspend)
    workers = {pid for trial_id in rates for pid in result(executor, trial_id)["pids"]}
    assert len(workers) >= 2  # replaced at least once
    for trial_id, rate in rates.items():
        assert result(executor, trial_id)["total"] == pytest.approx(expected_total(rate), abs=1e-12)


def test_a_trial_that_kills_its_worker_fails_alone_and_the_parked_one_catches_up(tmp_path: Path) -> None:
    launches = {"a": curve(rate=0.4), "b": curve(rate=0.6, crash="hard", crash_step=4)}
    with LocalExecutor(
        tmp_path, slots=local_slots(cpu_slots=1), metric="score", checkpoint_every=2
    ) as executor:
        scheduler, log = run_experiment(executor, launches, period=0.05)
    a, b = scheduler.trials["a"], scheduler.trials["b"]
    assert b.state is TrialState.FAILED and b.error == "its worker died, exit code 7"  # it said nothing
    assert a.state is TrialState.COMPLETED
    assert a.steps == list(range(1, BUDGET + 1))  # the steps it did again after the crash were not re-reported
    assert [step for step, _ in reports(log, "a")] == list(range(1, BUDGET + 1))
    assert result(executor, "a")["total"] == pytest.approx(expected_total(0.4), abs=1e-12)
    assert len(set(result(executor, "a")["pids"])) == 2  # it lost its worker and went on in the new one


def test_a_worker_that_dies_importing_the_trials_module_says_why_once(tmp_path: Path) -> None:
    """Each trial's error quotes its own worker's last lines, whole, not those of the slot's workers before it."""
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n\ndef train(config):\n    pass\n")
    launches = {t: TrialLaunch(BUDGET, function="broken:train", cwd=str(tmp_path)) for t in "abc"}
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, _ = run_experiment(executor, launches, policy="fifo")
    for trial in scheduler.trials.values():
        assert trial.state is TrialState.FAILED and trial.error.startswith("its worker died, exit code 1: ")
        said = trial.error.removeprefix("its worker died, exit code 1: ")
        assert said.count("Traceback") <= 1 and said.endswith("No module named 'no_such_module_anywhere'")
        assert said.startswith(("Traceback", "File ", "  File ")), said  # a whole line, the first one quoted


def test_an_exception_fails_only_its_trial_and_the_worker_lives_on(tmp_path: Path) -> None:
    launches = {"a": curve(rate=0.4), "b": curve(rate=0.6, crash="raise", crash_step=2), "c": curve(rate=0.8)}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, _ = run_experiment(executor, launches, policy="fifo")
    b = scheduler.trials["b"]
    assert b.state is TrialState.FAILED
    assert b.error.startswith("uncaught RuntimeError: synthetic failure at step 2: about to fail at step 2\nTraceback")
    assert b.error.endswith("RuntimeError: synthetic failure at step 2")
    assert scheduler.trials["a"].state is scheduler.trials["c"].state is TrialState.COMPLETED
    assert result(executor, "a")["pids"] == result(executor, "c")["pids"]  # the same worker ran both


def test_a_running_trial_is_stopped_at_its_report(tmp_path: Path) -> None:
    launches = {"a": curve(rate=0.4), "b": curve(rate=0.6), "victim": curve(rate=0.2)}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, _ = run_experiment(executor, launches, period=0.05, stopper=StopAtStep("victim", 2))
    assert scheduler.trials["victim"].state is TrialState.STOPPED
    assert scheduler.trials["victim"].steps == [1, 2]
    assert scheduler.trials["a"].state is scheduler.trials["b"].state is TrialState.COMPLETED


def test_a_parked_trial_that_is_stopped_ends_silently(tmp_path: Path) -> None:
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        executor.next_events()  # its slot's NodeAdded
        executor.submit("a", curve(rate=0.4))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        assert isinstance(report, TrialReported) and report.step == 1
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended) and suspended.step == 1
        executor.apply(Stop("a"), executor.now())
        assert executor.next_events() == []  # the core expects nothing more: no event comes
        executor.submit("b", curve(rate=0.6, sleep=0.0))  # and the slot's worker serves the next trial
        executor.apply(Start("b", "local/cpu0"), executor.now())
        assert isinstance(executor.next_events()[0], TrialReported)
    assert not (executor.directory / "trials" / "a" / "result.json").exists()


def test_a_trial_stopped_while_it_moves_to_another_slot_ends_with_an_event(tmp_path: Path) -> None:
    """From its Resume on, the core counts a trial resumed on another slot as running. A Stop that came while its
    old worker was still spilling it to disk ended it without a word, and a cancelled experiment waited for that
    trial for ever (seen on a server, where a cancel stops every trial at once)."""
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=2), metric="score", checkpoint_every=1000) as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", curve(rate=0.4, hold_save=1))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended) and suspended.step == 1  # parked: nothing on disk yet
        executor.apply(Resume("a", "local/cpu1", migrated=True), executor.now())  # spilled first, held half written
        directory = executor.directory / "trials" / "a"
        wait_for(lambda: (directory / "saving-1").exists(), 30, "the spill to begin")
        executor.apply(Stop("a"), executor.now())
        (directory / "go-1").touch()
        events = executor.next_events()
        assert [(type(e), e.trial_id, e.succeeded, e.error) for e in events] == [(TrialExited, "a", False, "stopped")]
        assert executor.next_events() == [] and executor.idle()
    assert not (directory / "result.json").exists()  # it never started on the other slot


def test_a_trial_that_crashes_after_a_resume_from_memory_catches_up_silently(tmp_path: Path) -> None:
    """Parked in memory, a trial counts as saved at its step (the core falls back to it); the run resumed from
    there that crashes takes that state with it, and the next run starts from scratch. The executor kept the
    older step as the trial's fallback, so that run's catch-up report of the parked step went to the core as new
    and ended the whole experiment ("trial 1 reported step 1 after step 1"; seen once in CI)."""
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("a", curve(rate=0.4, crash="raise", crash_step=2, crash_runs=1))
        executor.apply(Start("a", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        executor.apply(Suspend("a"), executor.now())
        executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended) and suspended.step == 1  # parked in memory
        executor.apply(Resume("a", "local/cpu0"), executor.now())
        [crashed] = executor.next_events()
        assert isinstance(crashed, TrialExited) and crashed.crashed  # at step 2: the parked state is gone with it
        executor.apply(Resume("a", "local/cpu0"), executor.now())  # from step 1, as the core counts it
        reported = []
        while not reported or not isinstance(reported[-1], TrialExited):
            for event in executor.next_events():
                reported.append(event)
                if isinstance(event, TrialReported):
                    executor.settled(event)
    assert [e.step for e in reported if isinstance(e, TrialReported)] == list(range(2, BUDGET + 1))
    assert reported[-1].succeeded
    assert result(executor, "a")["total"] == pytest.approx(expected_total(0.4), abs=1e-12)


def test_a_trial_that_forks_neither_hangs_nor_reads_the_workers_commands(tmp_path: Path) -> None:
    """A DataLoader's worker processes are forked from the worker while its command loop blocks reading its
    commands: they used to wait for ever on that file's lock (multiprocessing closes stdin in every child). A
    program the trial runs gets /dev/null as stdin, not the worker's commands."""
    launches = {trial_id: TrialLaunch(3, function="trials.forking:train", cwd=str(TESTS)) for trial_id in "ab"}
    limits = TrialLimits(stall_after=30.0)  # a hang fails the trial, and so the test, instead of hanging it
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="seen", limits=limits) as executor:
        scheduler, log = run_experiment(executor, launches, period=0.05)
    assert {trial.trial_id: trial.error for trial in scheduler.trials.values()} == {"a": None, "b": None}
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    assert decisions_of(log, Suspend)  # and they were parked and resumed between their forks
    for trial_id in "ab":
        assert [metrics for _, metrics in reports(log, trial_id)] == [{"seen": 1.0, "stdin": 0.0}] * 3


def test_a_trial_that_reports_from_a_thread_of_its_own_runs_as_in_a_process_of_its_own(tmp_path: Path) -> None:
    """The session was the trial thread's only: hermes.trial in another thread of a warm worker failed the trial
    ("needs 'HERMES_TRIAL_ID' from a Hermes executor"), where a process per run worked. Two trials on one slot,
    parked and resumed between their reports."""
    launches = {trial_id: TrialLaunch(BUDGET, function="trials.threaded:train", config={"rate": rate},
                                      cwd=str(TESTS)) for trial_id, rate in (("a", 0.1), ("b", 0.2))}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, log = run_experiment(executor, launches, period=0.05)
    assert {trial.trial_id: trial.error for trial in scheduler.trials.values()} == {"a": None, "b": None}
    assert decisions_of(log, Suspend) and decisions_of(log, Resume)
    for trial_id, rate in (("a", 0.1), ("b", 0.2)):
        assert [metrics["score"] for _, metrics in reports(log, trial_id)] == pytest.approx(
            [rate * step for step in range(1, BUDGET + 1)])


def until_ended(executor: LocalExecutor, trials: int) -> list[Event]:
    """The executor's events until ``trials`` trials have ended, every report answered as it comes."""
    events: list[Event] = []
    while sum(isinstance(event, TrialExited) for event in events) < trials:
        for event in executor.next_events():
            events.append(event)
            executor.settled(event)
    return events


def test_a_trials_threads_work_for_it_while_another_trial_of_its_worker_moves(tmp_path: Path) -> None:
    """hermes.trial in a thread that a trial started answered for the trial the worker last said computes: a trial
    parked in the same worker and moved (spilled) or stopped meanwhile set that to itself, then to none, so the
    thread's next call reported for the other trial or failed ("needs 'HERMES_TRIAL_ID' from a Hermes executor").
    Now a thread works for the trial that started it; one that no trial started still answers for the trial that
    computes, which the other's spill leaves as it was."""
    launch = TrialLaunch(3, function="trials.pooled:train", cwd=str(TESTS))
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=2), metric="score") as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id in ("moved", "stays"):
            executor.submit(trial_id, launch)
        executor.apply(Start("moved", "local/cpu0"), executor.now())
        [report] = executor.next_events()
        executor.apply(Suspend("moved"), executor.now())
        executor.settled(report)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended)  # parked in the worker of cpu0
        executor.apply(Start("stays", "local/cpu0"), executor.now())
        [waiting] = executor.next_events()  # its step 1, from its pool's thread, which waits for the answer
        executor.apply(Resume("moved", "local/cpu1", migrated=True), executor.now())  # spilled by cpu0's worker
        [moved] = executor.next_events()  # its step 2 on cpu1: its spill on cpu0 has ended
        assert (moved.trial_id, moved.step) == ("moved", 2)
        executor.settled(moved)
        executor.settled(waiting)
        events = until_ended(executor, 2)
    assert {(e.trial_id, e.succeeded, e.error) for e in events if isinstance(e, TrialExited)} == {
        ("moved", True, None), ("stays", True, None)}
    reported = [waiting, *(e for e in events if isinstance(e, TrialReported))]
    assert sorted((e.trial_id, e.step) for e in reported if e.trial_id == "stays") == [("stays", s) for s in (1, 2, 3)]
    assert all(e.metrics["mine"] == e.metrics["shared"] == e.metrics["computes"] == 1.0 for e in reported)


def test_what_a_trials_threads_print_goes_to_its_own_logs(tmp_path: Path) -> None:
    """As in a process of its own: the lines and the traceback of a trial's other threads went to its worker's log,
    mixed with those of the worker's other trials. Two trials on one slot, parked and resumed between their steps;
    their tasks in a thread pool they share work for the trial that submits them, whichever started its thread."""
    launches = {trial_id: TrialLaunch(BUDGET, function="trials.pooled:train", config={"sleep": 0.05},
                                      cwd=str(TESTS)) for trial_id in "ab"}
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, log = run_experiment(executor, launches, period=0.05)
    assert {trial.trial_id: trial.error for trial in scheduler.trials.values()} == {"a": None, "b": None}
    assert decisions_of(log, Suspend) and decisions_of(log, Resume)
    for trial_id in "ab":
        assert [metrics for _, metrics in reports(log, trial_id)] == [
            {"score": float(step), "mine": 1.0, "shared": 1.0, "computes": 1.0} for step in range(1, BUDGET + 1)]
    for trial_id in "ab":
        directory = executor.directory / "trials" / trial_id
        assert (directory / "stdout.log").read_text().splitlines() == [
            f"trial {trial_id} prints at step {step}" for step in range(1, BUDGET + 1)]
        stderr = (directory / "stderr.log").read_text()
        assert f"RuntimeError: a thread of trial {trial_id} failed" in stderr
        assert [line for line in stderr.splitlines() if " warns at " in line] == [
            f"trial {trial_id} warns at step {step}" for step in range(1, BUDGET + 1)]
    worker_log = (executor.directory / "workers" / "local-cpu0.log").read_text()
    assert "prints at" not in worker_log and "warns at" not in worker_log and "RuntimeError" not in worker_log


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "process"])
def test_a_trial_whose_first_report_is_past_its_budget_fails_saying_its_steps_are_iterations(
    tmp_path: Path, warm: bool
) -> None:
    """Its steps counted iterations (100, 200...) against a budget of epochs: the trial ended at its first report,
    "completed" by its stderr, and then failed as one that "ended without a report"."""
    launch = TrialLaunch(BUDGET, function="trials.curve:train", config={"report": "iterations", "sleep": 0.0},
                         cwd=str(TESTS), warm=warm)
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, _ = run_experiment(executor, {"a": launch})
    [trial] = scheduler.trials.values()
    assert trial.state is TrialState.FAILED and not trial.steps
    assert (f"ValueError: its first report was step 100, past budget.steps {BUDGET}: steps count up to the budget "
            "(epochs, say), not iterations") in trial.error
    assert "ended without a report" not in trial.error


def test_a_trial_whose_workdir_is_gone_fails_alone_and_the_executor_goes_on(tmp_path: Path) -> None:
    """A workdir removed after the spec check: its warm worker could not start, and the FileNotFoundError stopped the
    executor (in a pool, every user's experiments)."""
    gone = tmp_path / "gone"
    launches = {"gone": TrialLaunch(BUDGET, function="trials.curve:train", config={"rate": 0.5}, cwd=str(gone)),
                "here": curve(rate=0.5)}
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, _ = run_experiment(executor, launches, policy="fifo")
    trials = scheduler.trials
    assert trials["gone"].state is TrialState.FAILED
    assert trials["gone"].error.startswith("cannot start its warm worker: [Errno 2] No such file or directory"), (
        trials["gone"].error)
    assert trials["here"].state is TrialState.COMPLETED


BIG_MB = 60
BIG_STATE = f'''
"""A trial whose saver holds {BIG_MB} MB (as a model would); it reports its worker's resident memory as it began."""
import json
import os

import numpy as np

from hermes import trial
from hermes.local.system import resident_bytes


def train(config):
    resident = resident_bytes(os.getpid()) / 2**20
    weights = np.ones({BIG_MB} << 17)  # float64s, touched

    def save(directory):
        (directory / "w.json").write_text(json.dumps(float(weights[0])))

    def load(directory):
        weights[:] = json.loads((directory / "w.json").read_text())

    saver = trial.Files(save, load)
    for step in range(saver.restore() + 1, trial.budget() + 1):
        trial.report(step, score=float(weights[0]), resident=resident)
'''


def big_state(directory: Path, steps: int) -> TrialLaunch:
    (directory / "bigstate.py").write_text(BIG_STATE)
    return TrialLaunch(steps, function="bigstate:train", cwd=str(directory))


def test_a_worker_keeps_nothing_of_the_trials_that_ended_in_it(tmp_path: Path) -> None:
    """A trial's saver pointed at its session, which keeps its savers: that cycle held each ended trial's state (its
    model, its optimizer; on a GPU, their device memory) in the worker until Python's cyclic collector happened to
    run, which numpy's and torch's memory never prompts: +40 MB a trial, 32 MB grew to 327 MB in 7 trials."""
    launch = big_state(tmp_path, 2)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="score") as executor:
        scheduler, log = run_experiment(executor, {str(n): launch for n in range(5)}, policy="fifo")
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    resident = [metrics["resident"] for n in range(5) for step, metrics in reports(log, str(n)) if step == 1]
    assert max(resident) - min(resident) < BIG_MB * 1.5, resident  # one trial's state at most, and no more


def test_a_worker_keeps_nothing_of_a_trial_that_moved_to_another_slot(tmp_path: Path) -> None:
    """The worker a trial was spilled from (to resume on another slot) held on to that trial's state, by the same
    cycle; the next trial it runs starts where the moved one started."""
    launch = big_state(tmp_path, 2)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="score") as executor:
        executor.next_events()  # the node's NodeAdded
        executor.submit("moved", launch)
        executor.submit("next", launch)
        executor.apply(Start("moved", "local/cpu0"), executor.now())
        [first] = executor.next_events()
        executor.apply(Suspend("moved"), executor.now())
        executor.settled(first)
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended)  # parked in the worker of cpu0
        executor.apply(Resume("moved", "local/cpu1", migrated=True), executor.now())  # spilled by cpu0's worker
        [moved] = executor.next_events()  # its step 2 on cpu1: its spill on cpu0 has ended
        assert (moved.trial_id, moved.step) == ("moved", 2)
        executor.settled(moved)
        executor.apply(Start("next", "local/cpu0"), executor.now())
        events = until_ended(executor, 2)
    [after] = [e for e in events if isinstance(e, TrialReported) and e.trial_id == "next" and e.step == 1]
    assert after.metrics["resident"] - first.metrics["resident"] < BIG_MB / 2


def test_a_worker_whose_trials_only_end_is_replaced_over_its_memory_limit(tmp_path: Path) -> None:
    """The limit was measured only when a trial parked: a worker whose trials ran to their end one after another was
    never replaced, however big it grew."""
    launches = {trial_id: curve(sleep=0.0) for trial_id in "abc"}
    limit = 1 << 20  # a megabyte: a worker is over it as soon as it has imported anything
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), metric="score", worker_memory_limit=limit) as executor:
        scheduler, log = run_experiment(executor, launches, policy="fifo")
    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    assert not decisions_of(log, Suspend)
    pids = [result(executor, trial_id)["pids"] for trial_id in "abc"]
    assert len({pid for run in pids for pid in run}) == 3  # a new worker for each
