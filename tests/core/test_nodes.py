"""Node GPU facts on every Node in tests/data/nodes, against values worked out by hand."""

import re
from fractions import Fraction

import pytest

from policies.facts.nodes import node_facts, parse_hami_register
from policies.facts.resource_names import GPUSettings
from tests.builders.corpus import DATA, documents

NODES = {
    d["metadata"]["name"]: d
    for path in sorted((DATA / "nodes").glob("*.yaml"))
    for d in documents(f"nodes/{path.name}")
}

# name: (allocatable gpus, allocatable mig, physical GPUs, model, MIG strategy,
#        GPU-equivalents allocatable, a warning fragment or None)
EXPECTED = {
    # HAMi: 20 vGPU slots = 2 GPUs x split 10 (register annotation) -> 2 GPUs' worth.
    "gpu-node-hami-2080ti": ({"nvidia.com/gpu": 20}, {}, 2, None, None, Fraction(2), None),
    # HAMi 9-field CSV, no status block in the report: offers nothing yet, 2 GPUs registered.
    "gpu-node-hami-gtx1050": ({}, {}, 2, None, None, Fraction(0), None),
    # HAMi "mig" mode on 8 x H20-3e (not in the MIG catalog): 8 GPUs registered.
    "gpu-node-hami-h20": ({}, {}, 8, None, None, Fraction(0), None),
    # HAMi JSON records: one V100.
    "gpu-node-hami-json": ({}, {}, 1, None, None, Fraction(0), None),
    # Register value cut by kubectl ("..."): 1 whole record; the GPU count cannot be known.
    "gpu-node-hami-a100-pcie": (
        {"nvidia.com/gpu": 0},
        {},
        None,
        "A100-40GB",
        None,
        Fraction(0),
        "truncated",
    ),
    # MIG + time-slicing renamed: 128 replicas of unknown size -> equivalents unknown.
    "gpu-node-p5-01": (
        {"nvidia.com/gpu": 0},
        {},
        None,
        None,
        None,
        None,
        "replicas per GPU are unknown",
    ),
    # 16 x 3g.20gb (only on A100-40GB: 3 of 7 slices) = 48/7; label family says 3g.21gb.
    "gpu-node-a100-06": (
        {},
        {"3g.20gb": 16},
        None,
        None,
        "mixed",
        Fraction(48, 7),
        "disagree with the advertised MIG resources",
    ),
    # -MIG-INVALID: gpu.count 0 means nothing, the node offers nothing.
    "gpu-node-a100-mig-invalid-01": (
        {"nvidia.com/gpu": 0},
        {},
        None,
        "A100-80GB",
        None,
        Fraction(0),
        "invalid MIG single-strategy layout",
    ),
    # 2 whole + 6 x 1g.10gb (1/7) + 4 x 2g.20gb (2/7) + 0 x 3g.40gb = 2 + 6/7 + 8/7 = 4.
    "gpu-node-a100-mixed-01": (
        {"nvidia.com/gpu": 2},
        {"1g.10gb": 6, "2g.20gb": 4, "3g.40gb": 0},
        None,
        None,
        "mixed",
        Fraction(4),
        None,
    ),
    # Labels only (no status in the report): gpu.memory is one slice; nothing to count.
    "gpu-node-r7525-01": ({}, {}, None, None, None, Fraction(0), None),
    # 8 x H100 80GB, MIG disabled.
    "gpu-node-h100-01": ({"nvidia.com/gpu": 8}, {}, 8, "H100-80GB", None, Fraction(8), None),
    # Old product name without NVIDIA-: 4 x 1g.5gb + 2 x 2g.10gb = 4/7 + 4/7 = 8/7.
    "gpu-node-a100-pcie-01": (
        {"nvidia.com/gpu": 0},
        {"1g.5gb": 4, "2g.10gb": 2},
        None,
        "A100-40GB",
        "mixed",
        Fraction(8, 7),
        None,
    ),
    # all-balanced H100 94GB: 2 x 1g.12gb + 2g.24gb + 3g.47gb = 2/7 + 2/7 + 3/7 = 1 GPU.
    "gpu-node-h100-mig-01": (
        {"nvidia.com/gpu": 0},
        {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1},
        None,
        None,
        "mixed",
        Fraction(1),
        None,
    ),
    # Single strategy: 56 nvidia.com/gpu are 1g.5gb slices = 56/7 = 8 A100s.
    "gpu-node-dgx-a100-mig-single": (
        {"nvidia.com/gpu": 56},
        {},
        None,
        "A100-40GB",
        "single",
        Fraction(8),
        None,
    ),
    # 8 x A100 80GB, mixed strategy label but MIG disabled; mlnxnics is not a GPU.
    "nvs-kwok-node-001": ({"nvidia.com/gpu": 8}, {}, 8, "A100-80GB", "mixed", Fraction(8), None),
}


