"""The scheduling core in small hand-made situations: explicit events in, exact decisions out.

Every test drives ``Scheduler.handle`` directly with explicit times, with the real policies
(fifo, rr) and, where a verdict is needed, a tiny policy or stopper written against the
public plug-in interface.
"""

from __future__ import annotations

import pytest

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    GpuAdded,
    GpuReclaimed,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    SubmissionsClosed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.errors import HermesError, IllegalTransition
from hermes.core.policy import EarlyStopper, SchedulingPolicy, Verdict
from hermes.policies.fifo import FifoPolicy
from hermes.policies.rr import RoundRobinPolicy

PERIOD = 10.0


class Core:
    """A scheduler plus a few shortcuts, so each test reads as a sequence of events."""

    def __init__(self, policy: SchedulingPolicy, stopper: EarlyStopper | None = None, **kwargs: object) -> None:
        self.scheduler = Scheduler(policy, stopper=stopper, **kwargs)

    def __call__(self, event: Event) -> list[Decision]:
        return self.scheduler.handle(event)

    def node(self, at: float, name: str, *gpus: str) -> list[Decision]:
        return self(NodeAdded(at, name, gpus))

    def submit(self, at: float, trial_id: str, budget: int = 10, **kwargs: object) -> list[Decision]:
        return self(TrialSubmitted(at, trial_id, budget, **kwargs))

    def report(self, at: float, trial_id: str, step: int, value: float = 0.5, **kwargs: object) -> list[Decision]:
        return self(TrialReported(at, trial_id, step, value, **kwargs))

    def suspended(self, at: float, trial_id: str, step: int) -> list[Decision]:
        return self(TrialSuspended(at, trial_id, step))

    def exited(
        self, at: float, trial_id: str, succeeded: bool = True, error: str | None = None, crashed: bool = False
    ) -> list[Decision]:
        return self(TrialExited(at, trial_id, succeeded, error, crashed))

    def trial(self, trial_id: str) -> Trial:
        return self.scheduler.trials[trial_id]

    def state(self, trial_id: str) -> TrialState:
        return self.trial(trial_id).state

    def states(self) -> dict[str, TrialState]:
        return {trial_id: trial.state for trial_id, trial in self.scheduler.trials.items()}


def fifo() -> Core:
    return Core(FifoPolicy())


def rr(period: float = PERIOD, **kwargs: object) -> Core:
    return Core(RoundRobinPolicy(period=period), **kwargs)


class StopBelow(EarlyStopper):
    """Stops every trial whose latest report is below ``threshold``."""

    name = "stop_below"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def should_stop(self, trial: Trial) -> bool:
        return trial.values[-1] < self.threshold


class VerdictPolicy(RoundRobinPolicy):
    """Round robin that answers each report with the verdict the test sets for that trial."""

    name = "verdict"

    def __init__(self, period: float = PERIOD) -> None:
        super().__init__(period)
        self.verdicts: dict[str, Verdict] = {}

    def observe(self, trial: Trial, now: float) -> Verdict:
        return self.verdicts.get(trial.trial_id, Verdict.CONTINUE)


class Benched(RoundRobinPolicy):
    """Round robin that refuses to run the trials named in ``benched`` (priority None)."""

    name = "benched"

    def __init__(self, benched: set[str], period: float = PERIOD) -> None:
        super().__init__(period)
        self.benched = benched

    def priority(self, trial: Trial, now: float) -> float | None:
        return None if trial.trial_id in self.benched else super().priority(trial, now)


class Ranked(RoundRobinPolicy):
    """Fixed priorities, and a fixed price in priority for resuming on another GPU than the one a trial left."""

    name = "ranked"

    def __init__(self, priorities: dict[str, float], penalty: float) -> None:
        super().__init__(PERIOD)
        self.priorities = priorities
        self.penalty = penalty

    def priority(self, trial: Trial, now: float) -> float:
        return self.priorities[trial.trial_id]

    def migration_penalty(self, trial: Trial, now: float) -> float:
        return self.penalty


# ---------------------------------------------------------------------------------------- fifo
def test_fifo_runs_in_arrival_order_one_per_gpu() -> None:
    core = fifo()
    assert core.node(0, "n0", "g0", "g1") == []
    assert core.submit(0, "a", budget=3) == [Start("a", "g0")]
    assert core.submit(1, "b", budget=3) == [Start("b", "g1")]
    assert core.submit(2, "c", budget=3) == []
    assert core.submit(3, "d", budget=3) == []
    assert core.states() == {
        "a": TrialState.RUNNING,
        "b": TrialState.RUNNING,
        "c": TrialState.PENDING,
        "d": TrialState.PENDING,
    }
    # The earlier arrival gets the first GPU that frees, whichever GPU that is.
    assert core.report(10, "b", 1) == []
    assert core.report(11, "b", 2) == []
    assert core.report(12, "b", 3) == []
    assert core.exited(12, "b") == [Start("c", "g1")]
    assert core.state("b") is TrialState.COMPLETED
    assert core.exited(13, "a", succeeded=False, error="boom") == [Start("d", "g0")]
    assert core.state("a") is TrialState.FAILED
    assert core.trial("a").error == "boom"


