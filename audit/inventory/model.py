"""The node GPU inventory: frozen records of what NVML reported, and their stable JSON form.

Owns the ``GPUInventory`` document (``apiVersion: gpuguard.io/v1alpha1``, ``version: 1``),
documented field by field in ``docs/inventory.md``: :meth:`Inventory.to_dict` writes it and
:func:`inventory_from_dict` reads it back (for ``gpuguard audit --inventory``). Units are in the
field names: ``_bytes``, ``_mib`` (bytes // 2**20, rounded down), ``_percent`` (0-100). ``null``
means "not read" (the call failed or does not apply), never zero.

Must not call NVML (that is :mod:`audit.inventory.nvml_reader`) or read files; reading a malformed
document raises :class:`InventoryFormatError` with the field path, never anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.value_words import described, type_words

__all__ = [
    "API_VERSION",
    "KIND",
    "VERSION",
    "Gpu",
    "Inventory",
    "InventoryFormatError",
    "MigDevice",
    "MigState",
    "NvmlIssue",
    "Process",
    "inventory_from_dict",
    "mib",
]

API_VERSION = "gpuguard.io/v1alpha1"
KIND = "GPUInventory"
#: Schema version: bumped when a field changes meaning or disappears (fields may be added).
VERSION = 1

_MIB = 1 << 20


def mib(value: int | None) -> int | None:
    """Bytes to MiB, rounded down (None stays None)."""
    return None if value is None else value // _MIB


class InventoryFormatError(ValueError):
    """A GPUInventory document that does not follow the schema; the message names the field."""


@dataclass(frozen=True)
class NvmlIssue:
    """One NVML call that failed: recorded, never fatal.

    Attributes:
        call: the NVML function (``nvmlDeviceGetMigMode``).
        code: the NVML return code (``nvmlReturn_t``; 3 NOT_SUPPORTED, 15 GPU_IS_LOST …).
        error: its stable name (:data:`audit.inventory.nvml.ERROR_NAMES`).
        message: the binding's text (``Not Supported``).
    """

    call: str
    code: int
    error: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{call, code, error, message}``."""
        return {"call": self.call, "code": self.code, "error": self.error,
                "message": self.message}


