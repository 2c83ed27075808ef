"""The webhook's SubjectAccessReview authorizer (kube/subject_access_reviews.py): the review it
posts, the decision it reads, its cache (injected clock) and its failures. The real API server
answers these reviews in tests/controlplane/test_authorizer_live.py; here the review is posted to
a function that can fail on demand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube.subject_access_reviews import (
    SARSettings,
    SubjectAccessReviewAuthorizer,
    decision_of,
    review_body,
)
from policies.authorization import Attributes, Subject, Verdict

ALICE = Subject("alice", "u-1", ("gpu-h100", "system:authenticated"), {"team": ("ml",)})
H100 = Attributes(ALICE, "use", resource_request=True, api_group="gpuguard.io",
                  resource="gpus", namespace="ml", name="NVIDIA-H100-80GB-HBM3")


@dataclass
class Reviews:
    """Stands in for the API's SubjectAccessReview endpoint where the test needs a fault or a
    count: answers ``status`` (or raises ``fault``) and keeps each posted body."""

    status: dict[str, Any] = field(default_factory=lambda: {"allowed": True, "reason": "ok"})
    fault: Exception | None = None
    posted: list[Mapping[str, Any]] = field(default_factory=list)

    def __call__(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.posted.append(body)
        if self.fault is not None:
            raise self.fault
        return {**body, "status": self.status}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_review_body_carries_the_user_and_every_attribute() -> None:
    selected = Attributes(ALICE, "list", resource_request=True, resource="pods",
                          subresource="log", namespace="ml", field_selector="spec.nodeName=n1",
                          label_selector="app=x")
    assert review_body(selected) == {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "uid": "u-1", "groups": ["gpu-h100", "system:authenticated"],
                 "extra": {"team": ["ml"]},
                 "resourceAttributes": {
                     "verb": "list", "group": "", "version": "*", "resource": "pods",
                     "subresource": "log", "namespace": "ml",
                     "fieldSelector": {"rawSelector": "spec.nodeName=n1"},
                     "labelSelector": {"rawSelector": "app=x"}}}}
    path = Attributes(Subject("bob"), "get", resource_request=False, path="/healthz")
    assert review_body(path)["spec"] == {
        "user": "bob", "groups": [], "nonResourceAttributes": {"path": "/healthz",
                                                               "verb": "get"}}


def test_status_mapping() -> None:
    assert decision_of({"status": {"allowed": True, "reason": "RBAC: allowed by x"}}).allowed
    denied = decision_of({"status": {"allowed": False, "denied": True, "reason": "no"}})
    assert (denied.verdict, denied.errored) == (Verdict.DENY, False)
    silent = decision_of({"status": {"allowed": False}})
    assert (silent.verdict, silent.reason, silent.errored) == (Verdict.NO_OPINION, "", False)
    failed = decision_of({"status": {"allowed": False, "evaluationError": "webhook down"}})
    assert failed.errored and failed.error == "webhook down"


def test_decisions_are_cached_per_key_until_the_ttl() -> None:
    reviews, clock = Reviews(), Clock()
    authorizer = SubjectAccessReviewAuthorizer(
        reviews, SARSettings(allowed_ttl_s=10, denied_ttl_s=2), clock=clock)
    assert authorizer.authorize(H100).allowed
    clock.now += 9.9
    assert authorizer.authorize(H100).allowed
    assert len(reviews.posted) == 1
    other = Attributes(ALICE, "use", resource_request=True, api_group="gpuguard.io",
                       resource="gpus", namespace="ml", name="NVIDIA-A100-SXM4-80GB")
    authorizer.authorize(other)
    assert len(reviews.posted) == 2  # another name is another key
    clock.now += 0.2
    authorizer.authorize(H100)
    assert len(reviews.posted) == 3  # expired
    reviews.status = {"allowed": False}
    bob = Attributes(Subject("bob"), "use", resource_request=True, resource="gpus")
    authorizer.authorize(bob)
    clock.now += 2.5
    authorizer.authorize(bob)
    assert len(reviews.posted) == 5  # denials have their own, shorter TTL


def test_cache_is_bounded_least_recently_used_first() -> None:
    reviews = Reviews()
    authorizer = SubjectAccessReviewAuthorizer(reviews, SARSettings(max_entries=2),
                                               clock=Clock())
    names = [Attributes(ALICE, "use", resource_request=True, resource="gpus", name=n)
             for n in ("a", "b", "c")]
    authorizer.authorize(names[0])
    authorizer.authorize(names[1])
    authorizer.authorize(names[0])  # a is now the most recently used
    authorizer.authorize(names[2])  # drops b
    assert len(authorizer) == 2
    authorizer.authorize(names[0])
    assert len(reviews.posted) == 3
    authorizer.authorize(names[1])
    assert len(reviews.posted) == 4


def test_failures_are_errored_decisions_and_not_cached() -> None:
    reviews = Reviews(fault=ApiException(status=403, reason="Forbidden"))
    authorizer = SubjectAccessReviewAuthorizer(reviews, clock=Clock())
    decision = authorizer.authorize(H100)
    assert (decision.verdict, decision.allowed) == (Verdict.NO_OPINION, False)
    assert decision.error == "SubjectAccessReview failed: 403 Forbidden"
    reviews.fault = ConnectionRefusedError(111, "Connection refused")
    assert "ConnectionRefusedError" in authorizer.authorize(H100).error
    reviews.fault = None
    assert authorizer.authorize(H100).allowed  # the failure was not kept
    assert len(reviews.posted) == 3


def test_the_engine_asks_it_even_with_an_empty_cache() -> None:
    """Regression (control-plane test): an authorizer with an empty cache has ``len() == 0``;
    the engine took it for "no authorizer" and every check errored."""
    from policies.facts.review import UserInfo
    from tests.core.test_authorizer import CHECK, engine
    from tests.core.test_authorizer import review as review_of

    reviews = Reviews()
    authorizer = SubjectAccessReviewAuthorizer(reviews, clock=Clock())
    assert len(authorizer) == 0
    verdict = engine(f"{CHECK}.allowed()").evaluate(
        review_of(UserInfo("alice", groups=("gpu-h100",))), authorizer=authorizer)
    assert verdict.allowed, verdict.message
    assert reviews.posted[0]["spec"]["resourceAttributes"]["name"] == "NVIDIA-H100-80GB-HBM3"
