"""A run of many unmodified programs under the usual soft limit of open files, on the real command line."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from hermes.core.states import TrialState
from tests.test_run import (
    PRINTED,
    RATE,
    RUN_TIMEOUT,
    TESTS,
    environment,
    hermes_command,
    load_view,
    spec_of,
    write_spec,
)


def test_many_paused_unmodified_programs_run_under_a_low_soft_limit(tmp_path: Path) -> None:
    """Each paused program holds five descriptors of the runner (its logs, its pipes, a pidfd), and the policy pauses
    every one after its first report: 250 of them stopped a run with "Too many open files" under the usual soft limit
    of 1024, the hard limit far above it. Here 40 of them, under a soft limit of 64."""
    trials = 40
    spec = spec_of(
        "many-printers",
        trial={"command": f"{sys.executable} trials/printer.py --steps 3 --rate {{rate}} --sleep 0.01",
               "metrics_regex": PRINTED, "workdir": str(TESTS)},
        search={"sampler": "random", "trials": trials, "seed": 1, "space": {"rate": RATE}},
        budget={"steps": 3},
        policy={"name": "rr", "period": 0.02},  # each paused at its first report, as the default policy's sweep does
        resources={"gpus": "none", "cpu_slots": 1},
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

    result = subprocess.run(hermes_command("run", str(write_spec(tmp_path, spec)), "--no-live"), cwd=tmp_path,
                            env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
                            preexec_fn=low_soft_limit, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * trials