@dataclass(frozen=True)
class Process:
    """A compute process on a GPU or MIG device (``nvmlDeviceGetComputeRunningProcesses``).

    Attributes:
        pid: host PID (NVML reports host PIDs, also inside containers).
        used_memory_bytes: ``usedGpuMemory`` in bytes; None when NVML withholds it
            (``NVML_VALUE_NOT_AVAILABLE``, e.g. without permission).
    """

    pid: int
    used_memory_bytes: int | None

    @property
    def used_memory_mib(self) -> int | None:
        """``used_memory_bytes`` in MiB (rounded down)."""
        return mib(self.used_memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{pid, used_memory_bytes, used_memory_mib}``."""
        return {"pid": self.pid, "used_memory_bytes": self.used_memory_bytes,
                "used_memory_mib": self.used_memory_mib}


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (GPU instance + compute instance) of a MIG-enabled GPU.

    Attributes:
        index: its slot (``nvmlDeviceGetMigDeviceHandleByIndex`` index).
        uuid: ``MIG-…`` (``nvmlDeviceGetUUID``).
        name: ``nvmlDeviceGetName`` (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``).
        profile: the GI profile (``1g.10gb``, ``1c.3g.40gb``, ``1g.10gb+me``), rebuilt from
            ``nvmlDeviceGetAttributes`` with the go-nvlib rule, suffixes from the name.
        gpu_instance_id / compute_instance_id: ``nvmlDeviceGetGpuInstanceId`` /
            ``nvmlDeviceGetComputeInstanceId``.
        multiprocessors: ``multiprocessorCount`` of the attributes.
        memory_total_mib: ``memorySizeMB`` of the attributes (MiB).
        memory_used_bytes: ``nvmlDeviceGetMemoryInfo(mig).used`` (bytes).
        processes: compute processes on this device; None when the call failed.
        errors: the NVML calls on this device that failed.
    """

    index: int
    uuid: str | None
    name: str | None
    profile: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessors: int | None
    memory_total_mib: int | None
    memory_used_bytes: int | None
    processes: tuple[Process, ...] | None
    errors: tuple[NvmlIssue, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (docs/inventory.md, ``MIG_DEVICE``)."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "profile": self.profile,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "multiprocessors": self.multiprocessors,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_used_mib": mib(self.memory_used_bytes),
            "processes": _list(self.processes),
            "errors": [e.to_dict() for e in self.errors],
        }


@dataclass(frozen=True)
class MigState:
    """MIG state of one GPU (``nvmlDeviceGetMigMode`` and the MIG device enumeration).

    Attributes:
        capable: True when nvmlDeviceGetMigMode answers, False when it raises NOT_SUPPORTED,
            None when it failed otherwise.
        current / pending: ``enabled`` or ``disabled`` (pending differs until a GPU reset).
        max_devices: ``nvmlDeviceGetMaxMigDeviceCount`` (slots probed).
        devices: the MIG devices found, by slot.
        empty_slots: slots that answered NOT_FOUND / INVALID_ARGUMENT (no MIG device there).
    """

    capable: bool | None
    current: str | None
    pending: str | None
    max_devices: int | None
    devices: tuple[MigDevice, ...] = ()
    empty_slots: tuple[int, ...] = ()

    def profiles(self) -> dict[str, int]:
        """MIG devices per profile (``{"1g.10gb": 2}``); unknown profiles count as ``?``."""
        counts: dict[str, int] = {}
        for device in self.devices:
            key = device.profile or "?"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (docs/inventory.md, ``MIG``)."""
        return {"capable": self.capable, "current": self.current, "pending": self.pending,
                "max_devices": self.max_devices, "devices": [d.to_dict() for d in self.devices],
                "empty_slots": list(self.empty_slots)}


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML reports it.

    Attributes:
        index: NVML index (``nvmlDeviceGetHandleByIndex``).
        status: ``ok``; ``lost`` when a call raised GPU_IS_LOST (reading stopped there);
            ``unavailable`` when no handle could be had for another reason.
        uuid / name / pci_bus_id: ``nvmlDeviceGetUUID`` / ``nvmlDeviceGetName`` /
            ``nvmlDeviceGetPciInfo().busId``.
        model: the MIG catalog model of the name (:func:`policies.facts.mig.model_from_name`), None
        for
            GPUs without MIG in the catalog.
        memory_total_bytes / memory_used_bytes: ``nvmlDeviceGetMemoryInfo`` (bytes; ``used``
            includes driver-reserved memory).
        utilization_gpu_percent / utilization_memory_percent: ``nvmlDeviceGetUtilizationRates``
            (percent over the driver's last sample period; not available with MIG enabled).
        mig: MIG state.
        processes: compute processes on the whole GPU; None when MIG is enabled (they are
            listed per MIG device) or when the call failed.
        errors: the NVML calls on this GPU that failed (MIG devices keep their own).
    """

    index: int
    status: str
    uuid: str | None
    name: str | None
    model: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_gpu_percent: int | None
    utilization_memory_percent: int | None
    mig: MigState
    processes: tuple[Process, ...] | None
    errors: tuple[NvmlIssue, ...] = ()

    def all_processes(self) -> tuple[Process, ...] | None:
        """Processes on the GPU or any of its MIG devices; None when some list was not read."""
        if self.mig.current == "enabled":
            lists = [d.processes for d in self.mig.devices]
        else:
            lists = [self.processes]
        if any(p is None for p in lists):
            return None
        return tuple(p for group in lists for p in group or ())

    def to_dict(self) -> dict[str, Any]:
        """JSON form (docs/inventory.md, ``GPU``)."""
        return {
            "index": self.index,
            "status": self.status,
            "uuid": self.uuid,
            "name": self.name,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_mib": mib(self.memory_total_bytes),
            "memory_used_mib": mib(self.memory_used_bytes),
            "utilization_gpu_percent": self.utilization_gpu_percent,
            "utilization_memory_percent": self.utilization_memory_percent,
            "mig": self.mig.to_dict(),
            "processes": _list(self.processes),
            "errors": [e.to_dict() for e in self.errors],
        }


@dataclass(frozen=True)
class Inventory:
    """Everything NVML reported on one node at one time.

    Attributes:
        node: the Kubernetes node name it describes (None when not known).
        collected_at: ISO 8601 UTC time of the reading (``2026-03-02T10:00:00Z``).
        driver_version: ``nvmlSystemGetDriverVersion``.
        cuda_driver_version: ``nvmlSystemGetCudaDriverVersion`` (12040 = CUDA 12.4).
        nvml_version: ``nvmlSystemGetNVMLVersion``.
        gpus: every GPU ``nvmlDeviceGetCount`` announced, by index.
        errors: failed calls not tied to one GPU (versions, the device count).
    """

    node: str | None
    collected_at: str
    driver_version: str | None
    cuda_driver_version: int | None
    nvml_version: str | None
    gpus: tuple[Gpu, ...]
    errors: tuple[NvmlIssue, ...] = ()

    @property
    def cuda_version(self) -> str | None:
        """``major.minor`` of :attr:`cuda_driver_version` (``12.4``)."""
        version = self.cuda_driver_version
        if version is None:
            return None
        return f"{version // 1000}.{version % 1000 // 10}"

    def to_dict(self) -> dict[str, Any]:
        """The ``GPUInventory`` document (docs/inventory.md)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "version": VERSION,
            "node": self.node,
            "collected_at": self.collected_at,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "cuda_version": self.cuda_version,
            "nvml_version": self.nvml_version,
            "gpu_count": len(self.gpus),
            "gpus": [g.to_dict() for g in self.gpus],
            "errors": [e.to_dict() for e in self.errors],
        }


def _list(processes: tuple[Process, ...] | None) -> list[dict[str, Any]] | None:
    return None if processes is None else [p.to_dict() for p in processes]


# ---------------------------------------------------------------------------------------------
# Reading the JSON back


class _Reader:
    """Typed field access on one JSON object, with the field path in every error."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise InventoryFormatError(f"{path or 'document'}: expected an object, got "
                                       f"{described(data)}")
        self.data = data
        self.path = path

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = True) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = type_words(*kinds)
            raise InventoryFormatError(f"{self._where(key)}: expected {expected}, got "
                                       f"{described(value)}")
        return value

    def items(self, key: str, *, optional: bool = False) -> list[_Reader] | None:
        value = self.get(key, list, optional=optional)
        if value is None:
            return None
        return [_Reader(v, f"{self._where(key)}[{i}]") for i, v in enumerate(value)]


