"""Reliability of ``hermes run`` (issue 15): one runner per storage dir, no report stored twice
whatever the moment of a crash, and a full disk that leaves the experiment interrupted, not running.

Real runners, real trial processes, the real store, as in test_run.py (whose helpers these are).
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from hermes.core.decisions import Resume, Start
from hermes.core.events import NodeAdded, TrialReported, TrialSubmitted
from hermes.core.states import TrialState
from hermes.experiment import load_spec
from hermes.report import open_store, pick_experiment
from hermes.store import ExperimentStatus, SqlStore, TrialRecord
from hermes.store.lock import LOCK_FILE, holder
from test_run import (
    RUN_TIMEOUT,
    TESTS,
    count_reports,
    count_rows,
    environment,
    hermes,
    hermes_command,
    load_view,
    run_ok,
    search,
    spec_of,
    trial_processes,
    wait_for,
    write_spec,
)


def duplicates(database: Path) -> list[tuple[str, int, int]]:
    """(trial, step, count) of every step the metrics table holds more than once."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        return connection.execute(
            "SELECT trial_id, step, count(*) FROM metrics GROUP BY experiment_id, trial_id, step HAVING count(*) > 1"
        ).fetchall()


def test_a_second_runner_on_the_same_storage_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    budget = 6
    # Each trial waits in its checkpoint of step 4 until the test lets it go: the first runner runs on until it is
    # killed, however slow the checks below (under load, 10 s of sleeping steps were over before them).
    spec = spec_of("two-runners", search=search(2, 0, 0.02, hold_save={"type": "choice", "values": [4]}),
                   budget={"steps": budget})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    first = subprocess.Popen(
        hermes_command("run", str(path), "--no-live"),
        cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: (holder(storage / LOCK_FILE) or {}).get("pid") == first.pid, RUN_TIMEOUT,
                 "the first runner to lock the storage dir")
        second = hermes("run", str(path), "--no-live", cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        assert f"{storage} is in use by another runner, pid {first.pid} on " in second.stderr, second.stderr
        assert "running experiment 'two-runners'" in second.stderr and f"hermes.cli run {path}" in second.stderr
        wait_for(lambda: count_reports(storage / "hermes.db") >= 3, 60, "3 reports")
        status = hermes("status", str(storage), cwd=tmp_path)
        assert f"two-runners (id 1): running, by pid {first.pid} on " in status.stdout, status.stdout
        listed = hermes("list", str(storage), cwd=tmp_path).stdout  # a line each: the pid, not the command line
        assert f"running (pid {first.pid})" in listed and "hermes.cli" not in listed, listed
        first.send_signal(signal.SIGKILL)  # the kernel releases its lock
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    wait_for(lambda: not trial_processes(storage), 5, "the killed runner's trials to die")
    status = hermes("status", str(storage), cwd=tmp_path)
    assert "two-runners (id 1): running when its runner ended without a word (killed?)" in status.stdout, status.stdout

    for trial in ("0", "1"):  # the rerun's checkpoints of step 4 go on at once
        (storage / "two-runners" / "trials" / trial / "go-4").touch()
    assert "(continued)" in run_ok(path).stdout
    view, _ = load_view(storage)
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2
    assert len(view.metrics) == 2 * budget and not duplicates(storage / "hermes.db")


# Where the runner dies, the n-th time it passes there: inside the transaction that records a report
# (between its metrics and its event), or after an event is committed, before anything acted on it.
@pytest.mark.parametrize("crash_at", ["report:4", "report:13", "recorded:6", "recorded:16"])
def test_a_runner_dying_between_writes_never_stores_a_report_twice(tmp_path: Path, crash_at: str) -> None:
    budget, trials = 6, 4
    spec = spec_of(
        f"crash-{crash_at.replace(':', '-')}",
        search=search(trials, 1, 0.01),
        budget={"steps": budget},
        storage={"dir": "runs", "checkpoint_every": 4},  # rollbacks: steps past a checkpoint are reported again
    )
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    crashed = subprocess.run(
        hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env={**environment(), "HERMES_CRASH_AT": crash_at},
        capture_output=True, text=True, timeout=90,
    )
    assert crashed.returncode == 137, crashed.stderr
    wait_for(lambda: not trial_processes(storage), 5, "the trials of the dead runner to die")
    before = count_reports(storage / "hermes.db")

    # A second crash while catching up, then the run that completes.
    again = subprocess.run(
        hermes_command("run", str(path), "--no-live"), cwd=tmp_path,
        env={**environment(), "HERMES_CRASH_AT": "report:3"}, capture_output=True, text=True, timeout=90,
    )
    assert again.returncode == 137, again.stderr
    wait_for(lambda: not trial_processes(storage), 5, "the trials of the dead runner to die")
    run_ok(path)

    store = open_store(storage)
    try:
        experiment = pick_experiment(store, None)
        events = store.events(experiment.experiment_id)
        metrics = store.metrics(experiment.experiment_id)
        trial_records = store.trials(experiment.experiment_id)
    finally:
        store.close()
    assert experiment.status is ExperimentStatus.FINISHED and before > 0
    assert all(trial.state is TrialState.COMPLETED for trial in trial_records) and len(trial_records) == trials
    assert not duplicates(storage / "hermes.db")
    steps = Counter((m.trial_id, m.step) for m in metrics)
    assert set(steps) == {(t.trial_id, step) for t in trial_records for step in range(1, budget + 1)}
    reported = Counter((e.trial_id, e.step) for e in events if isinstance(e, TrialReported))
    assert set(reported) == set(steps)  # each report in the log has its metrics, once


def test_a_runner_killed_with_slots_free_is_continued_with_each_trial_run_once(tmp_path: Path) -> None:
    """Two trials on three slots, one of them completed, the runner killed (SIGKILL): the rerun loses the old run's
    nodes, then runs the other trial once more from its checkpoint. On Ray (tests/test_ray_engine.py), where a
    run's nodes keep their names, losing them one at a time restarted a trial on an old node not lost yet, and then
    once more: its steps were stored twice or the rerun crashed."""
    budget = 8
    spec = spec_of("killed-with-slots-free", search={"configs": [{"rate": 0.5, "sleep": 0.01},
                                                                 {"rate": 0.3, "sleep": 0.1}]},
                   budget={"steps": budget}, resources={"gpus": "none", "cpu_slots": 3})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    database = storage / "hermes.db"

    def slow_one_midway() -> bool:
        completed = count_rows(database, "SELECT count(*) FROM trials WHERE state = 'completed'")
        return completed == 1 and count_rows(database, "SELECT count(*) FROM metrics WHERE trial_id = '1'") >= 2

    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(slow_one_midway, 60, "a trial completed and the other midway")
        runner.send_signal(signal.SIGKILL)
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    wait_for(lambda: not trial_processes(storage), 5, "the trials of the killed runner to die")

    assert "(continued)" in run_ok(path).stdout
    view, _ = load_view(storage)
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2
    steps = Counter((m.trial_id, m.step) for m in view.metrics)
    assert steps == Counter({(trial, step): 1 for trial in ("0", "1") for step in range(1, budget + 1)}), steps


def test_a_log_of_a_run_on_several_nodes_is_continued_on_this_machine_without_its_old_nodes(tmp_path: Path) -> None:
    """The log of a run over two nodes (a Ray driver's: nodes a and b), its trial running on a, continued by a runner
    whose nodes are others (here: this machine's). The rerun lost the old nodes one at a time: losing a placed the
    trial on b, not lost yet, and the new executor was told to run it on a GPU it does not have ("unknown GPU
    b/cpu0"; on the same Ray cluster, where b is still there, the trial ran twice)."""
    budget = 4
    spec = spec_of("several-nodes", search={"configs": [{"rate": 0.5, "sleep": 0.01}]}, budget={"steps": budget},
                   resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    storage.mkdir()
    params = {"rate": 0.5, "sleep": 0.01}
    store = SqlStore(f"sqlite:///{storage / 'hermes.db'}")
    try:
        experiment = store.create_or_open_experiment("several-nodes", load_spec(path).model_dump(mode="json"))
        running = TrialRecord("0", params, TrialState.RUNNING, budget, 0.1, gpu="a/cpu0", started_at=0.1)
        store.record_events(experiment, [
            (NodeAdded(0.0, "a", ("a/cpu0",)), [], []),
            (NodeAdded(0.0, "b", ("b/cpu0",)), [], []),
            (TrialSubmitted(0.1, "0", budget, params), [Start("0", "a/cpu0")], [running]),
        ])
    finally:
        store.close()

    assert "(continued)" in run_ok(path).stdout
    view, decisions = load_view(storage)
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED]
    assert [(d.trial_id, d.gpu) for d in decisions if isinstance(d, (Start, Resume))] == [
        ("0", "a/cpu0"), ("0", "local/cpu0")]
    assert sorted(m.step for m in view.metrics) == list(range(1, budget + 1))


def test_an_engine_that_cannot_start_leaves_the_experiment_interrupted_and_takes_a_corrected_spec(
    tmp_path: Path
) -> None:
    """An engine that fails as it starts, once the store has the experiment (a Ray node whose agent cannot write
    storage.uri; here the experiment's folder is a link to itself): the experiment was left "running when its
    runner died", and the corrected spec was refused as one that "already exists with a different spec", though
    nothing of it had run. The spec check refuses such a folder; here it turns into a loop after the check."""
    from hermes.session import ExperimentSession

    spec = spec_of("cannot-start", search=search(2, 0, 0.01), budget={"steps": 3})
    path = write_spec(tmp_path, spec)
    session = ExperimentSession(load_spec(path))
    folder = tmp_path / "runs" / "cannot-start"
    shutil.rmtree(folder)  # made by the session for its lock, which stays held on the open file
    folder.symlink_to(folder.name)
    with pytest.raises(RuntimeError, match="Symlink loop"):
        session.run()
    assert "cannot-start (id 1): interrupted" in hermes("status", "runs", cwd=tmp_path).stdout

    folder.unlink()
    write_spec(tmp_path, {**spec, "metric": {"name": "total", "mode": "max"}})
    assert "cannot-start: finished" in run_ok(path).stdout
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.spec["metric"] == {"name": "total", "mode": "max"}
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2


def in_small_filesystem(tmp_path: Path, script: str, size: str, small: Path | None = None
                        ) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python) in a mount namespace where ``small`` (default ``tmp_path/disk``) is a tmpfs of
    ``size``."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small filesystem")
    small = small or tmp_path / "disk"
    small.mkdir(parents=True)
    (tmp_path / "scenario.py").write_text(script)
    command = f"mount -t tmpfs -o size={size} tmpfs {small} && exec {sys.executable} {tmp_path / 'scenario.py'}"
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -rm is not allowed here: {probe.stderr.decode().strip()}")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", command], cwd=tmp_path, env=environment(), capture_output=True, text=True,
        timeout=180,
    )


