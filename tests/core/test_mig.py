"""MIG catalog: profile grammar, resource names, product labels, per-model tables, layouts.

Expected values are written by hand from the GPU reference (gpu-domain.md sections 1-3) and the
Node / manifest files under tests/data, not computed from the catalog under test.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import yaml

from policies.facts import mig
from tests.paths import TESTS

DATA = TESTS / "data"

# ------------------------------------------------------------------------------------------------
# Reference tables (section 1.3): model -> {profile: (C, M, max)}

_SEVEN = ((1, 1, 7), (1, 1, 1), (1, 2, 4), (2, 2, 3), (3, 4, 2), (4, 4, 1), (7, 8, 1))


def _seven(names: str) -> dict[str, tuple[int, int, int]]:
    """Profiles of a 7-slice part, listed as 1g, 1g+me, 1g x 2 memory slices, 2g, 3g, 4g, 7g."""
    return dict(zip(names.split(), _SEVEN, strict=True))


REFERENCE = {
    "A30-24GB": {
        "1g.6gb": (1, 1, 4), "1g.6gb+me": (1, 1, 1), "2g.12gb": (2, 2, 2),
        "2g.12gb+me": (2, 2, 1), "4g.24gb": (4, 4, 1),
    },
    "A100-40GB": _seven("1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"),
    "A100-80GB": _seven("1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "H100-80GB": _seven("1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "H100-94GB": _seven("1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb"),
    "H100-96GB": _seven("1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.48gb 4g.48gb 7g.96gb"),
    "H200-141GB": _seven("1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"),
    "GH200-144GB": _seven("1g.18gb 1g.18gb+me 1g.36gb 2g.36gb 3g.72gb 4g.72gb 7g.144gb"),
    "B200-180GB": _seven("1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb"),
    "GB200-186GB": _seven("1g.23gb 1g.23gb+me 1g.47gb 2g.47gb 3g.93gb 4g.93gb 7g.186gb"),
    "B300": _seven("1g.34gb 1g.34gb+me 1g.67gb 2g.67gb 3g.135gb 4g.135gb 7g.269gb"),
    "GB300": _seven("1g.35gb 1g.35gb+me 1g.70gb 2g.70gb 3g.139gb 4g.139gb 7g.278gb"),
    "RTX-PRO-6000": {
        "1g.24gb": (1, 1, 4), "1g.24gb+me": (1, 1, 1), "1g.24gb+gfx": (1, 1, 4),
        "1g.24gb+me.all": (1, 1, 1), "1g.24gb-me": (1, 1, 4), "2g.48gb": (2, 2, 2),
        "2g.48gb+gfx": (2, 2, 2), "2g.48gb+me.all": (2, 2, 1), "2g.48gb-me": (2, 2, 2),
        "4g.96gb": (4, 4, 1), "4g.96gb+gfx": (4, 4, 1),
    },
}

# Section 1.4: (compute slices, memory slices) -> (allowed starts, size)
PLACEMENTS_7 = {
    (1, 1): ((0, 1, 2, 3, 4, 5, 6), 1), (1, 2): ((0, 2, 4, 6), 2), (2, 2): ((0, 2, 4), 2),
    (3, 4): ((0, 4), 4), (4, 4): ((0,), 4), (7, 8): ((0,), 8),
}
PLACEMENTS_4 = {(1, 1): ((0, 1, 2, 3), 1), (2, 2): ((0, 2), 2), (4, 4): ((0,), 4)}
FOUR_SLICE = {"A30-24GB", "RTX-PRO-6000"}
UNVERIFIED = {"H100-94GB", "H100-96GB", "GH200-144GB", "GB200-186GB", "B300", "GB300"}


def test_models_are_exactly_the_reference_models_in_order():
    assert mig.models() == tuple(REFERENCE)


@pytest.mark.parametrize("model", REFERENCE)
def test_every_reference_profile_round_trips_through_parse_and_lookup(model):
    assert {p.name for p in mig.profiles_for(model)} == set(REFERENCE[model])
    four = model in FOUR_SLICE
    assert mig.slices_per_gpu(model) == (4 if four else 7)
    for name, (c, m, most) in REFERENCE[model].items():
        parsed = mig.parse_profile(name)
        assert parsed is not None and parsed.canonical == name
        assert parsed.gi_slices == parsed.ci_slices == c
        found = mig.lookup(model, name)
        assert found is not None
        assert (found.model, found.name) == (model, name)
        assert (found.compute_slices, found.memory_slices, found.max_instances) == (c, m, most)
        totals = (found.total_compute_slices, found.total_memory_slices)
        assert totals == ((4, 4) if four else (7, 8))
        assert found.memory_gb == parsed.memory_gb
        placements = PLACEMENTS_4 if four else PLACEMENTS_7
        assert (found.placements, found.placement_size) == placements[(c, m)]
        assert found.verified is (model not in UNVERIFIED)
        assert "mig-parted" in found.source


def test_placements_unverified_where_the_reference_only_assumes_them():
    assumed = {m for m in mig.models() if not mig.lookup(m, mig.profiles_for(m)[0].name)
               .placements_verified}
    assert assumed == {
        "H100-96GB", "H200-141GB", "GH200-144GB", "B200-180GB", "GB200-186GB", "B300", "GB300",
        "RTX-PRO-6000",
    }


def test_model_memory():
    memory = {m: mig.gpu_model(m).memory_gb for m in mig.models()}
    assert memory == {
        "A30-24GB": 24, "A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80, "H100-94GB": 94,
        "H100-96GB": 96, "H200-141GB": 141, "GH200-144GB": 144, "B200-180GB": 180,
        "GB200-186GB": 186, "B300": 269, "GB300": 278, "RTX-PRO-6000": 96,
    }


def test_same_name_means_different_geometry_per_model():
    h200, gb300 = mig.lookup("H200-141GB", "1g.35gb"), mig.lookup("GB300", "1g.35gb")
    assert (h200.memory_slices, h200.max_instances) == (2, 4)
    assert (gb300.memory_slices, gb300.max_instances) == (1, 7)
    a40, a80 = mig.lookup("A100-40GB", "1g.10gb"), mig.lookup("A100-80GB", "1g.10gb")
    assert (a40.memory_slices, a80.memory_slices) == (2, 1)
    assert mig.lookup("A100-40GB", "3g.40gb") is None
    assert mig.models_with_profile("1g.10gb") == ("A100-40GB", "A100-80GB", "H100-80GB")
    assert mig.models_with_profile("1g.24gb") == ("H100-94GB", "H100-96GB", "RTX-PRO-6000")
    assert mig.models_with_profile("3g.20gb") == ("A100-40GB",)
    assert mig.models_with_profile("9g.99gb") == ()
    assert mig.models_with_profile("junk") == ()


# ------------------------------------------------------------------------------------------------
# Profile names


@pytest.mark.parametrize(
    ("name", "g", "c", "gb", "attributes", "canonical"),
    [
        ("1g.5gb", 1, 1, 5, (), "1g.5gb"),
        ("7g.141gb", 7, 7, 141, (), "7g.141gb"),
        ("1c.3g.20gb", 3, 1, 20, (), "1c.3g.20gb"),
        ("3c.3g.20gb", 3, 3, 20, (), "3g.20gb"),
        ("1g.10gb+me", 1, 1, 10, ("+me",), "1g.10gb+me"),
        ("1g.24gb+me.all", 1, 1, 24, ("+me.all",), "1g.24gb+me.all"),
        ("2g.48gb+gfx", 2, 2, 48, ("+gfx",), "2g.48gb+gfx"),
        ("1g.24gb-me", 1, 1, 24, ("-me",), "1g.24gb-me"),
        ("1g.24gb+me,gfx", 1, 1, 24, ("+gfx", "+me"), "1g.24gb+gfx,me"),
        (" 1G.5GB ", 1, 1, 5, (), "1g.5gb"),
    ],
)
def test_parse_profile(name, g, c, gb, attributes, canonical):
    parsed = mig.parse_profile(name)
    assert parsed == mig.ProfileName(g, c, gb, attributes, canonical)
    assert mig.parse_profile(parsed.canonical) == parsed


@pytest.mark.parametrize(
    "name",
    [
        "", "1g", "1g.5", "g.5gb", "0g.5gb", "1g.0gb", "01g.5gb", "2c.1g.5gb", "1g.5gb+",
        "1g.5gb+me-me", "1g.5gb-gfx", "1g.5gb+foo", "1g.5gb+me,me", "1g.5gb.me", "3g.20gb.shared",
        "nvidia.com/mig-1g.5gb", "1g.5gib", "1.5g.5gb", None, 7,
    ],
)
def test_parse_profile_rejects(name):
    assert mig.parse_profile(name) is None


def test_profile_name_flags():
    assert mig.parse_profile("1c.3g.20gb").is_compute_instance
    assert not mig.parse_profile("3g.20gb").is_compute_instance
    assert mig.parse_profile("1g.5gb+me").has_media_extension
    assert mig.parse_profile("1g.24gb+me.all").has_media_extension
    assert not mig.parse_profile("1g.24gb-me").has_media_extension
    assert not mig.parse_profile("1g.24gb+gfx").has_media_extension


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        ("nvidia.com/mig-1g.10gb", ("1g.10gb", False)),
        ("nvidia.com/mig-1g.10gb.me", ("1g.10gb+me", False)),
        ("nvidia.com/mig-1g.24gb.me.all", ("1g.24gb+me.all", False)),
        ("nvidia.com/mig-1g.24gb.gfx", ("1g.24gb+gfx", False)),
        ("nvidia.com/mig-1g.24gb-me", ("1g.24gb-me", False)),
        ("nvidia.com/mig-3g.20gb.shared", ("3g.20gb", True)),
        ("nvidia.com/mig-1g.10gb.me.shared", ("1g.10gb+me", True)),
        ("nvidia.com/mig-7g.141gb", ("7g.141gb", False)),
        ("nvidia.com/mig-", None),
        ("nvidia.com/mig-3g", None),
        ("nvidia.com/mig-1c.3g.20gb", None),
        ("nvidia.com/mig-1g.10gb+me", None),
        ("nvidia.com/mig-1g.5gb.count", None),
        ("nvidia.com/mig-1g.5gb.engines.copy", None),
        ("nvidia.com/mig-1g.5gb.shared.shared", None),
        ("nvidia.com/mig-1G.5GB", None),
        ("nvidia.com/gpu", None),
        ("nvidia.com/gpu.shared", None),
        ("example.com/mig-1g.5gb", None),
        ("", None),
        (None, None),
    ],
)
def test_profile_from_resource(resource, expected):
    assert mig.profile_from_resource(resource) == expected


def _yaml_documents(folder: str):
    for path in sorted((DATA / folder).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path.name, doc


def _resource_keys(value, parent=None):
    """Keys of every limits / requests / capacity / allocatable mapping inside ``value``."""
    if isinstance(value, dict):
        for key, child in value.items():
            if parent in {"limits", "requests", "capacity", "allocatable"}:
                yield key
            yield from _resource_keys(child, key)
    elif isinstance(value, list):
        for child in value:
            yield from _resource_keys(child, parent)


# Every nvidia.com/mig-* resource name in tests/data/manifests and tests/data/nodes.
CORPUS_MIG_RESOURCES = {
    "nvidia.com/mig-1g.5gb": ("1g.5gb", False),
    "nvidia.com/mig-2g.10gb": ("2g.10gb", False),
    "nvidia.com/mig-3g.20gb": ("3g.20gb", False),
    "nvidia.com/mig-1g.10gb": ("1g.10gb", False),
    "nvidia.com/mig-2g.20gb": ("2g.20gb", False),
    "nvidia.com/mig-3g.40gb": ("3g.40gb", False),
    "nvidia.com/mig-1g.12gb": ("1g.12gb", False),
    "nvidia.com/mig-2g.24gb": ("2g.24gb", False),
    "nvidia.com/mig-3g.47gb": ("3g.47gb", False),
}


def test_profile_from_resource_for_every_mig_resource_in_the_corpus():
    found = {
        key
        for folder in ("manifests", "nodes")
        for _, doc in _yaml_documents(folder)
        for key in _resource_keys(doc)
        if str(key).startswith("nvidia.com/mig-")
    }
    assert found == set(CORPUS_MIG_RESOURCES)
    for resource, expected in CORPUS_MIG_RESOURCES.items():
        assert mig.profile_from_resource(resource) == expected


def test_gfd_mig_label_keys_are_not_resources():
    keys = [
        key
        for _, doc in _yaml_documents("nodes")
        for key in (doc.get("metadata", {}).get("labels") or {})
        if key.startswith("nvidia.com/mig-")
    ]
    assert "nvidia.com/mig-3g.21gb.count" in keys
    assert len(keys) > 20
    assert all(mig.profile_from_resource(key) is None for key in keys)


# ------------------------------------------------------------------------------------------------
# Product labels, NVML names, GKE labels

# node name -> (model, mig_profile, mig_invalid, shared) for every node with nvidia.com/gpu.product
NODE_PRODUCTS = {
    "gpu-node-a100-mig-invalid-01": ("A100-80GB", None, True, False),
    "gpu-node-h100-01": ("H100-80GB", None, False, False),
    "gpu-node-a100-pcie-01": ("A100-40GB", None, False, False),
    "gpu-node-dgx-a100-mig-single": ("A100-40GB", "1g.5gb", False, False),
    "nvs-kwok-node-001": ("A100-80GB", None, False, False),
}


def test_product_label_of_every_node_in_the_corpus():
    seen = {}
    for _, doc in _yaml_documents("nodes"):
        labels = doc.get("metadata", {}).get("labels") or {}
        if "nvidia.com/gpu.product" in labels:
            label = mig.parse_product(labels["nvidia.com/gpu.product"])
            seen[doc["metadata"]["name"]] = (
                label.model, label.mig_profile, label.mig_invalid, label.shared,
            )
    assert seen == NODE_PRODUCTS


# HAMi's hami.io/node-nvidia-register device type field: "NVIDIA-" + the NVML name.
HAMI_TYPES = {
    "gpu-node-hami-2080ti": ("NVIDIA-NVIDIA GeForce RTX 2080 Ti", None),
    "gpu-node-hami-gtx1050": ("NVIDIA-NVIDIA GeForce GTX 1050", None),
    "gpu-node-hami-h20": ("NVIDIA-NVIDIA H20-3e", None),
    "gpu-node-hami-json": ("NVIDIA-Tesla V100-PCIE-32GB", None),
    "gpu-node-hami-a100-pcie": ("NVIDIA-NVIDIA A100-PCIE-40GB", "A100-40GB"),
}


def test_hami_device_types_in_the_corpus():
    annotations = {
        doc["metadata"]["name"]: doc["metadata"]["annotations"]["hami.io/node-nvidia-register"]
        for _, doc in _yaml_documents("nodes")
        if "hami.io/node-nvidia-register" in (doc["metadata"].get("annotations") or {})
    }
    assert set(annotations) == set(HAMI_TYPES)
    for node, (device_type, model) in HAMI_TYPES.items():
        assert device_type in annotations[node]
        assert mig.model_from_name(device_type) == model


@pytest.mark.parametrize(
    ("label", "model", "base", "mig_profile", "mig_invalid", "shared"),
    [
        # gpu-domain.md section 3.1 examples
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB", "NVIDIA-A100-SXM4-40GB", None, False, False),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB", "NVIDIA-A100-SXM4-80GB", None, False, False),
        ("NVIDIA-A100-PCIE-40GB", "A100-40GB", "NVIDIA-A100-PCIE-40GB", None, False, False),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB", "NVIDIA-A100-80GB-PCIe", None, False, False),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB", "NVIDIA-H100-80GB-HBM3", None, False, False),
        ("NVIDIA-H100-PCIe", "H100-80GB", "NVIDIA-H100-PCIe", None, False, False),
        ("NVIDIA-H100-NVL", "H100-94GB", "NVIDIA-H100-NVL", None, False, False),
        ("NVIDIA-H200", "H200-141GB", "NVIDIA-H200", None, False, False),
        ("NVIDIA-GH200-480GB", "H100-96GB", "NVIDIA-GH200-480GB", None, False, False),
        ("Tesla-T4", None, "Tesla-T4", None, False, False),
        ("NVIDIA-L4", None, "NVIDIA-L4", None, False, False),
        # section 3.2 and the corpus comments (gpu-operator#479)
        ("NVIDIA-H100-NVL-MIG-1g.12gb", "H100-94GB", "NVIDIA-H100-NVL", "1g.12gb", False, False),
        ("NVIDIA-A100-SXM4-80GB-MIG-INVALID", "A100-80GB", "NVIDIA-A100-SXM4-80GB", None, True,
         False),
        # old drivers: no NVIDIA- prefix
        ("A100-SXM4-40GB", "A100-40GB", "A100-SXM4-40GB", None, False, False),
        ("A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB", "A100-SXM4-40GB", "1g.5gb", False, False),
        ("A100-PCIE-40GB", "A100-40GB", "A100-PCIE-40GB", None, False, False),
        # derived from NVML names (UNVERIFIED in the reference)
        ("NVIDIA-A30", "A30-24GB", "NVIDIA-A30", None, False, False),
        ("NVIDIA-H200-NVL", "H200-141GB", "NVIDIA-H200-NVL", None, False, False),
        ("NVIDIA-GH200-144G-HBM3e", "GH200-144GB", "NVIDIA-GH200-144G-HBM3e", None, False, False),
        ("NVIDIA-B200", "B200-180GB", "NVIDIA-B200", None, False, False),
        ("NVIDIA-GB200", "GB200-186GB", "NVIDIA-GB200", None, False, False),
        ("NVIDIA-B300-SXM6-AC", "B300", "NVIDIA-B300-SXM6-AC", None, False, False),
        ("NVIDIA-GB300", "GB300", "NVIDIA-GB300", None, False, False),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "RTX-PRO-6000",
         "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", None, False, False),
        # sharing and combinations
        ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-80GB", "NVIDIA-A100-SXM4-80GB", None, False, True),
        ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED", "A100-80GB", "NVIDIA-A100-SXM4-80GB",
         "3g.40gb", False, True),
        # GFD drops '+' when sanitising
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gbme", "H100-80GB", "NVIDIA-H100-80GB-HBM3",
         "1g.10gb+me", False, False),
        ("NVIDIA-A100-80GB-PCIe-MIG-INVALID", "A100-80GB", "NVIDIA-A100-80GB-PCIe", None, True,
         False),
        ("nvidia-a100-sxm4-40gb-mig-invalid", "A100-40GB", "nvidia-a100-sxm4-40gb", None, True,
         False),
        ("NVIDIA-A100-SXM4-40GB-MIG-garbage", "A100-40GB", "NVIDIA-A100-SXM4-40GB", "garbage",
         False, False),
        ("NVIDIA-A10", None, "NVIDIA-A10", None, False, False),
        ("NVIDIA-H100", None, "NVIDIA-H100", None, False, False),
        ("", None, "", None, False, False),
    ],
)
def test_parse_product(label, model, base, mig_profile, mig_invalid, shared):
    assert mig.parse_product(label) == mig.ProductLabel(
        label, base, model, mig_profile, mig_invalid, shared
    )


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("NVIDIA GH200 480GB", "H100-96GB"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA H20", "H100-96GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA B200 MIG 1g.45gb", "B200-180GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000"),
        ("nvidia   a100_sxm4_80gb", "A100-80GB"),
        ("NVIDIA H20-3e", None),
        ("NVIDIA L40S", None),
        ("NVIDIA A10", None),
        ("Tesla T4", None),
        ("Tesla V100-SXM2-16GB", None),
        ("NVIDIA GeForce RTX 2080 Ti", None),
        ("NVIDIA RTX PRO 5000 Blackwell", None),
        ("", None),
        (None, None),
    ],
)
def test_model_from_name(name, model):
    assert mig.model_from_name(name) == model


@pytest.mark.parametrize(
    ("value", "model"),
    [
        ("nvidia-tesla-a100", "A100-40GB"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("nvidia-h100-80gb", "H100-80GB"),
        ("nvidia-h100-mega-80gb", "H100-80GB"),
        ("nvidia-h200-141gb", "H200-141GB"),
        ("nvidia-b200", "B200-180GB"),
        ("nvidia-tesla-t4", None),
        ("nvidia-l4", None),
        ("", None),
        (None, None),
    ],
)
def test_model_from_gke_accelerator(value, model):
    assert mig.model_from_gke_accelerator(value) == model


def test_gke_manifest_node_selector_value():
    values = {
        doc["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator"]
        for name, doc in _yaml_documents("manifests")
        if name.startswith("gke__") and doc.get("kind") == "Deployment"
    }
    assert values == {"nvidia-tesla-a100"}
    assert mig.model_from_gke_accelerator("nvidia-tesla-a100") == "A100-40GB"


# ------------------------------------------------------------------------------------------------
# GPU-equivalents


@pytest.mark.parametrize(
    ("profile", "model", "value", "approximate"),
    [
        ("1g.5gb", "A100-40GB", Fraction(1, 7), False),
        ("3g.20gb", "A100-40GB", Fraction(3, 7), False),
        ("7g.80gb", "H100-80GB", Fraction(1), False),
        ("1g.10gb+me", "A100-80GB", Fraction(1, 7), False),
        ("2g.12gb", "A30-24GB", Fraction(1, 2), False),
        ("1g.24gb", "RTX-PRO-6000", Fraction(1, 4), False),
        ("1g.24gb", "H100-94GB", Fraction(1, 7), False),
        ("3g.40gb", None, Fraction(3, 7), False),  # A100-80GB and H100-80GB: both 7 slices
        ("3g.20gb", None, Fraction(3, 7), False),  # only A100-40GB
        ("1g.6gb", None, Fraction(1, 4), False),  # only A30
        ("1g.24gb", None, Fraction(1, 7), True),  # H100-94/96GB (7) vs RTX PRO 6000 (4)
        ("2g.48gb-me", None, Fraction(1, 2), False),  # only RTX PRO 6000
        ("9g.99gb", None, Fraction(9, 7), True),  # in no model
        ("1g.5gb", "T4", Fraction(1, 7), False),  # model not in the catalog: as if unknown
        ("3g.40gb", "A100-40GB", Fraction(3, 7), True),  # not offered by that model
        ("2g.24gb", "A30-24GB", Fraction(2, 4), True),
        ("1c.3g.20gb", "A100-40GB", Fraction(3, 7), True),  # CI profile: not in the catalog
        ("not-a-profile", "A100-40GB", Fraction(1), True),
    ],
)
def test_equivalents(profile, model, value, approximate):
    assert mig.equivalents(profile, model) == (value, approximate)


# ------------------------------------------------------------------------------------------------
# Layouts (section 1.4)

A100_40 = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_SHORT = dict(zip(("1g", "1g2m", "2g", "3g", "4g", "7g"), A100_40, strict=True))

# Section 1.4 rule 5, written as {class: count} ("1g2m" = the 2-memory-slice 1g profile).
REFERENCE_MAXIMAL = [
    # 7 compute slices used
    {"1g": 7}, {"1g": 6, "1g2m": 1}, {"2g": 1, "1g": 5}, {"2g": 1, "1g": 4, "1g2m": 1},
    {"3g": 1, "1g": 4}, {"2g": 2, "1g": 3}, {"4g": 1, "1g": 3}, {"2g": 2, "1g": 2, "1g2m": 1},
    {"4g": 1, "1g": 2, "1g2m": 1}, {"3g": 1, "2g": 1, "1g": 2}, {"2g": 3, "1g": 1},
    {"4g": 1, "2g": 1, "1g": 1}, {"2g": 3, "1g2m": 1}, {"4g": 1, "2g": 1, "1g2m": 1},
    {"3g": 1, "2g": 2}, {"4g": 1, "3g": 1}, {"7g": 1},
    # 6
    {"1g": 4, "1g2m": 2}, {"2g": 1, "1g": 2, "1g2m": 2}, {"3g": 1, "1g": 2, "1g2m": 1},
    {"2g": 2, "1g2m": 2}, {"4g": 1, "1g2m": 2}, {"3g": 1, "2g": 1, "1g2m": 1}, {"3g": 2},
    # 5
    {"1g": 2, "1g2m": 3}, {"2g": 1, "1g2m": 3}, {"3g": 1, "1g2m": 2},
    # 4
    {"1g2m": 4},
]


def _valid_multisets(model, names, limit=8):
    """Every non-empty multiset of ``names`` (count 0..limit each) that fits on one GPU."""
    return {
        counts
        for counts in itertools.product(range(limit + 1), repeat=len(names))
        if any(counts) and sum(counts) <= limit
        and mig.valid_layout(model, dict(zip(names, counts, strict=True)))
    }


def _maximal(valid):
    return {
        counts for counts in valid
        if not any(
            tuple(n + (i == j) for j, n in enumerate(counts)) in valid for i in range(len(counts))
        )
    }


def _as_counts(short, names):
    return tuple(short.get(name, 0) for name in names)


def test_seven_slice_part_has_77_valid_multisets_and_the_28_maximal_sets_of_the_reference():
    valid = _valid_multisets("A100-40GB", A100_40)
    assert len(valid) == 77
    expected = {
        _as_counts({_SHORT[k]: n for k, n in s.items()}, A100_40) for s in REFERENCE_MAXIMAL
    }
    assert len(expected) == 28
    assert _maximal(valid) == expected
    # "any sub-multiset of a maximal set is also valid", and nothing else is
    subsets = {
        sub for top in expected
        for sub in itertools.product(*(range(n + 1) for n in top)) if any(sub)
    }
    assert subsets == valid


@pytest.mark.parametrize("model", ["A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB", "GB300"])
def test_every_seven_slice_model_has_the_same_77_layouts(model):
    names = tuple(
        p.name for p in mig.profiles_for(model) if not mig.parse_profile(p.name).attributes
    )
    assert len(names) == 6
    assert len(_valid_multisets(model, names)) == 77


def test_a30_maximal_sets():
    names = ("1g.6gb", "2g.12gb", "4g.24gb")
    valid = _valid_multisets("A30-24GB", names, limit=4)
    assert _maximal(valid) == {(4, 0, 0), (2, 1, 0), (0, 2, 0), (0, 0, 1)}


@pytest.mark.parametrize(
    ("model", "layout", "valid"),
    [
        ("A100-40GB", {"4g.20gb": 1, "3g.20gb": 1}, True),
        ("A100-40GB", {"3g.20gb": 2}, True),
        ("A100-40GB", {"4g.20gb": 2}, False),
        ("A100-40GB", {"1g.5gb": 7}, True),
        ("A100-40GB", {"1g.5gb": 8}, False),
        ("A100-40GB", {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, True),
        ("A100-40GB", {"1g.5gb+me": 1, "1g.5gb": 6}, True),
        ("A100-40GB", {"1g.5gb+me": 2}, False),
        ("A100-40GB", {"1g.10gb": 4, "1g.5gb": 1}, False),
        ("A100-40GB", {}, True),
        ("A100-40GB", {"7g.40gb": 1, "1g.5gb": 0}, True),
        ("A100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, True),  # all-balanced
        ("H100-94GB", {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}, True),
        ("A30-24GB", {"2g.12gb": 2}, True),
        ("A30-24GB", {"4g.24gb": 1, "1g.6gb": 1}, False),
        ("A30-24GB", {"1g.6gb": 2, "2g.12gb": 1}, True),  # all-balanced
        ("A30-24GB", {"1g.6gb+me": 1, "2g.12gb+me": 1}, False),
        ("RTX-PRO-6000", {"1g.24gb+me": 1, "1g.24gb+me.all": 1}, False),
        ("RTX-PRO-6000", {"1g.24gb-me": 2, "2g.48gb+gfx": 1}, True),
        ("RTX-PRO-6000", {"1g.24gb": 2, "2g.48gb": 1}, True),  # all-balanced
    ],
)
def test_valid_layout(model, layout, valid):
    assert mig.valid_layout(model, layout) is valid
    assert (mig.layout_problem(model, layout) is None) is valid


@pytest.mark.parametrize(
    ("model", "layout", "reason"),
    [
        ("T4", {"1g.5gb": 1}, "unknown GPU model 'T4'"),
        ("A100-40GB", {"1g.10gb+me": 1}, "profile '1g.10gb+me' is not offered by A100-40GB"),
        ("A100-40GB", {"junk": 1}, "profile 'junk' is not offered by A100-40GB"),
        ("A100-40GB", {"1g.5gb": -1}, "count of '1g.5gb' must be a non-negative integer"),
        ("A100-40GB", {"1g.5gb": 1.5}, "count of '1g.5gb' must be a non-negative integer"),
        ("A100-40GB", {"1g.5gb": True}, "count of '1g.5gb' must be a non-negative integer"),
        ("A100-40GB", {"1g.5gb": 8}, "8 x 1g.5gb exceeds the maximum of 7 per GPU on A100-40GB"),
        ("A100-40GB", {"1g.5gb": 4, "1G.5GB": 4}, "8 x 1g.5gb exceeds the maximum of 7"),
        ("A100-40GB", {"4g.20gb": 1, "2g.10gb": 2}, "needs 8 compute slices, A100-40GB has 7"),
        ("A100-40GB", {"1g.10gb": 4, "1g.5gb": 1}, "no placement of these instances fits"),
        ("A100-40GB", {"1g.5gb+me": 2}, "exceeds the maximum of 1"),
        ("RTX-PRO-6000", {"1g.24gb+me": 1, "2g.48gb+me.all": 1}, "at most one per GPU"),
        ("A100-40GB", None, "must be a mapping"),
    ],
)
def test_layout_problem_reasons(model, layout, reason):
    assert reason in mig.layout_problem(model, layout)


# ------------------------------------------------------------------------------------------------
# Unknown input never raises; a malformed packaged catalog does


@pytest.mark.parametrize("bad", [None, "", "T4", "a100-40gb", 7])
def test_unknown_models(bad):
    assert mig.lookup(bad, "1g.5gb") is None
    assert mig.profiles_for(bad) == ()
    assert mig.slices_per_gpu(bad) is None
    assert mig.gpu_model(bad) is None
    assert mig.valid_layout(bad, {"1g.5gb": 1}) is False


@pytest.fixture
def packaged(monkeypatch):
    """Swap the packaged YAML for a test document, with a fresh cache before and after."""
    def install(document):
        monkeypatch.setattr(mig, "load_package_yaml", lambda package, name: document)
        mig._catalog.cache_clear()

    yield install
    monkeypatch.undo()
    mig._catalog.cache_clear()


def _one_model(**profile):
    row = {"compute": 1, "memory": 1, "max": 7, "starts": [0], "size": 1, **profile}
    return {"models": {"X": {
        "compute_slices": 7, "memory_slices": 8, "memory_gb": 40, "verified": True,
        "placements_verified": True, "source": "test", "products": ["X 1"],
        "gke_accelerators": [], "profiles": {"1g.5gb": row},
    }}}


@pytest.mark.parametrize(
    "document",
    [
        None,
        {"models": []},
        _one_model(compute=2),
        _one_model(starts=[7], size=2),
        _one_model(starts=[]),
        _one_model(max="7"),
        {"models": {"X": {**_one_model()["models"]["X"], "profiles": {"1G.5GB": {}}}}},
    ],
)
def test_malformed_catalog_raises(packaged, document):
    packaged(document)
    with pytest.raises(ValueError, match=r"mig_profiles\.yaml"):
        mig.models()


def test_product_listed_for_two_models_raises(packaged):
    document = _one_model()
    document["models"]["Y"] = document["models"]["X"]
    packaged(document)
    with pytest.raises(ValueError, match="listed for two models"):
        mig.models()


def test_well_formed_test_catalog_loads(packaged):
    packaged(_one_model())
    assert mig.models() == ("X",)
    assert mig.model_from_name("NVIDIA X 1") == "X"
