"""Plug-ins that misbehave: a policy or a stopper that raises, answers what the core cannot use, or edits what it
only reads; and a policy without time-sharing, whose priority decides which waiting trial starts next.

The core refuses a misbehaving plug-in as its ``PluginError``, which names it, the method and the problem, in the
simulator and on a real run alike (there: the experiment's failure, and a ``hermes: error:`` line; in a shared
pool, the failure of that experiment alone). The plug-ins are defined here; a runner in a subprocess imports them
from this file, with ``tests`` on its path.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hermes.core.decisions import Start, Suspend
from hermes.core.events import (
    ExperimentCancelled,
    NodeAdded,
    PeriodElapsed,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import EarlyStopper, PluginError, SchedulingPolicy, Verdict
from hermes.core.scheduler import Scheduler
from hermes.core.states import TrialState
from hermes.core.trial import Trial
from hermes.experiment import parse_spec
from hermes.experiment.spec import ResourcesSpec
from hermes.policies import POLICIES, STOPPERS, make_policy, make_stopper
from hermes.policies.hermes import HermesPolicy, _rung_value
from hermes.policies.rr import RoundRobinPolicy
from hermes.policies.stopping import MedianStopper
from hermes.pool import PoolSession, stored_form
from hermes.report import open_store, pick_experiment
from hermes.sim.pool import PoolExperiment, simulate_pool
from hermes.sim.simulate import simulate
from hermes.sim.trace import Trace, TraceTrial
from hermes.store import ExperimentStatus, SqlStore
from hermes.testing import policy_contract
from tests.test_pool import check_completed, pool_spec, running, status, submit
from tests.test_run import PRINTED, RATE, spec_of, wait_for

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
HERE = Path(__file__).stem  # the module a runner imports the plug-ins from
TIMEOUT = 120


# ---------------------------------------------------------------------------------------------- the plug-ins
class Mutator(RoundRobinPolicy):
    """Breaks "policies only read a trial": it edits the hyper-parameters in place."""

    def observe(self, trial: Trial, now: float) -> Verdict:
        trial.params["rate"] = 123.0  # type: ignore[index]
        return Verdict.CONTINUE


class RaisesInPriority(RoundRobinPolicy):
    """Raises for a trial that reported: when a turn ends, say, with another trial waiting."""

    def priority(self, trial: Trial, now: float) -> float:
        if trial.step >= 1:
            raise RuntimeError("boom in priority")
        return super().priority(trial, now)


class StringPriority(RoundRobinPolicy):
    def priority(self, trial: Trial, now: float) -> Any:
        return "high"


class NaNForTheSecond(RoundRobinPolicy):
    """Cannot rank the second trial to arrive: NaN, which compares false with everything."""

    def priority(self, trial: Trial, now: float) -> float:
        return math.nan if trial.seq == 1 else super().priority(trial, now)


class StringVerdict(RoundRobinPolicy):
    """Says "stop", which equals Verdict.STOP as a string, but is no Verdict."""

    def observe(self, trial: Trial, now: float) -> Any:
        return "stop"


class PricedMigration(RoundRobinPolicy):
    """Prices a migration with the answer it is made with."""

    def __init__(self, answer: Any) -> None:
        super().__init__(period=1.0)
        self.answer = answer

    def migration_penalty(self, trial: Trial, now: float) -> Any:
        return self.answer


class NoVerdict(RoundRobinPolicy):
    """Forgets to return its verdict."""

    def observe(self, trial: Trial, now: float) -> Any:
        self.last_step = trial.step  # and no return


class RaisingStopper(EarlyStopper):
    def should_stop(self, trial: Trial) -> bool:
        if trial.step >= 2:
            raise ValueError("stopper boom")
        return False


class HighestRateFirst(SchedulingPolicy):
    """Without time-sharing: each trial to its end, the one with the highest rate first."""

    time_sharing = False

    def priority(self, trial: Trial, now: float) -> float:
        return float(trial.params["rate"])


class RaisesAfterTwentyPriorities(RoundRobinPolicy):
    """Works for a while, then raises at every priority it is asked: mid-run."""

    def __init__(self, period: float = 60.0) -> None:
        super().__init__(period)
        self.asked = 0

    def priority(self, trial: Trial, now: float) -> float:
        self.asked += 1
        if self.asked > 20:
            raise RuntimeError("boom after 20")
        return super().priority(trial, now)


class WaitsForTheThird(RoundRobinPolicy):
    """Pauses the first two trials at their first report, each held back (priority None) until the third, started once
    both wait, has done better. It compares with the third's best score, which is None before its first report: a
    TypeError for a trial held back, asked again in the pass that started the third (another GPU was free)."""

    order_version = None  # its answers change with the other trials' states

    def attach(self, trials: Mapping[str, Trial]) -> None:
        self.trials = trials

    def observe(self, trial: Trial, now: float) -> Verdict:
        return Verdict.PAUSE if trial.seq < 2 else Verdict.CONTINUE

    def priority(self, trial: Trial, now: float) -> float | None:
        first_two = [other for other in self.trials.values() if other.seq < 2]
        if trial.seq == 2:
            both_wait = len(first_two) == 2 and all(other.state is TrialState.SUSPENDED for other in first_two)
            return super().priority(trial, now) if both_wait else None
        if trial.step == 0:
            return super().priority(trial, now)  # its first run
        third = next((other for other in self.trials.values() if other.seq == 2), None)
        if third is None or third.state is not TrialState.RUNNING:
            return None
        return super().priority(trial, now) if trial.best_score > third.best_score else None  # type: ignore[operator]


class RaisesInConfigure(RoundRobinPolicy):
    def configure(self, profile: Any) -> None:
        raise RuntimeError("boom in configure")


class RaisesInAttach(RoundRobinPolicy):
    def attach(self, trials: Any) -> None:
        raise KeyError("boom in attach")


class RaisesInLoadStateDict(RoundRobinPolicy):
    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise ValueError("boom in load_state_dict")


class KeepsASet(RoundRobinPolicy):
    """Its state is no plain data: JSON holds no set."""

    def state_dict(self) -> dict[str, Any]:
        return {"seen": {1, 2}}


class SaysNo(EarlyStopper):
    """Means "do not stop", but "no" is true."""

    def should_stop(self, trial: Trial) -> Any:
        return "no"


class ArrayStopper(EarlyStopper):
    """Answers a numpy array: one element has a truth value, more raise, and neither is an answer."""

    def should_stop(self, trial: Trial) -> Any:
        return np.array(trial.scores[-1:]) < 0.3


class NumpyBoolStopper(EarlyStopper):
    """Stops a trial whose last score is below 0.3, answering numpy's bool (a comparison of numpy floats)."""

    def should_stop(self, trial: Trial) -> Any:
        return np.float64(trial.scores[-1]) < 0.3


