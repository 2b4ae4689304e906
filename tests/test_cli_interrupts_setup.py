"""`hermes run` interrupted as it sets up, by a real signal to a real runner: it says so, exits 128 + the signal and
leaves no experiment shown running. A library that the signal interrupted may make an error of its own of it
(pydantic, building a model class as a module is imported, raises SchemaError; a plug-in's import error is a spec
error), or swallow it: that was a traceback or a spec error, or a run that ignored its SIGTERM. A signal as the live
view started was said, but left the experiment "running when its runner died"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hermes.report import open_store, pick_experiment
from hermes.store import ExperimentStatus
from tests.test_run import RUN_TIMEOUT, environment, hermes_command

TRIAL = '''
from hermes import trial


def train(config):
    for step in range(1, trial.budget() + 1):
        trial.report(step, score=config["rate"] * step)
'''

# A plug-in policy whose import the signal interrupts (it sends it to its own process, so that it lands there)
INTERRUPTED_IMPORT = '''
import os
import signal

from hermes.policies.fifo import FifoPolicy as Policy

interrupted = None
try:
    os.kill(os.getpid(), signal.{signal})
except KeyboardInterrupt as interrupt:  # as pydantic-core takes what a Python callback raised
    interrupted = interrupt
if interrupted is not None and {wraps}:  # outside the except: pydantic's SchemaError chains nothing
    raise RuntimeError(f"Error building a validator: {{interrupted!r}}")
'''


def project(root: Path, name: str, policy: str = "fifo") -> Path:
    """A spec of two short trials, its trial module and plug-ins beside it in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tiny_trial.py").write_text(TRIAL)
    spec = {
        "name": name,
        "trial": {"function": "tiny_trial:train", "workdir": str(root)},
        "search": {"sampler": "list", "configs": [{"rate": 0.1}, {"rate": 0.2}]},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 2},
        "policy": {"name": policy},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "storage": {"dir": str(root / "runs")},
    }
    path = root / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(hermes_command("run", str(path), "--no-live"), check=False, cwd=path.parent,
                          env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)


def on_a_terminal(command: list[str], cwd: Path) -> tuple[int, str]:
    """``command``'s exit code and what it showed, with a pseudo-terminal for its output (so the live view is drawn)."""
    import pty

    leader, follower = pty.openpty()
    runner = subprocess.Popen(command, cwd=cwd, env={**environment(), "TERM": "xterm", "COLUMNS": "120"},
                              stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    shown = b""
    try:
        while chunk := os.read(leader, 1 << 16):
            shown += chunk
    except OSError:  # EIO: the runner closed the terminal
        pass
    finally:
        os.close(leader)
        returncode = runner.wait(timeout=RUN_TIMEOUT)
    return returncode, shown.decode(errors="replace")


def status_of(storage: Path, name: str) -> ExperimentStatus:
    store = open_store(storage)
    try:
        return pick_experiment(store, name).status
    finally:
        store.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_that_a_library_makes_an_error_of_as_the_run_sets_up_interrupts_it(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """It was said as the library's error: a spec error here (the plug-in's import), a traceback and exit code 1
    for pydantic's SchemaError."""
    (tmp_path / "wrapping_policy.py").write_text(INTERRUPTED_IMPORT.format(signal=signum.name, wraps=True))
    path = project(tmp_path, "wrapped", policy="wrapping_policy:Policy")
    result = run(path)
    assert (result.returncode, result.stderr) == (128 + signum, "interrupted before the experiment started\n")


def test_a_signal_that_a_library_swallows_as_the_run_sets_up_interrupts_it(tmp_path: Path) -> None:
    """The run went on, the SIGTERM lost (pydantic-core swallows what a validator's ``__name__`` raises)."""
    (tmp_path / "swallowing_policy.py").write_text(INTERRUPTED_IMPORT.format(signal="SIGTERM", wraps=False))
    path = project(tmp_path, "swallowed", policy="swallowing_policy:Policy")
    result = run(path)
    assert (result.returncode, result.stderr) == (
        128 + signal.SIGTERM, f"interrupted: run `hermes run {path}` again to continue\n")
    assert status_of(tmp_path / "runs", "swallowed") is ExperimentStatus.INTERRUPTED


def test_sigterm_as_the_live_view_starts_records_the_experiment_interrupted(tmp_path: Path) -> None:
    """After its set-up, before its run: "interrupted", exit code 143, and the store said it was running when its
    runner died. The signal comes from inside Rich's Live.start, which the live view calls as it starts."""
    path = project(tmp_path, "live-start")
    (tmp_path / "signal_in_live_start.py").write_text(textwrap.dedent('''
        import os
        import signal
        import sys

        import rich.live

        start = rich.live.Live.start


        def start_after_sigterm(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return start(self, *args, **kwargs)


        rich.live.Live.start = start_after_sigterm
        from hermes.cli import main

        sys.exit(main(["run", sys.argv[1]]))
    '''))
    command = [sys.executable, str(tmp_path / "signal_in_live_start.py"), str(path)]
    returncode, shown = on_a_terminal(command, tmp_path)
    assert returncode == 128 + signal.SIGTERM, shown
    assert f"interrupted: run `hermes run {path}` again to continue" in shown
    assert status_of(tmp_path / "runs", "live-start") is ExperimentStatus.INTERRUPTED


def test_sigterm_as_the_run_takes_over_the_signals_exits_143_and_records_the_experiment_interrupted(
    tmp_path: Path,
) -> None:
    """Just before the run's own handler took SIGTERM (``interrupts_between_batches``), the one that `hermes run`
    takes it with from its start raised: exit code 130, as for Ctrl-C, and the experiment left running."""
    path = project(tmp_path, "taking-over")
    (tmp_path / "signal_as_handlers_change.py").write_text(textwrap.dedent('''
        import os
        import signal
        import sys

        install = signal.signal


        def install_after_sigterm(signum, handler):
            if signum == signal.SIGTERM and "interrupts_between_batches" in getattr(handler, "__qualname__", ""):
                signal.signal = install
                os.kill(os.getpid(), signal.SIGTERM)  # taken by the handler being replaced
            return install(signum, handler)


        signal.signal = install_after_sigterm
        from hermes.cli import main

        sys.exit(main(["run", sys.argv[1], "--no-live"]))
    '''))
    result = subprocess.run([sys.executable, str(tmp_path / "signal_as_handlers_change.py"), str(path)],
                            check=False, cwd=tmp_path, env=environment(), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT)
    assert (result.returncode, result.stderr) == (
        128 + signal.SIGTERM, f"interrupted: run `hermes run {path}` again to continue\n")
    assert status_of(tmp_path / "runs", "taking-over") is ExperimentStatus.INTERRUPTED
