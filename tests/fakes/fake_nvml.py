"""A fake NVML backend with the ``pynvml`` function surface gpuguard calls (audit.inventory.nvml.NvmlBackend).

It raises the real ``pynvml.NVMLError`` subclasses (``pynvml.NVMLError(code)`` picks the subclass,
e.g. ``NVMLError_NotFound``), returns ``str`` like current nvidia-ml-py, and records every call.
Values follow what the hardware reports (memory totals in bytes from nvidia-smi / GFD labels:
A100 80GB 81920 MiB, H100 80GB HBM3 81559 MiB, T4 15360 MiB; MIG instance sizes from
``nvidia-smi mig -lgip`` on A100 80GB: 1g.10gb 9728 MiB, 2g.20gb 19968 MiB, 3g.40gb 40192 MiB).
This is a stand-in, not a recording of a real machine: see tests/data/inventory/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1 << 20
GIB = 1 << 30


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeMig:
    """One MIG device in a slot of a MIG-enabled fake GPU."""

    uuid: str
    profile: str  # as the device name shows it
    gi_slices: int
    ci_slices: int
    memory_mib: int
    multiprocessors: int
    gi_id: int
    ci_id: int
    used_bytes: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code


@dataclass
class FakeGpu:
    """One physical fake GPU."""

    uuid: str
    name: str
    bus_id: str
    total_bytes: int
    used_bytes: int
    utilization: tuple[int, int] | None = (0, 0)  # None: NOT_SUPPORTED
    mig_mode: tuple[int, int] | None = None  # None: NOT_SUPPORTED (not MIG-capable)
    max_mig: int = 0
    migs: dict[int, FakeMig] = field(default_factory=dict)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False  # every call after the handle raises GPU_IS_LOST
    lost_at_handle: bool = False  # nvmlDeviceGetHandleByIndex itself raises GPU_IS_LOST
    errors: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code


class FakeNvml:
    """The fake ``pynvml`` module: same function names and signatures as nvidia-ml-py."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15", cuda: int = 12040,
                 nvml: str = "12.550.54.15", init_error: int | None = None,
                 system_errors: dict[str, int] | None = None) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.nvml = nvml
        self.init_error = init_error
        self.system_errors = system_errors or {}
        self.calls: list[str] = []
        self.initialized = 0

    # -- helpers -------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialized:
            raise error(pynvml.NVML_ERROR_UNINITIALIZED)
        if name in self.system_errors:
            raise error(self.system_errors[name])

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        self._enter(name)
        kind, index = handle[0], handle[1]
        gpu = self.gpus[index]
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if kind == "gpu" and name in gpu.errors:
            raise error(gpu.errors[name])
        return gpu

    def _mig(self, name: str, handle: Any) -> FakeMig:
        gpu = self._gpu(name, handle)
        device = gpu.migs[handle[2]]
        if name in device.errors:
            raise error(device.errors[name])
        return device

    # -- system --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    # -- devices -------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost_at_handle:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        if handle[0] == "mig":
            gpu = self._gpu("nvmlDeviceGetName", handle)
            return f"{gpu.name} MIG {self._mig('nvmlDeviceGetName', handle).profile}"
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if handle[0] == "mig":
            return self._mig("nvmlDeviceGetUUID", handle).uuid
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=gpu.bus_id, domain=0, bus=int(gpu.bus_id[9:11], 16))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        if handle[0] == "mig":
            device = self._mig("nvmlDeviceGetMemoryInfo", handle)
            total = device.memory_mib * MIB
            return SimpleNamespace(total=total, used=device.used_bytes,
                                   free=total - device.used_bytes)
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=gpu.total_bytes, used=gpu.used_bytes,
                               free=gpu.total_bytes - gpu.used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.utilization is None or (gpu.mig_mode and gpu.mig_mode[0] == 1):
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.utilization[0], memory=gpu.utilization[1])

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", device)
        if gpu.mig_mode is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", device)
        if gpu.mig_mode is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < gpu.max_mig:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index not in gpu.migs:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", device[1], index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", device).ci_id

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        if device[0] != "mig":
            self._gpu("nvmlDeviceGetAttributes", device)
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = self._mig("nvmlDeviceGetAttributes", device)
        return SimpleNamespace(
            multiprocessorCount=mig.multiprocessors, sharedCopyEngineCount=mig.gi_slices,
            sharedDecoderCount=0, sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0,
            gpuInstanceSliceCount=mig.gi_slices, computeInstanceSliceCount=mig.ci_slices,
            memorySizeMB=mig.memory_mib)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if handle[0] == "mig":
            found = self._mig("nvmlDeviceGetComputeRunningProcesses", handle).processes
        else:
            found = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle).processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for pid, used in found]


# -- the GPUs of the documented example ---------------------------------------------------------

