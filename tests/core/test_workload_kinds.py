"""The one workload registry (policies.facts.workload_kinds) feeds every list of workload kinds."""

import copy

import pytest

from kube.lists import AUDIT_RESOURCES
from policies.engine.evaluation import Engine
from policies.facts import prefilter
from policies.facts.review import from_object, plural_of
from policies.facts.workload_kinds import DEFAULT_RESOURCES, WORKLOAD_KINDS
from policies.facts.workloads import find_workload
from policies.policy.loader import build_policy_set
from policies.sources import Document
from tests.builders.corpus import first
from tests.builders.environment import ENV

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
    assert kind.plural in DEFAULT_RESOURCES
    assert plural_of(kind.kind) == kind.plural
    assert prefilter.TEMPLATE_LOCATIONS[(kind.group, kind.plural)] == kind.templates
    listed = {(r.group, r.plural) for r in AUDIT_RESOURCES}
    if kind.kind not in ("Pod", "PodTemplate", "VirtualMachineInstance"):
        assert (kind.group, kind.plural) in listed


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
                          "virtualmachineinstances"}


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
        assert missing <= _DELIBERATE_EXCLUSIONS, (document.source, sorted(missing))
