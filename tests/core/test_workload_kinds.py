"""The one workload registry (policies.facts.workload_kinds) feeds every list of workload kinds."""

import copy
from typing import Any

import pytest
import yaml

from kube.lists import AUDIT_RESOURCES
from policies.engine.evaluation import Engine
from policies.facts import prefilter
from policies.facts.review import from_object, plural_of
from policies.facts.workload_kinds import DEFAULT_RESOURCES, JUDGED_KINDS, WORKLOAD_KINDS
from policies.facts.workloads import find_workload, workload_facts
from policies.policy.loader import build_policy_set
from policies.sources import Document
from tests.builders.corpus import first
from tests.builders.environment import ENV
from tests.paths import ROOT

LIMIT = {
    "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "max-4"},
    "spec": {"validations": [{"expression": "gpu.maxPerPod.count <= 4",
                              "message": "at most 4 GPUs per pod"}]},
}


def _as_mxjob(pytorchjob):
    mxjob = copy.deepcopy(pytorchjob)
    mxjob["kind"] = "MXJob"
    mxjob["spec"]["mxReplicaSpecs"] = mxjob["spec"].pop("pytorchReplicaSpecs")
    return mxjob


def test_an_mxjob_is_judged_like_the_same_pytorchjob():
    # MXJob was counted by `gpuguard gpus` but missing from the default match list, so a 16-GPU
    # MXJob passed a policy that denied the same PyTorchJob.
    pytorchjob = copy.deepcopy(first("manifests/kftrain__pytorchjob-mnist-nccl.yaml"))
    for replica in pytorchjob["spec"]["pytorchReplicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            container.setdefault("resources", {})["limits"] = {"nvidia.com/gpu": 16}
    policy_set, errors = build_policy_set([Document("t.yaml", 0, None, LIMIT)], ENV)
    assert errors == []
    engine = Engine(policy_set, ENV)
    verdicts = [engine.evaluate(from_object(obj)) for obj in (pytorchjob, _as_mxjob(pytorchjob))]
    assert [v.allowed for v in verdicts] == [False, False]
    assert verdicts[0].message == verdicts[1].message == "max-4: at most 4 GPUs per pod"


@pytest.mark.parametrize("kind", WORKLOAD_KINDS, ids=lambda k: f"{k.group or 'core'}/{k.plural}")
def test_every_registered_kind_is_matched_reviewed_prefiltered_and_listed(kind):
    assert plural_of(kind.kind) == kind.plural
    key = (kind.group, kind.plural)
    assert prefilter.TEMPLATE_LOCATIONS[key] == kind.templates
    assert prefilter.POD_SPEC_LOCATIONS.get(key, ()) == kind.pod_specs
    assert prefilter.RESOURCE_LOCATIONS.get(key, ()) == kind.resources
    assert kind.templates or kind.pod_specs or kind.resources or kind.claim_refs \
        or kind.mig_requests
    assert prefilter.ACCELERATOR_FIELD_LOCATIONS.get(key, ()) == (*kind.claim_refs,
                                                                  *kind.mig_requests)
    listed = {(r.group, r.plural) for r in AUDIT_RESOURCES}
    if kind.derived:  # judged and counted through the job it stands for, never twice
        assert kind.plural not in DEFAULT_RESOURCES and key not in listed
        with pytest.raises(ValueError, match="judge the job twice"):
            prefilter.match_conditions([key])
        return
    assert kind.plural in DEFAULT_RESOURCES
    if kind.kind not in ("Pod", "PodTemplate", "VirtualMachineInstance"):
        assert key in listed


def _webhook_rules() -> dict[str, set[tuple[str, str, str]]]:
    """Webhook name -> (apiGroup, apiVersion, resource) of its rules in deploy/base."""
    rules: dict[str, set[tuple[str, str, str]]] = {}
    for doc in yaml.safe_load_all((ROOT / "deploy" / "base" / "webhooks.yaml").read_text()):
        for hook in (doc or {}).get("webhooks", []):
            rules[hook["name"]] = {(g, v, r) for rule in hook["rules"] for g in rule["apiGroups"]
                                   for v in rule["apiVersions"] for r in rule["resources"]}
    return rules


def test_webhook_rules_follow_the_registry():
    # deploy/base/webhooks.yaml is written by hand; this keeps it to the registry. Every kind
    # that is judged in its own right is sent to workloads.validate and mutate (at the version
    # the registry reads), but Pods (pods.validate) and PodTemplates (they make no pods); the
    # derived kinds never are. Before: TrainJob, InferenceService, LLMInferenceService,
    # KFService, DisaggregatedSet and ReplicationController were missing from the rules.
    rules = _webhook_rules()
    wanted = {(k.group, k.version, k.plural) for k in JUDGED_KINDS
              if k.kind not in ("Pod", "PodTemplate")}
    for name in ("workloads.validate.gpuguard.io", "mutate.gpuguard.io"):
        assert wanted <= rules[name], (name, sorted(wanted - rules[name]))
        sent = {(g, r) for g, _, r in rules[name]}
        registered = {(k.group, k.plural) for k in WORKLOAD_KINDS}
        assert sent - registered <= {("", "pods"), ("", "pods/ephemeralcontainers")}
        assert not sent & {(k.group, k.plural) for k in WORKLOAD_KINDS if k.derived}
    # and the DRA claims, judged themselves (a Pod arrives without them), fail-closed as pods
    assert {(g, r) for g, _, r in rules["pods.validate.gpuguard.io"]} == {
        ("", "pods"), ("", "pods/ephemeralcontainers"),
        ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "resourceclaimtemplates")}