def test_fifo_never_preempts() -> None:
    core = fifo()
    core.node(0, "n0", "g0")
    assert core.submit(0, "a", budget=50) == [Start("a", "g0")]
    assert core.submit(0, "b", budget=50) == []
    for step in range(1, 20):
        at = 100.0 * step  # far beyond any period
        assert core.report(at, "a", step) == []
        assert core(PeriodElapsed(at + 1)) == []
    assert core.state("a") is TrialState.RUNNING
    assert core.state("b") is TrialState.PENDING


def test_fifo_starts_waiting_trials_one_after_another_until_finished() -> None:
    core = fifo()
    core.node(0, "n0", "g0")
    for name in "abc":
        core.submit(0, name, budget=1)
    assert core(SubmissionsClosed(0)) == []
    assert core.report(5, "a", 1) == []
    assert core.exited(5, "a") == [Start("b", "g0")]
    assert core.report(9, "b", 1) == []
    assert core.exited(9, "b") == [Start("c", "g0")]
    assert not core.scheduler.finished
    assert core.report(12, "c", 1) == []
    assert core.exited(12, "c") == []
    assert core.scheduler.finished
    assert set(core.states().values()) == {TrialState.COMPLETED}


# ---------------------------------------------------------------------------------------- rr
def rr_one_gpu_three_trials() -> Core:
    core = rr()
    core.node(0, "n0", "g0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == []
    assert core.submit(0, "c") == []
    return core


def test_rr_does_not_preempt_before_the_turn_is_over() -> None:
    core = rr_one_gpu_three_trials()
    assert core.report(5, "a", 1) == []
    assert core(PeriodElapsed(9.9)) == []
    assert core.state("a") is TrialState.RUNNING


def test_rr_time_shares_one_gpu_in_turns() -> None:
    core = rr_one_gpu_three_trials()
    assert core.report(5, "a", 1) == []
    # a's turn (10 s) is over: its next report suspends it for the longest waiting trial.
    assert core.report(12, "a", 2) == [Suspend("a")]
    assert core.state("a") is TrialState.SUSPENDING
    assert core.suspended(12.5, "a", 2) == [Start("b", "g0")]
    assert core.state("a") is TrialState.SUSPENDED
    assert core.report(20, "b", 1) == []  # 7.5 s into its turn
    assert core.report(30, "b", 2) == [Suspend("b")]
    assert core.suspended(30.5, "b", 2) == [Start("c", "g0")]
    assert core.report(45, "c", 1) == [Suspend("c")]
    # a has waited longest (since 12.5): it resumes where it left off, on the same GPU.
    assert core.suspended(45.5, "c", 1) == [Resume("a", "g0", migrated=False)]
    assert core.state("a") is TrialState.RUNNING
    assert core.trial("a").step == 2
    assert core.report(50, "a", 3) == []
    assert core.trial("a").steps == [1, 2, 3]
    assert core.trial("a").starts == 2
    assert core.trial("a").migrations == 0


def test_rr_period_elapsed_preempts_a_running_trial_whose_turn_is_over() -> None:
    core = rr_one_gpu_three_trials()
    assert core(PeriodElapsed(10)) == [Suspend("a")]
    assert core(PeriodElapsed(11)) == []  # already suspending: not asked twice
    assert core.suspended(11, "a", 0) == [Start("b", "g0")]


def test_rr_does_not_preempt_when_nobody_waits() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core.report(50, "a", 1) == []
    assert core(PeriodElapsed(60)) == []
    assert core.states() == {"a": TrialState.RUNNING, "b": TrialState.RUNNING}


def test_rr_claimed_challenger_is_not_used_twice_and_resume_elsewhere_is_migrated() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "g1")]
    assert core.submit(0, "c") == []
    assert core.report(12, "a", 1) == [Suspend("a")]  # claims c
    assert core.report(12, "b", 1) == []  # c is claimed by a: b keeps its GPU
    assert core(PeriodElapsed(12.2)) == []
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    assert core.report(24, "b", 2) == [Suspend("b")]  # now a waits
    # a last ran on g0; it resumes on g1, which is a migration.
    assert core.suspended(25, "b", 2) == [Resume("a", "g1", migrated=True)]
    assert core.trial("a").migrations == 1
    assert core.report(30, "a", 2) == []


@pytest.mark.parametrize("penalty", [0.0, 0.4, 1.0])
def test_a_free_gpu_goes_to_its_own_trial_within_the_price_of_a_migration(penalty: float) -> None:
    """x (priority 2) left g1, y (1.5) left g0; g0 frees. x migrates there unless the policy prices a migration at
    more than the 0.5 between them: then y resumes where its state is, and x waits for its own GPU."""
    core = Core(Ranked({"y": 1.5, "x": 2.0, "p": 10.0, "q": 9.0}, penalty))
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "y") == [Start("y", "g0")]
    assert core.submit(0, "x") == [Start("x", "g1")]
    core.submit(1, "p")
    core.submit(1, "q")
    assert core.report(12, "y", 1) == [Suspend("y")]
    assert core.suspended(12, "y", 1) == [Start("p", "g0")]
    assert core.report(12, "x", 1) == [Suspend("x")]
    assert core.suspended(12, "x", 1) == [Start("q", "g1")]
    if penalty > 0.5:
        assert core.exited(20, "p") == [Resume("y", "g0", migrated=False)]
        assert core.exited(21, "q") == [Resume("x", "g1", migrated=False)]
    else:
        assert core.exited(20, "p") == [Resume("x", "g0", migrated=True)]
        assert core.exited(21, "q") == [Resume("y", "g1", migrated=True)]


