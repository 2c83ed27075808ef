"""GPU usage of the cluster's pods for quota: an index of pod charges kept by a pod watch.

:class:`PodUsageIndex` holds, per pod, the usage it counts for
(:func:`policies.policy.quota.pod_charge`) and running totals per namespace, so the usage of a
quota's scope is a sum over namespaces, not over pods (the admission hot path). Pending and running
pods count; finished pods (``Succeeded`` / ``Failed``) and deleted ones do not.

:class:`PodCache` fills the index from a live cluster: a paginated list of ``/api/v1/pods`` then a
watch, in a daemon worker thread (the pattern of :class:`kube.namespaces.NamespaceWatch`). A watch
that expires (410 Gone, or an ``ERROR`` event with code 410) is followed by a fresh list that
replaces the index; other errors are retried with back-off. Readers may be on any thread: the
index is guarded by a lock. A thread can wait for the cache to reach a state (a resourceVersion
applied, a relist) with :meth:`PodCache.wait_for` instead of polling.

Must not know about HTTP serving; quota semantics are :mod:`policies.policy.quota`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kube.list_watch import run_list_watch, shut_down, watch_stream
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.policy.quota import ZERO, Quota, Usage, pod_charge

if TYPE_CHECKING:
    from kubernetes import client as k8s_client


SUM_MAX_AGE_S = 5.0  # seconds a team / cluster sum is reused when no pod changed


class PodUsageIndex:
    """Usage per pod and per namespace (see module docstring). Thread-safe.

    Args:
        namespace_labels: namespace name → its labels, for team scopes.
        settings: GPU naming, for the GPU facts.
    """

    def __init__(self, namespace_labels: Callable[[str], Mapping[str, Any]] = lambda n: {},
                 settings: GPUSettings = DEFAULT_SETTINGS) -> None:
        self.namespace_labels = namespace_labels
        self.settings = settings
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], Usage] = {}
        self._namespaces: dict[str, Usage] = {}
        # Team and cluster sums, reused while no pod changed: summing every namespace's usage
        # on each admission cost more than the rest of the quota check. Namespace labels can
        # change without a pod changing, hence the age bound.
        self._version = 0
        self._sums: dict[Any, tuple[int, float, Usage]] = {}

    def _remove(self, key: tuple[str, str]) -> None:
        self._version += 1
        old = self._pods.pop(key, None)
        if old is not None:
            remaining = self._namespaces[key[0]] - old
            if remaining.pods <= 0:
                del self._namespaces[key[0]]
            else:
                self._namespaces[key[0]] = remaining

    def upsert(self, pod: Mapping[str, Any]) -> None:
        """Add or update a pod (a finished pod is removed)."""
        metadata = pod.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        usage = pod_charge(pod, self.settings).usage
        with self._lock:
            self._remove(key)
            if usage.pods:
                self._version += 1
                self._pods[key] = usage
                self._namespaces[key[0]] = self._namespaces.get(key[0], ZERO) + usage

    def delete(self, namespace: str, name: str) -> None:
        """Forget a pod."""
        with self._lock:
            self._remove((namespace, name))

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything (after a list)."""
        fresh = PodUsageIndex(self.namespace_labels, self.settings)
        for pod in pods:
            fresh.upsert(pod)
        with self._lock:
            self._pods, self._namespaces = fresh._pods, fresh._namespaces
            self._version += 1

    def pod_usage(self, namespace: str, name: str) -> Usage | None:
        """The usage of one pod; None when not in the index."""
        return self._pods.get((namespace, name))

    def usage(self, quota: Quota) -> Usage:
        """Usage of the pods in ``quota``'s scope (GPU-equivalents, devices, MiB, …)."""
        with self._lock:
            return self._scope_usage(quota)

    def usage_apart_from(self, quota: Quota, pods: Iterable[tuple[str, str]]) -> Usage:
        """Usage of ``quota``'s scope less the listed ``(namespace, name)`` pods it holds.

        One read under the index lock: the quota ledger counts a reserved pod through its
        reservation instead, and a watch event landing between "sum the scope" and "is this
        reserved pod in it" would otherwise drop the pod from both (an admission over the limit).
        """
        with self._lock:
            total = self._scope_usage(quota)
            seen: set[tuple[str, str]] = set()
            for key in pods:
                cached = self._pods.get(key)
                if cached is None or key in seen or not self._in_scope(quota, key[0]):
                    continue
                seen.add(key)
                total = total - cached
            return total

    def _in_scope(self, quota: Quota, namespace: str) -> bool:
        return quota.scope.applies(namespace, self.namespace_labels(namespace))

    def _scope_usage(self, quota: Quota) -> Usage:
        """Caller holds the lock."""
        scope = quota.scope
        if scope.kind == "Namespace":
            return self._namespaces.get(str(scope.namespace), ZERO)
        key = (scope.kind, getattr(scope, "label", None), getattr(scope, "value", None))
        version, now = self._version, time.monotonic()
        cached = self._sums.get(key)
        if cached is not None and cached[0] == version and now - cached[1] < SUM_MAX_AGE_S:
            return cached[2]
        total = ZERO
        for namespace, usage in self._namespaces.items():
            if scope.applies(namespace, self.namespace_labels(namespace)):
                total = total + usage
        self._sums[key] = (version, now, total)
        return total

    def __len__(self) -> int:
        return len(self._pods)


