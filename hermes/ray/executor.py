"""The Ray executor: the execution contract over one node agent per Ray node with GPUs (or per node on CPUs).

The driver (``hermes run``: the engine loop, the core, the store) keeps no trial process; each
node's agent (``hermes.ray.agent``) runs that node's slots. Decisions and settled reports are
buffered per agent and sent in one call when the driver next waits. The driver waits with
``ray.wait`` on every agent's pending ``next_events`` call, so an event reaches the core as soon as
an agent has it; ``wake`` makes those calls return. Its clock stamps every event as it arrives.

Membership comes from Ray's node table, read every ``poll`` seconds: a new alive node with GPUs
(any alive node with Ray CPUs, with ``cpu_slots``) gets an agent, whose first events are its ``NodeAdded``; while no
alive node has a GPU, the trials' GPUs are asked of Ray's autoscaler (``request_resources``), which sees no other demand
of Hermes's; a dead node, or a dead agent (its pending
call fails with ``ActorDiedError``), becomes ``NodeRemoved``, and its trials fall back to their
last durable checkpoint. ``ActorUnavailableError`` is transient: the call is sent again (the agent
ignores a call it has, by its sequence number).

Where a suspended trial resumes decides how its state travels: on its own node, from memory (or
local disk), as on one machine; on another live node, as the return value of the source agent's
``export`` (owned by the driver) handed to the destination's ``receive``; when its node is gone
(or the driver restarted), from the storage URI, catching up silently to the step the core knows.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.core.decisions import Decision, Resume, Start, Stop, Suspend
from hermes.core.events import (
    Event,
    GpuRemoved,
    NodeAdded,
    NodeRemoved,
    PeriodElapsed,
    TrialExited,
    TrialReported,
    TrialSubmitted,
    TrialSuspended,
)
from hermes.core.policy import ExecutionProfile
from hermes.errors import ClusterLost, HermesError
from hermes.execution.contract import Executor
from hermes.local.handshake import TrialProgress
from hermes.local.launch import WARM_SWITCH_COST, TrialLaunch
from hermes.local.launchers.base import driver_script
from hermes.local.loop import checked_period, monotonic_clock
from hermes.ray.storage import CheckpointStore

log = logging.getLogger("hermes.ray")
PLACEMENT_NOTE_S = 5.0  # seconds a node's agent may wait for Ray to place it before the user is told
HEAD_TIMEOUT = 5.0  # seconds a connection to the cluster's head may take before it counts as gone
# How a local launcher's TrialExited begins where starting the trial's process raised (hermes.local.launchers)
LAUNCH_FAILURE = "cannot start "


def _agent_gone() -> tuple[type[Exception], ...]:
    """What a call to an agent raises when the agent is gone for good: it died, or Ray can no longer place it (its
    node died before it started there: not a RayActorError)."""
    import ray

    return ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError


def node_name(node_id: str) -> str:
    """The Hermes name of a Ray node: the start of its NodeID (GPUs are ``<name>/gpu<i>``)."""
    return node_id[:12]


@dataclass(eq=False)
class _Agent:
    """The driver's view of one node agent."""

    node: str
    node_id: str
    handle: Any
    ready: bool = False  # its NodeAdded has come
    seq: int = 0  # the last call sent
    done: int = 0  # the last call it has run, as it last said
    busy: bool = True  # whether a run of it may still report, as it last said
    after: int = 0  # the number of the last event received
    buffer: list[tuple] = field(default_factory=list)  # commands not sent yet
    listening: Any = None  # its pending next_events call
    trials: set[str] = field(default_factory=set)  # trials it knows (submitted there, not handed over)


