"""The Ray engine: a spec's trials on the GPU nodes of a Ray cluster, one node agent per node.

``engine: ray`` in a spec, with ``ray.address`` (``auto``: the cluster this machine belongs to; ``local``: a
Ray instance started for this run, on this machine alone) and
``storage.uri`` for durable checkpoints; the trials themselves run as with the local engine. With
``resources.gpus: none`` every node runs ``resources.cpu_slots`` CPU slots instead, as one machine
without GPUs does.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from hermes.core.policy import ExecutionProfile
from hermes.errors import HermesError, install_extra
from hermes.execution.registry import ExecutionEngine
from hermes.local.engine import tick_period, trial_launch, trial_profile
from hermes.local.launch import TrialLaunch
from hermes.ray.executor import RayExecutor
from hermes.ray.storage import checked_store, experiment_uri

if TYPE_CHECKING:
    from hermes.experiment.spec import ExperimentSpec

CONNECT_TIMEOUT_S = 10.0  # to reach a cluster's head: a live one answers in milliseconds, even across regions
GCS_CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # the first call every Ray driver makes


def connect(address: str, setting: str) -> bool:
    """Make this process the driver of the Ray cluster at ``address`` (``auto``: the one this machine belongs to;
    ``local``: a new instance of this process's own), unless it is one already; whether it started a Ray of its
    own (for its caller to end). A HermesError names the ``setting`` that gave the address."""
    field = setting  # the spec's, where RAY_ADDRESS gives the address in its place
    try:
        import ray
    except ImportError:
        raise HermesError(f"{setting}: Ray is not installed: {install_extra('ray')}") from None
    if address == "auto" and os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        # Ray connects there in place of auto: a bad one was reported as "'auto' is not an address", and one that
        # takes no connection was retried for minutes
        address, setting = os.environ["RAY_ADDRESS"], f"RAY_ADDRESS (used for {field}: auto)"
    target = _host_port(address)
    if target is not None and not 0 < target[1] < 65536:  # passed over by both checks below, retried by Ray for minutes
        raise HermesError(f"{setting}: {address!r}: port must be 1-65535")
    if ray.is_initialized():
        _check_same_cluster(address, setting)
        return False
    try:
        if address == "local":
            _start_undisturbed(lambda: ray.init(address=address, log_to_driver=False), ray.shutdown)
        else:
            _check_reachable(address, setting)
            ray.init(address=address, log_to_driver=False)
    except ConnectionError as error:
        local = f"set {field}: local" if field == setting else f"unset RAY_ADDRESS and set {field}: local"
        hint = ("; start a cluster on this machine (ray start --head), give the address of another, or "
                f"{local} to start Ray for this run only; a cluster with token authentication needs its "
                "RAY_AUTH_MODE and RAY_AUTH_TOKEN in this process's environment, as every node has them")
        raise HermesError(f"{setting}: cannot connect to {address!r}: {str(error).rstrip('.')}{hint}") from None
    except ValueError as error:  # Ray reads the address first: "garbage", "host:abc"
        raise HermesError(f"{setting}: {address!r} is not an address: {error}; give HOST:PORT of a cluster's "
                          "head, auto (the cluster this machine belongs to) or local (Ray for this run only)"
                          ) from None
    except RuntimeError as error:
        if not str(error).startswith("Version mismatch"):
            raise
        raise HermesError(f"{setting}: cannot connect to {address!r}: {' '.join(str(error).split())}; run Hermes with "
                          "the cluster's Ray and Python versions") from None
    return address == "local"


def _check_same_cluster(address: str, setting: str) -> None:
    """This process is a driver already (``ray.init`` called, or a run before this one): refuse an explicit
    HOST:PORT of another cluster, which it would not be using."""
    import ray

    wanted, current = _host_port(address), ray.get_runtime_context().gcs_address
    have = _host_port(current)
    if wanted is None or have is None:
        return  # auto, local: the cluster it is connected to
    try:
        same = _endpoints(*wanted) & _endpoints(*have)
    except OSError:
        return  # not resolvable here: Ray's own connection is the judge
    if not same:
        raise HermesError(f"{setting}: this process is a Ray driver of the cluster at {current} already, not of "
                          f"{address!r}: call ray.shutdown() first, or give that cluster's address")


def _check_reachable(address: str, setting: str) -> None:
    """Refuse at once a HOST:PORT that takes no connection, or whose server is not a Ray head: Ray itself retries
    either for about 14 minutes, deaf to Ctrl-C. Addresses Ray reads otherwise (``auto``, or no port) are left to
    it."""
    target = _host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        reason = f"no answer in {CONNECT_TIMEOUT_S:g} s" if isinstance(error, TimeoutError) else error.strerror or error
        raise HermesError(f"{setting}: cannot reach {address!r} ({reason}); is the cluster's head running there "
                          "(ray start --head), and is its port open to this machine?") from None
    if "://" not in address and not os.environ.get("RAY_USE_TLS"):  # ray:// is Ray Client; TLS is Ray's to speak
        _check_answers_as_head(address, target, setting)


def _check_answers_as_head(address: str, target: tuple[str, int], setting: str) -> None:
    """Ask the port for the cluster's id as Ray's GCS would be asked: a head answers in milliseconds (refusing a
    request without its token still answers), while another server (the dashboard's 8265, a Ray Client's 10001,
    anything else) does not speak that protocol. grpcio comes with Ray."""
    import grpc

    host, port = target
    # through an HTTP proxy only where Ray goes through one (it leaves http_proxy aside unless told)
    proxy = int(os.environ.get("RAY_grpc_enable_http_proxy", "0").lower() in ("1", "true"))
    address_text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(address_text, options=[("grpc.enable_http_proxy", proxy)]) as channel:
        ask = channel.unary_unary(GCS_CLUSTER_ID_METHOD, request_serializer=lambda _: b"",  # an empty request
                                  response_deserializer=lambda reply: reply)
        try:
            ask(None, timeout=CONNECT_TIMEOUT_S)
            return
        except grpc.RpcError as error:
            code = error.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
        answer = {grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer in {CONNECT_TIMEOUT_S:g} s",
                  grpc.StatusCode.UNIMPLEMENTED: "a gRPC server, but not Ray's"}.get(code, "not gRPC")
        raise HermesError(f"{setting}: {address!r} takes connections but is not a Ray cluster's head ({answer}); "
                          "give the head's GCS port (6379 unless ray start --head was given --port), not the "
                          "dashboard's or Ray Client's")


def _endpoints(host: str, port: int) -> set[tuple[str, int]]:
    """The socket addresses a host and port resolve to (``localhost`` and ``127.0.0.1`` share one)."""
    return {info[4][:2] for info in socket.getaddrinfo(host, port)}


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port of a ``[scheme://]HOST:PORT`` address; None for any other (``auto``, ``local``)."""
    host, _, port = address.partition("://")[2 if "://" in address else 0].rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _start_undisturbed(start: Callable[[], object], stop: Callable[[], None]) -> None:
    """Run ``start`` with Ctrl-C held back until it returns; then, if it came, ``stop`` and raise
    KeyboardInterrupt. Cut short, Ray's start left some of its processes running, with no one to end them. A
    second Ctrl-C is taken at once. (SIGTERM is Ray's: ``ray.init`` sets its own handler first thing.)"""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # ignored, or someone else's
    ):
        start()
        return
    received = False

    def hold(_signum: int, _frame: object) -> None:
        nonlocal received
        received = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, hold)
    try:
        start()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        stop()
        raise KeyboardInterrupt


