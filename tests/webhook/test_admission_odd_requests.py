"""Requests a fresh-context trial sent that the built-in library must judge, not let through or
crash on (issue 20's trial, 2026-12-04).

- A custom resource whose kind has a built-in kind's name (``example.com/v1 Deployment`` served
  as ``mydeploys``) and holds a privileged GPU pod template was allowed by every policy: the
  workload reader picked the built-in reader by kind name, and the rule that judges kinds the
  registry does not model counted only objects found by the structural search.
- A lone surrogate escape in ``request.name`` or ``request.namespace`` (the standard library
  decodes it; orjson refuses it) made the authorizer's state encoding raise: the evaluation fell
  to the failurePolicy fallback with a TypeError; it is now a per-policy error naming the field,
  as for ``request.uid``.
- ``subResource: 5``, ``resource.resource: 5``, ``kind: []`` were read as text or as no kind;
  each is now a 400 naming the field, as other fields of the wrong type are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from typing import Any

import pytest

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from policies.facts.resource_names import GPUSettings
from tests.paths import ROOT
from webhook.admission import Admitter, Decision, Endpoint
from webhook.metrics import Metrics
from webhook.policy_store import PolicyStore
from webhook.settings import ServerSettings
from webhook.wire import decode_envelope

POD_SPEC = {"containers": [{"name": "c", "image": "cuda", "securityContext": {
    "privileged": True}, "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}


@pytest.fixture(scope="module")
def admitter() -> Any:
    store = PolicyStore(None, functools.partial(policy_set.load, settings=GPUSettings()))
    store.load()
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        yield Admitter(store, StaticNamespaces({}, "none"), ServerSettings(), Metrics(),
                       executor)


def _admit(admitter: Admitter, body: bytes) -> Decision:
    return asyncio.run(admitter.admit(decode_envelope(body, max_depth=100), Endpoint.VALIDATE))


def _custom(kind: str, resource: str, spec: dict) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {
                           "uid": f"u-{kind}", "operation": "CREATE", "namespace": "team-llm",
                           "kind": {"group": "example.com", "version": "v1", "kind": kind},
                           "resource": {"group": "example.com", "version": "v1",
                                        "resource": resource},
                           "userInfo": {"username": "alice", "groups": ["dev"]},
                           "object": {"apiVersion": "example.com/v1", "kind": kind,
                                      "metadata": {"name": "x", "namespace": "team-llm"},
                                      "spec": spec}}}).encode()


@pytest.mark.parametrize(("kind", "resource", "spec"), [
    ("Trainer", "trainers", {"template": {"spec": POD_SPEC}}),
    ("Deployment", "mydeploys", {"template": {"spec": POD_SPEC}}),
    ("Job", "trainingjobs", {"template": {"spec": POD_SPEC}}),
    ("StatefulSet", "trainers", {"template": {"spec": POD_SPEC}}),
    ("Pod", "trainers", POD_SPEC),
])
def test_a_custom_resource_named_like_a_built_in_kind_is_judged(admitter, kind, resource, spec):
    decision = _admit(admitter, _custom(kind, resource, spec))
    assert not decision.allowed and decision.fallback is None
    assert "no-privileged-gpu" in decision.denied_by, decision.denied_by


@pytest.mark.parametrize("field", ["name", "namespace"])
def test_a_lone_surrogate_in_the_request_names_the_field(admitter, field):
    base = json.dumps(json.loads((ROOT / "examples" / "admission" / "gpu-pod-review.json")
                                 .read_text()), separators=(",", ":"))
    value = {"name": '"name":"cuda-vector-add"', "namespace": '"namespace":"team-llm"'}[field]
    assert value in base
    decision = _admit(admitter, base.replace(value, f'"{field}":"\\ud800"', 1).encode())
    assert not decision.allowed and decision.fallback is None
    assert f"request.{field}: text with a lone UTF-16 surrogate" in decision.message


@pytest.mark.parametrize(("fields", "expected"), [
    ({"subResource": 5}, "request.subResource: expected a string, got the number 5"),
    ({"resource": {"group": "", "version": "v1", "resource": 5}},
     "request.resource.resource: expected a string, got the number 5"),
    ({"resource": "pods"}, "request.resource: expected an object with group, version and "
                           "resource, got"),
    ({"kind": []}, "request.kind: expected an object with group, version and kind, got"),
    ({"kind": 0}, "request.kind: expected an object with group, version and kind, got"),
    ({"kind": {"group": "", "version": "v1", "kind": ["Pod"]}},
     "request.kind.kind: expected a string"),
])
def test_kind_resource_and_subresource_of_the_wrong_type_are_a_400(admitter, fields, expected):
    from webhook.wire import WireError

    review = json.loads((ROOT / "examples" / "admission" / "gpu-pod-review.json").read_text())
    review["request"].update(fields)
    with pytest.raises(WireError) as caught:
        _admit(admitter, json.dumps(review).encode())
    assert caught.value.status == 400 and caught.value.message.startswith(expected), \
        caught.value.message
