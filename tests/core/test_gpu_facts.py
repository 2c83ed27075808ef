"""GPU facts rules on real inputs.

Bug cases, corpus manifests, and corpus manifests edited to hit one rule each (each test names the
edit).
"""

import copy
import dataclasses
import re
from fractions import Fraction

import pytest

from policies.cel.gpu import empty_gpu_data, gpu_data
from policies.facts.gpu import (
    GPUFacts,
    HamiSplit,
    KaiShare,
    MigSingle,
    ResourceProblem,
    merge,
    pod_facts,
)
from policies.facts.resource_names import GPUSettings
from policies.facts.workloads import claim_templates_of, find_workload, workload_facts
from policies.sources import read_documents
from tests.builders.corpus import DATA, bug_input, first


def facts_of(obj, **kwargs):
    result = workload_facts(obj, **kwargs)
    assert result is not None
    return result.total


# --- bug cases (tests/data/bugs) -----------------------------------------------------------


def test_gpu_only_in_init_container_is_counted_hami_2167():
    pod = bug_input("Project-HAMi-HAMi-2167.yaml")["request"]["object"]
    facts = facts_of(pod)
    assert facts.requested
    assert facts.effective_requests == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}
    assert facts.gpus == {"nvidia.com/gpu": 1}
    assert facts.gpu_memory_mib == 8000
    assert facts.hami is not None and facts.hami.to_dict() == {"gpus": 1, "gpumem_mib": 8000, "gpumem_percentage": None,
                          "gpucores": None}
    assert facts.sources[0].path == "spec.initContainers[0].resources.limits[nvidia.com/gpu]"
    # HAMi memory in MiB without a cores share: the share of a GPU needs the GPU's size.
    assert facts.gpu_equivalents is None
    assert facts.unknown and "spec.initContainers[0]" in facts.unknown[0]


def test_requests_not_equal_limits_is_invalid_and_counts_the_limit_ndp_154():
    job = bug_input("NVIDIA-k8s-device-plugin-154.yaml")["request"]["object"]
    facts = facts_of(job)
    assert facts.gpus == {"nvidia.com/gpu": 3}  # never the request (1): that would hide demand
    assert facts.invalid == (
        "spec.template.spec.containers[0].resources[nvidia.com/gpu]: requests (1) must equal "
        "limits (3) for an extended resource",
    )


def test_visible_devices_env_without_request_is_unrequested_access_ndp_61():
    pod = bug_input("NVIDIA-k8s-device-plugin-61.yaml", "explicit_env")["request"]["object"]
    facts = facts_of(pod)
    assert not facts.requested
    [access] = facts.unrequested_access
    assert access.path == "spec.containers[0].env[0]"
    assert access.reason == "NVIDIA_VISIBLE_DEVICES=all without requesting a GPU"


def test_zero_gpu_request_is_no_gpu_ndp_61():
    pod = bug_input("NVIDIA-k8s-device-plugin-61.yaml", "zero_gpu")["request"]["object"]
    facts = facts_of(pod)
    assert not facts.requested
    assert facts.gpus == {}
    assert facts.gpu_equivalents == 0
    assert facts.invalid == ()


def test_ephemeral_debug_container_with_visible_devices_deckhouse_22398():
    pod = bug_input("deckhouse-deckhouse-22398.yaml")["request"]["object"]
    facts = facts_of(pod)
    [access] = facts.unrequested_access
    assert access.container_type == "ephemeralContainers"
    assert access.path == "spec.ephemeralContainers[0].env[0]"
    assert "NVIDIA_VISIBLE_DEVICES=all" in access.reason


# --- effective request rules (corpus pods edited) -------------------------------------------


def _vector_add_pod():
    return first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")  # one app container, 1 GPU


def _gpu_container(name, gpus, restart_policy=None):
    container = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    if restart_policy:
        container["restartPolicy"] = restart_policy
    return container


@pytest.mark.parametrize(
    ("init_containers", "expected"),
    [
        # A plain init container with 2 GPUs runs alone: max(2, app 1) = 2.
        ([("prep", 2, None)], 2),
        # A sidecar (restartPolicy Always) runs beside the app: app 1 + sidecar 1 = 2.
        ([("proxy", 1, "Always")], 2),
        # Sidecar 1 started before an init container of 2: init peak 1 + 2 = 3 > app 1 + 1.
        ([("proxy", 1, "Always"), ("prep", 2, None)], 3),
        # Init container of 3 before the sidecar: peak 3 vs app 1 + sidecar 1 = 2.
        ([("prep", 3, None), ("proxy", 1, "Always")], 3),
        # Two init containers are never summed (HAMi#2167's wrong rule would give 1 + 1 + 1).
        ([("a", 1, None), ("b", 1, None)], 1),
    ],
)
def test_effective_request_follows_kubernetes_pod_requests(init_containers, expected):
    pod = _vector_add_pod()
    pod["spec"]["initContainers"] = [_gpu_container(*c) for c in init_containers]
    assert facts_of(pod).gpus == {"nvidia.com/gpu": expected}