@pytest.mark.parametrize("penalty", [0.1, 0.5])
def test_a_trial_whose_challenger_would_migrate_for_less_than_its_price_gets_its_gpu_back(penalty: float) -> None:
    """t (1.0) holds g0; c (1.2) left g1, where u (5.0) runs. Priced at 0.5, a migration of c is worth less than the
    0.2 between them: g0, once t's turn is over, goes back to t, a fresh turn for a switch on one GPU (preempting t
    only for whom the GPU then goes to, no switch at all, did worse on the panel: docs/policy.md)."""
    core = Core(Ranked({"t": 1.0, "c": 1.2, "u": 5.0}, penalty))
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "t") == [Start("t", "g0")]
    assert core.submit(0, "c") == [Start("c", "g1")]
    core.submit(1, "u")
    assert core.report(12, "c", 1) == [Suspend("c")]
    assert core.suspended(12, "c", 1) == [Start("u", "g1")]
    assert core.report(12.5, "t", 1) == [Suspend("t")]
    if penalty > 0.2:
        assert core.suspended(13, "t", 1) == [Resume("t", "g0", migrated=False)]
        assert core.trial("c").waiting and core.trial("c").starts == 1
    else:
        assert core.suspended(13, "t", 1) == [Resume("c", "g0", migrated=True)]


