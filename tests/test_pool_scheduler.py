"""The pool scheduler: many experiments on one GPU pool, fair share by weights, and its simulation.

Pure tests of the core (events in, decisions out) and simulations with the real simulated executor.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from hermes.core.decisions import Resume, Start, Stop, Suspend
from hermes.core.events import (
    ExperimentCancelled,
    GpuReclaimed,
    NodeAdded,
    NodeRemoved,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import PluginError, Verdict
from hermes.core.pool import PoolScheduler, qualify, split
from hermes.core.scheduler import Scheduler
from hermes.core.share import nested_shares, water_fill
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.errors import HermesError
from hermes.policies import make_policy
from hermes.policies.rr import RoundRobinPolicy
from hermes.sim.pool import PoolExperiment, simulate_pool
from hermes.sim.simulate import cluster_layout, simulate
from hermes.sim.synthetic import synthetic_trace


# ---------------------------------------------------------------------- shares
def test_water_fill_divides_by_weight_and_passes_on_what_a_capped_member_cannot_use() -> None:
    assert water_fill(4.0, {"a": 1.0, "b": 3.0}, {"a": 10, "b": 10}) == pytest.approx({"a": 1.0, "b": 3.0})
    assert water_fill(4.0, {"a": 1.0, "b": 3.0}, {"a": 10, "b": 2}) == pytest.approx({"a": 2.0, "b": 2.0})
    assert water_fill(4.0, {"a": 1.0, "b": 1.0}, {"a": 1, "b": 1}) == pytest.approx({"a": 1.0, "b": 1.0})
    assert water_fill(4.0, {"a": 1.0, "b": 1.0}, {"a": 0, "b": 9}) == pytest.approx({"a": 0.0, "b": 4.0})
    # only the ratios count: weights whose sum overflows (a store written before weights were bounded) split alike
    assert water_fill(2.0, {"a": 1e308, "b": 1e308}, {"a": 9, "b": 9}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_nested_shares_split_the_pool_by_owner_then_by_experiment() -> None:
    owners = {"a1": "ann", "a2": "ann", "b1": "bob"}
    demands = {"a1": 50.0, "a2": 50.0, "b1": 50.0}
    even = nested_shares(8.0, owners, {"a1": 1.0, "a2": 3.0, "b1": 1.0}, demands, {})
    assert even == pytest.approx({"a1": 1.0, "a2": 3.0, "b1": 4.0})
    heavier_bob = nested_shares(8.0, owners, {"a1": 1.0, "a2": 1.0, "b1": 1.0}, demands, {"bob": 3.0})
    assert heavier_bob == pytest.approx({"a1": 1.0, "a2": 1.0, "b1": 6.0})


def test_qualified_ids_name_the_experiment() -> None:
    assert split(qualify("e3", "007")) == ("e3", "007")
    assert split("e3.a.b") == ("e3", "a.b")
    with pytest.raises(HermesError, match="names no experiment"):
        split("007")


# ---------------------------------------------------------------------- the core, event by event
def experiment(trials: int) -> tuple[Scheduler, list[TrialSubmitted]]:
    return Scheduler(make_policy("rr", period=10.0)), [TrialSubmitted(0.0, f"t{i}", 100) for i in range(trials)]


def test_a_newcomer_gets_its_share_by_preemption_and_events_carry_the_experiment() -> None:
    pool = PoolScheduler()
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1", "g2", "g3")))
    first, submissions = experiment(6)
    pool.add_experiment("a", first, at=0.0)
    started = []
    for submission in submissions:
        started += pool.tell("a", submission)
    assert sorted((d.trial_id, d.gpu) for d in started) == [(f"a.t{i}", f"g{i}") for i in range(4)]
    assert all(isinstance(d, Start) for d in started)
    # Each experiment's scheduler saw its grants as its own cluster events, and its own trial ids.
    assert [type(r.event).__name__ for r in pool.routed] == ["TrialSubmitted"]
    assert pool.routed[0].experiment == "a" and pool.routed[0].event.trial_id == "t5"

    second, submissions = experiment(3)
    decisions = pool.add_experiment("b", second, at=1.0)  # weights 1:1: b is owed two GPUs now
    assert decisions == []  # it has no trials yet
    decisions, routed = [], []
    for submission in submissions:
        decisions += pool.tell("b", submission)
        routed += pool.routed
    suspended = [d for d in decisions if isinstance(d, Suspend)]
    assert len(suspended) == 2 and all(d.trial_id.startswith("a.") for d in suspended)
    # a's log says why: the pool reclaimed two of its GPUs, preempting the trials its policy ranks lowest.
    reclaims = [r for r in routed if isinstance(r.event, GpuReclaimed)]
    assert [(r.experiment, r.event.preempt) for r in reclaims] == [("a", True), ("a", True)]
    assert [r.decisions for r in reclaims] == [[Suspend(d.trial_id.split(".")[1])] for d in suspended]

    # a's preempted trials release their GPUs, which go to b, not back to a.
    gpus = {f"a.t{i}": f"g{i}" for i in range(4)}
    granted = []
    for decision in suspended:
        granted += pool.handle(TrialSuspended(2.0, decision.trial_id, 0))
    assert sorted(d.trial_id for d in granted) == ["b.t0", "b.t1"]
    assert sorted(d.gpu for d in granted) == sorted(gpus[d.trial_id] for d in suspended)
    assert {len(t.gpus) for t in pool.tenants.values()} == {2}


def test_a_freed_gpu_goes_to_the_experiment_most_owed() -> None:
    """Shares 4/3 and 2/3 GPU: nobody is below a whole GPU, so nothing is preempted (quantum is
    huge), but when a's trial yields its turn, its GPU goes to b, which is owed GPU time."""
    pool = PoolScheduler(quantum=1e9)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    first, submissions = experiment(3)
    pool.add_experiment("a", first, at=0.0, weight=2.0)
    for submission in submissions:
        pool.tell("a", submission)
    second, submissions = experiment(2)
    pool.add_experiment("b", second, at=0.0, weight=1.0)
    assert [d for s in submissions for d in pool.tell("b", s)] == []
    assert pool.handle(TrialReported(11.0, "a.t0", 1, 0.5)) == [Suspend("a.t0")]  # rr: its turn is over, t2 waits
    decisions = pool.handle(TrialSuspended(11.5, "a.t0", 1))
    assert decisions == [Start("b.t0", "g0")]
    assert [(r.experiment, type(r.event).__name__) for r in pool.routed] == [
        ("a", "GpuReclaimed"), ("a", "TrialSuspended"), ("b", "NodeAdded")
    ]
    assert pool.tenants["a"].gpus == {"g1"} and pool.tenants["b"].gpus == {"g0"}


