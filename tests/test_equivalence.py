"""One core, two engines: a real run and a simulation of the same workload make the same decisions.

Real trial processes sleep a known time per step and report known values; the simulator replays
the same curves with the step times and the switch costs measured in the real run. The stated
tolerance: the same sequence of decisions (kind, trial and GPU), each made within 1.5 s of its
simulated twin. The workload keeps every turn boundary at least 0.3 s away from a step boundary
so that timing jitter cannot flip a decision.
"""

from __future__ import annotations

import statistics
import sys

from hermes.core.decisions import Decision, Resume, Start, Suspend
from hermes.core.events import Event, SubmissionsClosed, TrialReported, TrialSuspended
from hermes.core.scheduler import Objective, Scheduler
from hermes.execution.engine import Engine
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.policies import make_policy
from hermes.sim.costs import SwitchCosts
from hermes.sim.executor import SimulatedExecutor
from hermes.sim.trace import TraceTrial

SETUP = 0.5  # seconds every trial process spends before its first step, like importing a framework
PERIOD = 1.6  # a turn is over after 2 steps: setup (+ ~0.2 s start) + 2 steps >= 1.6 > setup + 1 step
STEP_SECONDS = {"a": 0.55, "b": 0.7, "c": 0.85}
VALUES = {"a": [0.2, 0.4, 0.5, 0.55], "b": [0.3, 0.35, 0.6, 0.7], "c": [0.1, 0.5, 0.52, 0.6]}

TRIAL_CODE = """
import time
from hermes import trial
config = trial.config()
time.sleep(config["setup"])
for step in range(trial.start_step() + 1, trial.budget() + 1):
    time.sleep(config["seconds"])
    trial.report(step, value=config["values"][step - 1])
"""

Log = list[tuple[float, Decision]]


def _run(scheduler: Scheduler, executor, submissions: list[Event]) -> tuple[Log, list[Event]]:
    log: Log = []
    events: list[Event] = []

    def listen(event: Event, decisions: list[Decision]) -> None:
        events.append(event)
        log.extend((event.at, decision) for decision in decisions)

    engine = Engine(scheduler, executor, [listen])
    for submission in [*submissions, SubmissionsClosed(0.0)]:
        engine.post(submission)
    engine.run()
    return log, events


def _measured_costs(log: Log, events: list[Event]) -> SwitchCosts:
    """Start and resume: from the decision to the first report, less one step. Suspend: from the
    report that was answered "suspend" to TrialSuspended."""
    first_report: dict[tuple[str, float], float] = {}
    reports = [e for e in events if isinstance(e, TrialReported)]
    start, resume = [], []
    for at, decision in log:
        if isinstance(decision, (Start, Resume)):
            after = next(r.at for r in reports if r.trial_id == decision.trial_id and r.at > at)
            (start if isinstance(decision, Start) else resume).append(after - at - STEP_SECONDS[decision.trial_id])
            first_report[(decision.trial_id, at)] = after
    suspend = [
        suspended.at - at
        for at, decision in log
        if isinstance(decision, Suspend)
        for suspended in [next(e for e in events if isinstance(e, TrialSuspended) and e.trial_id == decision.trial_id and e.at >= at)]
    ]
    return SwitchCosts(
        start=statistics.fmean(start), suspend=statistics.fmean(suspend), resume=statistics.fmean(resume), migration=0.0,
        spill=0.0, state_mb=0.0,  # the measured latencies hold everything: nothing more per MB or per move
    )


def test_a_real_run_and_its_simulation_make_the_same_decisions(tmp_path) -> None:
    slots = local_slots(cpu_slots=2, threads_per_slot=1)
    nodes = {"local": tuple(slot.name for slot in slots)}
    budget = 4

    with LocalExecutor(tmp_path, slots=slots) as executor:
        submissions: list[Event] = [
            executor.submit(
                name,
                TrialLaunch(
                    budget=budget,
                    command=(sys.executable, "-c", TRIAL_CODE),
                    config={"setup": SETUP, "seconds": STEP_SECONDS[name], "values": VALUES[name]},
                ),
                at=0.0,
            )
            for name in STEP_SECONDS
        ]
        real, events = _run(Scheduler(make_policy("rr", period=PERIOD)), executor, submissions)

    costs = _measured_costs(real, events)
    curves = {
        name: TraceTrial(name, tuple(VALUES[name]), (STEP_SECONDS[name],) * budget, False, {}) for name in STEP_SECONDS
    }
    simulator = SimulatedExecutor(nodes, costs)
    simulated, _ = _run(
        Scheduler(make_policy("rr", period=PERIOD), objective=Objective("max")),
        simulator,
        [simulator.submit(name, curve, at=0.0) for name, curve in curves.items()],
    )

    assert any(isinstance(d, Suspend) for _, d in real), "the workload must exercise preemption"
    assert [d for _, d in real] == [d for _, d in simulated]
    drift = max(abs(a - b) for (a, _), (b, _) in zip(real, simulated))
    assert drift < 1.5, f"decisions drifted {drift:.2f} s from the simulation"
