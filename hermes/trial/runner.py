"""Runs a function trial: ``python -m hermes.trial.runner package.module:function [SCRIPT ARGV...]``.

The executor starts this in the trial's own process (and process group); it imports the
function, limits torch's threads to the slot's share and calls the function with the config.
``SCRIPT ARGV...``: the command line of the script whose ``hermes.run`` drives the experiment, its file first, which
the trial's process sees as ``sys.argv`` (``set_trial_argv``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import reprlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hermes import trial
from hermes.errors import STORAGE_LIMIT_ERRNOS, HermesError
from hermes.trial import protocol
from hermes.trial.session import Session, current, fast_exit


def main(argv: list[str]) -> None:
    if not argv or ":" not in argv[0]:
        raise SystemExit("usage: python -m hermes.trial.runner package.module:function [SCRIPT ARGV...]")
    module_name, _, function_name = argv[0].partition(":")
    set_trial_argv(module_name, argv[1:])
    function = getattr(importlib.import_module(module_name), function_name)
    threads = os.environ.get(protocol.ENV_THREADS)
    # OMP_NUM_THREADS already covers a torch imported later; this covers one the module imported.
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    reported_step = int(os.environ.get(protocol.ENV_REPORTED_STEP) or 0)
    try:
        unreported = returned_unread(function, function(trial.config()), current(), reported_step)
    except OSError as error:
        if error.errno not in STORAGE_LIMIT_ERRNOS:
            raise
        try:
            print(f"hermes: {error}", file=sys.stderr)
        finally:
            os._exit(protocol.EXIT_NO_SPACE)  # not the trial's fault: the executor stops the run
    fast_exit()
    if unreported is not None:  # told as a misuse: it fails at once, not run again as a crash would be
        with contextlib.suppress(HermesError, OSError):
            current()._send({"type": protocol.MISUSED, "error": unreported})
        raise SystemExit(1)


def set_trial_argv(module_name: str, script: Sequence[str]) -> None:
    """Give the trial's process, before its module is imported, the command line it would have run with: any module
    may parse ``sys.argv`` at its import (argparse in a settings module the trial's module imports), which held the runner's
    or warm worker's own arguments. Where a script drives the experiment (``script``: its file, then its arguments),
    that script's command line, as every module of the driver saw it; else the module's file alone, as
    ``python train.py`` gives it."""
    sys.argv = list(script) if script else [_module_file(module_name) or ""]


def _module_file(module_name: str) -> str | None:
    """The file an import of ``module_name`` would run, found as the import system finds it but without running any
    code: importing the packages above it to ask would run their ``__init__`` with the command line not yet set.
    None where there is none (not found, a namespace package, a built-in)."""
    spec, locations = None, None
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     if (found := finder.find_spec(name, locations)) is not None), None)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        if locations is None and depth < len(parts):
            return None
    return spec.origin if spec is not None and spec.has_location else None


def returned_unread(function: Callable[..., Any], returned: Any, session: Session, reported_step: int) -> str | None:
    """A trial function's return value, which Hermes does not read (Optuna's objective returns its value, Ray Tune's
    trainable may return its last result), is said once in the trial's stderr.log; where the trial never reported
    (``reported_step``: the last step the executor had of it), the reason it fails, in place of the core's bare
    "ended without a report"."""
    if returned is None:
        return None
    name = getattr(function, "__name__", "the trial function")
    metric = session.metric or "metric"
    how = ("hermes.trial.report(step, **result) for each result" if isinstance(returned, dict)
           else f"hermes.trial.report(step, {metric}=value) at each step")
    said = f"{name} returned {reprlib.repr(returned)}, which Hermes does not read: report it with {how}"
    print(f"hermes: {said}", file=sys.stderr, flush=True)
    return f"ended without a report: {said}" if session.last_step == reported_step == 0 else None


if __name__ == "__main__":
    main(sys.argv[1:])