@pytest.mark.parametrize(
    ("limit", "request_value", "count", "invalid_fragment"),
    [
        (1, None, 1, None),
        ("1", None, 1, None),
        ("2", "2", 2, None),
        ("1k", None, 1000, None),
        (None, "1", 1, "a request without a limit is rejected"),
        ("500m", None, 1, "0.5 is not a whole number"),
        ("-1", None, 0, "negative quantity"),
        ("two", None, 0, "'two' is not a Kubernetes quantity"),
        ("0", None, 0, None),
    ],
)
def test_extended_resource_quantity_rules(limit, request_value, count, invalid_fragment):
    pod = _vector_add_pod()
    resources = pod["spec"]["containers"][0]["resources"] = {}
    if limit is not None:
        resources["limits"] = {"nvidia.com/gpu": limit}
    if request_value is not None:
        resources["requests"] = {"nvidia.com/gpu": request_value}
    facts = facts_of(pod)
    assert facts.gpus.get("nvidia.com/gpu", 0) == count
    if invalid_fragment is None:
        assert facts.invalid == ()
    else:
        assert any(invalid_fragment in message for message in facts.invalid), facts.invalid


# --- MIG, sharing, placement ----------------------------------------------------------------


def test_mig_single_strategy_pinned_by_product_label_counts_a_slice():
    pod = _vector_add_pod()
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}
    facts = facts_of(pod)
    assert facts.gpus == {"nvidia.com/gpu": 1}
    assert facts.mig_single is not None and facts.mig_single.to_dict() == {"status": "pinned", "profile": "1g.5gb", "model": "A100-40GB"}
    assert facts.gpu_equivalents == Fraction(1, 7)


def test_mig_single_strategy_pinned_by_gke_partition_size():
    pod = _vector_add_pod()
    pod["spec"]["nodeSelector"] = {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
        "cloud.google.com/gke-gpu-partition-size": "3g.20gb",
    }
    facts = facts_of(pod)
    assert facts.mig_single is not None and facts.mig_single.to_dict() == {"status": "pinned", "profile": "3g.20gb", "model": "A100-40GB"}
    assert facts.gpu_equivalents == Fraction(3, 7)


def test_whole_gpu_pinned_to_a_non_mig_product_by_required_affinity():
    pod = _vector_add_pod()
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In",
             "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}
    facts = facts_of(pod)
    assert facts.mig_single is not None and facts.mig_single.to_dict() == {"status": "excluded", "profile": None, "model": "H100-80GB"}
    assert facts.gpu_equivalents == 1


def test_mig_mixed_resource_on_a_known_model():
    pod = first("manifests/hami__static-mig-3g.20gb.yaml")
    facts = facts_of(pod)
    assert facts.mig == {"3g.20gb": 1}
    assert facts.gpus == {}
    assert facts.mig_single is None
    assert facts.gpu_equivalents == Fraction(3, 7)
    assert not facts.approximate


def test_mig_profile_offered_by_models_with_different_slice_counts_is_approximate():
    pod = _vector_add_pod()
    # 1g.24gb exists on H100 NVL (7 slices) and RTX PRO 6000 (4 slices).
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.24gb": 1}}
    facts = facts_of(pod)
    assert facts.gpu_equivalents == Fraction(1, 7)
    assert facts.approximate
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"}
    pinned = facts_of(pod)
    assert pinned.gpu_equivalents == Fraction(1, 7)
    assert not pinned.approximate


def test_shared_replicas_need_a_replica_count():
    deployment = first("manifests/gpuop__mps-deployment-sharing-strategy-nodeselector.yaml")
    unknown = facts_of(deployment)
    assert unknown.shared and unknown.gpu_equivalents is None
    settings = GPUSettings(shared_replicas=(("nvidia.com/gpu", 4),))
    known = facts_of(deployment, settings=settings)
    assert known.gpu_equivalents == 1  # 4 replicas x 1/4 of a GPU


def test_renamed_shared_resource_uses_configured_replicas():
    pod = _vector_add_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": 1}}
    assert facts_of(pod).gpu_equivalents is None
    settings = GPUSettings(shared_replicas=(("nvidia.com/gpu.shared", 10),))
    facts = facts_of(pod, settings=settings)
    assert facts.shared
    assert facts.gpu_equivalents == Fraction(1, 10)


# --- KAI, DRA, unknown resources ------------------------------------------------------------