def settle(pool: PoolScheduler, decisions: list, at: float) -> list:
    """Answer every Suspend with its TrialSuspended, as an executor would; return all decisions made."""
    made = list(decisions)
    pending = [d for d in decisions if isinstance(d, Suspend)]
    while pending:
        assert len(made) < 1000, "the pool keeps preempting"
        more = pool.handle(TrialSuspended(at, pending.pop(0).trial_id, 0))
        made += more
        pending += [d for d in more if isinstance(d, Suspend)]
    return made


def held(pool: PoolScheduler) -> dict[str, int]:
    return {key: len(tenant.gpus) for key, tenant in pool.tenants.items()}


def two_experiments(owners: tuple[str, str]) -> PoolScheduler:
    """Experiments a and b of six trials each on four GPUs, two GPUs each."""
    pool = PoolScheduler()
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1", "g2", "g3")))
    for key, owner in zip(("a", "b"), owners):
        scheduler, submissions = experiment(6)
        pool.add_experiment(key, scheduler, at=0.0, owner=owner)
        settle(pool, [d for submission in submissions for d in pool.tell(key, submission)], 0.5)
    assert held(pool) == {"a": 2, "b": 2}
    return pool


def test_a_weight_change_moves_gpus_at_once() -> None:
    pool = two_experiments(("ann", "ann"))
    made = settle(pool, pool.set_weight("b", 3.0, at=1.0), 1.5)  # b is owed three GPUs: one of a's trials yields
    assert [type(d).__name__ for d in made] == ["Suspend", "Start"]
    assert made[0].trial_id.startswith("a.") and made[1].trial_id.startswith("b.")
    assert held(pool) == {"a": 1, "b": 3}