def _issues(reader: _Reader) -> tuple[NvmlIssue, ...]:
    return tuple(
        NvmlIssue(r.get("call", str, optional=False), r.get("code", int, optional=False),
                  r.get("error", str, optional=False), r.get("message", str) or "")
        for r in reader.items("errors", optional=True) or ()
    )


def _ints(reader: _Reader, key: str) -> list[int]:
    values = reader.get(key, list) or []
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InventoryFormatError(f"{reader._where(key)}: expected a list of integers")
    return values


def _processes(reader: _Reader) -> tuple[Process, ...] | None:
    found = reader.items("processes", optional=True)
    if found is None:
        return None
    return tuple(Process(r.get("pid", int, optional=False), r.get("used_memory_bytes", int))
                 for r in found)


def _mig_device(r: _Reader) -> MigDevice:
    return MigDevice(
        index=r.get("index", int, optional=False), uuid=r.get("uuid", str),
        name=r.get("name", str), profile=r.get("profile", str),
        gpu_instance_id=r.get("gpu_instance_id", int),
        compute_instance_id=r.get("compute_instance_id", int),
        multiprocessors=r.get("multiprocessors", int),
        memory_total_mib=r.get("memory_total_mib", int),
        memory_used_bytes=r.get("memory_used_bytes", int),
        processes=_processes(r), errors=_issues(r),
    )


def _gpu(r: _Reader) -> Gpu:
    m = _Reader(r.data.get("mig") or {}, r._where("mig"))
    mig_state = MigState(
        capable=m.get("capable", bool), current=m.get("current", str),
        pending=m.get("pending", str), max_devices=m.get("max_devices", int),
        devices=tuple(_mig_device(d) for d in m.items("devices", optional=True) or ()),
        empty_slots=tuple(_ints(m, "empty_slots")),
    )
    status = r.get("status", str, optional=False)
    if status not in ("ok", "lost", "unavailable"):
        raise InventoryFormatError(f"{r._where('status')}: expected ok, lost or unavailable, "
                                   f"got {status!r}")
    return Gpu(
        index=r.get("index", int, optional=False), status=status, uuid=r.get("uuid", str),
        name=r.get("name", str), model=r.get("model", str), pci_bus_id=r.get("pci_bus_id", str),
        memory_total_bytes=r.get("memory_total_bytes", int),
        memory_used_bytes=r.get("memory_used_bytes", int),
        utilization_gpu_percent=r.get("utilization_gpu_percent", int),
        utilization_memory_percent=r.get("utilization_memory_percent", int),
        mig=mig_state, processes=_processes(r), errors=_issues(r),
    )


def inventory_from_dict(data: Any) -> Inventory:
    """Read a ``GPUInventory`` document (the output of :meth:`Inventory.to_dict`).

    Raises:
        InventoryFormatError: not a GPUInventory of a version this gpuguard reads, or a field of
            the wrong type (the message names it).
    """
    r = _Reader(data, "")
    if r.data.get("kind") != KIND:
        raise InventoryFormatError(f"kind: expected {KIND}, got {r.data.get('kind')!r}")
    version = r.get("version", int, optional=False)
    if version != VERSION:
        raise InventoryFormatError(f"version: {version} is not supported (this gpuguard reads "
                                   f"version {VERSION})")
    return Inventory(
        node=r.get("node", str),
        collected_at=r.get("collected_at", str, optional=False),
        driver_version=r.get("driver_version", str),
        cuda_driver_version=r.get("cuda_driver_version", int),
        nvml_version=r.get("nvml_version", str),
        gpus=tuple(_gpu(g) for g in r.items("gpus") or ()),
        errors=_issues(r),
    )
