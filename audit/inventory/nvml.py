"""The NVML boundary: which ``pynvml`` functions gpuguard calls, loading them, naming their errors.

Owns the only ``import pynvml`` of the project (the official ``nvidia-ml-py`` package; the
deprecated ``pynvml`` PyPI package must not be installed next to it, both provide the module) and
the :class:`NvmlBackend` protocol: the subset of ``pynvml`` that :mod:`audit.inventory.nvml_reader`
calls, with the same names and signatures, so the real module and a fake
(``tests/fakes/fake_nvml.py``) are interchangeable. Function list, return shapes and error codes:
``shared/reference/gpu-domain.md`` section 6 (nvidia-ml-py 13.615.71's ``pynvml.py``).

Must not read devices itself (that is :mod:`audit.inventory.nvml_reader`), touch the cluster or
print: callers get :class:`NvmlUnavailable` with a one-line reason and decide the exit code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = [
    "ERROR_NAMES",
    "GPU_IS_LOST",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "NOT_SUPPORTED",
    "NvmlBackend",
    "NvmlUnavailable",
    "error_code",
    "error_name",
    "load_backend",
    "unavailable_reason",
]

# NVML return codes (nvml.h ``nvmlReturn_t``; reference section 6 "Error codes worth handling").
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15

#: Stable names of NVML return codes, as written in the inventory's ``errors[].error``.
ERROR_NAMES: dict[int, str] = {
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    NOT_FOUND: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    GPU_IS_LOST: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    999: "UNKNOWN",
}

_HINTS = {
    LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 is not on this machine: no NVIDIA driver, or a container "
    "started without the NVIDIA runtime (runtimeClassName: nvidia)",
    DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    NO_PERMISSION: "no permission to open the /dev/nvidia* device nodes",
    18: "the NVML library and the kernel driver are different versions (reboot or reinstall)",
}


class NvmlBackend(Protocol):
    """The ``pynvml`` functions gpuguard calls; the real module satisfies it structurally.

    Handles are opaque. Memory is in bytes, utilization in percent, ``memorySizeMB`` in MiB.
    Every function raises ``NVMLError`` (whose ``value`` is the NVML return code) on failure.
    """

    NVMLError: type[Exception]

    def nvmlInit(self) -> None:
        """Load libnvidia-ml and initialise NVML."""

    def nvmlShutdown(self) -> None:
        """Release NVML (reference-counted with nvmlInit)."""

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        """Driver version, e.g. ``550.54.15``."""

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """Highest CUDA version the driver supports, as 1000 x major + 10 x minor (12040)."""

    def nvmlSystemGetNVMLVersion(self) -> str | bytes:
        """NVML library version, e.g. ``12.550.54.15``."""

    def nvmlDeviceGetCount(self) -> int:
        """Number of physical GPUs the driver enumerated (lost ones included)."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """Handle of the GPU at ``index`` (0-based NVML index)."""

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        """Product name (``NVIDIA H100 80GB HBM3``; MIG: ``NVIDIA A100-SXM4-80GB MIG 1g.10gb``)."""

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        """``GPU-…`` (MIG devices: ``MIG-…``)."""

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        """PCI info; ``.busId`` is ``00000000:07:00.0``."""

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        """``.total``, ``.free``, ``.used`` in bytes (v1: ``used`` includes driver-reserved)."""

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """``.gpu`` and ``.memory`` percent over the last sample period (NOT_SUPPORTED on MIG)."""

    def nvmlDeviceGetMigMode(self, handle: Any) -> Sequence[int]:
        """``[current, pending]``, 1 enabled / 0 disabled; NOT_SUPPORTED when not MIG-capable."""

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """Number of MIG device slots to probe with nvmlDeviceGetMigDeviceHandleByIndex."""

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        """Handle of the MIG device in slot ``index``; NOT_FOUND for an empty slot."""

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        """GPU instance id of a MIG device."""

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        """Compute instance id of a MIG device."""

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        """MIG device attributes: ``gpuInstanceSliceCount``, ``computeInstanceSliceCount``,
        ``multiprocessorCount``, ``memorySizeMB`` (MiB)."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]:
        """Compute processes: ``.pid`` (host PID), ``.usedGpuMemory`` (bytes, or None)."""


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; ``str()`` is one line saying why (exit code 3)."""


def error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by an ``NVMLError`` (its ``value``), or None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_name(code: int | None) -> str:
    """The stable name of an NVML return code (``NOT_SUPPORTED``), ``ERROR_<n>`` if unknown."""
    if code is None:
        return "UNKNOWN"
    return ERROR_NAMES.get(code, f"ERROR_{code}")


def unavailable_reason(exc: BaseException) -> str:
    """One line for an nvmlInit failure: the NVML error name, its text and what it usually means."""
    code = error_code(exc)
    text = str(exc).strip() or error_name(code)
    hint = _HINTS.get(code) if code is not None else None
    reason = f"NVML is not available ({error_name(code)}: {text})"
    return f"{reason}: {hint}" if hint else reason


def load_backend() -> NvmlBackend:
    """The real NVML binding: the ``pynvml`` module of ``nvidia-ml-py`` (not yet initialised).

    Importing it does not load libnvidia-ml; ``nvmlInit`` does, in
    :func:`audit.inventory.nvml_reader.read_inventory`.

    Raises:
        NvmlUnavailable: the ``nvidia-ml-py`` package is not installed.
    """
    try:
        import pynvml  # noqa: PLC0415 - imported on use: the module is optional at run time
    except ImportError as exc:
        raise NvmlUnavailable(
            f"NVML is not available: the nvidia-ml-py package cannot be imported ({exc})"
        ) from None
    return pynvml