def test_owners_share_first_then_their_experiments() -> None:
    pool = two_experiments(("ann", "bob"))
    assert settle(pool, pool.set_weight("b", 3.0, at=1.0), 1.5) == []  # b is bob's only experiment: no change
    made = settle(pool, pool.set_owner_weight("ann", 3.0, at=2.0), 2.5)  # ann is owed 3 of the 4 GPUs
    assert held(pool) == {"a": 3, "b": 1}
    assert [d.trial_id[:2] for d in made if isinstance(d, Suspend)] == ["b."]


@pytest.mark.parametrize("carried", [False, True])
def test_accounts_carried_from_an_earlier_pool_decide_who_is_owed(carried: bool) -> None:
    """1.5 GPUs each on 3: when a's trial yields its turn, its GPU goes to b, which is owed GPU
    time, unless b comes from an earlier pool where it had used 500 GPU seconds more than its share."""
    pool = PoolScheduler(quantum=1e9)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1", "g2")))
    for key, used, owed in (("a", 0.0, 0.0), ("b", 1500.0 if carried else 0.0, 1000.0 if carried else 0.0)):
        scheduler, submissions = experiment(4)
        pool.add_experiment(key, scheduler, at=0.0, used=used, owed=owed)
        settle(pool, [d for submission in submissions for d in pool.tell(key, submission)], 0.0)
    assert held(pool) == {"a": 2, "b": 1}  # b took its whole GPU from a at once
    assert pool.handle(TrialReported(11.0, "a.t0", 1, 0.5)) == [Suspend("a.t0")]  # rr: its turn is over
    freed = pool.handle(TrialSuspended(11.5, "a.t0", 1))
    assert len(freed) == 1 and freed[0].gpu == "g0"
    assert freed[0].trial_id.startswith("a." if carried else "b.")


def test_an_experiment_that_ends_returns_its_gpus() -> None:
    pool = PoolScheduler()
    pool.handle(NodeAdded(0.0, "n0", ("g0",)))
    scheduler = Scheduler(make_policy("fifo"))
    pool.add_experiment("a", scheduler, at=0.0)
    assert [type(d).__name__ for d in pool.tell("a", TrialSubmitted(0.0, "t0", 1))] == ["Start"]
    pool.tell("a", SubmissionsClosed(0.0))
    pool.handle(TrialReported(1.0, "a.t0", 1, 0.5))
    pool.handle(TrialExited(1.0, "a.t0", True))
    assert pool.tenants == {} and pool.finished_experiments == ["a"] and pool.holder == {"g0": None}


def test_weights_and_keys_are_checked() -> None:
    pool = PoolScheduler()
    for weight in (0.0, 1e-7, 1e7, float("inf"), float("nan")):
        with pytest.raises(HermesError, match="a weight must be a number from 1e-06 to 1e\\+06"):
            pool.add_experiment("a", Scheduler(make_policy("rr")), at=0.0, weight=weight)
    with pytest.raises(HermesError, match="free of"):
        pool.add_experiment("a.b", Scheduler(make_policy("rr")), at=0.0)


# ---------------------------------------------------------------------- simulations
@pytest.mark.parametrize("policy", ["hermes", "rr", "fifo"])
@pytest.mark.parametrize("weights", [(1.0, 3.0), (1.0, 2.0)])
def test_gpu_time_follows_the_weights(policy: str, weights: tuple[float, float]) -> None:
    """4 GPUs do not split 1:2 evenly: the deficits carry the fractions, so GPU time still follows."""
    result = simulate_pool(
        [
            PoolExperiment("a", synthetic_trace(60, 20, seed=1), policy, weights[0]),
            PoolExperiment("b", synthetic_trace(60, 20, seed=2, mode="min"), policy, weights[1]),
        ],
        gpus=4,
    )
    assert result.contested_s > 0.5 * result.makespan_s  # most of the run was contested
    shares = result.contested_shares()
    assert shares["a"] == pytest.approx(weights[0] / sum(weights), abs=0.02)
    assert shares["b"] == pytest.approx(weights[1] / sum(weights), abs=0.02)
    assert set(result.finished_at) == {"a", "b"}


