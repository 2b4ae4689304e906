"""Runs a function trial: ``python -m hermes.trial.runner package.module:function``.

The executor starts this in the trial's own process (and process group); it imports the
function, limits torch's threads to the slot's share and calls the function with the config.
"""

from __future__ import annotations

import importlib
import os
import sys

from hermes import trial
from hermes.errors import STORAGE_LIMIT_ERRNOS
from hermes.trial import protocol
from hermes.trial.session import fast_exit


def main(argv: list[str]) -> None:
    if len(argv) != 1 or ":" not in argv[0]:
        raise SystemExit("usage: python -m hermes.trial.runner package.module:function")
    module_name, _, function_name = argv[0].partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    threads = os.environ.get(protocol.ENV_THREADS)
    # OMP_NUM_THREADS already covers a torch imported later; this covers one the module imported.
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    try:
        function(trial.config())
    except OSError as error:
        if error.errno not in STORAGE_LIMIT_ERRNOS:
            raise
        try:
            print(f"hermes: {error}", file=sys.stderr)
        finally:
            os._exit(protocol.EXIT_NO_SPACE)  # not the trial's fault: the executor stops the run
    fast_exit()


if __name__ == "__main__":
    main(sys.argv[1:])
