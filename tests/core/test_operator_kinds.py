"""Kinds the wild harvest found dropped or miscounted (issue 16, FOUND-2026-12-02.tsv), and the
leftovers of the trials: NVIDIA NIM operator ``NIMService`` (``spec.draResources``), KAITO
``Workspace`` / ``InferenceSet`` (``resource.mig``), DisaggregatedSet ``spec.slices``, GKE's legacy
Cloud TPU names and KubeVirt vGPU types valued by framebuffer.

Each kind has its real file (tests/data/wild-harvest, also checked field by field against
EXPECTED.yaml in tests/core/test_wild_corpus.py) and minimal variants for the shapes the file does
not have; each checks the GPU count, MIG profile or GPU-equivalents a user would read.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import pytest

from gpuguard.gpus_command import collect
from policies.engine.evaluation import Engine
from policies.facts.nodes import node_facts
from policies.facts.resource_names import DEFAULT_SETTINGS, ResourceKind, classify
from policies.facts.review import from_object
from policies.facts.workloads import dra_index_of, workload_facts
from policies.policy.loader import build_policy_set
from policies.sources import Document
from tests.builders.corpus import DATA, documents, first
from tests.builders.environment import ENV

HARVEST = "wild-harvest"
NIM_DRA = f"{HARVEST}/NVIDIA_k8s-nim-operator__config-samples-nim-serving-advanced-dra-manual-llm.yaml"
NIM_BASIC = f"{HARVEST}/NVIDIA_k8s-nim-operator__config-samples-nim-llm-basic-nimservice.yaml"
KAITO_WORKSPACE = f"{HARVEST}/kaito-project_kaito__examples-mig-workspace-mig.yaml"
KAITO_SET = f"{HARVEST}/kaito-project_kaito__examples-inference-kaito_inferenceset_mig_mixed_strategy.yaml"
LLMD = f"{HARVEST}/llm-d_llm-d__guides-pd-disaggregation-modelserver-gpu-vllm-base-disaggregatedset.yaml"

NO_GPU = {
    "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "no-gpu"},
    "spec": {"validations": [{"expression": "!gpu.requested",
                              "message": "no GPUs here"}]},
}


def _facts(obj: dict[str, Any], *others: dict[str, Any]) -> dict[str, Any]:
    facts = workload_facts(obj, dra=dra_index_of([obj, *others]))
    assert facts is not None, obj["kind"]
    return facts.to_dict()


def _denied_by_a_gpu_policy(obj: dict[str, Any]) -> bool:
    policy_set, errors = build_policy_set([Document("t.yaml", 0, None, NO_GPU)], ENV)
    assert errors == []
    verdict = Engine(policy_set, ENV).evaluate(from_object(obj))
    return not verdict.allowed and verdict.message == "no-gpu: no GPUs here"


# --- NVIDIA NIM operator: NIMService -----------------------------------------------------------

def test_nim_service_gpu_from_dra_resources_is_counted_and_judged() -> None:
    # The real file: a ResourceClaimTemplate (gpu.nvidia.com, ExactCount 1), a NIMCache (no
    # GPU), a NIMService whose only GPU is draResources[0].resourceClaimTemplateName.
    template, cache, service = documents(NIM_DRA)
    facts = _facts(service, template, cache)
    assert not facts["generic"] and facts["replicas"] == 1
    dra = facts["total"]["dra"]
    assert dra["gpus"] == 1
    [claim] = dra["claims"]
    assert (claim["template"], claim["device_class"], claim["count"], claim["path"]) == (
        "gpu-resourceclaimtemplate", "gpu.nvidia.com", 1, "spec.draResources[0]")
    assert facts["total"]["gpu_equivalents"] == 1
    assert workload_facts(cache) is None  # NIMCache pulls the model: no pods of GPUs
    result = collect([str(DATA / NIM_DRA)], DEFAULT_SETTINGS)
    assert [o["kind"] for o in result["objects"]] == ["NIMService"]
    assert _denied_by_a_gpu_policy(service)


def test_nim_service_resources_are_judged_as_a_modelled_kind() -> None:
    service = first(NIM_BASIC)
    facts = _facts(service)
    assert not facts["generic"] and facts["not_modelled"] is None
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 1}
    assert _denied_by_a_gpu_policy(service)


def test_nim_service_claim_spec_replicas_and_multi_node() -> None:
    # claimSpec: the operator makes the ResourceClaimTemplate (count default 1, deviceClassName
    # default gpu.nvidia.com); pods: replicas x multiNode.size.
    service = first(NIM_BASIC)
    del service["spec"]["resources"]
    service["spec"].update({"replicas": 3, "multiNode": {"size": 2}, "draResources": [
        {"claimSpec": {"devices": [{"name": "gpu", "count": 2}, {"name": "extra"}]}}]})
    facts = _facts(service)
    assert facts["replicas"] == 6
    assert facts["total"]["dra"]["gpus"] == 6 * 3  # 3 devices per pod
    assert facts["total"]["gpu_equivalents"] == 18


def test_nim_service_claim_name_shared_and_a_broken_entry_reported() -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "shared-gpu", "namespace": "nim-service"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}
    service = first(NIM_DRA, "NIMService")
    service["spec"]["replicas"] = 2
    service["spec"]["draResources"] = [{"resourceClaimName": "shared-gpu"}, {"requests": ["x"]}]
    facts = _facts(service, claim)
    [shared] = facts["total"]["dra"]["claims"]
    assert shared["resource_claim"] == "shared-gpu" and shared["shared_by"] == 2
    assert facts["total"]["gpu_equivalents"] == 1  # one device shared by the two pods
    assert "spec.draResources[1]: names neither resourceClaimName nor " \
           "resourceClaimTemplateName" in facts["total"]["invalid"]


# --- KAITO: Workspace and InferenceSet resource.mig ---------------------------------------------

def test_kaito_workspace_mig_profile_and_count() -> None:
    workspace = first(KAITO_WORKSPACE)
    facts = _facts(workspace)
    assert not facts["generic"] and facts["replicas"] == 1
    assert facts["total"]["mig"] == {"1g.10gb": 1}
    assert facts["total"]["gpu_equivalents"] == pytest.approx(1 / 7)
    assert facts["total"]["sources"][0]["path"] == \
        "spec.resource.containers[0].resources.limits[nvidia.com/mig-1g.10gb]"
    assert _denied_by_a_gpu_policy(workspace)


def test_kaito_inference_set_replicas_times_mig() -> None:
    inference_set = first(KAITO_SET)
    facts = _facts(inference_set)
    assert facts["replicas"] == 2
    assert facts["total"]["mig"] == {"2g.24gb": 2}  # count defaults to 1 per Workspace
    assert facts["total"]["gpu_equivalents"] == pytest.approx(4 / 7)


def test_kaito_top_level_fields_count_and_custom_template() -> None:
    # KAITO's Go type keeps resource / inference at the top level; resource.count is GPU nodes.
    workspace = {"apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
                 "metadata": {"name": "w"},
                 "resource": {"count": 2, "mig": {"profile": "3g.40gb", "count": 2}},
                 "inference": {"template": {"spec": {"containers": [{"name": "c", "resources": {
                     "limits": {"nvidia.com/gpu": 1}}}]}}}}
    facts = _facts(workspace)
    assert [(t["role"], t["replicas"]) for t in facts["templates"]] == [
        ("mig", 2), ("inference", 2)]
    assert facts["total"]["mig"] == {"3g.40gb": 4}
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 2}


def test_kaito_preset_workspace_asks_for_gpus_of_unknown_count() -> None:
    # KAITO's usual Workspace names a preset and an instanceType: GPUs KAITO chooses. Counted as
    # a GPU request whose size is unknown, with the reason, never as no GPU.
    workspace = {"apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
                 "metadata": {"name": "falcon"},
                 "resource": {"instanceType": "Standard_NC12s_v3",
                              "labelSelector": {"matchLabels": {"apps": "falcon"}}},
                 "inference": {"preset": {"name": "falcon-7b"}}}
    total = _facts(workspace)["total"]
    assert total["requested"] is True and total["gpu_equivalents"] is None
    assert total["unknown"] == [
        "inference.preset: KAITO runs preset 'falcon-7b' on the GPUs of resource.instanceType "
        "('Standard_NC12s_v3') x 1 node(s); how many GPUs that is, the manifest does not say"]
    assert _denied_by_a_gpu_policy(workspace)


@pytest.mark.parametrize(("mig", "message"), [
    ({"count": 1}, "spec.resource.mig.profile: expected a MIG profile such as 1g.10gb, got None"),
    (["1g.10gb"], "spec.resource.mig: expected a map {profile, count}, got a list"),
    ({"profile": "1g.10gb", "count": -1},
     "spec.resource.mig.count: expected a non-negative integer, got -1"),
])
def test_kaito_broken_mig_request_is_reported(mig: Any, message: str) -> None:
    workspace = first(KAITO_WORKSPACE)
    workspace["spec"]["resource"]["mig"] = mig
    assert message in _facts(workspace)["total"]["invalid"]


def test_kaito_mig_written_as_a_bare_profile_is_counted_and_reported() -> None:
    workspace = first(KAITO_WORKSPACE)
    workspace["spec"]["resource"]["mig"] = "3g.40gb"
    total = _facts(workspace)["total"]
    assert total["mig"] == {"3g.40gb": 1}
    assert total["invalid"] == ["spec.resource.mig: expected a map {profile, count}, got a "
                                "string (counted as profile '3g.40gb', count 1)"]


def test_kaito_unknown_mig_profile_is_listed_not_dropped() -> None:
    workspace = first(KAITO_WORKSPACE)
    workspace["spec"]["resource"]["mig"] = {"profile": "1g.10gigs"}
    total = _facts(workspace)["total"]
    assert total["unrecognized"] == ["nvidia.com/mig-1g.10gigs"]


# --- llm-d / LWS DisaggregatedSet spec.slices ---------------------------------------------------

def test_disaggregated_set_slices_copy_every_role() -> None:
    facts = _facts(first(LLMD))
    assert [(t["role"], t["replicas"]) for t in facts["templates"]] == [
        ("prefill", 8), ("decode", 2)]
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 16}
    assert facts["total"]["gpu_equivalents"] == 16


@pytest.mark.parametrize(("slices", "pods", "invalid"), [
    (3, [3, 9], []),
    (0, [0, 0], []),
    ("two", [1, 3], ["spec.slices: expected a non-negative integer, got 'two'"]),
])
def test_disaggregated_set_slices_variants(slices: Any, pods: list[int],
                                           invalid: list[str]) -> None:
    gpu = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    obj = {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
           "metadata": {"name": "d"}, "spec": {"slices": slices, "roles": [
               {"name": "prefill", "spec": {"leaderWorkerTemplate": {"workerTemplate": gpu}}},
               {"name": "decode", "spec": {"replicas": 3, "leaderWorkerTemplate": {
                   "workerTemplate": copy.deepcopy(gpu)}}}]}}
    facts = _facts(obj)
    assert [t["replicas"] for t in facts["templates"]] == pods
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": sum(pods)}
    assert [m for m in facts["total"]["invalid"] if "slices" in m] == invalid


# --- GKE legacy Cloud TPU names ----------------------------------------------------------------

def test_legacy_cloud_tpu_pod_counts_chips() -> None:
    pod = first("edge/gke-legacy-cloud-tpu-pod.yaml")
    total = _facts(pod)["total"]
    assert total["gpus"] == {"cloud-tpus.google.com/preemptible-v2": 8}
    assert total["gpu_equivalents"] == 4  # 8 TensorCores, 2 per v2 chip
    assert total["vendors"] == ["google"] and total["unrecognized"] == []


@pytest.mark.parametrize(("name", "kind"), [
    ("cloud-tpus.google.com/v2", ResourceKind.CORES),
    ("cloud-tpus.google.com/v3", ResourceKind.CORES),
    ("cloud-tpus.google.com/preemptible-v3", ResourceKind.CORES),
    ("cloud-tpus.google.com/v4", ResourceKind.UNRECOGNIZED),  # a name Google never published
    ("tpu.example.com/board", ResourceKind.UNRECOGNIZED),  # the hint word before the '/'
    ("example.com/widget", ResourceKind.OTHER),
])
def test_accelerator_words_anywhere_in_the_name(name: str, kind: ResourceKind) -> None:
    assert classify(name) is kind


# --- KubeVirt vGPU types valued by framebuffer --------------------------------------------------

def test_kubevirt_vgpu_node_is_valued_by_framebuffer() -> None:
    node = node_facts(first("edge/kubevirt-node-vgpu-grid-a100.yaml"))
    assert node.allocatable.shared == {"nvidia.com/GRID_A100-4C": 20}
    assert node.gpu_equivalents == 2  # A100-4C: 4 GB of 40 GB, 10 per GPU; was 20
    assert node.warnings == ()


@pytest.mark.parametrize(("name", "equivalents", "warning"), [
    ("nvidia.com/GRID_T4-2Q", Fraction(8 * 2, 16), None),
    ("nvidia.com/GRID_A100-1-5C", Fraction(8, 7), None),  # MIG-backed: a 1g instance each
    ("nvidia.com/GRID_V100DX-8Q", None,
     "nvidia.com/GRID_V100DX-8Q: 8 vGPUs; vGPU type nvidia.com/GRID_V100DX-8Q: board V100DX is not "
     "in gpuguard's vGPU table, so its share of a GPU is unknown"),
])
def test_kubevirt_vgpu_node_variants(name: str, equivalents: Fraction | None,
                                     warning: str | None) -> None:
    obj = first("edge/kubevirt-node-vgpu-grid-a100.yaml")
    obj["status"] = {"allocatable": {name: "8"}}
    node = node_facts(obj)
    assert node.gpu_equivalents == equivalents
    assert list(node.warnings) == ([warning] if warning else [])
