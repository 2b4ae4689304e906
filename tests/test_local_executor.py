"""The local executor with real trial processes, real checkpoints and the real scheduling core."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import hermes.trial.session as session_module
from examples.digits.train import load_digits, train
from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    NodeAdded,
    PeriodElapsed,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSuspended,
)
from hermes.core.policy import SchedulingPolicy, Verdict
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.execution.engine import Engine
from hermes.errors import HermesError
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.policies import EarlyStopper, make_policy
from hermes.trial import protocol

ROOT = Path(__file__).resolve().parent.parent
PRINT_METRICS = str(ROOT / "examples" / "scripts" / "print_metrics.py")
PRINT_PATTERN = r"epoch (?P<step>\d+) loss (?P<loss>[\d.]+) accuracy (?P<value>[\d.]+)"


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def counter(steps_code: str = "") -> tuple[str, ...]:
    """A cooperative command trial: reports 0.1 * step for every step of its budget."""
    return python(
        "from hermes import trial\n"
        "for step in range(trial.start_step() + 1, trial.budget() + 1):\n"
        f"    {steps_code or 'pass'}\n"
        "    trial.report(step, value=0.1 * step)\n"
    )


def run_experiment(
    executor: LocalExecutor,
    launches: dict[str, TrialLaunch],
    *,
    policy: str | SchedulingPolicy = "rr",
    period: float = 0.05,
    stopper: EarlyStopper | None = None,
) -> tuple[Scheduler, list[tuple[Event, list[Decision]]]]:
    """Submit the trials and the executor's nodes, and run the engine to the end."""
    chosen = make_policy(policy, period=period) if isinstance(policy, str) else policy
    scheduler = Scheduler(chosen, stopper=stopper)
    log: list[tuple[Event, list[Decision]]] = []
    engine = Engine(scheduler, executor, [lambda event, decisions: log.append((event, decisions))])
    for trial_id, launch in launches.items():
        engine.post(executor.submit(trial_id, launch, at=0.0))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    return scheduler, log


def decisions_of(log: list[tuple[Event, list[Decision]]], kind: type) -> list[Decision]:
    return [decision for _, decisions in log for decision in decisions if isinstance(decision, kind)]


def reports(log: list[tuple[Event, list[Decision]]], trial_id: str) -> list[tuple[int, dict[str, float]]]:
    """All metrics of the trial's reports, by step, as their events carry them."""
    return sorted(
        (event.step, dict(event.metrics))
        for event, _ in log
        if isinstance(event, TrialReported) and event.trial_id == trial_id
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


class AlwaysContinue:
    """A session channel that records the messages and answers every report 'continue'."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def send(self, message: dict) -> None:
        self.messages.append(message)

    def receive(self) -> str:
        return protocol.CONTINUE


def reference_run(config: dict, budget: int, directory: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Train the digits function uninterrupted, in this process with one thread like a CPU slot.
    Returns the reported metrics."""
    directory.mkdir(parents=True)
    (directory / protocol.CONFIG_FILE).write_text(json.dumps(config))
    channel = AlwaysContinue()
    session = session_module.Session(
        "reference", directory, channel, budget=budget, metric="accuracy", checkpoint_every=0
    )
    monkeypatch.setattr(session_module, "_current", session)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config)
    finally:
        torch.set_num_threads(threads)
    return [message["metrics"] for message in channel.messages]


def test_load_digits_reads_scikit_learns_data() -> None:
    from sklearn.datasets import load_digits as sklearn_load_digits

    features, labels = load_digits()
    reference = sklearn_load_digits()
    assert np.array_equal(features, reference.data) and np.array_equal(labels, reference.target)


