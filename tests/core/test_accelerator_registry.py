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
from tests.builders.corpus import DATA

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


def _one(limits: dict[str, Any]) -> Any:
    return pod_facts({"containers": [{"name": "c", "resources": {"limits": limits}}]})


@pytest.mark.parametrize(("limits", "equivalents", "memory_mib", "shared"), [
    # HAMi AMD split (examples/amd/use_cores.yaml): 25% of one MI-series GPU.
    ({"amd.com/gpu": 1, "amd.com/gpumem": 4096, "amd.com/gpucores": 25}, 0.25, 4096, True),
    # HAMi Hygon DCU (examples/hygon/default_use.yaml): 60% of one DCU, 2000 MiB.
    ({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 60}, 0.6, 2000,
     True),
    # HAMi Cambricon smlu, the model in the names; memory in the vendor's units (no MiB).
    ({"cambricon.com/vmlu": 1, "cambricon.com/mlu370.smlu.vmemory": 20,
      "cambricon.com/mlu370.smlu.vcore": 10}, 0.1, None, True),
    # HAMi Iluvatar: vcuda-memory in units of 256 MiB, vcuda-core a percentage.
    ({"iluvatar.ai/vgpu": 2, "iluvatar.ai/vcuda-memory": 4, "iluvatar.ai/vcuda-core": 50}, 1.0,
     2048, True),
    # HAMi Moore Threads: sgpu-memory in units of 512 MiB; core groups are not a share.
    ({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32}, None, 16384, True),
    # HAMi Enflame: vgcu-percentage is compute and memory alike.
    ({"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 50}, 0.5, None, True),
    # HAMi Kunlunxin vXPU: memory (MiB) alone, the share depends on the card.
    ({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 4096}, None, 4096, True),
    # HAMi Ascend vNPU: a memory-chosen template slice.
    ({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 2000}, None, 2000, True),
    # Intel GPU plugin shared mode: 1000 millicores make one GPU.
    ({"gpu.intel.com/i915": 1, "gpu.intel.com/millicores": 250}, 0.25, None, True),
    # HAMi NVIDIA gpucores 100 is exclusive.
    ({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100}, 2.0, None, False),
    # Whole devices of the vendors without a split.
    ({"npu.intel.com/accel": 1}, 1.0, None, False),
    ({"metax-tech.com/gpu": 1}, 1.0, None, False),
    ({"huawei.com/Ascend910": 8}, 8.0, None, False),
    ({"kunlunxin.com/xpu": 1}, 1.0, None, False),
    ({"enflame.com/gcu": 1}, 1.0, None, False),
    ({"mthreads.com/gpu": 1}, 1.0, None, False),
    ({"nvidia.com/GA102GL_A10": 1}, 1.0, None, False),  # KubeVirt passthrough
    ({"amd.com/MI300X": 1}, 1.0, None, False),  # KubeVirt passthrough of an AMD Instinct GPU
    # HAMi's older name of gpucores (docs/config.md resourceCores default): 40% of each of 2.
    ({"nvidia.com/gpu": 2, "nvidia.com/cores": 40}, 0.8, None, True),
    # KubeVirt vGPU types: the framebuffer share of one GPU (NVIDIA vGPU user guide, "Virtual
    # GPU Types": T4-1Q is 1 GB of a 16 GB T4), unknown for a board not in the table.
    ({"nvidia.com/GRID_T4-1Q": 1}, 0.0625, None, True),
    ({"nvidia.com/NVIDIA_A10-4C": 3}, 0.5, None, True),
    ({"nvidia.com/GRID_V100DX-8Q": 1}, None, None, True),
    # GKE's legacy Cloud TPU names count TensorCores: a v2-8 is 4 chips of 2 cores.
    ({"cloud-tpus.google.com/v2": 8}, 4.0, None, False),
    ({"cloud-tpus.google.com/preemptible-v3": 8}, 4.0, None, False),
])
def test_vendor_semantics(limits: dict[str, Any], equivalents: float | None,
                          memory_mib: int | None, shared: bool) -> None:
    """Whole / shared semantics per vendor as the vendors and HAMi document them."""
    facts = _one(limits)
    got = facts.gpu_equivalents
    assert (None if got is None else float(got)) == pytest.approx(equivalents)
    assert facts.gpu_memory_mib == memory_mib
    assert facts.shared is shared
    assert facts.requested and not facts.unrecognized
    if equivalents is None:
        assert facts.unknown  # never a silent zero


def test_nvidia_network_resources_stay_out() -> None:
    """NVIDIA's network operator publishes NICs under nvidia.com: not accelerators."""
    assert classify("nvidia.com/mlnxnics") is ResourceKind.OTHER
    assert classify("nvidia.com/rdma_shared_device_a") is ResourceKind.OTHER
    assert classify("nvidia.com/priority") is ResourceKind.QUALIFIER


@pytest.mark.parametrize("name", ["qualcomm.com/qaic", "tenstorrent.com/n300", "furiosa.ai/rngd",
                                  "rebellions.ai/ATOM", "graphcore.ai/ipu"])
def test_accelerators_named_without_a_hint_word_are_listed_not_zero(name: str) -> None:
    """Real device-plugin names with no gpu/npu/tpu word (a trial found them valued 0 and not
    listed): unrecognized, with the field path, never silently zero."""
    assert classify(name) is ResourceKind.UNRECOGNIZED
    facts = _one({name: 1})
    assert facts.unrecognized == (name,)
    assert any(f"spec.containers[0].resources.limits[{name}]" in w for w in facts.warnings)
