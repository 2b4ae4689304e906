"""The Ray engine end to end on a real three-node Ray cluster (a head and two worker nodes with two
fake GPUs each, shared by the module): ``engine: ray`` runs a whole experiment, trials spread over
the nodes, a cross-node migration resumes bitwise, a node joins and another dies mid-run with no
trial lost or duplicated, and a driver killed with SIGKILL is continued by a rerun.

The trials are tests/trials/curve.py in warm workers; its ``total`` metric is the running sum of its
scores, which only an exact resumption (from memory, the object store or a durable checkpoint)
gets right. The test that kills a node runs last: the cluster is not the same after it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from hermes.core.decisions import Resume, Start, Suspend  # noqa: E402
from hermes.core.events import NodeAdded, NodeRemoved, TrialExited, TrialReported, TrialSuspended  # noqa: E402
from hermes.core.states import TrialState  # noqa: E402
from hermes.errors import HermesError  # noqa: E402
from hermes.execution.contract import ContractMonitor  # noqa: E402
from hermes.experiment import load_spec  # noqa: E402
from hermes.local.launch import TrialLaunch  # noqa: E402
from hermes.local.resources import discover_gpus  # noqa: E402
from hermes.ray.executor import RayExecutor, node_name  # noqa: E402
from hermes.ray.storage import CheckpointStore  # noqa: E402
from hermes.session import ExperimentSession  # noqa: E402
from hermes.store import ExperimentStatus  # noqa: E402
from hermes.testing.executor_conformance import Driver, ExecutorHarness  # noqa: E402
from hermes.testing.ray_cluster import RayCluster  # noqa: E402
from tests.test_run import (  # noqa: E402
    PRINTED,
    TESTS,
    count_reports,
    environment,
    hermes,
    hermes_command,
    load_view,
    run_until,
    score,
    search,
    spec_of,
    trial_processes,
    wait_for,
    write_spec,
)

ROOT = Path(__file__).resolve().parent.parent
DETECTION_BOUND_S = 10.0  # a killed node's NodeRemoved; measured 1.1-1.6 s with the cluster's health checks


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cluster = RayCluster(workers=2, gpus_per_node=2, env_overrides={"PYTHONPATH": pythonpath})
    with cluster:
        cluster.connect()
        yield cluster
    assert not cluster.pids()


def ray_spec(cluster: RayCluster, name: str, trials: int, budget: int, sleep: float, **sections: Any) -> dict:
    """A spec of curve trials on the cluster's GPU nodes (``resources`` among ``sections``: other resources)."""
    return spec_of(
        name,
        search=search(trials, 3, sleep),
        budget={"steps": budget},
        engine="ray",
        ray={"address": cluster.address},
        storage={"dir": "runs", "checkpoint_every": 2},
        **{"resources": {"gpus": "all"}, **sections},
    )


def assert_exact(session: ExperimentSession, budget: int) -> None:
    """Every trial completed once, with every step's value and the running sum of an uninterrupted run."""
    for trial in session.scheduler.trials.values():
        assert trial.state is TrialState.COMPLETED, f"trial {trial.trial_id}: {trial.state}"
        rate = trial.params["rate"]
        assert sorted(set(trial.steps)) == list(range(1, budget + 1))
        assert trial.values[-1] == score(rate, budget)
    store = session.store
    metrics = store.metrics(session.experiment_id)
    for trial in session.scheduler.trials.values():
        rate = trial.params["rate"]
        last = [m for m in metrics if m.trial_id == trial.trial_id and m.step == budget]
        assert len(last) == 1, f"trial {trial.trial_id} reported its last step {len(last)} times"
        expected = 0.0
        for step in range(1, budget + 1):
            expected += score(rate, step)
        assert last[0].values["total"] == expected  # bitwise: the same additions in the same order
    ends = Counter(e.trial_id for e in store.events(session.experiment_id) if isinstance(e, TrialExited))
    assert set(ends.values()) == {1}, f"trials ended more than once: {ends}"


def nodes_of(decisions: list) -> Counter:
    """Node -> how many distinct trials were started or resumed there."""
    placed = {(d.gpu.partition("/")[0], d.trial_id) for d in decisions if isinstance(d, (Start, Resume))}
    return Counter(node for node, _ in placed)


