"""The simulator: invariants on random synthetic traces, determinism, and hand-computed figures.

The invariants are checked on the logs of ``simulate`` and, where the core's own view is
needed (trial states, switching events), on a run of the same engine, scheduler and simulated
executor wired as ``simulate`` wires them; a test checks that both runs agree.
"""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import pytest

from hermes.cli import _print_json, main
from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import Event, GpuRemoved, SubmissionsClosed, TrialExited, TrialSubmitted, TrialSuspended
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.errors import HermesError
from hermes.execution.engine import Engine
from hermes.core.policy import EarlyStopper, SchedulingPolicy
from hermes.policies.fifo import FifoPolicy
from hermes.policies.rr import RoundRobinPolicy
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import EpochRecord, SimulatedExecutor
from hermes.sim.simulate import cluster_layout, simulate
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import MAX_EPOCH_SECONDS, Trace, TraceTrial, load_trace, write_trace

COSTS = SwitchCosts()
TOLERANCE = 1e-6


class StopEveryThird(EarlyStopper):
    """Stops trials whose name is a multiple of three once they reach step 2: exercises Stop in the simulator."""

    name = "every_third"

    def should_stop(self, trial: Trial) -> bool:
        return int(trial.trial_id) % 3 == 0 and trial.step >= 2


@dataclass(frozen=True)
class Case:
    seed: int
    kind: str
    gpus: int
    nodes: int
    policy: str
    period: float = 60.0
    trials: int = 14
    epochs: int = 6
    diverge: float = 0.0
    mode: str = "max"
    stop: bool = False

    def make_policy(self) -> SchedulingPolicy:
        return FifoPolicy() if self.policy == "fifo" else RoundRobinPolicy(period=self.period)

    def trace(self) -> Trace:
        return synthetic_trace(
            self.trials,
            self.epochs,
            seed=self.seed,
            mode=self.mode,
            kind=self.kind,
            epoch_seconds=(2.0, 20.0),
            diverge_fraction=self.diverge,
        )

    def __str__(self) -> str:
        extra = f"-p{self.period:g}" if self.policy == "rr" else ""
        flags = ("-div" if self.diverge else "") + ("-stop" if self.stop else "")
        return f"{self.policy}{extra}-{self.kind}-s{self.seed}-{self.gpus}g{self.nodes}n-{self.mode}{flags}"


CASES = [
    Case(0, "saturating", 1, 1, "fifo"),
    Case(1, "mixed", 3, 2, "fifo", diverge=0.3),
    Case(2, "noisy", 8, 3, "fifo", trials=20, mode="min"),
    Case(3, "crossing", 2, 1, "fifo", stop=True),
    Case(4, "saturating", 1, 1, "rr", period=5),
    Case(5, "mixed", 2, 1, "rr", period=10, diverge=0.3),
    Case(6, "misleading_first", 3, 2, "rr", period=15, mode="min"),
    Case(7, "crossing", 4, 3, "rr", period=30, trials=20),
    Case(8, "noisy", 5, 2, "rr", period=5, diverge=0.2, trials=18),
    Case(9, "mixed", 8, 3, "rr", period=20, trials=24, epochs=8, diverge=0.25),
    Case(10, "saturating", 6, 3, "rr", period=7, stop=True, diverge=0.2),
    Case(11, "mixed", 3, 3, "rr", period=12, stop=True, mode="min"),
    Case(12, "misleading_first", 7, 2, "rr", period=25, trials=22, epochs=10),
    Case(13, "mixed", 2, 2, "rr", period=6, trials=10, epochs=5, diverge=0.5),
]


