"""The gpuguard.io policy-object watch (kube/policy_objects.py) on a real API server.

On an API server started with ``--watch-cache=false`` (as in test_watches.py), so that after
:meth:`ControlPlane.compact_etcd` a resumed watch is answered ``410 Gone`` and the watch must
list again; and the status writes of the Lease holder (kube/policy_status.py) through the status
subresource, with the status Lease (kube/lease.py, injected clocks) taken over from a holder that
stopped renewing it — and not from one whose wall clock is behind while it renews.

Every wait is for a condition (the watch holding what the API holds), with a deadline.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuguard import policy_set
from kube.lease import LeaseElector
from kube.policy_objects import PolicyObjectWatch, list_policy_objects
from kube.policy_status import LEASE_NAME, StatusPublisher
from kube.served_set import merge
from policies.facts.resource_names import GPUSettings
from policies.sources import Snapshot
from tests.controlplane.cluster import ControlPlane, wait_until

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def uncached(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """A control plane whose watches go to etcd, with deploy/crds applied."""
    with ControlPlane(control_plane_bin, apiserver_args=["--watch-cache=false"]) as cluster:
        cluster.apply_gpuguard_crds()
        yield cluster


def _policy(name: str, message: str = "m") -> str:
    return json.dumps({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                       "metadata": {"name": name},
                       "spec": {"validations": [{"expression": "true", "message": message}]}})


def test_policy_watch_follows_changes_ignores_status_writes_and_relists_after_410(
        uncached: ControlPlane, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuguard.kube")
    assert uncached.kubectl("apply", "-f", "-", input=_policy("before")).returncode == 0
    api_client = uncached.api_client()
    changes: list[int] = []
    watch = PolicyObjectWatch(api_client, watch_timeout_s=1)  # resumed every second
    watch.start(lambda: changes.append(1))
    try:
        wait_until(lambda: watch.synced, "the first lists", logs=uncached.logs)
        assert [o.key for o in watch.objects()] == ["GPUPolicy/before"]
        assert watch.status() == (True, "1 gpuguard.io objects, watching")
        assert uncached.kubectl("apply", "-f", "-", input=_policy("before", "edited")
                                ).returncode == 0
        wait_until(lambda: watch.objects()[0].generation == 2, "the spec edit",
                   logs=uncached.logs)
        seen = len(changes)
        patched = uncached.kubectl("patch", "gpupolicy", "before", "--subresource=status",
                                   "--type=merge", "-p", '{"status": {"observedGeneration": 2}}')
        assert patched.returncode == 0, patched.stderr
        wait_until(lambda: watch.objects()[0].status_generation == 2, "the status write",
                   logs=uncached.logs)
        assert len(changes) == seen  # a status write changes nothing that is served
        lists = watch.lists
        for name in ("expiry-a", "expiry-b"):
            assert uncached.kubectl("-n", "default", "create", "configmap", name).returncode == 0
        uncached.compact_etcd()
        wait_until(lambda: watch.lists > lists, "a relist after the watch expired",
                   logs=uncached.logs)
        assert any("expired (410 Gone); listing again" in r.getMessage() for r in caplog.records)
        deleted = uncached.kubectl("delete", "gpupolicy", "before")
        assert deleted.returncode == 0, deleted.stderr
        wait_until(lambda: watch.objects() == [], "the deletion after the relist",
                   logs=uncached.logs)
    finally:
        watch.stop()
        api_client.close()


class _Clock:
    """A replica's monotonic clock (seconds), moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _replica(api_client: k8s_client.ApiClient, namespace: str, identity: str, clock: _Clock,
             wall: datetime.datetime) -> LeaseElector:
    """The status writer's elector as serve builds it; ``renewTime`` follows ``clock`` from
    ``wall`` (an unchanged Lease body is a no-op update that keeps its resourceVersion)."""
    return LeaseElector(api_client, namespace, LEASE_NAME, identity, lease_duration_s=15,
                        clock=clock, wall=lambda: wall + datetime.timedelta(seconds=clock.now))


def _lease(cluster: ControlPlane, namespace: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, "get", "lease", LEASE_NAME, "-o",
                                      "json").stdout)


