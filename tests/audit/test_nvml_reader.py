"""audit.inventory.nvml_reader against the fake NVML backend: the call sequence, errors kept per device,
MIG enumeration with empty slots, profile reconstruction, and the no-NVML paths."""

import json
import sys

import pynvml
import pytest

from audit.inventory.model import inventory_from_dict
from audit.inventory.nvml import NvmlUnavailable, error_name, load_backend, unavailable_reason
from audit.inventory.nvml_reader import profile_from_attributes, read_inventory
from tests.builders.inventory_scenario import NOW
from tests.fakes.fake_nvml import (
    A100_80GB_PROFILES,
    GIB,
    H100_80GB_TOTAL,
    MIB,
    FakeGpu,
    FakeNvml,
    a100_mig,
    example_machine,
    h100,
    lost_gpu,
    mig_device,
    t4,
)


def read(fake, node="gpu-node-01"):
    return read_inventory(fake, node=node, now=lambda: NOW)


def test_example_machine_reads_as_documented():
    fake = example_machine()
    data = read(fake).to_dict()
    assert [g["status"] for g in data["gpus"]] == ["ok", "ok", "lost", "ok"]
    assert {k: data[k] for k in ("driver_version", "cuda_driver_version", "cuda_version",
                                 "nvml_version", "gpu_count", "collected_at", "node")} == {
        "driver_version": "550.54.15", "cuda_driver_version": 12040, "cuda_version": "12.4",
        "nvml_version": "12.550.54.15", "gpu_count": 4, "collected_at": "2026-03-02T10:00:00Z",
        "node": "gpu-node-01"}
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"
    assert fake.initialized == 0


def test_a100_in_mig_mode():
    gpu = read(FakeNvml([a100_mig()])).to_dict()["gpus"][0]
    assert gpu["mig"]["capable"] is True
    assert (gpu["mig"]["current"], gpu["mig"]["pending"], gpu["mig"]["max_devices"]) == (
        "enabled", "enabled", 7)
    assert [(d["index"], d["profile"], d["gpu_instance_id"], d["memory_total_mib"])
            for d in gpu["mig"]["devices"]] == [
        (0, "3g.40gb", 2, 40192), (1, "2g.20gb", 3, 19968), (2, "1g.10gb", 9, 9728),
        (3, "1g.10gb", 10, 9728)]
    # Slots 4-6 answer NOT_FOUND: empty slots, not errors.
    assert gpu["mig"]["empty_slots"] == [4, 5, 6]
    assert all(d["errors"] == [] for d in gpu["mig"]["devices"])
    # Utilization is NOT_SUPPORTED with MIG enabled: recorded, null, not fatal.
    assert gpu["utilization_gpu_percent"] is None
    assert gpu["errors"] == [{"call": "nvmlDeviceGetUtilizationRates", "code": 3,
                              "error": "NOT_SUPPORTED", "message": "Not Supported"}]
    # Processes are read per MIG device; usedGpuMemory None stays null.
    assert gpu["processes"] is None
    assert gpu["mig"]["devices"][0]["processes"] == [
        {"pid": 41022, "used_memory_bytes": 20 * GIB, "used_memory_mib": 20480}]
    assert gpu["mig"]["devices"][2]["processes"] == [
        {"pid": 41177, "used_memory_bytes": None, "used_memory_mib": None}]


def test_h100_without_mig_lists_processes():
    gpu = read(FakeNvml([h100()])).to_dict()["gpus"][0]
    assert gpu["mig"] == {"capable": True, "current": "disabled", "pending": "disabled",
                          "max_devices": None, "devices": [], "empty_slots": []}
    assert gpu["processes"] == [
        {"pid": 3001, "used_memory_bytes": 40 * GIB, "used_memory_mib": 40960},
        {"pid": 3002, "used_memory_bytes": 512 * MIB, "used_memory_mib": 512}]
    assert (gpu["utilization_gpu_percent"], gpu["utilization_memory_percent"]) == (87, 41)
    assert (gpu["memory_total_bytes"], gpu["memory_total_mib"]) == (H100_80GB_TOTAL, 81559)
    assert gpu["model"] == "H100-80GB" and gpu["errors"] == []


