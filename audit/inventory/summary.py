"""The compact inventory written on the Node (annotation ``gpuguard.io/inventory``) and read back.

Owns the ``GPUInventorySummary`` document (version 1, docs/inventory.md): per GPU its index, UUID
prefix, name, memory, MIG mode and the MIG profiles present, utilization and process counts; plus
driver / CUDA versions and the collection time. It is what the auditor joins with Kubernetes'
allocations (:mod:`audit.inventory.join`), so a full :class:`audit.inventory.model.Inventory` is
summarised the same way before joining. The JSON is compact and at most :data:`MAX_BYTES` long
(GPUs past the limit are dropped and ``truncated`` is set), well under the API server's 256 KiB
limit for all annotations of an object.

Must not call NVML or the API server, or read files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from audit.inventory.model import Gpu, Inventory, InventoryFormatError, mib
from policies.sources import load_json
from policies.value_words import described, type_words

__all__ = [
    "ANNOTATION",
    "MAX_BYTES",
    "SUMMARY_KIND",
    "SUMMARY_VERSION",
    "GpuSummary",
    "InventorySummary",
    "summarize",
    "summary_from_dict",
    "summary_from_json",
]

ANNOTATION = "gpuguard.io/inventory"
SUMMARY_KIND = "GPUInventorySummary"
SUMMARY_VERSION = 1
#: Largest annotation value written (bytes of compact JSON).
MAX_BYTES = 16 * 1024
UUID_PREFIX = 12  # "GPU-" and 8 hex digits: unique in practice, a third of the size
MAX_NAME = 64


@dataclass(frozen=True)
class GpuSummary:
    """One GPU in the summary (units in the names: MiB, percent).

    Attributes:
        index: NVML index.
        uuid: the first 12 characters of the UUID (``GPU-4f2e9a10``).
        name: NVML product name (at most 64 characters).
        status: ``ok``, ``lost`` or ``unavailable`` (as in the inventory).
        memory_total_mib / memory_used_mib: ``nvmlDeviceGetMemoryInfo``.
        utilization_percent: ``nvmlDeviceGetUtilizationRates().gpu``; None with MIG enabled.
        mig: current MIG mode ``enabled`` / ``disabled``; None when the GPU has no MIG.
        mig_pending: the pending mode, when it differs from the current one (else None).
        mig_profiles: MIG devices per profile (``{"1g.10gb": 2}``).
        mig_busy: of those, how many run at least one process; None when not read.
        process_count: compute processes on the GPU and its MIG devices; None when not read.
        process_memory_mib: their summed used memory (MiB); None when NVML withheld some.
    """

    index: int
    uuid: str | None
    name: str | None
    status: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_percent: int | None
    mig: str | None
    mig_pending: str | None
    mig_profiles: Mapping[str, int] = field(default_factory=dict)
    mig_busy: Mapping[str, int] | None = None
    process_count: int | None = None
    process_memory_mib: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (docs/inventory.md, ``SUMMARY_GPU``)."""
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name, "status": self.status,
            "memory_total_mib": self.memory_total_mib, "memory_used_mib": self.memory_used_mib,
            "utilization_percent": self.utilization_percent, "mig": self.mig,
            "mig_pending": self.mig_pending, "mig_profiles": dict(self.mig_profiles),
            "mig_busy": None if self.mig_busy is None else dict(self.mig_busy),
            "process_count": self.process_count, "process_memory_mib": self.process_memory_mib,
        }


@dataclass(frozen=True)
class InventorySummary:
    """A node's GPUs in short: what the annotation holds and the join reads.

    Attributes:
        node: node name (None when the inventory did not say).
        collected_at: ISO 8601 UTC time of the NVML reading.
        driver_version / cuda_version: ``550.54.15`` / ``12.4``.
        gpu_count: GPUs NVML reported (also those dropped by truncation).
        gpus: the GPUs, by index.
        truncated: True when GPUs were dropped to stay under :data:`MAX_BYTES`.
    """

    node: str | None
    collected_at: str
    driver_version: str | None
    cuda_version: str | None
    gpu_count: int
    gpus: tuple[GpuSummary, ...]
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The ``GPUInventorySummary`` document (docs/inventory.md)."""
        return {
            "kind": SUMMARY_KIND, "version": SUMMARY_VERSION, "node": self.node,
            "collected_at": self.collected_at, "driver_version": self.driver_version,
            "cuda_version": self.cuda_version, "gpu_count": self.gpu_count,
            "truncated": self.truncated, "gpus": [g.to_dict() for g in self.gpus],
        }

    def to_json(self) -> str:
        """Compact JSON, the annotation value (at most :data:`MAX_BYTES` when built by
        :func:`summarize`)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=True)


