"""What `hermes run` said, and took, where it said or took the wrong thing: text reported as a metric was read as a
number; out of open files, it advised a change that a rerun refuses; a trial stopped as it was suspending got no end
line; a rerun of an experiment whose time budget was spent said nothing of why nothing ran. Real `hermes run`
processes, real stores; the printer with the real core's events and decisions."""

from __future__ import annotations

import json
import re
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

from hermes.cli import _progress_printer
from hermes.core.events import (
    ExperimentCancelled,
    NodeAdded,
    PeriodElapsed,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.experiment import load_spec
from hermes.session import BUDGET_SPENT, ExperimentSession
from tests.test_run import (
    RUN_TIMEOUT,
    TESTS,
    environment,
    hermes,
    hermes_command,
    run_ok,
    search,
    spec_of,
    write_spec,
)

TEXT_TRIAL = '''
import numpy as np
from hermes import trial


def train(config):
    score = {"text": "0.5", "numpy text": np.str_("0.5"), "number": 0.5}[config["score"]]
    for step in range(1, trial.budget() + 1):
        trial.report(step, score=score, phase="0007", tag="warmup")
'''


def stored_metrics(folder: Path) -> list[dict[str, float]]:
    with sqlite3.connect(folder / "runs" / "hermes.db") as store:
        return [json.loads(values) for (values,) in store.execute("SELECT metric_values FROM metrics ORDER BY id")]


def test_text_reported_as_a_metric_is_no_number_where_a_printed_one_is(tmp_path: Path) -> None:
    """float() read "0.5", " 1e3 ", "1_000" and "inf": the objective as text completed its trial, and a side metric
    "0007" was stored as 7.0, where docs/trials.md says text fails the trial as the objective, and is left out
    otherwise. A program's printed line, read by trial.metrics_regex, is text that holds a number, and stays one."""
    (tmp_path / "textual.py").write_text(TEXT_TRIAL)
    spec = spec_of("textual", trial={"function": "textual:train", "workdir": str(tmp_path)},
                   search={"sampler": "list", "configs": [{"score": "text"}, {"score": "numpy text"},
                                                          {"score": "number"}]},
                   budget={"steps": 1}, policy={"name": "fifo"})
    ran = hermes("run", str(write_spec(tmp_path / "function", spec)), "--no-live", cwd=tmp_path / "function")
    ends = sorted(line.split("] ", 1)[1] for line in ran.stdout.splitlines() if line.startswith("["))
    failed = "failed before its first report (uncaught TypeError: metric 'score' must be a number, got"
    assert len(ends) == 3 and ends[2] == "trial 2 completed at step 1, score 0.5", ran.stdout
    assert ends[0].startswith(f"trial 0 {failed} str '0.5' (text: report the number, float(text))"), ran.stdout
    assert ends[1].startswith(f"trial 1 {failed} str_ np.str_('0.5') (text: "), ran.stdout  # the line is cut after
    assert stored_metrics(tmp_path / "function") == [{"score": 0.5}]  # "0007" and "warmup" left out

    spec = spec_of("printed", trial={"command": f"{sys.executable} trials/printer.py --steps 2 --rate {{rate}} --sleep 0",
                                     "metrics_regex": r"loss (?P<loss>\S+) score (?P<score>\S+)",
                                     "workdir": str(TESTS)},
                   search={"sampler": "list", "configs": [{"rate": 1.0}]}, budget={"steps": 2}, policy={"name": "fifo"})
    run_ok(write_spec(tmp_path / "command", spec))
    assert stored_metrics(tmp_path / "command") == [{"score": 0.6321, "loss": 0.3679}, {"score": 0.8647, "loss": 0.1353}]


def test_out_of_open_files_it_advises_a_limit_that_lets_the_rerun_go_on_and_max_pending_as_a_new_experiment(
    tmp_path: Path,
) -> None:
    """It said "keep fewer trials under way (search.max_pending), then run ... again to continue", which the rerun
    refuses: search.max_pending may not change on a rerun. Both ways it says now work."""
    spec = spec_of("few-files", search=search(8, 0, 0.01), budget={"steps": 3},
                   trial={"command": f"{sys.executable} trials/printer.py --steps 3 --rate {{rate}} --sleep 0.01",
                          "metrics_regex": r"score (?P<value>\S+)", "workdir": str(TESTS)},
                   resources={"gpus": "none", "cpu_slots": 8})
    path = write_spec(tmp_path, spec)

    def run_with(limit: int, *args: str) -> str:
        ran = subprocess.run(
            hermes_command("run", str(path), "--no-live", *args), check=False, cwd=tmp_path, env=environment(),
            capture_output=True, text=True, timeout=RUN_TIMEOUT,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
        return f"{ran.returncode}\n{ran.stdout}{ran.stderr}"

    stopped = run_with(32)
    advice = re.search(r"\ninterrupted: raise the limit \(`ulimit -n` for open files\) from 32 to (\d+) or so, for "
                       r"up to 8 trials under way \(`ulimit -n \1` in the shell that runs it; past its hard limit, 32, "
                       rf"only as root or in /etc/security/limits.conf\), then run `hermes run {path}` again to "
                       rf"continue; or lower search.max_pending in {path}, for fewer trials under way, and run it as a "
                       rf"new experiment \(`hermes run {path} --name few-files-2`\): a rerun of this one may not "
                       r"change it\n", stopped)
    assert stopped.startswith("2\n") and advice, stopped
    assert int(advice.group(1)) == 128  # 32 and 5 descriptors for each of 8 trials, rounded up
    assert "few-files: finished (continued)" in run_with(int(advice.group(1)))
    spec["search"]["max_pending"] = 2
    write_spec(tmp_path, spec)
    assert "few-files-2: finished;" in run_with(32, "--name", "few-files-2")


def test_a_trial_stopped_as_it_was_suspending_gets_its_end_line(tmp_path: Path) -> None:
    """The budget's end stops a trial between the report that suspends it and its suspension: the core ends it at its
    TrialSuspended, with no Stop decision then and no TrialExited, the two things the printer looked at."""
    spec = spec_of("suspending", resources={"gpus": "none", "cpu_slots": 1})
    session = ExperimentSession(load_spec(write_spec(tmp_path, spec)))
    said: list[str] = []
    printer = _progress_printer(session, said.append)
    try:
        for event in (NodeAdded(0.0, "local", ("local/cpu0",)), TrialSubmitted(0.0, "0", budget=5),
                      TrialSubmitted(0.0, "1", budget=5), TrialReported(0.4, "0", 1, 0.5),
                      PeriodElapsed(0.5),  # rr: trial 0 is to make way for trial 1
                      ExperimentCancelled(0.6, BUDGET_SPENT), TrialSuspended(0.7, "0", 1)):
            printer(event, session.scheduler.handle(event))
            printer.flush()
    finally:
        session.abandon()
        session.store.close()
    assert said == ["[     0.6s] trial 1 stopped before its first report",
                    "[     0.7s] trial 0 stopped at step 1, score 0.5"]


def test_a_rerun_its_spent_time_budget_keeps_from_running_says_so(tmp_path: Path) -> None:
    """More trials do not lift a spent max_time: the rerun ran nothing and said only "finished (continued)"."""
    spec = spec_of("spent", search={**search(2, 0, 0.2), "max_time": 1}, budget={"steps": 50},
                   resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    assert f"spent: finished: {BUDGET_SPENT}; " in run_ok(path).stdout
    spec["search"]["trials"] = 5
    write_spec(tmp_path, spec)
    assert (f"spent: finished (continued): {BUDGET_SPENT}, so nothing ran: raise search.max_time to run more; "
            in run_ok(path).stdout)
