"""The GPUInventory and GPUInventorySummary documents: docs/inventory.md shows exactly what the
code writes, both read back unchanged, the summary stays small, bad documents name the field."""

import copy
import json
import re

import pytest

from audit.inventory.model import InventoryFormatError, inventory_from_dict
from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import (
    MAX_BYTES,
    summarize,
    summary_from_dict,
    summary_from_json,
)
from tests.builders.inventory_scenario import NOW
from tests.fakes.fake_nvml import FakeNvml, a100_mig, example_machine, h100
from tests.paths import ROOT

DOC = ROOT / "docs" / "inventory.md"


def example():
    return read_inventory(example_machine(), node="gpu-node-01", now=lambda: NOW)


def doc_json_blocks():
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)]


def test_documented_inventory_is_the_fake_machines_output():
    blocks = doc_json_blocks()
    assert blocks[0] == example().to_dict()


def test_documented_summary_is_the_example_summary():
    assert doc_json_blocks()[1] == summarize(example()).to_dict()


def test_every_field_is_documented():
    text = DOC.read_text()
    data = example().to_dict()
    gpu = data["gpus"][0]
    names = set(data) | set(gpu) | set(gpu["mig"]) | set(gpu["mig"]["devices"][0])
    names |= set(summarize(example()).to_dict()["gpus"][0])
    missing = sorted(n for n in names if not any(
        form in text for form in (f"`{n}`", f".{n}`", f"`{n},", f", {n}`", f"{n}[]`")))
    assert not [m for m in missing if m not in ("apiVersion", "kind", "version")], missing


def test_summary_of_the_example():
    summary = summarize(example())
    text = summary.to_json()
    assert " " not in text.replace("NVIDIA A100", "").replace("NVIDIA H100 80GB HBM3", "") \
        .replace("Tesla T4", "")
    assert len(text) < 1500
    assert summary_from_json(text) == summary
    a100, h100_gpu, lost, t4 = summary.gpus
    assert a100.mig_profiles == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert a100.mig_busy == {"1g.10gb": 1, "3g.40gb": 1}
    assert (a100.process_count, a100.process_memory_mib) == (2, None)  # one usedGpuMemory hidden
    assert (h100_gpu.process_count, h100_gpu.process_memory_mib) == (2, 41472)
    assert (lost.status, lost.uuid, lost.process_count) == ("lost", None, None)
    assert (t4.mig, t4.utilization_percent, t4.process_count) == (None, 0, 0)


def test_summary_is_bounded_by_dropping_gpus():
    gpus = [h100(uuid=f"GPU-{i:08d}-0000-4000-8000-000000000000") for i in range(48)]
    gpus += [a100_mig(uuid=f"GPU-{i:08d}-1111-4000-8000-000000000000") for i in range(48)]
    inventory = read_inventory(FakeNvml(gpus), node="big", now=lambda: NOW)
    summary = summarize(inventory)
    assert summary.truncated and summary.gpu_count == 96
    assert 0 < len(summary.gpus) < 96
    assert len(summary.to_json()) <= MAX_BYTES
    small = summarize(inventory, max_bytes=2000)
    assert len(small.to_json()) <= 2000 and small.truncated


def test_mig_pending_in_the_summary():
    gpu = h100()
    gpu.mig_mode = (0, 1)
    summary = summarize(read_inventory(FakeNvml([gpu]), node="n", now=lambda: NOW))
    assert (summary.gpus[0].mig, summary.gpus[0].mig_pending) == ("disabled", "enabled")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(kind="Pod"), "kind: expected GPUInventory, got 'Pod'"),
    (lambda d: d.update(version=2), "version: 2 is not supported"),
    (lambda d: d["gpus"][1].update(index="1"), "gpus[1].index: expected an integer, got the string '1'"),
    (lambda d: d["gpus"][0]["mig"]["devices"][2].update(profile=7),
     "gpus[0].mig.devices[2].profile: expected a string, got the number 7"),
    (lambda d: d["gpus"][3].update(status="melted"), "gpus[3].status: expected ok, lost or"),
    (lambda d: d["gpus"][1]["processes"][0].update(pid=True), "gpus[1].processes[0].pid"),
    (lambda d: d.update(gpus={}), "gpus: expected a list, got a map"),
])
def test_bad_inventory_names_the_field(edit, message):
    data = copy.deepcopy(example().to_dict())
    edit(data)
    with pytest.raises(InventoryFormatError, match=re.escape(message)):
        inventory_from_dict(data)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(kind="GPUInventory"), "kind: expected GPUInventorySummary"),
    (lambda d: d.update(version="1"), "version: expected an integer, got the string '1'"),
    (lambda d: d["gpus"][0].update(mig_profiles={"1g.10gb": -1}), "gpus[0].mig_profiles"),
    (lambda d: d["gpus"][1].update(process_count=1.5), "gpus[1].process_count: expected an integer"),
    (lambda d: d.pop("collected_at"), "collected_at: expected a string, got null"),
])
def test_bad_summary_names_the_field(edit, message):
    data = copy.deepcopy(summarize(example()).to_dict())
    edit(data)
    with pytest.raises(InventoryFormatError, match=re.escape(message)):
        summary_from_dict(data)


def test_summary_annotation_not_json():
    with pytest.raises(InventoryFormatError, match="not JSON"):
        summary_from_json("{gpus: [")