class RayEngine(ExecutionEngine):
    """Connects this process to the cluster as its driver (unless it is already connected)."""

    def __init__(self, spec: ExperimentSpec) -> None:
        super().__init__(spec)
        # Before Ray starts: a storage URI that cannot be written is the spec's error, not a node's.
        self._storage_uri = spec.checkpoint_uri
        checked_store(self._storage_uri, "storage.uri")
        self._own_ray = connect(spec.ray.address, "ray.address")  # ``local``: this run's, ended with it (close)
        import ray

        resources = spec.resources
        # A Ray of this run's own is this machine alone: without a GPU, no GPU node will ever join, so it runs
        # on CPU slots as the local engine does.
        alone_without_gpus = spec.ray.address == "local" and not ray.cluster_resources().get("GPU")
        self._cpu_slots = resources.cpu_slots if resources.gpus == "none" or alone_without_gpus else None
        nodes = sum(1 for node in ray.nodes() if node["Alive"])
        self._slots = nodes * self._cpu_slots if self._cpu_slots else int(ray.cluster_resources().get("GPU", 0))

    def capacity(self) -> int:
        return max(1, self._slots)

    def close(self) -> None:
        if self._own_ray:  # a process that runs several experiments (``hermes.run``) must not keep it
            import ray

            ray.shutdown()
            self._own_ray = False

    def profile(self) -> ExecutionProfile:
        return trial_profile(self.spec)

    def work(self, params: Mapping[str, Any]) -> TrialLaunch:
        return trial_launch(self.spec, params, self.workdir)

    def executor(self, directory: Path, clock_offset: float) -> RayExecutor:
        spec = self.spec
        return RayExecutor(
            directory,
            storage_uri=self._storage_uri if spec.storage.uri is None else self._experiment_uri(),
            metric=spec.metric.name,
            checkpoint_every=spec.storage.checkpoint_every,
            period=tick_period(spec),
            clock_offset=clock_offset,
            poll=spec.ray.poll,
            cpu_slots=self._cpu_slots,
            threads_per_slot=spec.resources.threads_per_slot,
        )

    def _experiment_uri(self) -> str:
        """This experiment's folder under ``storage.uri``, which experiments of the same name in other stores may
        share (the default, in the storage dir, is this store's alone): named after its creation in the store that
        ``hermes run`` keeps in the storage dir, and made by now (``ExperimentSession.run``)."""
        from hermes.session import STORE_FILE
        from hermes.store.sql import SqlStore

        store = SqlStore.open_read_only(self.spec.storage_dir / STORE_FILE)
        try:
            record = next(e for e in store.experiments() if e.name == self.spec.name and not e.owner)
            continued = bool(store.events_after(record.experiment_id, 0, limit=1))
        finally:
            store.close()
        return experiment_uri(self._storage_uri, record.created_at, continued)