class YieldOnce(SchedulingPolicy):
    """A schedule that moves a trial between slots whatever the timing: each of ``yielding`` yields
    its slot at its first report; a trial that has not run yet goes first, then the one that has
    waited longest. The first to yield leaves its slot to a third trial, so when the second yields,
    the first resumes on the second's slot."""

    name = "yield-once"

    def __init__(self, yielding: set[str]) -> None:
        super().__init__(period=3600.0)  # no turn ends: only the yields switch trials
        self.yielding = set(yielding)

    def priority(self, trial: Trial, now: float) -> float:
        return math.inf if not trial.steps else -trial.idle_since

    def observe(self, trial: Trial, now: float) -> Verdict:
        if trial.trial_id in self.yielding:
            self.yielding.remove(trial.trial_id)
            return Verdict.PAUSE
        return Verdict.CONTINUE


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "process-per-trial"])
def test_digits_trials_resume_bitwise_exactly_across_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    configs = {
        "a": {"seed": 1, "width": 256, "lr": 0.05},
        "b": {"seed": 2, "width": 256, "lr": 0.1, "momentum": 0.5},
        "c": {"seed": 3, "width": 1024, "lr": 0.02, "weight_decay": 1e-4, "batch_size": 64},
    }
    # c, which takes the slot a yields, must still run when b yields, or a would resume on its own slot: twice
    # the steps of the others, each 5 times theirs (0.7 s), keep it there even when other processes slow b's first
    # step (seen under load).
    budgets = {"a": 3, "b": 3, "c": 6}
    launches = {
        trial_id: TrialLaunch(budgets[trial_id], function="examples.digits.train:train", config=config, warm=warm)
        for trial_id, config in configs.items()
    }
    with LocalExecutor(
        tmp_path / "run", slots=local_slots(cpu_slots=2), metric="accuracy", checkpoint_every=2, cwd=ROOT
    ) as executor:
        scheduler, log = run_experiment(executor, launches, policy=YieldOnce({"a", "b"}))

    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    suspended = [event.trial_id for event, _ in log if isinstance(event, TrialSuspended)]
    migrations = {decision.trial_id for decision in decisions_of(log, Resume) if decision.migrated}
    assert sorted(suspended) == ["a", "b"] and suspended[0] in migrations  # on the slot the other left
    for timing in executor.switch_timings:
        assert timing.suspend_latency is not None and timing.suspend_latency > 0
        assert timing.resume_latency is not None and timing.resume_latency > 0
    checkpointed = [event for event, _ in log if getattr(event, "checkpointed", False)]
    assert {(event.trial_id, event.step) for event in checkpointed} == {("a", 2), ("b", 2), ("c", 2), ("c", 4),
                                                                          ("c", 6)}

    for trial_id, config in configs.items():
        expected = reference_run(config, budgets[trial_id], tmp_path / "reference" / trial_id, monkeypatch)
        assert [metrics for _, metrics in reports(log, trial_id)] == expected
        weights = torch.load(tmp_path / "run" / "trials" / trial_id / "model.pt")
        reference = torch.load(tmp_path / "reference" / trial_id / "model.pt")
        assert weights.keys() == reference.keys()
        assert all(torch.equal(weights[key], reference[key]) for key in weights), trial_id


def test_a_crashing_trial_fails_with_its_exit_code_and_stderr(tmp_path: Path) -> None:
    launches = {
        "ok1": TrialLaunch(3, command=counter()),
        "crash": TrialLaunch(3, command=counter("if step == 2: raise RuntimeError('boom at step 2')")),
        "missing": TrialLaunch(3, command=("/nonexistent/program",)),
        "ok2": TrialLaunch(3, command=counter()),
    }
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=2)) as executor:
        scheduler, _ = run_experiment(executor, launches, policy="fifo")
    trials = scheduler.trials
    assert trials["ok1"].state is trials["ok2"].state is TrialState.COMPLETED
    assert trials["ok1"].values == pytest.approx([0.1, 0.2, 0.3])
    assert trials["crash"].state is TrialState.FAILED
    assert trials["crash"].error.startswith("exit code 1: ")
    assert trials["crash"].error.endswith("RuntimeError: boom at step 2")
    assert trials["crash"].steps == [1]
    assert trials["missing"].state is TrialState.FAILED and "cannot start" in trials["missing"].error


def test_a_protocol_violation_fails_the_trial_instead_of_hanging(tmp_path: Path) -> None:
    garbage = python(
        "import os, time\n"
        f"os.write(int(os.environ['{protocol.ENV_CHANNEL}'].split(',')[1]), b'not json\\n')\n"
        "time.sleep(60)\n"
    )
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1)) as executor:
        scheduler, _ = run_experiment(executor, {"garbage": TrialLaunch(2, command=garbage)}, policy="fifo")
    assert scheduler.trials["garbage"].state is TrialState.FAILED
    assert scheduler.trials["garbage"].error.startswith("protocol error")