def _gpu_summary(gpu: Gpu) -> GpuSummary:
    processes = gpu.all_processes()
    memory = None
    if processes is not None and all(p.used_memory_mib is not None for p in processes):
        memory = sum(p.used_memory_mib or 0 for p in processes)
    busy: dict[str, int] | None = None  # None: some instance's processes are unknown
    if all(device.processes is not None for device in gpu.mig.devices):
        busy = {}
        for device in gpu.mig.devices:
            if device.processes:
                key = device.profile or "?"
                busy[key] = busy.get(key, 0) + 1
    mig_mode = gpu.mig.current if gpu.mig.capable else None
    pending = gpu.mig.pending if gpu.mig.pending != gpu.mig.current else None
    return GpuSummary(
        index=gpu.index,
        uuid=gpu.uuid[:UUID_PREFIX] if gpu.uuid else None,
        name=gpu.name[:MAX_NAME] if gpu.name else None,
        status=gpu.status,
        memory_total_mib=mib(gpu.memory_total_bytes),
        memory_used_mib=mib(gpu.memory_used_bytes),
        utilization_percent=gpu.utilization_gpu_percent,
        mig=mig_mode,
        mig_pending=pending if mig_mode else None,
        mig_profiles=gpu.mig.profiles(),
        mig_busy=dict(sorted(busy.items())) if busy is not None else None,
        process_count=None if processes is None else len(processes),
        process_memory_mib=memory,
    )


def summarize(inventory: Inventory, *, max_bytes: int = MAX_BYTES) -> InventorySummary:
    """The summary of ``inventory``, cut to ``max_bytes`` of JSON by dropping trailing GPUs."""
    summary = InventorySummary(
        node=inventory.node, collected_at=inventory.collected_at,
        driver_version=inventory.driver_version, cuda_version=inventory.cuda_version,
        gpu_count=len(inventory.gpus), gpus=tuple(_gpu_summary(g) for g in inventory.gpus),
    )
    while len(summary.to_json()) > max_bytes and summary.gpus:
        summary = replace(summary, gpus=summary.gpus[:-1], truncated=True)
    return summary


# ---------------------------------------------------------------------------------------------
# Reading


def _field(data: Mapping[str, Any], key: str, kind: type, where: str,
           optional: bool = True) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InventoryFormatError(f"{where}{key}: expected {type_words(kind)}, got "
                                   f"{described(value)}")
    return value


def _counts(data: Mapping[str, Any], key: str, where: str) -> dict[str, int] | None:
    value = _field(data, key, dict, where)
    if value is None:
        return None
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in value.values()):
        raise InventoryFormatError(f"{where}{key}: expected profile -> count")
    return {str(k): v for k, v in value.items()}


def summary_from_dict(data: Any) -> InventorySummary:
    """Read a ``GPUInventorySummary`` document.

    Raises:
        InventoryFormatError: not a summary of a version this gpuguard reads, or a field of the
            wrong type (the message names it).
    """
    if not isinstance(data, Mapping):
        raise InventoryFormatError(f"expected an object, got {described(data)}")
    if data.get("kind") != SUMMARY_KIND:
        raise InventoryFormatError(f"kind: expected {SUMMARY_KIND}, got {data.get('kind')!r}")
    version = _field(data, "version", int, "", optional=False)
    if version != SUMMARY_VERSION:
        raise InventoryFormatError(f"version: {version} is not supported (this gpuguard reads "
                                   f"version {SUMMARY_VERSION})")
    gpus = []
    for number, raw in enumerate(_field(data, "gpus", list, "", optional=False)):
        where = f"gpus[{number}]."
        if not isinstance(raw, Mapping):
            raise InventoryFormatError(f"gpus[{number}]: expected an object")
        gpus.append(GpuSummary(
            index=_field(raw, "index", int, where, optional=False),
            uuid=_field(raw, "uuid", str, where),
            name=_field(raw, "name", str, where),
            status=_field(raw, "status", str, where, optional=False),
            memory_total_mib=_field(raw, "memory_total_mib", int, where),
            memory_used_mib=_field(raw, "memory_used_mib", int, where),
            utilization_percent=_field(raw, "utilization_percent", int, where),
            mig=_field(raw, "mig", str, where),
            mig_pending=_field(raw, "mig_pending", str, where),
            mig_profiles=_counts(raw, "mig_profiles", where) or {},
            mig_busy=_counts(raw, "mig_busy", where),
            process_count=_field(raw, "process_count", int, where),
            process_memory_mib=_field(raw, "process_memory_mib", int, where),
        ))
    return InventorySummary(
        node=_field(data, "node", str, ""),
        collected_at=_field(data, "collected_at", str, "", optional=False),
        driver_version=_field(data, "driver_version", str, ""),
        cuda_version=_field(data, "cuda_version", str, ""),
        gpu_count=_field(data, "gpu_count", int, "", optional=False),
        gpus=tuple(gpus),
        truncated=bool(_field(data, "truncated", bool, "")),
    )


def summary_from_json(text: str) -> InventorySummary:
    """Read the annotation value (compact JSON of a summary).

    Raises:
        InventoryFormatError: not JSON, or not a summary (the message says which).
    """
    try:
        data = load_json(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InventoryFormatError(f"not JSON: {exc}") from None
    return summary_from_dict(data)