def _trim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What quota needs of a pod: metadata (names, annotations), spec, status.phase."""
    metadata = pod.get("metadata") or {}
    return {
        "kind": "Pod",
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "annotations",
                                                  "labels", "resourceVersion") if k in metadata},
        "spec": pod.get("spec") or {},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }



class PodCache:
    """A :class:`PodUsageIndex` kept current by list + watch of all pods, in a worker thread.

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        index: the index to fill (its namespace labels and settings are used).
        watch_timeout_s: server-side timeout of one watch call (seconds).
        page_size: pods per list page.
        max_backoff_s: longest wait between retries after an error (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, index: PodUsageIndex | None = None, *,
                 watch_timeout_s: int = 300, page_size: int = 500,
                 max_backoff_s: float = 30.0) -> None:
        from kubernetes import client as k8s_client  # noqa: PLC0415 - see kube.list_watch

        from kube.lists import leave_status_retries_to_lists  # noqa: PLC0415 - the same

        leave_status_retries_to_lists(api_client)
        self._api = k8s_client.CoreV1Api(api_client)
        self.index = index if index is not None else PodUsageIndex()
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.synced = threading.Event()
        self._changes = threading.Condition()
        self.lists = 0  # completed lists (the first, then one per relist)
        self.resource_version = ""  # of the last list or event applied
        self.last_error: str | None = None

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)``: synced once the first complete pod list arrived."""
        if self.synced.is_set():
            return True, f"watching (full pod lists so far: {self.lists})"
        problem = f" (last error: {self.last_error})" if self.last_error else ""
        return False, f"waiting for the first list of the cluster's pods{problem}"

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Block until ``condition()`` holds, checked now and after each change the worker
        applies (a list, an event, an error); False after ``timeout`` seconds without it.

        E.g. ``cache.wait_for(lambda: cache.resource_version == "205", 60)``; a
        resourceVersion is opaque, so compare it for equality only.
        """
        with self._changes:
            return self._changes.wait_for(condition, timeout)

    def _changed(self, version: str | None = None) -> None:
        with self._changes:
            if version:
                self.resource_version = version
            self._changes.notify_all()

    # UsageSource, delegated
    def usage(self, quota: Quota) -> Usage:
        """See :meth:`PodUsageIndex.usage`."""
        return self.index.usage(quota)

    def pod_usage(self, namespace: str, name: str) -> Usage | None:
        """See :meth:`PodUsageIndex.pod_usage`."""
        return self.index.pod_usage(namespace, name)

    def usage_apart_from(self, quota: Quota, pods: Iterable[tuple[str, str]]) -> Usage:
        """See :meth:`PodUsageIndex.usage_apart_from`."""
        return self.index.usage_apart_from(quota, pods)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the worker (shutting the open watch's socket down) and wait up to ``timeout`` s."""
        self._stop.set()
        shut_down(self._response, "pod")
        if self._thread is not None:
            self._thread.join(timeout)

    def _list(self) -> str:
        from kube.lists import ListStats, call_pages  # noqa: PLC0415 - see kube.list_watch

        pods: list[dict[str, Any]] = []
        stats = ListStats()
        for page in call_pages(self._api.list_pod_for_all_namespaces, "pods",
                               page_size=self._page_size, sleep=self._stop.wait, stats=stats,
                               on_restart=pods.clear):
            pods.extend(_trim(item) for item in page.get("items") or [])
        self.index.replace(pods)
        self.lists += 1
        self.last_error = None
        self.synced.set()
        self._changed(stats.resource_version)
        return stats.resource_version

    def _events(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        def hold(response: Any) -> None:
            self._response = response

        return watch_stream(self._api.list_pod_for_all_namespaces, resource_version,
                            timeout_s=self._watch_timeout_s, stop=self._stop, hold=hold)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        if kind == "DELETED":
            self.index.delete(str(metadata.get("namespace") or ""), str(metadata.get("name")))
        elif kind in ("ADDED", "MODIFIED"):
            self.index.upsert(_trim(obj))
        self._changed(str(metadata.get("resourceVersion") or ""))

    def _run(self) -> None:
        run_list_watch(what="pod", stop=self._stop, list_once=self._list, events=self._events,
                       apply=self._apply, failed=self._failed, max_backoff_s=self._max_backoff_s)

    def _failed(self, message: str) -> None:
        self.last_error = message
        self._changed()