def test_gpu_time_follows_the_weights_across_nodes() -> None:
    result = simulate_pool(
        [
            PoolExperiment("a", synthetic_trace(50, 15, seed=4), "hermes", 1.0),
            PoolExperiment("b", synthetic_trace(50, 15, seed=5), "hermes", 2.0),
        ],
        gpus=6,
        nodes=3,
    )
    assert result.contested_shares() == pytest.approx({"a": 1 / 3, "b": 2 / 3}, abs=0.02)


def test_gpu_time_follows_owner_weights() -> None:
    result = simulate_pool(
        [
            PoolExperiment("ann1", synthetic_trace(40, 15, seed=1), "rr", owner="ann"),
            PoolExperiment("ann2", synthetic_trace(40, 15, seed=2), "rr", owner="ann"),
            PoolExperiment("bob", synthetic_trace(40, 15, seed=3), "rr", owner="bob"),
        ],
        gpus=4,
    )
    shares = result.contested_shares()
    assert shares == pytest.approx({"ann1": 0.25, "ann2": 0.25, "bob": 0.5}, abs=0.02)


@pytest.mark.parametrize("policy", ["hermes", "rr", "fifo", "slaq"])
def test_a_lone_experiment_gets_the_whole_pool_and_decides_as_a_plain_scheduler(policy: str) -> None:
    trace = synthetic_trace(30, 10, seed=1)
    alone = simulate_pool([PoolExperiment("a", trace, policy, seed=3)], gpus=4, record=True)
    assert alone.contested_gpu_seconds["a"] == pytest.approx(4 * alone.contested_s)
    plain = simulate(trace, make_policy(policy), gpus=4, seed=3, record=True)
    assert [(at, verb, split(trial)[1], gpu) for at, verb, trial, gpu in alone.decisions] == plain.decisions
    assert alone.makespan_s == plain.makespan_s


def test_resumes_in_a_pool_never_double_book_a_gpu() -> None:
    """Every Start or Resume lands on a GPU nobody else holds (the executor would refuse it)."""
    result = simulate_pool(
        [
            PoolExperiment("a", synthetic_trace(30, 10, seed=1), "hermes", 1.0),
            PoolExperiment("b", synthetic_trace(30, 10, seed=2), "rr", 2.0),
            PoolExperiment("c", synthetic_trace(30, 10, seed=3), "fifo", 1.0),
        ],
        gpus=3,
        record=True,
    )
    assert set(result.finished_at) == {"a", "b", "c"}
    assert any(verb == "Suspend" for _, verb, _, _ in result.decisions)
    assert {verb for _, verb, _, _ in result.decisions} >= {Start.__name__, Resume.__name__, Suspend.__name__}


def test_a_node_that_dies_and_one_that_joins_mid_run_lose_no_experiment_and_no_trial() -> None:
    """A pool on a cluster whose nodes change (a Ray cluster's): a node that both experiments used dies, another joins
    later. Its trials resume elsewhere, no GPU of the dead node is used again, the new one's are, and every trial of
    both experiments completes."""
    layout = cluster_layout(6, 3)
    dead, gpus = next(iter(layout.items()))
    result = simulate_pool(
        [
            PoolExperiment("a", synthetic_trace(30, 12, seed=6), "hermes", 1.0),
            PoolExperiment("b", synthetic_trace(30, 12, seed=7), "rr", 1.0),
        ],
        gpus=6,
        nodes=3,
        record=True,
        changes=[NodeRemoved(1_000.0, dead), NodeAdded(2_000.0, "late", ("late/gpu0", "late/gpu1"))],
    )
    assert result.states == {"a": Counter({TrialState.COMPLETED: 30}), "b": Counter({TrialState.COMPLETED: 30})}
    runs = [(at, split(trial)[0], gpu) for at, verb, trial, gpu in result.decisions
            if verb in (Start.__name__, Resume.__name__)]
    assert {experiment for at, experiment, gpu in runs if gpu in gpus and at < 1_000.0} == {"a", "b"}
    assert not any(gpu in gpus for at, _, gpu in runs if at >= 1_000.0)
    assert any(gpu.startswith("late/") for _, _, gpu in runs)


