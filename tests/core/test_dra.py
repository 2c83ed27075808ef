"""DRA claims resolved as the scheduler does (issue 16 item 2), one test per kind of fault found
in the wild corpus (``tests/data/wild/FOUND-2026-12-01.tsv``)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.facts.workloads import claim_templates_of, dra_index_of, workload_facts
from tests.builders.corpus import documents

WILD = "wild/"


def _facts(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """(kind, name) -> total facts as JSON, with the DRA index of all ``objects``."""
    index = dra_index_of(objects)
    found = {}
    for obj in objects:
        facts = workload_facts(obj, dra=index)
        if facts is not None:
            found[(obj["kind"], obj["metadata"].get("name"))] = facts.total.to_dict()
    return found


def _pod(name: str, resources: dict[str, Any] | None = None,
         claims: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "resources": {"limits": resources or {}}}
    spec: dict[str, Any] = {"containers": [container]}
    if claims:
        container["resources"]["claims"] = [{"name": c["name"]} for c in claims]
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "n"},
            "spec": spec}


def _claim(name: str, device_class: str, kind: str = "ResourceClaim") -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "n"},
            "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}


@pytest.mark.parametrize("file", [
    "kubernetes-sigs_dra-example-driver__demo-examples-basic-shared-claim-across-pods-"
    "basic-shared-claim-across-pods.yaml",
    "kai-scheduler_KAI-Scheduler__docs-developer-designs-dra-claim-sharing-gpu-sharing-"
    "example.yaml",
])
def test_a_resource_claim_in_the_input_is_resolved_and_shared(file: str) -> None:
    """Was: 'ResourceClaim single-gpu is not in the input', GPUs unknown, for a claim in the
    file. Now: one GPU, each of the two pods holding half of it."""
    facts = _facts(documents(WILD + file))
    pods = [f for (kind, _), f in facts.items() if kind == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        claim = pod["dra"]["claims"][0]
        assert (claim["resource_claim"], claim["count"], claim["shared_by"]) == \
            ("single-gpu", 1, 2)
        assert pod["gpu_equivalents"] == 0.5
        assert pod["shared"] and not pod["unknown"]


def test_a_shared_claim_is_one_allocation_however_many_replicas() -> None:
    """Three replicas naming one ResourceClaim: one device, not three."""
    pod = _pod("p", claims=[{"name": "gpu", "resourceClaimName": "one"}])
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": "n"},
                  "spec": {"replicas": 3, "template": {"spec": pod["spec"]}}}
    total = _facts([deployment, _claim("one", "gpu.nvidia.com")])[("Deployment", "d")]
    assert total["dra"]["gpus"] == 1
    assert total["gpu_equivalents"] == 1.0


def test_a_missing_resource_claim_is_named_as_such() -> None:
    total = _facts([_pod("p", claims=[{"name": "gpu", "resourceClaimName": "gone"}])])
    assert total[("Pod", "p")]["unknown"] == [
        "spec.resourceClaims[0]: ResourceClaim 'gone' is not in the input; its device count is "
        "unknown"]


def test_first_available_of_unnamed_classes_is_one_device_of_unknown_size() -> None:
    """Was: classes without 'gpu'/'mig' in the name made the request 0 GPUs."""
    facts = _facts(documents(WILD + "kubernetes-sigs_kueue__site-static-examples-dra-sample-"
                                    "dra-firstavailable-job.yaml"))
    total = next(f for (kind, _), f in facts.items() if kind == "Job")
    assert total["dra"]["gpus"] == 1
    assert total["gpu_equivalents"] is None
    assert "may not be a GPU" in total["unknown"][0]


def test_a_device_class_extended_resource_counts_as_its_devices() -> None:
    """KEP-5004: example.com/gpu named by a GPU DeviceClass of the input is one GPU."""
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "gpu.example.com"},
                    "spec": {"selectors": [{"cel": {"expression":
                                                    "device.driver == 'gpu.example.com'"}}],
                             "extendedResourceName": "example.com/gpu"}}
    pod = _pod("p", {"example.com/gpu": 1})
    assert _facts([pod])[("Pod", "p")]["unrecognized"] == ["example.com/gpu"]
    total = _facts([pod, device_class])[("Pod", "p")]
    assert total["gpus"] == {"example.com/gpu": 1}
    assert total["gpu_equivalents"] == 1.0 and not total["unrecognized"]


def test_a_mig_device_class_makes_nvidia_gpu_a_slice() -> None:
    """Was: nvidia.com/gpu 1 = 1 GPU although the file's DeviceClass maps it to 1g.12gb."""
    facts = _facts(documents(WILD + "NVIDIA_k8s-dra-driver-gpu__demo-specs-extended-resources-"
                                    "mig-1g-12gb.yaml"))
    total = facts[("Pod", "mig-1g12gb-pod")]
    assert total["mig_single"]["status"] == "pinned"
    assert total["mig_single"]["profile"] == "1g.12gb"
    assert total["gpu_equivalents"] == pytest.approx(1 / 7, abs=1e-6)