def test_kai_fraction_on_an_init_container():
    facts = facts_of(first("manifests/kai__gpu-fraction-init-container.yaml"))
    assert facts.kai is not None
    assert facts.kai.to_dict() == {"fraction": 0.5, "memory_mib": None, "devices": 1,
                                   "container": "gpu-init"}
    assert facts.gpu_equivalents == Fraction(1, 2)
    assert facts.shared


def test_kai_fraction_naming_a_missing_container_is_invalid():
    pod = first("manifests/kai__gpu-fraction-non-default-container.yaml")
    pod["metadata"]["annotations"]["gpu-fraction-container-name"] = "not-there"
    facts = facts_of(pod)
    assert facts.invalid == (
        "metadata.annotations[gpu-fraction-container-name]: no container named 'not-there'",
    )


@pytest.mark.parametrize("value", ["1.5", "0", "half", "1", "2", " 0.5", "1e-999"])
def test_kai_fraction_out_of_range_is_invalid_and_of_unknown_size(value):
    # KAI's admission: a float above 0 and below 1 (1e-999 is 0 as a float64); never 0 here.
    pod = first("manifests/kai__gpu-fraction-mps-hostpath.yaml")
    pod["metadata"]["annotations"]["gpu-fraction"] = value
    facts = facts_of(pod)
    assert any("is not a fraction of a GPU" in m for m in facts.invalid)
    assert facts.gpu_equivalents is None and facts.requested
    assert facts.unknown == (f"metadata.annotations[gpu-fraction]: {value!r} is not a valid "
                             "fraction, so the share of a GPU it asks for is unknown",)


def test_dra_claim_counted_from_template_in_the_same_input():
    from tests.builders.corpus import documents

    objects = documents("manifests/dradriver__pod-two-gpus-resourceclaimtemplate.yaml")
    claims = claim_templates_of(objects)
    assert claims == {("gpu-test1", "double-gpu"): ("gpu.nvidia.com", 2)}
    pod = next(o for o in objects if o["kind"] == "Pod")
    facts = facts_of(pod, claim_templates=claims)
    assert facts.dra_gpus == 2
    assert facts.gpu_equivalents == 2
    assert facts.requested


def test_dra_v1_request_shape_and_all_mode():
    template = first("manifests/dradriver__pod-two-gpus-resourceclaimtemplate.yaml",
                     "ResourceClaimTemplate")
    template["apiVersion"] = "resource.k8s.io/v1"
    request = template["spec"]["spec"]["devices"]["requests"][0]
    template["spec"]["spec"]["devices"]["requests"][0] = {
        "name": request["name"],
        "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4},
    }
    assert claim_templates_of([template]) == {("gpu-test1", "double-gpu"): ("gpu.nvidia.com", 4)}
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    assert claim_templates_of([template]) == {
        ("gpu-test1", "double-gpu"): ("gpu.nvidia.com", None)}


def test_vendor_neutral_resource_is_unrecognized_until_configured():
    pod = first("manifests/k8sdocs__example-vector-add-vendor-neutral.yaml")
    facts = facts_of(pod)
    assert not facts.requested
    assert facts.unrecognized == ("gpu-vendor.example/example-gpu",)
    configured = facts_of(
        pod, settings=GPUSettings(extra_whole_resources=("gpu-vendor.example/example-gpu",)))
    assert configured.gpus == {"gpu-vendor.example/example-gpu": 1}
    assert configured.vendors == ("gpu-vendor.example",)


def test_hostpath_dev_nvidia_mount_without_request():
    pod = first("manifests/kai__gpu-fraction-mps-hostpath.yaml")
    del pod["metadata"]["annotations"]
    pod["spec"]["volumes"][0]["hostPath"]["path"] = "/dev/nvidia0"
    facts = facts_of(pod)
    [access] = facts.unrequested_access
    assert access.path == "spec.containers[0].volumeMounts[0]"
    assert access.reason == "mounts hostPath /dev/nvidia0 without requesting a GPU"


def test_sys_admin_and_privileged_are_listed_with_or_without_gpu():
    job = first("manifests/mpiop__nccl-tests-mpijob.yaml")
    facts = facts_of(job)
    assert [a.container for a in facts.privileged] == ["nccl", "nccl"]
    assert {a.path.split(".template")[0] for a in facts.privileged} == {
        "spec.mpiReplicaSpecs.Launcher", "spec.mpiReplicaSpecs.Worker"}
    [access] = facts.unrequested_access  # only the launcher asks for no GPU
    assert access.path.startswith("spec.mpiReplicaSpecs.Launcher")


def test_malformed_pod_parts_never_raise():
    pod = _vector_add_pod()
    pod["spec"]["containers"] = {"not": "a list"}
    pod["spec"]["initContainers"] = ["not a container"]
    facts = facts_of(pod)
    assert not facts.requested
    assert facts.invalid == (
        "spec.initContainers[0]: expected a container object",
        "spec.containers: expected a list of containers",
    )
    assert pod_facts(None).requested is False


