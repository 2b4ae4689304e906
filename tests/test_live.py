"""The live view of `hermes run` (hermes.live), drawn from a real scheduling core into a recording console the
size of a terminal, as Rich's Live draws it (LiveRender: what does not fit the height is cut, "..." at the end)."""

from __future__ import annotations

import fcntl
import io
import math
import os
import re
import struct
import subprocess
import termios
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console
from rich.live_render import LiveRender

from hermes.core.decisions import Decision
from hermes.core.events import (
    Event,
    ExperimentCancelled,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    SubmissionsClosed,
    SubmissionsReopened,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import SchedulingPolicy
from hermes.core.scheduler import Objective, Scheduler
from hermes.core.states import TrialState
from hermes.live import Eta, LiveView, Work, estimate_eta
from hermes.policies.fifo import FifoPolicy
from hermes.policies.rr import RoundRobinPolicy
from hermes.search.budget import Budget

GPUS = ("gpu0", "gpu1")


class Run:
    """A core on one node of two GPUs, driven by hand, and the clock of its last event; ``listeners`` are told each
    event and its decisions, as the engine tells them."""

    def __init__(self, mode: str = "max", policy: SchedulingPolicy | None = None) -> None:
        self.scheduler = Scheduler(policy or FifoPolicy(), objective=Objective(mode))
        self.mode = mode
        self.now = 0.0
        self.listeners: list[Callable[[Event, list[Decision]], None]] = []
        self(NodeAdded(0.0, "node", GPUS))

    def __call__(self, event: Event) -> None:
        self.now = event.at
        decisions = self.scheduler.handle(event)
        for listener in self.listeners:
            listener(event, decisions)

    def submit(self, trial_id: str, budget: int, at: float = 0.0) -> None:
        self(TrialSubmitted(at, trial_id, budget))

    def train(self, trial_id: str, values: list[float], start: float = 0.0, seconds: float = 0.5) -> None:
        """Reports ``values`` at its next steps, ``seconds`` apart, from ``start``."""
        first = self.scheduler.trials[trial_id].step + 1
        for index, value in enumerate(values, start=1):
            self(TrialReported(start + index * seconds, trial_id, first + index - 1, value))

    def finish(self, trial_id: str, at: float, succeeded: bool = True) -> None:
        self(TrialExited(at, trial_id, succeeded, None if succeeded else "boom"))

    def draw(self, width: int = 120, height: int = 60, budget: Budget | None = None, in_flight: int | None = None
             ) -> str:
        console = Console(width=width, height=height, record=True, file=io.StringIO(), color_system=None)
        view = LiveView("exp", "score", self.mode, self.scheduler, lambda: self.now, console, budget=budget,
                        in_flight=in_flight)
        view._take()
        console.print(LiveRender(view))
        return console.export_text()

    def follow(self, budget: Budget | None = None, height: int = 60) -> LiveView:
        """A view told every event from now on, as `hermes run`'s is."""
        console = Console(width=120, height=height, record=True, file=io.StringIO(), color_system=None)
        view = LiveView("exp", "score", self.mode, self.scheduler, lambda: self.now, console, budget=budget)
        view._take()
        self.listeners.append(view)
        return view


def drawn(view: LiveView) -> str:
    """The frame of a snapshot taken now."""
    view._take()
    view.console.print(LiveRender(view))
    return view.console.export_text()


def header(text: str) -> str:
    return text.splitlines()[0]


def eta_of(text: str) -> str | None:
    found = re.search(r"ETA (\S+(?: \S+)?(?: \(\w+\))?)  ", header(text))
    return found.group(1) if found else None


def seconds(duration: str) -> int:
    minutes, secs = re.search(r"(\d+):(\d\d)", duration).groups()
    return int(minutes) * 60 + int(secs)


# ---------------------------------------------------------------------- 1. the ETA
def test_the_eta_of_one_trial_is_its_own_time_left_however_many_gpus_there_are() -> None:
    """One trial of 40 steps at 0.5 s a step, at step 10 on two GPUs: 15 s are left, not 7.5."""
    run = Run()
    run.submit("0", 40)
    run(SubmissionsClosed(0.0))
    run.train("0", [0.1 * step for step in range(1, 11)])
    assert run.now == 5.0
    assert eta_of(run.draw()) == "~0:15"


def test_the_eta_counts_the_trials_the_searcher_has_not_asked_for_yet() -> None:
    """16 trials, two asked at a time (max_pending 2), of 5 steps at 0.2 s: after the first second, 14 trials of
    1 s are still to come, besides the two at their last step, on two GPUs: 7.2 s, not 0."""
    run = Run()
    for trial_id in ("00", "01"):
        run.submit(trial_id, 5)
    for trial_id in ("00", "01"):
        run.train(trial_id, [0.1, 0.2, 0.3, 0.4], seconds=0.2)
    text = run.draw(budget=Budget(trials=16))
    assert 7 <= seconds(eta_of(text)) <= 8 and "<=" not in eta_of(text), header(text)


def test_the_eta_runs_no_more_trials_at_once_than_the_searcher_keeps_in_flight() -> None:
    """max_pending 1 on two GPUs: the 14 trials still to come run one after another, 14 s, not 7."""
    run = Run()
    run.submit("00", 5)
    run.train("00", [0.1, 0.2, 0.3, 0.4, 0.5], seconds=0.2)
    run.finish("00", 1.0)
    text = run.draw(budget=Budget(trials=15), in_flight=1)
    assert 13 <= seconds(eta_of(text)) <= 15, header(text)


def test_a_time_budget_bounds_the_eta_and_says_so() -> None:
    """max_time 90 s and no count: the run ends when the time is up, whatever the trials would need."""
    run = Run()
    run.submit("0", 8)
    run.train("0", [0.1, 0.2], seconds=0.3)
    assert eta_of(run.draw(budget=Budget(seconds=90.0))) == "<= 1:29 (max_time)"
    run.train("0", [0.3, 0.4, 0.5], start=80.0, seconds=1.0)  # later: 7 s left of the budget
    assert eta_of(run.draw(budget=Budget(seconds=90.0))) == "<= 0:07 (max_time)"


def test_a_count_shorter_than_the_time_budget_gives_an_estimate() -> None:
    run = Run()
    run.submit("0", 8)
    run.train("0", [0.1, 0.2], seconds=0.5)
    assert eta_of(run.draw(budget=Budget(trials=1, seconds=3600.0))) == "~0:03"


def test_without_a_count_of_trials_or_a_time_budget_there_is_no_eta() -> None:
    run = Run()
    run.submit("0", 8)
    run.train("0", [0.1, 0.2], seconds=0.5)
    text = run.draw()  # the searcher may ask for more trials, how many is not known
    assert "ETA" not in header(text), header(text)
    run(SubmissionsClosed(run.now))  # the searcher asked its last: the trials left are all there is
    assert eta_of(run.draw()) == "~0:03"


def test_estimate_eta() -> None:
    def running(step: int, budget: int, pace: float = 1.0) -> Work:
        return Work(False, step, budget, step * pace, step * pace)

    # the longest trial, or all the work over the GPUs, whichever is longer
    assert estimate_eta([running(1, 11), running(9, 11)], gpus=2, to_ask=0) == Eta(10.0)
    assert estimate_eta([running(1, 11), running(1, 11), running(1, 11)], gpus=2, to_ask=0) == Eta(15.0)
    # a trial that has not reported goes at the mean pace; those to come cost what a trial has so far
    assert estimate_eta([running(2, 4, 2.0), Work(False, 0, 4, 0.0, 0.0)], gpus=2, to_ask=0) == Eta(8.0)
    assert estimate_eta([Work(True, 4, 4, 4.0, 4.0), running(2, 4)], gpus=1, to_ask=3) == Eta(14.0)
    # into a step since its last report: that time is spent
    assert estimate_eta([Work(False, 2, 4, 2.0, 2.5)], gpus=1, to_ask=0) == Eta(1.5)
    # nothing to go by
    assert estimate_eta([Work(False, 0, 4, 0.0, 0.0)], gpus=2, to_ask=0) is None
    assert estimate_eta([running(2, 4)], gpus=2, to_ask=None) is None
    assert estimate_eta([], gpus=2, to_ask=5) is None
    # a time budget: the time left at most, named
    assert estimate_eta([running(2, 4)], gpus=2, to_ask=None, time_left=30.0) == Eta(30.0, "max_time")
    assert estimate_eta([running(2, 4)], gpus=2, to_ask=100, time_left=30.0) == Eta(30.0, "max_time")
    assert estimate_eta([running(2, 4)], gpus=2, to_ask=0, time_left=30.0) == Eta(2.0)
    # a budget of GPU seconds: more trials come until it is spent
    assert estimate_eta([running(2, 4)], gpus=2, to_ask=None, gpu_seconds_left=10.0) == Eta(5.0)
    assert str(Eta(75.0)) == "~1:15" and str(Eta(5.0, "max_time")) == "<= 0:05 (max_time)"


# ---------------------------------------------------------------------- 2. the height of the terminal
def many(run: Run, pending: int = 40) -> None:
    """Two trials running, eight ended (the best, 07, at 0.8494), ``pending`` waiting."""
    for index in range(10 + pending):
        run.submit(f"{index:02d}", 5)
    at = 0.0
    for index in range(10):  # two at a time on the two GPUs
        trial_id = f"{index:02d}"
        values = [0.1 * (index % 8 + 1) + 0.0123456 * step for step in range(5 if index < 8 else 2)]
        run.train(trial_id, values, start=at)
        if index < 8:
            run.finish(trial_id, run.now)
        at = run.now if index % 2 else at


@pytest.mark.parametrize("height", [24, 30, 40, 18, 14])
def test_the_leaderboard_shows_in_a_terminal_of_any_height(height: int) -> None:
    run = Run()
    many(run)
    text = run.draw(width=80, height=height)
    lines = text.splitlines()
    assert len(lines) <= height and "..." not in lines[-1], text
    assert "leaderboard" in text
    board = text[text.index("leaderboard"):]
    assert re.search(r"│ 1 │ 07 +│ +0\.8494 │", board), text  # its winner


@pytest.mark.parametrize("height", [6, 5, 3])
def test_a_terminal_too_short_for_a_table_shows_the_best_in_a_line(height: int) -> None:
    """Every cell of the one-leader table was cut to "...": no best value showed."""
    run = Run()
    many(run)
    text = run.draw(width=80, height=height)
    assert "best score: 0.8494 (trial 07)" in text and "..." not in text, text


def test_the_last_frame_of_an_interrupted_run_shows_nothing_running() -> None:
    """After Ctrl-C it said "ETA ~0:04  GPUs 2/2 busy" while the store had the run interrupted, no GPU busy."""
    run = Run()
    many(run)
    console = Console(width=120, height=60, record=True, file=io.StringIO(), color_system=None)
    view = LiveView("exp", "score", "max", run.scheduler, lambda: run.now, console, budget=Budget(trials=50))
    with pytest.raises(KeyboardInterrupt):
        with view:
            raise KeyboardInterrupt
    console.print(LiveRender(view))
    top = [line for line in console.export_text().splitlines() if line.startswith("exp  ")][-1]  # the last frame's
    assert top.startswith("exp  interrupted  elapsed ") and "ETA" not in top and "GPUs 0/2 busy" in top, top


def test_the_rows_are_the_running_trials_then_the_best_ended_ones_and_the_pending_are_counted() -> None:
    run = Run()
    many(run)
    text = run.draw(width=80, height=24)
    table = text[text.index("\n") : text.index("leaderboard")]  # below the header
    assert "pending" not in table.replace("40 pending", ""), text
    states = re.findall(r"│ (\d\d) +│ (\w+) ", table)
    assert [state for _, state in states[:2]] == ["running", "running"], text
    assert states[2] == ("07", "completed"), text  # then the best ended one
    assert "40 pending" in table


# ---------------------------------------------------------------------- 3. the width of the terminal
@pytest.mark.parametrize("width", [40, 50, 60, 80])
def test_numbers_are_never_cut_in_a_narrow_terminal(width: int) -> None:
    run = Run()
    run.submit("0", 5)
    run.submit("1", 5)
    run.train("0", [0.123456, 0.654321])
    run.train("1", [12345.678, 0.000123456])
    text = run.draw(width=width, height=40)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width
    table = text[: text.index("leaderboard")]
    assert re.search(r"│ +0\.6543 │ +0\.6543 │", table), text  # last and best of trial 0
    assert re.search(r"│ +0\.0001235 │ +1\.235e\+04 │", table), text  # of trial 1
    board = text[text.index("leaderboard"):]
    assert "1.235e+04" in board and "0.6543" in board, text


# ---------------------------------------------------------------------- 4. a trial that reported only NaN (or inf)
@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_trial_that_reported_only_nan_has_no_best_and_is_no_leader(mode: str) -> None:
    """Its best showed "nan" and it led the leaderboard while no other trial had reported, where `hermes results`
    shows "-" and `hermes status` says "best none: every value reported is NaN or infinite"."""
    run = Run(mode)
    run.submit("0", 3)
    run.submit("1", 3)
    run.train("0", [math.nan, math.inf if mode == "max" else -math.inf])
    alone = run.draw()
    assert re.search(r"│ 0 +│ running +│ gpu\d +│ +2/3 │ +-?inf │ +- │", alone), alone
    assert not re.search(r"│ 1 │ 0 ", alone), alone  # the leaderboard is empty
    run.train("1", [0.5, 0.25])
    run.finish("0", run.now)
    text = run.draw()
    assert re.search(r"│ 0 +│ completed +│ +│ +2/3 │ +-?inf │ +- │", text), text
    best = "0.5" if mode == "max" else "0.25"
    assert re.search(rf"│ 1 │ 1 +│ +{best} │ running", text), text
    assert not re.search(r"│ 2 │ 0 ", text), text  # an ended trial without a best is no leader either
    run.train("1", [math.nan])  # a finite best stays
    text = run.draw()
    assert re.search(rf"│ 1 +│ running +│ gpu\d +│ +3/3 │ +nan │ +{best} │", text), text


def test_a_trial_that_never_reported_shows_a_dash() -> None:
    run = Run()
    run.submit("0", 3)
    text = run.draw()
    assert re.search(r"│ 0 +│ running +│ gpu\d +│ +0/3 │ +- │ +- │", text), text
    assert TrialState.RUNNING.value in text


# ---------------------------------------------------------------------- 5. hermes run: live or plain lines
def run_in(tmp_path: Path, name: str, stdout: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``hermes run`` of two trials, one of which fails at its first step, with its output to ``stdout``."""
    from tests.test_run import environment, hermes_command, search, spec_of, write_spec

    spec = spec_of(name, search=search(2, 0, 0.01, crash={"type": "grid", "values": ["none", "raise"]},
                                       crash_step={"type": "choice", "values": [1]}), budget={"steps": 3})
    return subprocess.Popen(hermes_command("run", str(write_spec(tmp_path, spec))), cwd=tmp_path,
                            env={**environment(), **env}, stdout=stdout, stderr=subprocess.STDOUT)


def test_output_to_a_file_is_plain_lines_whatever_rich_is_told(tmp_path: Path) -> None:
    """FORCE_COLOR (set by CI systems) made Rich call a file a terminal: the log filled with redrawn frames and
    had no line per trial."""
    log = tmp_path / "out.log"
    with open(log, "wb") as file:
        assert run_in(tmp_path, "to-file", file.fileno(), {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}).wait(120) == 0
    text = log.read_text()
    assert "\x1b[" not in text and " trial 0 completed at step 3, score " in text, text


def test_a_failed_trial_is_said_above_the_live_view(tmp_path: Path) -> None:
    """The view's table showed "failed", and its error was nowhere (the final table lists the best five)."""
    master, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    runner = run_in(tmp_path, "in-a-terminal", terminal, {"TERM": "xterm"})
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    assert runner.wait(120) == 0
    text = output.decode(errors="replace")
    assert "\x1b[" in text, text  # drawn live
    assert re.search(r"trial 1 failed before its first report \(uncaught RuntimeError", text), text
    assert " trial 0 completed at step" not in text  # the view says that much


# ---------------------------------------------------------------------- 6. a view that follows the run
# The view keeps what it shows as events come, and looks again only at the trials that may have changed: those an
# event or its decisions name, those holding a GPU, and the new ones. A view that reads the core afresh
# (``Run.draw``) must draw the same frame.
def test_a_trial_suspended_for_another_is_shown_suspended() -> None:
    """Round robin, turns of 1 s: the period's event names no trial, its decision suspends trial 0 for trial 2."""
    run = Run(policy=RoundRobinPolicy(period=1.0))
    view = run.follow(Budget(trials=3))
    for trial_id in ("0", "1", "2"):
        run.submit(trial_id, 50)
    run.train("0", [0.3])
    run.train("1", [0.2])
    run(PeriodElapsed(1.5))
    text = drawn(view)
    assert re.search(r"│ 0 +│ suspending +│ gpu\d +│ +1/50 │", text), text
    assert text == run.draw(budget=Budget(trials=3))
    run(TrialSuspended(1.6, "0", 1))  # its GPU goes to trial 2
    text = drawn(view)
    assert re.search(r"│ 0 +│ suspended +│ +│ +1/50 │", text) and re.search(r"│ 2 +│ running +│ gpu\d", text), text
    assert "GPUs 2/2 busy" in header(text) and text == run.draw(budget=Budget(trials=3))
    run(PeriodElapsed(3.0))  # trial 2's turn is over (before its first report): trial 0 runs again
    run(TrialSuspended(3.1, "2", 0))
    text = drawn(view)
    assert re.search(r"│ 0 +│ running +│ gpu\d", text) and re.search(r"│ 2 +│ suspended +│ +│ +0/50 │ +- │", text), text
    assert text == run.draw(budget=Budget(trials=3))


def test_trials_that_lose_their_gpus_with_their_node_are_shown_waiting() -> None:
    """A lost node takes its trials' GPUs: its event names none of them, and nothing is decided about them."""
    run = Run()
    view = run.follow()
    run.submit("0", 5)
    run.submit("1", 5)
    run.train("0", [0.3, 0.4])
    run.train("1", [0.2])
    drawn(view)
    run(NodeRemoved(2.0, "node"))
    text = drawn(view)
    assert "GPUs 0/0 busy  suspended 2" in header(text), text
    # back to their last checkpoints: none, step 0
    assert re.search(r"│ 0 +│ suspended +│ +│ +0/5 │ +0\.4 │", text), text
    assert re.search(r"│ 1 +│ suspended +│ +│ +0/5 │", text), text
    assert text == run.draw()


def test_a_failed_trial_is_counted_and_shown_with_the_ended_ones_but_is_no_leader() -> None:
    """Its best is no result (as in `hermes results`): the leaderboard and the best line named it first."""
    run = Run()
    view = run.follow(Budget(trials=3))
    for trial_id in ("0", "1", "2"):
        run.submit(trial_id, 4)
    run.train("0", [0.5, 0.9])
    run.train("1", [0.7])
    run.finish("0", run.now, succeeded=False)  # its GPU goes to trial 2
    text = drawn(view)
    assert "GPUs 2/2 busy  failed 1  running 2" in header(text), header(text)  # states in the order of their trials
    assert re.search(r"│ 0 +│ failed +│ +│ +2/4 │ +0\.9 │ +0\.9 │", text), text
    assert re.search(r"│ 1 │ 1 +│ +0\.7 │ running", text), text  # the leaderboard's first
    assert not re.search(r"│ \d │ 0 +│ +0\.9 │ failed", text), text
    assert text == run.draw(budget=Budget(trials=3))


def test_trials_that_come_after_the_view_started_are_shown_with_or_without_an_event() -> None:
    """A session replays its log into the core after the view's first look, and tells the view nothing of it; the
    trials submitted afterwards come with their events."""
    run = Run()
    view = run.follow()
    run.listeners.remove(view)  # the replay
    for trial_id in ("0", "1", "2"):
        run.submit(trial_id, 3)
    run.train("0", [0.1, 0.2, 0.3])
    run.finish("0", run.now)
    run.listeners.append(view)
    run.submit("3", 3, at=run.now)
    run.train("1", [0.6], start=run.now)
    text = drawn(view)
    assert "completed 1  running 2  pending 1" in header(text), header(text)
    assert re.search(r"│ 0 +│ completed +│ +│ +3/3 │", text) and "1 pending" in text, text
    assert text == run.draw()


def test_trials_that_a_larger_budget_runs_again_are_shown_once_as_they_are_now() -> None:
    """A rerun with a larger budget revives the trials its spent budget stopped: the view kept their "stopped" rows
    too (each trial listed and ranked twice, "stopped 0" in the header, the ETA's sums counting them twice), and a
    revived trial that no decision named (one still pending) stayed "stopped"."""
    budget = Budget(trials=4)
    run = Run()
    view = run.follow(budget)
    for trial_id in ("0", "1", "2"):
        run.submit(trial_id, 3)
    run.train("0", [0.5])
    run.train("1", [0.7])
    run(ExperimentCancelled(1.0, "max_time"))  # trial 2 never ran
    run.finish("0", 1.1)
    run.finish("1", 1.1)
    assert "stopped 3" in header(drawn(view))
    run(SubmissionsReopened(2.0))  # trials 0 and 1 start again from step 0, trial 2 waits
    text = drawn(view)
    assert "running 2  pending 1" in header(text) and "stopped" not in text, text
    assert len(re.findall(r"│ [01] +│ running +│ gpu\d +│ +0/3 │", text)) == 2, text
    assert text == run.draw(budget=budget)
    for trial_id in ("0", "1"):
        run.train(trial_id, [0.6, 0.8, 0.9], start=run.now)
        run.finish(trial_id, run.now)
    run.train("2", [0.4], start=run.now)
    text = drawn(view)
    assert "completed 2  running 1" in header(text), header(text)
    assert len(re.findall(r"│ [012] +│ (?:completed|running) ", text)) == 3 and "stopped" not in text, text
    assert text == run.draw(budget=budget)  # the ETA too: of three trials, not five


def test_the_last_frame_of_an_interrupted_run_that_the_view_followed_shows_nothing_running() -> None:
    run = Run()
    console = Console(width=120, height=60, record=True, file=io.StringIO(), color_system=None)
    view = LiveView("exp", "score", "max", run.scheduler, lambda: run.now, console, budget=Budget(trials=50))
    run.listeners.append(view)
    with pytest.raises(KeyboardInterrupt), view:
        many(run)
        raise KeyboardInterrupt
    console.print(LiveRender(view))
    text = console.export_text()
    top = [line for line in text.splitlines() if line.startswith("exp  ")][-1]  # the last frame's
    assert top.startswith("exp  interrupted  elapsed ") and "ETA" not in top and "GPUs 0/2 busy" in top, top
    assert "completed 8  interrupted 2  pending 40" in top, top  # as `hermes status` says: "running 2" before
    frame = text[text.rindex("exp  interrupted"):]
    assert "running" not in frame and "local/" not in frame, frame  # nor on their GPUs in its rows
    assert re.search(r"│ 1 │ 07 +│ +0\.8494 │ completed", text), text


def test_a_metrics_name_shows_as_written_not_as_markup_or_emoji() -> None:
    """Titles and headers were Rich markup: ":100:" became an emoji, and a trailing backslash was doubled."""
    run = Run()
    many(run)
    console = Console(width=160, height=60, record=True, file=io.StringIO(), color_system=None)
    text = drawn(LiveView("exp", "top:100:acc\\", "max", run.scheduler, lambda: run.now, console))
    assert "leaderboard (best top:100:acc\\, max)" in text and "best top:100:acc\\ " in text, text


def test_a_frame_draws_its_snapshot_whatever_the_core_does_after() -> None:
    """Rich's thread draws a snapshot while the engine's thread goes on: nothing a snapshot holds changes after it
    is taken (the ranking of the ended trials is copied before a trial joins it)."""
    run = Run()
    view = run.follow()
    many(run)
    first = drawn(view)
    taken = view._snapshot
    run.finish("08", run.now)  # trials 08 and 09 end, 10 and 11 start
    run.finish("09", run.now)
    latest = drawn(view)
    assert "completed 10" in header(latest), header(latest)
    view._snapshot = taken  # drawn again, as Rich's thread might have while the engine's took the latest
    view.console.print(LiveRender(view))
    assert view.console.export_text() == first


def allocated(action: Callable[[], object]) -> int:
    """The most memory, in bytes, that ``action`` held at once: what it costs, whatever the machine's speed."""
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_snapshot_and_a_frame_cost_what_changed_not_every_trial() -> None:
    """A snapshot built a row and an ETA record of every trial, and a frame sorted them all twice: at 10,000 trials
    58 ms and 112 ms of the engine's process, whose run went a third slower; a 5,000-trial run in a terminal did not
    finish in 10 minutes. A snapshot now holds about as much after 3,000 trials as after 300, and a frame too."""
    costs = []
    for trials in (300, 3000):
        run = Run()
        view = run.follow(height=24)
        for index in range(trials):
            run.submit(f"{index:04d}", 1 if index < trials - 10 else 5)
        for index in range(trials - 10):  # one report each, and the end
            run(TrialReported(run.now + 0.5, f"{index:04d}", 1, index * 7919 % 1000 / 1000))
            run.finish(f"{index:04d}", run.now)
        drawn(view)  # Rich's caches filled
        running = [trial.trial_id for trial in run.scheduler.trials.values() if trial.state.holds_gpu]
        run.train(running[0], [0.5, 0.6], start=run.now)
        snapshot = allocated(view._take)
        frame = allocated(partial(view.console.print, LiveRender(view)))
        costs.append((snapshot, frame))
    (_, small_frame), (snapshot, frame) = costs
    assert snapshot < 32 * 1024, costs  # a row and a record of each trial: 680 KB
    assert frame - small_frame < 32 * 1024, costs  # every row sorted, twice: 100 KB more


# ---------------------------------------------------------------------- 7. names that look like Rich markup
@pytest.mark.parametrize("width", [120, 50])
@pytest.mark.parametrize("metric", ["loss[/train]", "acc [val]"])
def test_names_in_brackets_are_shown_as_they_are(metric: str, width: int) -> None:
    """A metric named ``loss[/train]`` crashed `hermes run` in a terminal (rich.errors.MarkupError, before any trial
    ran), and ``acc [val]`` showed as ``acc``: titles, headers and str cells are Rich markup. A GPU's name too."""
    scheduler = Scheduler(FifoPolicy(), objective=Objective("min"))
    scheduler.handle(NodeAdded(0.0, "node", ("gpu[b]0", "gpu[b]1")))
    for trial_id in ("0", "1"):
        scheduler.handle(TrialSubmitted(0.0, trial_id, 3))
    scheduler.handle(TrialReported(1.0, "0", 1, 0.5))
    console = Console(width=width, height=40, record=True, file=io.StringIO(), color_system=None)
    view = LiveView("exp [x]", metric, "min", scheduler, lambda: 1.0, console)
    view._take()
    console.print(LiveRender(view))
    text = console.export_text()
    assert header(text).startswith("exp [x]  "), text
    assert f"leaderboard (best {metric}, min)" in text, text
    if width == 120:
        assert f"last {metric}" in text and f"best {metric}" in text and "gpu[b]0" in text, text
    else:  # the narrow layout names the metric in its title
        assert f"trials ({metric})" in text, text