# ---------------------------------------------------------------------- trials that cannot move, idle demand, quanta
def test_the_pool_takes_no_gpu_from_a_trial_that_cannot_move_and_every_such_trial_completes() -> None:
    """a runs two unmodified programs (not movable: each is SIGSTOPped in place and can continue only on its own
    GPU). b joins, owed one of the two GPUs: the pool preempts neither of a's trials; b gets a GPU once one ends,
    and a's other trial runs to its budget instead of being stopped with its experiment."""
    pool = PoolScheduler()
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    pool.add_experiment("a", Scheduler(make_policy("fifo")), at=0.0)
    made = [d for i in range(2) for d in pool.tell("a", TrialSubmitted(0.0, f"t{i}", 3, movable=False))]
    made += pool.tell("a", SubmissionsClosed(0.0))
    pool.add_experiment("b", Scheduler(make_policy("fifo")), at=0.0)
    made += [d for i in range(2) for d in pool.tell("b", TrialSubmitted(1.0, f"t{i}", 3))]
    for step in (1, 2, 3):
        made += pool.handle(TrialReported(1.0 + step, "a.t0", step, 0.5))
    made += pool.handle(TrialExited(4.5, "a.t0", True))
    assert [(type(d).__name__, d.trial_id) for d in made] == [("Start", "a.t0"), ("Start", "a.t1"), ("Start", "b.t0")]
    for step in (1, 2, 3):
        assert pool.handle(TrialReported(5.0 + step, "a.t1", step, 0.5)) == []
    pool.handle(TrialExited(8.5, "a.t1", True))
    assert pool.finished_experiments == ["a"]
    assert [t.state for t in pool.tenants["b"].scheduler.trials.values()] == [TrialState.RUNNING] * 2


def test_a_trial_that_cannot_move_keeps_its_gpu_when_its_own_policy_suspends_it() -> None:
    """Under rr a's three unmodified programs take turns on two GPUs, each parked on its own GPU between turns:
    the GPUs they are tied to stay a's, however much b is owed."""
    pool = PoolScheduler(quantum=1.0)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    scheduler = Scheduler(make_policy("rr", period=1.0))
    pool.add_experiment("a", scheduler, at=0.0)
    made = [d for i in range(3) for d in pool.tell("a", TrialSubmitted(0.0, f"t{i}", 100, movable=False))]
    pool.add_experiment("b", Scheduler(make_policy("fifo")), at=0.0)
    made += pool.tell("b", TrialSubmitted(0.0, "t0", 100))
    steps: Counter[str] = Counter()
    for tick in range(1, 13):  # every trial reports at each tick; rr turns them over every period
        for trial in [t for t in scheduler.trials.values() if t.state is TrialState.RUNNING]:
            steps[trial.trial_id] += 1
            made += settle(pool, pool.handle(TrialReported(float(tick), f"a.{trial.trial_id}", steps[trial.trial_id],
                                                           0.5)), float(tick))
    assert any(isinstance(d, Suspend) for d in made) and all(d.trial_id.startswith("a.") for d in made)
    assert held(pool) == {"a": 2, "b": 0}
    assert {t.state for t in scheduler.trials.values()} <= {TrialState.RUNNING, TrialState.SUSPENDED}


def test_a_trial_that_cannot_move_keeps_its_gpu_while_its_policy_holds_it_back() -> None:
    """Under asha, a's two unmodified programs pause at their first rung, each stopped on its own GPU with priority
    None until the rung is full: a runs nothing there meanwhile, yet keeps both GPUs, so that the better one, promoted
    once both paused, trains on to its budget (only the other is stopped, by asha)."""
    pool = PoolScheduler(quantum=1.0)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    asha = Scheduler(make_policy("asha"))
    pool.add_experiment("a", asha, at=0.0)
    for i in range(2):
        pool.tell("a", TrialSubmitted(0.0, f"t{i}", 3, movable=False))
    pool.tell("a", SubmissionsClosed(0.0))
    pool.add_experiment("b", Scheduler(make_policy("fifo")), at=0.0)
    pool.tell("b", TrialSubmitted(0.0, "t0", 1000))
    made = settle(pool, pool.handle(TrialReported(1.0, "a.t0", 1, 0.9)), 1.0)
    assert held(pool) == {"a": 2, "b": 0}
    made += settle(pool, pool.handle(TrialReported(2.0, "a.t1", 1, 0.1)), 2.0)
    assert Resume("a.t0", "g0", False) in made
    for step in (2, 3):
        made += pool.handle(TrialReported(2.0 + step, "a.t0", step, 0.9))
    made += pool.handle(TrialExited(5.5, "a.t0", True))
    assert pool.finished_experiments == ["a"]
    assert [t.state for t in asha.trials.values()] == [TrialState.COMPLETED, TrialState.STOPPED]