# --- workload kinds and replicas ------------------------------------------------------------


def test_job_parallelism_capped_by_completions_and_cronjob():
    job = first("manifests/ndp__e2e-job-nbody.yaml")
    job["spec"]["parallelism"] = 4
    job["spec"]["completions"] = 2
    assert find_workload(job).replicas == 2
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
            "spec": {"schedule": "0 2 * * *", "jobTemplate": {"spec": job["spec"]}}}
    workload = find_workload(cron)
    assert workload.templates[0].path == "spec.jobTemplate.spec.template"
    assert facts_of(cron).gpus == {"nvidia.com/gpu": 2}


def test_deployment_scaled_to_zero_asks_for_nothing():
    deployment = first("manifests/triton__mig-1g.5gb-deployment.yaml")
    deployment["spec"]["replicas"] = 0
    facts = facts_of(deployment)
    assert facts.mig == {"1g.5gb": 0}
    assert facts.gpu_equivalents == 0


def test_jobset_replicated_jobs():
    job = first("manifests/ndp__e2e-job-nbody.yaml")
    job["spec"]["parallelism"] = 2
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "train"},
              "spec": {"replicatedJobs": [{"name": "workers", "replicas": 3,
                                           "template": {"spec": job["spec"]}}]}}
    workload = find_workload(jobset)
    assert workload.replicas == 6
    assert facts_of(jobset).gpus == {"nvidia.com/gpu": 6}


def test_raycluster_num_of_hosts_and_autoscaling_bounds():
    service = first("manifests/kuberay__rayservice-vllm-gpu.yaml")
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["numOfHosts"] = 2
    workload = find_workload(service)
    worker = workload.templates[1]
    assert (worker.replicas, worker.min_replicas, worker.max_replicas) == (2, 0, 8)
    assert facts_of(service).gpus == {"nvidia.com/gpu": 4}


def test_leaderworkerset_without_leader_template_uses_worker_template_for_all():
    lws = first("manifests/lws__vllm-gpu-leaderworkerset.yaml")
    del lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    workload = find_workload(lws)
    assert [t.role for t in workload.templates] == ["worker"]
    assert workload.replicas == 4
    assert facts_of(lws).gpus == {"nvidia.com/gpu": 32}


def test_kubevirt_vm_passthrough_and_vgpu():
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm"},
          "spec": {"template": {"spec": {"domain": {"devices": {
              "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"},
                       {"name": "vgpu1", "deviceName": "nvidia.com/GRID_T4-1Q"}],
              "hostDevices": [{"name": "nic", "deviceName": "example.org/sriov-nic"},
                              {"name": "a100", "deviceName": "nvidia.com/GA100_A100_PCIE_40GB"}],
          }}}}}}
    facts = facts_of(vm)
    assert facts.gpus == {"nvidia.com/GA102GL_A10": 1, "nvidia.com/GRID_T4-1Q": 1,
                          "nvidia.com/GA100_A100_PCIE_40GB": 1}
    assert facts.shared
    # two passthrough GPUs and a T4-1Q vGPU: 1 GB of a 16 GB T4 (NVIDIA vGPU user guide)
    assert facts.gpu_equivalents == 2 + Fraction(1, 16)
    assert find_workload(vm).replicas == 1


def test_negative_replicas_are_reported_and_default_used():
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    deployment["spec"]["replicas"] = -3
    facts = facts_of(deployment)
    assert "spec.replicas: expected a non-negative integer, got -3" in facts.invalid
    assert facts.gpus == {"nvidia.com/gpu": 1}


def test_objects_without_pods_are_not_workloads():
    assert find_workload(first("manifests/gke__vllm-gemma3-27b-a100-deployment.yaml",
                               "Service")) is None
    assert find_workload(first("manifests/gpuop__timeslicing-mps-plugin-configmap.yaml")) is None


# --- resource problems: the structured twin of invalid's resource entries ----------------------

NEEDS_LIMIT = ("an extended resource needs a limit; a request without a limit is rejected by the "
               "API server")
# The invalid entries that have a ResourceProblem (what gpu-requests-equal-limits selected before).
RESOURCE_ENTRY = re.compile(r"\.resources(\.(requests|limits))?\[[^\]]+\]: ")


def _nbody_with(requests=None, limits=None):
    """manifests/dcgm__nbody-pod-burstable-cpu.yaml with its nvidia.com/gpu request / limit
    replaced (None: absent); cpu and memory stay."""
    pod = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
    resources = pod["spec"]["containers"][0]["resources"]
    for side, value in (("requests", requests), ("limits", limits)):
        resources[side].pop("nvidia.com/gpu", None)
        if value is not None:
            resources[side]["nvidia.com/gpu"] = value
    return pod