def test_t4_mig_not_supported_is_recorded_not_fatal():
    gpu = read(FakeNvml([t4()])).to_dict()["gpus"][0]
    assert gpu["status"] == "ok"
    assert gpu["mig"]["capable"] is False and gpu["mig"]["current"] is None
    assert gpu["errors"] == [{"call": "nvmlDeviceGetMigMode", "code": 3,
                              "error": "NOT_SUPPORTED", "message": "Not Supported"}]
    assert gpu["processes"] == [] and gpu["model"] is None


def test_lost_gpu_stops_reading_that_gpu_only():
    fake = FakeNvml([lost_gpu(), t4()])
    gpus = read(fake).to_dict()["gpus"]
    assert gpus[0]["status"] == "lost"
    assert gpus[0]["errors"] == [{"call": "nvmlDeviceGetUUID", "code": 15,
                                  "error": "GPU_IS_LOST", "message": "GPU is lost"}]
    assert gpus[1]["status"] == "ok" and gpus[1]["name"] == "Tesla T4"
    # Nothing more was asked of the lost GPU after the first GPU_IS_LOST.
    start = fake.calls.index("nvmlDeviceGetHandleByIndex")
    t4_start = fake.calls.index("nvmlDeviceGetHandleByIndex", start + 1)
    assert fake.calls[start:t4_start] == ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"]


def test_gpu_lost_at_the_handle():
    gpu = read(FakeNvml([FakeGpu(uuid="GPU-x", name="x", bus_id="00000000:01:00.0",
                                 total_bytes=1, used_bytes=0, lost_at_handle=True)]))
    assert gpu.gpus[0].status == "lost" and gpu.gpus[0].uuid is None
    assert [e.call for e in gpu.gpus[0].errors] == ["nvmlDeviceGetHandleByIndex"]