def asha_that_waits(pool: PoolScheduler) -> Scheduler:
    """Experiment a (asha, submissions open) whose two trials diverged at their first rung: paused, with priority
    None, they can run on no GPU. Experiment b (fifo, three trials) holds both GPUs."""
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    pool.add_experiment("b", Scheduler(make_policy("fifo")), at=0.0)
    for i in range(3):
        pool.tell("b", TrialSubmitted(0.0, f"t{i}", 1000))
    asha = Scheduler(make_policy("asha"))
    pool.add_experiment("a", asha, at=0.0)
    made = []
    for i in range(2):
        made += settle(pool, pool.tell("a", TrialSubmitted(0.0, f"t{i}", 9)), 0.0)
        running = next(d.trial_id for d in made if isinstance(d, (Start, Resume)) and d.trial_id == f"a.t{i}")
        made += settle(pool, pool.handle(TrialReported(0.5, running, 1, float("nan"))), 0.5)
    assert [t.state for t in asha.trials.values()] == [TrialState.SUSPENDED] * 2
    assert all(asha.policy.priority(t, 1.0) is None for t in asha.trials.values())
    return asha


def test_the_pool_preempts_no_one_for_an_experiment_that_could_not_run_anything_on_the_gpu() -> None:
    """a is owed a GPU but can use none: preempting b's trial would only hand its GPU straight back to b."""
    pool = PoolScheduler(quantum=1.0)
    asha_that_waits(pool)
    made = []
    for step in range(1, 101):
        for trial_id in ("b.t0", "b.t1"):
            made += settle(pool, pool.handle(TrialReported(1.0 + step, trial_id, step, 0.5)), 1.0 + step)
    assert made == [] and held(pool) == {"b": 2, "a": 0}


def test_an_owed_experiment_with_a_trial_to_run_still_gets_its_gpu_by_preemption() -> None:
    pool = PoolScheduler(quantum=1.0)
    asha_that_waits(pool)
    made = settle(pool, pool.tell("a", TrialSubmitted(2.0, "t2", 9)), 2.0)
    assert [(type(d).__name__, d.trial_id[:2]) for d in made] == [("Suspend", "b."), ("Start", "a.")]
    assert held(pool) == {"b": 1, "a": 1}


def test_an_experiment_owed_a_quantum_gets_a_gpu_however_many_others_are_above_their_share() -> None:
    """Five one-trial experiments on four GPUs, quantum 5 GPU seconds: each is owed 0.8 GPU, and the fifth, holding
    none, is owed a quantum after 6.25 s. The four others are each only 1.25 GPU seconds above their share then,
    yet one of them yields its GPU at once (docs/pool.md: the fractions are settled within a quantum)."""
    pool = PoolScheduler(quantum=5.0)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1", "g2", "g3")))
    for i in range(5):
        pool.add_experiment(f"z{i}", Scheduler(make_policy("fifo")), at=0.0)
        pool.tell(f"z{i}", TrialSubmitted(0.0, "t0", 1000))
    assert held(pool) == {"z0": 1, "z1": 1, "z2": 1, "z3": 1, "z4": 0}
    made, at = [], 0.0
    while not made and at < 60:  # a report from each trial every half second, until the pool preempts one
        at += 0.5
        for key, tenant in pool.tenants.items():
            trial = tenant.scheduler.trials["t0"]
            if trial.state is TrialState.RUNNING:
                made += pool.handle(TrialReported(at, qualify(key, "t0"), trial.step + 1, 0.5))
    assert at == 6.5 and [type(d).__name__ for d in made] == ["Suspend"]
    settle(pool, made, at)
    assert held(pool)["z4"] == 1