def test_rr_ties_between_running_and_waiting_trial_go_to_the_earlier_arrival() -> None:
    # rr ranks a running trial as idle since now; b has been idle since 20.
    core = rr()
    core.node(0, "n0", "g0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(20, "b") == []
    assert core.report(20, "a", 1) == []  # a's turn is over, but a tie goes to a, the earlier arrival
    assert core.report(21, "a", 2) == [Suspend("a")]  # now b has waited longer


# ---------------------------------------------------------------------------------------- report validation
def test_report_from_pending_trial_raises() -> None:
    core = rr_one_gpu_three_trials()
    with pytest.raises(HermesError, match="reported while pending"):
        core.report(1, "b", 1)


def test_report_from_suspended_trial_raises() -> None:
    core = rr_one_gpu_three_trials()
    core.report(12, "a", 1)
    core.suspended(12.5, "a", 1)
    with pytest.raises(HermesError, match="reported while suspended"):
        core.report(13, "a", 2)


def test_report_from_finished_trial_raises() -> None:
    core = rr_one_gpu_three_trials()
    core.report(1, "a", 10)
    core.exited(1, "a")
    with pytest.raises(HermesError, match="reported while completed"):
        core.report(2, "a", 11)


def test_report_from_unknown_trial_raises() -> None:
    core = rr_one_gpu_three_trials()
    with pytest.raises(HermesError, match="unknown trial"):
        core.report(1, "nobody", 1)


@pytest.mark.parametrize("step", [0, 1, 2], ids=["zero", "stale", "duplicate"])
def test_stale_or_duplicate_step_raises(step: int) -> None:
    core = rr_one_gpu_three_trials()
    core.report(1, "a", 1)
    core.report(2, "a", 2)
    with pytest.raises(HermesError, match=f"reported step {step} after step 2"):
        core.report(3, "a", step)
    assert core.trial("a").steps == [1, 2]  # the bad report left no trace


def test_submission_errors() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    with pytest.raises(HermesError, match="submitted twice"):
        core.submit(1, "a")
    with pytest.raises(HermesError, match="budget"):
        core.submit(1, "b", budget=0)
    core(SubmissionsClosed(2))
    with pytest.raises(HermesError, match="after submissions were closed"):
        core.submit(3, "c")


def test_suspended_event_for_a_trial_not_suspending_raises() -> None:
    core = rr_one_gpu_three_trials()
    with pytest.raises(HermesError, match="suspended while running"):
        core.suspended(1, "a", 0)


def test_exit_of_a_trial_that_never_ran_is_illegal() -> None:
    core = rr_one_gpu_three_trials()
    with pytest.raises(IllegalTransition):
        core.exited(1, "b")


def test_invalid_settings_raise() -> None:
    with pytest.raises(HermesError):
        Scheduler(RoundRobinPolicy(), max_trials_per_gpu=0)
    with pytest.raises(HermesError):
        Objective("sideways")
    with pytest.raises(ValueError):
        RoundRobinPolicy(period=0)


# ---------------------------------------------------------------------------------------- budget, exit, stop
def test_budget_reaching_report_makes_no_decision_and_exit_frees_the_gpu() -> None:
    core = rr(period=1)
    core.node(0, "n0", "g0")
    assert core.submit(0, "a", budget=2) == [Start("a", "g0")]
    assert core.submit(0, "b", budget=2) == []
    # The turn is long over and b waits, but a has reached its budget: it exits by itself.
    assert core.report(5, "a", 2) == []
    assert core.state("a") is TrialState.RUNNING
    assert core(PeriodElapsed(5.05)) == []  # nor at a tick while it ends (its final evaluation, its last save)
    assert core.exited(5.1, "a") == [Start("b", "g0")]
    assert core.state("a") is TrialState.COMPLETED
    assert core.trial("a").gpu is None
    assert core.scheduler.cluster.nodes["n0"].occupant["g0"] is core.trial("b")
    assert "a" not in core.scheduler.cluster.nodes["n0"].members


def test_a_trial_that_reports_past_its_budget_is_stopped_there_and_completed() -> None:
    core = rr(period=1)
    core.node(0, "n0", "g0")
    core.submit(0, "a", budget=2)
    core.submit(0, "b", budget=2)
    assert core.report(0.5, "a", 2) == []
    assert core.report(0.6, "a", 3) == [Stop("a")]  # it ignores its budget: ended here, not when it likes
    assert core.exited(0.7, "a", succeeded=False, error="stopped") == [Start("b", "g0")]
    assert core.state("a") is TrialState.COMPLETED
    # one told to suspend, whose report past its budget comes first, is completed once its checkpoint lands
    assert core.submit(1, "c", budget=2) == []
    assert core.report(2, "b", 1) == [Suspend("b")]  # its turn is over
    assert core.report(2.1, "b", 5) == [Stop("b")]
    assert core.suspended(2.2, "b", 5) == [Start("c", "g0")]
    assert core.state("b") is TrialState.COMPLETED


def test_stopper_stops_a_running_trial_which_ends_stopped_on_exit() -> None:
    core = rr(stopper=StopBelow(0.3))
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core.report(1, "a", 1, value=0.9) == []
    assert core.report(2, "a", 2, value=0.1) == [Stop("a")]
    assert core.state("a") is TrialState.RUNNING  # still holds its GPU until its process ends
    assert core.report(2.5, "a", 3, value=0.05) == []  # no second Stop
    assert core(PeriodElapsed(3)) == []
    # A stopped process reports failure; the outcome is still "stopped".
    assert core.exited(3, "a", succeeded=False, error="stopped") == [Start("b", "g0")]
    assert core.state("a") is TrialState.STOPPED


def test_policy_stop_verdict_stops_the_trial() -> None:
    policy = VerdictPolicy()
    core = Core(policy)
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    policy.verdicts["a"] = Verdict.STOP
    assert core.report(1, "a", 1) == [Stop("a")]
    assert core.exited(1.5, "a", succeeded=True) == [Start("b", "g0")]
    assert core.state("a") is TrialState.STOPPED


def test_policy_pause_verdict_suspends_at_once() -> None:
    policy = VerdictPolicy()
    core = Core(policy)
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    policy.verdicts["a"] = Verdict.PAUSE
    assert core.report(1, "a", 1) == [Suspend("a")]  # turn not over, nobody waits: still paused
    policy.verdicts.clear()
    assert core.suspended(1.5, "a", 1) == [Resume("a", "g0", migrated=False)]


def test_no_suspend_after_stop() -> None:
    """A trial told to stop is never asked to suspend afterwards (the Stop is final)."""
    core = rr(stopper=StopBelow(0.3))
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core.report(12, "a", 1, value=0.1) == [Stop("a")]
    # a's turn is over and b waits, but a is already on its way out.
    assert core(PeriodElapsed(13)) == []
    assert core.exited(14, "a", succeeded=False) == [Start("b", "g0")]
    assert core.state("a") is TrialState.STOPPED


def test_a_stopped_trial_is_never_resumed() -> None:
    """Whether or not a stop verdict is acted on while the trial suspends, a Stop is final."""
    core = rr(stopper=StopBelow(0.3))
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    log: list[Decision] = []
    log += core.report(12, "a", 1, value=0.5)
    assert log == [Suspend("a")]
    log += core.report(12.2, "a", 2, value=0.1)  # bad enough to stop, but a is already suspending
    log += core.suspended(12.5, "a", 2)  # the checkpoint landed before any Stop was carried out
    assert Start("b", "g0") in log
    log += core.report(25, "b", 1)  # b's turn is over and a waits (unless it is stopped)
    if log[-1] == Suspend("b"):
        log += core.suspended(25.5, "b", 1)
    if Stop("a") in log:
        after = log[log.index(Stop("a")) + 1 :]
        assert all(d.trial_id != "a" for d in after), f"decisions about a after its Stop: {after}"
        assert core.state("a") is TrialState.STOPPED
    else:
        assert Resume("a", "g0", migrated=False) in log


def test_report_while_suspending_is_recorded_and_preempts_nothing_more() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    core.submit(0, "c")
    assert core.report(12, "a", 1) == [Suspend("a")]
    # The trial reaches one more step boundary before its checkpoint lands.
    assert core.report(12.2, "a", 2, checkpointed=True) == []
    assert core(PeriodElapsed(12.3)) == []
    assert core.trial("a").steps == [1, 2]
    assert core.suspended(12.5, "a", 2) == [Start("b", "g0")]
    assert core.state("a") is TrialState.SUSPENDED
    assert core.trial("a").checkpoint_step == 2


def test_stop_at_the_end_drops_a_suspended_trial_at_once() -> None:
    policy = Benched(set())
    core = Core(policy)
    core.node(0, "n0", "g0")
    core.submit(0, "a", budget=5)
    core.submit(0, "b", budget=1)
    assert core.report(12, "a", 1, checkpointed=True) == [Suspend("a")]
    assert core.suspended(12.5, "a", 1) == [Start("b", "g0")]
    policy.benched.add("a")
    assert core(SubmissionsClosed(13)) == []
    assert core.report(20, "b", 1) == []
    # Nothing holds a GPU and a may not run any more: it is stopped where it is, with no exit to wait for.
    assert core.exited(20, "b") == [Stop("a")]
    assert core.state("a") is TrialState.STOPPED
    assert core.scheduler.finished


# ---------------------------------------------------------------------------------------- nodes and GPUs
def test_trials_wait_unplaced_until_a_node_is_added() -> None:
    core = fifo()
    assert core.submit(0, "a") == []
    assert core.submit(0, "b") == []
    assert core.submit(0, "c") == []
    assert core.node(5, "n0", "g0", "g1") == [Start("a", "g0"), Start("b", "g1")]
    assert core.node(6, "n1", "h0") == [Start("c", "h0")]
    assert core.trial("c").node == "n1"


def test_a_node_without_gpus_yet_is_harmless_and_gets_trials_once_it_has_one() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    assert core.node(0, "n1") == []  # joins before its GPUs are known
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == []
    assert core.trial("b").node == "n0"
    assert core(GpuAdded(5, "n1", "h0")) == [Start("b", "h0")]
    assert core.trial("b").node == "n1"


def test_gpu_added_later_takes_a_waiting_trial() -> None:
    core = fifo()
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core(GpuAdded(3, "n0", "g1")) == [Start("b", "g1")]


def test_placement_puts_each_trial_on_the_least_loaded_node() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0", "h1")
    assert core.submit(0, "a") == [Start("a", "h0")]  # after placing: n0 1 per GPU, n1 0.5
    assert core.submit(0, "b") == [Start("b", "g0")]  # 1 against 1: the tie goes to the first node
    assert core.submit(0, "c") == [Start("c", "h1")]  # 2 against 1
    assert core.submit(0, "d") == []  # 2 against 1.5
    assert core.trial("d").node == "n1"
    assert core.submit(0, "e") == []  # 2 against 2: the first node
    assert core.trial("e").node == "n0"


def test_node_added_later_takes_a_suspended_trial_which_resumes_migrated() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("b", "g0")]
    assert core.node(20, "n1", "h0") == [Resume("a", "h0", migrated=True)]
    assert core.trial("a").node == "n1"
    assert "a" in core.scheduler.cluster.nodes["n1"].members
    assert "a" not in core.scheduler.cluster.nodes["n0"].members


