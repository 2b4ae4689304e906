"""The switch-cost model: latencies plus state over bandwidth, its profiles, and how the simulator charges it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import MappingProxyType

import pytest

from hermes.policies.rr import RoundRobinPolicy
from hermes.sim.costs import CALIBRATION, SwitchCosts, load_calibration
from hermes.sim.simulate import simulate
from hermes.sim.synthetic import synthetic_trace
from hermes.sim.trace import Trace, TraceTrial, load_trace, write_trace


def test_costs_grow_with_state_along_each_path() -> None:
    costs = SwitchCosts(start=1, suspend=0.1, resume=0.2, migration=0.5, spill=0.3, spill_mb_s=100,
                        network_mb_s=50, device_mb_s=1000, state_mb=0)
    assert costs.suspend_cost(200) == pytest.approx(0.1 + 200 / 1000)
    assert costs.resume_cost(200) == pytest.approx(0.2 + 200 / 1000)
    assert costs.resume_cost(200, other_gpu=True) == pytest.approx(0.2 + 0.2 + 0.3 + 2.0)
    assert costs.resume_cost(200, other_node=True) == pytest.approx(0.2 + 0.2 + 0.3 + 2.0 + 0.5 + 4.0)
    assert costs.switch_cost(200) == pytest.approx(costs.suspend_cost(200) + costs.resume_cost(200))
    assert costs.switch_cost() == pytest.approx(0.3)  # the default state (0 MB here) moves nothing


def test_infinite_bandwidth_is_free_per_megabyte() -> None:
    costs = SwitchCosts(suspend=0.5, resume=1.5, device_mb_s=math.inf, spill=0.0, spill_mb_s=math.inf)
    assert costs.switch_cost(1e6) == 2.0
    assert costs.resume_cost(1e6, other_gpu=True) == 1.5
    assert costs.to_dict()["device_mb_s"] is None


@pytest.mark.parametrize("bad", [{"suspend": -1.0}, {"device_mb_s": 0.0}, {"state_mb": math.inf}, {"spill": math.nan}])
def test_bad_costs_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        SwitchCosts(**bad)


def test_profiles_warm_is_the_default_and_process_is_dearer() -> None:
    warm, process = SwitchCosts.profile("warm"), SwitchCosts.profile("process")
    assert SwitchCosts() == warm
    # measured: warm same-slot switch well under 100 ms, a process per run seconds (10 MB of state)
    assert warm.switch_cost(10) < 0.1
    assert 1 < process.switch_cost(10) < 10
    assert warm.resume_cost(10, other_gpu=True) < 1
    assert SwitchCosts.profile("warm", state_mb=5).state_mb == 5
    with pytest.raises(ValueError, match="unknown switch-cost profile"):
        SwitchCosts.profile("teleport")


def test_the_calibration_file_is_what_the_profiles_read(tmp_path: Path) -> None:
    document = json.loads(CALIBRATION.read_text(encoding="utf-8"))
    assert set(document["profiles"]) >= {"warm", "process"}
    assert load_calibration() == load_calibration(CALIBRATION)
    assert SwitchCosts.profile("process").start == pytest.approx(document["profiles"]["process"]["costs"]["start"])
    assert set(load_calibration(tmp_path / "absent.json")) == {"warm", "process"}  # built-in fallback


def _trial(name: str, state_mb: float | None) -> TraceTrial:
    return TraceTrial(name, (0.1, 0.2, 0.3), (10.0, 10.0, 10.0), False, MappingProxyType({}), state_mb)


def test_state_size_sets_the_simulated_overhead() -> None:
    """Round robin on one GPU: the same switches, so the overhead follows the state moved."""
    costs = SwitchCosts(start=1, suspend=0.1, resume=0.1, device_mb_s=100, state_mb=0)
    small = Trace("small", "max", tuple(_trial(n, 1.0) for n in "abc"))
    large = Trace("large", "max", tuple(_trial(n, 100.0) for n in "abc"))
    runs = [simulate(t, RoundRobinPolicy(period=5), gpus=1, costs=costs) for t in (small, large)]
    assert runs[0].preemptions == runs[1].preemptions > 0
    per_switch = [r.overhead_fraction * 90 / r.preemptions for r in runs]  # 90 s of training in each
    assert per_switch[0] == pytest.approx(0.2 + 2 * 1 / 100)
    assert per_switch[1] == pytest.approx(0.2 + 2 * 100 / 100)


def test_a_trace_without_sizes_takes_the_cost_models_default() -> None:
    trace = Trace("none", "max", tuple(_trial(n, None) for n in "abc"))
    cheap = simulate(trace, RoundRobinPolicy(period=5), gpus=1, costs=SwitchCosts(device_mb_s=100, state_mb=1))
    dear = simulate(trace, RoundRobinPolicy(period=5), gpus=1, costs=SwitchCosts(device_mb_s=100, state_mb=100))
    assert dear.overhead_fraction > cheap.overhead_fraction


def test_moving_to_another_gpu_pays_the_spill() -> None:
    trace = synthetic_trace(12, 6, seed=5, kind="saturating", epoch_seconds=(2.0, 20.0))
    cheap = simulate(trace, RoundRobinPolicy(period=5), gpus=4, seed=5, costs=SwitchCosts(spill=0.0, spill_mb_s=math.inf))
    dear = simulate(trace, RoundRobinPolicy(period=5), gpus=4, seed=5, costs=SwitchCosts(spill=2.0))
    assert cheap.migrations > 0
    assert dear.overhead_fraction > cheap.overhead_fraction


def test_trace_state_mb_column_and_default(tmp_path: Path) -> None:
    path = tmp_path / "sized.csv"
    path.write_text("trial,epoch,metric,seconds,state_mb\na,1,0.1,1,12.5\na,2,0.2,1,12.5\nb,1,0.3,1,\n")
    trace = load_trace(path, "max", state_mb=7.0)
    assert [t.state_mb for t in trace.trials] == [12.5, 7.0]
    assert load_trace(path, "max").trials[1].state_mb is None
    written = tmp_path / "again.csv"
    write_trace(trace, written)
    assert [t.state_mb for t in load_trace(written, "max").trials] == [12.5, 7.0]


@pytest.mark.parametrize("text", ["-1", "inf", "big"])
def test_trace_refuses_a_bad_state_size(tmp_path: Path, text: str) -> None:
    from hermes.errors import TraceError

    path = tmp_path / "bad.csv"
    path.write_text(f"trial,epoch,metric,seconds,state_mb\na,1,0.1,1,{text}\n")
    with pytest.raises(TraceError, match=":2: state_mb"):
        load_trace(path, "max")


def _measured(size: float, suspend: float, resume: float, spill_mb_s: float, device_mb_s: float) -> dict[str, float]:
    """What bench/switching.py measures at one state size for a path with these costs."""
    moved = size / device_mb_s
    return {"step": 0.001, "start": 0.1, "suspend": suspend + moved, "resume": resume + moved,
            "resume_other": resume + moved + 0.01 + size / spill_mb_s}


def test_switching_benchmark_fits_the_device_bandwidth_on_gpu_slots_only() -> None:
    from bench.switching import calibration
    from hermes.local import local_slots

    sizes = [100.0, 1000.0]
    warm = [_measured(size, 0.002, 0.003, 500.0, 20_000.0) for size in sizes]
    cold = [_measured(size, 0.2, 3.0, 500.0, 20_000.0) for size in sizes]
    on_gpu = calibration(sizes, warm, cold, 9_000.0, local_slots(gpus=["GPU-a", "GPU-a"]))
    fitted = on_gpu["profiles"]["warm"]["costs"]
    assert fitted["device_mb_s"] == pytest.approx(20_000.0)  # from the slopes, not the raw copy's 9000
    assert fitted["suspend"] == pytest.approx(0.002) and fitted["resume"] == pytest.approx(0.003)
    assert fitted["spill"] == pytest.approx(0.01) and fitted["spill_mb_s"] == pytest.approx(500.0)
    assert "device_mb_s" not in on_gpu["profiles"]["warm"]["assumed"]
    assert "GPU-a" in on_gpu["measured"]["slots"]

    on_cpu = calibration(sizes, warm, cold, None, local_slots(cpu_slots=2))
    kept = on_cpu["profiles"]["warm"]
    assert kept["costs"]["device_mb_s"] == load_calibration()["warm"]["device_mb_s"]  # nothing to measure it with
    assert "device_mb_s" in kept["assumed"]