def test_one_lease_holder_and_a_takeover_once_it_stops_renewing(uncached: ControlPlane,
                                                               caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuguard.kube.lease")
    assert uncached.kubectl("create", "namespace", "lease-test").returncode == 0
    api_client = uncached.api_client()
    wall = datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.UTC)
    a_clock, b_clock = _Clock(), _Clock()
    try:
        first = _replica(api_client, "lease-test", "replica-a", a_clock, wall)
        second = _replica(api_client, "lease-test", "replica-b", b_clock, wall)
        assert first.leading(), first.last_error  # made
        assert not second.leading()
        a_clock.now = b_clock.now = 10.0
        assert first.leading() and not second.leading()  # renewed: b saw it change at 10
        b_clock.now = 24.0  # 14 s on b's clock since it last saw the Lease change
        assert not second.leading()
        b_clock.now = 25.0  # 15 s: replica-a stopped renewing
        assert second.leading()
        a_clock.now = 11.0
        assert not first.leading()  # a sees b holding a fresh Lease
        lease = _lease(uncached, "lease-test")
        assert lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] == 1
        said = [(r.getMessage(), r.fields["identity"]) for r in caplog.records
                if r.name == "gpuguard.kube.lease"]
        assert said == [("holding the Lease", "replica-a"),
                        ("another candidate holds the Lease", "replica-b"),
                        ("holding the Lease", "replica-b"),
                        ("another candidate holds the Lease", "replica-a")]
    finally:
        api_client.close()


def test_a_holder_whose_clock_is_behind_keeps_the_lease_while_it_renews(uncached: ControlPlane
                                                                         ) -> None:
    """The holder's wall clock (its renewTime) is an hour behind the standby's. Comparing that
    renewTime with the standby's clock (what the status writer's own elector did) would take
    the Lease at once and make two writers; judged on the standby's clock from when it saw the
    Lease change, as client-go does, the holder keeps it while it renews."""
    assert uncached.kubectl("create", "namespace", "lease-skew").returncode == 0
    api_client = uncached.api_client()
    standby_wall = datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.UTC)
    a_clock, b_clock = _Clock(), _Clock()
    try:
        holder = _replica(api_client, "lease-skew", "replica-a", a_clock,
                          standby_wall - datetime.timedelta(hours=1))
        standby = _replica(api_client, "lease-skew", "replica-b", b_clock, standby_wall)
        assert holder.leading()
        for step in (10.0, 20.0, 30.0):
            a_clock.now = b_clock.now = step
            assert holder.leading() and not standby.leading(), standby.last_error
        assert _lease(uncached, "lease-skew")["spec"]["renewTime"] == \
            "2026-12-02T02:00:30.000000Z"  # an hour behind the standby's 03:00:30
        b_clock.now = 45.0  # the holder stopped renewing 15 s ago on the standby's clock
        assert standby.leading()
        assert _lease(uncached, "lease-skew")["spec"]["holderIdentity"] == "replica-b"
    finally:
        api_client.close()


def test_the_webhook_account_can_do_what_the_code_does_and_no_more(uncached: ControlPlane
                                                                   ) -> None:
    """The calls of the watch, the Lease and the status writer, made as the webhook's
    ServiceAccount with deploy/crds/rbac.yaml and the component's Lease Role applied."""
    uncached.kubectl("create", "namespace", "gpuguard-system")
    applied = uncached.kubectl("apply", "-f", str(
        ROOT / "deploy" / "components" / "cluster-policies" / "lease-rbac.yaml"))
    assert applied.returncode == 0, applied.stderr
    assert uncached.kubectl("apply", "-f", "-", input=_policy("rbac-checked")).returncode == 0
    api_client = uncached.api_client()
    api_client.set_default_header(
        "Impersonate-User", "system:serviceaccount:gpuguard-system:gpuguard-webhook")
    try:
        objects = list_policy_objects(api_client)
        assert [o.key for o in objects] == ["GPUPolicy/rbac-checked"]
        clock = _Clock()
        elector = _replica(api_client, "gpuguard-system", "replica-rbac", clock,
                           datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.UTC))
        assert elector.leading(), elector.last_error  # created (POST)
        clock.now = 5.0
        assert elector.leading(), elector.last_error  # renewed (PUT: RBAC's update)
        publisher = StatusPublisher(api_client, elector.leading)
        result = merge(Snapshot((), ()), objects, {},
                       lambda s: policy_set.load(s, GPUSettings()))
        publisher.publish(objects, result, True)
        assert publisher.writes == 1
        stored = json.loads(uncached.kubectl("get", "gpupolicy", "rbac-checked", "-o",
                                             "json").stdout)
        assert [c["type"] for c in stored["status"]["conditions"]] == ["Accepted", "Ready"]
        with pytest.raises(ApiException) as refused:  # the spec stays out of reach
            k8s_client.CustomObjectsApi(api_client).patch_cluster_custom_object(
                "gpuguard.io", "v1alpha1", "gpupolicies", "rbac-checked",
                {"spec": {"failurePolicy": "Ignore"}},
                _content_type="application/merge-patch+json")
        assert refused.value.status == 403
        elector.release()  # PUT with the holder cleared
        assert elector.last_error is None
        assert not _lease(uncached, "gpuguard-system")["spec"].get("holderIdentity")
    finally:
        api_client.close()
        uncached.kubectl("delete", "gpupolicy", "rbac-checked")
