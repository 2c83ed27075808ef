"""DRA claims for MIG slices are MIG facts (trial finding 2): NVIDIA's ``mig.nvidia.com`` class,
selectors on ``device.attributes['gpu.nvidia.com'].type == 'mig'`` / ``.profile``, an allocated
claim's devices from ResourceSlices — profile, count and GPU-equivalents exactly as the
``nvidia.com/mig-<profile>`` form; an undetermined profile is ``unknown``, never a whole GPU."""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

from policies.facts.dra import UNKNOWN_MIG_PROFILE
from policies.facts.gpu import GPUFacts, pod_facts
from policies.facts.workloads import dra_index_of, workload_facts
from tests.builders.corpus import documents

TRIAL = "trial/dra/"


def _total(objects: list[dict[str, Any]], name: str) -> GPUFacts:
    index = dra_index_of(objects)
    for obj in objects:
        if obj["metadata"].get("name") == name and obj["kind"] != "ResourceClaimTemplate":
            facts = workload_facts(obj, dra=index)
            assert facts is not None
            return facts.total
    raise LookupError(name)


def _template(name: str, *options: dict[str, Any], first_available: bool = False,
              kind: str = "ResourceClaimTemplate") -> dict[str, Any]:
    request: dict[str, Any] = {"name": "r"}
    if first_available:
        request["firstAvailable"] = [{"name": f"o{i}", **o} for i, o in enumerate(options)]
    else:
        request["exactly"] = options[0]
    devices = {"devices": {"requests": [request]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "n"},
            "spec": {"spec": devices} if kind == "ResourceClaimTemplate" else devices}


def _pod(claim: str, *, template: bool = True, **spec: Any) -> dict[str, Any]:
    source = "resourceClaimTemplateName" if template else "resourceClaimName"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"},
            "spec": {"resourceClaims": [{"name": "g", source: claim}],
                     "containers": [{"name": "c", "resources": {"claims": [{"name": "g"}]}}],
                     **spec}}


def _profile(profile: str) -> dict[str, Any]:
    return {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}


def test_the_trial_mig_claim_is_two_1g10gb_slices_as_the_extended_resource_form() -> None:
    dra = _total(documents(TRIAL + "mig-only.yaml"), "p-mig")
    extended = _total(documents(TRIAL + "mig-extended-resource-pod.yaml"), "p-mig-ext")
    assert dict(dra.mig) == dict(extended.mig) == {"1g.10gb": 2}
    assert dra.gpu_equivalents == extended.gpu_equivalents == Fraction(2, 7)
    assert dra.gpus == {} and dra.unknown == ()
    claim = dra.to_dict()["dra"]["claims"][0]
    assert (claim["device_class"], claim["count"], claim["mig"]) == \
        ("mig.nvidia.com", 2, {"1g.10gb": 2})


def test_the_trial_imex_channel_and_vfio_claims_are_unchanged() -> None:
    objects = documents(TRIAL + "mig-only.yaml")
    assert not _total(objects, "p-cd").requested  # an IMEX channel is no GPU
    vfio = _total(objects, "p-vfio")  # VFIO passthrough: a whole GPU
    assert (vfio.gpu_equivalents, dict(vfio.mig)) == (Fraction(1), {})


def test_a_mig_class_with_no_profile_is_unknown_profile_never_a_whole_gpu() -> None:
    objects = documents(TRIAL + "dra.yaml") + documents(TRIAL + "pods.yaml")
    facts = _total(objects, "p-v1-two-requests")  # 1 gpu.nvidia.com + 2 mig.nvidia.com
    assert dict(facts.mig) == {UNKNOWN_MIG_PROFILE: 2}
    assert facts.gpu_equivalents is None
    assert facts.equivalents_known == 0  # the claim's size is unknown: not 3 GPUs
    assert any("MIG slices of request 'b' are of unknown profile" in u for u in facts.unknown)


def test_a_request_selector_on_type_mig_and_profile_pins_the_profile() -> None:
    selectors = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'mig' && "
                                        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
                          }}]
    objects = [_template("t", {"deviceClassName": "a100.example.com", "count": 1,
                               "selectors": selectors}), _pod("t")]
    facts = _total(objects, "p")
    assert dict(facts.mig) == {"3g.40gb": 1}
    assert facts.gpu_equivalents == Fraction(3, 7)