def test_request_without_limit_in_a_statefulset_template():
    facts = facts_of(first("manifests/imroc__ollama-statefulset-gpu-requests-only.yaml"))
    assert facts.resource_problems == (ResourceProblem(
        container="ollama", container_type="containers", path="spec.template.spec.containers[0]",
        field="spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]",
        resource="nvidia.com/gpu", requests="1", limits="not set", problem=NEEDS_LIMIT),)
    assert facts.invalid == (
        f"spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]: {NEEDS_LIMIT}",)


def test_zero_request_without_limit_keeps_the_zero_as_written():
    facts = facts_of(first("manifests/imroc__ollama-statefulset-gpu-zero-request.yaml"))
    [problem] = facts.resource_problems
    assert (problem.requests, problem.limits, problem.problem) == ("0", "not set", NEEDS_LIMIT)


def test_request_different_from_limit_in_a_job_template_ndp_154():
    job = bug_input("NVIDIA-k8s-device-plugin-154.yaml")["request"]["object"]
    assert facts_of(job).resource_problems == (ResourceProblem(
        container="train", container_type="containers", path="spec.template.spec.containers[0]",
        field="spec.template.spec.containers[0].resources[nvidia.com/gpu]",
        resource="nvidia.com/gpu", requests="1", limits="3",
        problem="requests (1) must equal limits (3) for an extended resource"),)


def test_request_different_from_limit_in_a_deployment_template():
    # Edited copy of the vLLM Deployment: request nvidia.com/gpu "2", limit "1"; 3 replicas.
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    deployment["spec"]["replicas"] = 3
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "nvidia.com/gpu"] = "2"
    facts = facts_of(deployment)
    assert facts.resource_problems == (ResourceProblem(
        container="mistral-7b", container_type="containers",
        path="spec.template.spec.containers[0]",
        field="spec.template.spec.containers[0].resources[nvidia.com/gpu]",
        resource="nvidia.com/gpu", requests="2", limits="1",
        problem="requests (2) must equal limits (1) for an extended resource"),)
    assert facts.to_dict()["resource_problems"] == [{
        "container": "mistral-7b", "container_type": "containers",
        "path": "spec.template.spec.containers[0]",
        "field": "spec.template.spec.containers[0].resources[nvidia.com/gpu]",
        "resource": "nvidia.com/gpu", "requests": "2", "limits": "1",
        "problem": "requests (2) must equal limits (1) for an extended resource"}]


@pytest.mark.parametrize(("limit", "shown", "problem"), [
    ("500m", "500m", "0.5 is not a whole number; extended resources take integers"),
    (0.5, "0.5", "0.5 is not a whole number; extended resources take integers"),
    # YAML floats are shown as CEL's string() shows a double (the policy's messages did so).
    (1234567.5, "1.2345675e+06", "1234567.5 is not a whole number; extended resources take "
                                 "integers"),
])
def test_fractional_limit_is_shown_as_written(limit, shown, problem):
    facts = facts_of(_nbody_with(limits=limit))
    assert facts.resource_problems == (ResourceProblem(
        container="nbody", container_type="containers", path="spec.containers[0]",
        field="spec.containers[0].resources[nvidia.com/gpu]", resource="nvidia.com/gpu",
        requests="not set", limits=shown, problem=problem),)


def test_obsolete_resource_name_in_a_legacy_tfjob():
    tfjob = first("manifests/kftrain__legacy-tfjob-alpha-nvidia-gpu.yaml")
    assert facts_of(tfjob).resource_problems == (ResourceProblem(
        container="tensorflow", container_type="containers",
        path="spec.replica_specs[0].template.spec.containers[0]",
        field="spec.replica_specs[0].template.spec.containers[0].resources"
              "[alpha.kubernetes.io/nvidia-gpu]",
        resource="alpha.kubernetes.io/nvidia-gpu", requests="not set", limits="1",
        problem="obsolete resource name (removed in Kubernetes 1.10; use nvidia.com/gpu); the "
                "API server rejects it"),)


def test_init_container_problem_hami_2167():
    # Edited copy of the HAMi#2167 pod: the init container's GPU request (1) differs from its
    # limit (2).
    pod = bug_input("Project-HAMi-HAMi-2167.yaml")["request"]["object"]
    resources = pod["spec"]["initContainers"][0]["resources"]
    resources["limits"]["nvidia.com/gpu"] = 2
    resources["requests"] = {"nvidia.com/gpu": 1}
    assert facts_of(pod).resource_problems == (ResourceProblem(
        container="warmup", container_type="initContainers", path="spec.initContainers[0]",
        field="spec.initContainers[0].resources[nvidia.com/gpu]", resource="nvidia.com/gpu", requests="1", limits="2",
        problem="requests (1) must equal limits (2) for an extended resource"),)


