"""The node agent: one long-lived Ray actor per node with GPUs (or per node, on CPU slots), running its slots.

An actor per trial (as Ray Tune does) costs 0.6-0.8 s to create and turns every pause into a
checkpoint plus a new actor; one agent per node, holding all of the node's GPUs, keeps the local
engine's warm workers, parking and spilling instead: it hosts a ``LocalExecutor`` whose slots are
the node's GPUs, each pinned by ``CUDA_VISIBLE_DEVICES`` to the index Ray gave (Ray leaves it unset
for an actor that asks for no GPU, and such an actor's children would see every GPU).

Threads: one *pump* thread owns the local executor (it is not thread-safe) and alternates between
the driver's commands and the local executor's events. Ray runs the methods in a pool of threads
(a threaded actor does not keep call order), so every ``call`` carries the driver's sequence
number and the pump runs them in that order; a repeated number (a retry after
``ActorUnavailableError``) is ignored. Events are numbered too: ``next_events(after)`` drops those
the driver has, so a reply lost on the way is sent again.

Durable checkpoints: a checkpointed report is uploaded to the storage URI before the driver sees
it, so ``checkpointed=True`` always names a checkpoint another node can download. A migrating
trial's state travels as the return value of ``call`` (owned by the driver, so it outlives this
agent) straight to the destination's agent.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hermes.core.decisions import Start
from hermes.core.events import Event, TrialReported
from hermes.errors import HermesError, start_thread
from hermes.local.executor import LocalExecutor
from hermes.local.launch import TrialLaunch
from hermes.local.launchers.base import set_driver_script
from hermes.local.resources import local_slots
from hermes.ray.storage import checked_store, checkpoint_contents, make_links
from hermes.trial import protocol
from hermes.trial.session import remove_checkpoints

UPLOADERS = 2  # threads that upload checkpoints to the storage URI, beside the pump
State = dict[str, Any]  # {"step": n, "files": {relative path: bytes}, "links": {relative path: target}}: a trial's
# newest checkpoint (its links as links: ``hermes.ray.storage.checkpoint_contents``)


def _ray_cpus() -> int:
    """The Ray CPU resource of this agent's node: the cores its trials may use. In a container it is the CPU limit
    (KubeRay's --num-cpus) while the affinity shows every core of the host (30 against 128), so GPU slots sized by the
    affinity alone would run several times more threads than the pod's CPU quota allows."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    cpus = next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node_id), 0)
    return max(1, int(cpus)) if cpus > 0 else 0  # a fraction of a CPU is one thread


class NodeAgent:
    """Runs one node's trials for a ``RayExecutor``; see the module docstring. Made with
    ``num_cpus=0``, the node's GPUs and a hard node affinity (``hermes.ray.executor``)."""

    def __init__(
        self,
        node: str,
        directory: str,
        metric: str | None,
        checkpoint_every: int,
        storage_uri: str,
        cpu_slots: int | None = None,
        threads_per_slot: int = 1,
        shared: str | None = None,
        driver_script: tuple[str, ...] = (),
    ) -> None:
        """``cpu_slots``: run that many CPU slots of ``threads_per_slot`` cores instead of the node's GPUs.
        ``shared``: the object the driver wrote under the storage URI (``CheckpointStore.mark_shared``), which
        this node must see there too. ``driver_script``: the driver's (``hermes.local.launchers.base``), whose command
        line its trials see, as on one machine."""
        import ray

        set_driver_script(driver_script)  # this process runs no other driver's trials

        if cpu_slots is None:
            slots = local_slots(node, gpus=[str(int(index)) for index in ray.get_gpu_ids()])
            cpus = _ray_cpus()
            if cpus > 0:  # no CPU resource (num-cpus 0) says nothing of the cores: the affinity's share stands
                slots = [dataclasses.replace(s, threads=max(1, min(s.threads, cpus // len(slots)))) for s in slots]
        else:
            slots = local_slots(node, cpu_slots=cpu_slots, threads_per_slot=threads_per_slot)
        self.node = node
        self.storage = checked_store(storage_uri, "storage.uri")  # a node that cannot write there must not run trials
        if shared is not None and not self.storage.sees(shared):  # its own folder, which no other node reads
            raise HermesError(f"storage.uri {storage_uri} is not shared with Ray node {node}: every node must see "
                              "the same checkpoints (a shared file system or s3://...)")
        self.local = LocalExecutor(
            Path(directory),
            slots=slots,
            metric=metric,
            checkpoint_every=checkpoint_every,
            cwd=directory,
        )
        self._changed = threading.Condition()
        self._calls: dict[int, tuple[list[tuple], Future]] = {}  # seq -> commands waiting for the pump
        self._done = 0  # the last seq the pump has run
        self._arrived: set[int] = set()  # seqs received and not yet run
        self._outbox: list[tuple[int, Event | str]] = []  # numbered events (and warnings) the driver may not have yet
        self._numbered = 0
        self._local_busy = True  # whether any run of the local executor may still report
        self._uploads = 0  # checkpoint uploads under way, each with a report to post
        self._upload_failed = False  # whether the user was warned that an upload failed
        # (report, its durable key, its directory) for the uploader threads; None ends one
        self._to_upload: queue.SimpleQueue[tuple[TrialReported, str, Path] | None] = queue.SimpleQueue()
        self._replied: tuple[bool, int] | None = None  # (busy, done) of the last next_events reply
        self._woken = False
        self._closed = False
        self._awaiting: dict[str, TrialReported] = {}  # trial -> its report the driver has to settle
        self._exports: dict[str, Future] = {}  # trial -> the call waiting for its state
        self._known: set[str] = set()  # trials the local executor has
        self._directories: dict[str, Path] = {}  # trial -> its own directory (TrialLaunch.directory: a pool's)
        self._durables: dict[str, str] = {}  # trial -> its durable checkpoints' key (TrialLaunch.durable: a pool's)
        # Every thread starts here, none as it is needed: a node whose limit of processes (``ulimit -u``, a pids limit)
        # leaves none refuses to run trials, saying so in a line (``start_thread``), as its executor's would
        uploaders = [threading.Thread(target=self._upload, name=f"hermes-upload-{n}", daemon=True)
                     for n in range(UPLOADERS)]
        self._pump_thread = threading.Thread(target=self._pump, name="hermes-agent-pump", daemon=True)
        try:
            for thread in [*uploaders, self._pump_thread]:
                start_thread(thread)
        except OSError:
            self._end_uploaders()
            self.local.close()
            raise

    # ------------------------------------------------------------------ what the driver calls
    def call(self, seq: int, commands: list[tuple], carried: list[Any] | None = None) -> State | None:
        """Run ``commands`` after every call numbered before ``seq``; return a state when one of
        them hands a trial over (``export``). ``carried`` holds, nested so that Ray does not wait
        for it, the object ref of a state that a ``receive`` among them takes in."""
        with self._changed:
            if seq <= self._done or seq in self._arrived:
                return None  # a retry of a call that arrived
        for command in commands:
            if command[0] == "receive":
                _, trial_id, work, _, durable_step = command
                self._receive(trial_id, work, durable_step, carried[0] if carried else None)
        future: Future = Future()
        with self._changed:
            self._calls[seq] = (commands, future)
            self._arrived.add(seq)
            self._changed.notify_all()
        self.local.wake()
        return future.result()

    def next_events(self, after: int) -> tuple[list[Event | str], int, bool, int]:
        """Wait for events numbered past ``after`` (or a wake, or a change of what ``busy`` and
        ``done`` say); return them (a string is a warning for the user), the number of the last,
        whether anything may still report, and the last call run."""
        with self._changed:
            self._outbox = [(n, e) for n, e in self._outbox if n > after]
            self._changed.wait_for(
                lambda: self._outbox or self._woken or self._closed or self._replied != (self._busy, self._done)
            )
            self._woken = False
            self._replied = (self._busy, self._done)
            return [e for _, e in self._outbox], self._numbered, self._busy, self._done

    @property
    def _busy(self) -> bool:
        """Whether an event may still come from here (read under ``_changed``)."""
        return self._local_busy or self._uploads > 0

    def wake(self) -> None:
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def close(self) -> None:
        """Kill every trial process here and end the pump."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self.local.wake()
        self._pump_thread.join(timeout=30)

    # ------------------------------------------------------------------ the pump
    def _pump(self) -> None:
        try:
            while True:
                while (ready := self._next_call()) is not None:
                    self._run(*ready)
                if self._closed:
                    return
                if self.local.idle() and not self._exports:
                    with self._changed:
                        self._changed.wait_for(lambda: self._done + 1 in self._calls or self._closed)
                    continue
                events = self.local.next_events()
                for event in events:
                    self._forward(event)
                for trial_id in list(self._exports):
                    if self.local.hand_over(trial_id):
                        self._known.discard(trial_id)
                        self._exports.pop(trial_id).set_result(self._state(trial_id))
                with self._changed:
                    self._local_busy = not self.local.idle()
                    self._changed.notify_all()
        finally:
            self.local.close()
            self._end_uploaders()

    def _next_call(self) -> tuple[int, list[tuple], Future] | None:
        with self._changed:
            seq = self._done + 1
            if seq not in self._calls:
                return None
            return (seq, *self._calls.pop(seq))

    def _run(self, seq: int, commands: list[tuple], future: Future) -> None:
        """Run a call's commands; only then does ``done`` say so (with ``busy`` as they left it)."""
        export: Future | None = None
        try:
            for command in commands:
                export = self._command(*command) or export
        except Exception as error:  # a bug or a contract violation of the driver: it raises it
            future.set_exception(error)
            return
        finally:
            with self._changed:
                self._done = seq
                self._arrived.discard(seq)
                self._local_busy = not self.local.idle()
                self._changed.notify_all()
        if export is None:
            future.set_result(None)
        else:
            export.add_done_callback(lambda done: future.set_result(done.result()))

    def _command(self, kind: str, *args: Any) -> Future | None:
        local = self.local
        if kind == "submit" or kind == "receive":
            trial_id, work, reported_step = args[:3]
            if trial_id not in self._known:
                self._note_places(trial_id, work)
                local.submit(trial_id, work, reported_step=reported_step)
                self._known.add(trial_id)
        elif kind == "apply":
            decision = args[0]
            if isinstance(decision, Start):
                self.storage.delete(self._durable(decision.trial_id))
            local.apply(decision, local.now())
        elif kind == "settle":
            trial_id, step = args
            event = self._awaiting.get(trial_id)
            if event is not None and event.step == step:
                del self._awaiting[trial_id]
                local.settled(event)
        elif kind == "export":
            future: Future = Future()
            if local.hand_over(args[0]):
                self._known.discard(args[0])
                future.set_result(self._state(args[0]))
            else:
                self._exports[args[0]] = future
            return future
        elif kind == "remove_gpu":
            local.remove_gpu(args[0])
        elif kind == "end_worker_group":  # a pool's experiment ended: its trials are never decided about again
            for trial_id in local.end_worker_group(args[0]):
                self._known.discard(trial_id)
                self._directories.pop(trial_id, None)
                self._durables.pop(trial_id, None)
                self._awaiting.pop(trial_id, None)
        else:
            raise ValueError(f"unknown command {kind!r}")
        return None

    def _forward(self, event: Event) -> None:
        """Hand an event to the driver; a checkpointed report only once its checkpoint is durable.
        Uploads run beside the pump, so the node's other slots go on meanwhile; the trial itself
        waits for its answer, so none of its own events can overtake the report."""
        if not isinstance(event, TrialReported):
            self._post(event)
            return
        self._awaiting[event.trial_id] = event
        if not event.checkpointed:
            self._post(event)
            return
        with self._changed:
            self._uploads += 1
        self._to_upload.put((event, self._durable(event.trial_id), self._trial_dir(event.trial_id)))

    def _upload(self) -> None:
        """An uploader thread: upload the checkpoints of the reports queued (``_forward``), then post each report."""
        while (queued := self._to_upload.get()) is not None:
            if self._closed:
                continue  # what has not started uploading is dropped
            event, durable, directory = queued
            error: Exception | None = None
            try:
                self.storage.upload_latest(durable, directory)
            except Exception as failure:
                error = failure
            self._uploaded(event, error)

    def _end_uploaders(self) -> None:
        for _ in range(UPLOADERS):
            self._to_upload.put(None)

    def _uploaded(self, event: TrialReported, error: Exception | None) -> None:
        if error is not None:  # not durable: the core must not count on it, and the user must know
            event = dataclasses.replace(event, checkpointed=False)
            if not self._upload_failed:
                self._upload_failed = True
                self._post(f"trial {event.trial_id}'s checkpoint of step {event.step} could not be uploaded to "
                           f"{self.storage.uri} ({type(error).__name__}: {error}); until uploads work again, a trial "
                           "that leaves this node resumes from an older checkpoint (further failures not shown)")
        with self._changed:
            self._uploads -= 1
        self._post(event)

    def _post(self, event: Event | str) -> None:
        """Queue an event, or a warning for the user (a string), for the driver."""
        with self._changed:
            self._numbered += 1
            self._outbox.append((self._numbered, event))
            self._changed.notify_all()

    # ------------------------------------------------------------------ trial state
    def _note_places(self, trial_id: str, work: TrialLaunch) -> None:
        """A launch that names the trial's directory (a pool's trials keep their experiment's files, on a mount
        that every node shares) puts its files there instead of under this agent's directory; one that names its
        durable checkpoints' key (a pool's: its experiment's folder, apart from other stores' experiments of the same
        id) keeps them there instead of under its trial id."""
        if work.directory:
            self._directories[trial_id] = Path(work.directory)
        if work.durable:
            self._durables[trial_id] = work.durable

    def _trial_dir(self, trial_id: str) -> Path:
        return self._directories.get(trial_id) or self.local.directory / "trials" / trial_id

    def _durable(self, trial_id: str) -> str:
        """Where the trial's durable checkpoints are under the storage URI (``TrialLaunch.durable``)."""
        return self._durables.get(trial_id, trial_id)

    def _state(self, trial_id: str) -> State | None:
        """The newest checkpoint of a trial handed over, read into memory for the object store."""
        latest = protocol.latest_checkpoint(self._trial_dir(trial_id))
        if latest is None:
            return None
        directory, step = latest
        files, links = checkpoint_contents(directory)
        return {"step": step, "files": {str(path.relative_to(directory)): path.read_bytes() for path in files},
                "links": links}

    def _receive(self, trial_id: str, work: TrialLaunch, durable_step: int, carried: Any) -> None:
        """Before a trial resumes here from elsewhere: put its state in its directory, from the
        object store (a migration between live nodes) or else from the storage URI (its node died,
        or the driver restarted), where the driver counts on one of ``durable_step``. Runs in Ray's thread, not the
        pump: the trial is unknown here."""
        import ray

        state = None
        if carried is not None:
            try:
                state = ray.get(carried)
            except ray.exceptions.RayError:
                state = None  # its node died on the way: the durable checkpoint it is
        self._note_places(trial_id, work)
        trial_dir = self._trial_dir(trial_id)
        checkpoints = trial_dir / protocol.CHECKPOINTS_DIR
        remove_checkpoints(checkpoints)  # Hermes's, not the trial's own files there (its best model, say)
        if state is None:
            step = self.storage.download(self._durable(trial_id), trial_dir)
            if work.movable and durable_step > 0 and (step is None or step < durable_step):
                self._post(f"trial {trial_id}'s durable checkpoint of step {durable_step} is not in "
                           f"{self.storage.uri}: it resumes from {'its beginning' if step is None else f'step {step}'}"
                           " (does every node see storage.uri?)")
            return
        write_state(state, checkpoints)


def write_state(state: State, checkpoints: Path) -> None:
    """Make ``state`` (``NodeAgent._state`` of the node it left) the newest checkpoint in ``checkpoints``, its links
    links again (a saver's copy of a Hugging Face snapshot arrived as copies, and its dangling links not at all)."""
    final = checkpoints / f"step-{state['step']}"
    for name, data in state["files"].items():
        (final / name).parent.mkdir(parents=True, exist_ok=True)
        (final / name).write_bytes(data)
    make_links(final, state["links"])
    pointer = checkpoints / f"{protocol.LATEST_FILE}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, checkpoints / protocol.LATEST_FILE)