def test_unmodified_script_is_stopped_and_continued_in_place(tmp_path: Path) -> None:
    epochs = 6
    command = (sys.executable, PRINT_METRICS, "--epochs", str(epochs), "--epoch-seconds", "0.1")
    launches = {
        trial_id: TrialLaunch(epochs, command=command + ("--lr", lr), metric_pattern=PRINT_PATTERN)
        for trial_id, lr in (("u1", "0.1"), ("u2", "0.3"))
    }
    assert not launches["u1"].movable
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1)) as executor:
        scheduler, log = run_experiment(executor, launches, period=0.25)

    assert {trial.state for trial in scheduler.trials.values()} == {TrialState.COMPLETED}
    assert decisions_of(log, Suspend) and decisions_of(log, Resume)
    assert not any(decision.migrated for decision in decisions_of(log, Resume))
    for trial_id, lr in (("u1", 0.1), ("u2", 0.3)):
        recorded = reports(log, trial_id)
        assert [step for step, _ in recorded] == list(range(1, epochs + 1))
        losses = [float(f"{np.exp(-lr * step):.4f}") for step in range(1, epochs + 1)]
        assert [metrics["loss"] for _, metrics in recorded] == losses
        assert [metrics["value"] for _, metrics in recorded] == [round(1 - loss, 4) for loss in losses]
        stdout = (tmp_path / "trials" / trial_id / "stdout.log").read_text().splitlines()
        assert len(stdout) == epochs
    # While stopped, a script prints nothing: no report of it lands between its suspension and resumption.
    for timing in executor.switch_timings:
        at = [event.at for event, _ in log if isinstance(event, TrialReported) and event.trial_id == timing.trial_id]
        assert not any(timing.suspended < moment < timing.resume_decided for moment in at)


class StopAtStep(EarlyStopper):
    """Stops one trial once it reports ``step``."""

    name = "stop-at-step"

    def __init__(self, trial_id: str, step: int) -> None:
        self.trial_id, self.step = trial_id, step

    def should_stop(self, trial: Trial) -> bool:
        return trial.trial_id == self.trial_id and trial.step >= self.step