class PlainBoolStopper(EarlyStopper):
    def should_stop(self, trial: Trial) -> bool:
        return trial.scores[-1] < 0.3


class StateDictRaises(EarlyStopper):
    def should_stop(self, trial: Trial) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("boom in state_dict")


class SaysNoToTurnOver(RoundRobinPolicy):
    """Means "never preempt", but "no" is true: the core preempted at every report."""

    def turn_over(self, trial: Trial, now: float) -> Any:
        return "no"


class ForgetsTurnOverReturn(RoundRobinPolicy):
    """Computes whether the turn is over and forgets to return it: the core never preempted."""

    def turn_over(self, trial: Trial, now: float) -> Any:
        super().turn_over(trial, now)  # and no return


class NumpyTurnOver(RoundRobinPolicy):
    """Answers numpy's bool (a comparison of numpy floats), which is an answer as Python's is."""

    def turn_over(self, trial: Trial, now: float) -> Any:
        return np.bool_(super().turn_over(trial, now))


class UndecidedBeforeTheFirstReport(RoundRobinPolicy):
    """Answers None for a trial that has not reported yet: the core asks at reports, so it never sees that answer."""

    def turn_over(self, trial: Trial, now: float) -> Any:
        return super().turn_over(trial, now) if trial.step else None


class NeverNow(RoundRobinPolicy):
    """Says not now (None) to every trial: nothing ever runs."""

    def priority(self, trial: Trial, now: float) -> float | None:
        return None


class MyHermes(HermesPolicy):
    """Hermes with a tweak (none yet): it sets no name of its own."""


class MyMedian(MedianStopper):
    pass


