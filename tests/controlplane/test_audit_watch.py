"""``gpuguard audit --cluster --watch --write-reports`` against a real kube-apiserver.

The controller runs as its own process (as in its Deployment): it lists, watches, holds a Lease
and serves ``/metrics``. Creating a violating GPU pod must make its namespace's PolicyReport show
the failure, deleting the pod must clear it, and every metric the dashboard and the alerts in
deploy/monitoring/ query (apart from the webhook's own) must be in a scrape of the controller.
The Lease protocol itself is checked with two electors on injected clocks against the same API
server. Every wait is for a condition, with a generous deadline; nothing is timed.
"""

from __future__ import annotations

import datetime
import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kube.lease import LeaseElector
from tests.controlplane.cluster import ControlPlane, Process, free_port, wait_until
from tests.controlplane.test_admission_e2e import install_crds
from tests.project.test_dashboards import dashboard_metric_names, webhook_metric_names

ROOT = Path(__file__).resolve().parent.parent.parent
DATA = Path(__file__).resolve().parent / "data"
DEADLINE_S = 90.0


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}


def _pod(name: str, namespace: str, *, privileged: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "train", "image": "busybox:1.36",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kai.scheduler/queue": "research"}},
            "spec": {"containers": [container]}}


@pytest.fixture(scope="module")
def controller(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[ControlPlane, Process, int, str]]:
    """The controller process, with a GPU node in the cluster; yields (cluster, process,
    metrics port, Lease namespace)."""
    cluster = control_plane
    # the PolicyReport CRDs deploy/ ships (the test-only copy in data/ was removed)
    for crd in sorted((ROOT / "deploy" / "crds" / "policyreports").glob("*.wgpolicyk8s.io.yaml")):
        install_crds(cluster, crd)
    lease_namespace = "gpuguard-watch-system"
    created = cluster.kubectl("create", "namespace", lease_namespace)
    assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
    node = _node("watch-gpu-1")
    applied = cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
    assert applied.returncode == 0, applied.stderr
    status = {"status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti",
                                      "pods": "110"},
                         "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti",
                                         "pods": "110"},
                         "conditions": [{"type": "Ready", "status": "True",
                                         "reason": "KubeletReady", "message": "ready",
                                         "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                                         "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}
    patched = cluster.kubectl("patch", "node", "watch-gpu-1", "--subresource=status",
                              "--type=merge", "-p", json.dumps(status))
    assert patched.returncode == 0, patched.stderr
    port = free_port()
    log = tmp_path_factory.mktemp("audit-watch") / "controller.log"
    process = Process("gpuguard audit --watch", [
        sys.executable, "-m", "gpuguard", "audit", "--cluster", "--kubeconfig",
        str(cluster.kubeconfig), "--watch", "--write-reports",
        "--metrics-listen", f"127.0.0.1:{port}", "--lease", f"{lease_namespace}/gpuguard-audit",
        "--lease-identity", "controller-under-test", "--report-interval-s", "0.2",
        "--full-every-s", "0.5"], log)
    try:
        yield cluster, process, port, lease_namespace
    finally:
        process.stop()


def _logs(cluster: ControlPlane, process: Process) -> Callable[[], str]:
    def tail() -> str:
        text = process.log.read_text(errors="replace") if process.log.exists() else ""
        return "controller log:\n" + "\n".join(text.splitlines()[-40:]) + "\n" + cluster.logs(10)
    return tail


def _report(cluster: ControlPlane, namespace: str) -> dict[str, Any] | None:
    got = cluster.kubectl("get", "policyreports.wgpolicyk8s.io", "gpuguard-audit", "-n",
                          namespace, "-o", "json")
    if got.returncode != 0:
        return None
    report: dict[str, Any] = json.loads(got.stdout)
    return report


def _failures(report: dict[str, Any] | None) -> list[str]:
    return sorted(f"{r['policy']}:{r['resources'][0]['name']}"
                  for r in (report or {}).get("results", []) if r["result"] == "fail")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_a_violating_pod_shows_in_its_report_and_leaves_with_it(
        controller: tuple[ControlPlane, Process, int, str],
        make_namespace: Callable[..., str]) -> None:
    cluster, process, port, _ = controller
    logs = _logs(cluster, process)
    namespace = make_namespace("watch-research", labels={"gpuguard.io/team": "research"})
    created = cluster.kubectl("create", "-f", "-",
                              input=json.dumps(_pod("trainer", namespace, privileged=False)))
    assert created.returncode == 0, created.stderr
    report = wait_until(lambda: _report(cluster, namespace), "the namespace's PolicyReport",
                        deadline_s=DEADLINE_S, logs=logs)
    assert _failures(report) == []
    # Passed rules are the annotation, not summary.pass (a summary counts the report's results).
    assert int(report["metadata"]["annotations"]["gpuguard.io/passed-rules"]) > 0

    created = cluster.kubectl("create", "-f", "-",
                              input=json.dumps(_pod("rogue", namespace, privileged=True)))
    assert created.returncode == 0, created.stderr
    wait_until(lambda: _failures(_report(cluster, namespace)) == ["no-privileged-gpu:rogue"],
               "the privileged GPU pod's failure in the PolicyReport", deadline_s=DEADLINE_S,
               logs=logs)
    assert _report(cluster, namespace)["summary"]["fail"] == 1

    # the figures: both pods wait for a scheduler, 2 GPU-equivalents pending for the team
    wait_until(lambda: 'gpuguard_team_gpu_equivalents_pending{team="research"} 2.0'
               in _scrape(port), "the team's pending GPUs in /metrics", deadline_s=DEADLINE_S,
               logs=logs)

    deleted = cluster.kubectl("delete", "pod", "rogue", "-n", namespace, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: (r := _report(cluster, namespace)) is not None and not _failures(r),
               "the failure to leave the PolicyReport", deadline_s=DEADLINE_S, logs=logs)
    assert _report(cluster, namespace)["summary"]["fail"] == 0

    deleted = cluster.kubectl("delete", "pod", "trainer", "-n", namespace, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: _report(cluster, namespace) is None,
               "the PolicyReport of a namespace with nothing left to report to go",
               deadline_s=DEADLINE_S, logs=logs)
    assert process.running(), logs()


def test_every_dashboard_and_alert_metric_is_in_the_controller_scrape(
        controller: tuple[ControlPlane, Process, int, str]) -> None:
    cluster, process, port, lease_namespace = controller
    logs = _logs(cluster, process)
    wait_until(lambda: "gpuguard_audit_leader 1.0" in _scrape(port),
               "the controller to lead and serve /metrics", deadline_s=DEADLINE_S, logs=logs)
    wait_until(lambda: 'node="watch-gpu-1"' in _scrape(port), "the GPU node in /metrics",
               deadline_s=DEADLINE_S, logs=logs)
    text = _scrape(port)
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    # counters are typed without _total; the queries use the sample names
    exported |= {f"{name}_total" for name in exported} | {
        f"{name}_{suffix}" for name in exported for suffix in ("bucket", "sum", "count")}
    wanted = dashboard_metric_names() - webhook_metric_names()
    assert wanted, "the dashboards query no controller metric"
    assert sorted(wanted - exported) == []
    allocatable = [line for line in text.splitlines()
                   if line.startswith("gpuguard_node_gpu_equivalents_allocatable{")
                   and 'node="watch-gpu-1"' in line]
    assert len(allocatable) == 1 and allocatable[0].endswith(" 8.0"), allocatable
    lease = json.loads(cluster.kubectl("get", "lease", "gpuguard-audit", "-n", lease_namespace,
                                       "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"] == "controller-under-test"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lease_one_holder_and_takeover_only_after_expiry(
        control_plane: ControlPlane, make_namespace: Callable[..., str]) -> None:
    namespace = make_namespace("lease")
    api = control_plane.api_client()
    wall = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    a_clock, b_clock = _Clock(), _Clock()
    # renewTime follows each candidate's clock (an unchanged Lease body is a no-op update that
    # keeps its resourceVersion: a renewal must change renewTime to be seen)
    a = LeaseElector(api, namespace, "audit", "a", lease_duration_s=15, clock=a_clock,
                     wall=lambda: wall + datetime.timedelta(seconds=a_clock.now))
    b = LeaseElector(api, namespace, "audit", "b", lease_duration_s=15, clock=b_clock,
                     wall=lambda: wall + datetime.timedelta(seconds=b_clock.now))
    try:
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()  # b sees a fresh Lease held by a
        b_clock.now = 10.0
        a_clock.now = 5.0
        assert a.try_acquire_or_renew()  # a renews: b observes a new resourceVersion
        assert not b.try_acquire_or_renew()
        b_clock.now = 24.0  # 14 s after b last saw it change: not expired yet
        assert not b.try_acquire_or_renew()
        b_clock.now = 25.0  # 15 s: a has not renewed, b takes over
        assert b.try_acquire_or_renew()
        a_clock.now = 6.0
        assert not a.try_acquire_or_renew()  # a sees b holding a fresh Lease
        got = json.loads(control_plane.kubectl("get", "lease", "audit", "-n", namespace,
                                               "-o", "json").stdout)
        assert got["spec"]["holderIdentity"] == "b"
        assert got["spec"]["leaseTransitions"] == 1
        b.release()
        assert a.try_acquire_or_renew()  # released: no wait for expiry
    finally:
        api.close()


def test_the_controller_account_can_hold_its_lease(control_plane: ControlPlane) -> None:
    """The elector's calls (GET, POST, PUT to renew and to release) made as the controller's
    ServiceAccount with deploy/components/audit-controller/rbac.yaml applied: RBAC names a PUT
    ``update``, so a Role granting ``patch`` instead would 403 every renewal."""
    control_plane.kubectl("create", "namespace", "gpuguard-system")  # may exist already
    applied = control_plane.kubectl("apply", "-f", str(
        ROOT / "deploy" / "components" / "audit-controller" / "rbac.yaml"))
    assert applied.returncode == 0, applied.stderr
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User",
                           "system:serviceaccount:gpuguard-system:gpuguard-audit-controller")
    clock = _Clock()
    wall = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    elector = LeaseElector(api, "gpuguard-system", "gpuguard-audit", "controller-0",
                           clock=clock, wall=lambda: wall + datetime.timedelta(seconds=clock.now))
    other = LeaseElector(api, "gpuguard-system", "other", "controller-0", clock=clock)
    try:
        assert elector.try_acquire_or_renew(), elector.last_error  # created
        clock.now = 5.0
        assert elector.try_acquire_or_renew(), elector.last_error  # renewed with PUT
        elector.release()
        assert elector.last_error is None
        got = json.loads(control_plane.kubectl("get", "lease", "gpuguard-audit", "-n",
                                               "gpuguard-system", "-o", "json").stdout)
        assert not got["spec"].get("holderIdentity")  # released
        assert not other.try_acquire_or_renew()  # only its own Lease's name
        assert other.last_error is not None and "403" in other.last_error
    finally:
        api.close()


@pytest.fixture(scope="module")
def uncached(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """A control plane whose watches go to etcd (``--watch-cache=false``): after a compaction,
    resuming a watch from an older resourceVersion is answered 410 Gone, as a cluster answers a
    watch that fell out of its window (tests/controlplane/test_watches.py)."""
    with ControlPlane(control_plane_bin, apiserver_args=["--watch-cache=false"]) as cluster:
        yield cluster


def test_resource_watch_relists_after_410_and_the_store_matches_the_api(
        uncached: ControlPlane) -> None:
    import threading

    from audit.watch.store import ObjectStore
    from kube.lists import Resource
    from kube.resource_watch import ResourceWatch

    store, lock = ObjectStore(), threading.Lock()
    lists: list[int] = []

    def listed(items: list[dict[str, Any]]) -> None:
        with lock:
            store.replace("", "Pod", items)
            lists.append(len(items))

    def event(kind: str, obj: dict[str, Any]) -> None:
        with lock:
            store.apply(kind, obj)

    def names() -> set[str]:
        with lock:
            return {d.body["metadata"]["name"] for d in store.documents("watch-410")}

    assert uncached.kubectl("create", "namespace", "watch-410").returncode == 0
    for name in ("p1", "p2"):
        pod = _pod(name, "watch-410", privileged=False)
        assert uncached.kubectl("create", "-f", "-", input=json.dumps(pod)).returncode == 0
    api = uncached.api_client()
    watch = ResourceWatch(api, Resource("", "v1", "pods", "Pod"), on_list=listed,
                          on_event=event, on_not_served=lambda: None, watch_timeout_s=1)
    watch.start()
    try:
        wait_until(lambda: names() == {"p1", "p2"}, "the first list", logs=uncached.logs)
        pod = _pod("p3", "watch-410", privileged=False)
        assert uncached.kubectl("create", "-f", "-", input=json.dumps(pod)).returncode == 0
        wait_until(lambda: names() == {"p1", "p2", "p3"}, "the ADDED event",
                   logs=uncached.logs)
        before = len(lists)
        # writes the pod watch does not see move etcd on; then its history goes: resuming the
        # watch (every second) from the version it holds is 410 Gone
        for name in ("gone-a", "gone-b"):
            assert uncached.kubectl("-n", "default", "create", "configmap", name
                                    ).returncode == 0
        uncached.compact_etcd()
        wait_until(lambda: len(lists) > before, "a relist after 410 Gone", logs=uncached.logs)
        deleted = uncached.kubectl("-n", "watch-410", "delete", "pod", "p1", "--grace-period=0",
                                   "--force")
        assert deleted.returncode == 0, deleted.stderr
        wait_until(lambda: names() == {"p2", "p3"}, "the deletion after the relist",
                   logs=uncached.logs)
        with lock:
            assert len([d for d in store.documents("watch-410")]) == 2  # nothing twice
    finally:
        watch.stop()
        api.close()
