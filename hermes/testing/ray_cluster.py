"""A real multi-node Ray cluster on one machine, for tests and benchmarks of the Ray engine.

Each node is its own ``ray start`` (a head plus workers), with its own short temporary directory
(Unix socket paths are limited to 107 bytes), explicit free ports (several clusters, of other
users too, share the machine), fake GPUs (``--num-gpus`` declares resources; nothing checks
devices) and health checks tuned so that the GCS marks a dead node dead within about 1.5 s
instead of Ray's default 30 s, while a live one that a loaded machine leaves unscheduled for
seconds stays alive. Each ``ray start`` runs in a new session, and every process Ray
spawns for that node stays in it (Ray only calls ``setpgrp``), so the cluster finds, kills and
checks for survivors by session id and pid, never by name: ``ray stop`` would kill every Ray
process on the machine. Token authentication is on, with a token of this process's own (not
``~/.ray/auth_token``, which Ray would otherwise pick up), passed to every node and, through
``env`` and ``connect``, to the driver.

    with RayCluster(workers=2, gpus_per_node=2) as cluster:   # stop() on exit, by session and pid
        cluster.connect()                                      # ray.init(address=...) with the token
        node = cluster.add_node(num_gpus=1); cluster.wait_alive(node)
        killed = cluster.kill_raylet(node); dead = cluster.wait_alive(node, alive=False)
"""

from __future__ import annotations

import importlib.util
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Fast failure detection: the GCS checks each raylet every period; `threshold` failed checks in a
# row (each failing fast when the raylet is gone: connection refused) mark the node dead. A raylet
# that is there answers late when the machine is loaded: at 500 ms a stall of 3 s killed its node.
HEALTH_CHECK_PERIOD_MS = 500
HEALTH_CHECK_TIMEOUT_MS = 2500
HEALTH_CHECK_FAILURE_THRESHOLD = 3
HEALTH_CHECK_INITIAL_DELAY_MS = 500

WORKER_PORTS = 16  # Ray worker processes per node that may hold a port at once
_PORT_RANGE = (12000, 32000)  # below the kernel's ephemeral range (32768-60999), where clients bind
# `ray start`, as the `ray` command runs it, without the command groups the command line imports for its other
# commands (Serve's, jobs', the state API's), which cost ~1.3 s of CPU per node started.
_RAY_START = """
import sys
for name in ("ray.serve.scripts", "ray.dashboard.modules.job.cli", "ray.util.state.state_cli"):
    sys.modules[name] = None  # an ImportError, which the command line expects of a minimal install
from ray.scripts.scripts import main
sys.argv[0] = "ray"
sys.exit(main())
"""
# One token per process: Ray's C++ token loader reads it once, so a second cluster started by the same
# driver process must use the same token.
_TOKEN = secrets.token_hex(32)


@dataclass
class RayNode:
    """One ``ray start`` of the cluster: its ports, temporary directory and session."""

    name: str
    head: bool
    num_gpus: int
    temp_dir: Path
    ports: dict[str, int]
    session: int = 0  # the session id of its `ray start`, which every process of the node keeps
    node_id: str = ""  # Ray's hex NodeID, read from its raylet's command line
    raylet_pid: int = 0
    ip: str = ""  # the host's address as Ray resolves it (never 127.0.0.1: Ray replaces loopback)