# ---------------------------------------------------------------------------------------------- helpers
def trace(rates: list[float], epochs: int = 3, mode: str = "max", metric: float | None = None) -> Trace:
    """Trials ``t0``, ``t1``... of ``epochs`` 10-second epochs, each with its ``rate`` param; ``metric``: the value
    every epoch of ``t0`` reports (a blown-up one), the others rising with their rate."""
    trials = []
    for index, rate in enumerate(rates):
        curve = tuple(metric if metric is not None and index == 0 else 1 - math.exp(-rate * (step + 1))
                      for step in range(epochs))
        trials.append(TraceTrial(f"t{index}", curve, (10.0,) * epochs, False, {"rate": rate}))
    return Trace("test", mode, tuple(trials))


def starts(rates: list[float], policy: SchedulingPolicy, gpus: int, nodes: int = 1, seed: int = 3) -> list[str]:
    result = simulate(trace(rates), policy, gpus=gpus, nodes=nodes, seed=seed, record=True)
    return [trial_id for _, kind, trial_id, _ in result.decisions if kind == "Start"]


def environment() -> dict[str, str]:
    """This checkout's hermes, and this file's plug-ins, for a runner."""
    paths = [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def hermes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hermes.cli", *args], cwd=cwd, env=environment(), check=False,
                          capture_output=True, text=True, timeout=TIMEOUT)


