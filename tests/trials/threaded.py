"""A function trial whose training loop runs in a thread it starts (a thread pool, as some frameworks' fit()
does): each step reports from that thread, and asks hermes.trial for its budget and config there."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from hermes import trial


def _loop() -> None:
    rate = float(trial.config()["rate"])
    for step in range(1, trial.budget() + 1):
        time.sleep(0.05)
        trial.report(step, score=rate * step)


def train(config: dict) -> None:
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_loop).result()