def test_uneven_nodes_migrate_a_waiting_trial() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "h0")]
    assert core.submit(0, "c") == []
    assert core.trial("c").node == "n0"
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    # n1 empties: n0 time-shares two trials on one GPU, so its waiting trial moves over.
    assert core.report(14, "b", 5) == []
    assert core.exited(14, "b") == [Resume("a", "h0", migrated=True)]
    assert core.trial("a").node == "n1"
    assert core.report(20, "a", 2) == []


def test_loads_that_are_even_enough_are_left_alone() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    for name in "abcd":
        core.submit(0, name)
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    # b exits: n0 holds a and c, n1 holds d: moving a would only flip the imbalance.
    assert core.exited(14, "b") == [Start("d", "h0")]
    assert core.trial("a").node == "n0"


def test_gpu_removed_while_running_falls_back_to_the_checkpoint_and_resumes_elsewhere() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.report(5, "a", 1, checkpointed=True) == []
    assert core.report(10, "a", 2) == []  # not checkpointed: lost with the GPU
    assert core(GpuRemoved(11, "g0")) == [Resume("a", "g1", migrated=True)]
    trial = core.trial("a")
    assert trial.step == 1 and trial.checkpoint_step == 1
    assert trial.last_gpu == "g0"
    assert core.report(20, "a", 2) == []  # re-trains step 2


def test_gpu_removed_while_running_then_resumes_on_another_node() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "g1")]
    assert core.submit(0, "c") == [Start("c", "h0")]
    assert core.report(5, "a", 3, checkpointed=True) == []
    assert core.report(6, "c", 10) == []
    assert core.exited(6, "c") == []
    # n0 keeps a (lost) and b on one GPU while n1 is idle: a moves there.
    assert core(GpuRemoved(7, "g0")) == [Resume("a", "h0", migrated=True)]
    assert core.state("a") is TrialState.RUNNING
    assert core.trial("a").node == "n1"
    assert core.trial("a").step == 3


def test_gpu_removed_from_a_one_gpu_node_moves_its_trial_to_another_node() -> None:
    """A node that lost its last GPU must not strand its trials while other nodes have GPUs."""
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "h0")]
    assert core.report(5, "a", 1, checkpointed=True) == []
    assert core(GpuRemoved(6, "g0")) == []  # h0 is busy
    assert core.state("a") is TrialState.SUSPENDED
    assert core.exited(7, "b") == [Resume("a", "h0", migrated=True)]