def test_an_imex_channel_of_a_compute_domain_is_not_a_gpu() -> None:
    facts = _facts(documents(WILD + "kai-scheduler_KAI-Scheduler__docs-dra-gpu-imex-pod.yaml"))
    total = facts[("Pod", "gpu-imex-pod")]
    assert total["gpus"] == {"nvidia.com/gpu": 1}
    assert total["dra"] is None and total["gpu_equivalents"] == 1.0


def test_kubevirt_gpus_with_dra_count_the_claim() -> None:
    """Was: gpus[0].deviceName invalid, 0 GPUs, for the claimName / requestName form."""
    objects = documents(WILD + "kubevirt_kubevirt__examples-vm-dra-pgpu.yaml") + \
        documents(WILD + "kubevirt_kubevirt__examples-pgpu-resource-claim-tmpl.yaml")
    facts = workload_facts(objects[0], dra=dra_index_of(objects))
    assert facts is not None
    per_vm = facts.per_template[0].to_dict()
    assert per_vm["invalid"] == []
    assert per_vm["dra"]["gpus"] == 1 and per_vm["gpu_equivalents"] == 1.0
    # The example is runStrategy: Halted: the VM holds nothing now, and says what it would take.
    total = _facts(objects)[("VirtualMachine", "vm-dra-pgpu")]
    assert total["dra"]["gpus"] == 0 and total["gpu_equivalents"] == 0.0
    assert total["warnings"] == ["spec.runStrategy: Halted: stopped, so it holds no GPU now; once "
                                 "started each VM takes 1 GPU device(s), 1 GPU-equivalent(s)"]
    alone = workload_facts(objects[0], dra=dra_index_of(objects[:1]))
    assert alone is not None
    assert alone.per_template[0].dra_gpus is None and alone.total.gpu_equivalents is None


def test_a_claim_name_the_vm_does_not_declare_is_invalid() -> None:
    vm = documents(WILD + "kubevirt_kubevirt__examples-vm-dra-pgpu.yaml")[0]
    vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["claimName"] = "other"
    total = _facts([vm])[("VirtualMachine", "vm-dra-pgpu")]
    assert total["invalid"] == ["spec.template.spec.domain.devices.gpus[0].claimName: 'other' "
                                "names no entry of the VM's spec.resourceClaims"]


def test_the_audit_s_template_index_no_longer_drops_unnamed_classes() -> None:
    """The (class, count) index the auditor keeps (claim_template_devices) reads DRA requests
    with the same rule: an A100-or-MIG template is one device of unknown size, not 0 GPUs."""
    objects = documents(WILD + "kubernetes-sigs_kueue__site-static-examples-dra-sample-"
                               "dra-firstavailable-job.yaml")
    templates = claim_templates_of(objects)
    assert templates == {("default", "a100-or-mig"): ("a100.example.com", 1)}
    job = next(o for o in objects if o["kind"] == "Job")
    facts = workload_facts(job, claim_templates=templates)
    assert facts is not None
    assert facts.total.dra_gpus == 1 and facts.total.gpu_equivalents is None


def _all_mode_input(devices_per_node: tuple[int, ...]) -> list[dict[str, Any]]:
    template = _claim("all-gpus", "gpu.nvidia.com", "ResourceClaimTemplate")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "gpu.nvidia.com"},
                    "spec": {"selectors": [{"cel": {"expression":
                                                    "device.driver == 'gpu.nvidia.com'"}}]}}
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": f"node-{i}-gpu.nvidia.com"},
               "spec": {"driver": "gpu.nvidia.com", "nodeName": f"node-{i}",
                        "pool": {"name": f"node-{i}", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"gpu-{d}"} for d in range(n)]}}
              for i, n in enumerate(devices_per_node)]
    pod = _pod("p", claims=[{"name": "gpus", "resourceClaimTemplateName": "all-gpus"}])
    return [pod, template, device_class, *slices]


def test_allocation_mode_all_is_counted_from_the_input_s_resource_slices() -> None:
    """Every node of the driver publishes 8 devices: All is 8 GPUs, wherever the pod lands."""
    total = _facts(_all_mode_input((8, 8)))[("Pod", "p")]
    assert total["dra"]["gpus"] == 8 and total["gpu_equivalents"] == 8.0


@pytest.mark.parametrize("devices_per_node", [(), (8, 4)])
def test_allocation_mode_all_stays_unknown_when_the_slices_do_not_tell(
    devices_per_node: tuple[int, ...],
) -> None:
    """No slice, or nodes of different sizes: the count depends on the node, so unknown."""
    total = _facts(_all_mode_input(devices_per_node))[("Pod", "p")]
    assert total["dra"]["gpus"] is None and total["gpu_equivalents"] is None
    assert "allocationMode All" in total["unknown"][0]