FULL_DISK = """
import json, subprocess, sys, time
from pathlib import Path
from hermes.report import open_store, pick_experiment

disk, spec, small = Path({disk!r}), {spec!r}, Path({small!r})
run = {command!r}
runner = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.monotonic() + 60
def reports():
    import sqlite3
    try:
        with sqlite3.connect(f"file:{{disk / 'runs' / 'hermes.db'}}?mode=ro", uri=True) as connection:
            return connection.execute("SELECT count(*) FROM metrics").fetchone()[0]
    except sqlite3.Error:
        return 0
while reports() < 4 and time.monotonic() < deadline:
    time.sleep(0.01)
filler = small / "filler"
with open(filler, "wb", buffering=0) as file:  # the disk is full from here on; unbuffered: closing writes nothing
    try:
        while file.write(bytes(1 << 16)):
            pass
    except OSError:
        pass
out, err = runner.communicate(timeout=60)
store = open_store(disk / "runs")
first = pick_experiment(store, None).status.value
store.close()
filler.unlink()
rerun = subprocess.run(run, capture_output=True, text=True, timeout=90)
store = open_store(disk / "runs")
experiment = pick_experiment(store, None)
trials = store.trials(experiment.experiment_id)
metrics = store.metrics(experiment.experiment_id)
store.close()
print(json.dumps({{
    "code": runner.returncode, "stderr": err, "status": first, "rerun": rerun.returncode, "rerun_err": rerun.stderr,
    "final": experiment.status.value, "states": [t.state.value for t in trials],
    "steps": sorted([m.trial_id, m.step] for m in metrics),
}}))
"""


