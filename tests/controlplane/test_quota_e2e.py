"""The quota ledger (kube/quota_ledger.py, docs/quota.md) with two replicas behind one address.

Two ``gpuguard serve`` processes, each with its own pod watch and ledger client, sit behind a
round-robin TCP proxy (kube-proxy's part, :mod:`tests.controlplane.service_proxy`) registered
through deploy/base/webhooks.yaml. ``CREATES`` GPU pods of one GPU each are created through the
API server from ``CLIENTS`` threads at once, in namespaces sharing a 40 GPU-equivalent
``GPUQuota``. The API server holds exactly 40 afterwards, every other create was refused with
the quota's message, both replicas admitted some (they did race on the ledger's
resourceVersion), and the ledger holds a reservation for admitted pods only, all of which drop
once the watch shows the pods.

Size: 500 creates with 32 client threads; on a 2-core machine shared with the API server, etcd
and both replicas they take tens of seconds, not minutes.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from kube.pod_cache import PodCache, PodUsageIndex
from kube.quota_ledger import ConfigMapLedgerStore, QuotaLedger
from policies.policy.loader import load_quotas
from tests.controlplane.cluster import ControlPlane, wait_until
from tests.controlplane.service_proxy import RoundRobinProxy
from tests.controlplane.webhook_process import (
    REPO,
    GpuguardServer,
    generate_certs,
    gpuguard,
    loopback_webhooks,
    unregister_webhooks,
    wait_webhook_active,
)

QUOTA_FILE = Path(__file__).resolve().parent / "data" / "quota-policies.yaml"
LIMIT = 40
CREATES = 500
CLIENTS = 32
NAMESPACES = ("race-a", "race-b")
LEDGER_NAMESPACE = "gpuguard-system"


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[list[GpuguardServer], RoundRobinProxy]]:
    work = tmp_path_factory.mktemp("quota-e2e")
    setup = [{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
              "metadata": {"name": "nvidia"}, "handler": "nvidia"},
             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEDGER_NAMESPACE}},
             *({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {"gpuguard.io/e2e-quota": "race"}}}
               for name in NAMESPACES)]
    applied = control_plane.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": setup}))
    assert applied.returncode == 0, applied.stderr
    certs = generate_certs(work / "certs")
    args = ["--policies", str(REPO / "policies" / "library"), "--policies", str(QUOTA_FILE),
            "--quota-namespace", LEDGER_NAMESPACE]
    servers = [GpuguardServer(certs, work / f"replica-{i}.log",
                              kubeconfig=control_plane.kubeconfig, args=args) for i in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        with RoundRobinProxy([s.port for s in servers]) as proxy:
            configs = loopback_webhooks(f"https://127.0.0.1:{proxy.port}", control_plane)
            path = work / "webhooks.yaml"
            path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": configs}))
            applied = control_plane.kubectl("apply", "-f", str(path))
            assert applied.returncode == 0, applied.stderr
            injected = gpuguard("certs", "inject", "--ca", str(certs / "ca.crt"), "--live",
                                "validatingwebhookconfiguration/gpuguard-validating",
                                "--live", "mutatingwebhookconfiguration/gpuguard-mutating",
                                "--kubeconfig", str(control_plane.kubeconfig))
            assert injected.returncode == 0, injected.stderr
            wait_webhook_active(control_plane, servers[0], NAMESPACES[0])
            yield servers, proxy
    finally:
        unregister_webhooks(control_plane)
        for server in servers:
            server.stop()


def _unchecked(message: str) -> bool:
    """gpuguard's refusal when the quota step could not check usage (under load: a ledger write
    that kept conflicting, a slow API server): failurePolicy Fail, naming the quota."""
    return message.startswith('admission webhook "pods.validate.gpuguard.io" denied the '
                              "request: GPUQuota e2e-race: usage could not be checked") \
        and message.endswith("failurePolicy Fail")


def _engine_deadline(message: str) -> bool:
    """gpuguard's refusal when the quota step fitted but the policies did not finish within the
    deadline (a loaded machine): the fail-closed fallback, whose reservation is given back."""
    return message.startswith('admission webhook "pods.validate.gpuguard.io" denied the '
                              "request: gpuguard: the evaluation did not finish within the ")


def _api_timeout(message: str) -> bool:
    """kube-apiserver's refusal when gpuguard did not answer within the webhook's timeoutSeconds
    (``failurePolicy: Fail``): a loaded machine's answer, fail-closed like the others."""
    return "failed calling webhook" in message and (
        "deadline exceeded" in message or "timeout" in message.lower())