# ---------------------------------------------------------------------- plug-ins that fail
class Armed(RoundRobinPolicy):
    """Round robin until armed; then its priority raises, or answers ``answer``."""

    def __init__(self, answer: Any = None) -> None:
        super().__init__(period=10.0)
        self.answer = answer
        self.armed = False

    def priority(self, trial: Trial, now: float) -> Any:
        if not self.armed:
            return super().priority(trial, now)
        if self.answer is None:
            raise RuntimeError("boom")
        return self.answer


@pytest.mark.parametrize("answer", [None, math.nan, "high"], ids=["raises", "nan", "str"])
def test_a_policy_that_fails_when_the_pool_picks_whom_to_preempt_fails_its_experiment_not_the_pool(
    answer: Any,
) -> None:
    """The pool asked the policy of the experiment above its share which running trial ranks lowest unchecked: a
    RuntimeError came out of the pool's own frames, naming no plug-in; NaN and "high" were ranked as numbers. Now the
    call goes on, and ``failed`` names the experiment with its policy's PluginError, for the host to retire it."""
    pool = PoolScheduler(quantum=1.0)
    pool.handle(NodeAdded(0.0, "n0", ("g0", "g1")))
    policy = Armed(answer)
    pool.add_experiment("a", Scheduler(policy), at=0.0)
    assert len([d for i in range(2) for d in pool.tell("a", TrialSubmitted(0.0, f"t{i}", 100))]) == 2  # both run
    second, submissions = experiment(1)
    pool.add_experiment("b", second, at=1.0)
    policy.armed = True
    assert pool.tell("b", submissions[0]) == []  # nothing preempted for b: a's ranking is not known
    assert [(r.experiment, type(r.event).__name__) for r in pool.routed] == [("b", "TrialSubmitted")]
    assert list(pool.failed) == ["a"]
    assert isinstance(pool.failed["a"], PluginError)
    assert str(pool.failed["a"]).startswith(f"policy {__name__}:Armed: priority() ")


def test_another_experiments_failing_policy_loses_no_event_of_this_one_and_the_host_retires_it() -> None:
    """A trial of a ended while the pool asked u's policy whether u wants the GPU it frees: the policy's error left
    the call before a's core had the exit, so that trial held its GPU for ever. Now a's exit is handled, u is named
    failed and gets no GPU; retired as a host does (its core cancelled, asking its plug-ins nothing more), it ends."""
    pool = PoolScheduler(quantum=1e9)
    pool.handle(NodeAdded(0.0, "n0", ("g0",)))
    healthy = Scheduler(make_policy("rr", period=10.0))
    pool.add_experiment("a", healthy, at=0.0)
    assert pool.tell("a", TrialSubmitted(0.0, "t0", 1)) == [Start("a.t0", "g0")]
    pool.tell("a", SubmissionsClosed(0.0))
    policy = Armed()
    failing = Scheduler(policy)
    pool.add_experiment("u", failing, at=0.0)
    assert pool.tell("u", TrialSubmitted(0.0, "t0", 5)) == []  # it waits for the GPU a holds
    policy.armed = True
    assert pool.handle(TrialReported(1.0, "a.t0", 1, 0.5)) == []
    assert pool.handle(TrialExited(2.0, "a.t0", succeeded=True)) == []  # the GPU goes to no one meanwhile
    assert healthy.finished and healthy.trials["t0"].state is TrialState.COMPLETED
    assert list(pool.failed) == ["u"] and "priority() raised RuntimeError: boom (trial t0)" in str(pool.failed["u"])

    failing.restore_policy(make_policy("fifo"), {})  # as hermes.pool retires it
    pool.tell("u", ExperimentCancelled(2.0, "PluginError"))
    assert failing.finished and failing.trials["t0"].state is TrialState.STOPPED
    assert pool.tenants == {} and pool.failed == {} and pool.holder == {"g0": None}