@pytest.mark.parametrize("writer", ["store", "checkpoint", "torch-like checkpoint"])
def test_a_full_disk_interrupts_the_run_and_a_rerun_with_room_completes_it(tmp_path: Path, writer: str) -> None:
    """The disk fills while the runner writes its store (the store and the trials' checkpoints on
    one small filesystem), or while a trial writes its checkpoint (big ballast in each); torch.save says
    so with a RuntimeError, which was counted as the trial's crash (and failed it, its retries used up)."""
    budget = 6
    disk = tmp_path / "disk"
    space = search(3, 0, 0.05, ballast_kb={"type": "choice", "values": [0 if writer == "store" else 64]},
                   ballast_error={"type": "choice", "values": ["runtime" if writer.startswith("torch") else "os"]})
    spec = spec_of(f"full-{writer.split()[0]}", search=space, budget={"steps": budget},
                   storage={"dir": str(disk / "runs"), "checkpoint_every": 1, "allow_outside": True},
                   trial={"function": "trials.curve:train", "workdir": str(TESTS), "max_failures": 0})  # no crash
    path = write_spec(tmp_path, spec)
    command = [*hermes_command("run", str(path), "--no-live")]
    # torch's case: only the trials' checkpoints are full, so the store records what the trial's error does
    small = disk / "runs" / spec["name"] / "trials" if writer.startswith("torch") else disk
    script = FULL_DISK.format(disk=str(disk), spec=str(path), command=command, small=str(small))
    result = in_small_filesystem(tmp_path, script, "4m", small)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["code"] == 2, outcome["stderr"]
    assert "no space left" in outcome["stderr"] and "Traceback" not in outcome["stderr"], outcome["stderr"]
    assert outcome["status"] == "interrupted"
    assert outcome["rerun"] == 0, outcome["rerun_err"]
    assert outcome["final"] == "finished" and outcome["states"] == ["completed"] * 3
    assert outcome["steps"] == sorted([str(t), s] for t in range(3) for s in range(1, budget + 1))


