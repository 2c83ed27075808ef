"""gpuguard's policy objects in the cluster: GPUPolicy, GPUQuota and GPUPolicyException.

Owns reading the ``gpuguard.io/v1alpha1`` custom resources (``deploy/crds/``) from the API
server, as :class:`PolicyObject` values the served set is built from (:mod:`kube.served_set`):

- :class:`PolicyObjectWatch`: per resource, a paginated list then a watch (the shared
  :func:`kube.list_watch.run_list_watch`: a watch that expires with 410 Gone is followed by a
  fresh list that replaces that resource's objects) in a daemon worker thread. Every change that
  alters what would be served (an object's spec, labels or name, its arrival or its deletion —
  not a status write or a resourceVersion bump) calls the ``on_change`` callback given to
  :meth:`PolicyObjectWatch.start`, from the worker thread. :meth:`PolicyObjectWatch.objects`
  returns the current objects from any thread.
- :func:`list_policy_objects`: one list of each resource (``gpuguard audit --cluster
  --cluster-policies``).

A resource the cluster does not serve (the CRD not installed: 404) is reported by ``status()``
and retried with back-off: nothing is taken from it, never "no policies" said silently.

Must not interpret policies: :mod:`kube.served_set` builds them with the loader.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client

from kube.list_watch import run_list_watch, shut_down, watch_stream
from kube.lists import ListStats, call_pages, leave_status_retries_to_lists
from policies.sources import SourceFile

_LOG = logging.getLogger("gpuguard.kube.policy_objects")
GROUP, VERSION = "gpuguard.io", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SOURCE_PREFIX = "cluster:"


@dataclass(frozen=True)
class Resource:
    """One gpuguard.io resource: its kind, plural (the URL path) and scope."""

    kind: str
    plural: str
    namespaced: bool


RESOURCES = (
    Resource("GPUPolicy", "gpupolicies", False),
    Resource("GPUQuota", "gpuquotas", False),
    Resource("GPUPolicyException", "gpupolicyexceptions", True),
)


@dataclass(frozen=True)
class PolicyObject:
    """One gpuguard.io object as the API server returned it, reduced to what is served.

    Attributes:
        kind / namespace / name: which object (``namespace`` "" for the cluster-scoped kinds).
        uid / generation: its identity and spec version (``metadata.generation``: bumped by the
            API server on every spec change, never by a status write).
        resource_version: of the version read (for the status writer's optimistic updates).
        body: ``apiVersion``, ``kind``, ``metadata`` (``name``, ``namespace``, ``labels``) and
            ``spec``: the document the loader checks, as a policy file would hold it.
        conditions: ``status.conditions`` as read (the status writer compares before writing).
        status_generation: ``status.observedGeneration`` as read (0 when absent).
    """

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    body: Mapping[str, Any]
    conditions: tuple[Mapping[str, Any], ...] = ()
    status_generation: int = 0

    @property
    def key(self) -> str:
        """``Kind/name``, or ``Kind/namespace/name`` for a GPUPolicyException."""
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else \
            f"{self.kind}/{self.name}"

    @property
    def source(self) -> str:
        """The source name its documents and errors carry: ``cluster:`` + :attr:`key`."""
        return SOURCE_PREFIX + self.key

    @functools.cached_property
    def data(self) -> bytes:
        """:attr:`body` as canonical JSON (sorted keys, indented so errors have lines): the
        bytes the served set's digest covers."""
        return json.dumps(self.body, sort_keys=True, indent=1).encode("utf-8")

    def source_file(self) -> SourceFile:
        """The object as one in-memory policy file named :attr:`source`."""
        return SourceFile(self.source, self.data, self.source)

    @property
    def served_content(self) -> tuple[str, bytes]:
        """What decides whether a change matters to the served set: ``(key, data)``."""
        return self.key, self.data


def policy_object(raw: Mapping[str, Any], kind: str) -> PolicyObject | None:
    """A :class:`PolicyObject` from an object of a list or watch event; None without a name.

    ``metadata.namespace`` is the API server's (the object's own namespace), never taken from
    the spec: a GPUPolicyException exempts the namespace it lives in.
    """
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    name = str(metadata.get("name") or "")
    if not name:
        return None
    namespace = str(metadata.get("namespace") or "")
    kept: dict[str, Any] = {"name": name}
    if namespace:
        kept["namespace"] = namespace
    if isinstance(metadata.get("labels"), Mapping) and metadata["labels"]:
        kept["labels"] = dict(metadata["labels"])
    body = {"apiVersion": str(raw.get("apiVersion") or API_VERSION), "kind": kind,
            "metadata": kept, "spec": raw.get("spec")}
    status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    conditions = status.get("conditions")
    try:
        generation = int(metadata.get("generation") or 0)
        observed = int(status.get("observedGeneration") or 0)
    except (TypeError, ValueError):
        generation, observed = 0, 0
    return PolicyObject(
        kind=kind, namespace=namespace, name=name, uid=str(metadata.get("uid") or ""),
        generation=generation, resource_version=str(metadata.get("resourceVersion") or ""),
        body=body, status_generation=observed,
        conditions=tuple(c for c in conditions if isinstance(c, Mapping))
        if isinstance(conditions, list) else ())


def _list_call(api: k8s_client.CustomObjectsApi, resource: Resource) -> Callable[..., Any]:
    # The cluster-wide list also lists a namespaced resource across every namespace.
    return functools.partial(api.list_cluster_custom_object, GROUP, VERSION, resource.plural)


def _list_pages(call: Callable[..., Any], resource: Resource, page_size: int,
                sleep: Callable[[float], object] = time.sleep,
                ) -> tuple[list[PolicyObject], str]:
    """Every object of ``resource`` (paginated, through :func:`kube.lists.call_pages`) and the
    list's resourceVersion.

    Raises:
        kube.lists.ListError: as :func:`kube.lists.fetch_pages`.
    """
    found: list[PolicyObject] = []
    stats = ListStats()
    for page in call_pages(call, f"{resource.plural}.{GROUP}", page_size=page_size,
                           sleep=sleep, stats=stats, on_restart=found.clear):
        for item in page.get("items") or []:
            obj = policy_object(item, resource.kind)
            if obj is not None:
                found.append(obj)
    return found, stats.resource_version


def list_policy_objects(api_client: k8s_client.ApiClient, *, page_size: int = 500,
                        ) -> list[PolicyObject]:
    """Every gpuguard.io object of the cluster, listed once, sorted by :attr:`PolicyObject.key`.

    Raises:
        kube.lists.NotServed: a CRD is not installed (404).
        kube.lists.ListError: another API error (403: RBAC); the message names the resource.
        kube.lists.Unreachable: the API server cannot be reached.
    """
    leave_status_retries_to_lists(api_client)
    api = k8s_client.CustomObjectsApi(api_client)
    objects: list[PolicyObject] = []
    for resource in RESOURCES:
        objects.extend(_list_pages(_list_call(api, resource), resource, page_size)[0])
    return sorted(objects, key=lambda o: o.key)


class PolicyObjectWatch:
    """The gpuguard.io objects of a live cluster, kept current by list + watch.

    The interface other components use (the webhook's served set, an audit controller):
    :meth:`start` with an ``on_change`` callback (called from a worker thread after each change
    that alters what would be served; it must not block), :meth:`objects` (the current objects,
    sorted by key), :meth:`status` and :attr:`synced` (every resource listed once), :meth:`stop`.

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient`` (see :mod:`kube.config`).
        resources: which resources to watch (default all three).
        watch_timeout_s: server-side timeout of one watch call (seconds).
        page_size: objects per list page.
        max_backoff_s: longest wait between retries after an error (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, *,
                 resources: Sequence[Resource] = RESOURCES, watch_timeout_s: int = 300,
                 page_size: int = 500, max_backoff_s: float = 30.0) -> None:
        leave_status_retries_to_lists(api_client)
        self._api = k8s_client.CustomObjectsApi(api_client)
        self._resources = tuple(resources)
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._max_backoff_s = max_backoff_s
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, PolicyObject]] = {r.kind: {} for r in resources}
        self._listed: set[str] = set()
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, Any] = {}
        self._on_change: Callable[[], None] = lambda: None
        self.lists = 0  # completed lists, every resource together (the first ones, relists)
        self.source = "cluster watch"

    # --- readers (any thread) -----------------------------------------------------------------

    def objects(self) -> list[PolicyObject]:
        """The current objects of every watched resource, sorted by key."""
        with self._lock:
            found = [o for by_key in self._objects.values() for o in by_key.values()]
        return sorted(found, key=lambda o: o.key)

    @property
    def synced(self) -> bool:
        """Whether every watched resource has been listed at least once."""
        with self._lock:
            return len(self._listed) == len(self._resources)

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)``; the detail names each resource not listed yet, or whose watch
        is failing (and retried), and why."""
        with self._lock:
            missing = [f"{r.plural}.{GROUP}: {self._errors.get(r.kind, 'listing')}"
                       for r in self._resources if r.kind not in self._listed]
            count = sum(len(v) for v in self._objects.values())
            failing = [f"{r.plural}.{GROUP}: {self._errors[r.kind]}" for r in self._resources
                       if r.kind in self._listed and r.kind in self._errors]
        if missing:
            return False, "not listed yet: " + "; ".join(missing)
        if failing:  # still synced: what was listed last keeps serving while it retries
            return True, f"{count} gpuguard.io objects; watch failing, retrying: " + \
                "; ".join(failing)
        return True, f"{count} gpuguard.io objects, watching"

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, on_change: Callable[[], None] | None = None) -> None:
        """Start one worker thread per resource; ``on_change`` is called after each change."""
        if on_change is not None:
            self._on_change = on_change
        for resource in self._resources:
            thread = threading.Thread(target=self._run, args=(resource,), daemon=True,
                                      name=f"watch-{resource.plural}")
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the worker threads (their open watches' sockets are shut down, as in
        :meth:`kube.namespaces.NamespaceWatch.stop`) and wait up to ``timeout`` seconds each."""
        self._stop.set()
        for kind, response in list(self._responses.items()):
            shut_down(response, kind)
        for thread in self._threads:
            thread.join(timeout)

    # --- applying changes (worker threads; also called by tests with injected events) ---------

    def replace(self, kind: str, objects: Sequence[PolicyObject]) -> None:
        """A fresh list of ``kind``: replaces what was held (objects deleted meanwhile go)."""
        fresh = {o.key: o for o in objects}
        with self._lock:
            before = self._objects.get(kind, {})
            changed = kind not in self._listed or \
                {k: o.data for k, o in before.items()} != {k: o.data for k, o in fresh.items()}
            self._objects[kind] = fresh
            self._listed.add(kind)
            self._errors.pop(kind, None)
            self.lists += 1
        if changed:
            self._on_change()

    def apply(self, event: str, obj: PolicyObject) -> None:
        """One ADDED / MODIFIED / DELETED event; ``on_change`` only when what is served would
        change (a status write changes neither the spec nor the generation)."""
        with self._lock:
            by_key = self._objects.setdefault(obj.kind, {})
            before = by_key.get(obj.key)
            if event == "DELETED":
                changed = by_key.pop(obj.key, None) is not None
            else:
                by_key[obj.key] = obj
                changed = before is None or before.data != obj.data
        if changed:
            self._on_change()

    def failed(self, kind: str, message: str) -> None:
        """A list or watch of ``kind`` failed (retried with back-off): named by :meth:`status`
        until the next list of it succeeds."""
        with self._lock:
            self._errors[kind] = message

    def _run(self, resource: Resource) -> None:
        call = _list_call(self._api, resource)

        def list_once() -> str:
            objects, version = _list_pages(call, resource, self._page_size,
                                           sleep=self._stop.wait)
            self.replace(resource.kind, objects)
            _LOG.info("policy objects listed", extra={"fields": {
                "resource": f"{resource.plural}.{GROUP}", "objects": len(objects),
                "resourceVersion": version}})
            return version

        def events(version: str) -> Iterator[tuple[str, dict[str, Any]]]:
            def hold(response: Any) -> None:
                if response is None:
                    self._responses.pop(resource.kind, None)
                else:
                    self._responses[resource.kind] = response
            return watch_stream(call, version, timeout_s=self._watch_timeout_s,
                                stop=self._stop, hold=hold)

        def apply(event: str, raw: dict[str, Any]) -> None:
            obj = policy_object(raw, resource.kind)
            if obj is not None:
                self.apply(event, obj)

        run_list_watch(what=f"{resource.plural}.{GROUP}", stop=self._stop, list_once=list_once,
                       events=events, apply=apply,
                       failed=functools.partial(self.failed, resource.kind),
                       max_backoff_s=self._max_backoff_s)