def test_a_profile_test_that_pins_no_one_profile_is_unknown() -> None:
    selectors = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile in "
                                        "['1g.10gb', '2g.20gb']"}}]
    objects = [_template("t", {"deviceClassName": "gpu-any", "count": 2, "selectors": selectors}),
               _pod("t")]
    facts = _total(objects, "p")
    assert dict(facts.mig) == {UNKNOWN_MIG_PROFILE: 2} and facts.gpu_equivalents is None


def test_first_available_mig_profiles_of_different_sizes_are_unknown() -> None:
    objects = [_template("t", {"deviceClassName": "mig.nvidia.com", "selectors": [_profile(
        "3g.40gb")]}, {"deviceClassName": "mig.nvidia.com", "selectors": [_profile("1g.10gb")]},
        first_available=True), _pod("t")]
    facts = _total(objects, "p")
    assert dict(facts.mig) == {UNKNOWN_MIG_PROFILE: 1} and facts.gpu_equivalents is None
    same = [_template("t", {"deviceClassName": "mig.nvidia.com", "selectors": [_profile(
        "1g.10gb")]}, {"deviceClassName": "mig.nvidia.com", "selectors": [_profile("1g.10gb")]},
        first_available=True), _pod("t")]
    assert dict(_total(same, "p").mig) == {"1g.10gb": 1}


def test_a_device_class_of_the_input_pins_the_profile() -> None:
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "small-slices"},
                    "spec": {"selectors": [{"cel": {"expression": (
                        "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'mig' && "
                        "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'")}}]}}
    objects = [device_class, _template("t", {"deviceClassName": "small-slices", "count": 3}),
               _pod("t", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"})]
    facts = _total(objects, "p")
    assert dict(facts.mig) == {"1g.5gb": 3}
    assert facts.gpu_equivalents == Fraction(3, 7) and not facts.approximate


def test_an_allocated_claim_takes_its_profiles_from_the_resource_slices() -> None:
    claim = _template("c", {"deviceClassName": "mig.nvidia.com", "count": 2}, kind="ResourceClaim")
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "gpu.nvidia.com", "pool": "node-1", "device": d}
        for d in ("gpu-0-mig-9-4-4", "gpu-1-mig-0-0-8")]}}}

    def device(name: str, profile: str) -> dict[str, Any]:
        return {"name": name, "attributes": {"type": {"string": "mig"},
                                             "profile": {"string": profile}}}

    resource_slice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                      "metadata": {"name": "node-1-gpu.nvidia.com"},
                      "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-1",
                               "pool": {"name": "node-1"},
                               "devices": [device("gpu-0-mig-9-4-4", "3g.20gb"),
                                           device("gpu-1-mig-0-0-8", "7g.40gb")]}}
    facts = _total([claim, resource_slice, _pod("c", template=False)], "p")
    assert dict(facts.mig) == {"3g.20gb": 1, "7g.40gb": 1}
    assert facts.gpu_equivalents == Fraction(10, 7) and facts.unknown == ()
    # Without the slices the requests decide: mig.nvidia.com with no profile.
    alone = _total([copy.deepcopy(claim), _pod("c", template=False)], "p")
    assert dict(alone.mig) == {UNKNOWN_MIG_PROFILE: 2}


def test_the_older_pair_shape_marks_a_mig_class_as_unknown_profile() -> None:
    facts = pod_facts(_pod("t")["spec"], claim_templates={("n", "t"): ("mig.nvidia.com", 2)},
                      namespace="n")
    assert dict(facts.mig) == {UNKNOWN_MIG_PROFILE: 2} and facts.gpu_equivalents is None


def test_a_replicated_template_multiplies_the_slices() -> None:
    objects = documents(TRIAL + "mig-only.yaml")
    pod = next(o for o in objects if o["metadata"]["name"] == "p-mig")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": "team-llm"},
                  "spec": {"replicas": 3, "template": {"spec": pod["spec"]}}}
    facts = _total([*objects, deployment], "d")
    assert dict(facts.mig) == {"1g.10gb": 6} and facts.gpu_equivalents == Fraction(6, 7)


def test_whole_gpu_claims_stay_exact_fractions() -> None:
    objects = documents(TRIAL + "dra.yaml") + documents(TRIAL + "pods.yaml")
    facts = _total(objects, "p-v1-exactly")
    assert type(facts.equivalents_known) is Fraction and facts.equivalents_known == 2
    assert dict(facts.mig) == {}
