"""Where the webhook evaluates policy sets that use ``authorizer``: on the event loop while the
authorizer answers from its cache, in the thread pool when a check needs a review.

The verdict must be the authorizer's own answer in every case: an evaluation on the loop that
met a check without a cached answer is thrown away, never answered with its placeholder.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from kube.subject_access_reviews import SubjectAccessReviewAuthorizer
from policies.authorization import Attributes, Decision, Verdict
from policies.facts.resource_names import GPUSettings
from tests.fakes.fake_timer import ManualTimer
from tests.fakes.webhook_harness import gpu_policy, write_policies
from webhook.admission import Admitter, Endpoint
from webhook.metrics import Metrics
from webhook.policy_store import PolicyStore
from webhook.settings import ServerSettings
from webhook.wire import decode_envelope

CHECK = ("authorizer.group('').resource('pods').namespace('team-a').check('create')"
         ".allowed()")


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A one-thread pool that counts the evaluations handed to it and the threads they ran on."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0
        self.threads: list[int] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any,  # type: ignore[override]
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.submitted += 1

        def run() -> Any:
            self.threads.append(threading.get_ident())
            return fn(*args, **kwargs)
        return super().submit(run)


class Reviews:
    """The SubjectAccessReviews an API server would answer: allowed for ``allowed`` users."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.threads: list[int] = []

    def create(self, body: Any) -> dict[str, Any]:
        self.threads.append(threading.get_ident())
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


def admitter(tmp_path: Path, authorizer: Any,
             executor: concurrent.futures.Executor) -> Admitter:
    path = write_policies(tmp_path, gpu_policy("may-create-pods", {
        "match": {"resources": ["pods"]},
        "validations": [{"expression": CHECK, "message": "may not create pods"}]}))
    store = PolicyStore([str(path)], functools.partial(policy_set.load, settings=GPUSettings()))
    store.load()
    assert store.current is not None and store.current.engine.uses_authorizer
    # A timer that never moves: on a loaded machine the real clock ran an inline evaluation
    # past its 10 ms slice and handed it to the pool (pool.submitted 3, not 2).
    return Admitter(store, StaticNamespaces({}, "none"), ServerSettings(), Metrics(), executor,
                    authorizer=authorizer, timer=ManualTimer())


def body(user: str) -> bytes:
    import json
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {
                           "uid": f"uid-{user}", "operation": "CREATE", "namespace": "team-a",
                           "kind": {"group": "", "version": "v1", "kind": "Pod"},
                           "resource": {"group": "", "version": "v1", "resource": "pods"},
                           "userInfo": {"username": user, "groups": []},
                           "object": {"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {"name": "p", "namespace": "team-a"},
                                      "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
                      ).encode()


def decide(admit: Admitter, user: str) -> tuple[bool, str]:
    envelope = decode_envelope(body(user), max_depth=100)
    decision = asyncio.run(admit.admit(envelope, Endpoint.VALIDATE))
    assert decision.fallback is None
    return decision.allowed, decision.message


def test_a_review_runs_in_the_pool_and_its_cached_answer_on_the_loop(tmp_path: Path) -> None:
    reviews = Reviews({"alice"})
    authorizer = SubjectAccessReviewAuthorizer(reviews.create, clock=lambda: 100.0)
    pool = CountingExecutor()
    try:
        admit = admitter(tmp_path, authorizer, pool)
        # First request of each user: no cached answer, so the pool evaluates (and reviews).
        assert decide(admit, "alice") == (True, "")
        assert decide(admit, "mallory") == (False, "may-create-pods: may not create pods")
        assert (pool.submitted, authorizer.reviews) == (2, 2)
        assert set(reviews.threads) == set(pool.threads)
        assert threading.get_ident() not in reviews.threads  # never a review on the loop
        # Again: both answers are cached, so the loop decides, the same way, with no review.
        assert decide(admit, "alice") == (True, "")
        assert decide(admit, "mallory") == (False, "may-create-pods: may not create pods")
        assert (pool.submitted, authorizer.reviews) == (2, 2)
    finally:
        pool.shutdown(wait=True)


def test_an_expired_answer_is_reviewed_again_in_the_pool(tmp_path: Path) -> None:
    now = [100.0]
    reviews = Reviews({"alice"})
    authorizer = SubjectAccessReviewAuthorizer(reviews.create, clock=lambda: now[0])
    pool = CountingExecutor()
    try:
        admit = admitter(tmp_path, authorizer, pool)
        assert decide(admit, "alice") == (True, "")
        reviews.allowed.clear()  # the RoleBinding is removed
        now[0] += authorizer.settings.allowed_ttl_s + 1
        assert decide(admit, "alice") == (False, "may-create-pods: may not create pods")
        assert (pool.submitted, authorizer.reviews) == (2, 2)
    finally:
        pool.shutdown(wait=True)


class Blocking:
    """An authorizer without ``cached``: every check may block."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def authorize(self, attributes: Attributes) -> Decision:
        self.threads.append(threading.get_ident())
        return Decision(Verdict.ALLOW, "")


@pytest.mark.parametrize("repeat", [1, 3])
def test_an_authorizer_without_a_cache_is_always_asked_in_the_pool(tmp_path: Path,
                                                                    repeat: int) -> None:
    authorizer = Blocking()
    pool = CountingExecutor()
    try:
        admit = admitter(tmp_path, authorizer, pool)
        for _ in range(repeat):
            assert decide(admit, "alice") == (True, "")
        assert pool.submitted == repeat
        assert threading.get_ident() not in authorizer.threads
    finally:
        pool.shutdown(wait=True)