def test_one_value_can_break_two_rules():
    # Edited nbody pod: request 1, limit "1500m": unequal, and the larger is not whole.
    facts = facts_of(_nbody_with(requests=1, limits="1500m"))
    assert [(p.requests, p.limits, p.problem) for p in facts.resource_problems] == [
        ("1", "1500m", "requests (1) must equal limits (1.5) for an extended resource"),
        ("1", "1500m", "1.5 is not a whole number; extended resources take integers"),
    ]


def test_same_problem_on_both_sides_is_two_problems():
    # Edited nbody pod: request and limit both "x"; invalid names each side, and so do the
    # problems (their ``field`` differs).
    facts = facts_of(_nbody_with(requests="x", limits="x"))
    assert [p.field for p in facts.resource_problems] == [
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
        "spec.containers[0].resources.requests[nvidia.com/gpu]",
    ]
    assert {(p.requests, p.limits) for p in facts.resource_problems} == {("x", "x")}
    assert facts.invalid == tuple(f"{p.field}: {p.problem}" for p in facts.resource_problems)


def test_resource_problems_are_merged_like_invalid():
    facts = facts_of(first("manifests/imroc__ollama-statefulset-gpu-requests-only.yaml"))
    assert merge([facts, facts]).resource_problems == facts.resource_problems
    assert merge([facts.scaled(4), GPUFacts()]).resource_problems == facts.resource_problems


def _corpus_workloads():
    documents, errors = read_documents([str(DATA / "manifests")])
    assert not errors
    return [d.body for d in documents if find_workload(d.body) is not None]


def _edited_workloads():
    """Every corpus workload, and copies with the first container of their first pod template
    given broken GPU resources (each edit named in the list)."""
    edits = [
        {"requests": {"nvidia.com/gpu": 1}},                                       # no limit
        {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": 3}},    # unequal
        {"limits": {"nvidia.com/gpu": "250m", "amd.com/gpu": -1}},                 # fraction, < 0
        {"limits": {"alpha.kubernetes.io/nvidia-gpu": 1, "nvidia.com/gpu": "x"}},  # old name, text
        {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 10**9}},  # out of range
        {"requests": {"nvidia.com/gpu": "x"}, "limits": {"nvidia.com/gpu": "x"}},  # same, twice
    ]
    for obj in _corpus_workloads():
        yield obj
        for edit in edits:
            edited = copy.deepcopy(obj)
            workload = find_workload(edited)
            assert workload is not None
            containers = workload.templates[0].spec.get("containers")  # the object's own map
            if containers:
                containers[0]["resources"] = edit
                yield edited


def test_every_resource_entry_of_invalid_has_one_resource_problem():
    checked = 0
    for obj in _edited_workloads():
        facts = facts_of(obj)
        entries = [e for e in facts.invalid if RESOURCE_ENTRY.search(e)]
        assert entries == [f"{p.field}: {p.problem}" for p in facts.resource_problems]
        for problem in facts.resource_problems:
            assert problem.field.startswith(f"{problem.path}.resources")
            assert problem.field.endswith(f"[{problem.resource}]")
        checked += len(entries)
    assert checked > 100


def test_resource_problems_in_cel():
    tfjob = first("manifests/kftrain__legacy-tfjob-alpha-nvidia-gpu.yaml")
    assert gpu_data(workload_facts(tfjob))["resourceProblems"] == [{
        "container": "tensorflow", "containerType": "containers",
        "path": "spec.replica_specs[0].template.spec.containers[0]",
        "field": "spec.replica_specs[0].template.spec.containers[0].resources"
                 "[alpha.kubernetes.io/nvidia-gpu]",
        "resource": "alpha.kubernetes.io/nvidia-gpu", "requests": "not set", "limits": "1",
        "problem": "obsolete resource name (removed in Kubernetes 1.10; use nvidia.com/gpu); the "
                   "API server rejects it"}]
    assert empty_gpu_data()["resourceProblems"] == []


@pytest.mark.parametrize(("manifest", "field", "cel_key", "record"), [
    ("manifests/kai__gpu-fraction-init-container.yaml", "kai", "kai", KaiShare),
    ("manifests/hami__default-use-gpumem-gpucores.yaml", "hami", "hami", HamiSplit),
])
def test_kai_hami_views_are_the_record_fields(manifest, field, cel_key, record):
    # One field list: the JSON view (to_dict) and the CEL view (gpu.kai / gpu.hami) are the
    # record's fields, by name; no view adds, drops or renames one.
    workload = workload_facts(first(manifest))
    assert workload is not None
    facts = workload.total
    value = getattr(facts, field)
    assert isinstance(value, record)
    names = [f.name for f in dataclasses.fields(record)]
    assert list(value.to_dict()) == names
    assert list(facts.to_dict()[field]) == names
    assert list(gpu_data(workload)[cel_key]) == names


