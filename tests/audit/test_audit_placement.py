"""Placement building blocks on the corpus nodes: units without double counting, the scheduler's
filters, pod requests, ownership roll-up, and a scan of the corpus nodes."""

from __future__ import annotations

import datetime
from fractions import Fraction

import pytest

from audit.report.assemble import assemble
from audit.scan.node_capacity import node_capacity
from audit.scan.ownership import ObjectKey, Ownership
from audit.scan.pods import PodReader
from audit.scan.scanner import scan
from audit.scan.scheduling import selects, tolerates, untolerated
from audit.settings import AuditSettings
from policies.facts.nodes import node_facts
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.sources import Document, read_documents
from tests.builders.corpus import first
from tests.paths import ROOT

NODES = [d.body for d in read_documents([str(ROOT / "tests" / "data" / "nodes")])[0]]


@pytest.mark.parametrize("node", NODES, ids=lambda n: n["metadata"]["name"])
def test_slot_units_add_up_to_the_node_facts(node):
    capacity = node_capacity(node, DEFAULT_SETTINGS)
    assert capacity.gpu_equivalents == node_facts(node, DEFAULT_SETTINGS).gpu_equivalents


def test_mig_plus_time_slicing_is_not_128_gpus():
    node = first("nodes/issue-bottlerocket-4418__mig-plus-timeslicing-gpu-shared.yaml")
    capacity = node_capacity(node, DEFAULT_SETTINGS)
    assert capacity.allocatable == {"nvidia.com/gpu": 0, "nvidia.com/gpu.shared": 128}
    assert capacity.gpu_equivalents is None  # replicas per GPU unknown: not guessed
    assert capacity.whole == {"nvidia.com/gpu"} and capacity.allocatable["nvidia.com/gpu"] == 0
    told = GPUSettings(shared_replicas=(("nvidia.com/gpu.shared", 16),))
    # 8 GPUs x 4 MIG partitions x 4 replicas: each replica is 1/16 of a GPU
    assert node_capacity(node, told).gpu_equivalents == 8


def test_mig_only_node_with_zero_whole_gpus():
    node = first("nodes/issue-viewalloc-258__h100-mixed-mig-no-whole-gpu.yaml")
    capacity = node_capacity(node, DEFAULT_SETTINGS)
    assert capacity.allocatable["nvidia.com/gpu"] == 0
    assert capacity.mig_profiles == {"nvidia.com/mig-1g.12gb": "1g.12gb",
                                     "nvidia.com/mig-2g.24gb": "2g.24gb",
                                     "nvidia.com/mig-3g.47gb": "3g.47gb"}
    # 2 x 1/7 + 2/7 + 3/7: one H100's worth of slices
    assert capacity.gpu_equivalents == 1


def test_whole_gpus_next_to_mig_slices_count_once():
    node = first("nodes/issue-gpuop-637__a100-mixed-gpu-and-mig-allocatable.yaml")
    capacity = node_capacity(node, DEFAULT_SETTINGS)
    assert capacity.whole == {"nvidia.com/gpu"}
    assert capacity.gpu_equivalents == 2 + Fraction(6, 7) + Fraction(8, 7)


