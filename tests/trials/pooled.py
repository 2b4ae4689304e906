"""A function trial whose loop runs in a thread pool it starts (as some frameworks' fit() does), which checks there
that hermes.trial answers for it: each step reports whether ``trial.trial_id()`` named it (``mine``: 1 or 0), whether
it did in a task of a thread pool that the trials share, whose thread the first of them started (``shared``), and in a
thread that no trial started, which answers for the trial that computes (``computes``). The
pool's thread prints a line a step on stdout and on stderr, and a thread it starts first dies of an exception, whose
traceback Python prints on stderr. It keeps no checkpoint of its state: resumed from disk, it starts over."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.pool import ThreadPool

from hermes import trial

_STARTED_AT_IMPORT = ThreadPool(1)  # by the warm worker, which imports the trials' module first
_SHARED = ThreadPoolExecutor(1)  # its thread starts with the first task


def _fail() -> None:
    raise RuntimeError(f"a thread of trial {trial.trial_id()} failed")


def _loop(me: str) -> None:
    for step in range(1, trial.budget() + 1):
        time.sleep(float(trial.config().get("sleep", 0.0)))
        print(f"trial {me} prints at step {step}", flush=True)
        print(f"trial {me} warns at step {step}", file=sys.stderr, flush=True)
        shared = _SHARED.submit(trial.trial_id).result() == me
        computes = _STARTED_AT_IMPORT.apply(trial.trial_id) == me
        trial.report(step, score=float(step), mine=float(trial.trial_id() == me), shared=float(shared),
                     computes=float(computes))


def train(config: dict) -> None:
    failing = threading.Thread(target=_fail)
    failing.start()
    failing.join()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_loop, trial.trial_id()).result()
