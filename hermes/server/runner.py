"""Runs the server's experiments: the one place that starts them, so that a pool with fair share can replace it.

This runner takes the server's experiments one at a time, oldest first, and runs each as an
``ExperimentSession`` on the server's store in a background thread. Each session believes it has
the machine's GPUs to itself, which is only true one at a time. At start it also takes up the
experiments a previous server left running: their sessions continue them from the store, as
``hermes run`` does after ``kill -9``. When the server process ends, the running session ends
with it (its trials die with their parent) and is continued the same way on the next start.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from hermes.experiment import ExperimentSpec
from hermes.session import ExperimentSession
from hermes.store import ExperimentRecord, ExperimentStatus, ExperimentStore

log = logging.getLogger("hermes.server")
SpecOf = Callable[[ExperimentRecord], ExperimentSpec]


class SessionRunner:
    def __init__(self, store: ExperimentStore, spec_of: SpecOf) -> None:
        self.store = store
        self.spec_of = spec_of
        self._lock = threading.Condition()
        self._current: tuple[int, ExperimentSession] | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="hermes-runner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submitted(self, experiment_id: int) -> None:
        """A new experiment is queued."""
        with self._lock:
            self._lock.notify_all()

    def cancel(self, experiment_id: int, by: str) -> None:
        """After ``store.request_cancel``: stop its session, or record a queued one as cancelled at once."""
        with self._lock:
            if self._current is not None and self._current[0] == experiment_id:
                self._current[1].cancel(f"cancelled by {by}")
            elif self.store.experiment(experiment_id).status is ExperimentStatus.QUEUED:
                self.store.set_status(experiment_id, ExperimentStatus.CANCELLED)

    def close(self) -> None:
        """Take no more experiments; a running one goes on until the process ends (see the module docstring)."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()

    # ------------------------------------------------------------------ the runner thread
    def _serve(self) -> None:
        while True:
            with self._lock:
                experiment = self._next()
                while experiment is None and not self._closing:
                    self._lock.wait(timeout=5.0)
                    experiment = self._next()
                if self._closing:
                    return
                try:
                    session = ExperimentSession(self.spec_of(experiment), store=self.store)
                except Exception as error:
                    log.exception("experiment %d (%s) cannot start", experiment.experiment_id, experiment.name)
                    self.store.set_status(experiment.experiment_id, ExperimentStatus.FAILED, error=str(error))
                    continue
                self._current = (experiment.experiment_id, session)
                if experiment.cancel_requested:
                    session.cancel("cancelled before it ran")
            self._run(experiment, session)

    def _next(self) -> ExperimentRecord | None:
        """The oldest of the server's experiments that is not over (``hermes run``'s have no owner)."""
        for experiment in self.store.experiments():
            if experiment.owner is not None and not experiment.status.is_final:
                return experiment
        return None

    def _run(self, experiment: ExperimentRecord, session: ExperimentSession) -> None:
        experiment_id = experiment.experiment_id
        log.info("experiment %d (%s of %s) starts", experiment_id, experiment.name, experiment.owner)
        try:
            session.run()  # records the experiment finished, cancelled (after session.cancel) or failed
        except Exception:
            log.exception("experiment %d (%s) failed", experiment_id, experiment.name)
        finally:
            with self._lock:
                self._current = None
        log.info("experiment %d ends: %s", experiment_id, self.store.experiment(experiment_id).status.value)