class HoldsBack(RoundRobinPolicy):
    """Round robin that pauses the trials in ``holding`` at their reports and holds them back (priority None), and
    raises for those in ``broken``: a policy that fails for some trials only."""

    order_version = None  # its answers change with its sets

    def __init__(self) -> None:
        super().__init__(period=10.0)
        self.holding: set[str] = set()
        self.broken: set[str] = set()

    def priority(self, trial: Trial, now: float) -> float | None:
        if trial.trial_id in self.broken:
            raise RuntimeError("boom")
        return None if trial.trial_id in self.holding else super().priority(trial, now)

    def observe(self, trial: Trial, now: float) -> Verdict:
        return Verdict.PAUSE if trial.trial_id in self.holding else Verdict.CONTINUE


def carry_out(pool: PoolScheduler, decisions: list, running: set[str], at: float) -> None:
    """Play the executor: run what is started or resumed; answer a Stop of a trial it runs with its exit. A Stop of a
    trial it never started gets no answer, as from the real executors."""
    for decision in decisions:
        if isinstance(decision, (Start, Resume)):
            running.add(decision.trial_id)
        elif isinstance(decision, Stop) and decision.trial_id in running:
            running.discard(decision.trial_id)
            carry_out(pool, pool.handle(TrialExited(at, decision.trial_id, succeeded=False)), running, at)


def test_an_experiment_whose_policy_fails_after_its_core_started_a_trial_in_that_event_ends_freeing_its_gpus() -> None:
    """Submissions close while every trial of a waits, two of them parked on their own GPUs (they cannot move): its
    core fills each node, starting f on n0, and its policy raises on n1. The Start was lost with the error: the core
    believed f ran on g0, the executor never started it, the cancellation's Stop of f got no answer, and a kept g0
    for ever. Now the Start comes with the failure, logged with its event, and the retired experiment ends."""
    pool = PoolScheduler(quantum=1e9)
    pool.handle(NodeAdded(0.0, "n0", ("g0",)))
    pool.handle(NodeAdded(0.0, "n1", ("g1",)))
    policy = HoldsBack()
    scheduler = Scheduler(policy)
    pool.add_experiment("a", scheduler, at=0.0)
    policy.holding = {"f"}
    running: set[str] = set()
    made = [d for i in range(2) for d in pool.tell("a", TrialSubmitted(0.0, f"u{i}", 100, movable=False))]
    made += pool.tell("a", TrialSubmitted(0.0, "f", 100))
    assert made == [Start("a.u0", "g0"), Start("a.u1", "g1")]
    carry_out(pool, made, running, 0.0)
    policy.holding |= {"u0", "u1"}  # each pauses at its first report, parked on its GPU, which a keeps
    for trial_id in ("a.u0", "a.u1"):
        assert pool.handle(TrialReported(1.0, trial_id, 1, 0.5)) == [Suspend(trial_id)]
        running.discard(trial_id)
        assert pool.handle(TrialSuspended(1.5, trial_id, 1)) == []
    assert held(pool) == {"a": 2} and scheduler.busy == 0 and scheduler.trials["f"].node == "n0"

    policy.holding, policy.broken = {"u0"}, {"u1"}
    made = pool.tell("a", SubmissionsClosed(2.0))
    assert list(pool.failed) == ["a"] and "priority() raised RuntimeError: boom (trial u1)" in str(pool.failed["a"])
    assert made == [Start("a.f", "g0")]
    assert [(r.experiment, r.event, r.decisions) for r in pool.routed] == [
        ("a", SubmissionsClosed(2.0), [Start("f", "g0")])]  # what the host logs
    assert scheduler.busy == 1
    carry_out(pool, made, running, 2.0)

    scheduler.restore_policy(make_policy("fifo"), {})  # retired as hermes.pool retires it
    stops = pool.tell("a", ExperimentCancelled(2.0, "PluginError"))
    assert sorted(d.trial_id for d in stops) == ["a.f", "a.u0", "a.u1"] and all(isinstance(d, Stop) for d in stops)
    carry_out(pool, stops, running, 2.5)
    assert scheduler.finished and pool.finished_experiments == ["a"]
    assert [t.state for t in scheduler.trials.values()] == [TrialState.STOPPED] * 3
    assert pool.tenants == {} and pool.holder == {"g0": None, "g1": None}
