"""A torch checkpoint that fills the disk: the trial's log keeps the whole traceback of why.

torch.save's writer, a local of the frames that raised, held the deleted partial checkpoint's blocks until the
exception was gone, so the traceback the worker then printed to the trial's stderr.log (on that disk) ended after its
first line, "Traceback (most recent call last):", which stayed the whole log once a rerun completed the trial.
A real `hermes run` in a mount namespace whose storage is a tmpfs of 12 MB, a real torch.save of 10 MB of state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_reliability import in_small_filesystem
from test_run import hermes_command

pytest.importorskip("torch", reason="the checkpoint is torch's")

TRIAL = """
import torch
from hermes import trial

def train(config):
    model = torch.nn.Linear(1600, 1600)  # 10 MB of state: the disk holds one checkpoint, not two
    state = trial.Checkpoint(model=model)
    for step in range(state.restore(), trial.budget()):
        trial.report(step + 1, loss=1.0 / (step + 1))
"""

SCENARIO = """
import json, subprocess
run = subprocess.run({command!r}, capture_output=True, text=True, timeout=120)
log = {log!r}
print(json.dumps({{"code": run.returncode, "stderr": run.stderr, "log": open(log).read()}}))
"""


def test_the_log_of_a_checkpoint_that_filled_the_disk_holds_its_whole_traceback(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text(TRIAL)
    disk = tmp_path / "disk"
    spec = {"name": "full", "trial": {"function": "big:train", "workdir": str(tmp_path)},
            "search": {"sampler": "list", "configs": [{"x": 1}]}, "metric": {"name": "loss", "mode": "min"},
            "budget": {"steps": 2}, "policy": {"name": "fifo"}, "resources": {"gpus": "none", "cpu_slots": 1},
            "storage": {"dir": str(disk / "runs")}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    log = disk / "runs" / "full" / "trials" / "0" / "stderr.log"
    script = SCENARIO.format(command=hermes_command("run", str(tmp_path / "spec.yaml"), "--no-live"), log=str(log))
    ran = in_small_filesystem(tmp_path, script, "12m", small=disk)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["code"] == 2 and "no space left" in found["stderr"], found["stderr"]
    assert found["log"].startswith("Traceback (most recent call last):\n"), found["log"]
    assert "OSError: [Errno 28] no space left on the device for the checkpoint of step " in found["log"], found["log"]