@dataclass
class Run:
    """One simulation with the core's and executor's view kept for inspection."""

    case: Case
    trace: Trace
    curves: dict[str, TraceTrial]
    gpu_node: dict[str, str]
    scheduler: Scheduler
    executor: SimulatedExecutor
    log: list[tuple[float, str, str, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    @property
    def epochs(self) -> list[EpochRecord]:
        assert self.executor.epochs is not None
        return self.executor.epochs


@functools.cache
def run_engine(case: Case) -> Run:
    """What ``simulate`` does, keeping the scheduler, the executor and every event and decision."""
    trace = case.trace()
    layout = cluster_layout(case.gpus, case.nodes)
    arrivals = trace.shuffled(case.seed)
    curves = {curve.name: curve for curve in arrivals}
    gpu_node = {gpu: node for node, gpus in layout.items() for gpu in gpus}
    executor = SimulatedExecutor(layout, COSTS, record_epochs=True)
    policy = case.make_policy()
    policy.configure(executor.profile)
    scheduler = Scheduler(
        policy, objective=Objective(trace.mode), stopper=StopEveryThird() if case.stop else None
    )
    run = Run(case, trace, curves, gpu_node, scheduler, executor)

    def listen(event: Event, decisions: list[Decision]) -> None:
        run.events.append(event)
        for decision in decisions:
            run.decisions.append((event.at, decision))
            run.log.append((event.at, type(decision).__name__, decision.trial_id, getattr(decision, "gpu", "")))

    engine = Engine(scheduler, executor, [listen])
    for curve in arrivals:
        executor.submit(curve.name, curve)
        engine.post(TrialSubmitted(0.0, curve.name, curve.epochs))
    engine.post(SubmissionsClosed(0.0))
    engine.run()
    return run


@pytest.fixture(scope="module", params=CASES, ids=str)
def run(request: pytest.FixtureRequest) -> Run:
    return run_engine(request.param)


def _by_trial(epochs: list[EpochRecord]) -> dict[str, list[EpochRecord]]:
    grouped: dict[str, list[EpochRecord]] = defaultdict(list)
    for record in epochs:
        grouped[record.trial_id].append(record)
    return grouped


def _assert_no_overlap(intervals: list[tuple[float, float]], what: str) -> None:
    intervals = sorted(intervals)
    for (start, end), (next_start, next_end) in zip(intervals, intervals[1:]):
        assert next_start >= end - TOLERANCE, f"{what}: [{start}, {end}] overlaps [{next_start}, {next_end}]"


# ---------------------------------------------------------------------------------------- invariants
def test_engine_run_matches_simulate(run: Run) -> None:
    """The inspected run is the very run ``simulate`` makes."""
    case = run.case
    result = simulate(
        run.trace,
        case.make_policy(),
        gpus=case.gpus,
        nodes=case.nodes,
        seed=case.seed,
        stopper=StopEveryThird() if case.stop else None,
        record=True,
    )
    assert result.decisions == run.log
    assert result.epochs == run.epochs
    assert result.makespan_s == run.executor.now()


def test_no_gpu_runs_two_epochs_at_once(run: Run) -> None:
    per_gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in run.epochs:
        assert record.start <= record.end
        per_gpu[record.gpu].append((record.start, record.end))
    assert set(per_gpu) <= set(run.gpu_node)
    for gpu, intervals in per_gpu.items():
        _assert_no_overlap(intervals, f"GPU {gpu}")


def test_no_gpu_is_held_by_two_trials_at_once(run: Run) -> None:
    """Stronger than epochs: from Start/Resume to the trial's release, switching costs included."""
    holding: dict[str, tuple[str, float]] = {}  # trial -> (gpu, since)
    per_gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    timeline = sorted(
        [(at, 1, decision) for at, decision in run.decisions] + [(e.at, 0, e) for e in run.events],
        key=lambda item: (item[0], item[1]),
    )
    # Release events at time t come before decisions made at t, as the engine orders them.
    for at, _, item in timeline:
        if isinstance(item, (Start, Resume)):
            assert item.trial_id not in holding, f"{item.trial_id} got a GPU while holding one"
            holding[item.trial_id] = (item.gpu, at)
        elif isinstance(item, (TrialSuspended, TrialExited)) and item.trial_id in holding:
            gpu, since = holding.pop(item.trial_id)
            per_gpu[gpu].append((since, at))
    assert not holding, f"trials still holding GPUs at the end: {sorted(holding)}"
    for gpu, intervals in per_gpu.items():
        _assert_no_overlap(intervals, f"GPU {gpu}")


def test_no_trial_runs_on_two_gpus_at_once(run: Run) -> None:
    for trial_id, records in _by_trial(run.epochs).items():
        _assert_no_overlap([(r.start, r.end) for r in records], f"trial {trial_id}")


def test_every_epoch_runs_once_in_order(run: Run) -> None:
    grouped = _by_trial(run.epochs)
    assert set(grouped) == set(run.curves), "some trial never trained"
    for trial_id, records in grouped.items():
        assert [r.epoch for r in records] == list(range(1, len(records) + 1)), trial_id
        assert [r.start for r in records] == sorted(r.start for r in records)
        trial = run.scheduler.trials[trial_id]
        curve = run.curves[trial_id]
        if trial.state is TrialState.STOPPED:
            # Killed at the epoch boundary of the report that stopped it: nothing trained after that.
            assert len(records) == trial.step <= curve.epochs
        else:
            assert len(records) == curve.epochs, f"trial {trial_id} trained {len(records)} of {curve.epochs}"


def test_epochs_take_their_recorded_time(run: Run) -> None:
    for record in run.epochs:
        expected = run.curves[record.trial_id].seconds[record.epoch - 1]
        assert record.end - record.start == pytest.approx(expected, abs=TOLERANCE)


def test_every_trial_ends_terminal_with_the_right_outcome(run: Run) -> None:
    scheduler = run.scheduler
    assert scheduler.finished
    assert set(scheduler.trials) == set(run.curves)
    for trial_id, trial in scheduler.trials.items():
        assert trial.state.is_terminal, f"{trial_id} ended {trial.state.value}"
        assert trial.gpu is None
        curve = run.curves[trial_id]
        if trial.state is TrialState.COMPLETED:
            assert not curve.diverged
            assert trial.step == curve.epochs
        elif trial.state is TrialState.FAILED:
            assert curve.diverged
            assert trial.step == curve.epochs - 1
        else:
            assert trial.state is TrialState.STOPPED
            assert trial_id in {d.trial_id for _, d in run.decisions if isinstance(d, Stop)}
    if not run.case.stop:
        assert all(trial.state is not TrialState.STOPPED for trial in scheduler.trials.values())


def test_reports_match_the_trace(run: Run) -> None:
    for trial_id, trial in run.scheduler.trials.items():
        curve = run.curves[trial_id]
        assert trial.steps == list(range(1, len(trial.steps) + 1))
        assert trial.values == list(curve.metrics[: len(trial.values)])


def test_resumed_trials_keep_their_progress_on_the_resumed_gpu(run: Run) -> None:
    grouped = _by_trial(run.epochs)
    resumes = 0
    for at, decision in run.decisions:
        if not isinstance(decision, (Start, Resume)):
            continue
        records = grouped[decision.trial_id]
        before = [r for r in records if r.end <= at + TOLERANCE]
        after = [r for r in records if r.start >= at - TOLERANCE]
        if isinstance(decision, Start):
            assert not before
            assert after and after[0].epoch == 1
            cost = COSTS.start
        else:
            resumes += 1
            assert before, f"{decision.trial_id} resumed without having trained"
            if not after:
                continue  # stopped or lost before training again: nothing to check
            assert after[0].epoch == before[-1].epoch + 1, f"{decision.trial_id} lost or repeated progress"
            cost = COSTS.resume_cost(
                other_gpu=decision.gpu != before[-1].gpu,
                other_node=run.gpu_node[decision.gpu] != run.gpu_node[before[-1].gpu],
            )
            assert decision.migrated == (decision.gpu != before[-1].gpu)
        assert after[0].gpu == decision.gpu
        assert after[0].start == pytest.approx(at + cost, abs=TOLERANCE)
    if run.case.policy == "rr":
        assert resumes > 0, "the short periods should make rr preempt"


def test_time_never_goes_backwards(run: Run) -> None:
    times = [at for at, *_ in run.log]
    assert times == sorted(times)
    event_times = [event.at for event in run.events]
    assert event_times == sorted(event_times)
    assert run.executor.now() == max(r.end for r in run.epochs)


def test_useful_time_is_the_sum_of_trained_epochs(run: Run) -> None:
    accounts = run.executor.accounts
    trained = sum(run.curves[r.trial_id].seconds[r.epoch - 1] for r in run.epochs)
    assert accounts.useful == pytest.approx(trained, rel=1e-9)
    assert accounts.useful == pytest.approx(sum(r.end - r.start for r in run.epochs), rel=1e-9)


def _node_crossings(run: Run) -> int:
    """Resumes on another node than the trial's previous run."""
    crossings = 0
    last_node: dict[str, str] = {}
    for _, decision in run.decisions:
        if isinstance(decision, (Start, Resume)):
            node = run.gpu_node[decision.gpu]
            crossings += isinstance(decision, Resume) and last_node[decision.trial_id] != node
            last_node[decision.trial_id] = node
    return crossings


def _resume_costs(run: Run) -> float:
    """What the cost model charges for the run's resumes, from where each trial ran before."""
    total = 0.0
    last_gpu: dict[str, str] = {}
    for _, decision in run.decisions:
        if isinstance(decision, (Start, Resume)):
            gpu = decision.gpu
            if isinstance(decision, Resume):
                before = last_gpu[decision.trial_id]
                total += COSTS.resume_cost(other_gpu=gpu != before, other_node=run.gpu_node[gpu] != run.gpu_node[before])
            last_gpu[decision.trial_id] = gpu
    return total


def test_every_gpu_second_is_accounted_for(run: Run) -> None:
    """Busy time is training plus switching: start, suspend, resume and migration costs, nothing else."""
    accounts = run.executor.accounts
    starts = sum(isinstance(d, Start) for _, d in run.decisions)
    suspensions = sum(isinstance(e, TrialSuspended) for e in run.events)
    overhead = suspensions * COSTS.suspend_cost() + _resume_costs(run)
    assert accounts.overhead == pytest.approx(overhead, abs=TOLERANCE)
    assert accounts.busy == pytest.approx(accounts.useful + accounts.overhead + starts * COSTS.start, rel=1e-9)
    assert starts == len(run.curves)


def test_fifo_never_preempts_or_resumes(run: Run) -> None:
    if run.case.policy == "fifo":
        names = {name for _, name, _, _ in run.log}
        assert names <= {"Start", "Stop"}
        assert run.executor.accounts.overhead == 0.0
        # One trial per GPU at a time, so no trial ever waits after its first epoch.
        for records in _by_trial(run.epochs).values():
            for previous, following in zip(records, records[1:]):
                assert following.start == pytest.approx(previous.end, abs=TOLERANCE)
                assert following.gpu == previous.gpu


def test_cases_exercise_every_path() -> None:
    """The random cases, taken together, reach every outcome and every kind of switch."""
    runs = [run_engine(case) for case in CASES]
    outcomes = {trial.state for run in runs for trial in run.scheduler.trials.values()}
    assert outcomes == {TrialState.COMPLETED, TrialState.FAILED, TrialState.STOPPED}
    decisions = [(run, decision) for run in runs for _, decision in run.decisions]
    assert any(isinstance(d, Suspend) for _, d in decisions)
    assert any(isinstance(d, Resume) and not d.migrated for _, d in decisions)
    assert any(isinstance(d, Resume) and d.migrated for _, d in decisions)
    assert sum(_node_crossings(run) for run in runs) > 0, "no trial ever resumed on another node"
    assert {run.case.mode for run in runs} == {"max", "min"}


# ---------------------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("policy", ["fifo", "rr"])
def test_same_seed_same_decisions_and_other_seed_other_decisions(policy: str) -> None:
    trace = synthetic_trace(16, 6, seed=7, kind="mixed", epoch_seconds=(2.0, 20.0), diverge_fraction=0.2)

    def make() -> SchedulingPolicy:
        return FifoPolicy() if policy == "fifo" else RoundRobinPolicy(period=8)

    first = simulate(trace, make(), gpus=4, nodes=2, seed=3, record=True)
    again = simulate(trace, make(), gpus=4, nodes=2, seed=3, record=True)
    other = simulate(trace, make(), gpus=4, nodes=2, seed=4, record=True)
    assert first.decisions, "record=True must fill the decision log"
    assert first.decisions == again.decisions
    assert first.epochs == again.epochs
    assert first.figures() == again.figures()
    assert first.decisions != other.decisions


def test_without_record_no_logs_are_kept() -> None:
    trace = synthetic_trace(4, 3, seed=0, epoch_seconds=(2.0, 5.0))
    result = simulate(trace, FifoPolicy(), gpus=2)
    assert result.decisions == []
    assert result.epochs is None


# ---------------------------------------------------------------------------------------- figures
HAND_COSTS = SwitchCosts(start=1.5, suspend=0.5, resume=1.5, migration=1.0, spill=0.0, state_mb=0.0)  # hand-traced: fixed costs only


def _curve(name: str, metrics: list[float], seconds: list[float]) -> TraceTrial:
    return TraceTrial(name, tuple(metrics), tuple(seconds), len(seconds) > len(metrics), MappingProxyType({}))


def test_fifo_first_feedback_on_a_csv_trace(tmp_path: Path) -> None:
    """One GPU, three identical-length trials of two 10 s epochs: the order does not change the figures."""
    curves = (_curve(name, [0.1 * i, 0.2 * i], [10.0, 10.0]) for i, name in enumerate("abc", 1))
    made = Trace("hand", "max", tuple(curves))
    path = tmp_path / "hand.csv"
    write_trace(made, path)
    trace = load_trace(path, "max")
    result = simulate(trace, FifoPolicy(), gpus=1, seed=0, record=True, costs=HAND_COSTS)
    start = HAND_COSTS.start
    # Each trial starts when the previous one exits, then pays the start cost before its first epoch.
    first_reports = [start + 10, 2 * (start + 20) - 10, 3 * (start + 20) - 10]  # 11.5, 33, 54.5
    assert result.mean_first_feedback_s == pytest.approx(sum(first_reports) / 3)
    assert result.median_first_feedback_s == pytest.approx(first_reports[1])
    assert result.max_first_feedback_s == pytest.approx(first_reports[2])
    assert result.makespan_s == pytest.approx(3 * (start + 20))
    assert result.time_to_best_s == pytest.approx(  # "c" is best; its completion depends on its place
        (1 + [t.name for t in trace.shuffled(0)].index("c")) * (start + 20)
    )
    assert result.gpu_utilization == pytest.approx(1.0)
    assert result.overhead_fraction == 0.0
    assert result.preemptions == 0 and result.migrations == 0


def test_fifo_figures_on_two_gpus() -> None:
    trace = Trace("two", "max", (_curve("a", [0.5, 0.9], [10.0, 20.0]), _curve("b", [0.3, 0.4], [4.0, 4.0])))
    result = simulate(trace, FifoPolicy(), gpus=2, seed=1, costs=HAND_COSTS)
    # Both start at once on their own GPU: first feedback after start cost + first epoch.
    assert result.mean_first_feedback_s == pytest.approx(((1.5 + 10) + (1.5 + 4)) / 2)
    assert result.max_first_feedback_s == pytest.approx(11.5)
    assert result.time_to_best_s == pytest.approx(31.5)
    assert result.makespan_s == pytest.approx(31.5)
    assert result.gpu_utilization == pytest.approx((31.5 + 9.5) / (2 * 31.5))
    assert 0 < result.gpu_utilization <= 1
    assert result.overhead_fraction == 0.0


def test_time_to_best_is_the_first_completion_of_any_trial_tied_for_best() -> None:
    """Two trials end on the best metric: the best is reached when the first of them completes, not when the one
    first in the file does (100 s later here)."""
    trace = Trace("tie", "max", (_curve("slow", [0.9], [100.0]), _curve("fast", [0.9], [1.0]),
                                 _curve("other", [0.1], [1.0])))
    result = simulate(trace, FifoPolicy(), gpus=3, seed=0, costs=HAND_COSTS)
    assert result.time_to_best_s == pytest.approx(1.5 + 1.0) == result.time_to_target_s
    assert result.makespan_s == pytest.approx(1.5 + 100.0)
    assert [t.name for t in trace.best_finals()] == ["slow", "fast"]


def test_rr_figures_on_a_hand_traced_run() -> None:
    """One GPU, period 5 s, two trials of two 10 s epochs: every report after the first epoch preempts."""
    trace = Trace("rr", "max", (_curve("a", [0.1, 0.2], [10.0, 10.0]), _curve("b", [0.3, 0.4], [10.0, 10.0])))
    result = simulate(trace, RoundRobinPolicy(period=5), gpus=1, seed=0, record=True, costs=HAND_COSTS)
    first, second = (t.name for t in trace.shuffled(0))
    assert result.decisions == [
        (0.0, "Start", first, "n0/g0"),
        (11.5, "Suspend", first, ""),  # epoch 1 ends at 1.5 + 10; suspending costs 0.5
        (12.0, "Start", second, "n0/g0"),
        (23.5, "Suspend", second, ""),
        (24.0, "Resume", first, "n0/g0"),  # resuming costs 1.5: epoch 2 runs 25.5 to 35.5
        (35.5, "Resume", second, "n0/g0"),  # first completes; second's epoch 2 runs 37 to 47
    ]
    assert result.mean_first_feedback_s == pytest.approx((11.5 + 23.5) / 2)
    assert result.makespan_s == pytest.approx(47.0)
    assert result.preemptions == 2 and result.migrations == 0
    assert result.overhead_fraction == pytest.approx((2 * 0.5 + 2 * 1.5) / 40)
    assert result.gpu_utilization == pytest.approx(1.0)
    fifo = simulate(trace, FifoPolicy(), gpus=1, seed=0, costs=HAND_COSTS)
    assert fifo.mean_first_feedback_s == pytest.approx((11.5 + 33.0) / 2)
    assert result.mean_first_feedback_s < fifo.mean_first_feedback_s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overhead_is_zero_for_fifo_and_positive_for_rr_with_preemptions(seed: int) -> None:
    trace = synthetic_trace(12, 5, seed=seed, kind="mixed", epoch_seconds=(2.0, 20.0))
    fifo = simulate(trace, FifoPolicy(), gpus=3, nodes=2, seed=seed)
    rr = simulate(trace, RoundRobinPolicy(period=10), gpus=3, nodes=2, seed=seed)
    assert fifo.preemptions == 0 and fifo.migrations == 0
    assert fifo.overhead_fraction == 0.0
    assert rr.preemptions > 0
    assert rr.overhead_fraction > 0.0
    for result in (fifo, rr):
        assert 0 < result.gpu_utilization <= 1 + 1e-12
        assert result.makespan_s > 0
        assert 0 < result.mean_first_feedback_s <= result.max_first_feedback_s
    # Time-sharing gets first feedback to everyone sooner.
    assert rr.mean_first_feedback_s < fifo.mean_first_feedback_s


def test_migration_across_nodes_costs_extra() -> None:
    """Resume decisions flagged migrated are counted; crossing nodes adds the migration cost."""
    trace = synthetic_trace(12, 6, seed=5, kind="saturating", epoch_seconds=(2.0, 20.0))
    cheap = simulate(trace, RoundRobinPolicy(period=5), gpus=4, nodes=2, seed=5, costs=SwitchCosts(migration=0.0))
    dear = simulate(trace, RoundRobinPolicy(period=5), gpus=4, nodes=2, seed=5, costs=SwitchCosts(migration=5.0))
    assert cheap.migrations > 0
    assert dear.overhead_fraction > cheap.overhead_fraction


def _pinned(trace: Trace) -> Trace:
    """``trace`` as an unmodified program's: every trial suspended in place with SIGSTOP, its state in its process."""
    return replace(trace, trials=tuple(replace(trial, movable=False) for trial in trace.trials))


def test_an_unmovable_trial_never_migrates_and_its_switches_move_no_state() -> None:
    """A run submits an unmodified program with movable=False and SIGSTOPs it in place; the simulator migrated it,
    charging 50 MB of state each way, where the real run never did (4 migrations and 22.9% overhead on a search
    that ran with none)."""
    trace = synthetic_trace(12, 6, seed=5, kind="saturating", epoch_seconds=(2.0, 20.0))
    trace = replace(trace, trials=tuple(replace(trial, state_mb=50.0) for trial in trace.trials))
    costs = SwitchCosts(start=1.0, suspend=0.5, resume=1.5, spill=0.0, migration=0.0, device_mb_s=100.0,
                        spill_mb_s=100.0)
    moved = simulate(trace, RoundRobinPolicy(period=5), gpus=4, seed=5, costs=costs)
    assert moved.migrations > 0  # the same search, movable: the case migrates
    pinned = simulate(_pinned(trace), RoundRobinPolicy(period=5), gpus=4, seed=5, costs=costs, record=True)
    assert pinned.migrations == 0 and pinned.preemptions > 0
    assert len({(epoch.trial_id, epoch.gpu) for epoch in pinned.epochs}) == len(trace.trials)  # one GPU each
    resumes = sum(verb == "Resume" for _, verb, _, _ in pinned.decisions)
    useful = sum(map(sum, (trial.seconds for trial in trace.trials)))
    assert pinned.overhead_fraction == pytest.approx((pinned.preemptions * 0.5 + resumes * 1.5) / useful)


@pytest.mark.parametrize("lost", ["running", "suspended"])
def test_an_unmovable_trial_that_lost_its_process_starts_again_and_catches_up(lost: str) -> None:
    """It keeps no checkpoint: where its GPU goes, running or stopped there, a new process starts from the beginning
    (the start cost), trains the epochs the core has again without reporting them, and reports from the next."""
    executor = SimulatedExecutor({"n0": ("n0/g0", "n0/g1")}, HAND_COSTS, record_epochs=True)
    curve = TraceTrial("a", (0.1, 0.2, 0.3, 0.4), (10.0,) * 4, False, MappingProxyType({}), movable=False)
    assert executor.submit("a", curve).movable is False
    executor.next_events()  # the cluster
    executor.apply(Start("a", "n0/g0"), 0.0)
    assert [event.step for event in executor.next_events()] == [1]  # at 11.5
    executor.apply(Suspend("a"), 11.5)
    assert executor.next_events() == [TrialSuspended(12.0, "a", 1)]
    executor.apply(Resume("a", "n0/g0"), 12.0)
    assert [event.step for event in executor.next_events()] == [2]  # at 23.5; it trains on
    if lost == "suspended":
        executor.apply(Suspend("a"), 23.5)
        assert executor.next_events() == [TrialSuspended(24.0, "a", 2)]
    executor.remove_gpu("n0/g0")
    executor.next_events()  # GpuRemoved
    lost_at = executor.now()
    executor.apply(Resume("a", "n0/g1", migrated=True), lost_at)
    events: list[Event] = []
    while not events or not isinstance(events[-1], TrialExited):
        events += executor.next_events()
    assert [event.step for event in events[:-1]] == [3, 4] and events[-1].succeeded
    assert [epoch.epoch for epoch in executor.epochs if epoch.gpu == "n0/g1"] == [1, 2, 3, 4]
    assert events[-1].at == pytest.approx(lost_at + HAND_COSTS.start + 40.0)


def test_unmovable_trials_replay_through_the_core_when_gpus_go() -> None:
    """The core and the simulator agree on where a restarted unmodified program stands: no step is reported twice
    (the core refuses that), every trial trains its budget, and none migrates."""
    trace = _pinned(synthetic_trace(8, 6, seed=3, epoch_seconds=(2.0, 10.0)))
    changes = [GpuRemoved(15.0, "n0/g0"), GpuRemoved(40.0, "n0/g2")]
    result = simulate(trace, RoundRobinPolicy(period=5), gpus=4, seed=3, record=True, changes=changes)
    assert result.migrations == 0
    done = defaultdict(int)
    for epoch in result.epochs:
        done[epoch.trial_id] = max(done[epoch.trial_id], epoch.epoch)
    assert done == {trial.name: trial.epochs for trial in trace.trials}
    assert len(result.epochs) > sum(trial.epochs for trial in trace.trials)  # processes were lost, epochs re-trained


def test_cluster_layout_spreads_gpus_evenly() -> None:
    assert cluster_layout(5, 2) == {"n0": ("n0/g0", "n0/g1", "n0/g2"), "n1": ("n1/g0", "n1/g1")}
    with pytest.raises(ValueError):
        cluster_layout(2, 3)
    with pytest.raises(ValueError):
        cluster_layout(0, 1)


# ---------------------------------------------------------------------------------------- command line
DIGITS = str(Path(__file__).resolve().parent.parent / "data" / "digits_mlp.csv")


def _strict_json(text: str) -> object:
    """Parse as strict parsers do (JavaScript's, Go's): NaN and Infinity are no JSON."""
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_cli_simulate_refuses_a_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse's refusal, with the usage; was numpy's ValueError traceback
        main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--seed", "-1"])
    assert "argument --seed: must be a whole number >= 0, got '-1'" in capsys.readouterr().err
    assert main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--seed", "0", "--policy", "fifo"]) == 0


def test_cli_compare_table_says_never_where_no_seed_reached_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    """A policy that never trained the best trial printed ``nan`` for its times and ratios; the table says "never",
    as the README's tables do, its ratios "-", and --json keeps null."""
    compare = ["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--seeds", "2", "--compare", "fifo,asha",
               "--target-tolerance", "0"]
    assert main(compare) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:]}
    assert rows["asha"][1:6] == ["0/2", "never", "-", "never", "-"] and "nan" not in rows["asha"]
    assert rows["fifo"][1] == "2/2" and float(rows["fifo"][2]) > 0
    assert main([*compare, "--json"]) == 0
    asha = next(row for row in _strict_json(capsys.readouterr().out) if row["policy"] == "asha")
    assert asha["time_to_best_s"] is None and asha["time_to_target_s"] is None


