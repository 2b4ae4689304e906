"""What a long-lived pool (``hermes server``) keeps of an experiment that ended: nothing on its nodes.

A Ray node agent kept the id and folder of every trial of every experiment the pool ever ran, and each
experiment left an (empty, nearly always) warm-worker log per slot. Real agents and executors, real warm workers
running ``tests/trials/curve.py``; the agent is driven in-process, as its Ray driver would call it.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from pathlib import Path

from hermes.core.decisions import Start
from hermes.core.events import Event, TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from hermes.ray.agent import NodeAgent

TESTS = Path(__file__).resolve().parent


def launch(tmp_path: Path, group: str | None, trial_id: str, budget: int = 1, **kept: object) -> TrialLaunch:
    """A quick curve trial of ``group`` (a pool's experiment), with its folder in the experiment's, as a pool has."""
    directory = str(tmp_path / (group or "own") / trial_id)
    return TrialLaunch(budget, function="trials.curve:train", config={"sleep": 0.01}, cwd=str(TESTS),
                       worker_group=group, directory=directory, **kept)


class Driver:
    """Calls a node agent as ``RayExecutor`` does: numbered calls, numbered events."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent, self.seq, self.after = agent, 0, 0

    def call(self, *commands: tuple) -> None:
        self.seq += 1
        self.agent.call(self.seq, list(commands))

    def until(self, last: Callable[[Event], bool]) -> None:
        """Take events, settling each report as the core would, until ``last`` (left unsettled)."""
        while True:
            events, self.after, _, _ = self.agent.next_events(self.after)
            for event in events:
                if isinstance(event, str):  # a warning for the user
                    continue
                if last(event):
                    return
                if isinstance(event, TrialReported):
                    self.call(("settle", event.trial_id, event.step))


def test_a_ray_node_agent_forgets_the_trials_of_an_experiment_that_ended(tmp_path: Path) -> None:
    agent = NodeAgent("node", str(tmp_path / "node"), "score", 0, str(tmp_path / "durable"), cpu_slots=1)
    driver = Driver(agent)
    try:
        gpu = next(iter(agent.local.slots))
        driver.call(("submit", "a", launch(tmp_path, "exp1", "a", budget=2), 0),
                    ("submit", "c", launch(tmp_path, "exp2", "c"), 0), ("apply", Start("a", gpu)))
        driver.until(lambda e: isinstance(e, TrialExited) and e.trial_id == "a")
        driver.call(("submit", "b", launch(tmp_path, "exp1", "b"), 0), ("apply", Start("b", gpu)))
        driver.until(lambda e: isinstance(e, TrialReported) and e.trial_id == "b")  # left unsettled
        assert set(agent._known) == {"a", "b", "c"} and set(agent._awaiting) == {"b"}
        driver.call(("end_worker_group", "exp1"))
        assert agent._known == {"c"}  # exp2's, not ended
        assert agent._directories == {"c": tmp_path / "exp2" / "c"}
        assert agent._awaiting == {}
    finally:
        agent.close()


def run(executor: LocalExecutor, starts: dict[str, str]) -> None:
    """Start each trial on its slot and settle its reports until every one has exited."""
    for trial_id, gpu in starts.items():
        executor.apply(Start(trial_id, gpu), executor.now())
    running = set(starts)
    while running:
        for event in executor.next_events():
            executor.settled(event)
            if isinstance(event, TrialExited):
                assert event.succeeded, event
                running.discard(event.trial_id)


def test_an_ended_experiments_empty_worker_logs_go_and_one_with_output_stays(tmp_path: Path) -> None:
    """``quiet``'s workers wrote nothing (one of them gone before the experiment ended, with its slot); ``noisy``'s
    module writes a line as its worker imports it. The executor's own workers (no group) keep their logs."""
    (tmp_path / "noisy_trial.py").write_text(
        "import os\nfrom hermes import trial\nos.write(2, b'a warning as it imports\\n')\n\n"
        "def train(config):\n    trial.report(1, score=1.0)\n"
    )
    with LocalExecutor(tmp_path / "pool", slots=local_slots(cpu_slots=2), metric="score") as executor:
        first, second = executor.slots
        executor.submit("own", launch(tmp_path, None, "own"))
        executor.submit("quiet1", launch(tmp_path, "quiet", "quiet1"))
        executor.submit("quiet2", launch(tmp_path, "quiet", "quiet2"))
        executor.submit("noisy", TrialLaunch(1, function="noisy_trial:train", cwd=str(tmp_path), worker_group="noisy",
                                             directory=str(tmp_path / "noisy" / "n")))
        run(executor, {"own": first, "quiet1": second})
        run(executor, {"quiet2": first, "noisy": second})
        logs = executor.directory / "workers"
        name = {gpu: gpu.replace("/", "-") for gpu in (first, second)}
        quiet = [logs / f"quiet-{name[first]}.log", logs / f"quiet-{name[second]}.log"]
        noisy = logs / f"noisy-{name[second]}.log"
        own = [logs / f"{name[first]}.log", logs / f"{name[second]}.log"]
        executor.remove_gpu(second)  # quiet's worker there ends with it, before its experiment does
        assert all(log.exists() and log.stat().st_size == 0 for log in [*quiet, *own])
        forgotten = executor.end_worker_group("quiet")
        executor.end_worker_group("noisy")
        assert not any(log.exists() for log in quiet)
        assert noisy.read_text() == "a warning as it imports\n"
        assert all(log.exists() for log in own)
        assert forgotten == ["quiet1", "quiet2"]


def test_the_events_of_an_ended_experiments_trials_go_with_them(tmp_path: Path) -> None:
    """A report its worker sent as the experiment ended is read as the worker is collected: handed on, it named a
    trial forgotten here (an agent kept it awaiting an answer for good, the Ray driver had no trial of that id)."""
    with LocalExecutor(tmp_path / "pool", slots=local_slots(cpu_slots=1), metric="score") as executor:
        executor.submit("a", launch(tmp_path, "exp1", "a", budget=3))
        executor.apply(Start("a", next(iter(executor.slots))), executor.now())
        reported: list[Event] = []
        while not reported:
            reported = [event for event in executor.next_events() if isinstance(event, TrialReported)]
        executor.settled(reported[0])  # on to step 2, whose report it sends and waits on
        (worker,) = executor.launchers["warm"]._workers.values()
        assert select.select([worker.channel], [], [], 30)[0]  # that report waits in the pipe, unread
        forgotten = executor.end_worker_group("exp1")
        assert executor.next_events() == []
        assert forgotten == ["a"]
