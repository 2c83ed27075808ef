"""Requests no policy is written for: answered without building the review, same answer.

``Admitter.admit`` allows a request whose shape (resource, subresource, operation, kind) selects
no policy of the set — as the engine's selection cache knows from an earlier request of the
shape — without building its :class:`~policies.facts.review.ReviewInput` (issue 20's no-policy
path). These tests pin that the answer is the engine's (allowed, no patch, no warning), that the
request's checks still refuse a malformed request with the same 400, and that every request a
policy is written for is still evaluated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from policies.facts.resource_names import GPUSettings
from tests.fakes.fake_timer import ManualTimer
from tests.fakes.webhook_harness import gpu_policy, write_policies
from webhook.admission import Admitter, Decision, Endpoint
from webhook.metrics import Metrics
from webhook.policy_store import PolicyStore
from webhook.settings import ServerSettings
from webhook.wire import WireError, decode_envelope

POLICY = gpu_policy("at-most-one-gpu", {
    "match": {"resources": ["deployments"]},
    "validations": [{"expression": "gpu.count <= 1", "message": "at most 1 GPU"}]})
"""Written for Deployments: no policy is written for Pods (a kind the workload registry
models, so the match is decided by the shape) — the shortcut's case."""


@pytest.fixture
def admitter(tmp_path: Path) -> Any:
    store = PolicyStore([str(write_policies(tmp_path, POLICY))],
                        functools.partial(policy_set.load, settings=GPUSettings()))
    store.load()
    assert store.current is not None
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        yield Admitter(store, StaticNamespaces({}, "none"), ServerSettings(), Metrics(),
                       executor, timer=ManualTimer())


def _body(kind: str, *, gpus: int = 0, **request: Any) -> bytes:
    group, resource = {"Pod": ("", "pods"), "Deployment": ("apps", "deployments"),
                       "ConfigMap": ("", "configmaps")}[kind]
    pod_spec = {"containers": [{"name": "c", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": gpus}}}]}
    obj: dict[str, Any] = {"apiVersion": f"{group}/v1" if group else "v1", "kind": kind,
                           "metadata": {"name": "x", "namespace": "team-a"}}
    if kind == "Pod":
        obj["spec"] = pod_spec
    elif kind == "Deployment":
        obj["spec"] = {"template": {"spec": pod_spec}}
    else:
        obj["data"] = {"k": "v"}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u1", "operation": "CREATE", "namespace": "team-a",
                                   "kind": {"group": group, "version": "v1", "kind": kind},
                                   "resource": {"group": group, "version": "v1",
                                                "resource": resource},
                                   "userInfo": {"username": "alice", "groups": ["dev"]},
                                   "object": obj, **request}}).encode()


def _admit(admitter: Admitter, body: bytes, endpoint: Endpoint = Endpoint.VALIDATE) -> Decision:
    return asyncio.run(admitter.admit(decode_envelope(body, max_depth=100), endpoint))


def test_a_shape_no_policy_is_written_for_is_allowed_as_the_engine_allows_it(admitter):
    first = _admit(admitter, _body("Pod", gpus=2))
    assert first.review is not None  # the first of its shape: evaluated, which caches it
    for endpoint in (Endpoint.VALIDATE, Endpoint.MUTATE):
        again = _admit(admitter, _body("Pod", gpus=2), endpoint)
        assert again.review is None
        # The same answer as the evaluated one, field by field (review aside).
        fields = ("allowed", "decision", "message", "warnings", "audit_annotations", "patch",
                  "denied_by", "policy_outcomes", "fallback", "policy_set")
        assert [getattr(again, f) for f in fields] == [getattr(first, f) for f in fields]
        assert (again.allowed, again.decision, again.patch) == (True, "allowed", ())


def test_a_malformed_request_of_such_a_shape_is_still_refused_with_the_same_400(admitter):
    _admit(admitter, _body("Pod", gpus=2))  # the shape is known to select none
    refusals = {
        "request.userInfo.groups: expected a list": {"userInfo": {"groups": "dev"}},
        "request.namespace: expected a string": {"namespace": 7},
        "request.operation: expected one of": {"operation": "PATCH"},
        "request.object: expected an object or null": {"object": [1]},
    }
    for expected, fields in refusals.items():
        with pytest.raises(WireError) as caught:
            _admit(admitter, _body("Pod", gpus=2, **fields))
        assert caught.value.status == 400 and expected in caught.value.message, fields


def test_a_shape_a_policy_is_written_for_is_evaluated_every_time(admitter):
    _admit(admitter, _body("Pod", gpus=2))
    for gpus, allowed in ((1, True), (2, False), (1, True)):
        decision = _admit(admitter, _body("Deployment", gpus=gpus))
        assert decision.review is not None and decision.allowed is allowed, gpus
    # The same kind under another subresource or operation is its own shape.
    assert _admit(admitter, _body("Deployment", gpus=2, subResource="status")).decision == \
        "not_evaluated"
    denied = _admit(admitter, _body("Deployment", gpus=2, operation="UPDATE",
                                    oldObject={"apiVersion": "apps/v1",
                                               "kind": "Deployment", "metadata": {"name": "x"}}))
    assert not denied.allowed and "at most 1 GPU" in denied.message


def test_a_kind_the_registry_does_not_model_is_evaluated_every_time(tmp_path: Path):
    """A GPUPolicy written for pods also judges kinds the workload registry does not model by
    their object (a custom resource holding a pod template): a ConfigMap is such a kind, so its
    requests are never answered by shape alone."""
    store = PolicyStore([str(write_policies(tmp_path, gpu_policy("pods", {
        "match": {"resources": ["pods"]}, "validations": [{"expression": "gpu.count <= 1"}]})))],
        functools.partial(policy_set.load, settings=GPUSettings()))
    store.load()
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        admitter = Admitter(store, StaticNamespaces({}, "none"), ServerSettings(), Metrics(),
                            executor, timer=ManualTimer())
        for _ in range(3):
            decision = _admit(admitter, _body("ConfigMap"))
            assert decision.allowed and decision.review is not None
