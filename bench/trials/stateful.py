"""A bench trial that carries ``mb`` megabytes of state and times each of its reports' answers.

Config: ``sleep`` (seconds a step), ``mb`` (state size), ``rate`` (its curve). The state (a random
blob, the running sum and every answer's latency) is saved with ``trial.Files``, so it follows the
trial through suspensions and migrations; ``result.json`` gets the latencies and a checksum.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from hermes import trial


def train(config: dict[str, Any]) -> None:
    sleep, rate, size = float(config.get("sleep", 0.01)), float(config.get("rate", 0.5)), int(config.get("mb", 0))
    state: dict[str, Any] = {"total": 0.0, "latencies": [], "blob": b""}

    def save(directory: Path) -> None:
        (directory / "blob").write_bytes(state["blob"])
        (directory / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "blob"}))

    def load(directory: Path) -> None:
        state.update(json.loads((directory / "state.json").read_text()), blob=(directory / "blob").read_bytes())

    start = trial.Files(save, load).restore()
    if start == 0:
        state["blob"] = os.urandom(size * 2**20)
    for step in range(start + 1, trial.budget() + 1):
        time.sleep(sleep)
        value = 1.0 - math.exp(-rate * step)
        state["total"] += value
        asked = time.perf_counter()
        trial.report(step, score=value, total=state["total"])
        state["latencies"].append(time.perf_counter() - asked)
    digest = hashlib.sha256(state["blob"]).hexdigest()
    (trial.trial_dir() / "result.json").write_text(json.dumps({**{k: v for k, v in state.items() if k != "blob"},
                                                               "sha256": digest}))