def test_stop_answers_a_reporting_trial_which_exits_cleanly(tmp_path: Path) -> None:
    marker = tmp_path / "finally-ran"
    code = (
        "from hermes import trial\n"
        "try:\n"
        "    for step in range(1, trial.budget() + 1):\n"
        "        trial.report(step, value=0.1 * step)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').close()\n"
    )
    launches = {"victim": TrialLaunch(10, command=python(code)), "other": TrialLaunch(3, command=counter())}
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2)) as executor:
        scheduler, _ = run_experiment(executor, launches, policy="fifo", stopper=StopAtStep("victim", 2))
    assert scheduler.trials["victim"].state is TrialState.STOPPED
    assert scheduler.trials["victim"].steps == [1, 2]
    assert scheduler.trials["other"].state is TrialState.COMPLETED
    assert marker.exists()  # a SystemExit: the trial's finally block ran


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {child_pid}; echo started; echo oops >&2; wait"
    with LocalExecutor(tmp_path, slots=local_slots(cpu_slots=1), period=0.1) as executor:
        assert isinstance(executor.next_events()[0], NodeAdded)
        executor.submit("sleeper", TrialLaunch(5, command=("sh", "-c", script)))
        executor.apply(Start("sleeper", "local/cpu0"), executor.now())
        deadline = time.monotonic() + 10
        while not (child_pid.exists() and child_pid.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pid = int(child_pid.read_text())
        assert isinstance(executor.next_events()[0], PeriodElapsed)  # a silent trial: only the period ticks
        executor.apply(Stop("sleeper"), executor.now())
        exits: list[TrialExited] = []
        while not exits:  # a wait may wake for nothing, or a period's tick come beside the exit (a loaded machine)
            exits = [event for event in executor.next_events() if isinstance(event, TrialExited)]
        assert [(exit.trial_id, exit.succeeded, exit.error) for exit in exits] == [("sleeper", False, "stopped")]
        assert executor.next_events() == []  # nothing left alive
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
    while alive(pid):
        assert time.monotonic() < deadline, "the trial's child survived the stop"
        time.sleep(0.01)
    directory = tmp_path / "trials" / "sleeper"
    assert (directory / "stdout.log").read_text() == "started\n"
    assert (directory / "stderr.log").read_text() == "oops\n"


def test_slots_pin_cores_threads_and_devices(tmp_path: Path) -> None:
    slots = local_slots(cpu_slots=2, threads_per_slot=1)
    cores = sorted(os.sched_getaffinity(0))
    assert [slot.name for slot in slots] == ["local/cpu0", "local/cpu1"]
    if len(cores) >= 2:
        assert [slot.cpus for slot in slots] == [frozenset(cores[:1]), frozenset(cores[1:2])]
    gpu_slots = local_slots(gpus=["GPU-1111", "GPU-2222"])
    assert [(slot.name, slot.visible_devices) for slot in gpu_slots] == [
        ("local/gpu0", "GPU-1111"),
        ("local/gpu1", "GPU-2222"),
    ]
    show = python(
        "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
        "repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    )
    with LocalExecutor(tmp_path, slots=slots, clock_offset=100.0) as executor:
        assert [(e.node, e.gpus) for e in executor.next_events()] == [("local", ("local/cpu0", "local/cpu1"))]
        assert executor.now() >= 100.0
        executor.submit("show", TrialLaunch(1, command=show))
        executor.submit("second", TrialLaunch(1, command=show))
        executor.apply(Start("show", "local/cpu1"), executor.now())
        with pytest.raises(HermesError, match="holds it"):
            executor.apply(Start("second", "local/cpu1"), executor.now())
        with pytest.raises(HermesError, match="unknown GPU"):
            executor.apply(Start("second", "elsewhere/gpu0"), executor.now())
        (exited,) = executor.next_events()
        assert isinstance(exited, TrialExited) and exited.trial_id == "show" and exited.succeeded
    expected_cpus = sorted(slots[1].cpus) if slots[1].cpus else cores
    assert (tmp_path / "trials" / "show" / "stdout.log").read_text() == f"{expected_cpus} 1 ''\n"


def test_a_long_line_is_read_in_linear_time_and_only_its_end_is_kept() -> None:
    """A program's output is read 64 KiB at a time: a line of 20 MB took 15 s when each read copied and split the
    whole line again, and 200 MB never ended. Now it takes time in proportion to its length, and of a line over
    MAX_LINE only its end is kept (where its report is), so memory stays bounded. A carriage return ends a segment
    (a progress bar redrawn in place: docs/trials.md), which keeps the byte that ended it."""
    import threading

    from hermes.local.launchers import process
    from hermes.local.launchers.process import ScriptLauncher
    from hermes.local.runs import Output

    launcher = ScriptLauncher.__new__(ScriptLauncher)  # no executor: only its reading of a pipe is used
    lines: list[bytes] = []
    largest = 0

    def line(run: object, output: Output, text: bytes) -> None:
        lines.append(text)

    def close(output: Output) -> None:
        os.close(output.fd)
        output.fd = None

    launcher._line, launcher._close_output = line, close  # type: ignore[method-assign]
    launcher._ended = lambda run, output: None  # type: ignore[method-assign]
    read, write = os.pipe()
    report = b" epoch 3 loss 0.5 accuracy 0.75"
    long_line = b"#" * 50_000_000 + report  # no line end for 50 MB (a bar drawn with backspaces, say)
    bar = b"\r 10%|#      | 1/10 [00:01<00:09]" * (50_000_000 // 34)  # a bar redrawn in place: segments

    def produce() -> None:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(b"first\n" + long_line + b"\nshort\rline\n" + bar + b"\nlast")

    producer = threading.Thread(target=produce, daemon=True)  # a failure below must not leave it blocking pytest
    started = time.perf_counter()
    producer.start()
    output = Output(read)
    while output.fd is not None:
        launcher._read(None, output)  # type: ignore[arg-type]
        largest = max(largest, len(output.buffer))
    producer.join()
    elapsed = time.perf_counter() - started
    assert elapsed < 6.0, f"reading 100 MB took {elapsed:.1f}s"  # 0.7 s; quadratic, minutes
    assert lines[:4] == [b"first\n", long_line[1 - process.MAX_LINE:] + b"\n", b"short\r", b"line\n"]
    assert lines[4] == b"\r" and set(lines[5:-2]) == {b" 10%|#      | 1/10 [00:01<00:09]\r"}
    assert lines[-2:] == [b" 10%|#      | 1/10 [00:01<00:09]\n", b"last"]
    assert largest <= 2 * process.MAX_LINE + (1 << 16), f"{largest} bytes of a line kept"
