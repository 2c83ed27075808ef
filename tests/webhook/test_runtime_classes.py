"""The library's runtimeClass mutation applies only where the cluster has that RuntimeClass
(issue 16 item 5): kube-apiserver refuses a pod naming a RuntimeClass that does not exist, and
GKE has no ``nvidia`` class. Before, ``add-gpu-toleration-and-runtimeclass`` added
``runtimeClassName: nvidia`` to every NVIDIA GPU template, whatever the cluster had.

The webhook reads the names from its RuntimeClass watch (:mod:`kube.runtime_classes`; the watch
itself is tested against a real API server in tests/controlplane/test_watches.py); here the
Admitter is given them as the watch gives them, including "not known yet" (None)."""

from __future__ import annotations

import json

import pytest

from tests.fakes.webhook_harness import JSON, Harness, envelope, patch_of

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g", "namespace": "ml"},
       "spec": {"containers": [{"name": "c", "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
REQUEST = {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"},
           "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "alice"},
           "object": POD}
TOLERATION = {"op": "add", "path": "/spec/tolerations",
              "value": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
RUNTIME_CLASS = {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}


@pytest.mark.asyncio
@pytest.mark.parametrize(("classes", "patch"), [
    (frozenset({"gvisor"}), [TOLERATION]),  # GKE-like: no nvidia class (before: both ops)
    (frozenset(), [TOLERATION]),
    (frozenset({"nvidia", "gvisor"}), [TOLERATION, RUNTIME_CLASS]),
    (None, [TOLERATION, RUNTIME_CLASS]),  # the watch has not listed yet: as written
])
async def test_the_mutation_sets_only_a_runtime_class_the_cluster_has(aiohttp_client, classes,
                                                                      patch):
    harness = Harness(None)
    harness.admitter.runtime_classes = lambda: classes
    try:
        client = await aiohttp_client(harness.app)
        response = await client.post("/mutate", data=json.dumps(envelope(REQUEST)), headers=JSON)
        body = await response.json()
        assert response.status == 200 and body["response"]["allowed"]
        assert patch_of(body) == patch
    finally:
        harness.close()
