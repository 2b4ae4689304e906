"""A full disk under an unmodified program's log (the runner copies its output there) names that log by its path.

A real runner in a mount namespace where the storage dir is a small tmpfs (``in_small_filesystem``, as
test_reliability.py's full-disk tests do).
"""

from __future__ import annotations

import json
from pathlib import Path

from test_reliability import in_small_filesystem
from test_run import hermes_command, write_spec

CHATTY = """
import time
for epoch in range(1, 31):
    print("x" * 100000, flush=True)  # output that fills the disk under the storage dir
    print(f"epoch {epoch} loss {1 / epoch:.4f}", flush=True)
    time.sleep(0.02)
"""

RUN = """
import json, subprocess
run = subprocess.run({command!r}, capture_output=True, text=True, timeout=90)
print(json.dumps({{"code": run.returncode, "stderr": run.stderr}}))
"""


def test_a_full_disk_under_a_programs_log_names_the_log_by_its_path(tmp_path: Path) -> None:
    """It said "no space left: trial 0: 17: No space left on device", 17 being the log's descriptor."""
    disk = tmp_path / "disk"
    (tmp_path / "chatty.py").write_text(CHATTY)
    spec = {
        "name": "full-log",
        "trial": {"command": "python chatty.py", "workdir": str(tmp_path),
                  "metrics_regex": r"epoch (?P<step>\d+) loss (?P<value>\S+)"},
        "search": {"configs": [{"a": 1}]},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": 30},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": str(disk / "runs"), "allow_outside": True},
    }
    path = write_spec(tmp_path, spec)
    result = in_small_filesystem(tmp_path, RUN.format(command=hermes_command("run", str(path), "--no-live")), "2m")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    log = disk / "runs" / "full-log" / "trials" / "0" / "stdout.log"
    assert outcome["code"] == 2, outcome["stderr"]
    assert f"hermes: error: no space left: trial 0: {log}: No space left on device" in outcome["stderr"], (
        outcome["stderr"])