def test_every_corpus_node_has_an_expected_row():
    assert set(NODES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_node_facts(name):
    gpus, migs, physical, model, strategy, equivalents, warning = EXPECTED[name]
    facts = node_facts(NODES[name])
    assert dict(facts.allocatable.gpus) == gpus
    assert dict(facts.allocatable.mig) == migs
    assert facts.physical_gpus == physical
    assert facts.model == model
    assert facts.mig_strategy == strategy
    assert facts.gpu_equivalents == equivalents
    if warning is None:
        assert facts.warnings == ()
    else:
        assert any(warning in w for w in facts.warnings), facts.warnings


def test_mig_single_node_reports_the_profile():
    facts = node_facts(NODES["gpu-node-dgx-a100-mig-single"])
    assert facts.mig_single_profile == "1g.5gb"
    assert not facts.approximate


def test_shared_replicas_setting_resolves_bottlerocket_node():
    settings = GPUSettings(shared_replicas=(("nvidia.com/gpu.shared", 16),))
    facts = node_facts(NODES["gpu-node-p5-01"], settings)
    assert facts.allocatable.shared == {"nvidia.com/gpu.shared": 128}
    assert facts.gpu_equivalents == 8  # 8 GPUs x 4 MIG slices x 4 replicas


def test_hami_register_formats():
    devices, truncated, problems = parse_hami_register(
        NODES["gpu-node-hami-h20"]["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    )
    assert len(devices) == 8 and not truncated and problems == []
    assert {d.mode for d in devices} == {"mig"}
    assert devices[0].memory_mib == 258787 and devices[0].cores == 500
    [v100] = node_facts(NODES["gpu-node-hami-json"]).hami_devices
    assert (v100.split, v100.memory_mib, v100.type) == (10, 32768, "NVIDIA-Tesla V100-PCIE-32GB")
    cut = node_facts(NODES["gpu-node-hami-a100-pcie"])
    assert cut.hami_truncated and [d.memory_mib for d in cut.hami_devices] == [40960]


def test_malformed_node_never_raises():
    node = {
        "kind": "Node",
        "metadata": {
            "name": "x",
            "labels": {"nvidia.com/gpu.count": "many"},
            "annotations": {"hami.io/node-nvidia-register": "a,b"},
        },
        "status": {"allocatable": {"nvidia.com/gpu": "lots"}},
    }
    facts = node_facts(node)
    assert facts.physical_gpus is None
    assert any("status.allocatable[nvidia.com/gpu]" in w for w in facts.warnings)
    assert any("record 0 has 2 fields" in w for w in facts.warnings)


def _gfd_label_patterns():
    patterns = []
    for path in (DATA / "nodes").glob("ndp-tests__gfd-expected-labels-*.regex.txt"):
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                patterns.append(re.compile(line.split("=", 1)[0]))
    return patterns


@pytest.mark.parametrize(
    "key",
    [
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.count",
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy",
        "nvidia.com/mig.strategy",
        "nvidia.com/mig-1g.5gb.count",
        "nvidia.com/mig-1g.5gb.product",
    ],
)
def test_labels_read_are_real_gfd_labels(key):
    # Label names gpuguard reads must be ones GFD writes (the device plugin's test fixtures).
    assert any(p.fullmatch(key) for p in _gfd_label_patterns())