def test_mig_single_view_is_the_record_fields():
    workload = workload_facts({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                               "spec": {"containers": [{"name": "c", "resources": {
                                   "limits": {"nvidia.com/gpu": 1}}}]}})
    assert workload is not None
    facts = workload.total
    assert isinstance(facts.mig_single, MigSingle)
    names = [f.name for f in dataclasses.fields(MigSingle)]
    assert list(facts.mig_single.to_dict()) == names == list(gpu_data(workload)["migSingle"])
    assert facts.mig_single.to_dict()["status"] == "unknown"  # a plain string for JSON and CEL


# --- GPU access without a request: capabilities, hostPaths, envFrom (tests/data/access) ------


def _access_pods(name):
    documents, errors = read_documents([str(DATA / "access" / name)])
    assert not errors
    return {d.body["metadata"]["name"]: d.body for d in documents}


@pytest.mark.parametrize("capability", ["ALL", "all", "CAP_ALL", "SYS_ADMIN", "sys_admin",
                                        "CAP_SYS_ADMIN", "cap_sys_admin", "Cap_Sys_Admin"])
def test_capability_all_or_sys_admin_in_any_spelling_is_privileged(capability):
    pods = _access_pods("cap-all.yaml")
    for pod in pods.values():
        pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = [
            "NET_RAW", capability]
    gpu_pod, cpu_pod = facts_of(pods["cap-all"]), facts_of(pods["cap-all-nogpu"])
    path = "spec.containers[0].securityContext.capabilities.add"
    expected = ("adds capability ALL (every capability, SYS_ADMIN included)"
                if capability.upper().removeprefix("CAP_") == "ALL"
                else "adds capability SYS_ADMIN")
    assert [(a.path, a.reason) for a in gpu_pod.privileged] == [(path, expected)]
    assert gpu_pod.unrequested_access == ()  # the GPU container asked for its GPU
    assert [(a.path, a.reason) for a in cpu_pod.unrequested_access] == [
        (path, f"{expected}: sees every device on the node without requesting a GPU")]


def test_other_capabilities_are_not_privileged():
    pod = _access_pods("cap-all.yaml")["cap-all-nogpu"]
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = [
        "NET_ADMIN", "ALLX", "SYS_ADMINISTRATOR", "CAP_NET_RAW"]
    facts = facts_of(pod)
    assert facts.privileged == () and facts.unrequested_access == ()


# hostPath as written -> the note after "mounts hostPath <path>" (None: no finding); the trial's
# pods hp0..hp15 (their path is their annotation).
HOST_PATHS = {
    "/": " (the whole host filesystem, /dev included)",
    "/dev": "",
    "//dev": " (= /dev)",
    "/./dev": " (= /dev)",
    "/dev/./nvidia0": " (= /dev/nvidia0)",
    "/dev/../dev/nvidia0": " (a '..' element: the API server refuses it, the target is unknown)",
    "/var/../dev": " (a '..' element: the API server refuses it, the target is unknown)",
    "/dev/nvidia0": "",
    "/DEV": None,  # paths are case-sensitive
    "/dev/shm": None,
    "/run/nvidia/driver": None,
    "/dev/dri/card0": "",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": None,
    "/dev/vfio": None,
    "/dev/infiniband": None,
    "/sys/bus/pci": None,
}


@pytest.mark.parametrize("name", [f"hp{i}" for i in range(16)])
def test_host_paths_are_cleaned_as_the_kernel_resolves_them(name):
    pod = _access_pods("hostpaths.yaml")[name]
    path = pod["metadata"]["annotations"]["path"]
    facts = facts_of(pod)
    note = HOST_PATHS[path]
    if note is None:
        assert facts.unrequested_access == ()
        return
    [access] = facts.unrequested_access
    assert access.path == "spec.containers[0].volumeMounts[0]"
    assert access.reason == f"mounts hostPath {path}{note} without requesting a GPU"


@pytest.mark.parametrize(("path", "note"), [
    ("/dev/", " (= /dev)"), ("//", " (the whole host filesystem, /dev included)"),
    ("/.", " (the whole host filesystem, /dev included)"), ("/dev//nvidiactl", " (= /dev/nvidiactl)"),
    ("dev", " (= /dev)"), ("/dev/dri/", " (= /dev/dri)"), ("/devices", None), ("/dev.d", None),
    ("/home/.cache", None), ("/var/lib/kubelet", None), ("", None),
])
def test_host_path_spellings(path, note):
    pod = _access_pods("hostpath-dotdev.yaml")["hp"]
    pod["spec"]["volumes"][0]["hostPath"]["path"] = path
    facts = facts_of(pod)
    if note is None:
        assert facts.unrequested_access == ()
    else:
        [access] = facts.unrequested_access
        assert access.reason == f"mounts hostPath {path}{note} without requesting a GPU"