A100_80GB_TOTAL = 81920 * MIB
H100_80GB_TOTAL = 81559 * MIB
A100_40GB_PCIE_TOTAL = 40960 * MIB
T4_TOTAL = 15360 * MIB

# (profile, G, C, memory MiB, SMs) on A100 80GB and A100 40GB (nvidia-smi mig -lgip).
A100_80GB_PROFILES = {"1g.10gb": (1, 1, 9728, 14), "2g.20gb": (2, 2, 19968, 28),
                      "3g.40gb": (3, 3, 40192, 42), "7g.80gb": (7, 7, 80896, 98)}
A100_40GB_PROFILES = {"1g.5gb": (1, 1, 4864, 14), "2g.10gb": (2, 2, 9984, 28),
                      "3g.20gb": (3, 3, 20096, 42)}


def mig_device(table: dict[str, tuple[int, int, int, int]], profile: str, uuid: str, gi_id: int,
               used_mib: int = 13, processes: list[tuple[int, int | None]] | None = None,
               ) -> FakeMig:
    g, c, memory, sms = table[profile]
    return FakeMig(uuid=uuid, profile=profile, gi_slices=g, ci_slices=c, memory_mib=memory,
                   multiprocessors=sms, gi_id=gi_id, ci_id=0, used_bytes=used_mib * MIB,
                   processes=processes or [])


def a100_mig(uuid: str = "GPU-4f2e9a10-7c1d-4b8e-9a55-0d3c2b1a0001",
             bus_id: str = "00000000:07:00.0") -> FakeGpu:
    """A100-SXM4-80GB in MIG mode: 3g.40gb, 2g.20gb and two 1g.10gb; slots 4-6 empty."""
    table = A100_80GB_PROFILES
    migs = {
        0: mig_device(table, "3g.40gb", "MIG-2b7c3d4e-0001-5f60-8a9b-c0d1e2f30001", 2,
                      used_mib=20493, processes=[(41022, 20480 * MIB)]),
        1: mig_device(table, "2g.20gb", "MIG-2b7c3d4e-0002-5f60-8a9b-c0d1e2f30002", 3),
        2: mig_device(table, "1g.10gb", "MIG-2b7c3d4e-0003-5f60-8a9b-c0d1e2f30003", 9,
                      used_mib=3085, processes=[(41177, None)]),
        3: mig_device(table, "1g.10gb", "MIG-2b7c3d4e-0004-5f60-8a9b-c0d1e2f30004", 10),
    }
    return FakeGpu(uuid=uuid, name="NVIDIA A100-SXM4-80GB", bus_id=bus_id,
                   total_bytes=A100_80GB_TOTAL, used_bytes=24217 * MIB, utilization=(0, 0),
                   mig_mode=(1, 1), max_mig=7, migs=migs)


def h100(uuid: str = "GPU-9d8c7b6a-5e4f-4a3b-8c2d-1e0f9a8b0002", bus_id: str = "00000000:18:00.0",
         utilization: tuple[int, int] = (87, 41),
         processes: list[tuple[int, int | None]] | None = None, used_mib: int | None = None,
         ) -> FakeGpu:
    """H100 80GB HBM3, MIG capable but disabled, running two processes by default."""
    found = [(3001, 40960 * MIB), (3002, 512 * MIB)] if processes is None else processes
    if used_mib is None:
        used_mib = 547 + sum((u or 0) for _, u in found) // MIB
    return FakeGpu(uuid=uuid, name="NVIDIA H100 80GB HBM3", bus_id=bus_id,
                   total_bytes=H100_80GB_TOTAL, used_bytes=used_mib * MIB,
                   utilization=utilization, mig_mode=(0, 0), processes=found)


def lost_gpu(uuid: str = "GPU-0a1b2c3d-4e5f-4607-8899-aabbccdd0003",
             bus_id: str = "00000000:2a:00.0") -> FakeGpu:
    """An H100 that fell off the bus: every call after the handle raises GPU_IS_LOST."""
    return FakeGpu(uuid=uuid, name="NVIDIA H100 80GB HBM3", bus_id=bus_id,
                   total_bytes=H100_80GB_TOTAL, used_bytes=0, lost=True)


def t4(uuid: str = "GPU-7e6d5c4b-3a29-4180-9f6e-5d4c3b2a0004",
       bus_id: str = "00000000:3b:00.0") -> FakeGpu:
    """Tesla T4: no MIG (nvmlDeviceGetMigMode raises NOT_SUPPORTED), idle, no processes."""
    return FakeGpu(uuid=uuid, name="Tesla T4", bus_id=bus_id, total_bytes=T4_TOTAL,
                   used_bytes=5 * MIB, utilization=(0, 0), mig_mode=None)


def example_machine() -> FakeNvml:
    """The machine of docs/inventory.md: A100 MIG mixed, H100 with processes, lost GPU, T4."""
    return FakeNvml([a100_mig(), h100(), lost_gpu(), t4()])
