"""Every paginated list of gpuguard's caches goes through :func:`kube.lists.fetch_pages`: the
namespace, pod and gpuguard.io-object caches honour Retry-After on 429 and start again on an
expired continue token (410) as the audit's lister does, and a stopping cache ends a wait.

Driven through the official client against the local fake kube-apiserver
(tests/fakes/fake_kube_api.py: pagination, 410 on a continue token, 429 with Retry-After). Waits
are recorded, never slept; nothing is timed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from audit.sources.files import iter_snapshot
from kube.connect import connect
from kube.lists import (
    ListCancelled,
    ListStats,
    NotServed,
    call_pages,
    fetch_pages,
    leave_status_retries_to_lists,
)
from kube.namespaces import NamespaceWatch
from kube.pod_cache import PodCache
from kube.policy_objects import GROUP, RESOURCES, VERSION, list_policy_objects
from policies.sources import Document
from tests.fakes.fake_kube_api import FakeKubeAPI
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
WAIT_S = 60.0  # upper bound of every wait; never an assertion about speed


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return [d.body for d in iter_snapshot([str(EXAMPLE)]) if isinstance(d, Document)]


def client(api: FakeKubeAPI, tmp_path: Path) -> k8s_client.ApiClient:
    return connect(str(api.kubeconfig(tmp_path / "kubeconfig")), None).api_client


def test_typed_client_lists_wait_retry_after_and_start_again_after_410(objects, tmp_path):
    example_pods = sum(1 for o in objects if o.get("kind") == "Pod")
    waits: list[float] = []
    with FakeKubeAPI(objects, expire={"/api/v1/pods"}, throttle={"/api/v1/pods": 2},
                     retry_after="3") as api:
        api_client = client(api, tmp_path)
        leave_status_retries_to_lists(api_client)  # as every cache does when it is made
        core = k8s_client.CoreV1Api(api_client)
        pods: list[dict] = []
        stats = ListStats()
        for page in call_pages(core.list_pod_for_all_namespaces, "pods", page_size=7,
                               sleep=waits.append, stats=stats, on_restart=pods.clear):
            pods.extend(page["items"])
        queries = [q for _, path, q in api.requests if path == "/api/v1/pods"]
    assert waits == [3.0, 3.0]  # the two 429 answers, each waited as Retry-After said
    assert stats.relists == 1 and "410 Gone" in stats.notes[0]
    names = [p["metadata"]["name"] for p in pods]
    assert len(names) == len(set(names)) == example_pods  # the first page dropped, not doubled
    assert stats.resource_version == "1000"
    # 2 throttled, page 1, the expired continue, then all pages from the start
    assert len(queries) == 2 + 1 + 1 + -(-example_pods // 7)


def test_a_stopping_cache_cancels_the_wait_instead_of_listing_again():
    stop = threading.Event()
    stop.set()
    asked: list[str | None] = []

    def throttled(token: str | None) -> dict:
        asked.append(token)
        raise ApiException(status=429, reason="Too Many Requests")

    with pytest.raises(ListCancelled, match=r"^pods: stopped while waiting"):
        list(fetch_pages(throttled, "pods", sleep=stop.wait))
    assert asked == [None]  # asked once; no 30 quick retries when stopping


def test_pod_cache_lists_through_throttling_and_an_expired_continue(objects, tmp_path):
    with FakeKubeAPI(objects) as api:
        plain = PodCache(client(api, tmp_path), page_size=7)
        plain._list()
        expected = len(plain.index)
    with FakeKubeAPI(objects, expire={"/api/v1/pods"}, throttle={"/api/v1/pods": 1}) as api:
        cache = PodCache(client(api, tmp_path), page_size=7)
        version = cache._list()
    assert expected > 0
    assert len(cache.index) == expected
    assert version == "1000" and cache.synced.is_set()


def test_namespace_watch_lists_through_throttling(objects, tmp_path):
    example = {o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace"}
    with FakeKubeAPI(objects, throttle={"/api/v1/namespaces": 2}) as api:
        watch = NamespaceWatch(client(api, tmp_path), page_size=2)
        namespaces, version = watch._list()
        calls = [path for _, path, _ in api.requests if path == "/api/v1/namespaces"]
    assert set(namespaces) == example and version == "1000"
    assert len(calls) == 2 + -(-len(example) // 2)


def test_policy_object_list_is_not_unreachable_when_throttled(objects, tmp_path):
    """Before: urllib3 retried the 429 itself, three times, and the list ended as 'cannot
    reach the API server' (exit 3) instead of waiting its turn."""
    path = f"/apis/{GROUP}/{VERSION}/{RESOURCES[0].plural}"
    with FakeKubeAPI(objects, throttle={path: 4}) as api:
        with pytest.raises(NotServed, match=f"^{RESOURCES[0].plural}.{GROUP}: not served"):
            list_policy_objects(client(api, tmp_path))
        calls = [p for _, p, _ in api.requests if p == path]
    assert len(calls) == 5  # four 429 waited out (Retry-After 0), then the 404: no CRD here