def test_host_path_dot_dev_of_the_trial_is_dev():
    [access] = facts_of(_access_pods("hostpath-dotdev.yaml")["hp"]).unrequested_access
    assert access.reason == "mounts hostPath /./dev (= /dev) without requesting a GPU"


ALL_DEVICE_ENV = ("NVIDIA_VISIBLE_DEVICES, NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES, "
                  "HABANA_VISIBLE_DEVICES")


def test_env_from_a_config_map_may_set_the_device_env_vars():
    pods = _access_pods("envfrom.yaml")
    reasons = {name: [(a.path, a.reason) for a in facts_of(pod).unrequested_access]
               for name, pod in pods.items()}
    certain = {name: [a.certain for a in facts_of(pod).unrequested_access]
               for name, pod in pods.items()}
    # Without a prefix the access depends on the ConfigMap's keys: listed, not certain.
    assert certain["envfrom"] == [False] and certain["envfrom-prefix"] == [True]
    assert certain["env-valuefrom"] == [True]
    assert reasons == {
        "envfrom": [("spec.containers[0].envFrom[0]", f"envFrom ConfigMap 'gpu-env' may set "
                     f"{ALL_DEVICE_ENV} (value unknown) without requesting a GPU")],
        "envfrom-prefix": [("spec.containers[0].envFrom[0]", "envFrom ConfigMap 'gpu-env' with "
                            "prefix 'NVIDIA_' may set NVIDIA_VISIBLE_DEVICES, "
                            "NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES (value "
                            "unknown) without requesting a GPU")],
        "env-valuefrom": [("spec.containers[0].env[0]", "NVIDIA_VISIBLE_DEVICES is set from a "
                           "reference (value unknown) without requesting a GPU")],
        "env-lower": [],  # other names: env names are case-sensitive
        "env-dup": [("spec.containers[0].env[0]",
                     "NVIDIA_VISIBLE_DEVICES=all without requesting a GPU")],
        "env-dup2": [("spec.containers[0].env[1]",
                      "NVIDIA_VISIBLE_DEVICES=all without requesting a GPU")],
        "env-space": [],
    }


@pytest.mark.parametrize(("source", "names"), [
    ({"secretRef": {"name": "s"}}, ALL_DEVICE_ENV),
    ({"prefix": "HABANA_", "secretRef": {"name": "s"}}, "HABANA_VISIBLE_DEVICES"),
    ({"prefix": "NVIDIA_VISIBLE_DEVICES", "configMapRef": {"name": "c"}},
     "NVIDIA_VISIBLE_DEVICES"),
    ({"prefix": "N", "configMapRef": {"name": "c", "optional": True}},
     "NVIDIA_VISIBLE_DEVICES, NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES"),
    ({"prefix": "APP_", "configMapRef": {"name": "c"}}, None),
    ({"prefix": "nvidia_", "configMapRef": {"name": "c"}}, None),
    ({"prefix": "NVIDIA_VISIBLE_DEVICES_", "configMapRef": {"name": "c"}}, None),
])
def test_env_from_prefixes(source, names):
    pod = _access_pods("envfrom.yaml")["envfrom"]
    pod["spec"]["containers"][0]["envFrom"] = [source]
    facts = facts_of(pod)
    if names is None:
        assert facts.unrequested_access == ()
        return
    [access] = facts.unrequested_access
    assert f" may set {names} (value unknown) without requesting a GPU" in access.reason
    assert access.reason.startswith("envFrom Secret 's'" if "secretRef" in source
                                    else "envFrom ConfigMap 'c'")


def test_env_entries_win_over_env_from():
    # Kubernetes: a variable set in env overrides one of the same name from envFrom.
    pod = _access_pods("envfrom.yaml")["envfrom-prefix"]
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": n, "value": "void"} for n in (
        "NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES")]
    assert facts_of(pod).unrequested_access == ()
    container["env"].pop()
    [access] = facts_of(pod).unrequested_access
    assert "may set NVIDIA_MIG_MONITOR_DEVICES (value unknown)" in access.reason


def test_env_from_in_a_gpu_container_is_its_own_business():
    pod = _access_pods("envfrom.yaml")["envfrom"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    facts = facts_of(pod)
    assert facts.requested and facts.unrequested_access == ()


def test_malformed_env_from_is_invalid_not_a_crash():
    pod = _access_pods("envfrom.yaml")["envfrom"]
    pod["spec"]["containers"][0]["envFrom"] = ["gpu-env", {"prefix": 7, "configMapRef": "x"}]
    facts = facts_of(pod)
    assert facts.invalid == ("spec.containers[0].envFrom[0]: expected a map, got the string 'gpu-env'",)
    assert facts.unrequested_access == ()  # prefix "7" can produce no device variable
