"""The slots of the local machine: its GPUs, or exclusive shares of its CPU cores.

Each slot is what the core calls a GPU: one trial at a time runs on it. A GPU slot pins its trial
with CUDA_VISIBLE_DEVICES (by UUID, which unlike an index means the same device to NVML and to
CUDA whatever CUDA_DEVICE_ORDER says); a CPU slot hides every GPU and, where the machine has the
cores, pins its trial to its own cores with sched_setaffinity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hermes.errors import HermesError


@dataclass(frozen=True, slots=True)
class Slot:
    node: str
    name: str  # "<node>/gpu0", "<node>/cpu1": the GPU name the scheduler sees
    visible_devices: str  # CUDA_VISIBLE_DEVICES of its trials ("" hides every GPU)
    cpus: frozenset[int] | None  # cores its trials are pinned to; None leaves them to the OS
    threads: int  # OMP/MKL/torch threads its trials may use


def discover_gpus() -> list[str]:
    """UUIDs of the NVIDIA GPUs this process may use; none without NVML or a driver.

    A CUDA_VISIBLE_DEVICES already set restricts them: UUIDs match as given, integers are read as
    NVML (PCI bus) indices, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        uuids = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
    finally:
        pynvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return uuids
    chosen = []
    for entry in filter(None, (part.strip() for part in visible.split(","))):
        if entry.isdigit():
            chosen.extend(uuids[int(entry) : int(entry) + 1])
        else:
            chosen.extend(uuid for uuid in uuids if uuid.startswith(entry))
    return chosen


def local_slots(
    node: str = "local",
    *,
    gpus: list[str] | None = None,
    cpu_slots: int | None = None,
    threads_per_slot: int = 1,
) -> list[Slot]:
    """One slot per GPU (``gpus`` UUIDs, discovered when None), or ``cpu_slots`` CPU slots.

    Asking for ``cpu_slots`` uses CPU slots even on a GPU machine. Without GPUs and without
    ``cpu_slots``, the machine's cores are split into slots of ``threads_per_slot`` cores. GPU
    slots share the cores evenly, for data loading.
    """
    if threads_per_slot < 1:
        raise HermesError(f"threads_per_slot must be at least 1, got {threads_per_slot}")
    cores = sorted(os.sched_getaffinity(0))
    if cpu_slots is None:
        gpus = discover_gpus() if gpus is None else gpus
        if gpus:
            share = max(1, len(cores) // len(gpus))
            pinned = len(cores) >= share * len(gpus)
            return [
                Slot(
                    node,
                    f"{node}/gpu{i}",
                    uuid,
                    frozenset(cores[i * share : (i + 1) * share]) if pinned else None,
                    share,
                )
                for i, uuid in enumerate(gpus)
            ]
        cpu_slots = max(1, len(cores) // threads_per_slot)
    if cpu_slots < 1:
        raise HermesError(f"cpu_slots must be at least 1, got {cpu_slots}")
    pinned = len(cores) >= cpu_slots * threads_per_slot
    return [
        Slot(
            node,
            f"{node}/cpu{i}",
            "",
            frozenset(cores[i * threads_per_slot : (i + 1) * threads_per_slot]) if pinned else None,
            threads_per_slot,
        )
        for i in range(cpu_slots)
    ]