@pytest.mark.parametrize("kind", [k for k in WORKLOAD_KINDS if k.replica_specs],
                         ids=lambda k: k.kind)
def test_kubeflow_kinds_are_read_by_the_workload_reader(kind):
    template = {"spec": {"containers": [{"name": "c", "resources": {
        "limits": {"nvidia.com/gpu": 2}}}]}}
    obj = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": "j"},
           "spec": {kind.replica_specs: {"Worker": {"replicas": 3, "template": template}}}}
    workload = find_workload(obj)
    assert workload is not None and not workload.generic
    assert [t.replicas for t in workload.templates] == [3]


# Kinds a library policy may leave out on purpose: they carry no pod template of their own
# (ephemeral containers, PodTemplates) or hold GPUs in a VM domain the rule does not read.
_DELIBERATE_EXCLUSIONS = {"pods/ephemeralcontainers", "podtemplates", "virtualmachines",
                          "virtualmachineinstances", "virtualmachinepools",
                          "virtualmachineinstancereplicasets"}
# Tolerations and runtimeClassName cannot be written on a resource block (Trainer's
# resourcesPerNode, KFServing's framework blocks): the runtime or KServe writes the pods. The
# NIM and KAITO operators write theirs too, from fields of their own (NIM spec.tolerations,
# KAITO's preset), which these PodSpec patches do not reach.
_POD_SPEC_ONLY = {"add-gpu-toleration-and-runtimeclass", "gpu-node-toleration"}
_RESOURCE_BLOCK_KINDS = {"trainjobs", "kfservices", "nimservices", "workspaces", "inferencesets"}


def test_library_policies_leave_out_no_workload_kind_by_accident():
    from policies.sources import Document, iter_documents, library_path

    documents = [d for d in iter_documents([library_path()]) if isinstance(d, Document)]
    assert len(documents) >= 10
    for document in documents:
        spec = document.body.get("spec") or {}
        listed = (spec.get("match") or {}).get("resources")
        if document.body.get("kind") != "GPUPolicy" or listed is None:
            continue
        missing = set(DEFAULT_RESOURCES) - set(listed)
        allowed = _DELIBERATE_EXCLUSIONS | (
            _RESOURCE_BLOCK_KINDS if document.body["metadata"]["name"] in _POD_SPEC_ONLY else set())
        assert missing <= allowed, (document.source, sorted(missing))


NO_GPU = {
    "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "no-gpu"},
    "spec": {"validations": [{"expression": "gpu.maxPerPod.count < 1",
                              "message": "no GPUs here"}]},
}


def _engine() -> Engine:
    policy_set, errors = build_policy_set([Document("t.yaml", 0, None, NO_GPU)], ENV)
    assert errors == []
    return Engine(policy_set, ENV)


_ISVC = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
         "metadata": {"name": "isvc", "namespace": "team-a"},
         "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"},
                                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}}}}


@pytest.mark.parametrize("source", [
    "wild/kubeflow_trainer__examples-flux-lammps-train-gpus.yaml",
    "wild/kserve_kserve__docs-samples-accelerators-tensorflow-gpu.yaml",
    "wild/kserve_kserve__docs-samples-llmisvc-agentic-tool-calling-llmisvc-single-gpu.yaml",
    "wild/kubernetes-sigs_lws__docs-examples-disaggregatedset-basic-vllm.yaml",
    "inline InferenceService",
])
def test_kinds_with_podspecs_or_resource_blocks_are_judged(source):
    # Before: the GPU facts counted these kinds, but no default GPUPolicy matched them (they
    # were not in the registry), so a policy denying every GPU allowed them.
    obj = copy.deepcopy(_ISVC) if source.startswith("inline") else first(source)
    verdict = _engine().evaluate(from_object(obj))
    assert not verdict.allowed and verdict.message == "no-gpu: no GPUs here"
    workload = find_workload(obj)
    assert workload is not None and not workload.generic and workload.not_modelled is None