def test_gpu_lost_while_reading_mig_devices_keeps_what_was_read():
    gpu = a100_mig()
    gpu.migs[2].errors["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_GPU_IS_LOST
    found = read(FakeNvml([gpu])).gpus[0]
    assert found.status == "lost"
    assert [d.profile for d in found.mig.devices] == ["3g.40gb", "2g.20gb"]
    assert found.errors[-1].error == "GPU_IS_LOST"
    assert found.errors[-1].call == "nvmlDeviceGetAttributes"


def test_errors_on_one_mig_device_stay_on_it():
    gpu = a100_mig()
    gpu.migs[1].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    device = read(FakeNvml([gpu])).gpus[0].mig.devices[1]
    assert device.processes is None
    assert [(e.call, e.error) for e in device.errors] == [
        ("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION")]


def test_unavailable_handle_and_system_errors():
    gpu = t4()
    fake = FakeNvml([gpu], system_errors={"nvmlSystemGetCudaDriverVersion":
                                          pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
    fake.gpus.insert(0, FakeGpu(uuid="GPU-y", name="y", bus_id="00000000:02:00.0",
                                total_bytes=1, used_bytes=0))
    original = fake.nvmlDeviceGetHandleByIndex

    def handle(index):
        if index == 0:
            fake.calls.append("nvmlDeviceGetHandleByIndex")
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return original(index)

    fake.nvmlDeviceGetHandleByIndex = handle
    inventory = read(fake)
    assert inventory.cuda_driver_version is None and inventory.cuda_version is None
    assert [(e.call, e.code, e.error) for e in inventory.errors] == [
        ("nvmlSystemGetCudaDriverVersion", 13, "FUNCTION_NOT_FOUND")]
    assert inventory.gpus[0].status == "unavailable"
    assert inventory.gpus[0].errors[0].error == "NO_PERMISSION"
    assert inventory.gpus[1].status == "ok"


def test_mig_mode_change_pending():
    gpu = h100()
    gpu.mig_mode = (0, 1)
    found = read(FakeNvml([gpu])).gpus[0]
    assert (found.mig.current, found.mig.pending) == ("disabled", "enabled")
    assert found.processes is not None  # MIG is not on yet: the whole GPU is read


def test_bytes_strings_from_old_bindings_are_decoded():
    fake = FakeNvml([t4()], driver=b"470.57.02")  # type: ignore[arg-type]
    fake.gpus[0].name = b"Tesla T4"  # type: ignore[assignment]
    inventory = read(fake)
    assert inventory.driver_version == "470.57.02" and inventory.gpus[0].name == "Tesla T4"


def test_used_memory_not_available_sentinel_is_null():
    gpu = h100(processes=[(1, (1 << 64) - 1)])
    assert read(FakeNvml([gpu])).gpus[0].processes[0].used_memory_bytes is None


@pytest.mark.parametrize(("g", "c", "mib", "total", "expected"), [
    # A100 80GB (81920 MiB): nvidia-smi mig -lgip sizes.
    (1, 1, 9728, 81920, "1g.10gb"), (1, 1, 19968, 81920, "1g.20gb"),
    (2, 2, 19968, 81920, "2g.20gb"), (3, 3, 40192, 81920, "3g.40gb"),
    (4, 4, 40192, 81920, "4g.40gb"), (7, 7, 80896, 81920, "7g.80gb"),
    # A100 40GB (40960 MiB; the PCIe card reports 40536): GFD label sizes.
    (1, 1, 4864, 40960, "1g.5gb"), (2, 2, 9984, 40960, "2g.10gb"), (3, 3, 20096, 40536, "3g.20gb"),
    # H100 80GB HBM3 (81559 MiB) and H100 NVL (95830 MiB, 1g.12gb = 11008 MiB from GFD).
    (1, 1, 9984, 81559, "1g.10gb"), (1, 1, 11008, 95830, "1g.12gb"),
    # A compute instance smaller than its GPU instance.
    (3, 1, 40192, 81920, "1c.3g.40gb"),
])
def test_profile_reconstruction(g, c, mib, total, expected):
    assert profile_from_attributes(g, c, mib, total * MIB) == expected


def test_profile_reconstruction_rejects_nonsense():
    assert profile_from_attributes(0, 0, 0, 0) is None
    assert profile_from_attributes(1, 2, 9728, 81920 * MIB) is None


def test_media_extension_suffix_comes_from_the_device_name():
    gpu = a100_mig()
    gpu.migs[3] = mig_device(A100_80GB_PROFILES, "1g.10gb", "MIG-me", 14)
    gpu.migs[3].profile = "1g.10gb+me"  # what the MIG device's name shows
    assert read(FakeNvml([gpu])).gpus[0].mig.devices[3].profile == "1g.10gb+me"


def test_profile_from_the_name_when_attributes_fail():
    gpu = a100_mig()
    gpu.migs[1].errors["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    device = read(FakeNvml([gpu])).gpus[0].mig.devices[1]
    assert device.profile == "2g.20gb" and device.memory_total_mib is None


def test_inventory_round_trips_through_json():
    inventory = read(example_machine())
    again = inventory_from_dict(json.loads(json.dumps(inventory.to_dict())))
    assert again == inventory


# -- no NVML ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "text"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
     "NVML is not available (LIBRARY_NOT_FOUND: NVML Shared Library Not Found): "
     "libnvidia-ml.so.1 is not on this machine: no NVIDIA driver, or a container started "
     "without the NVIDIA runtime (runtimeClassName: nvidia)"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
     "NVML is not available (DRIVER_NOT_LOADED: Driver Not Loaded): the NVIDIA kernel driver "
     "is not loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION,
     "NVML is not available (NO_PERMISSION: Insufficient Permissions): no permission to open "
     "the /dev/nvidia* device nodes"),
])
def test_init_failure_is_nvml_unavailable(code, text):
    fake = FakeNvml([t4()], init_error=code)
    with pytest.raises(NvmlUnavailable) as caught:
        read(fake)
    assert str(caught.value) == text
    assert "\n" not in str(caught.value)
    assert fake.calls == ["nvmlInit"]


def test_real_pynvml_library_not_found_error_reads_as_one_line():
    # The exception the real binding raises when libnvidia-ml.so.1 cannot be loaded.
    exc = pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert isinstance(exc, pynvml.NVMLError_LibraryNotFound)
    assert unavailable_reason(exc).startswith(
        "NVML is not available (LIBRARY_NOT_FOUND: NVML Shared Library Not Found)")


def test_load_backend_is_the_nvidia_ml_py_module():
    backend = load_backend()
    assert backend is pynvml
    assert "NVIDIA" in (pynvml.__doc__ or "") or hasattr(pynvml, "nvmlDeviceGetMigMode")


def test_missing_binding_package_is_nvml_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NvmlUnavailable, match="the nvidia-ml-py package cannot be imported"):
        load_backend()


def test_error_names():
    assert error_name(3) == "NOT_SUPPORTED" and error_name(15) == "GPU_IS_LOST"
    assert error_name(6) == "NOT_FOUND" and error_name(12345) == "ERROR_12345"