def write_spec(directory: Path, name: str, policy: str, rates: list[float], steps: int = 3, slots: int = 2) -> Path:
    """A real experiment of curve trials (tests/trials/curve.py), one per rate, on CPU slots."""
    spec = {
        "name": name,
        "trial": {"function": "trials.curve:train", "workdir": str(TESTS)},
        "search": {"sampler": "list", "configs": [{"rate": rate, "sleep": 0.05} for rate in rates]},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": steps},
        "policy": {"name": policy, "period": 0.2},
        "resources": {"gpus": "none", "cpu_slots": slots},
        "storage": {"dir": "runs"},
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def stored(directory: Path) -> tuple[Any, list[Any], list[Any]]:
    """The stored experiment, its trials and its decisions."""
    store = open_store(directory / "runs")
    try:
        experiment = pick_experiment(store, None)
        trials = store.trials(experiment.experiment_id)
        decisions = [record.decision for record in store.decisions(experiment.experiment_id)]
        return experiment, trials, decisions
    finally:
        store.close()


def core_with(policy: SchedulingPolicy, stopper: EarlyStopper | None = None) -> Scheduler:
    """A core with one GPU and trials ``a`` (rate 0.5) and ``b`` (rate 0.25), ``a`` running."""
    scheduler = Scheduler(policy, stopper=stopper)
    scheduler.handle(NodeAdded(0.0, "n", ("n/g0",)))
    scheduler.handle(TrialSubmitted(0.0, "a", 5, {"rate": 0.5}))
    scheduler.handle(TrialSubmitted(0.0, "b", 5, {"rate": 0.25}))
    return scheduler


# ---------------------------------------------------------------------------------------------- the tests
def test_a_policy_cannot_change_the_hyper_parameters_the_store_keeps(tmp_path: Path) -> None:
    """A policy that wrote ``trial.params["rate"] = 123.0`` overwrote what the store, the results and the trace keep
    of every trial: they are read-only, so its observe fails, naming it, and the store keeps what ran."""
    rates = [0.5, 0.25]
    result = hermes("run", str(write_spec(tmp_path, "mutator", f"{HERE}:Mutator", rates)), "--no-live", cwd=tmp_path)
    experiment, trials, _ = stored(tmp_path)
    assert sorted(trial.params["rate"] for trial in trials) == sorted(rates), result.stderr
    assert f"policy {HERE}:Mutator: observe() raised TypeError" in result.stderr
    assert experiment.status is ExperimentStatus.FAILED


def test_without_time_sharing_the_policy_decides_which_waiting_trial_starts_next_in_the_simulator() -> None:
    """Without time-sharing trials started in arrival order, whatever the priority said. The first arrivals start
    at once, one per GPU (nothing else waits yet); every later start is the highest rate of those waiting."""
    rates = [0.1, 0.7, 0.3, 0.9, 0.5, 0.2, 0.8, 0.4]
    for gpus, nodes in ((1, 1), (2, 2)):
        arrivals = [curve.name for curve in trace(rates).shuffled(3)]
        first, waiting = arrivals[:gpus], arrivals[gpus:]
        expected = first + sorted(waiting, key=lambda name: -rates[int(name[1:])])
        assert expected != arrivals  # else this proves nothing
        assert starts(rates, HighestRateFirst(), gpus, nodes) == expected, (gpus, nodes)
    # FIFO's priority is arrival order: unchanged
    assert starts(rates, make_policy("fifo"), 2, 2) == [curve.name for curve in trace(rates).shuffled(3)]


def test_without_time_sharing_the_policy_decides_which_waiting_trial_starts_next_on_a_real_run(
    tmp_path: Path,
) -> None:
    rates = [0.3, 0.2, 0.9, 0.5]
    path = write_spec(tmp_path, "highest", f"{HERE}:HighestRateFirst", rates, steps=2, slots=1)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _, trials, decisions = stored(tmp_path)
    rate_of = {trial.trial_id: trial.params["rate"] for trial in trials}
    started = [rate_of[decision.trial_id] for decision in decisions if isinstance(decision, Start)]
    assert started == [0.3, 0.9, 0.5, 0.2]  # the first alone at once, then the highest rate of those waiting


@pytest.mark.parametrize("policy", [StringVerdict, NoVerdict])
def test_a_verdict_that_is_no_verdict_is_refused_naming_the_policy(policy: type[SchedulingPolicy]) -> None:
    """"stop" (a string equal to Verdict.STOP) and None were taken as CONTINUE."""
    scheduler = core_with(policy())
    with pytest.raises(PluginError, match=rf"^policy {HERE}:{policy.__name__}: observe\(\) returned .* for trial a; "
                                          r"it must return a Verdict"):
        scheduler.handle(TrialReported(1.0, "a", 1, 0.5))
    with pytest.raises(AssertionError, match=rf"policy {HERE}:{policy.__name__}: observe\(\) returned"):
        policy_contract.test_priority_and_observe_answer_what_the_core_takes(f"{HERE}:{policy.__name__}")


@pytest.mark.parametrize("answer", ["cheap", -1.0, math.nan, None])
def test_a_migration_penalty_that_is_no_price_is_refused_naming_the_policy(answer: Any) -> None:
    """The node scheduler weighs a migration's penalty against priorities whenever a GPU frees and the best waiting
    trial left another: anything but a number >= 0 fails as the policy's error, not as a TypeError of the core."""
    with pytest.raises(PluginError, match=rf"^policy {HERE}:PricedMigration: migration_penalty\(\) returned "
                                          r".* for trial t\d; it must return a number >= 0"):
        simulate(trace([0.1, 0.2, 0.3, 0.4, 0.5]), PricedMigration(answer), gpus=2, seed=0)
    assert simulate(trace([0.1, 0.2, 0.3, 0.4, 0.5]), PricedMigration(0.5), gpus=2, seed=0).time_to_best_s


def test_a_nan_priority_is_refused_whatever_the_arrival_order() -> None:
    """NaN compares false with everything: the trial ran first where it arrived first, and never after another."""
    for seed in range(3):
        with pytest.raises(PluginError, match=rf"^policy {HERE}:NaNForTheSecond: priority\(\) returned nan \(float\) "
                                              r"for trial t\d; it must return a number \(not NaN\), or None"):
            simulate(trace([0.1, 0.2, 0.3, 0.4]), NaNForTheSecond(period=5.0), gpus=1, seed=seed)
    with pytest.raises(AssertionError, match=r"priority\(\) returned nan"):
        policy_contract.test_priority_and_observe_answer_what_the_core_takes(f"{HERE}:NaNForTheSecond")


@pytest.mark.parametrize("mode", ["max", "min"])
def test_hermes_ranks_a_metric_that_blew_up_to_1e308_and_the_experiment_ends(mode: str) -> None:
    """The sum of two reports of 1e308 overflowed in hermes's rung value (OverflowError: intermediate overflow in
    fsum): the experiment could never end. Now such a stretch is valued at its mean, as one report of it is; so is
    one whose trend lies past the float range, or is too small to square."""
    result = simulate(trace([0.5, 0.2, 0.3, 0.4], epochs=6, mode=mode, metric=1e308), make_policy("hermes"), gpus=1)
    assert result.trials == 4 and result.makespan_s > 0
    blown = Trial("blown", 0, 6, 0.0)
    for step in range(1, 5):
        blown.record(step, 1e308, 1e308 if mode == "max" else -1e308, float(step))
    assert _rung_value(blown, 0, 1.0) == (1e308 if mode == "max" else -1e308)  # the best of scores, or the worst
    swinging = Trial("swinging", 1, 6, 0.0)
    for step, score in enumerate((-1e308, 1e308, -1e308, 1e308), start=1):  # a trend past the float range
        swinging.record(step * 10, score, score, float(step))
    assert math.isfinite(_rung_value(swinging, 0, 1.0))
    creeping = Trial("creeping", 2, 6, 0.0)
    for step in range(1, 5):  # a trend too small to square: ZeroDivisionError
        creeping.record(step, step * 1e-300, step * 1e-300, float(step))
    assert _rung_value(creeping, 0, 0.0) == pytest.approx(2.5e-300)


def test_a_plugin_that_raises_or_answers_nonsense_fails_in_the_simulator_naming_itself(tmp_path: Path) -> None:
    """It surfaced as a raw traceback through the core's frames; a str priority even ran to the end on one GPU."""
    rates = [0.1, 0.2, 0.3]
    with pytest.raises(PluginError, match=rf"^policy {HERE}:RaisesInPriority: priority\(\) raised RuntimeError: "
                                          r"boom in priority \(trial t\d\)$"):
        simulate(trace(rates), RaisesInPriority(period=5.0), gpus=1)
    with pytest.raises(PluginError, match=rf"^early stopper {HERE}:RaisingStopper: should_stop\(\) raised "
                                          r"ValueError: stopper boom \(trial t\d\)$"):
        simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, stopper=RaisingStopper())
    with pytest.raises(PluginError, match=rf"^policy {HERE}:StringPriority: priority\(\) returned 'high' \(str\)"):
        simulate(trace(rates), StringPriority(), gpus=1)
    path = tmp_path / "trace.csv"
    path.write_text("trial,epoch,metric,seconds\n" + "".join(f"t{t},{e},{0.1 * t + 0.01 * e},1\n"
                                                            for t in range(3) for e in (1, 2)))
    result = hermes("simulate", "--trace", str(path), "--mode", "max", "--gpus", "1",
                    "--policy", f"{HERE}:StringPriority", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"hermes: error: policy {HERE}:StringPriority: priority() returned 'high' (str)")


