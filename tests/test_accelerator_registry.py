"""The accelerator registry never drops (issue 16 item 3).

Every extended-resource name anywhere in the corpus (``tests/data/**``: limits, requests, node
capacity / allocatable, KubeVirt ``deviceName``) is walked. A name that looks like an accelerator
by a word list kept HERE (independent of the registry's own hint) must not be ``OTHER``; and a
container asking for one unit of any name the registry does not call ``OTHER`` must see it counted
(``effective_requests``), listed (``unrecognized`` plus a warning naming the field), rejected
(``resource_problems``), or be a qualifier that asks for no device — never nothing at all.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from policies.facts.gpu import pod_facts
from policies.facts.resource_names import ResourceKind, classify, split_family
from policies.sources import read_documents
from tests.corpus import DATA

# Vendors and words of accelerators (HAMi, the device plugins, the cloud providers' docs).
_LOOKS_LIKE_ACCELERATOR = re.compile(
    r"gpu|tpu|npu|xpu|gcu|dcu|mlu|accel|neuron|gaudi|ascend|cuda|mig-|grid_|fpga|"
    r"^(nvidia|amd|habana|huawei|cambricon|hygon|metax-tech|iluvatar|mthreads|enflame|kunlunxin)"
    r"\.", re.I)
# Names that match the words above but are not accelerators, and why.
NOT_ACCELERATORS = {
    "nvidia.com/mlnxnics": "NVIDIA network operator: a Mellanox NIC",
}


def _corpus_names() -> dict[str, str]:
    """Every resource name of the corpus -> one place it is written."""
    names: dict[str, str] = {}
    documents, _ = read_documents([str(DATA)])

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key in ("limits", "requests", "capacity", "allocatable"):
                if isinstance(value.get(key), dict):
                    for name in value[key]:
                        if isinstance(name, str):
                            names.setdefault(name, f"{where}.{key}")
            if isinstance(value.get("deviceName"), str):
                names.setdefault(value["deviceName"], f"{where}.deviceName")
            for key, child in value.items():
                walk(child, f"{where}.{key}")
        elif isinstance(value, list):
            for index, child in enumerate(value):
                walk(child, f"{where}[{index}]")

    for document in documents:
        walk(document.body, document.location)
    # Files that are not YAML (HAMi's MLU example has merge-conflict markers) still publish
    # names: every `domain/name: <number>` line of them.
    parsed = {d.location.split(":")[0] for d in documents}
    for path in DATA.rglob("*.y*ml"):
        if str(path) in parsed:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = _NAME_LINE.match(line)
            if found:
                names.setdefault(found.group(1), f"{path}:{number}")
    return names


_NAME_LINE = re.compile(r"\s*([a-z0-9.-]+\.[a-z]{2,}/[A-Za-z0-9._-]+)\s*:\s*[\"']?\d")


NAMES = _corpus_names()


def test_the_walk_sees_the_vendors_of_the_issue() -> None:
    """The walk reaches the names issue 16 found dropped (else it proves nothing)."""
    for name in ("huawei.com/Ascend910B3", "npu.intel.com/accel", "hygon.com/dcunum",
                 "metax-tech.com/gpu", "cambricon.com/vmlu", "amd.com/gpucores",
                 "deviceclass.resource.kubernetes.io/gpu.example.com"):
        assert name in NAMES
    assert len(NAMES) > 50


@pytest.mark.parametrize("name", sorted(NAMES))
def test_no_accelerator_looking_name_is_other(name: str) -> None:
    """Looks like an accelerator -> the registry knows it or calls it unrecognized."""
    if name in NOT_ACCELERATORS or not _LOOKS_LIKE_ACCELERATOR.search(name) or "/" not in name:
        return
    assert classify(name) is not ResourceKind.OTHER, f"{name} (at {NAMES[name]}) is dropped"


@pytest.mark.parametrize("name", sorted(n for n in NAMES if classify(n) is not ResourceKind.OTHER))
def test_every_gpu_like_name_is_counted_or_said(name: str) -> None:
    """One unit of the name in a container: counted, listed with its path, or rejected."""
    kind = classify(name)
    resources: dict[str, Any] = {name: "1"}
    family = split_family(name)
    if family is not None and family.count:
        resources[family.count] = "1"  # a split dimension goes with its device count
    facts = pod_facts({"containers": [{"name": "c", "resources": {"limits": resources}}]})
    if kind is ResourceKind.QUALIFIER:
        assert not facts.requested  # HAMi priority: no device, nothing to count
    elif kind is ResourceKind.UNRECOGNIZED:
        assert facts.unrecognized == (name,)
        assert any(f"spec.containers[0].resources.limits[{name}]" in w for w in facts.warnings)
    elif kind is ResourceKind.OBSOLETE:
        assert [p.resource for p in facts.resource_problems] == [name]
    else:
        assert facts.effective_requests.get(name) == 1
        assert facts.requested
