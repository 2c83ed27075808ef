"""The namespace, pod and RuntimeClass watches (kube/namespaces.py, kube/pod_cache.py,
kube/runtime_classes.py) on a real API server.

Two API servers: the session's (watch cache on, as clusters run) for list + watch + events, and a
module one started with ``--watch-cache=false`` for expiry: there a watch goes to etcd, so after
:meth:`ControlPlane.compact_etcd` a watch resumed from an older resourceVersion is answered the
way a cluster answers a watch that fell out of its window, ``410 Gone`` — the real reason a
client must list again, produced on demand instead of by waiting for eviction.

Every wait is for a condition (the cache holding what the API holds), with a deadline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube.namespaces import NamespaceWatch
from kube.pod_cache import PodCache
from kube.runtime_classes import RuntimeClassWatch
from policies.facts.review import NAMESPACE_NAME_LABEL as NAME_LABEL
from policies.policy.quota import parse_quota
from tests.controlplane.cluster import ControlPlane, wait_until


@pytest.fixture(scope="module")
def uncached(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """A second control plane whose watches go to etcd (``--watch-cache=false``)."""
    with ControlPlane(control_plane_bin, apiserver_args=["--watch-cache=false"]) as cluster:
        yield cluster


def _gpu_pod(name: str, namespace: str, gpus: int) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                                "resources": {"limits": {
                                                    "nvidia.com/gpu": str(gpus)}}}]}})


def _finalize(cluster: ControlPlane, name: str) -> None:
    """Delete a namespace the way the namespace controller would finish it (none runs here)."""
    deleted = cluster.kubectl("delete", "namespace", name, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    body = json.loads(cluster.kubectl("get", "namespace", name, "-o", "json").stdout)
    body["spec"]["finalizers"] = []
    done = cluster.kubectl("replace", "--raw", f"/api/v1/namespaces/{name}/finalize", "-f", "-",
                           input=json.dumps(body))
    assert done.returncode == 0, done.stderr


def test_namespace_watch_follows_creates_label_changes_and_deletes(control_plane: ControlPlane
                                                                   ) -> None:
    api_client = control_plane.api_client()
    watch = NamespaceWatch(api_client, watch_timeout_s=30)
    watch.start()
    try:
        wait_until(lambda: watch.status()[0], "the first namespace list",
                   logs=control_plane.logs)
        assert watch.get("kube-system")["metadata"]["labels"][NAME_LABEL] == "kube-system"
        created = control_plane.kubectl("create", "namespace", "watched-team")
        assert created.returncode == 0, created.stderr
        wait_until(lambda: "uid" in watch.get("watched-team")["metadata"],
                   "the new namespace in the cache", logs=control_plane.logs)
        labelled = control_plane.kubectl("label", "namespace", "watched-team",
                                         "gpuguard.io/team=vision")
        assert labelled.returncode == 0, labelled.stderr
        wait_until(lambda: watch.get("watched-team")["metadata"]["labels"].get(
            "gpuguard.io/team") == "vision", "the label change", logs=control_plane.logs)
        assert "managedFields" not in watch.get("watched-team")["metadata"]
        _finalize(control_plane, "watched-team")
        wait_until(lambda: "uid" not in watch.get("watched-team")["metadata"],
                   "the deletion (back to a stub)", logs=control_plane.logs)
        assert watch.lists == 1  # all of it from one list and one watch
    finally:
        watch.stop()
        api_client.close()


def test_runtime_class_watch_follows_creates_and_deletes(control_plane: ControlPlane) -> None:
    # What the webhook checks a setRuntimeClassName mutation against: None until the first
    # list, then the cluster's RuntimeClass names as they are created and deleted.
    api_client = control_plane.api_client()
    watch = RuntimeClassWatch(api_client, watch_timeout_s=30)
    assert watch.names() is None
    watch.start()
    try:
        wait_until(lambda: watch.status()[0], "the first RuntimeClass list",
                   logs=control_plane.logs)
        assert "nvidia-watched" not in (watch.names() or ())
        created = control_plane.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "nvidia-watched"}, "handler": "nvidia"}))
        assert created.returncode == 0, created.stderr
        wait_until(lambda: "nvidia-watched" in (watch.names() or ()),
                   "the new RuntimeClass in the cache", logs=control_plane.logs)
        deleted = control_plane.kubectl("delete", "runtimeclass", "nvidia-watched")
        assert deleted.returncode == 0, deleted.stderr
        wait_until(lambda: (names := watch.names()) is not None and "nvidia-watched" not in names,
                   "the deletion", logs=control_plane.logs)
        listed = json.loads(control_plane.kubectl("get", "runtimeclasses", "-o", "json").stdout)
        # the cache is what the API server holds (other tests of the session may add classes)
        assert watch.names() == {r["metadata"]["name"] for r in listed["items"]}
    finally:
        watch.stop()
        api_client.close()


def test_namespace_watch_lists_again_after_410_gone(uncached: ControlPlane, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuguard.kube")
    api_client = uncached.api_client()
    watch = NamespaceWatch(api_client, watch_timeout_s=1)  # resumed every second
    watch.start()
    try:
        wait_until(lambda: watch.status()[0], "the first namespace list", logs=uncached.logs)
        created = uncached.kubectl("create", "namespace", "before-expiry")
        assert created.returncode == 0, created.stderr
        wait_until(lambda: "uid" in watch.get("before-expiry")["metadata"],
                   "the namespace event", logs=uncached.logs)
        seen = int(watch.get("before-expiry")["metadata"]["resourceVersion"])
        # writes the namespace watch does not see move etcd two revisions on, then the
        # history up to now goes: resuming from `seen` (or any version the watch saw) is 410
        for name in ("expiry-a", "expiry-b"):
            assert uncached.kubectl("-n", "default", "create", "configmap", name).returncode == 0
        compacted = uncached.compact_etcd()
        assert compacted >= seen + 2
        wait_until(lambda: watch.lists >= 2, "a relist after the watch expired",
                   logs=uncached.logs)
        assert any("namespace watch expired (410 Gone); listing again" in r.getMessage()
                   for r in caplog.records)
        # the relisted cache is complete and current
        assert uncached.kubectl("label", "namespace", "before-expiry", "after=relist"
                                ).returncode == 0
        wait_until(lambda: watch.get("before-expiry")["metadata"]["labels"].get("after") ==
                   "relist", "events after the relist", logs=uncached.logs)
        assert watch.status() == (True, f"{len(_names(uncached))} namespaces, watching")
    finally:
        watch.stop()
        api_client.close()


def _names(cluster: ControlPlane) -> list[str]:
    return cluster.kubectl("get", "namespaces", "-o", "name").stdout.split()


QUOTA, _errors = parse_quota({
    "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota", "metadata": {"name": "watched"},
    "spec": {"scope": {"namespace": "pods-watched"}, "limits": {"gpuEquivalents": 100}}})
assert QUOTA is not None and not _errors, _errors


def test_pod_cache_counts_pods_and_relists_after_410_gone(uncached: ControlPlane,
                                                          caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuguard.kube")
    assert uncached.kubectl("create", "namespace", "pods-watched").returncode == 0
    assert uncached.kubectl("create", "-f", "-", input=_gpu_pod("before", "pods-watched", 2)
                            ).returncode == 0
    api_client = uncached.api_client()
    cache = PodCache(api_client, watch_timeout_s=1)
    cache.start()
    try:
        assert cache.synced.wait(60), cache.status()
        assert cache.usage(QUOTA).gpu_equivalents == 2
        assert uncached.kubectl("create", "-f", "-", input=_gpu_pod("added", "pods-watched", 3)
                                ).returncode == 0
        wait_until(lambda: cache.usage(QUOTA).gpu_equivalents == 5, "the added pod",
                   logs=uncached.logs)
        # a finished pod holds nothing (the kubelet's status write, done here by hand)
        finished = uncached.kubectl("-n", "pods-watched", "patch", "pod", "added",
                                    "--subresource=status", "--type=merge",
                                    "-p", '{"status": {"phase": "Succeeded"}}')
        assert finished.returncode == 0, finished.stderr
        wait_until(lambda: cache.usage(QUOTA).gpu_equivalents == 2, "the finished pod",
                   logs=uncached.logs)
        lists = cache.lists
        for name in ("expiry-c", "expiry-d"):
            assert uncached.kubectl("-n", "default", "create", "configmap", name).returncode == 0
        uncached.compact_etcd()
        wait_until(lambda: cache.lists > lists, "a relist after the watch expired",
                   logs=uncached.logs)
        assert any("pod watch expired (410 Gone); listing again" in r.getMessage()
                   for r in caplog.records)
        deleted = uncached.kubectl("-n", "pods-watched", "delete", "pod", "before",
                                   "--grace-period=0", "--force")
        assert deleted.returncode == 0, deleted.stderr
        wait_until(lambda: cache.pod_usage("pods-watched", "before") is None,
                   "the deletion after the relist", logs=uncached.logs)
        assert cache.usage(QUOTA).gpu_equivalents == 0
    finally:
        cache.stop()
        api_client.close()