def test_gpu_removed_while_suspending_releases_the_claim() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    core.submit(0, "a")
    core.submit(0, "b")
    core.submit(0, "c")
    assert core.report(5, "a", 1, checkpointed=True) == []
    assert core.report(12, "a", 2) == [Suspend("a")]  # claims c
    assert core(GpuRemoved(12.1, "g0")) == []  # g1 is busy with b
    assert core.state("a") is TrialState.SUSPENDED
    assert core.trial("a").step == 1
    # The claim on c died with a's GPU: b may now yield to c.
    assert core.report(12.5, "b", 1) == [Suspend("b")]
    assert core.suspended(13, "b", 1) == [Start("c", "g1")]


def test_node_removed_while_running_falls_back_to_the_checkpoint_and_resumes_elsewhere() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "h0")]
    assert core.report(5, "a", 1, checkpointed=True) == []
    assert core.report(10, "a", 2) == []
    assert core.exited(11, "b") == []
    assert core(NodeRemoved(12, "n0")) == [Resume("a", "h0", migrated=True)]
    trial = core.trial("a")
    assert trial.node == "n1"
    assert trial.step == 1 and trial.checkpoint_step == 1
    assert "n0" not in core.scheduler.cluster.nodes
    with pytest.raises(HermesError):
        core(GpuRemoved(13, "g0"))


def test_node_removed_with_stop_requested_ends_stopped() -> None:
    core = rr(stopper=StopBelow(0.3))
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    core.submit(0, "a")
    core.submit(0, "b")
    assert core.report(1, "a", 1, value=0.1) == [Stop("a")]
    assert core(NodeRemoved(2, "n0")) == []
    assert core.state("a") is TrialState.STOPPED


def test_node_removed_without_other_nodes_waits_for_a_new_one() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.report(5, "a", 2, checkpointed=True)
    assert core(NodeRemoved(6, "n0")) == []
    assert core(SubmissionsClosed(7)) == []  # no GPU at all: wait instead of stopping everything
    assert not core.scheduler.finished
    assert core.node(8, "n1", "h0") == [Resume("a", "h0", migrated=True)]
    assert core.report(9, "a", 3) == []
    assert core.report(10, "a", 10) == []
    assert core.exited(10, "a") == []
    assert core.scheduler.finished


# ---------------------------------------------------------------------------------------- non-movable trials
def test_non_movable_trial_resumes_only_on_its_own_gpu() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a", movable=False) == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "g1")]
    assert core.submit(0, "c") == []
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    # b's turn is over and a waits, but a cannot move to g1: b keeps running.
    assert core.report(14, "b", 1) == []
    # Nor does a take g1 when it frees.
    assert core.exited(20, "b") == []
    assert core.state("a") is TrialState.SUSPENDED
    # When g0 frees, a goes back there and c, which may move, takes g1.
    assert core.report(25, "c", 1) == [Suspend("c")]
    assert core.suspended(26, "c", 1) == [Resume("a", "g0", migrated=False), Resume("c", "g1", migrated=True)]


def test_non_movable_waiting_trial_is_not_migrated_between_nodes() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    core.submit(0, "a", movable=False)
    core.submit(0, "b")
    core.submit(0, "c")
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    assert core.exited(14, "b") == []  # a would even the load but cannot leave g0
    assert core.trial("a").node == "n0"


def test_fill_gives_a_free_gpu_to_a_runnable_trial_ranked_below_blocked_ones() -> None:
    """Two non-movable trials that both need g0 must not keep a movable trial off a free g1."""
    core = rr()
    core.node(0, "n0", "g0")
    assert core.submit(0, "x", movable=False) == [Start("x", "g0")]
    assert core.submit(0, "y", movable=False) == []
    assert core.report(12, "x", 1) == [Suspend("x")]
    assert core.suspended(13, "x", 1) == [Start("y", "g0")]
    assert core.report(24, "y", 1) == [Suspend("y")]
    assert core.suspended(25, "y", 1) == [Resume("x", "g0", migrated=False)]
    assert core.submit(35, "z") == []
    # Ranked: y (idle since 25), then z. y may only run on g0, which x holds; z takes g1.
    assert core(GpuAdded(40, "n0", "g1")) == [Start("z", "g1")]


def test_a_non_movable_trial_whose_node_died_starts_again_on_another() -> None:
    """Its state lived in its process, which died with the node: it may run anywhere now, from its beginning,
    catching up the steps it reported (so the core stays at its last step)."""
    core = rr()
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a", movable=False) == [Start("a", "g0")]
    assert core.submit(0, "b", budget=1) == [Start("b", "h0")]
    assert core.report(1, "a", 1) == []
    assert core(NodeRemoved(2, "n0")) == []  # h0 is busy
    assert core.trial("a").node == "n1" and core.trial("a").step == 1
    assert core.report(4, "b", 1) == []
    assert core.exited(4, "b") == [Resume("a", "h0", migrated=False)]


def test_a_non_movable_trial_stopped_on_a_gpu_that_failed_runs_again_on_another() -> None:
    core = rr()
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a", movable=False) == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "g1")]
    assert core.submit(0, "c") == []
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    assert core(GpuRemoved(14, "g0")) == []  # c falls back to its checkpoint; a's stopped process died there
    assert core.report(15, "b", 1) == [Suspend("b")]
    assert core.suspended(16, "b", 1) == [Resume("a", "g1", migrated=False)]  # a waited longest


