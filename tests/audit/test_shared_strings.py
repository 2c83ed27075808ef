"""The audit keeps one string object per distinct label, resource name, namespace, API group and
kind, not one per object naming it (issue 20: memory of a million-pod audit).

Node labels and resource names, and the namespace / group / kind of object keys, outlive the
decoded objects; before they were interned each node and each controller key held its own copy
(119,000 duplicate strings, 6.8 MiB, in a 100k-pod / 5k-node audit).
"""

from __future__ import annotations

import json

from audit.scan.node_capacity import node_capacity
from audit.scan.ownership import controller_of, key_of
from policies.facts.resource_names import GPUSettings


def _node(name: str) -> dict:
    # Decoded from JSON text, as the audit reads it: equal strings, distinct objects.
    return json.loads(json.dumps({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true",
                                              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                              "nvidia.com/gpu.count": "8"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                   "capacity": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}}}))


def test_nodes_of_one_pool_share_their_label_and_resource_strings():
    first, second = (node_capacity(_node(n), GPUSettings()) for n in ("a-0", "a-1"))
    assert first.labels == second.labels  # the same content, read as before
    for key in first.labels:
        other = next(k for k in second.labels if k == key)
        assert other is key and second.labels[key] is first.labels[key], key
    assert next(iter(first.allocatable)) is next(iter(second.allocatable))
    assert first.allocatable == {"nvidia.com/gpu": 8} and first.facts.model == \
        second.facts.model


def test_the_input_node_is_not_changed():
    node = _node("a-0")
    before = json.dumps(node)
    node_capacity(node, GPUSettings())
    assert json.dumps(node) == before


def test_object_keys_share_namespace_group_and_kind():
    pods = [json.loads(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p-{i}", "namespace": "team-a", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}]}}))
        for i in range(2)]
    keys = [key_of(p) for p in pods]
    owners = [controller_of(p, k.namespace) for p, k in zip(pods, keys, strict=True)]
    assert keys[0].namespace is keys[1].namespace and keys[0].kind is keys[1].kind
    assert owners[0] == owners[1]
    assert owners[0].group is owners[1].group == "apps"
    assert owners[0].kind is owners[1].kind == "ReplicaSet"
    assert owners[0].namespace is keys[0].namespace == "team-a"
