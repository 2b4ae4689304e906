"""A ``hermes.run`` whose set-up fails (Ctrl-C, a spec its store refuses) closes the store it opened: a notebook's
long-lived process held ``hermes.db``, ``-wal`` and ``-shm`` open for ever, one more set with each such call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.test_run import RUN_TIMEOUT, environment, search, spec_of

SCRIPT = """
import json, os, sys
import hermes
from hermes.store.sql import SqlStore

def store_files():
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # the listing's own descriptor, closed since
            pass
    return sorted(name for name in names if name.startswith("hermes.db"))

def interrupted_at(method):
    original = getattr(SqlStore, method)
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt  # the user's Ctrl-C, in the middle of the set-up
    setattr(SqlStore, method, interrupt)
    try:
        hermes.run(spec)
    except KeyboardInterrupt:
        pass
    finally:
        setattr(SqlStore, method, original)

spec = json.loads(sys.argv[1])
for method in ("create_or_open_experiment", "claim_writer"):
    interrupted_at(method)
    print(method, store_files())
print("run", hermes.run(spec).status, store_files())
try:
    hermes.run({**spec, "metric": {**spec["metric"], "mode": "min"}})
except Exception as error:
    print("other spec", type(error).__name__, store_files())
"""


def test_a_set_up_cut_short_leaves_no_store_file_open(tmp_path: Path) -> None:
    spec = spec_of("leak", search=search(1, 0, 0.0), budget={"steps": 1}, policy={"name": "fifo"},
                   resources={"gpus": "none", "cpu_slots": 1})
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.stdout.splitlines() == [
        "create_or_open_experiment []", "claim_writer []", "run finished []", "other spec StoreError []"], done.stderr