def test_a_policy_that_raises_fails_the_run_naming_itself_and_a_fixed_rerun_clears_the_error(tmp_path: Path) -> None:
    """The run ended in a traceback (exit code 1) and stored "RuntimeError: boom in priority", naming no plug-in;
    continued to its end with a fixed policy, ``hermes status`` still showed that error."""
    rates = [0.5, 0.25, 0.4]
    path = write_spec(tmp_path, "boom", f"{HERE}:RaisesInPriority", rates, steps=5)
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"hermes: error: policy {HERE}:RaisesInPriority: priority() raised RuntimeError: boom in priority" \
        in result.stderr
    experiment, _, _ = stored(tmp_path)
    assert experiment.status is ExperimentStatus.FAILED
    assert experiment.error.startswith(f"PluginError: policy {HERE}:RaisesInPriority: priority() raised RuntimeError")

    write_spec(tmp_path, "boom", "rr", rates, steps=5)  # the same experiment, continued with a policy that works
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    experiment, _, _ = stored(tmp_path)
    assert experiment.status is ExperimentStatus.FINISHED and experiment.error is None
    status = hermes("status", "runs", cwd=tmp_path)
    assert status.returncode == 0 and "boom in priority" not in status.stdout, status.stdout


def test_a_subclass_that_sets_no_name_is_named_after_its_class() -> None:
    """``class MyHermes(HermesPolicy): pass`` reported itself as hermes."""
    assert MyHermes.name == "MyHermes" and MyMedian.name == "MyMedian"
    assert simulate(trace([0.1, 0.2]), MyHermes(), gpus=1).policy == "MyHermes"
    assert [make_policy(name).name for name in POLICIES] == list(POLICIES)  # the built-ins keep theirs
    assert [make_stopper(name).name for name in STOPPERS] == list(STOPPERS)


