"""Hard limits: a spent time or GPU budget, or a cancel, ends the experiment then, and its running trials at once.

Real sessions, warm workers, a SQLite store and a pool, nothing of ours mocked. The trials (``TRIAL``, written
into each test's folder) train a few quick steps, then slow ones: a budget or a cancel that waited for the next
report, or a stop that waited for the end of a step, shows as seconds too many.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    TrialExited,
    TrialReported,
    TrialSuspended,
)
from hermes.core.states import TrialState
from hermes.experiment import parse_spec
from hermes.experiment.spec import ResourcesSpec
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.pool import PoolSession, stored_form
from hermes.report.status import experiment_status
from hermes.session import BUDGET_SPENT, ExperimentSession
from hermes.store import ExperimentStatus, SqlStore
from tests.test_pool import running, submit
from tests.test_run import wait_for

TRIAL = '''
import os
import time
from hermes import trial

def train(config):
    """``fast_steps`` steps of ``fast`` seconds, then steps of ``slow`` seconds; each step notes the worker's pid."""
    for step in range(1, trial.budget() + 1):
        time.sleep(config["fast"] if step <= config["fast_steps"] else config["slow"])
        with open(trial.trial_dir() / "pids", "a") as pids:
            pids.write(f"{os.getpid()}\\n")
        trial.report(step, loss=1.0 / step)