class RayExecutor(Executor[TrialLaunch]):
    """Runs trials on a Ray cluster this process is connected to (``ray.init``); see the module docstring.

    ``directory``: each agent keeps its trials under ``<directory>/nodes/<node>/`` on its own node.
    ``storage_uri``: the durable checkpoints (``hermes.ray.storage``). ``agent_timeout``: how long
    the first ``next_events`` waits for the agents of the nodes there are at the start.
    ``cpu_slots``: every node with Ray CPUs runs that many CPU slots of ``threads_per_slot`` cores, and no GPU
    (``resources.gpus: none``, as on one machine); None: the GPUs of the nodes that have some.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        storage_uri: str,
        metric: str | None = None,
        checkpoint_every: int = 0,
        period: float | None = None,
        clock_offset: float = 0.0,
        poll: float = 0.25,
        agent_timeout: float = 120.0,
        cpu_slots: int | None = None,
        threads_per_slot: int = 1,
    ) -> None:
        import ray

        if not ray.is_initialized():
            raise HermesError("the Ray executor needs a connected driver: call ray.init first")
        self.directory = Path(directory).resolve()
        self.storage_uri = storage_uri
        self._storage = CheckpointStore(storage_uri)
        self._shared = self._storage.mark_shared()  # every node's agent must see it (NodeAgent)
        self._driver_script = driver_script()  # whose command line the trials see (NodeAgent)
        self.metric = metric
        self.checkpoint_every = checkpoint_every
        self.poll = poll
        self.cpu_slots = cpu_slots
        self.threads_per_slot = threads_per_slot
        self._told_no_gpu = False  # whether the user was told that no node has a GPU (with cpu_slots: a Ray CPU)
        self._requested_gpus = 0  # GPUs asked of Ray's autoscaler and not withdrawn
        self.profile = ExecutionProfile(switch_cost=WARM_SWITCH_COST)
        self._clock = monotonic_clock(clock_offset)
        self.period: float | None = None
        self._next_tick: float | None = None
        self.set_period(period)
        self._agents: dict[str, _Agent] = {}  # node name -> agent, created and not lost
        self._retired: set[str] = set()  # node ids whose agent was lost: never another
        self._gpus: dict[str, str] = {}  # GPU -> node name
        self._work: dict[str, TrialLaunch] = {}
        self._ended: set[str] = set()  # trials the core runs no more (``trial_ended``), until started again
        self._progress: dict[str, TrialProgress] = {}
        # trial -> the step of its newest checkpoint in storage.uri as this driver knows it: a suspension's does not
        # count (a trial parked in memory is not uploaded), though the core falls back to it (``TrialProgress``)
        self._durable: dict[str, int | None] = {}
        self._where: dict[str, str] = {}  # trial -> node of the agent that holds it
        self._gpu_of: dict[str, str] = {}  # trial -> GPU of its latest run
        self._ran: dict[str, float] = {}  # trial -> seconds of its runs that ended, on any node (trial.timeout)
        self._running_since: dict[str, float] = {}  # trial -> when its run in progress began
        self._calls: dict[Any, tuple[_Agent, tuple]] = {}  # pending call ref -> (agent, its arguments)
        self._events: list[Event] = []
        self._woken = False
        self._closed = False
        self._lost = False  # the cluster's head is gone
        self._next_poll = 0.0
        self._started = False  # the agents of the nodes there were at the start are ready, or timed out
        self._refused: list[str] = []  # why agents could not start (``_lose``)
        self._served = False  # an agent was ready once: the run has a node that can run its trials
        try:
            self._poll_membership()
            started = time.monotonic()
            deadline, noted = started + agent_timeout, False
            while any(not a.ready for a in self._agents.values()) and time.monotonic() < deadline:
                self._wait(min(1.0, deadline - time.monotonic()))
                if not noted and time.monotonic() - started > PLACEMENT_NOTE_S:
                    noted = True
                    self._note_unplaced(agent_timeout)
            if self._refused and not self._agents:  # no node could: the spec's or the storage's, not a node's
                raise self._refusal()
        except BaseException:
            self.close()  # the agents that did start
            raise
        for problem in self._refused:
            log.warning("%s; it runs no trial, the run goes on on the other nodes", problem)
        self._started = True

    def _note_unplaced(self, agent_timeout: float) -> None:
        """Say which nodes' agents Ray has not started yet: other Ray work holds their GPUs (another experiment's
        run, say), or the node died and Ray has not noticed yet. A second user's run waited there for minutes
        without a word."""
        waiting = sorted(agent.node for agent in self._agents.values() if not agent.ready)
        if waiting:
            log.warning("waiting for Ray to start this run on node(s) %s: their GPUs are held by other Ray work "
                        "(another experiment's run?), or the node died and Ray has not marked it dead yet; it starts "
                        "on the others after %.0f s in all, and takes these up once Ray starts them",
                        ", ".join(waiting), agent_timeout)

    # ------------------------------------------------------------------ the contract
    def now(self) -> float:
        return self._clock()

    def submit(
        self, trial_id: str, work: TrialLaunch, *, at: float | None = None, reported_step: int = 0
    ) -> TrialSubmitted:
        if trial_id in self._work:
            raise HermesError(f"trial {trial_id} submitted twice")
        if not self._work or work.switch_cost > self.profile.switch_cost:
            self.profile = ExecutionProfile(switch_cost=work.switch_cost)
        self._work[trial_id] = work
        self._progress[trial_id] = TrialProgress(
            trial_id=trial_id, last_step=reported_step, checkpoint_step=reported_step
        )
        self._durable[trial_id] = None if work.movable and reported_step else 0  # None: read where it is received
        return TrialSubmitted(self.now() if at is None else at, trial_id, work.budget, dict(work.config), work.movable)

    def _durable_step(self, trial_id: str) -> int:
        """The step of the trial's newest checkpoint in storage.uri as this driver knows it. For a trial submitted
        with its steps known (a rerun), what storage.uri holds up to them, read as it is first received on a node (at
        submission, a rerun of thousands of trials read it for each, finished ones too): the core falls back to its
        last suspension, which a trial parked in memory never uploaded, and the node warned of a checkpoint missing
        from storage.uri."""
        step = self._durable[trial_id]
        if step is None:
            try:
                latest = self._storage.latest(self._work[trial_id].durable or trial_id)
            except OSError:
                latest = None  # unknown: the node's download says what there is
            known = self._progress[trial_id].checkpoint_step  # the step it was submitted with
            step = self._durable[trial_id] = 0 if latest is None else min(latest[1], known)
        return step

    def apply(self, decision: Decision, at: float) -> None:
        trial_id = decision.trial_id
        if trial_id not in self._work:
            raise HermesError(f"unknown trial {trial_id}: submit it to the executor first")
        if isinstance(decision, (Start, Resume)):
            self._ended.discard(trial_id)  # it runs again (``trial_ended``)
            target = self._agent_of_gpu(decision.gpu)
            self._running_since[trial_id] = at
            if isinstance(decision, Start):
                progress = self._progress[trial_id]
                progress.last_step = progress.checkpoint_step = self._durable[trial_id] = 0
                self._place(target, trial_id, "submit")
                target.buffer.append(("apply", decision))
            else:
                self._resume(target, decision)
            self._where[trial_id] = target.node
            self._gpu_of[trial_id] = decision.gpu
        elif isinstance(decision, (Suspend, Stop)):
            agent = self._agents.get(self._where.get(trial_id, ""))
            if agent is not None and trial_id in agent.trials:
                agent.buffer.append(("apply", decision))

    def settled(self, event: Event) -> None:
        if isinstance(event, TrialReported):
            agent = self._agents.get(self._where.get(event.trial_id, ""))
            if agent is not None:
                agent.buffer.append(("settle", event.trial_id, event.step))

    def trial_ended(self, trial_id: str) -> None:
        if trial_id in self._work:  # not one forgotten already (``end_worker_group``)
            self._ended.add(trial_id)

    def next_events(self) -> list[Event]:
        self._flush()
        while not self._events:  # an agent's word (a call run, say) returns too: idle() may have changed
            if self._woken or self.idle() or self._wait(self._timeout()):
                break
        self._woken = False
        events, self._events = self._events, []
        return events

    def idle(self) -> bool:
        if self._events:
            return False
        agents = self._agents.values()
        if not any(a.ready for a in agents):
            return False  # no GPU yet: one may join
        return all(a.ready and not a.busy and not a.buffer and a.done >= a.seq for a in agents)

    def wake(self) -> None:
        """From any thread: make the agents' pending ``next_events`` return, and with them ``ray.wait``."""
        self._woken = True
        for agent in list(self._agents.values()):
            if agent.listening is not None:
                agent.handle.wake.remote()
                return

    def close(self) -> None:
        """End every agent (and so every trial process); pending events are dropped."""
        if self._closed:
            return
        self._closed = True
        self._storage.unmark_shared(self._shared)
        if self._lost:
            return  # nothing to ask a cluster that is gone: its agents died with it, or end when they find it gone
        import ray

        agents = list(self._agents.values())
        # An agent Ray has not placed yet holds no trial, and would answer only once placed: 30 s of waiting.
        closing = [agent.handle.close.remote() for agent in agents if agent.ready]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=30)
        finally:
            for agent in agents:
                ray.kill(agent.handle, no_restart=True)
            self._agents.clear()
            self._events.clear()
            self._request_gpus(0)

    def remove_gpu(self, gpu: str) -> None:
        """Take ``gpu`` out of service at once; its agent reports ``GpuRemoved``."""
        agent = self._agent_of_gpu(gpu)
        agent.buffer.append(("remove_gpu", gpu))

    def set_period(self, period: float | None) -> None:
        """Emit a PeriodElapsed every ``period`` seconds from now on (None: none), as ``period`` at construction."""
        if checked_period(period) != self.period:
            self.period = period
            self._next_tick = self.now() + period if period is not None else None

    def end_worker_group(self, group: str) -> None:
        """End the warm workers of ``group`` (TrialLaunch.worker_group) on every node, and forget its trials, here and
        there (``LocalExecutor.end_worker_group``): they have all ended, a pool's experiment that ended. A server's
        pool runs thousands of experiments, and kept every trial of each for its life."""
        for agent in self._agents.values():
            agent.buffer.append(("end_worker_group", group))
        for trial_id in [trial_id for trial_id, work in self._work.items() if work.worker_group == group]:
            for kept in (self._work, self._progress, self._durable, self._where, self._gpu_of, self._ran,
                         self._running_since):
                kept.pop(trial_id, None)
            self._ended.discard(trial_id)
            for agent in self._agents.values():
                agent.trials.discard(trial_id)

    # ------------------------------------------------------------------ decisions
    def _agent_of_gpu(self, gpu: str) -> _Agent:
        agent = self._agents.get(self._gpus.get(gpu, ""))
        if agent is None:
            raise HermesError(f"unknown GPU {gpu}; this executor has {', '.join(self._gpus) or 'none'}")
        return agent

    def _place(self, agent: _Agent, trial_id: str, kind: str, *extra: Any) -> None:
        """Make the trial known to ``agent`` (a ``submit``, or a ``receive`` of its state), with the time it ran
        on other nodes, which its trial.timeout counts too."""
        work = dataclasses.replace(self._work[trial_id], ran=self._ran.get(trial_id, 0.0))
        agent.buffer.append((kind, trial_id, work, self._progress[trial_id].last_step, *extra))
        agent.trials.add(trial_id)

    def _run_ended(self, trial_id: str) -> None:
        since = self._running_since.pop(trial_id, None)
        if since is not None:
            self._ran[trial_id] = self._ran.get(trial_id, 0.0) + self.now() - since

    def _resume(self, target: _Agent, decision: Resume) -> None:
        trial_id = decision.trial_id
        if trial_id in target.trials:  # on its own node: from memory or local disk
            target.buffer.append(("apply", decision))
            return
        source = self._agents.get(self._where.get(trial_id, ""))
        carried = None
        if source is not None and trial_id in source.trials:  # another live node: through the object store
            source.trials.discard(trial_id)
            source.buffer.append(("export", trial_id))
            carried = self._send(source, watch=False)  # never fetched here: it goes to the target
        self._place(target, trial_id, "receive", self._durable_step(trial_id))
        target.buffer.append(("apply", decision))
        self._send(target, [carried] if carried is not None else None)

    # ------------------------------------------------------------------ calls and events
    def _flush(self) -> None:
        for agent in list(self._agents.values()):
            if agent.buffer:
                self._send(agent)

    def _send(self, agent: _Agent, carried: list[Any] | None = None, *, watch: bool = True) -> Any:
        """Send the agent's buffered commands as one call and return its ref (an ``export``'s state).
        A watched call's failure is seen in ``_wait``."""
        agent.seq += 1
        arguments = (agent.seq, agent.buffer, carried)
        agent.buffer = []
        ref = agent.handle.call.remote(*arguments)
        if watch:
            self._calls[ref] = (agent, arguments)
        return ref

    def _listen(self, agent: _Agent) -> None:
        agent.listening = agent.handle.next_events.remote(agent.after)

    def _timeout(self) -> float:
        deadline = self._next_poll if self._next_tick is None else min(self._next_poll, self._next_tick)
        return max(0.0, deadline - self.now())

    def _wait(self, timeout: float) -> bool:
        """Wait for an agent's events or the end of a call, at most ``timeout`` seconds; take what
        came, and say whether an agent's events or state changed."""
        import ray

        for agent in self._agents.values():
            if agent.listening is None:
                self._listen(agent)
        listening = {agent.listening: agent for agent in self._agents.values()}
        refs = [*listening, *self._calls]
        if refs:
            ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        else:
            time.sleep(timeout)
            ready = []
        changed = False
        for ref in ready:  # one may belong to an agent an earlier one showed lost
            if ref in listening:
                changed = self._heard(listening[ref], ref) or changed
            else:
                self._answered(ref)
        if self.now() >= self._next_poll:
            self._poll_membership()
        if self._next_tick is not None and self.now() >= self._next_tick:
            while self._next_tick <= self.now():
                self._next_tick += self.period
            self._events.append(PeriodElapsed(self.now()))
        return changed

    def _heard(self, agent: _Agent, ref: Any) -> bool:
        """Take an agent's reply; whether it brought events or changed what the agent last said."""
        import ray

        agent.listening = None
        if agent.node not in self._agents:
            return False
        try:
            events, numbered, busy, done = ray.get(ref)
        except ray.exceptions.ActorUnavailableError:
            return False  # transient: listen again
        except _agent_gone() as error:
            self._lose(agent, error)
            return True
        changed = bool(events) or (busy, done) != (agent.busy, agent.done)
        agent.after, agent.busy, agent.done = numbered, busy, done
        for event in events:
            if isinstance(event, str):
                log.warning("Ray node %s: %s", agent.node, event)
            else:
                self._take(agent, dataclasses.replace(event, at=self.now()))
        return changed

    def _answered(self, ref: Any) -> None:
        import ray

        agent, arguments = self._calls.pop(ref, (None, None))
        if agent is None or agent.node not in self._agents:
            return  # its agent was lost meanwhile
        try:
            ray.get(ref)
        except ray.exceptions.ActorUnavailableError:
            retry = agent.handle.call.remote(*arguments)  # the agent ignores it if the first one arrived
            self._calls[retry] = (agent, arguments)
        except _agent_gone() as error:
            self._lose(agent, error)
        except ray.exceptions.RayTaskError as error:
            raise error.as_instanceof_cause() from None

    def _take(self, agent: _Agent, event: Event) -> None:
        """Keep the driver's view of the trials in step with an agent's event, and queue it. An event of a trial
        forgotten here (its experiment ended, ``end_worker_group``) was under way when it ended: it goes too."""
        trial_id = getattr(event, "trial_id", None)
        if trial_id is not None and trial_id not in self._work:
            return
        if isinstance(event, NodeAdded):
            agent.ready = self._served = True
            self._gpus.update(dict.fromkeys(event.gpus, agent.node))
        elif isinstance(event, GpuRemoved):
            self._gpus.pop(event.gpu, None)
            for trial_id, gpu in self._gpu_of.items():
                if gpu == event.gpu and self._where.get(trial_id) == agent.node:
                    self._lost_run(trial_id)
                    self._run_ended(trial_id)
        elif isinstance(event, TrialReported):
            progress = self._progress[event.trial_id]
            progress.last_step = event.step
            if event.checkpointed:  # uploaded: the agent forwards such a report once its checkpoint is durable
                progress.checkpoint_step = self._durable[event.trial_id] = event.step
        elif isinstance(event, TrialSuspended):
            progress = self._progress[event.trial_id]
            progress.last_step = progress.checkpoint_step = event.step
            self._run_ended(event.trial_id)
        elif isinstance(event, TrialExited):
            self._run_ended(event.trial_id)
            if not event.succeeded and (event.error or "").startswith(LAUNCH_FAILURE):
                # Its node's making (the trial's workdir not mounted there, say), which on one machine would be the
                # spec's: it runs again on another node, as after any crash, instead of failing for good.
                event = dataclasses.replace(event, crashed=True)
            if event.crashed:
                self._lost_run(event.trial_id)  # the core may run it again from its checkpoint
            if event.error and not event.succeeded and event.error != "stopped":  # which node, when one is bad
                event = dataclasses.replace(event, error=f"Ray node {agent.node}: {event.error}")
        self._events.append(event)

    def _lost_run(self, trial_id: str) -> None:
        """Its run died: the steps past its checkpoint are reported again; a trial that is not movable starts again
        from its beginning and catches up every step it reported (``Trial.catch_up_step``)."""
        if self._work[trial_id].movable:
            self._progress[trial_id].lost()

    def _lose(self, agent: _Agent, error: Exception | None = None) -> None:
        """The agent or its node died (``error``: how the driver learnt it): its trials fall back to their
        durable checkpoints. An agent that raised as it started (a node without the storage's mount, say) is that
        node's problem: it is left out, with a warning, and the run goes on on the others; where every node there at
        the start refused, the run cannot go on, and a HermesError says why (``__init__``)."""
        import ray

        self._check_head()  # an agent lost with the head: ray.kill would wait a minute for its GCS
        del self._agents[agent.node]
        self._retired.add(agent.node_id)
        ray.kill(agent.handle, no_restart=True)  # a live node's stray agent must not run on
        for ref in [ref for ref, (owner, _) in self._calls.items() if owner is agent]:
            del self._calls[ref]
        if isinstance(error, ray.exceptions.RayActorError) and error.actor_init_failed:
            cause = next((line for line in reversed(str(error).splitlines()) if line.strip()), "no reason given")
            problem = (f"Hermes could not start on Ray node {agent.node}: "
                       f"{cause.strip().removeprefix('hermes.errors.HermesError: ')}")
            self._refused.append(problem)
            if not self._started:
                return  # said once every node there at the start is ready or refused (``__init__``)
            if not self._agents and not self._served:  # the last of those, its GPUs held by other Ray work till now
                raise self._refusal()
            log.warning("%s; it runs no trial, the run goes on on the other nodes", problem)
            return
        if not agent.ready:
            return
        for gpu in [gpu for gpu, node in self._gpus.items() if node == agent.node]:
            del self._gpus[gpu]
        for trial_id in [t for t, node in self._where.items() if node == agent.node]:
            self._lost_run(trial_id)
            self._run_ended(trial_id)
            del self._where[trial_id]
        self._events.append(NodeRemoved(self.now(), agent.node))

    def _refusal(self) -> HermesError:
        """Why no node can run the trials: the first refusal, and how many more there were."""
        others = f" (and on {len(self._refused) - 1} other node(s))" if len(self._refused) > 1 else ""
        return HermesError(self._refused[0] + others)

    def _request_gpus(self, count: int) -> None:
        """Ask Ray's autoscaler for ``count`` GPUs, one per trial the core may still run (0: withdraw the request).
        Trials wait in Hermes's queue, not as Ray work, so an autoscaler (KubeRay's) sees no demand of theirs and never
        adds a GPU node by itself; where no autoscaler runs, the request is only a record in the GCS."""
        if count == self._requested_gpus:
            return
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"GPU": 1}] * count)  # replaces the last request; [] withdraws it
        self._requested_gpus = count

    def _check_head(self) -> None:
        """ClusterLost when the head's GCS takes no connection: ``ray.nodes()`` would wait a minute for it, deaf to
        signals, and then Ray would end this process without a word."""
        import ray

        address = ray.get_runtime_context().gcs_address
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=HEAD_TIMEOUT).close()
        except OSError as error:
            self._lost = True
            raise ClusterLost(f"lost the Ray cluster: its head at {address} takes no connection "
                              f"({error.strerror or error})") from None

    def _poll_membership(self) -> None:
        """Agents for new alive nodes with GPUs (any, with CPU slots); NodeRemoved for the dead ones."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from hermes.ray.agent import NodeAgent

        self._next_poll = self.now() + self.poll
        self._check_head()
        alive, cpus = {}, {}
        for node in ray.nodes():
            if node["Alive"]:
                alive[node["NodeID"]] = int(node["Resources"].get("GPU", 0))
                cpus[node["NodeID"]] = node["Resources"].get("CPU", 0)
        for agent in list(self._agents.values()):
            if agent.node_id not in alive:
                self._lose(agent)
        known = {agent.node_id for agent in self._agents.values()} | self._retired
        remote = ray.remote(NodeAgent)
        on_gpus = self.cpu_slots is None
        # With no GPU node alive no trial holds a GPU: every one the core may still run waits for one.
        waiting = len(self._work.keys() - self._ended) if on_gpus and not any(alive.values()) else 0
        self._request_gpus(waiting)
        if waiting and not self._told_no_gpu:
            self._told_no_gpu = True
            log.warning("waiting for a Ray node with GPUs: the cluster has none yet (%d alive node(s), none with a "
                        "GPU); Hermes asked Ray's autoscaler for %d GPU(s), and the trials start when a GPU node "
                        "joins (where no autoscaler runs, add a node with GPUs; to run on the nodes' CPUs instead, "
                        "set resources.gpus: none and resources.cpu_slots)", len(alive), waiting)
        if not on_gpus and self._work and not any(cpus.values()) and not self._told_no_gpu:
            self._told_no_gpu = True
            log.warning("waiting for a Ray node with CPUs: none of the %d alive node(s) has a Ray CPU (a node started "
                        "with num-cpus 0, as a head kept for the driver, runs no trial)", len(alive))
        for node_id, gpus in alive.items():
            # With CPU slots, a node with no Ray CPU (a head started with num-cpus 0) is kept free of Ray work.
            if (gpus < 1 if on_gpus else cpus[node_id] <= 0) or node_id in known:
                continue
            name = node_name(node_id)
            handle = remote.options(
                num_cpus=0,
                num_gpus=gpus if on_gpus else 0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                max_concurrency=16,
                max_restarts=0,
            ).remote(name, str(self.directory / "nodes" / name), self.metric, self.checkpoint_every, self.storage_uri,
                     self.cpu_slots, self.threads_per_slot, self._shared, self._driver_script)
            self._agents[name] = _Agent(name, node_id, handle)