@dataclass
class RayCluster:
    """A head and ``workers`` worker nodes; ``start`` it, ``add_node`` while it runs, ``stop`` at the end.

    Memory (PSS): about 200 MiB for the head and 120 MiB per worker node while no task runs, plus
    about 100 MiB per actor and what the object stores hold (``object_store_bytes`` per node is a
    cap, not a reservation).
    """

    workers: int = 2
    gpus_per_node: int = 2
    cpus_per_node: int = 1
    object_store_bytes: int = 100 * 2**20
    env_overrides: dict[str, str] = field(default_factory=dict)
    nodes: list[RayNode] = field(default_factory=list)
    root: Path = field(init=False)
    token: str = field(init=False, default_factory=lambda: _TOKEN)
    _saved_env: dict[str, str | None] = field(init=False, default_factory=dict)  # the driver's, before connect

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp"))

    @property
    def address(self) -> str:
        return f"{self.nodes[0].ip}:{self.nodes[0].ports['gcs']}"

    @property
    def env(self) -> dict[str, str]:
        """What every process of the cluster, the driver included, needs in its environment."""
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_health_check_period_ms": str(HEALTH_CHECK_PERIOD_MS),
            "RAY_health_check_timeout_ms": str(HEALTH_CHECK_TIMEOUT_MS),
            "RAY_health_check_failure_threshold": str(HEALTH_CHECK_FAILURE_THRESHOLD),
            "RAY_health_check_initial_delay_ms": str(HEALTH_CHECK_INITIAL_DELAY_MS),
            # No idle workers started ahead of need: each costs ~60 MB on a shared machine.
            "RAY_enable_worker_prestart": "0",
            "RAY_prestart_worker_first_driver": "0",
            **self.env_overrides,
        }

    def start(self) -> RayCluster:
        """The head, then the worker nodes side by side: a worker's ``ray start`` waits seconds for its node's
        processes to come up, and two such waits overlap (~12 s instead of ~19 s for two workers on a loaded
        2-core machine)."""
        self._await_node(*self._launch_node(head=True, num_gpus=0))
        launched = [self._launch_node(head=False, num_gpus=self.gpus_per_node) for _ in range(self.workers)]
        for node, process in launched:
            self._await_node(node, process)
        return self

    def add_node(self, num_gpus: int | None = None) -> RayNode:
        """Start a worker node and return once its raylet runs (the GCS lists it alive soon after)."""
        return self._await_node(
            *self._launch_node(head=False, num_gpus=self.gpus_per_node if num_gpus is None else num_gpus)
        )

    def kill_raylet(self, node: RayNode) -> float:
        """SIGKILL a worker node's raylet, as a crashed host would; return ``time.monotonic()`` of the kill.
        Its workers and agents notice and exit on their own; ``stop`` reaps any that remain."""
        if node.head:
            raise ValueError("kill a worker node, not the head: the GCS lives there")
        os.kill(node.raylet_pid, signal.SIGKILL)
        return time.monotonic()

    def kill_node(self, node: RayNode) -> None:
        """SIGKILL every process of the node's ``ray start`` session, as a host that dies takes them all; for
        the head, its GCS with them: the cluster is gone."""
        for pid, session in _sessions().items():
            if session == node.session:
                _signal(pid, signal.SIGKILL)

    def connect(self) -> None:
        """Make this process the cluster's driver (on the head node, which Ray prefers on a shared host).
        The cluster's environment stays in ``os.environ`` until ``stop``, which puts the old one back."""
        self._saved_env = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        _reload_ray_config()
        import ray

        ray.init(address=self.address, log_to_driver=False)

    def alive(self) -> dict[str, bool]:
        """Node id -> whether the GCS counts it alive, as the driver sees it (``ray.nodes()``)."""
        import ray

        return {node["NodeID"]: node["Alive"] for node in ray.nodes()}

    def wait_alive(self, node: RayNode, alive: bool = True, timeout: float = 30.0) -> float:
        """Poll the GCS every 20 ms until ``node`` is (or is no longer) alive; return ``time.monotonic()``
        when it was first seen so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive().get(node.node_id, False) == alive:
                return time.monotonic()
            time.sleep(0.02)
        raise TimeoutError(f"node {node.name} not {'alive' if alive else 'dead'} after {timeout} s")

    def pids(self) -> set[int]:
        """Every live process this cluster started: the members of its nodes' sessions."""
        sessions = {node.session for node in self.nodes}
        return {pid for pid, session in _sessions().items() if session in sessions}

    def memory(self) -> int:
        """Bytes of memory the cluster's processes use: the sum of their proportional set sizes (PSS),
        which counts shared libraries once rather than once per process as RSS does."""
        total = 0
        for pid in self.pids():
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) * 1024
        return total

    def stop(self, timeout: float = 10.0) -> set[int]:
        """Disconnect this process's driver, SIGKILL every process of the cluster and remove its
        directories; return the pids still alive after ``timeout``, which should be none. SIGKILL
        because a test cluster keeps nothing worth a graceful exit, and the GCS, raylets and agents
        take longer than 6 s to honour SIGTERM."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if self._saved_env:
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._saved_env = {}
            _reload_ray_config()
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)
        return self.pids()

    def __enter__(self) -> RayCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch_node(self, *, head: bool, num_gpus: int) -> tuple[RayNode, subprocess.Popen[bytes]]:
        """Run the node's ``ray start``, without waiting for it (``_await_node`` does)."""
        name = "head" if head else f"w{len(self.nodes)}"
        keys = ["node_manager", "object_manager", "metrics", "runtime_env_agent", "agent_http", "agent_grpc"]
        keys += ["gcs", "client_server", "dashboard"] if head else []
        # not those of a node still starting, which may not listen on them yet
        free = _free_ports(len(keys) + WORKER_PORTS, taken={port for node in self.nodes for port in _port_range(node)})
        ports = dict(zip(keys, free))
        ports["min_worker"], ports["max_worker"] = free[len(keys)], free[-1]
        node = RayNode(name, head, num_gpus, self.root / name, ports)
        node.temp_dir.mkdir()
        command = [
            sys.executable, "-c", _RAY_START, "start",
            f"--temp-dir={node.temp_dir}",
            f"--num-cpus={self.cpus_per_node}",
            f"--num-gpus={num_gpus}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--node-manager-port={ports['node_manager']}",
            f"--object-manager-port={ports['object_manager']}",
            f"--metrics-export-port={ports['metrics']}",
            f"--runtime-env-agent-port={ports['runtime_env_agent']}",
            f"--dashboard-agent-listen-port={ports['agent_http']}",
            f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
            f"--min-worker-port={ports['min_worker']}",
            f"--max-worker-port={ports['max_worker']}",
            "--include-log-monitor=false",
            "--disable-usage-stats",
        ]
        if head:
            # The head's API server (jobs, usage stats) runs even without the dashboard, on 8265 unless told.
            command += ["--head", f"--port={ports['gcs']}", f"--dashboard-port={ports['dashboard']}"]
            command += ["--include-dashboard=false", "--no-monitor"]  # no autoscaler monitor: nothing to scale
            if importlib.util.find_spec("grpc") is not None:  # Ray Client is there: it would take port 10001
                command.append(f"--ray-client-server-port={ports['client_server']}")
        else:
            command.append(f"--address={self.address}")
        self.nodes.append(node)  # before it starts: stop() must reap a half-started node too
        process = subprocess.Popen(
            command,
            env={**os.environ, **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node.session = process.pid
        return node, process

    def _await_node(self, node: RayNode, process: subprocess.Popen[bytes]) -> RayNode:
        """Wait for the node's ``ray start`` to end, its raylet running."""
        output, _ = process.communicate(timeout=120)
        if process.returncode != 0:
            raise RuntimeError(f"ray start of {node.name} failed ({process.returncode}):\n{output.decode()[-3000:]}")
        node.raylet_pid, arguments = _raylet(node.session)
        node.node_id, node.ip = arguments["--node_id"], arguments["--node_ip_address"]
        return node


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` consecutive ports that nothing listens on now and none of ``taken``, at a random place in the
    range, so that clusters started at the same time rarely collide."""
    for _ in range(200):
        base = random.randrange(_PORT_RANGE[0], _PORT_RANGE[1] - count)
        ports = list(range(base, base + count))
        if taken.isdisjoint(ports) and all(_port_free(port) for port in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in {_PORT_RANGE}")


def _port_range(node: RayNode) -> range:
    """Every port the node was given, its workers' included."""
    return range(min(node.ports.values()), max(node.ports.values()) + 1)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _sessions() -> dict[int, int]:
    """pid -> session id of every process on the machine (from /proc/<pid>/stat)."""
    sessions: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if fields[0] != "Z":  # a zombie is dead, only not yet reaped by its parent
            sessions[int(entry)] = int(fields[3])
    return sessions


def _raylet(session: int) -> tuple[int, dict[str, str]]:
    """The pid and the ``--name=value`` arguments of the raylet in a node's session."""
    for pid, member in _sessions().items():
        if member != session:
            continue
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if Path(arguments[0]).name == "raylet":
            return pid, dict(a.split("=", 1) for a in arguments[1:] if a.startswith("--") and "=" in a)
    raise RuntimeError(f"no raylet in session {session}")


def _reload_ray_config() -> None:
    """Ray reads its settings (token auth among them) from the environment when it is imported; make a
    driver that imported it before (another test module) read them again, as Ray's own token set-up does."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