def _pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"race-{i:03d}", "namespace": NAMESPACES[i % 2]},
            "spec": {"containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.0-base",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_two_replicas_admit_exactly_the_limit_of_concurrent_creates(
        control_plane: ControlPlane, replicas) -> None:
    servers, proxy = replicas
    quotas, errors = load_quotas([str(QUOTA_FILE)])
    assert not errors and len(quotas) == 1, errors
    quota = quotas[0]
    api_client = control_plane.api_client()
    api_client.configuration.connection_pool_maxsize = CLIENTS
    core = k8s_client.CoreV1Api(api_client)
    barrier = threading.Barrier(CLIENTS)
    local = threading.local()

    def create(i: int) -> tuple[int, str]:
        try:
            core.create_namespaced_pod(NAMESPACES[i % 2], _pod(i), _request_timeout=60)
        except ApiException as exc:
            return exc.status, json.loads(exc.body).get("message", exc.body)
        return 201, ""

    def create_together(i: int) -> tuple[int, str]:
        if not getattr(local, "started", False):
            local.started = True
            barrier.wait(60)  # every client thread starts at once
        return create(i)

    quota_message = (
        'admission webhook "pods.validate.gpuguard.io" denied the request: team race '
        f"(GPUQuota e2e-race) uses {LIMIT} of {LIMIT} GPU-equivalents; this pod needs 1 "
        "(headroom 0 GPU-equivalents)")
    deadline_message = ("GPUQuota e2e-race: usage could not be checked (the quota check did "
                        "not finish within the 2500 ms deadline); failurePolicy Fail")
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(create_together, range(CREATES)))
        admitted = [f"race-{i:03d}" for i, (status, _) in enumerate(results) if status == 201]
        refused = [message for status, message in results if status != 201]
        assert len(admitted) <= LIMIT, len(admitted)  # never over, whatever the timing
        # each refusal is the quota's, or (a loaded machine) the quota step's or the policies'
        # deadline, or the API server's own webhook timeout (timeoutSeconds; failurePolicy Fail
        # refuses too): all fail closed, none admits
        assert all(m == quota_message or m.endswith(deadline_message) or _unchecked(m)
                   or _engine_deadline(m) or _api_timeout(m) for m in refused), \
            [m for m in refused if m != quota_message and not m.endswith(deadline_message)][:3]
        missed = sum(1 for m in refused if m.endswith(deadline_message))
        # both replicas admitted pods: the connections were spread and the ledger was shared
        admitted_by = [sum(1 for d in s.decisions() if d.get("endpoint") == "validate"
                           and d.get("decision") == "allowed"
                           and str(d.get("name", "")).startswith("race-")) for s in servers]
        assert all(admitted_by) and sum(admitted_by) == len(admitted), admitted_by
        assert min(proxy.connections.values()) > 0

        # Exactly the limit: what the burst left free (requests that missed the deadline
        # were refused, and what they reserved late is given back) is admitted now, one by one,
        # and not one pod more. A reservation that leaked would hold its GPU for the
        # reservation TTL (60 s), beyond this wait.
        next_pod = itertools.count(CREATES)

        def topped_up() -> bool:
            status, message = create(next(next_pod))
            if status == 201:
                admitted.append(f"race-{len(admitted)}")  # counted; the name is not needed
                return False
            assert message == quota_message, message
            return len(admitted) == LIMIT
        wait_until(topped_up, f"the quota to admit exactly {LIMIT} pods "
                   f"({missed} quota checks missed the deadline in the burst)",
                   deadline_s=120, interval_s=0.2,
                   logs=lambda: "\n".join(s.logs() for s in servers))
        stored = {p["metadata"]["name"] for ns in NAMESPACES
                  for p in json.loads(control_plane.kubectl("-n", ns, "get", "pods", "-o",
                                                            "json").stdout)["items"]}
        assert len(stored) == LIMIT

        # the ledger: reservations for admitted pods only, counted once, and none left once
        # the watch shows the pods and settle_s (5 s) passed
        labels = {ns: {"gpuguard.io/e2e-quota": "race"} for ns in NAMESPACES}  # as created
        cache = PodCache(api_client, PodUsageIndex(lambda ns: labels.get(ns, {})))
        cache.start()
        try:
            assert cache.synced.wait(60)
            ledger = QuotaLedger(ConfigMapLedgerStore(api_client, LEDGER_NAMESPACE), cache)
            wait_until(lambda: {r.name for r in ledger.reservations(quota).values()} <= stored,
                       "reservations of admitted pods only",
                       logs=lambda: "\n".join(s.logs() for s in servers))
            assert ledger.status(quota).used.gpu_equivalents == LIMIT  # each pod counted once
            wait_until(lambda: ledger.prune(quota) == 0, "the settled reservations to go",
                       logs=lambda: "\n".join(s.logs() for s in servers))
            assert ledger.status(quota).used.gpu_equivalents == LIMIT
        finally:
            cache.stop()
        late = create(next(next_pod))
        assert late == (403, quota_message)
    finally:
        api_client.close()
