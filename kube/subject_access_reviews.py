"""The webhook's ``authorizer``: SubjectAccessReviews for the request's user, cached.

Owns :class:`SubjectAccessReviewAuthorizer`, the :class:`~policies.authorization.Authorizer` the
webhook injects into the engine: each CEL ``check(verb)`` becomes a
``authorization.k8s.io/v1`` SubjectAccessReview (``spec.user``, ``groups``, ``uid``, ``extra`` of
the request's ``userInfo`` or of ``serviceAccount(ns, name)``; ``resourceAttributes`` with
``version: "*"`` as authz.go sets it, or ``nonResourceAttributes``), so the API server's own
authorizer chain (RBAC, Node, webhooks) decides, as for a ValidatingAdmissionPolicy.

* Cache: per decision key (subject + every attribute), allowed and denied answers kept for
  :attr:`SARSettings.allowed_ttl_s` / :attr:`SARSettings.denied_ttl_s` on the injected monotonic
  clock, at most :attr:`SARSettings.max_entries` (least recently used dropped first). Errored
  answers are not cached: the next request asks again.
* Failure: a review that cannot be made (API unreachable, timeout, 403 because gpuguard's
  service account lacks ``create subjectaccessreviews``) and a status with ``evaluationError``
  that is not allowed are an *errored* decision (no opinion, ``error()`` the cause), as
  Kubernetes reports an authorizer error; the engine then applies the policy's failurePolicy.

Status mapping (the webhook authorizer's, ``k8s.io/apiserver/plugin/pkg/authorizer/webhook``):
``allowed`` → allow, ``denied`` → deny, neither → no opinion; ``reason`` kept. Blocking: call
``authorize`` off the event loop; ``cached`` never blocks (the webhook evaluates on its event
loop with cached answers, and in its thread pool when one is missing).
Only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from policies.authorization import Attributes, Decision, Verdict

CreateReview = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""Posts a SubjectAccessReview (a dict) and returns the created object as a dict; raises on
failure."""


@dataclass(frozen=True)
class SARSettings:
    """Cache and call limits of the SubjectAccessReviews (built once by ``gpuguard serve``).

    Attributes:
        allowed_ttl_s / denied_ttl_s: seconds an allow / a deny or no-opinion is reused (the
            API server's webhook authorizer defaults to 300 s / 30 s; shorter here so a
            RoleBinding change shows within seconds).
        max_entries: decisions kept at most.
        timeout_s: seconds one review may take (the admission deadline bounds it too).
    """

    allowed_ttl_s: float = 10.0
    denied_ttl_s: float = 10.0
    max_entries: int = 10_000
    timeout_s: float = 2.0


def review_body(attributes: Attributes) -> dict[str, Any]:
    """The SubjectAccessReview for ``attributes`` (authorization.k8s.io/v1)."""
    subject = attributes.subject
    spec: dict[str, Any] = {"user": subject.username, "groups": list(subject.groups)}
    if subject.uid:
        spec["uid"] = subject.uid
    if subject.extra:
        spec["extra"] = {k: list(v) for k, v in subject.extra.items()}
    if attributes.resource_request:
        resource: dict[str, Any] = {
            "verb": attributes.verb, "group": attributes.api_group,
            "version": attributes.api_version, "resource": attributes.resource}
        for key, value in (("subresource", attributes.subresource),
                           ("namespace", attributes.namespace), ("name", attributes.name)):
            if value:
                resource[key] = value
        if attributes.field_selector:
            resource["fieldSelector"] = {"rawSelector": attributes.field_selector}
        if attributes.label_selector:
            resource["labelSelector"] = {"rawSelector": attributes.label_selector}
        spec["resourceAttributes"] = resource
    else:
        spec["nonResourceAttributes"] = {"path": attributes.path, "verb": attributes.verb}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


def decision_of(review: Mapping[str, Any]) -> Decision:
    """The decision a created SubjectAccessReview's ``status`` gives."""
    status = review.get("status")
    status = status if isinstance(status, Mapping) else {}
    reason = str(status.get("reason") or "")
    if status.get("allowed") is True:
        return Decision(Verdict.ALLOW, reason)
    verdict = Verdict.DENY if status.get("denied") is True else Verdict.NO_OPINION
    return Decision(verdict, reason, str(status.get("evaluationError") or ""))


def api_create_review(api_client: k8s_client.ApiClient, timeout_s: float) -> CreateReview:
    """:data:`CreateReview` through the cluster's API client."""
    api = k8s_client.AuthorizationV1Api(api_client)

    def create(body: Mapping[str, Any]) -> Mapping[str, Any]:
        # The client serialises a dict body as it is (sanitize_for_serialization); its stubs
        # want the model class, which would only be converted back.
        created = api.create_subject_access_review(
            dict(body), _request_timeout=timeout_s)  # type: ignore[arg-type]
        result = api_client.sanitize_for_serialization(created)
        assert isinstance(result, dict)
        return result
    return create


class SubjectAccessReviewAuthorizer:
    """:class:`~policies.authorization.Authorizer` through SubjectAccessReviews; thread-safe.

    Args:
        create: posts a review (:func:`api_create_review`).
        settings: cache and timeout.
        clock: monotonic seconds (injected for tests).

    Attributes:
        reviews: reviews posted (cache misses), for metrics and tests.
    """

    def __init__(self, create: CreateReview, settings: SARSettings = SARSettings(), *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._create = create
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[object, ...], tuple[float, Decision]] = \
            collections.OrderedDict()
        self.reviews = 0

    def authorize(self, attributes: Attributes) -> Decision:
        """The cached or freshly reviewed decision; never raises (errored decision instead)."""
        found = self.cached(attributes)
        if found is not None:
            return found
        key = attributes.key()
        with self._lock:
            self.reviews += 1
        decision = self._review(attributes)
        if decision.errored:
            return decision
        ttl = self.settings.allowed_ttl_s if decision.allowed else self.settings.denied_ttl_s
        with self._lock:
            self._cache[key] = (self._clock() + ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self.settings.max_entries:
                self._cache.popitem(last=False)
        return decision

    def cached(self, attributes: Attributes) -> Decision | None:
        """The cached decision for ``attributes``, None when there is none or it expired; never
        posts a review, so it may be called on the event loop (``webhook/admission.py``
        evaluates there with these, and in the thread pool after a miss)."""
        key = attributes.key()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is None or hit[0] <= now:
                return None
            self._cache.move_to_end(key)
            return hit[1]

    def _review(self, attributes: Attributes) -> Decision:
        try:
            return decision_of(self._create(review_body(attributes)))
        except ApiException as exc:
            return Decision(Verdict.NO_OPINION, "",
                            f"SubjectAccessReview failed: {exc.status} {exc.reason}".strip())
        except Exception as exc:  # unreachable API, timeout, a bad answer: never fail open
            return Decision(Verdict.NO_OPINION, "",
                            f"SubjectAccessReview failed: {type(exc).__name__}: {exc}")

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
