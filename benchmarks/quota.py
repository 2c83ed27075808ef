"""Latency the quota check adds per admission (``python benchmarks/quota.py``).

- no conflicts: :class:`QuotaAdmission` over the in-memory ledger store (the arithmetic and the
  protocol, no network) with 2,000 pods in the watch index;
- API round-trip: the same over :class:`ConfigMapLedgerStore` against the local fake API (one GET
  + one PUT per admission through the ``kubernetes`` client), sequential;
- contention: 2 replicas x 16 threads against the fake API (409s and retries).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kube.config import detect
from kube.pod_cache import PodUsageIndex
from kube.quota_ledger import (
    ConfigMapLedgerStore,
    MemoryLedgerStore,
    QuotaAdmission,
    QuotaLedger,
)
from tests.core.test_quota import pod, quota, request
from tests.fakes.fake_ledger_api import FakeLedgerAPI


def _index() -> PodUsageIndex:
    index = PodUsageIndex(lambda ns: {"team": "team-a"})
    for i in range(2000):
        index.upsert(pod(f"run{i}", f"a-{i % 50}", limits={"nvidia.com/gpu": 1}))
    return index


def _per_call(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    team = quota(gpuEquivalents=10**9)
    index = _index()
    memory = QuotaAdmission([team], QuotaLedger(MemoryLedgerStore(), index, ttl_s=0.001),
                            index.namespace_labels)
    objs = [pod(f"p{i}", "a-1") for i in range(5000)]
    times = _per_call(lambda i: memory.admit(request(objs[i], f"u{i}")), 5000)
    print(f"no conflicts (in-memory ledger): median {statistics.median(times):.3f} ms, "
          f"p99 {sorted(times)[int(len(times) * .99)]:.3f} ms per admission")
    with FakeLedgerAPI() as api, tempfile.TemporaryDirectory() as tmp:
        cluster = detect(str(api.kubeconfig(Path(tmp) / "kubeconfig")))
        assert cluster is not None
        ledger = QuotaLedger(ConfigMapLedgerStore(cluster.api_client, "gpuguard"), index,
                             ttl_s=0.5)
        live = QuotaAdmission([team], ledger, index.namespace_labels)
        times = _per_call(lambda i: live.admit(request(objs[i], f"v{i}")), 500)
        print(f"API round-trip (fake API, GET+PUT): median {statistics.median(times):.3f} ms")
        replicas = [QuotaAdmission([team], QuotaLedger(
            ConfigMapLedgerStore(detect(str(Path(tmp) / "kubeconfig")).api_client, "gpuguard"),
            index, ttl_s=0.5, max_attempts=500), index.namespace_labels) for _ in range(2)]
        before = api.conflicts

        def one(i: int) -> float:
            start = time.perf_counter()
            replicas[i % 2].admit(request(objs[i], f"w{i}"))
            return (time.perf_counter() - start) * 1000
        with ThreadPoolExecutor(16) as pool:
            times = list(pool.map(one, range(1000)))
        print(f"contention (2 replicas x 16 threads): median {statistics.median(times):.2f} ms, "
              f"p99 {sorted(times)[990]:.2f} ms, {api.conflicts - before} conflicts / 1000")


if __name__ == "__main__":
    main()