'''
SLOT = "local/cpu0"
TEARDOWN = 2.0  # seconds from the deadline or the cancel to the last trial's end, killing its worker included


def write_trial(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "steps.py").write_text(TRIAL)
    return folder


def spec_of(folder: Path, name: str, configs: list[dict[str, Any]], **search: Any) -> dict[str, Any]:
    """Trials of ``configs`` on two CPU slots under round robin: turns of 0.2 s park some in their workers."""
    return {
        "name": name,
        "trial": {"function": "steps:train", "workdir": str(write_trial(folder))},
        "search": {"configs": configs, **search},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 20},
        "policy": {"name": "rr", "period": 0.2},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "storage": {"dir": str(folder / "runs")},
    }


def quick_then_slow(trials: int) -> list[dict[str, Any]]:
    """Three quick steps (turns end and trials park), then steps of 8 s: all in one, or parked, at the deadline."""
    return [{"fast": 0.05, "fast_steps": 3, "slow": 8.0, "n": n} for n in range(trials)]


def ended_promptly(store: SqlStore, experiment_id: int, limit: float) -> ExperimentCancelled:
    """The experiment's cancel, which came within ``limit`` seconds of its start; every trial ended stopped within
    TEARDOWN seconds of it, and `hermes status` shows it finished (or cancelled) with about that elapsed time."""
    events = store.events(experiment_id)
    [cancelled] = [event for event in events if isinstance(event, ExperimentCancelled)]
    assert cancelled.at - events[0].at <= limit + 0.5, f"cancelled {cancelled.at - events[0].at:.1f}s in"
    exits = [event for event in events if isinstance(event, TrialExited)]
    assert exits and max(event.at for event in exits) - cancelled.at < TEARDOWN
    assert {trial.state for trial in store.trials(experiment_id)} == {TrialState.STOPPED}
    status = experiment_status(store, store.experiment(experiment_id))
    assert status.elapsed < limit + 0.5 + TEARDOWN, f"elapsed {status.elapsed:.1f}s"
    return cancelled


def test_max_time_ends_the_experiment_at_its_deadline_while_every_trial_is_in_a_long_step(tmp_path: Path) -> None:
    """Three trials on two slots, one parked at the deadline: no report comes for 8 s, yet the experiment ends at
    its max_time, finished, and its trials are killed in the middle of their step, not answered at its end."""
    session = ExperimentSession(parse_spec(spec_of(tmp_path, "timed", quick_then_slow(3), max_time=2.5)))
    outcome = session.run()
    assert outcome.status is ExperimentStatus.FINISHED and session.ended_by == BUDGET_SPENT
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    try:
        cancelled = ended_promptly(store, outcome.experiment_id, 2.5)
        assert cancelled.reason == BUDGET_SPENT
        assert any(isinstance(record.decision, Suspend) for record in store.decisions(outcome.experiment_id))
    finally:
        store.close()


def test_max_gpu_hours_ends_the_experiment_once_the_running_trials_use_it_up(tmp_path: Path) -> None:
    """Two slots busy: 4 slot-seconds are spent 2 s after both trials started, between two of their reports."""
    spec = spec_of(tmp_path, "gpu-hours", quick_then_slow(2), max_gpu_hours=4.0 / 3600)
    session = ExperimentSession(parse_spec(spec))
    outcome = session.run()
    assert outcome.status is ExperimentStatus.FINISHED and session.ended_by == BUDGET_SPENT
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    try:
        runs = store.runs(outcome.experiment_id)
        first_start = min(run.started_at for run in runs) - store.events(outcome.experiment_id)[0].at
        cancelled = ended_promptly(store, outcome.experiment_id, first_start + 2.0)
        used = sum(run.ended_at - run.started_at for run in runs)
        assert 3.9 < used < 4.0 + 2 * TEARDOWN, used  # the budget, and each trial's teardown after the cancel
        assert cancelled.reason == BUDGET_SPENT
    finally:
        store.close()


def test_a_cancel_ends_a_trial_in_the_middle_of_its_step(tmp_path: Path) -> None:
    """Cancelled at trial 0's first report (answered before the cancel is handled: it trains on): both trials, 8 s
    from their next report, are killed then, and the run ends at once, cancelled, with that report kept."""
    configs = [{"fast": 0.05, "fast_steps": 1, "slow": 8.0}, {"fast": 8.0, "fast_steps": 1, "slow": 8.0}]
    session = ExperimentSession(parse_spec(spec_of(tmp_path, "cancelled", configs)))

    def cancel_at_the_first_report(event: Event, _decisions: list[Decision]) -> None:
        if isinstance(event, TrialReported) and event.step == 1 and event.trial_id == "0":
            session.cancel("cancelled on request")

    session.listeners.append(cancel_at_the_first_report)
    outcome = session.run()
    assert outcome.status is ExperimentStatus.CANCELLED
    store = SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")
    try:
        ended_promptly(store, outcome.experiment_id, 8.0)
        assert [metric.step for metric in store.metrics(outcome.experiment_id)] == [1]  # what it reported is kept
    finally:
        store.close()


def test_a_pool_ends_an_experiment_whose_time_is_up_while_its_trials_are_in_a_long_step(tmp_path: Path) -> None:
    """The pool asks each session between events, at each poll: the deadline needs no report to be seen."""
    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    pool = PoolSession(store, tmp_path, resources=ResourcesSpec(gpus="none", cpu_slots=2), poll=0.1)
    spec = stored_form(parse_spec(spec_of(tmp_path, "pooled", quick_then_slow(3), max_time=2.5)))
    timed = submit(store, spec)
    with running(pool):
        wait_for(lambda: store.experiment(timed).status is ExperimentStatus.FINISHED, 60, "the experiment to end")
    try:
        assert ended_promptly(store, timed, 2.5).reason == BUDGET_SPENT
    finally:
        store.close()


# ---------------------------------------------------------------------- the executor: what a stop kills, and keeps
def launch(folder: Path, slow: float) -> TrialLaunch:
    return TrialLaunch(3, function="steps:train", config={"fast": 0.05, "fast_steps": 1, "slow": slow},
                       cwd=str(write_trial(folder)))


def park(executor: LocalExecutor, trial_id: str, work: TrialLaunch) -> None:
    """Start the trial on the slot and suspend it at its first report: it parks in the slot's worker."""
    executor.submit(trial_id, work)
    executor.apply(Start(trial_id, SLOT), executor.now())
    [report] = executor.next_events()
    executor.apply(Suspend(trial_id), executor.now())
    executor.settled(report)
    [suspended] = executor.next_events()
    assert isinstance(suspended, TrialSuspended)


def start_into_its_second_step(executor: LocalExecutor, trial_id: str, work: TrialLaunch) -> None:
    executor.submit(trial_id, work)
    executor.apply(Start(trial_id, SLOT), executor.now())
    [report] = executor.next_events()
    assert isinstance(report, TrialReported) and report.step == 1
    executor.settled(report)  # answered continue: its slow step begins


def pids(executor: LocalExecutor, trial_id: str) -> set[str]:
    return set((executor.directory / "trials" / trial_id / "pids").read_text().split())


def test_stopped_with_the_trial_parked_beside_it_a_trial_ends_at_once(tmp_path: Path) -> None:
    """A cancel stops both: the worker holds nothing that lives on, so it is killed, and the running trial ends
    now instead of 10 s later at its report; the parked one ends silently, and the slot serves the next trial."""
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="loss") as executor:
        executor.next_events()  # the node's NodeAdded
        park(executor, "parked", launch(tmp_path, 10.0))
        start_into_its_second_step(executor, "running", launch(tmp_path, 10.0))
        stopped = time.monotonic()
        executor.apply(Stop("running"), executor.now())
        executor.apply(Stop("parked"), executor.now())
        events = executor.next_events()
        assert time.monotonic() - stopped < TEARDOWN
        assert [(type(e), e.trial_id, e.error) for e in events] == [(TrialExited, "running", "stopped")]
        start_into_its_second_step(executor, "next", launch(tmp_path, 0.05))
        assert pids(executor, "next").isdisjoint(pids(executor, "running"))  # in a new worker


def test_a_trial_stopped_beside_a_parked_one_that_lives_on_ends_at_its_report_which_is_kept(tmp_path: Path) -> None:
    """Killing the worker would lose the parked trial's state: the stopped one ends at its next report instead,
    and that report, which it did make, is recorded; the parked trial then resumes from memory, in that worker."""
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="loss") as executor:
        executor.next_events()
        park(executor, "parked", launch(tmp_path, 0.05))
        start_into_its_second_step(executor, "stopped", launch(tmp_path, 1.0))
        executor.apply(Stop("stopped"), executor.now())
        [kept] = executor.next_events()
        assert isinstance(kept, TrialReported) and (kept.trial_id, kept.step) == ("stopped", 2)
        executor.settled(kept)  # answered stop
        [ended] = executor.next_events()
        assert isinstance(ended, TrialExited) and (ended.trial_id, ended.error) == ("stopped", "stopped")
        executor.apply(Resume("parked", SLOT, migrated=False), executor.now())
        [report] = executor.next_events()
        assert isinstance(report, TrialReported) and (report.trial_id, report.step) == ("parked", 2)
        assert pids(executor, "parked") == pids(executor, "stopped")  # one worker ran both, never restarted



def test_a_trial_stopped_while_it_suspends_ends_there_and_leaves_its_worker_to_the_next(tmp_path: Path) -> None:
    """A stop that finds a trial parking (beside one that lives on, so its worker is not killed): its suspension
    ends it, and nothing of it stays in the worker. A parked run left asked to stop kept the next trial's stop from
    killing the worker, and where the worker was killed, it was said to have exited, which the core, having it
    stopped already, refused."""
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=1), metric="loss") as executor:
        executor.next_events()
        park(executor, "kept", launch(tmp_path, 0.05))
        executor.submit("parking", launch(tmp_path, 0.05))
        executor.apply(Start("parking", SLOT), executor.now())
        [report] = executor.next_events()
        executor.apply(Suspend("parking"), executor.now())
        executor.settled(report)  # answered suspend: it parks
        executor.apply(Stop("parking"), executor.now())  # decided while it suspends
        [suspended] = executor.next_events()
        assert isinstance(suspended, TrialSuspended) and suspended.trial_id == "parking"
        executor.apply(Stop("kept"), executor.now())
        start_into_its_second_step(executor, "next", launch(tmp_path, 10.0))
        stopped = time.monotonic()
        executor.apply(Stop("next"), executor.now())
        events = executor.next_events()
        assert time.monotonic() - stopped < TEARDOWN
        assert [(type(e), e.trial_id, e.error) for e in events] == [(TrialExited, "next", "stopped")]
        assert executor.next_events() == [] and executor.idle()