def test_cli_simulate_help_shows_the_default_target_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "default 1%" in " ".join(capsys.readouterr().out.split())


def test_cli_compare_refuses_a_policy_named_twice(capsys: pytest.CaptureFixture[str]) -> None:
    """Its runs would merge into one row: 6/6 under a header of 3 seeds."""
    compare = ["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--seeds", "1", "--compare"]
    assert main([*compare, "fifo,fifo,hermes"]) == 2
    assert "--compare 'fifo,fifo,hermes': policy 'fifo' is named twice" in capsys.readouterr().err
    assert main([*compare, "fifo, rr,rr ", "--json"]) == 2
    assert "policy 'rr' is named twice" in capsys.readouterr().err


def test_cli_refuses_an_epoch_longer_than_a_year(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1e308 seconds is finite, but the simulated clock overflowed to inf and --json printed Infinity and NaN."""
    path = tmp_path / "huge.csv"
    path.write_text(f"trial,epoch,metric,seconds\na,1,0.5,{MAX_EPOCH_SECONDS}\na,2,0.6,1e308\nb,1,0.4,1\n")
    assert main(["simulate", "--trace", str(path), "--mode", "max", "--gpus", "1", "--json", "--policy", "fifo"]) == 2
    assert f"huge.csv:3: seconds must be at most {MAX_EPOCH_SECONDS} (a year) per epoch, got '1e308'" in (
        capsys.readouterr().err
    )
    path.write_text(f"trial,epoch,metric,seconds\na,1,0.5,{MAX_EPOCH_SECONDS}\nb,1,0.4,1\n")  # a year is allowed
    assert main(["simulate", "--trace", str(path), "--mode", "max", "--gpus", "1", "--json", "--policy", "fifo"]) == 0
    assert _strict_json(capsys.readouterr().out)["makespan_s"] > MAX_EPOCH_SECONDS  # type: ignore[index]


def test_cli_json_is_standard_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A figure no seed produced is null, not NaN; on one GPU, ASHA stops digits' final-best trial early."""
    assert main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "1", "--stopper", "asha",
                 "--compare", "fifo", "--seeds", "1", "--json"]) == 0
    [summary] = _strict_json(capsys.readouterr().out)  # type: ignore[misc]
    assert summary["best_reached"] == 0 and summary["time_to_best_s"] is None
    assert summary["makespan_s"] > 0
    with pytest.raises(HermesError, match="--json: a figure is not a finite number"):
        _print_json({"makespan_s": math.inf})  # an overflow is an error, not a token that strict parsers reject