def test_a_policy_that_fails_in_a_shared_pool_fails_its_experiment_alone(tmp_path: Path) -> None:
    """A PluginError of one experiment's policy left the pool's loop: the pool stopped, and every experiment of it
    with it (interrupted). Now that experiment fails alone, recorded as `hermes run` records it, its trials are
    stopped, and the other experiment has the pool to itself and completes."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    policy = {"name": f"{HERE}:RaisesAfterTwentyPriorities", "period": 0.2}
    doomed = submit(store, pool_spec("doomed", 4, 0.05, budget=20, policy=policy))
    calm = submit(store, pool_spec("calm", 3, 0.05, budget=6), owner="bob")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)

    def ended() -> bool:
        trials = store.trials(doomed)
        return status(store, calm) is ExperimentStatus.FINISHED and bool(trials) and all(
            trial.state.is_terminal for trial in trials)

    with running(pool) as runner:
        wait_for(lambda: ended() or not runner.is_alive(), TIMEOUT, "the calm experiment to finish")
        assert runner.is_alive()
    failed = store.experiment(doomed)
    assert failed.status is ExperimentStatus.FAILED
    assert (failed.error or "").startswith(f"PluginError: policy {HERE}:RaisesAfterTwentyPriorities: priority() "
                                           "raised RuntimeError: boom after 20 (trial "), failed.error
    assert TrialState.STOPPED in {trial.state for trial in store.trials(doomed)}
    cancels = [event for event in store.events(doomed) if isinstance(event, ExperimentCancelled)]
    assert [event.reason for event in cancels] == [failed.error]  # its log says why its trials were stopped
    check_completed(store, tmp_path, calm, 3, 6)
    store.close()


def test_a_stopper_must_answer_true_or_false(tmp_path: Path) -> None:
    """"no" was taken as true: every trial was stopped at its first report. A numpy array of one element was taken by
    its truth value, of more raised. Both are refused, naming the stopper; numpy's bools are answers as Python's."""
    rates = [0.1, 0.2, 0.3, 0.4]
    with pytest.raises(PluginError, match=rf"^early stopper {HERE}:SaysNo: should_stop\(\) returned 'no' \(str\) for "
                                          r"trial t\d; it must return True or False$"):
        simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, stopper=SaysNo())
    with pytest.raises(PluginError, match=rf"^early stopper {HERE}:ArrayStopper: should_stop\(\) returned "
                                          r"array\(\[ ?(True|False)\]\) \(ndarray\)"):
        simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, stopper=ArrayStopper())
    plain = simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, stopper=PlainBoolStopper(), record=True)
    numpy = simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, stopper=NumpyBoolStopper(), record=True)
    assert "Stop" in {kind for _, kind, _, _ in numpy.decisions} and numpy.decisions == plain.decisions
    with pytest.raises(AssertionError, match=rf"early stopper {HERE}:SaysNo: should_stop\(\) returned 'no'"):
        policy_contract.test_should_stop_asked_again_changes_nothing(f"{HERE}:SaysNo")


def test_a_plugin_that_raises_outside_its_decisions_fails_naming_itself(tmp_path: Path) -> None:
    """configure, attach, load_state_dict and state_dict were called bare: what they raised came out as a traceback
    through the session, the core or the simulator; a state JSON cannot hold failed the contract with a bare
    TypeError. Each is the plug-in's PluginError now, naming it and the method."""
    path = write_spec(tmp_path, "configure", f"{HERE}:RaisesInConfigure", [0.5, 0.25])
    result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"hermes: error: policy {HERE}:RaisesInConfigure: configure() raised "
                                    "RuntimeError: boom in configure"), result.stderr
    with pytest.raises(PluginError, match=rf"^policy {HERE}:RaisesInConfigure: configure\(\) raised RuntimeError"):
        simulate_pool([PoolExperiment("a", trace([0.1, 0.2]), f"{HERE}:RaisesInConfigure")], gpus=1)
    with pytest.raises(PluginError, match=rf"^policy {HERE}:RaisesInAttach: attach\(\) raised KeyError: 'boom in "
                                          r"attach'$"):
        simulate(trace([0.1, 0.2]), RaisesInAttach(), gpus=1)
    scheduler = core_with(RoundRobinPolicy())
    with pytest.raises(PluginError, match=rf"^policy {HERE}:RaisesInLoadStateDict: load_state_dict\(\) raised "
                                          r"ValueError: boom in load_state_dict$"):
        scheduler.restore_policy(RaisesInLoadStateDict(), {})
    with pytest.raises(AssertionError, match=rf"^policy {HERE}:KeepsASet: state_dict\(\) returned what JSON cannot "
                                             r"hold \(Object of type set is not JSON serializable\)"):
        policy_contract.test_a_state_dict_round_trip_mid_run_changes_no_decision(f"{HERE}:KeepsASet")
    with pytest.raises(AssertionError, match=rf"^early stopper {HERE}:StateDictRaises: state_dict\(\) raised "
                                             r"RuntimeError: boom in state_dict$"):
        policy_contract.test_a_stopper_state_dict_round_trip_mid_run_changes_no_decision(f"{HERE}:StateDictRaises")
    # a simulated pool fails on a plug-in's error, as the simulator does, whichever experiment's it is
    with pytest.raises(PluginError, match=rf"^policy {HERE}:RaisesInPriority: priority\(\) raised RuntimeError"):
        simulate_pool([PoolExperiment("a", trace([0.1, 0.2, 0.3], epochs=10), "rr"),
                       PoolExperiment("b", trace([0.1, 0.2, 0.3], epochs=10), f"{HERE}:RaisesInPriority")], gpus=2)



