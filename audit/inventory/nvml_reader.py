"""Reading a node's GPUs through an NVML backend into an :class:`audit.inventory.model.Inventory`.

Owns the NVML call sequence (``shared/reference/gpu-domain.md`` section 6): ``nvmlInit``; driver,
CUDA and NVML versions; for each index of ``nvmlDeviceGetCount``: handle, UUID, name, PCI bus id,
memory, utilization, MIG mode (current and pending) and, when MIG is enabled, the go-nvlib MIG
enumeration loop (``nvmlDeviceGetMaxMigDeviceCount`` slots, ``nvmlDeviceGetMigDeviceHandleByIndex``
with NOT_FOUND / INVALID_ARGUMENT meaning an empty slot) with each MIG device's UUID, profile,
instance ids, memory and processes; compute processes of whole GPUs; ``nvmlShutdown``.

Every NVML error after ``nvmlInit`` is recorded in the inventory, never raised: NOT_SUPPORTED
(utilization on MIG, MIG mode on a T4) leaves the field null, GPU_IS_LOST marks the GPU ``lost``
and stops reading it. Only a failing ``nvmlInit`` raises
:class:`audit.inventory.nvml.NvmlUnavailable`.

Must not import ``pynvml`` (the backend is passed in; :func:`audit.inventory.nvml.load_backend`
gives the real one), print, or touch the cluster.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from audit.inventory.model import Gpu, Inventory, MigDevice, MigState, NvmlIssue, Process
from audit.inventory.nvml import (
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    NvmlBackend,
    NvmlUnavailable,
    error_code,
    error_name,
    unavailable_reason,
)
from policies.facts import mig

__all__ = ["profile_from_attributes", "read_inventory", "timestamp"]

_MIB = 1 << 20
_GIB = 1 << 30
_NOT_AVAILABLE = 1 << 63  # usedGpuMemory at or above this is NVML_VALUE_NOT_AVAILABLE
_MIG_MODES = {0: "disabled", 1: "enabled"}


def timestamp(now: datetime.datetime) -> str:
    """ISO 8601 UTC with seconds and a ``Z`` (``2026-03-02T10:00:00Z``)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def profile_from_attributes(
    gi_slices: int, ci_slices: int, memory_mib: int, gpu_total_bytes: int
) -> str | None:
    """The MIG profile name of a MIG device, rebuilt as go-nvlib does (reference section 6).

    Memory GB = round(ceil(8 x instance memory / GPU memory) / 8 x ceil(GPU memory in GiB)), so
    ``9728`` MiB on an 80 GiB A100 is ``10`` (``1g.10gb``); a compute instance smaller than its GPU
    instance gets the ``<C>c.`` prefix.

    Args:
        gi_slices / ci_slices: ``gpuInstanceSliceCount`` / ``computeInstanceSliceCount`` of
            ``nvmlDeviceGetAttributes``.
        memory_mib: ``memorySizeMB`` of the same attributes (MiB).
        gpu_total_bytes: the parent GPU's ``nvmlDeviceGetMemoryInfo().total`` (bytes).

    Returns:
        ``<G>g.<GB>gb`` or ``<C>c.<G>g.<GB>gb``, or None when an input is not positive.
    """
    if min(gi_slices, ci_slices, memory_mib, gpu_total_bytes) <= 0 or ci_slices > gi_slices:
        return None
    eighths = -(-(memory_mib * _MIB * 8) // gpu_total_bytes)  # ceil(8 x fraction of the GPU)
    total_gib = -(-gpu_total_bytes // _GIB)
    memory_gb = (2 * eighths * total_gib + 8) // 16  # round half up of eighths x total_gib / 8
    prefix = f"{ci_slices}c." if ci_slices < gi_slices else ""
    return f"{prefix}{gi_slices}g.{memory_gb}gb"


def _text(value: Any) -> str:
    """A string result of the binding (old nvidia-ml-py releases return bytes)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).rstrip("\x00").strip()


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


class _Lost(Exception):
    """The GPU answered GPU_IS_LOST: stop reading it."""


@dataclass
class _Calls:
    """NVML calls on one device: failures become :class:`NvmlIssue` records."""

    backend: NvmlBackend
    issues: list[NvmlIssue] = field(default_factory=list)
    lost: NvmlIssue | None = None
    device: bool = True  # False for system calls: GPU_IS_LOST is then recorded like any error

    def __call__(self, name: str, *args: Any, expected: tuple[int, ...] = ()) -> Any:
        """Call ``backend.<name>(*args)``; on an NVML error record it and return None.

        Codes in ``expected`` are re-raised unrecorded for the caller to interpret.

        Raises:
            _Lost: the device answered GPU_IS_LOST (recorded in :attr:`lost`).
        """
        try:
            return getattr(self.backend, name)(*args)
        except self.backend.NVMLError as exc:
            code = error_code(exc)
            if code in expected:
                raise
            issue = NvmlIssue(name, code if code is not None else -1, error_name(code),
                              str(exc).strip())
            if code == GPU_IS_LOST and self.device:
                self.lost = issue
                raise _Lost from None
            self.issues.append(issue)
            return None


def _processes(calls: _Calls, handle: Any) -> tuple[Process, ...] | None:
    found = calls("nvmlDeviceGetComputeRunningProcesses", handle)
    if found is None:
        return None
    records = []
    for process in found:
        pid = _int(getattr(process, "pid", None))
        if pid is None:
            continue
        used = _int(getattr(process, "usedGpuMemory", None))
        records.append(Process(pid, None if used is None or used >= _NOT_AVAILABLE else used))
    return tuple(sorted(records, key=lambda p: p.pid))


def _mig_profile(attributes: Any, name: str | None, gpu_total_bytes: int | None) -> str | None:
    """Profile from the attributes; ``+me`` / ``+gfx`` / ``-me`` suffixes from the device name."""
    named = None
    if name and " MIG " in f" {name} ":
        named = mig.parse_profile(name.rsplit("MIG", 1)[-1].strip())
    built = None
    if attributes is not None and gpu_total_bytes:
        built = profile_from_attributes(
            _int(getattr(attributes, "gpuInstanceSliceCount", None)) or 0,
            _int(getattr(attributes, "computeInstanceSliceCount", None)) or 0,
            _int(getattr(attributes, "memorySizeMB", None)) or 0,
            gpu_total_bytes,
        )
    if built is None:
        return named.canonical if named else None
    parsed = mig.parse_profile(built)
    if named and parsed and (named.gi_slices, named.memory_gb) == (
            parsed.gi_slices, parsed.memory_gb):
        suffix = named.canonical.split("gb", 1)[1]
        combined = mig.parse_profile(built + suffix)
        return combined.canonical if combined else built
    return built


def _mig_device(calls: _Calls, index: int, handle: Any, gpu_total: int | None) -> MigDevice:
    """Read one MIG device; its failed calls go to its own ``errors`` (GPU_IS_LOST propagates)."""
    own = _Calls(calls.backend)
    try:
        uuid = own("nvmlDeviceGetUUID", handle)
        name = own("nvmlDeviceGetName", handle)
        name = _text(name) if name is not None else None
        gi = own("nvmlDeviceGetGpuInstanceId", handle)
        ci = own("nvmlDeviceGetComputeInstanceId", handle)
        attributes = own("nvmlDeviceGetAttributes", handle)
        memory = own("nvmlDeviceGetMemoryInfo", handle)
        processes = _processes(own, handle)
    except _Lost:
        calls.lost = own.lost
        raise
    return MigDevice(
        index=index,
        uuid=_text(uuid) if uuid is not None else None,
        name=name,
        profile=_mig_profile(attributes, name, gpu_total),
        gpu_instance_id=_int(gi),
        compute_instance_id=_int(ci),
        multiprocessors=_int(getattr(attributes, "multiprocessorCount", None)),
        memory_total_mib=_int(getattr(attributes, "memorySizeMB", None)),
        memory_used_bytes=_int(getattr(memory, "used", None)),
        processes=processes,
        errors=tuple(own.issues),
    )


@dataclass
class _GpuDraft:
    """Fields of a GPU gathered so far (kept when the GPU is lost half-way)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    mig_capable: bool | None = None
    mig_current: str | None = None
    mig_pending: str | None = None
    mig_max: int | None = None
    mig_devices: list[MigDevice] = field(default_factory=list)
    empty_slots: list[int] = field(default_factory=list)
    processes: tuple[Process, ...] | None = None

    def build(self, status: str, issues: list[NvmlIssue]) -> Gpu:
        return Gpu(
            index=self.index, status=status, uuid=self.uuid, name=self.name,
            model=mig.model_from_name(self.name) if self.name else None,
            pci_bus_id=self.pci_bus_id, memory_total_bytes=self.memory_total,
            memory_used_bytes=self.memory_used, utilization_gpu_percent=self.utilization_gpu,
            utilization_memory_percent=self.utilization_memory,
            mig=MigState(self.mig_capable, self.mig_current, self.mig_pending, self.mig_max,
                         tuple(self.mig_devices), tuple(self.empty_slots)),
            processes=self.processes, errors=tuple(issues),
        )


def _read_mig(calls: _Calls, handle: Any, draft: _GpuDraft) -> None:
    """MIG mode, and the MIG devices when it is enabled (go-nvlib's VisitMigDevices loop)."""
    try:
        modes = calls("nvmlDeviceGetMigMode", handle, expected=(NOT_SUPPORTED,))
    except calls.backend.NVMLError as exc:
        calls.issues.append(NvmlIssue("nvmlDeviceGetMigMode", NOT_SUPPORTED,
                                      error_name(NOT_SUPPORTED), str(exc).strip()))
        draft.mig_capable = False
        return
    if modes is None:
        return
    current, pending = [*list(modes), None, None][:2]
    draft.mig_capable = True
    draft.mig_current = _MIG_MODES.get(current) if _int(current) is not None else None
    draft.mig_pending = _MIG_MODES.get(pending) if _int(pending) is not None else None
    if draft.mig_current != "enabled":
        return
    draft.mig_max = _int(calls("nvmlDeviceGetMaxMigDeviceCount", handle))
    for slot in range(draft.mig_max or 0):
        try:
            mig_handle = calls("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot,
                               expected=(NOT_FOUND, INVALID_ARGUMENT))
        except calls.backend.NVMLError:
            draft.empty_slots.append(slot)
            continue
        if mig_handle is not None:
            draft.mig_devices.append(_mig_device(calls, slot, mig_handle, draft.memory_total))


def _read_gpu(backend: NvmlBackend, index: int) -> Gpu:
    calls = _Calls(backend)
    draft = _GpuDraft(index)
    try:
        handle = calls("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return draft.build("unavailable", calls.issues)
        uuid = calls("nvmlDeviceGetUUID", handle)
        draft.uuid = _text(uuid) if uuid is not None else None
        name = calls("nvmlDeviceGetName", handle)
        draft.name = _text(name) if name is not None else None
        pci = calls("nvmlDeviceGetPciInfo", handle)
        bus = getattr(pci, "busId", None)
        draft.pci_bus_id = _text(bus) if bus else None
        memory = calls("nvmlDeviceGetMemoryInfo", handle)
        draft.memory_total = _int(getattr(memory, "total", None))
        draft.memory_used = _int(getattr(memory, "used", None))
        _read_mig(calls, handle, draft)
        rates = calls("nvmlDeviceGetUtilizationRates", handle)
        draft.utilization_gpu = _int(getattr(rates, "gpu", None))
        draft.utilization_memory = _int(getattr(rates, "memory", None))
        if draft.mig_current != "enabled":
            draft.processes = _processes(calls, handle)
    except _Lost:
        return draft.build("lost", [*calls.issues, *([calls.lost] if calls.lost else [])])
    return draft.build("ok", calls.issues)


def read_inventory(
    backend: NvmlBackend,
    *,
    node: str | None = None,
    now: Callable[[], datetime.datetime] | None = None,
) -> Inventory:
    """Initialise NVML on ``backend``, read every GPU, shut NVML down.

    Args:
        backend: the ``pynvml`` module (:func:`audit.inventory.nvml.load_backend`) or a fake.
        node: the Kubernetes node name to record.
        now: clock for ``collected_at`` (default: the current UTC time).

    Raises:
        NvmlUnavailable: ``nvmlInit`` failed (no library, no driver, no permission …); the
            message is one line.
    """
    try:
        backend.nvmlInit()
    except backend.NVMLError as exc:
        raise NvmlUnavailable(unavailable_reason(exc)) from None
    collected = timestamp((now or (lambda: datetime.datetime.now(datetime.UTC)))())
    try:
        system = _Calls(backend, device=False)
        driver = system("nvmlSystemGetDriverVersion")
        cuda = system("nvmlSystemGetCudaDriverVersion")
        nvml_version = system("nvmlSystemGetNVMLVersion")
        count = _int(system("nvmlDeviceGetCount"))
        gpus = tuple(_read_gpu(backend, index) for index in range(count or 0))
    finally:
        with contextlib.suppress(backend.NVMLError):  # the inventory is already read
            backend.nvmlShutdown()
    return Inventory(
        node=node,
        collected_at=collected,
        driver_version=_text(driver) if driver is not None else None,
        cuda_driver_version=_int(cuda),
        nvml_version=_text(nvml_version) if nvml_version is not None else None,
        gpus=gpus,
        errors=tuple(system.issues),
    )