# ---------------------------------------------------------------------------------------- crashes
def test_a_run_that_crashed_after_reports_runs_again_from_its_checkpoint_until_max_failures() -> None:
    core = rr(max_failures=2)
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b", budget=1) == [Start("b", "g1")]
    assert core.report(1, "a", 1, checkpointed=True) == []
    assert core.report(2, "a", 2) == []
    assert core.exited(3, "a", False, "uncaught RuntimeError: CUDA error", crashed=True) == [Resume("a", "g0", migrated=False)]
    trial = core.trial("a")
    assert (trial.state, trial.step, trial.crashes, trial.error) == (TrialState.RUNNING, 1, 1, None)
    assert core.report(4, "a", 2) == []  # trains step 2 again
    assert core.exited(5, "a", False, "exit code -9 (SIGKILL)", crashed=True) == [Resume("a", "g0", migrated=False)]
    assert core.exited(6, "a", False, "exit code -9 (SIGKILL)", crashed=True) == []  # its third crash: failed
    assert trial.state is TrialState.FAILED and trial.crashes == 2
    assert trial.error == "exit code -9 (SIGKILL)\n(its runs crashed 3 times; trial.max_failures is 2)"


def test_a_crash_after_the_last_step_completes_the_trial() -> None:
    """Its budget is trained and recorded: a failing teardown (CUDA, NCCL) neither fails nor retrains it."""
    core = rr(max_failures=2)
    core.node(0, "n0", "g0")
    assert core.submit(0, "a", budget=2) == [Start("a", "g0")]
    assert core.report(1, "a", 1) == [] and core.report(2, "a", 2) == []
    assert core.exited(3, "a", False, "exit code -11 (SIGSEGV)", crashed=True) == []
    trial = core.trial("a")
    assert (trial.state, trial.crashes) == (TrialState.COMPLETED, 0)
    assert trial.error == "after its last step: exit code -11 (SIGSEGV)"  # shown: a final save may be what failed


def test_a_crash_runs_again_only_after_a_report_and_only_when_it_is_a_crash() -> None:
    """Before any report (a broken script, a typo) and for a limit or a misuse (no ``crashed``) it fails at once;
    a stop it was told wins over a crash; the default core runs nothing again."""
    core = rr(max_failures=3)
    core.node(0, "n0", "g0", "g1", "g2")
    for trial_id in "abc":
        core.submit(0, trial_id)
    assert core.exited(1, "a", False, "uncaught NameError", crashed=True) == []  # before its first report
    assert core.report(1, "b", 1) == []
    assert core.exited(2, "b", False, "killed: it exceeded trial.timeout") == []
    assert core.report(1, "c", 1) == []
    assert core(ExperimentCancelled(2)) == [Stop("c")]
    assert core.exited(3, "c", False, "exit code 1", crashed=True) == []
    assert core.states() == {"a": TrialState.FAILED, "b": TrialState.FAILED, "c": TrialState.STOPPED}
    plain = rr()
    plain.node(0, "n0", "g0")
    plain.submit(0, "a")
    plain.report(1, "a", 1, checkpointed=True)
    assert plain.exited(2, "a", False, "exit code 1", crashed=True) == [] and plain.state("a") is TrialState.FAILED


def test_a_non_movable_trial_that_crashed_may_run_again_anywhere() -> None:
    """An unmodified program's state was its process, gone with the crash: it is tied to no GPU any more."""
    core = rr(max_failures=1)
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a", movable=False) == [Start("a", "g0")]
    assert core.submit(0, "b") == [Start("b", "g1")]
    assert core.submit(0, "c", budget=1) == []
    assert core.report(1, "a", 1) == []
    assert core.exited(2, "a", False, "exit code 1", crashed=True) == [Start("c", "g0")]  # c waited longer
    assert core.trial("a").last_gpu is None and core.trial("a").step == 1  # it catches up to its last step
    assert core.report(PERIOD + 1, "b", 1) == [Suspend("b")]
    assert core.suspended(PERIOD + 2, "b", 1) == [Resume("a", "g1", migrated=False)]


def test_leftover_non_movable_trial_without_its_gpu_is_stopped_at_the_end() -> None:
    """A GPU the pool took back still holds the trial's stopped process: the trial waits for that GPU, and is
    stopped at the end if it never comes back."""
    core = rr()
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a", movable=False) == [Start("a", "g0")]
    assert core.submit(0, "b", budget=2) == [Start("b", "g1")]
    assert core.submit(0, "c", budget=2) == []
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(13, "a", 1) == [Start("c", "g0")]
    assert core(GpuReclaimed(14, "g0", preempt=True)) == [Suspend("c")]
    assert core.suspended(15, "c", 1) == []  # g0 leaves; a may not take g1
    assert core(SubmissionsClosed(16)) == []
    assert core.report(17, "b", 2) == []
    assert core.exited(17, "b") == [Resume("c", "g1", migrated=True)]
    assert core.report(18, "c", 2) == []
    assert core.exited(18, "c") == [Stop("a")]
    assert core.scheduler.finished
    assert core.state("a") is TrialState.STOPPED