def test_ctrl_c_ends_a_long_command_quietly() -> None:
    """Ctrl-C during a long ``hermes simulate`` (or a second one while ``run`` says it was interrupted) gave a
    traceback; it ends the command with 130 and nothing else."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "hermes.cli", "simulate", "--trace", str(root / "data" / "lcbench_189908.csv"),
               "--mode", "max", "--gpus", "4", "--compare", "fifo,asha,hyperband,hermes", "--seeds", "10"]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # imported, and simulating: it takes a minute
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and "Traceback" not in stderr, stderr


class ShortestFirst(SchedulingPolicy):
    """docs/extending.md's example, as written there: it sets no ``name``."""

    def priority(self, trial: Trial, now: float) -> float:
        return -trial.step


def test_a_policy_of_ones_own_is_simulated_from_the_command_line_by_class_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It ran under `hermes run` but the simulator read its ``name``, which it need not set: a traceback."""
    trace = str(Path(__file__).parents[1] / "data" / "digits_mlp.csv")
    assert main(["simulate", "--trace", trace, "--mode", "max", "--gpus", "2", "--json",
                 "--policy", f"{__name__}:ShortestFirst", "--stopper", "hermes.policies.stopping:MedianStopper"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["policy"] == "ShortestFirst" and figures["trials"] == 40


class WithoutPriority(SchedulingPolicy):
    """Abstract: it has no ``priority``."""


class WithoutPeriod(SchedulingPolicy):
    """Takes no ``period``, which --period gives it."""

    def __init__(self) -> None:
        super().__init__(5.0)

    def priority(self, trial: Trial, now: float) -> float:
        return -trial.step


class WithoutPatience(EarlyStopper):
    """Needs an argument that the simulator does not give."""

    def __init__(self, patience: int) -> None:
        self.patience = patience

    def should_stop(self, trial: Trial) -> bool:
        return False


@pytest.mark.parametrize(("options", "told"), [
    (["--policy", f"{__name__}:WithoutPriority"],
     "--policy {module}:WithoutPriority: Can't instantiate abstract class"),
    (["--policy", f"{__name__}:WithoutPeriod", "--period", "3"],
     "--policy {module}:WithoutPeriod: WithoutPeriod.__init__() got an unexpected keyword argument 'period'"),
    (["--policy", "fifo", "--stopper", f"{__name__}:WithoutPatience"],
     "--stopper {module}:WithoutPatience: WithoutPatience.__init__() missing 1 required positional argument"),
    (["--compare", f"fifo,{__name__}:WithoutPriority"],
     "--compare 'fifo,{module}:WithoutPriority': Can't instantiate abstract class"),
    (["--compare", f"fifo,{__name__}:WithoutPeriod", "--period", "3"],
     "--compare 'fifo,{module}:WithoutPeriod': WithoutPeriod.__init__() got an unexpected keyword argument 'period'"),
], ids=["abstract", "no-period", "stopper-argument", "compare-abstract", "compare-no-period"])
def test_cli_simulate_refuses_a_class_it_cannot_build(
    options: list[str], told: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy or stopper that loads but cannot be built was a traceback in the middle of the simulation; it is
    refused before it starts, with the reason, as `hermes run` refuses it."""
    assert main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--seeds", "1", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hermes: error: " + told.format(module=__name__)) and "Traceback" not in err, err


def test_cli_simulate_builds_a_policy_as_the_simulation_will() -> None:
    """Without --period no period is given: the check must not refuse what the simulation can build."""
    assert main(["simulate", "--trace", DIGITS, "--mode", "max", "--gpus", "2", "--policy", f"{__name__}:WithoutPeriod",
                 "--json"]) == 0
