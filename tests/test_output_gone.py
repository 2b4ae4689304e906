"""`hermes run` whose output goes away, and what its lines say of a trial that a crash set back: real runs, in real
processes, on a real terminal (a pty) and a real pipe."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

from tests.test_run import (
    RUN_TIMEOUT,
    environment,
    hermes,
    hermes_command,
    search,
    spec_of,
    write_spec,
)


def test_a_terminal_gone_while_sighup_is_ignored_drops_the_live_view_and_the_run_finishes(tmp_path: Path) -> None:
    """`hermes run x.yaml & disown`, then the SSH session drops: no SIGHUP comes, and every write to the terminal
    fails (EIO). The live view's last frame raised it from Rich as the view stopped: a traceback and exit code 1 for
    an experiment that finished, where --no-live dropped its output and said so in a line."""
    path = write_spec(tmp_path, spec_of("gone", search=search(2, 0, 0.1), budget={"steps": 4}))
    leader, follower = pty.openpty()
    runner = subprocess.Popen(
        ["sh", "-c", "trap '' HUP; exec \"$@\"", "sh", *hermes_command("run", str(path))], cwd=tmp_path,
        env={**environment(), "TERM": "xterm", "COLUMNS": "120"}, stdin=subprocess.DEVNULL, stdout=follower,
        stderr=subprocess.PIPE, text=True,
    )
    os.close(follower)
    try:
        drawn, deadline = b"", time.monotonic() + RUN_TIMEOUT
        while b"\x1b[" not in drawn and time.monotonic() < deadline:  # the view has drawn: it is live
            if select.select([leader], [], [], 0.1)[0]:
                drawn += os.read(leader, 1 << 16)
        assert b"\x1b[" in drawn, drawn
        os.close(leader)  # the terminal is gone
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.count("hermes: warning: its output cannot be written (Input/output error)") == 1, stderr
    status = hermes("status", "runs", cwd=tmp_path)
    assert status.stdout.startswith("experiment  gone (id 1): finished\n"), status.stdout


# Reports x * step, a checkpoint every 3 steps; its first run crashes after step 5 (a runner killed, say), and every
# later one as it restores its checkpoint (a CUDA out of memory there): it fails before it catches up to step 5.
SET_BACK = """\
from pathlib import Path

from hermes import trial


def train(config):
    def load(directory):
        raise RuntimeError("CUDA out of memory while restoring (simulated)")

    saver = trial.Files(lambda directory: (Path(directory) / "state.json").write_text("{}"), load)
    for step in range(saver.restore() + 1, trial.budget() + 1):
        if step == 6:
            raise RuntimeError("the first run dies after step 5")
        trial.report(step, score=config["x"] * step)
"""


def test_a_trial_set_back_by_a_crash_is_said_to_fail_at_the_last_step_it_reported(tmp_path: Path) -> None:
    """A crash sets the core's step back to the trial's checkpoint (3): a trial that then failed before catching up
    was said "failed at step 3, score 2.5" (step 5's) by the run and "failed at step 3" by `hermes status`, where its
    results said 5 steps."""
    (tmp_path / "set_back.py").write_text(SET_BACK)
    spec = spec_of(
        "set-back",
        trial={"function": "set_back:train", "workdir": str(tmp_path), "max_failures": 1},
        search={"configs": [{"x": 0.5}]},
        budget={"steps": 8},
        storage={"dir": "runs", "checkpoint_every": 3},
    )
    run = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # its only trial failed
    assert "trial 0 failed at step 5, score 2.5 (uncaught RuntimeError: CUDA out of memory" in run.stdout, run.stdout
    status = hermes("status", "runs", cwd=tmp_path)
    assert "  trial 0 (failed at step 5): " in status.stdout, status.stdout
    results = hermes("results", "runs", "--format", "csv", cwd=tmp_path)
    assert results.stdout.splitlines()[1].split(",")[6] == "5", results.stdout  # steps: as it was


def test_a_reader_that_closes_the_pipe_interrupts_the_run(tmp_path: Path) -> None:
    """As the README says: `hermes run spec.yaml | head -1` stops the run, recorded interrupted, said on stderr,
    exit code 1; running it again continues it."""
    path = write_spec(tmp_path, spec_of("piped", search=search(4, 0, 0.1), budget={"steps": 4}))
    runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None
        assert re.search(r"trial \d+ completed", runner.stdout.readline())
        runner.stdout.close()  # as `head -1` does
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 1, stderr
    assert f"interrupted: its output was closed; run `hermes run {path}` again to continue" in stderr, stderr
    status = hermes("status", "runs", cwd=tmp_path)
    assert status.stdout.startswith("experiment  piped (id 1): interrupted\n"), status.stdout
