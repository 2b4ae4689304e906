"""One core, two engines: a real run and a simulation of the same workload make the same decisions.

Real trial processes sleep a known time per step and report known values; the simulator replays
the same curves with the step times and the switch costs measured in the real run. The stated
tolerance: the same sequence of decisions (kind, trial and GPU), each made within 1.5 s of its
simulated twin. Timing jitter must not be able to flip a decision, for any start delay (decision
to first step, the setup included) from 0.3 s to 1.5 s, the range seen on idle and loaded machines:
every turn is over before a run's first report (PERIOD is shorter than any start plus a step), so
no report falls near a turn's end, and the step times keep each report that decides something at
least 0.6 s from the other slot's reports next to it, in real time as in simulated time.
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
PERIOD = 0.25  # shorter than any start (>= 0.3 s) plus a first step (>= 0.4 s): every report ends a turn
# Seconds of each step. The reports that decide, with d the mean start delay (0.3..1.5 s) and s the
# ~0.05 s of a suspend: b's first 0.7 s after a's, which c's first follows by d + s + 0.3 s;
# a's last 1.0 s after that, and b's last 0.5 s + d + s after a's last. c's last decides nothing.
STEP_SECONDS = {"a": (0.4, 1.3), "b": (1.1, 1.5), "c": (1.0, 0.3)}
VALUES = {"a": [0.2, 0.4], "b": [0.3, 0.35], "c": [0.1, 0.5]}

TRIAL_CODE = """
import time
from hermes import trial
config = trial.config()
time.sleep(config["setup"])
for step in range(trial.start_step() + 1, trial.budget() + 1):
    time.sleep(config["seconds"][step - 1])
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
    """Start and resume: from the decision to the first report, less that report's step. Suspend: from
    the report that was answered "suspend" to TrialSuspended."""
    reports = [e for e in events if isinstance(e, TrialReported)]
    start, resume = [], []
    for at, decision in log:
        if isinstance(decision, (Start, Resume)):
            after = next(r for r in reports if r.trial_id == decision.trial_id and r.at > at)
            step_seconds = STEP_SECONDS[decision.trial_id][after.step - 1]
            (start if isinstance(decision, Start) else resume).append(after.at - at - step_seconds)
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
    budget = 2

    with LocalExecutor(tmp_path, slots=slots) as executor:
        submissions: list[Event] = [
            executor.submit(
                name,
                TrialLaunch(
                    budget=budget,
                    command=(sys.executable, "-c", TRIAL_CODE),
                    config={"setup": SETUP, "seconds": list(STEP_SECONDS[name]), "values": VALUES[name]},
                ),
                at=0.0,
            )
            for name in STEP_SECONDS
        ]
        real, events = _run(Scheduler(make_policy("rr", period=PERIOD)), executor, submissions)

    costs = _measured_costs(real, events)
    curves = {
        name: TraceTrial(name, tuple(VALUES[name]), STEP_SECONDS[name], False, {}) for name in STEP_SECONDS
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
