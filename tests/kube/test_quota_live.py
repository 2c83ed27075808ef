"""The quota ledger and pod cache through the real ``kubernetes`` client against a local fake API.

Two webhook replicas (two :class:`QuotaAdmission` instances, each with its own API client)
admit 1,000 pod creates from threads at once; the fake answers stale ConfigMap updates with 409.
No assertion depends on timing or thread scheduling: the replicas' race is made certain by the
fake (``read_together``), and the pod cache is waited on for the resourceVersion it applied
(:meth:`PodCache.wait_for`), with a generous bound.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from kube.config import detect
from kube.pod_cache import PodCache, PodUsageIndex
from kube.quota_ledger import ConfigMapLedgerStore, QuotaAdmission, QuotaLedger
from tests.core.test_quota import Clock, pod, quota, request
from tests.fakes.fake_ledger_api import FakeLedgerAPI

WAIT_S = 60.0  # upper bound of every wait; never an assertion about speed


def test_two_replicas_1000_concurrent_creates_never_exceed_the_limit(tmp_path) -> None:
    limit = 100
    team = quota(gpuEquivalents=limit)
    clock = Clock()
    index = PodUsageIndex(lambda ns: {"team": "team-a"})
    with FakeLedgerAPI() as api:
        api.read_together = 2  # the first two admissions read the same (absent) ledger
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        replicas = []
        for _ in range(2):
            cluster = detect(kubeconfig)
            assert cluster is not None
            cluster.api_client.configuration.connection_pool_maxsize = 32
            # A generous client timeout: a slow answer on a loaded machine is no failure here.
            store = ConfigMapLedgerStore(cluster.api_client, "gpuguard", timeout_s=WAIT_S)
            # Attempts enough that no admission gives up however the threads are scheduled.
            ledger = QuotaLedger(store, index, clock=clock, max_attempts=100_000, settle_s=5)
            replicas.append(QuotaAdmission([team], ledger, index.namespace_labels))
        barrier = threading.Barrier(32)
        local = threading.local()

        def create(i: int):
            if not getattr(local, "waited", False):
                local.waited = True
                barrier.wait()  # start together
            obj = pod(f"p{i}", "a-ns")
            return obj, replicas[i % 2].admit(request(obj, f"u{i}"))

        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(create, range(1000)))
        admitted = [obj for obj, d in results if d.allowed]
        denied = [d for _, d in results if not d.allowed]
        assert len(admitted) == limit  # never over, and the limit is reached
        assert all("uses 100 of 100 GPU-equivalents" in d.denials[0] for d in denied)
        assert api.conflicts > 0  # the replicas did race (at least those two)
        ledger = replicas[0].ledger
        reserved = ledger.reservations(team)
        assert len(reserved) == limit  # one reservation per admitted pod, none for denials
        assert {r.name for r in reserved.values()} == {o["metadata"]["name"] for o in admitted}
        # the pods appear in the watch; after the settle time the ledger empties: no leak
        for obj in admitted:
            index.upsert(obj)
        assert ledger.status(team).used.gpu_equivalents == limit
        clock.now += 5
        assert ledger.prune(team) == 0
        assert replicas[1].ledger.status(team).used.gpu_equivalents == limit
        assert not replicas[1].admit(request(pod("late", "a-ns"), "late")).allowed


def test_unreachable_api_denies_under_fail(tmp_path) -> None:
    with FakeLedgerAPI() as api:
        cluster = detect(str(api.kubeconfig(tmp_path / "kubeconfig")))
        assert cluster is not None
        api.down = True
        # A generous client timeout: the 503 must be what fails, not a slow answer.
        store = ConfigMapLedgerStore(cluster.api_client, "gpuguard", timeout_s=WAIT_S)
        ledger = QuotaLedger(store, PodUsageIndex())
        decision = QuotaAdmission([quota(scope={"cluster": {}})], ledger).admit(
            request(pod()))
        assert not decision.allowed and "503" in decision.denials[0]


def test_pod_cache_lists_watches_and_relists_after_410(tmp_path) -> None:
    with FakeLedgerAPI() as api:
        api.pods[("a", "running")] = {**pod("running", limits={"nvidia.com/gpu": 2}),
                                      "status": {"phase": "Running"}}
        api.pods[("a", "done")] = {**pod("done"), "status": {"phase": "Succeeded"}}
        cluster = detect(str(api.kubeconfig(tmp_path / "kubeconfig")))
        assert cluster is not None
        cache = PodCache(cluster.api_client, watch_timeout_s=2)
        team = quota(scope={"namespace": "a"})
        assert cache.status() == (False, "waiting for the first list of the cluster's pods")
        cache.start()
        try:
            assert cache.synced.wait(WAIT_S)
            assert cache.status() == (True, "watching (full pod lists so far: 1)")
            assert cache.usage(team).gpu_equivalents == 2 and len(cache.index) == 1
            version = api.push("ADDED", pod("new"))
            assert cache.wait_for(lambda: cache.resource_version == version, WAIT_S)
            assert cache.pod_usage("a", "new") is not None
            version = api.push("MODIFIED", {**pod("new"), "status": {"phase": "Failed"}})
            assert cache.wait_for(lambda: cache.resource_version == version, WAIT_S)
            assert cache.pod_usage("a", "new") is None
            assert cache.usage(team).gpu_equivalents == 2
            api.pods[("a", "listed")] = pod("listed")  # only a relist can see this one
            api.expire()
            assert cache.wait_for(lambda: cache.lists == 2, WAIT_S)
            assert cache.pod_usage("a", "listed") is not None
            assert cache.status() == (True, "watching (full pod lists so far: 2)")
        finally:
            cache.stop()
