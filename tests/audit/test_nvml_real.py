"""The real NVML, when this machine has an NVIDIA GPU and driver; skipped with NVML's reason
otherwise (e.g. "NVML Shared Library Not Found"). Checks what the fake cannot: that the reader
works against nvidia-ml-py and real hardware, and that the output keeps the documented schema."""

import json

import pynvml
import pytest

from audit.inventory.model import inventory_from_dict
from audit.inventory.nvml import load_backend
from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import MAX_BYTES, summarize, summary_from_json


@pytest.fixture(scope="module")
def real_nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVML on this machine: nvmlInit failed: {exc}")
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML works but reports no GPU")
    return load_backend()


def test_real_inventory_keeps_the_schema(real_nvml):
    inventory = read_inventory(real_nvml, node="real-gpu-machine")
    data = json.loads(json.dumps(inventory.to_dict()))
    assert inventory_from_dict(data) == inventory
    assert data["gpu_count"] == len(data["gpus"]) > 0
    assert data["driver_version"] and data["cuda_version"]
    for gpu in data["gpus"]:
        if gpu["status"] != "ok":
            continue
        assert gpu["uuid"].startswith("GPU-") and gpu["name"]
        assert gpu["memory_total_mib"] == gpu["memory_total_bytes"] // 2**20 > 0
        if gpu["mig"]["current"] == "enabled":
            for device in gpu["mig"]["devices"]:
                assert device["uuid"].startswith("MIG-")
                assert device["profile"], device  # rebuilt from the attributes
        else:
            assert gpu["processes"] is not None or gpu["errors"]
    summary = summarize(inventory)
    assert len(summary.to_json()) <= MAX_BYTES
    assert summary_from_json(summary.to_json()) == summary