_UNKNOWN_WORKERS = {"replicas": 2, "template": {"spec": {"containers": [
    {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}


@pytest.mark.parametrize(("spec", "path", "gpus"), [
    ({"workers": _UNKNOWN_WORKERS}, "spec.workers.template", 4),
    ({"server": {"containers": [{"name": "s", "image": "x",
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
     "spec.server", 1),
    ({"runner": {"numNodes": 3, "resourcesPerNode": {"requests": {"nvidia.com/gpu": "8"}}}},
     "spec.runner.resourcesPerNode", 24),
    ({"gang": {"minResources": {"cpu": "4", "amd.com/gpu": "2"}}}, "spec.gang.minResources", 2),
])
def test_an_unknown_crd_with_gpus_is_judged_and_flagged_not_modelled(spec, path, gpus):
    # Before: a PodSpec or a resource block in a kind gpuguard does not model was found only as
    # template.spec.containers, and no default GPUPolicy matched the kind at all: its GPUs
    # passed every policy (and `gpuguard gpus` put it in "ignored" with the Services).
    obj = {"apiVersion": "example.com/v1", "kind": "FooJob",
           "metadata": {"name": "f", "namespace": "team-a"}, "spec": copy.deepcopy(spec)}
    facts = workload_facts(obj)
    assert facts is not None and facts.workload.generic
    assert [t.path for t in facts.workload.templates] == [path]
    assert sum(facts.total.gpus.values()) == gpus
    assert facts.workload.not_modelled == (
        f"FooJob (example.com): kind not modelled; judged from what a search found at {path}")
    verdict = _engine().evaluate(from_object(obj))
    assert not verdict.allowed and verdict.message == "no-gpu: no GPUs here"


def test_objects_that_make_no_pods_stay_out():
    # A Service, a ResourceQuota's GPU limit or a node selector naming a GPU label is no pod.
    for obj in (
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
         "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
         "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}},
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "l"},
         "spec": {"limits": [{"type": "Container", "max": {"nvidia.com/gpu": "1"}}]}},
        {"apiVersion": "example.com/v1", "kind": "Pinning", "metadata": {"name": "p"},
         "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}},
    ):
        assert find_workload(obj) is None, obj["kind"]
        assert _engine().evaluate(from_object(obj)).allowed


def _kueue_workload() -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "image": "x", "resources": {
        "requests": {"nvidia.com/gpu": "2"}}}]}}
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": "job-x-1a2b3", "namespace": "team-a"},
            "spec": {"queueName": "user-queue", "podSets": [
                {"name": "main", "count": 3, "template": template},
                {"name": "launcher", "count": 1, "template": {"spec": {"containers": [
                    {"name": "l", "image": "x"}]}}}]}}


def test_kueue_workload_pod_sets_and_volcano_pod_group_min_resources_are_read():
    # Before: a Kueue Workload was searched as an unknown kind (podSets[].count not read: 1 pod
    # per pod set), a PodGroup's minResources not at all (no pod template: "ignored").
    workload = workload_facts(_kueue_workload())
    assert workload is not None and not workload.workload.generic
    assert [(t.role, t.replicas) for t in workload.workload.templates] == [("main", 3),
                                                                           ("launcher", 1)]
    assert workload.total.gpus == {"nvidia.com/gpu": 6}
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "team-a"},
             "spec": {"minMember": 4, "queue": "q",
                      "minResources": {"cpu": "16", "nvidia.com/gpu": "8"}}}
    facts = workload_facts(group)
    assert facts is not None and not facts.workload.generic
    assert [t.path for t in facts.workload.templates] == ["spec.minResources"]
    assert facts.total.gpus == {"nvidia.com/gpu": 8}
    # Made by the schedulers for jobs that are judged themselves: never judged a second time.
    for obj in (_kueue_workload(), group):
        assert _engine().evaluate(from_object(obj)).allowed


MUTATE = {
    "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "tolerate"},
    "spec": {"mutations": [
        {"name": "toleration", "addToleration": {"key": "nvidia.com/gpu", "operator": "Exists",
                                                 "effect": "NoSchedule"}},
        {"name": "label", "setLabel": {"key": "gpu", "value": "yes", "target": "podTemplates"}}]},
}


def test_pod_template_shortcuts_change_pod_specs_and_never_resource_blocks():
    # A resource block (TrainJob resourcesPerNode) has no pod spec: before, the shortcuts wrote
    # spec.trainer.tolerations and spec.trainer.metadata.labels, fields no TrainJob has. A bare
    # PodSpec (KServe predictor) takes the toleration, and has no metadata for the label.
    policy_set, errors = build_policy_set([Document("m.yaml", 0, None, MUTATE)], ENV)
    assert errors == []
    engine = Engine(policy_set, ENV)
    trainjob = first("wild/kubeflow_trainer__examples-flux-lammps-train-gpus.yaml")
    assert engine.evaluate(from_object(trainjob)).patch == ()
    isvc = copy.deepcopy(_ISVC)
    isvc["spec"]["predictor"] = {"containers": [
        {"name": "kserve-container", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    assert list(engine.evaluate(from_object(isvc)).patch) == [
        {"op": "add", "path": "/spec/predictor/tolerations",
         "value": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}]