def session_processes(session_id: int) -> list[int]:
    """Live processes of the session ``session_id`` (those a run started, unless they left its session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[3]) == session_id:
                pids.append(int(entry.name))
        except (OSError, IndexError):  # gone meanwhile
            continue
    return pids


@pytest.mark.parametrize("address", ["garbage", "localhost:abc"])
def test_an_address_that_is_none_names_the_setting(address: str, tmp_path: Path) -> None:
    """Ray reads the address before it connects: what it refuses is named as ray.address, not a traceback."""
    spec = spec_of("bad-address", engine="ray", ray={"address": address}, resources={"gpus": "none", "cpu_slots": 1})
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"hermes: error: ray.address: {address!r} is not an address: " in result.stderr
    assert "Traceback" not in result.stderr


def test_an_address_where_nothing_listens_is_refused_at_once(tmp_path: Path) -> None:
    """Ray retries a head it cannot reach for about 14 minutes, deaf to Ctrl-C; Hermes tries the port first."""
    spec = spec_of("no-head", engine="ray", ray={"address": "127.0.0.1:1"}, resources={"gpus": "none", "cpu_slots": 1})
    started = time.monotonic()
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "hermes: error: ray.address: cannot reach '127.0.0.1:1' (Connection refused)" in result.stderr
    assert time.monotonic() - started < 30


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """A web server on a free port (as the dashboard's 8265 is)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def grpc_server() -> Iterator[int]:
    """A gRPC server that is not Ray's (as a Ray Client's 10001 is)."""
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


@pytest.mark.parametrize(("server", "answer"), [(http_server, "not gRPC"), (grpc_server, "a gRPC server, but not Ray's")])
def test_an_address_that_takes_connections_but_is_no_ray_head_is_refused_at_once(
    server: Callable[[], contextlib.AbstractContextManager[int]], answer: str, tmp_path: Path
) -> None:
    """Ray retried the dashboard's port, or any other server's, for about 14 minutes, deaf to Ctrl-C."""
    with server() as port:
        address = f"127.0.0.1:{port}"
        spec = spec_of("no-head", engine="ray", ray={"address": address}, resources={"gpus": "none", "cpu_slots": 1})
        result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert (f"hermes: error: ray.address: {address!r} takes connections but is not a Ray cluster's head ({answer}); "
            "give the head's GCS port") in result.stderr


def test_a_head_behind_an_http_proxy_setting_is_reached_as_ray_reaches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's gRPC leaves http_proxy aside unless RAY_grpc_enable_http_proxy is set; the probe of the head went through
    the proxy, and refused a head Ray would have reached as "not gRPC"."""
    import grpc

    from hermes.ray.engine import GCS_CLUSTER_ID_METHOD, _check_reachable

    class Head(grpc.GenericRpcHandler):  # answers what a driver asks first, as a Ray head's GCS does
        def service(self, details: Any) -> Any:
            if details.method != GCS_CLUSTER_ID_METHOD:
                return None
            return grpc.unary_unary_rpc_method_handler(lambda request, context: b"", request_deserializer=bytes,
                                                       response_serializer=bytes)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1), handlers=[Head()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for variable in ("http_proxy", "https_proxy", "grpc_proxy"):
            monkeypatch.setenv(variable, "http://127.0.0.1:9")  # a proxy that takes no connection
        _check_reachable(f"127.0.0.1:{port}", "ray.address")  # no HermesError
    finally:
        server.stop(None)


def test_an_address_whose_port_is_out_of_range_is_refused_at_once(tmp_path: Path) -> None:
    """The reachability check above passed over a port outside 1-65535, and Ray retried it for 14 minutes."""
    spec = spec_of("bad-port", engine="ray", ray={"address": "127.0.0.1:99999"},
                   resources={"gpus": "none", "cpu_slots": 1})
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "hermes: error: ray.address: '127.0.0.1:99999': port must be 1-65535" in result.stderr


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3://bucket/checkpoints", "storage.uri: 's3://bucket/checkpoints/bad-uri' cannot be opened: Install s3fs"),
    ("nosuch://x", "storage.uri: 'nosuch://x/bad-uri' cannot be opened: Protocol not known: nosuch"),
    ("file:///proc/hermes", "storage.uri: cannot write checkpoints to 'file:///proc/hermes/bad-uri': "),
    ("ftp://127.0.0.1:1/ck",  # a file system that fails as it is made: a traceback
     "storage.uri: 'ftp://127.0.0.1:1/ck/bad-uri' cannot be opened: [Errno 111] Connection refused"),
])
def test_a_storage_uri_that_cannot_take_checkpoints_is_refused_before_ray_starts(
    uri: str, expected: str, tmp_path: Path
) -> None:
    """Unchecked, a missing filesystem package failed in the nodes' agents, where no one saw it (the run waited
    for good), and a path that cannot be written lost every upload without a word."""
    spec = spec_of("bad-uri", engine="ray", ray={"address": "local"}, resources={"gpus": "none", "cpu_slots": 1},
                   storage={"dir": "runs", "uri": uri})
    result = hermes("run", str(write_spec(tmp_path, spec)), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"hermes: error: {expected}" in result.stderr
    assert "Started a local Ray instance" not in result.stderr
    assert not (tmp_path / "runs" / "hermes.db").exists()


def test_a_bad_ray_address_variable_is_named_where_auto_reads_it(tmp_path: Path) -> None:
    """``address: auto`` connects where RAY_ADDRESS says: its bad value was reported as "'auto' is not an address"."""
    spec = spec_of("env-address", engine="ray", ray={"address": "auto"}, resources={"gpus": "none", "cpu_slots": 1})
    result = subprocess.run(hermes_command("run", str(write_spec(tmp_path, spec)), "--no-live"), cwd=tmp_path,
                            env={**environment(), "RAY_ADDRESS": "garbage"}, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert "hermes: error: RAY_ADDRESS (used for ray.address: auto): 'garbage' is not an address: " in result.stderr
    assert "Traceback" not in result.stderr


def test_a_driver_of_another_ray_version_is_refused_with_the_versions(cluster: RayCluster, tmp_path: Path) -> None:
    """Ray refuses a driver whose Ray (or Python) is not the cluster's: that was a traceback. This driver claims
    another Ray version, as one installed apart from the cluster's would have."""
    spec = spec_of("other-ray", engine="ray", ray={"address": cluster.address}, resources={"gpus": "none",
                                                                                           "cpu_slots": 1})
    program = ("import sys, ray._private.utils as utils\n"
               "real = utils.compute_version_info\n"
               "utils.compute_version_info = lambda: ('2.0.0', real()[1])\n"
               "from hermes.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    result = subprocess.run([sys.executable, "-c", program, "run", str(write_spec(tmp_path, spec)), "--no-live"],
                            cwd=tmp_path, env={**environment(), **cluster.env}, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert (f"hermes: error: ray.address: cannot connect to {cluster.address!r}: Version mismatch: The cluster was "
            "started with: Ray: ") in result.stderr
    assert "Ray: 2.0.0" in result.stderr and "run Hermes with the cluster's Ray and Python versions" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_runner_is_refused_before_it_starts_ray(tmp_path: Path) -> None:
    """The storage directory's lock comes first: a second runner used to start a Ray of its own (seconds) before
    it learnt that the directory is taken."""
    from hermes.store.lock import RunnerLock

    spec = spec_of("taken", engine="ray", ray={"address": "local"}, resources={"gpus": "none", "cpu_slots": 1})
    path = write_spec(tmp_path, spec)
    with RunnerLock(tmp_path / "runs", "taken"):
        result = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is in use by another runner" in result.stderr
    assert "Started a local Ray instance" not in result.stderr


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Ray's own put themselves in sessions of their own)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # it ended
        return []


def run_on_a_ray_of_its_own(tmp_path: Path, name: str) -> subprocess.Popen[str]:
    """``hermes run`` of a one-slot experiment with ``ray: {address: local}``, in a session of its own."""
    spec = spec_of(name, engine="ray", ray={"address": "local"}, resources={"gpus": "none", "cpu_slots": 1})
    write_spec(tmp_path, spec)
    env = {key: value for key, value in environment().items() if key != "RAY_ADDRESS"}
    return subprocess.Popen(hermes_command("run", "experiment.yaml", "--no-live"), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_ctrl_c_while_its_own_ray_starts_ends_that_ray(tmp_path: Path) -> None:
    """Ctrl-C in the seconds ``address: local`` takes to start Ray gave a traceback and left Ray's processes
    running; it is now taken once Ray has started, which is then ended, and the run says it was interrupted."""
    runner = run_on_a_ray_of_its_own(tmp_path, "interrupted")
    try:
        # once Ray's first process is up (the run reached Ray's start), in the 5 s or more Ray takes to start here
        wait_for(lambda: children_of(runner.pid), 60, "Ray to start")
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 130, output
    assert "interrupted before the experiment started" in output and "Traceback" not in output, output
    wait_for(lambda: not session_processes(runner.pid), 60, "the run's Ray instance to end")


def test_sigterm_while_the_agents_start_records_the_run_interrupted(tmp_path: Path) -> None:
    """SIGTERM once the experiment is in the store, while Ray's node agents start: it was left "running when its
    runner ended without a word", and the run exited 130 (Ray's wait makes a KeyboardInterrupt of SIGTERM's)."""
    runner = run_on_a_ray_of_its_own(tmp_path, "early")
    try:
        wait_for(lambda: count_rows(tmp_path / "runs" / "hermes.db", "experiments") > 0, 120, "the experiment")
        time.sleep(0.3)  # into the second or two its node agents take to start
        runner.send_signal(signal.SIGTERM)
        output, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 128 + signal.SIGTERM, output
    view, _ = load_view(tmp_path / "runs")
    assert view.experiment.status is ExperimentStatus.INTERRUPTED, output
    wait_for(lambda: not session_processes(runner.pid), 30, "the run's Ray instance to end")


def count_rows(database: Path, table: str) -> int:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_ray_address_local_runs_on_a_ray_of_its_own_and_ends_it(tmp_path: Path) -> None:
    """``ray: {address: local}`` needs no cluster: a run starts a Ray instance of its own on this machine (on CPU
    slots where it has no GPU, as the local engine), runs every trial exactly, and ends that instance, also when
    run from Python (``hermes.run``), whose process lives on. In a folder with a space: the default durable
    storage (``<dir>/<name>/checkpoints``) was once a ``file://`` URI that fsspec took as ``with%20space``."""
    budget = 4
    folder = tmp_path / "with space"
    spec = spec_of("ray-local", search=search(4, 5, 0.05), budget={"steps": budget}, engine="ray",
                   ray={"address": "local"}, resources={"gpus": "all", "cpu_slots": 2})
    write_spec(folder, spec)
    env = {key: value for key, value in environment().items() if key != "RAY_ADDRESS"}
    program = "import hermes, ray\nresult = hermes.run('experiment.yaml')\nprint(result.status, ray.is_initialized())"
    runner = subprocess.Popen([sys.executable, "-c", program], cwd=folder, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 0 and output.splitlines()[-1] == "finished False", output
    view, decisions = load_view(folder / "runs")
    assert len(view.trials) == 4 and {trial.state for trial in view.trials} == {TrialState.COMPLETED}
    last = {m.trial_id: m.values["score"] for m in view.metrics if m.step == budget}
    assert last == {trial.trial_id: score(trial.params["rate"], budget) for trial in view.trials}
    slots = {d.gpu.rpartition("/")[2] for d in decisions if isinstance(d, Start)}
    assert discover_gpus() or slots == {"cpu0", "cpu1"}, slots
    # Where the winner's files are: a Ray run keeps them per node, and its checkpoints in storage.uri.
    results = hermes("results", "runs", "--format", "json", cwd=folder)
    for row in json.loads(results.stdout):
        directory, checkpoint = Path(row["directory"]), Path(row["checkpoint"])
        assert directory.match(f"runs/ray-local/nodes/*/trials/{row['trial']}") and (directory / "config.json").exists()
        assert checkpoint.parent == folder.resolve() / "runs" / "ray-local" / "checkpoints" / row["trial"]
        assert json.loads((checkpoint / "hermes.json").read_text())["step"] == budget
    assert not (tmp_path / "with%20space").exists()
    trace = hermes("trace", "runs", cwd=folder).stdout.splitlines()
    assert trace[0].endswith(",state_mb") and all(line.rpartition(",")[2] for line in trace[1:]), trace[:3]
    wait_for(lambda: not session_processes(runner.pid) and not trial_processes((folder / "runs").resolve()), 30,
             "the run's Ray instance and trial processes to end")


def test_a_driver_of_one_cluster_is_refused_another_address(cluster: RayCluster) -> None:
    """This process is a driver of the test cluster: a spec naming another head would run on this one, unsaid."""
    from hermes.ray.engine import connect

    assert connect(cluster.address, "ray.address") is False  # the same cluster: used as it is, and not ours to end
    with pytest.raises(HermesError, match=r"ray.address: this process is a Ray driver of the cluster at .* already, "
                                          r"not of '127.0.0.1:1': call ray.shutdown\(\) first"):
        connect("127.0.0.1:1", "ray.address")


def test_experiments_of_one_name_in_two_stores_keep_their_own_checkpoints(cluster: RayCluster, tmp_path: Path) -> None:
    """Two users' experiments of one name, each in its own storage dir, with one storage.uri (the shipped KubeRay
    setup): the second one's start deleted the first one's durable checkpoints, and the first one's rerun resumed
    from the second one's state."""
    shared = tmp_path / "shared"
    for user, budget in (("ann", 4), ("bob", 2)):
        spec = ray_spec(cluster, "digits", 1, budget, 0.01)
        spec["storage"] |= {"checkpoint_every": 1, "uri": str(shared)}
        session = ExperimentSession(load_spec(write_spec(tmp_path / user, spec)))
        session.run()
        session.store.close()
    published = sorted(json.loads(path.read_text())["step"] for path in shared.rglob("hermes.json"))
    assert published == [2, 4]  # trial 0 of each, at its last step
    assert len(list((shared / "digits").iterdir())) == 2  # a folder for each


def test_a_whole_experiment_on_ray_spreads_its_trials_and_resumes_exactly(cluster: RayCluster, tmp_path: Path) -> None:
    budget = 6
    path = write_spec(tmp_path, ray_spec(cluster, "ray-e2e", 8, budget, 0.05, policy={"name": "rr", "period": 0.3}))
    monitor = ContractMonitor()
    session = ExperimentSession(load_spec(path), listeners=[monitor])
    started = time.monotonic()
    session.run()
    print(f"\n8 trials x {budget} steps on 2 nodes x 2 GPUs: {time.monotonic() - started:.1f} s")
    assert_exact(session, budget)
    decisions = [record.decision for record in session.store.decisions(session.experiment_id)]
    starts = Counter(d.gpu.partition("/")[0] for d in decisions if isinstance(d, Start))
    workers = {node_name(node.node_id) for node in cluster.nodes[1:]}
    assert set(starts) == workers and set(starts.values()) == {4}  # 8 trials evenly over 2 nodes
    assert any(isinstance(d, Suspend) for d in decisions)
    session.store.close()
    assert not trial_processes((tmp_path / "runs").resolve())

    # The local engine on as many slots, from the same seeds: the same trials, reports and results.
    local_spec = spec_of("ray-e2e", search=search(8, 3, 0.05), budget={"steps": budget},
                         policy={"name": "rr", "period": 0.3}, resources={"gpus": "none", "cpu_slots": 4},
                         storage={"dir": "local", "checkpoint_every": 2})
    local = ExperimentSession(load_spec(write_spec(tmp_path, local_spec)))
    local.run()
    ray_trials, local_trials = session.scheduler.trials, local.scheduler.trials
    assert sorted(ray_trials) == sorted(local_trials)
    for trial_id, trial in ray_trials.items():
        other = local_trials[trial_id]
        assert trial.params == other.params and trial.state is other.state
        assert list(zip(trial.steps, trial.values)) == list(zip(other.steps, other.values))
    local_decisions = [record.decision for record in local.store.decisions(local.experiment_id)]
    assert sorted(d.trial_id for d in decisions if isinstance(d, Start)) == sorted(
        d.trial_id for d in local_decisions if isinstance(d, Start)
    )
    local.store.close()


def test_cpu_slots_on_every_node_of_the_cluster(cluster: RayCluster, tmp_path: Path) -> None:
    """``resources.gpus: none``, as on one machine without GPUs: every node, the head without GPUs too, runs
    ``cpu_slots`` CPU slots, and no trial runs on a GPU."""
    budget = 4
    spec = ray_spec(cluster, "ray-cpu", 6, budget, 0.05, policy={"name": "rr", "period": 0.3},
                    resources={"gpus": "none", "cpu_slots": 1})
    session = ExperimentSession(load_spec(write_spec(tmp_path, spec)), listeners=[ContractMonitor()])
    session.run()
    assert_exact(session, budget)
    decisions = [record.decision for record in session.store.decisions(session.experiment_id)]
    slots = {d.gpu for d in decisions if isinstance(d, (Start, Resume))}
    assert slots == {f"{node_name(node.node_id)}/cpu0" for node in cluster.nodes}  # the head's slot included
    session.store.close()
    assert not trial_processes((tmp_path / "runs").resolve())


def test_a_hung_trial_on_ray_is_failed_by_its_specs_limit(cluster: RayCluster, tmp_path: Path) -> None:
    """``trial.timeout`` reaches the node that runs the trial (each launch carries its limits): a trial that hangs
    fails after the spec's 3 s, not the 10 minutes of the defaults, and the other completes."""
    spec = ray_spec(cluster, "ray-hung", 2, 4, 0.05, resources={"gpus": "none", "cpu_slots": 1})
    spec["search"] = {"sampler": "list", "configs": [{"rate": 0.5, "sleep": 0.05, "hang_after": 2},
                                                     {"rate": 0.7, "sleep": 0.05, "hang_after": -1}]}
    spec["trial"]["timeout"] = 3
    session = ExperimentSession(load_spec(write_spec(tmp_path, spec)), listeners=[ContractMonitor()])
    session.run()
    hung, healthy = session.scheduler.trials["0"], session.scheduler.trials["1"]
    assert hung.state is TrialState.FAILED and "timed out: it ran 3s in all (trial.timeout)" in (hung.error or "")
    assert healthy.state is TrialState.COMPLETED
    assert hung.gpu_time < 30  # the spec's limit, not the default stall of 60 s
    session.store.close()
    assert not trial_processes((tmp_path / "runs").resolve())


def test_a_pool_on_ray_runs_two_users_experiments_over_the_nodes(cluster: RayCluster, tmp_path: Path) -> None:
    """The server's pool with ``engine="ray"``: two users' experiments share the cluster's GPUs, every trial is
    exact (its state carried across suspensions, on any node), and both used more than one node."""
    from hermes.pool import PoolSession
    from hermes.store import ExperimentStatus, SqlStore
    from tests.test_pool import check_completed, pool_spec, status, submit

    store = SqlStore(f"sqlite:///{tmp_path}/pool.db")
    ids = [submit(store, pool_spec(owner, 5, 0.08, budget=5), owner=owner) for owner in ("ann", "bob")]
    pool = PoolSession(store, tmp_path, engine="ray", poll=0.1)
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        wait_for(lambda: all(status(store, i) is ExperimentStatus.FINISHED for i in ids), 120,
                 "both experiments to finish on Ray")
    finally:
        pool.stop()
        runner.join(60)
    assert not runner.is_alive()
    for experiment_id in ids:
        check_completed(store, tmp_path, experiment_id, 5, 5)
        decisions = [record.decision for record in store.decisions(experiment_id)]
        assert any(isinstance(decision, Suspend) for decision in decisions)
        assert len({d.gpu.split("/")[0] for d in decisions if isinstance(d, (Start, Resume))}) >= 2
    store.close()
    assert not trial_processes(tmp_path.resolve())


def test_a_pool_on_ray_killed_with_sigkill_continues_from_the_durable_checkpoints(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """``python -m hermes.pool --ray ADDRESS``, as ``hermes server --ray`` runs it, killed with SIGKILL mid-run: its
    agents and trials die with it, and a new pool continues both experiments, no trial started again from
    scratch and none of a finished one's steps run twice."""
    from hermes.store import SqlStore
    from tests.test_pool import check_continued, completed_trials, kill_pool, pool_spec, rerun_pool, submit

    database = tmp_path / "pool.db"
    store = SqlStore(f"sqlite:///{database}")
    budget = 6
    ids = [submit(store, pool_spec(owner, 4, 0.1, budget=budget, storage={"dir": "runs", "checkpoint_every": 2}),
                  owner=owner) for owner in ("ann", "bob")]
    command = [sys.executable, "-m", "hermes.pool", "--store", f"sqlite:///{database}", "--dir", str(tmp_path),
               "--ray", cluster.address, "--poll", "0.1"]
    env = {**os.environ, **cluster.env}
    kill_pool(command, env, tmp_path, lambda: count_reports(database) >= 12, 120)
    wait_for(lambda: not trial_processes(tmp_path.resolve()), 60, "the trials of the killed pool to die")
    before = {experiment_id: store.metrics(experiment_id) for experiment_id in ids}
    completed_before = completed_trials(store, ids)
    rerun_pool(command, env, tmp_path, store, ids, 180)
    check_continued(store, tmp_path, ids, budget, before, completed_before)
    store.close()
    wait_for(lambda: not trial_processes(tmp_path.resolve()), 60, "the trials of the second pool to end")


def test_hermes_server_on_ray_runs_a_submitted_experiment_over_the_nodes(cluster: RayCluster, tmp_path: Path) -> None:
    """``hermes server --ray ADDRESS``, as a team runs it: a user's experiment submitted with ``hermes submit`` runs
    on several nodes of the cluster, and its trials' logs are where the dashboard reads them."""
    import yaml

    from hermes.store import SqlStore
    from tests.test_server import _free_port, _wait_for, add_user, real_spec

    env = {**os.environ, **cluster.env}
    root = tmp_path / "srv"
    hermes = [sys.executable, "-m", "hermes.cli"]
    env["HERMES_TOKEN"] = add_user(root, "erin")  # in this process: test_server runs `hermes server add-user`
    area = root / "users" / "erin"
    (area / "spec.yaml").write_text(yaml.safe_dump(real_spec("on-ray", trials=6, steps=5, sleep=0.08)))
    url = f"http://127.0.0.1:{_free_port()}"
    server = subprocess.Popen([*hermes, "server", "--root", str(root), "--port", url.rpartition(":")[2],
                               "--ray", cluster.address], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        _wait_for(url, timeout=60)
        submitted = subprocess.run([*hermes, "submit", "spec.yaml", "--server", url], capture_output=True, text=True,
                                   env=env, cwd=area)
        assert submitted.returncode == 0, submitted.stderr

        def finished() -> bool:  # asked of the API every 0.1 s: a `hermes status` each time kept a core busy
            time.sleep(0.1)
            return httpx_get(f"{url}/api/experiments/1", env["HERMES_TOKEN"])["status"] == "finished"

        wait_for(finished, 120, "the experiment to finish")
        shown = subprocess.run([*hermes, "status", "--server", url], capture_output=True, text=True, env=env,
                               check=False)
        assert "finished" in shown.stdout, shown.stdout + shown.stderr
        log = httpx_get(f"{url}/api/experiments/1/trials/1/log?stream=stderr", env["HERMES_TOKEN"])
        assert "about to fail" in log["text"]  # the failing trial's stderr, written on its node
        gpus = sum(int(node.num_gpus) for node in cluster.nodes)
        assert httpx_get(f"{url}/api/cluster", env["HERMES_TOKEN"])["gpus"] == gpus > 0  # the nodes' GPUs
        pool = httpx_get(f"{url}/api/cluster/timeline", env["HERMES_TOKEN"])  # who ran where, over the nodes
        assert {run["owner"] for run in pool["runs"]} == {"erin"} and len(pool["runs"]) >= 6
        assert len({run["gpu"].split("/")[0] for run in pool["runs"]}) >= 2
        assert {run["gpu"] for run in pool["runs"]} <= set(pool["gpus"])
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr
    store = SqlStore(f"sqlite:///{root}/hermes.db")
    states = Counter(trial.state for trial in store.trials(1))
    assert states == Counter({TrialState.COMPLETED: 5, TrialState.FAILED: 1})
    decisions = [record.decision for record in store.decisions(1)]
    assert len({d.gpu.split("/")[0] for d in decisions if isinstance(d, (Start, Resume))}) >= 2
    store.close()
    wait_for(lambda: not trial_processes(tmp_path.resolve()), 60, "the server's trials to end")


def httpx_get(url: str, token: str) -> Any:
    import httpx

    response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    response.raise_for_status()
    return response.json()


class _Harness(ExecutorHarness):
    gpus = ()

    def executor(self, directory: Path) -> RayExecutor:
        raise NotImplementedError

    def work(self, steps: int, **_: Any) -> TrialLaunch:
        raise NotImplementedError

    def remove_gpu(self, executor: Any, gpu: str) -> None:
        raise NotImplementedError


def test_a_migration_across_nodes_resumes_bitwise(cluster: RayCluster, tmp_path: Path) -> None:
    first, second = (node_name(node.node_id) for node in cluster.nodes[1:3])
    executor = RayExecutor(tmp_path, storage_uri=(tmp_path / "durable").as_uri(), metric="score")
    driver = Driver(executor, _Harness())
    with executor:
        driver.start_membership()
        rate, steps = 0.4, 6
        driver.submit("a", TrialLaunch(steps, function="tests.trials.curve:train", config={"rate": rate, "sleep": 0.05},
                                       cwd=str(ROOT)))
        driver.apply(Start("a", f"{first}/gpu0"))
        events = driver.until(lambda e: isinstance(e, TrialSuspended), lambda e: [Suspend("a")] if e.step == 3 else [])
        moved = time.monotonic()
        driver.apply(Resume("a", f"{second}/gpu1", migrated=True))
        events += driver.until(lambda e: isinstance(e, TrialExited))
        reports = [e for e in events if isinstance(e, TrialReported)]
        suspended = next(e for e in events if isinstance(e, TrialSuspended))
        resumed = next(e for e in reports if e.step == 4)
        print(f"\ncross-node resume to its first report: {resumed.at - suspended.at:.3f} s "
              f"({time.monotonic() - moved:.2f} s wall)")
    assert events[-1].succeeded
    assert [e.step for e in reports] == list(range(1, steps + 1))
    total = 0.0
    for event in reports:
        total += score(rate, event.step)
        assert event.value == score(rate, event.step) and event.metrics["total"] == total

    result = json.loads((tmp_path / "nodes" / second / "trials" / "a" / "result.json").read_text())
    assert len(result["pids"]) == 2  # two processes, on two nodes, one uninterrupted sum
    assert not (tmp_path / "nodes" / first / "trials" / "a" / "result.json").exists()


def test_a_trials_timeout_counts_its_running_time_on_every_node(cluster: RayCluster, tmp_path: Path) -> None:
    """trial.timeout is running time in all: each node's agent counted only its own runs, so a trial that moved
    started its limit afresh on every node."""
    from hermes.local.watchdog import TrialLimits

    first, second = (node_name(node.node_id) for node in cluster.nodes[1:3])
    executor = RayExecutor(tmp_path, storage_uri=str(tmp_path / "durable"), metric="score")
    driver = Driver(executor, _Harness())
    work = TrialLaunch(200, function="tests.trials.curve:train", config={"rate": 0.1, "sleep": 0.1}, cwd=str(ROOT),
                       limits=TrialLimits(timeout=3.0))
    with executor:
        driver.start_membership()
        driver.submit("a", work)
        driver.apply(Start("a", f"{first}/gpu0"))
        events = driver.until(lambda e: isinstance(e, TrialSuspended), lambda e: [Suspend("a")] if e.step == 15 else [])
        driver.apply(Resume("a", f"{second}/gpu0", migrated=True))  # 1.5 s or more of its 3 s are spent
        events += driver.until(lambda e: isinstance(e, TrialExited))
    ended = events[-1]
    assert not ended.succeeded and ended.error.startswith(f"Ray node {second}: timed out: it ran 3s in all"), ended.error
    after = [e.step for e in events if isinstance(e, TrialReported) and e.step > 15]
    assert len(after) < 15, f"it ran {len(after)} more steps of 0.1 s on the second node: its first 1.5 s were lost"


def test_a_run_whose_node_ray_cannot_place_it_on_says_so(
    cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another experiment's run holds a node's GPUs: a second user's run waited for its agent there, up to
    agent_timeout, without a word."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, num_gpus=2)
    class Holder:
        def ready(self) -> bool:
            return True

    held = cluster.nodes[1].node_id
    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(held, soft=False)).remote()
    try:
        ray.get(holder.ready.remote(), timeout=60)
        with caplog.at_level(logging.WARNING, logger="hermes.ray"):
            # its note comes after PLACEMENT_NOTE_S (5 s), at the latest as it gives the node up
            executor = RayExecutor(tmp_path, storage_uri=str(tmp_path / "ckpt"), metric="score", agent_timeout=6)
        executor.close()
    finally:
        ray.kill(holder)
    notes = [message for message in (record.getMessage() for record in caplog.records)
             if "waiting for Ray to start this run" in message]
    assert len(notes) == 1 and f"node(s) {node_name(held)}: their GPUs are held by other Ray work" in notes[0], notes
    wait_for(lambda: not trial_processes(tmp_path), 30, "no trial process")


def test_an_agent_that_cannot_start_names_its_node_and_why(cluster: RayCluster, tmp_path: Path) -> None:
    """An agent that raised as it started (here: slots the driver passed on unchecked) was lost before it was ready,
    without a word, and the driver waited for good."""
    with pytest.raises(HermesError, match=r"Hermes could not start on Ray node [0-9a-f]{12}: .*threads_per_slot must "
                                          r"be at least 1, got 0"):
        RayExecutor(tmp_path, storage_uri=str(tmp_path / "durable"), metric="score", cpu_slots=1, threads_per_slot=0)
    wait_for(lambda: not trial_processes(tmp_path), 30, "no trial process")


def test_an_agent_that_does_not_see_the_drivers_storage_is_refused(cluster: RayCluster, tmp_path: Path) -> None:
    """A storage.uri each node reads as a folder of its own (its local disk, not a shared mount): every node passed
    its own check, and a trial that resumed elsewhere after a node loss started again from its beginning. An agent
    is given the object its driver wrote there (``CheckpointStore.mark_shared``); here one it cannot find."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hermes.ray.agent import NodeAgent

    node = cluster.nodes[1]
    durable = tmp_path / "durable"
    agent = ray.remote(NodeAgent).options(
        num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    ).remote(node_name(node.node_id), str(tmp_path / "node"), "score", 0, str(durable), 1, 1, ".hermes-run-elsewhere")
    with pytest.raises(ray.exceptions.RayActorError) as raised:
        ray.get(agent.wake.remote(), timeout=60)
    assert (f"storage.uri {durable} is not shared with Ray node {node_name(node.node_id)}: every node must see the "
            "same checkpoints (a shared file system or s3://...)") in str(raised.value)


def agent_of(worker: int) -> int:
    """The pid of the node agent (a Ray actor's process) whose warm worker ``worker`` is."""
    pid = worker
    while pid > 1:
        if (Path("/proc") / str(pid) / "cmdline").read_bytes().startswith(b"ray::NodeAgent"):
            return pid
        pid = int((Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[1])
    raise AssertionError(f"process {worker} runs under no node agent")


def test_a_durable_checkpoint_missing_where_its_trial_resumes_is_told(
    cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its node's agent died, and the node that resumes the trial does not find the checkpoint uploaded in this run
    (gone meanwhile, or a folder of its own): the trial started again from its beginning without a word. A trial
    submitted with its steps known (a rerun) is judged by what storage.uri holds as it is received: parked in memory,
    it may have uploaded none of them, and it said nothing of it (below)."""
    durable = tmp_path / "durable"
    executor = RayExecutor(tmp_path / "run", storage_uri=str(durable), metric="score", checkpoint_every=1)
    assert len(list(durable.glob(".hermes-run-*"))) == 1  # the object each node's agent must see
    first, second = (node_name(node.node_id) for node in cluster.nodes[1:3])
    curve = TrialLaunch(6, function="tests.trials.curve:train", config={"rate": 0.5, "sleep": 0.05}, cwd=str(ROOT))
    events: list = []

    def until(done: Callable[[Any], bool], decide: Callable[[Any], list] = lambda event: []) -> None:
        deadline = time.monotonic() + 60
        while not any(done(event) for event in events):
            assert time.monotonic() < deadline, events
            for event in executor.next_events():
                for decision in decide(event):
                    executor.apply(decision, executor.now())
                executor.settled(event)
                events.append(event)

    with executor, caplog.at_level(logging.WARNING, logger="hermes.ray"):
        executor.next_events()  # the nodes
        executor.submit("a", curve)
        executor.submit("b", curve, reported_step=3)  # its storage holds no step of it
        executor.apply(Start("a", f"{first}/gpu0"), executor.now())
        until(lambda e: isinstance(e, TrialSuspended),
              lambda e: [Suspend("a")] if isinstance(e, TrialReported) and e.step == 2 else [])
        CheckpointStore(str(durable)).delete("a")
        os.kill(agent_of(trial_processes((tmp_path / "run").resolve())[0]), signal.SIGKILL)
        executor.submit("c", curve)
        executor.apply(Start("c", f"{second}/gpu0"), executor.now())  # work to wait on: the driver hears of the death
        until(lambda e: isinstance(e, NodeRemoved))
        until(lambda e: isinstance(e, TrialExited) and e.trial_id == "c")
        executor.apply(Resume("a", f"{second}/gpu0", migrated=True), executor.now())
        executor.apply(Resume("b", f"{second}/gpu1", migrated=True), executor.now())
        until(lambda e: isinstance(e, TrialExited) and e.trial_id == "a")
        until(lambda e: isinstance(e, TrialExited) and e.trial_id == "b")
    assert [e.step for e in events if isinstance(e, TrialReported) and e.trial_id == "a"] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events if isinstance(e, TrialReported) and e.trial_id == "b"] == [4, 5, 6]
    warnings = [r.getMessage() for r in caplog.records if "durable checkpoint" in r.getMessage()]
    expected = (f"Ray node {second}: trial a's durable checkpoint of step 2 is not in {durable}: it resumes from its "
                "beginning (does every node see storage.uri?)")
    assert warnings == [expected]
    assert not list(durable.glob(".hermes-run-*"))  # gone with the run


def test_a_checkpoint_that_cannot_be_uploaded_is_not_durable_and_the_user_is_told(
    cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Storage that fails after the start (here its folder became a file) lost every upload without a word."""
    durable = tmp_path / "durable"
    executor = RayExecutor(tmp_path, storage_uri=durable.as_uri(), metric="score", checkpoint_every=1)
    shutil.rmtree(durable)
    durable.write_text("no longer a folder")
    driver = Driver(executor, _Harness())
    node = node_name(cluster.nodes[1].node_id)
    with executor, caplog.at_level(logging.WARNING, logger="hermes.ray"):
        driver.start_membership()
        driver.submit("a", TrialLaunch(3, function="tests.trials.curve:train", config={"rate": 0.5, "sleep": 0.01},
                                       cwd=str(ROOT)))
        driver.apply(Start("a", f"{node}/gpu0"))
        events = driver.until(lambda e: isinstance(e, TrialExited))
    assert events[-1].succeeded
    reports = [e for e in events if isinstance(e, TrialReported)]
    assert [e.step for e in reports] == [1, 2, 3] and not any(e.checkpointed for e in reports)
    warnings = [r.getMessage() for r in caplog.records if "could not be uploaded" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per node, not once per report
    assert f"Ray node {node}: trial a's checkpoint of step 1 could not be uploaded to {durable.as_uri()}" in warnings[0]


def signalled_driver(cluster: RayCluster, tmp_path: Path, name: str, trials: int, budget: int, reports: int,
                     signum: int) -> tuple[Path, Path, dict[str, str], int, str]:
    """Start ``hermes run`` on the cluster, send it ``signum`` after ``reports`` reports, and wait until its
    trial processes are gone: the spec's path, the storage, the environment, the driver's exit status and stderr."""
    path = write_spec(tmp_path, ray_spec(cluster, name, trials, budget, 0.08, policy={"name": "rr", "period": 0.3}))
    storage = (tmp_path / "runs").resolve()
    env = {**os.environ, **cluster.env}
    returncode, stderr = run_until(path, lambda: count_reports(storage / "hermes.db") >= reports,
                                   "reports of the first runner", signum, env, timeout=120)
    wait_for(lambda: not trial_processes(storage), 30, "the trial processes of the first runner to end")
    return path, storage, env, returncode, stderr


def rerun_to_the_end(path: Path, storage: Path, env: dict[str, str], trials: int) -> Any:
    """Run the spec again: it continues the experiment, and every trial completes. The store's view after it."""
    rerun = subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=path.parent, env=env,
                           capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "(continued)" in rerun.stdout
    assert "durable checkpoint" not in rerun.stderr, rerun.stderr  # what was durable is found where it was put
    view, _ = load_view(storage)
    assert len(view.trials) == trials and all(t.state is TrialState.COMPLETED for t in view.trials)
    return view


def test_a_driver_killed_is_continued_by_a_rerun(cluster: RayCluster, tmp_path: Path) -> None:
    budget, trials = 6, 6
    path, storage, env, returncode, stderr = signalled_driver(cluster, tmp_path, "ray-crash", trials, budget, 14,
                                                              signal.SIGKILL)
    assert returncode == -signal.SIGKILL, stderr[-2000:]
    before, _ = load_view(storage)
    completed_before = {t.trial_id for t in before.trials if t.state is TrialState.COMPLETED}
    view = rerun_to_the_end(path, storage, env, trials)
    after = view.metrics[len(before.metrics):]
    assert not completed_before & {m.trial_id for m in after}, "a trial finished before the kill ran again"
    for trial in view.trials:
        steps = {m.step for m in view.metrics if m.trial_id == trial.trial_id}
        assert steps == set(range(1, budget + 1))
        last = [m for m in view.metrics if m.trial_id == trial.trial_id and m.step == budget][-1]
        expected = 0.0
        for step in range(1, budget + 1):
            expected += score(trial.params["rate"], step)
        assert last.values["total"] == expected


def test_sigterm_interrupts_a_ray_run_between_batches(cluster: RayCluster, tmp_path: Path) -> None:
    """SIGTERM to a driver on Ray: the interrupt waits for the engine loop's next batch (the executor woken from
    the signal handler), the run is recorded as interrupted with its trials stopped, and a rerun continues it."""
    trials = 4
    path, storage, env, returncode, stderr = signalled_driver(cluster, tmp_path, "ray-sigterm", trials, 6, 6,
                                                              signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "interrupted: run" in stderr and "Traceback" not in stderr
    rerun_to_the_end(path, storage, env, trials)


@pytest.mark.alone  # under a parallel file's load the driver's notice of the lost head took past 60 s (once)
def test_a_lost_head_interrupts_the_run_at_once(tmp_path: Path) -> None:
    """Ray's ``nodes()`` waited a minute for a head that was gone, deaf to SIGTERM, then Ray ended the driver with
    exit 1 and no word of Hermes, leaving the experiment "running". Its own cluster: this one's head is killed."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with RayCluster(workers=1, gpus_per_node=0, cpus_per_node=1, env_overrides={"PYTHONPATH": pythonpath}) as doomed:
        spec = ray_spec(doomed, "ray-headless", 4, 200, 0.05, resources={"gpus": "none", "cpu_slots": 1})
        path = write_spec(tmp_path, spec)
        storage = (tmp_path / "runs").resolve()
        runner = subprocess.Popen(hermes_command("run", str(path), "--no-live"), cwd=tmp_path,
                                  env={**os.environ, **doomed.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            wait_for(lambda: count_reports(storage / "hermes.db") >= 4, 120, "reports")
            killed = time.monotonic()
            doomed.kill_node(next(node for node in doomed.nodes if node.head))
            _, stderr = runner.communicate(timeout=60)
            took = time.monotonic() - killed
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
    assert runner.returncode == 2, stderr[-3000:]
    assert "hermes: error: lost the Ray cluster: its head at" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert took < 30  # Ray itself gave up after 60 s
    view, _ = load_view(storage)
    assert view.experiment.status is ExperimentStatus.INTERRUPTED


def test_a_node_joins_and_another_dies_mid_run(
    cluster: RayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Runs last: it kills a worker node of the module's cluster. The trials parked there (suspended in memory, after
    their last durable checkpoint) resume from that checkpoint without a warning: they were told that
    their durable checkpoint was missing from storage.uri, "does every node see storage.uri?"."""
    from hermes.cli import _progress_printer

    budget = 10
    path = write_spec(tmp_path, ray_spec(cluster, "ray-churn", 8, budget, 0.5, policy={"name": "rr", "period": 0.6}))
    victim = cluster.nodes[1]
    seen: dict[str, Any] = {}
    joining = threading.Thread(target=cluster.add_node, kwargs={"num_gpus": 2}, daemon=True)

    def churn(event: Any, decisions: list) -> None:
        if isinstance(event, NodeAdded) and len(cluster.nodes) == 4 and "new" not in seen:
            seen["joined"], seen["new"] = time.monotonic(), event.node
        elif "new" in seen and "killed" not in seen and isinstance(event, TrialReported):
            if any(isinstance(d, (Start, Resume)) and d.gpu.startswith(seen["new"]) for d in decisions) or (
                time.monotonic() - seen["joined"] > 2
            ):
                seen["killed"] = cluster.kill_raylet(victim)
        elif isinstance(event, NodeRemoved):
            seen["removed"] = time.monotonic()

    monitor = ContractMonitor()
    session = ExperimentSession(load_spec(path), listeners=[monitor, churn])
    session.listeners.append(_progress_printer(session))  # what `hermes run` logs without a terminal
    joining.start()  # it joins a few seconds into the run
    session.run()
    joining.join(timeout=60)
    assert {"joined", "killed", "removed"} <= set(seen), seen
    detection = seen["removed"] - seen["killed"]
    logged = capsys.readouterr().out
    assert f"node {node_name(victim.node_id)} lost: what ran there resumes elsewhere" in logged, logged
    assert not [record.getMessage() for record in caplog.records if "durable checkpoint" in record.getMessage()]
    print(f"\nnode loss: SIGKILL of its raylet to NodeRemoved in the core: {detection:.2f} s")
    assert 0 < detection < DETECTION_BOUND_S
    decisions = [record.decision for record in session.store.decisions(session.experiment_id)]
    placed = nodes_of(decisions)
    assert placed[seen["new"]] >= 1, f"the node that joined got no work: {placed}"
    assert_exact(session, budget)
    session.store.close()
    wait_for(lambda: not trial_processes((tmp_path / "runs").resolve()), 30, "every trial process to end")


def test_unmodified_programs_stopped_on_a_node_that_dies_start_again_on_another(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """Runs after the churn test, on the nodes it left. A program stopped with SIGSTOP lives only in its process: when
    its node dies, it starts again from its beginning on another node and catches up, instead of waiting for ever."""
    budget = 8
    spec = ray_spec(cluster, "ray-unmodified", 6, budget, 0.0, policy={"name": "rr", "period": 0.4})
    spec["trial"] = {"command": f"{sys.executable} trials/printer.py --steps {budget} --rate {{rate}} --sleep 0.15",
                     "metrics_regex": PRINTED, "workdir": str(TESTS)}
    path = write_spec(tmp_path, spec)
    alive = {node_name(node.node_id): node for node in cluster.nodes[1:] if cluster.alive().get(node.node_id)}
    assert len(alive) >= 2, "the churn test leaves two live worker nodes"
    gpu_of: dict[str, str] = {}
    seen: dict[str, Any] = {}

    def kill_a_stopped_ones_node(event: Any, decisions: list) -> None:
        for decision in decisions:
            if isinstance(decision, (Start, Resume)):
                gpu_of[decision.trial_id] = decision.gpu
        if isinstance(event, TrialSuspended) and "killed" not in seen:
            node = gpu_of[event.trial_id].partition("/")[0]
            seen["killed"], seen["trial"] = node, event.trial_id
            cluster.kill_raylet(alive[node])

    session = ExperimentSession(load_spec(path), listeners=[ContractMonitor(), kill_a_stopped_ones_node])
    session.run()
    assert "killed" in seen
    trials = session.scheduler.trials
    assert all(trial.state is TrialState.COMPLETED for trial in trials.values()), {
        trial_id: (trial.state, trial.error) for trial_id, trial in trials.items()}
    for trial in trials.values():
        assert sorted(set(trial.steps)) == list(range(1, budget + 1))
        assert trial.values[-1] == pytest.approx(score(trial.params["rate"], budget), abs=1e-4)
    assert not gpu_of[seen["trial"]].startswith(seen["killed"])  # it ended on another node
    session.store.close()
    wait_for(lambda: not trial_processes((tmp_path / "runs").resolve()), 30, "every trial process to end")


def test_a_driver_killed_with_a_slot_free_is_continued_running_each_trial_once(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """The driver killed (SIGKILL) while trial 0 runs on the first node and the node of trial 1, which completed, is
    free. The rerun lost the old nodes one at a time: losing the first placed trial 0 on the other, not lost yet,
    and the new executor started it there (a node keeps its name on the same cluster); losing that one took the run
    for lost, and trial 0 started a second time, its reports crashing the rerun. One CPU slot on each node that is
    left (at least two: this test comes after those that kill nodes)."""
    budget = 8
    spec = ray_spec(cluster, "ray-crash-free-slot", 2, budget, 0.0, resources={"gpus": "none", "cpu_slots": 1})
    spec["search"] = {"configs": [{"rate": 0.5, "sleep": 0.25}, {"rate": 0.3, "sleep": 0.01}]}
    path = write_spec(tmp_path, spec)
    storage = (tmp_path / "runs").resolve()
    env = {**os.environ, **cluster.env}

    def stored(query: str) -> int:
        return count_rows(storage / "hermes.db", query)

    def one_completed_and_the_other_midway() -> bool:
        return stored("trials WHERE state = 'completed'") == 1 and stored("metrics WHERE trial_id = '0'") >= 2

    returncode, stderr = run_until(path, one_completed_and_the_other_midway, "trial 1 completed, trial 0 midway",
                                   signal.SIGKILL, env, timeout=120)
    assert returncode == -signal.SIGKILL, stderr[-2000:]
    wait_for(lambda: not trial_processes(storage), 30, "the trial processes of the killed driver to end")
    view = rerun_to_the_end(path, storage, env, 2)
    steps = Counter((m.trial_id, m.step) for m in view.metrics)
    assert steps == Counter({(trial, step): 1 for trial in ("0", "1") for step in range(1, budget + 1)}), steps
    for trial in view.trials:  # resumed exactly: the running sum of every step, each added once
        last = next(m for m in view.metrics if m.trial_id == trial.trial_id and m.step == budget)
        expected = 0.0
        for step in range(1, budget + 1):
            expected += score(trial.params["rate"], step)
        assert last.values["total"] == expected
    from hermes.report import open_store

    store = open_store(storage)
    try:
        exits = Counter(e.trial_id for e in store.events(view.experiment.experiment_id) if isinstance(e, TrialExited))
    finally:
        store.close()
    assert exits == Counter({"0": 1, "1": 1}), exits


def test_results_find_the_checkpoints_in_storage_uri_where_no_nodes_folder_is_seen(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """``hermes results`` and ``hermes.run(...).best.checkpoint`` looked for durable checkpoints in the default place
    alone: with ``storage.uri``, read where no node's folder is (KubeRay's head runs no trial), both gave none,
    though each trial's newest was published under the URI."""
    budget = 4
    spec = ray_spec(cluster, "ray-results-uri", 2, budget, 0.01, resources={"gpus": "none", "cpu_slots": 1})
    shared = tmp_path / "shared"
    spec["storage"] |= {"uri": shared.as_uri()}
    path = write_spec(tmp_path, spec)
    env = {**os.environ, **cluster.env}
    run = subprocess.run(hermes_command("run", str(path), "--no-live"), cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    shutil.rmtree(tmp_path / "runs" / "ray-results-uri" / "nodes")  # what a head that runs no trial sees

    results = subprocess.run(hermes_command("results", "runs", "--format", "json"), cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60, check=True)
    checkpoints = {trial["trial"]: trial["checkpoint"] for trial in json.loads(results.stdout)}
    assert set(checkpoints) == {"0", "1"} and None not in checkpoints.values(), checkpoints
    for checkpoint in checkpoints.values():
        assert Path(checkpoint).is_relative_to(shared), checkpoint
        assert json.loads((Path(checkpoint) / "hermes.json").read_text())["step"] == budget
    program = "import hermes\nprint(hermes.run('experiment.yaml').best.checkpoint)\n"
    api = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env={**environment(), **cluster.env},
                         capture_output=True, text=True, timeout=180, check=False)
    assert api.returncode == 0, api.stderr[-3000:]
    assert api.stdout.strip().splitlines()[-1] in checkpoints.values(), api.stdout