# ---------------------------------------------------------------------------------------- end of the experiment
def test_finished_when_all_trials_are_terminal_after_submissions_closed() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a", budget=1)
    core.submit(0, "b", budget=1)
    assert core(SubmissionsClosed(0)) == []
    assert core.report(1, "a", 1) == []
    assert core.exited(1, "a") == [Start("b", "g0")]
    assert not core.scheduler.finished
    assert core.report(2, "b", 1) == []
    assert core.exited(2, "b", succeeded=False) == []
    assert core.scheduler.finished
    assert core.states() == {"a": TrialState.COMPLETED, "b": TrialState.FAILED}
    with pytest.raises(HermesError, match="finished"):
        core(PeriodElapsed(3))


def test_not_finished_while_submissions_are_open() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a", budget=1)
    core.report(1, "a", 1)
    assert core.exited(1, "a") == []
    assert not core.scheduler.finished
    assert core.submit(2, "b", budget=1) == [Start("b", "g0")]


def test_closing_an_empty_experiment_finishes_it() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    assert core(SubmissionsClosed(0)) == []
    assert core.scheduler.finished


def test_leftover_non_runnable_trials_are_stopped_at_the_end() -> None:
    core = Core(Benched({"b"}))
    core.node(0, "n0", "g0", "g1")
    assert core.submit(0, "a", budget=1) == [Start("a", "g0")]
    assert core.submit(0, "b", budget=1) == []  # a free GPU, but the policy will not run b
    assert core(SubmissionsClosed(1)) == []
    assert core.report(2, "a", 1) == []
    assert core.exited(2, "a") == [Stop("b")]
    assert core.scheduler.finished
    assert core.states() == {"a": TrialState.COMPLETED, "b": TrialState.STOPPED}


def test_closing_waits_for_running_trials_and_stops_nothing_runnable() -> None:
    core = rr()
    core.node(0, "n0", "g0")
    core.submit(0, "a", budget=2)
    core.submit(0, "b", budget=2)
    assert core(SubmissionsClosed(0)) == []
    assert core.report(12, "a", 1) == [Suspend("a")]
    assert core.suspended(12.5, "a", 1) == [Start("b", "g0")]
    assert core.report(20, "b", 1) == []
    assert core.report(30, "b", 2) == []
    assert core.exited(30, "b") == [Resume("a", "g0", migrated=False)]
    assert not core.scheduler.finished
    assert core.report(40, "a", 2) == []
    assert core.exited(40, "a") == []
    assert core.scheduler.finished
    assert set(core.states().values()) == {TrialState.COMPLETED}


def test_objective_min_turns_values_into_scores() -> None:
    core = Core(RoundRobinPolicy(), objective=Objective("min"))
    core.node(0, "n0", "g0")
    core.submit(0, "a")
    core.report(1, "a", 1, value=2.0)
    core.report(2, "a", 2, value=float("nan"))
    assert core.trial("a").values[0] == 2.0
    assert core.trial("a").scores == [-2.0, float("-inf")]
    assert core.trial("a").best_score == -2.0


def test_a_crashed_run_runs_again_on_another_node_and_not_back_on_its_own() -> None:
    """A crash may be its node's (a bad host, a broken driver): its retry went back to the very slot it crashed
    on, so one bad node used up every trial's trial.max_failures there. With another node, it goes there, and the
    load balancing does not pull it back while it has not reported elsewhere."""
    core = rr(max_failures=2)
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.submit(0, "b", budget=2) == [Start("b", "h0")]
    assert core.report(1, "a", 1, checkpointed=True) == []
    assert core.exited(2, "a", False, "uncaught RuntimeError: CUDA error", crashed=True) == []  # h0 is busy
    assert core.trial("a").node == "n1" and core.trial("a").crashes == 1
    assert core.report(3, "b", 1) == []
    assert core.report(4, "b", 2) == []
    assert core.exited(4, "b") == [Resume("a", "h0", migrated=True)]  # from its checkpoint, on the other node
    lone = rr(max_failures=2)  # one node: it runs again where it was
    lone.node(0, "n0", "g0")
    lone.submit(0, "a")
    lone.report(1, "a", 1, checkpointed=True)
    assert lone.exited(2, "a", False, "exit code -9 (SIGKILL)", crashed=True) == [Resume("a", "g0", migrated=False)]


def test_a_crash_before_the_first_report_is_tried_once_on_another_node() -> None:
    """A broken script fails at once, as it would everywhere; with another node the first crash may be its node's
    (9 of 12 trials failed in a tenth of a second on one bad Ray node): once more elsewhere, then failed."""
    core = rr(max_failures=2)
    core.node(0, "n0", "g0")
    core.node(0, "n1", "h0")
    assert core.submit(0, "a") == [Start("a", "g0")]
    assert core.exited(1, "a", False, "uncaught ImportError: libcuda.so", crashed=True) == [
        Resume("a", "h0", migrated=True)  # from no checkpoint: from its beginning
    ]
    assert core.trial("a").node == "n1" and core.state("a") is TrialState.RUNNING
    assert core.exited(2, "a", False, "uncaught ImportError: libcuda.so", crashed=True) == []  # everywhere: failed
    assert core.state("a") is TrialState.FAILED and "crashed 2 times" in (core.trial("a").error or "")
