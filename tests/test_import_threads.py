"""``hermes.run`` first asked for by two threads at once: the second got ``hermes.tuning`` while the first was still
importing it ("AttributeError: partially initialized module 'hermes.tuning' has no attribute 'run'")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The first thread's import is held for a moment once hermes.tuning is in sys.modules, half done; the second thread
# asks for hermes.run then. A finder that finds nothing slows the import without changing it.
SCRIPT = '''
import sys
import threading
import time

import hermes

halfway = threading.Event()


class Slow:
    def find_spec(self, name, path=None, target=None):
        if "hermes.tuning" in sys.modules and not halfway.is_set():
            halfway.set()
            time.sleep(0.5)
        return None


sys.meta_path.insert(0, Slow())
got = {}


def first():
    got["first"] = hermes.run


def second():
    halfway.wait()
    try:
        got["second"] = hermes.ExperimentResult
    except AttributeError as error:
        got["second"] = error


threads = [threading.Thread(target=first), threading.Thread(target=second)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(got["first"].__name__, got["second"])
'''


def test_two_threads_that_first_ask_for_hermes_run_at_once_both_get_it() -> None:
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "run <class 'hermes.tuning.ExperimentResult'>", ran.stdout + ran.stderr