FULL_FROM_THE_START = """
import json, subprocess
from pathlib import Path
disk = Path({disk!r})
(disk / "runs").mkdir()
with open(disk / "filler", "wb", buffering=0) as file:  # not a byte left
    try:
        while file.write(bytes(1 << 16)):
            pass
    except OSError:
        pass
run = subprocess.run({command!r}, capture_output=True, text=True, timeout=90)
print(json.dumps({{"code": run.returncode, "stderr": run.stderr}}))
"""


def test_a_run_on_a_disk_with_no_byte_left_says_so_without_a_traceback(tmp_path: Path) -> None:
    """Its runner lock, the first file it writes, raised ENOSPC as a traceback (exit 1)."""
    disk = tmp_path / "disk"
    spec = spec_of("full-start", search=search(1, 0, 0.01),
                   storage={"dir": str(disk / "runs"), "allow_outside": True})
    path = write_spec(tmp_path, spec)
    script = FULL_FROM_THE_START.format(disk=str(disk), command=hermes_command("run", str(path), "--no-live"))
    result = in_small_filesystem(tmp_path, script, "1m")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["code"] == 2 and "Traceback" not in outcome["stderr"], outcome["stderr"]
    assert outcome["stderr"].startswith(f"hermes: error: no space left: {disk / 'runs' / 'hermes.lock'}: No space "), (
        outcome["stderr"])


@pytest.mark.parametrize("kind", ["function", "command"])
def test_a_runner_out_of_open_files_is_interrupted_saying_so_and_a_rerun_completes_it(tmp_path: Path, kind: str
                                                                                         ) -> None:
    """``ulimit -n`` too low for its slots' workers and pipes: a traceback, and the experiment recorded failed; a
    program's trials that could not start failed for good ("cannot start python: Too many open files")."""
    spec = spec_of("few-files", search=search(8, 0, 0.01), budget={"steps": 3},
                   resources={"gpus": "none", "cpu_slots": 8})
    if kind == "command":
        spec["trial"] = {"command": f"{sys.executable} trials/printer.py --steps 3 --rate {{rate}} --sleep 0.01",
                         "metrics_regex": r"score (?P<value>\S+)", "workdir": str(TESTS)}
    path = write_spec(tmp_path, spec)
    limited = subprocess.run(
        hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(), capture_output=True,
        text=True, timeout=RUN_TIMEOUT, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32)))
    assert limited.returncode == 2 and "Traceback" not in limited.stderr, limited.stderr
    assert limited.stderr.startswith("hermes: error: this machine ran out of what a trial needs: Too many open "
                                     "files (errno EMFILE)\ninterrupted: raise the limit (`ulimit -n` for open"), (
        limited.stderr)
    assert "few-files (id 1): interrupted" in hermes("status", "runs", cwd=tmp_path).stdout
    assert "few-files: finished (continued)" in run_ok(path).stdout


