"""How the local executor runs a trial, one launcher per kind of trial (``launcher_for``).

- ``WarmLauncher``: a function trial in its slot's long-lived worker; suspended, it parks in memory.
- ``ProcessLauncher``: a process per run that uses ``hermes.trial``: it checkpoints and exits when
  suspended, and resumes anywhere as a new process.
- ``ScriptLauncher``: an unmodified program that only prints its metrics: suspended with SIGSTOP,
  continued with SIGCONT on its own slot.
"""

from __future__ import annotations

from hermes.local.launchers.base import Host, Launcher
from hermes.local.launchers.process import ProcessLauncher, ScriptLauncher
from hermes.local.launchers.warm import WarmLauncher, Worker

__all__ = ["Host", "Launcher", "ProcessLauncher", "ScriptLauncher", "WarmLauncher", "Worker"]