def test_a_policy_that_fails_after_its_core_started_a_trial_in_that_event_hands_out_the_start() -> None:
    """Two programs (they cannot move) pause at their first report, each held back on its own GPU; once both wait, the
    core starts the third on one GPU and, asking again for the other, the policy raises. That Start was lost with the
    error, and the core did not even count the third as holding its GPU. Now the error carries it, counted."""
    scheduler = Scheduler(WaitsForTheThird(period=60.0))
    scheduler.handle(NodeAdded(0.0, "n", ("n/g0", "n/g1")))
    started = [d for i in range(3) for d in scheduler.handle(TrialSubmitted(0.0, f"t{i}", 9, movable=False))]
    assert started == [Start("t0", "n/g0"), Start("t1", "n/g1")]
    assert scheduler.handle(TrialReported(1.0, "t0", 1, 0.5)) == [Suspend("t0")]
    assert scheduler.handle(TrialSuspended(1.5, "t0", 1)) == []
    assert scheduler.handle(TrialReported(2.0, "t1", 1, 0.5)) == [Suspend("t1")]
    with pytest.raises(PluginError, match=rf"^policy {HERE}:WaitsForTheThird: priority\(\) raised TypeError: .* "
                                          r"\(trial t1\)$") as failure:
        scheduler.handle(TrialSuspended(2.5, "t1", 1))
    assert failure.value.decisions == [Start("t2", "n/g0")]  # type: ignore[attr-defined]
    assert scheduler.trials["t2"].state is TrialState.RUNNING and scheduler.busy == 1


def test_a_policy_that_fails_at_a_period_after_its_core_suspended_a_trial_hands_out_the_suspend() -> None:
    """At a period the core suspends a for c, then asks the policy about b, which raises for a trial that reported: the
    Suspend of a, which the core counts as leaving its GPU, comes with the error."""
    scheduler = Scheduler(RaisesInPriority(period=10.0))
    scheduler.handle(NodeAdded(0.0, "n", ("n/g0", "n/g1")))
    started = [d for trial_id in "abcd" for d in scheduler.handle(TrialSubmitted(0.0, trial_id, 9))]
    assert started == [Start("a", "n/g0"), Start("b", "n/g1")]
    assert scheduler.handle(TrialReported(1.0, "b", 1, 0.5)) == []
    with pytest.raises(PluginError, match=r"priority\(\) raised RuntimeError: boom in priority \(trial b\)$") as error:
        scheduler.handle(PeriodElapsed(20.0))
    assert error.value.decisions == [Suspend("a")]  # type: ignore[attr-defined]
    assert scheduler.trials["a"].state is TrialState.SUSPENDING


def test_a_pool_experiment_whose_policy_fails_after_starting_a_trial_ends_with_every_trial_stopped(
    tmp_path: Path,
) -> None:
    """The case above in a pool, with real programs on two slots: the third trial's Start was lost with the error. Its
    core believed it ran on a slot and, counting no trial running, ended the experiment at its cancellation with that
    trial still running in its record; a core that counts it waits for ever for the end of a run that never began.
    Now the pool starts it, the cancellation stops it, and the experiment ends with every trial stopped and its log
    saying so: the failing event with its Start, then the cancellation's Stops."""
    steps = 30
    spec = spec_of(
        "waits",
        trial={"command": f"{sys.executable} trials/printer.py --steps {steps} --rate {{rate}} --sleep 0.05",
               "metrics_regex": PRINTED, "workdir": str(TESTS)},
        search={"sampler": "random", "trials": 3, "seed": 4, "space": {"rate": RATE}},
        budget={"steps": steps},
        policy={"name": f"{HERE}:WaitsForTheThird", "period": 60.0},
    )
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    doomed = submit(store, stored_form(parse_spec(spec)))
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    with running(pool) as runner:
        wait_for(lambda: status(store, doomed) is ExperimentStatus.FAILED or not runner.is_alive(), TIMEOUT,
                 "the experiment to fail")
        wait_for(lambda: not pool.scheduler.tenants or not runner.is_alive(), TIMEOUT, "the experiment to end")
        assert runner.is_alive()
        assert pool.scheduler.holder == {gpu: None for gpu in pool.scheduler.gpu_node}  # every slot back in the pool
    failed = store.experiment(doomed)
    assert (failed.error or "").startswith(f"PluginError: policy {HERE}:WaitsForTheThird: priority() raised "
                                           "TypeError: "), failed.error
    assert [(trial.trial_id, trial.state) for trial in store.trials(doomed)] == [
        (trial_id, TrialState.STOPPED) for trial_id in ("0", "1", "2")]
    third = [type(record.decision).__name__ for record in store.decisions(doomed) if record.decision.trial_id == "2"]
    assert third == ["Start", "Stop"]
    store.close()