def test_a_store_its_disk_refuses_to_grow_interrupts_the_run_saying_so_and_a_rerun_completes_it(
    tmp_path: Path,
) -> None:
    """A file-size limit (``ulimit -f``), as a store made read-only or locked by another process past the wait:
    SQLAlchemy's whole dump ([SQL: ...] [parameters: ...]) was the message, and the run counted as failed."""
    budget = 50
    spec = spec_of("limited", search=search(4, 0, 0.005), budget={"steps": budget}, policy={"name": "rr", "period": 0.2},
                   storage={"dir": "runs", "checkpoint_every": 50})
    path = write_spec(tmp_path, spec)
    # bytes any file of the runner may grow to: its store's log (~20 KB a report) reaches it within the run
    limit = 400 * 1024
    limited = subprocess.run(
        hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(), capture_output=True,
        text=True, timeout=RUN_TIMEOUT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert limited.returncode == 2, limited.stderr
    assert limited.stderr.startswith("hermes: error: the store sqlite:///"), limited.stderr
    assert "its disk refused a write (a file-size limit, or a failing disk) (disk I/O error)\n" in limited.stderr
    assert "interrupted: run `hermes run " in limited.stderr and "[SQL:" not in limited.stderr
    rerun = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 4


# ---------------------------------------------------------------------- hung trials
# hang_after: the step after whose report a trial sleeps for good (0: before its first report).
HANGS = {  # limits, seconds a step, hang_after, the error's pattern
    "silent-for-its-steps": ({"stall": {"factor": 5, "min": 0.1}}, 0.15, 2,
                             r"hung: no report for (\S+)s, while its slowest step took (\S+)s \(trial.stall: factor 5, "
                             r"min 0.1s\)"),
    "silent-at-least-min": ({"stall": {"factor": 5, "min": 0.8}}, 0.02, 2,
                            r"hung: no report for 0.8s, while its slowest step took 0\.\d+s \(trial.stall: .*\)"),  # 5x it < 0.8
    "silent-from-the-start": ({"stall": {"after": 1.5}}, 0.02, 0, r"hung: no report for 1.5s \(trial.stall.after\)"),
    "over-its-time": ({"timeout": 2.0, "stall": {"factor": 0}}, 0.02, 2,
                      r"timed out: it ran 2s in all \(trial.timeout\)"),
}


@pytest.mark.parametrize(
    ("case", "warm"), [(case, True) for case in sorted(HANGS)] + [("silent-for-its-steps", False)],
    ids=[f"{case}-warm-worker" for case in sorted(HANGS)] + ["silent-for-its-steps-own-process"],
)
def test_a_hung_trial_fails_saying_why_and_the_experiment_goes_on(tmp_path: Path, case: str, warm: bool) -> None:
    limits, sleep, hang_after, reason = HANGS[case]
    budget = 5
    spec = spec_of(
        f"hung-{case}",
        trial={"function": "trials.curve:train", "workdir": str(Path(__file__).parent), "warm_workers": warm, **limits},
        search=search(4, 0, sleep, hang_after={"type": "grid", "values": [-1, hang_after]}),
        budget={"steps": budget},
        policy={"name": "fifo", "period": 1.0},
    )
    started = time.monotonic()
    result = run_ok(write_spec(tmp_path, spec))
    assert time.monotonic() - started < 60
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.FINISHED
    steps = Counter(record.trial_id for record in view.metrics)
    for trial in view.trials:
        if trial.params["hang_after"] < 0:
            assert trial.state is TrialState.COMPLETED and steps[trial.trial_id] == budget
        else:
            assert trial.state is TrialState.FAILED and steps[trial.trial_id] == hang_after
            match = re.fullmatch(reason, trial.error or "")
            assert match, trial.error
            if match.groups():  # silent for 5 times its slowest step, to the 3 digits shown
                assert float(match[1]) == pytest.approx(5 * float(match[2]), rel=0.01)
            where = f"at step {hang_after}" if hang_after else "before its first report"
            assert f"trial {trial.trial_id} failed {where}" in result.stdout
    assert not trial_processes((tmp_path / "runs").resolve())