def test_corpus_nodes_scan():
    documents = [Document("nodes", i, None, n) for i, n in enumerate(NODES)]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "orphan", "namespace": "a"},
           "spec": {"nodeName": "not-in-snapshot",
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
           "status": {"phase": "Running"}}
    settings = AuditSettings(now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    report = assemble(scan([*documents, Document("pods", 0, None, pod)], settings, None))
    stranded = {s["node"]: s["reasons"] for s in report["stranded"]}
    # the only GPU pod has no toleration, so the tainted kwok node's GPUs are out of reach
    assert stranded == {"gpu-node-a100-mig-invalid-01": ["mig-invalid"],
                        "nvs-kwok-node-001": ["untolerated-taint (nvidia.com/gpu=true:NoSchedule)"]}
    assert report["cluster"]["gpu_equivalents"]["nodes_unknown"] == ["gpu-node-p5-01"]
    # the nodes' own warnings are warnings of the audit too (one list that every count reads)
    assert [w for w in report["warnings"] if w.startswith("Node ")] == [
        f"Node {n['name']}: {w}" for n in report["nodes"] for w in n["warnings"]]
    assert [w for w in report["warnings"] if not w.startswith("Node ")] == [
        "1 GPU pod(s) run on 1 node(s) missing from the snapshot (not-in-snapshot): their 2 "
        "GPU-equivalent(s) are valued from the pods' requests alone and counted in the teams and "
        "workloads and as on_missing_nodes in the summary, not in the cluster's allocatable or "
        "allocated",
        # the reporter's site-specific counters (gpu-operator#637): not GPUs gpuguard knows
        "example.org/gpu-count: unrecognized accelerator resource, counted as no GPU (1 "
        "object(s): Node gpu-node-a100-mixed-01); --gpu-resource example.org/gpu-count counts it "
        "as whole devices",
        "example.org/gpu-mem: unrecognized accelerator resource, counted as no GPU (1 "
        "object(s): Node gpu-node-a100-mixed-01); --gpu-resource example.org/gpu-mem counts it as "
        "whole devices"]
    assert report["summary"]["gpu_equivalents"]["allocated"] == 0.0  # only known nodes count
    assert report["teams"][0]["gpu_equivalents"]["allocated"] == 2.0  # the team still pays


@pytest.mark.parametrize("toleration, taint, expected", [
    (("nvidia.com/gpu", "Exists", "", "NoSchedule"), ("nvidia.com/gpu", "true", "NoSchedule"),
     True),
    (("nvidia.com/gpu", "Exists", "", ""), ("nvidia.com/gpu", "x", "NoExecute"), True),
    (("", "Exists", "", ""), ("anything", "x", "NoSchedule"), True),
    (("nvidia.com/gpu", "Equal", "present", "NoSchedule"),
     ("nvidia.com/gpu", "true", "NoSchedule"), False),
    (("nvidia.com/gpu", "Equal", "true", "NoExecute"), ("nvidia.com/gpu", "true", "NoSchedule"),
     False),
])
def test_tolerations(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected
    assert untolerated([toleration], [taint]) == ([] if expected else [taint])


def test_node_affinity_operators():
    labels = {"zone": "a", "gpus": "8"}
    assert selects((("zone", "a"),), None, labels, "n1")
    assert not selects((("zone", "b"),), None, labels, "n1")
    term = ((("gpus", "Gt", ("4",)), ("zone", "NotIn", ("c",)), ("spot", "DoesNotExist", ())),
            ())
    assert selects((), (term,), labels, "n1")
    assert not selects((), (((("gpus", "Lt", ("4",)),), ()),), labels, "n1")
    by_name = ((), (("metadata.name", "In", ("n2",)),))
    assert selects((), (term, by_name), labels, "n2")  # terms are ORed
    assert not selects((), (((), ()),), labels, "n1")  # an empty term matches nothing


def test_pod_requests_follow_kubernetes():
    reader = PodReader(DEFAULT_SETTINGS)
    spec = {
        "initContainers": [
            {"name": "setup", "resources": {"requests": {"cpu": "3"}}},
            {"name": "sidecar", "restartPolicy": "Always",
             "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}},
        ],
        "containers": [{"name": "app", "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                                     "limits": {"nvidia.com/gpu": 1}}}],
        "overhead": {"cpu": "250m"},
    }
    usage = reader.template(spec, {}, "ns")
    # app 1 + sidecar 0.5 (limit stands in for the request) = 1.5 vs the init peak 3: 3 + 0.25
    assert usage.cpu_millicores == 3250
    assert usage.memory_bytes == 3 << 30
    assert usage.requests == {"nvidia.com/gpu": 1}
    assert reader.template(spec, {}, "ns") is usage  # replicas share the analysis
    assert reader.computed == 1


def test_ownership_rolls_up_while_owners_are_present():
    owners = Ownership()
    deployment = ObjectKey("ns", "apps", "Deployment", "web")
    replicaset = ObjectKey("ns", "apps", "ReplicaSet", "web-abc")
    pod = ObjectKey("ns", "", "Pod", "web-abc-x")
    owners.record(pod, replicaset)
    assert owners.root(pod) == replicaset  # the ReplicaSet is not in the input (yet)
    owners.record(replicaset, deployment)
    owners.record(deployment, None)
    assert owners.root(pod) == deployment
    assert owners.chain(pod) == [pod, replicaset, deployment]
    loop = ObjectKey("ns", "x", "Loop", "a")
    owners.record(loop, ObjectKey("ns", "x", "Loop", "b"))
    owners.record(ObjectKey("ns", "x", "Loop", "b"), loop)
    assert owners.root(loop).name in ("a", "b")  # no endless loop


def test_pods_kept_as_entries_still_roll_up_and_tell_duplicates():
    """Pods are recorded as a hash -> controller entry, not as keys: a pod read twice is told
    (the first copy counts), its controller key is one shared object, and an object owned by a
    pod rolls up through it only as a LeaderWorkerSet's workers' StatefulSet does (anything
    else naming a pod as its controller is its own workload)."""
    from audit.scan.ownership import ObjectKey, Ownership

    ownership = Ownership()
    deployment = ObjectKey("ml", "apps", "Deployment", "train")
    replicaset = ObjectKey("ml", "apps", "ReplicaSet", "train-7c9d8")
    ownership.record(deployment, None)
    ownership.record(replicaset, deployment)
    first = ownership.record_pod("ml", "train-7c9d8-a", ObjectKey(*_fields(replicaset)))
    second = ownership.record_pod("ml", "train-7c9d8-b", ObjectKey(*_fields(replicaset)))
    assert first == replicaset and second is first  # one key object per controller
    assert ownership.record_pod("ml", "train-7c9d8-a", replicaset) is False
    assert ownership.record_pod("other", "train-7c9d8-a", replicaset) == replicaset
    pod = ObjectKey("ml", "", "Pod", "train-7c9d8-a")
    assert ownership.present(pod)
    assert ownership.root(pod) == deployment
    owned_by_pod = ObjectKey("ml", "example.com", "Sidecar", "s")
    ownership.record(owned_by_pod, pod)
    assert ownership.root(owned_by_pod) == owned_by_pod
    assert ownership.pod_owned() == [(owned_by_pod, pod)]
    lws = ObjectKey("ml", "leaderworkerset.x-k8s.io", "LeaderWorkerSet", "vllm")
    leaders = ObjectKey("ml", "apps", "StatefulSet", "vllm")
    workers = ObjectKey("ml", "apps", "StatefulSet", "vllm-0")
    leader = ObjectKey("ml", "", "Pod", "vllm-0")
    ownership.record(lws, None)
    ownership.record(leaders, lws)
    ownership.record_pod("ml", "vllm-0", leaders)
    ownership.record(workers, leader)
    assert ownership.chain(workers) == [workers, leader, leaders, lws]
    misnamed = ObjectKey("ml", "apps", "StatefulSet", "other")
    ownership.record(misnamed, leader)  # not the name the LeaderWorkerSet controller gives
    assert ownership.root(misnamed) == misnamed
    assert ownership.pod_owned() == [(owned_by_pod, pod), (misnamed, leader)]
    # a LeaderWorkerSet of another API group is not the one whose leader pods own workers
    forged = ObjectKey("ml", "evil.io", "LeaderWorkerSet", "x")
    ownership.record(forged, None)
    ownership.record(ObjectKey("ml", "apps", "StatefulSet", "x"), forged)
    ownership.record_pod("ml", "x-0", ObjectKey("ml", "apps", "StatefulSet", "x"))
    workers_x = ObjectKey("ml", "apps", "StatefulSet", "x-0")
    ownership.record(workers_x, ObjectKey("ml", "", "Pod", "x-0"))
    assert ownership.root(workers_x) == workers_x
    bare = ObjectKey("ml", "", "Pod", "debug")
    assert ownership.record_pod("ml", "debug", None) is None
    assert ownership.root(bare) == bare


def _fields(key):
    return (key.namespace, key.group, key.kind, key.name)