def test_a_turn_over_that_is_no_bool_is_refused_naming_the_policy() -> None:
    """The node scheduler took turn_over's answer by its truth: "no" preempted the trial at every report, a forgotten
    return never. Both fail as the policy's error; numpy's bools are answers as Python's; and the contract suite asks
    turn_over itself, of every running trial, so it finds an answer the run it makes never asks for."""
    rates = [0.1, 0.2, 0.3, 0.4]
    for policy, answer in ((SaysNoToTurnOver, r"'no' \(str\)"), (ForgetsTurnOverReturn, r"None \(NoneType\)")):
        with pytest.raises(PluginError, match=rf"^policy {HERE}:{policy.__name__}: turn_over\(\) returned {answer} "
                                              r"for trial t\d; it must return True or False$"):
            simulate(trace(rates), policy(period=5.0), gpus=1)
    plain = simulate(trace(rates), RoundRobinPolicy(period=5.0), gpus=1, record=True)
    numpy = simulate(trace(rates), NumpyTurnOver(period=5.0), gpus=1, record=True)
    assert plain.preemptions and numpy.decisions == plain.decisions
    with pytest.raises(AssertionError, match=rf"^policy {HERE}:UndecidedBeforeTheFirstReport: turn_over\(\) returned "
                                             r"None \(NoneType\)"):
        policy_contract.test_priority_and_observe_answer_what_the_core_takes(f"{HERE}:UndecidedBeforeTheFirstReport")


def test_trials_a_policy_never_lets_run_are_stopped_saying_whose_doing_it_is(tmp_path: Path) -> None:
    """A policy that said not now (None) to every trial had them all stopped once nothing ran and no trial could come:
    the run said finished, every trial stopped before its first report, and nothing said why. Each such trial's error
    names the policy now: printed by `hermes run`, stored, and listed by `hermes status`."""
    reason = f"policy {HERE}:NeverNow answered priority() None (not now) with nothing running and no trial to come"
    result = hermes("run", str(write_spec(tmp_path, "never", f"{HERE}:NeverNow", [0.5, 0.25])), "--no-live",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"stopped before its first report ({reason}") == 2, result.stdout
    experiment, trials, _ = stored(tmp_path)
    assert experiment.status is ExperimentStatus.FINISHED
    assert [trial.state for trial in trials] == [TrialState.STOPPED] * 2
    assert all((trial.error or "").startswith(reason) for trial in trials), [trial.error for trial in trials]
    status = hermes("status", "runs", cwd=tmp_path)
    assert reason in status.stdout, status.stdout


def test_trials_asha_did_not_promote_end_stopped_with_no_error(tmp_path: Path) -> None:
    """asha's trials not promoted wait with priority None until the end, which stops them: its way of pausing, not a
    policy holding trials back before they ever ran, so no error blames it (each was said to be its doing)."""
    rates = [0.05 * index for index in range(1, 10)]
    result = hermes("run", str(write_spec(tmp_path, "promoted", "asha", rates, steps=9, slots=1)), "--no-live",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    experiment, trials, _ = stored(tmp_path)
    assert experiment.status is ExperimentStatus.FINISHED
    assert TrialState.STOPPED in {trial.state for trial in trials}  # some were not promoted
    assert [trial.error for trial in trials] == [None] * len(rates)
    assert "answered priority()" not in result.stdout, result.stdout
