"""List then watch any one resource, handing whole lists and single events to a callback.

Owns following one :class:`kube.lists.Resource` for ``gpuguard audit --watch``: a paginated list
through :class:`kube.lists.Lister` (its 410 / 429 / 5xx handling), then a watch from the list's
resourceVersion (``GET <path>?watch=true``, bookmarks on) in the protocol of
:func:`kube.list_watch.run_list_watch`: a watch that expires (410 Gone) or fails is followed by a
fresh list, which the callback receives whole — the consumer replaces what it holds of the
resource, so nothing is lost or counted twice across an API server restart. A resource the
server does not serve (404: its CRD is not installed) is reported once and listed again every
``not_served_retry_s`` (a CRD installed later is picked up). Runs in a daemon thread.

Must not know what the objects mean; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client as k8s_client

from kube.list_watch import read_events, run_list_watch, shut_down
from kube.lists import Lister, ListStats, NotServed, Resource

_LOG = logging.getLogger("gpuguard.kube.resource_watch")


class ResourceWatch:
    """One resource listed and watched in a worker thread.

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        resource: what to follow.
        on_list: receives every object of a complete list (at start and after each relist).
        on_event: receives ``(type, object)`` per ``ADDED`` / ``MODIFIED`` / ``DELETED`` event
            (objects with ``apiVersion`` and ``kind`` filled in).
        on_not_served: called when the resource is not served (404).
        on_error: receives a message per failure, before each retry.
        watch_timeout_s: server-side timeout of one watch request (seconds).
        max_backoff_s: longest wait between retries after an error (seconds).
        not_served_retry_s: how often a resource not served is listed again (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, resource: Resource, *,
                 on_list: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 on_not_served: Callable[[], None],
                 on_error: Callable[[str], None] = lambda message: None,
                 watch_timeout_s: int = 300, max_backoff_s: float = 30.0,
                 not_served_retry_s: float = 300.0) -> None:
        self._api = api_client
        self.resource = resource
        self._on_list = on_list
        self._on_event = on_event
        self._on_not_served = on_not_served
        self._on_error = on_error
        self._watch_timeout_s = watch_timeout_s
        self._max_backoff_s = max_backoff_s
        self._not_served_retry_s = not_served_retry_s
        self._stop = threading.Event()
        # A 429 / 5xx wait ends when the watch is stopped.
        self._lister = Lister(api_client, sleep=self._stop.wait)
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.lists = 0

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"watch-{self.resource.plural}")
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the worker (shutting the open watch's socket down); wait up to ``timeout`` s."""
        self._stop.set()
        shut_down(self._response, self.resource.plural)
        if self._thread is not None:
            self._thread.join(timeout)

    def _list(self) -> str:
        while True:
            stats = ListStats()
            items: list[dict[str, Any]] = []
            try:
                for page in self._lister.iter_pages(self.resource, stats):
                    items.extend(page)
            except NotServed:
                self._on_not_served()
                if self._stop.wait(self._not_served_retry_s):
                    raise
                continue
            for note in stats.notes:
                _LOG.info("%s", note)
            self._on_list(items)
            self.lists += 1
            return stats.resource_version

    def _events(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        query: list[tuple[str, Any]] = [("watch", "true"), ("allowWatchBookmarks", "true"),
                                        ("timeoutSeconds", self._watch_timeout_s)]
        if version:
            query.append(("resourceVersion", version))
        request = self._api.param_serialize(
            "GET", self.resource.path, query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        # The client's RESTResponse wraps urllib3's response unread (preload_content=False):
        # the watch is read line by line from it as events arrive.
        wrapped = self._api.call_api(*request, _request_timeout=(10, self._watch_timeout_s + 30))
        response: Any = wrapped.response
        if not 200 <= response.status <= 299:
            body = response.data
            response.release_conn()
            if response.status == 410:
                yield "ERROR", {"code": 410, "message": "resourceVersion too old"}
                return
            raise RuntimeError(f"{self.resource.path} watch: HTTP {response.status} "
                               f"{body[:200]!r}")

        def hold(open_response: Any) -> None:
            self._response = open_response

        for kind, obj in read_events(response, stop=self._stop, hold=hold):
            if isinstance(obj, dict) and kind != "ERROR":
                obj.setdefault("apiVersion", self.resource.api_version)
                obj.setdefault("kind", self.resource.kind)
            yield kind, obj

    def _run(self) -> None:
        try:
            run_list_watch(what=self.resource.plural, stop=self._stop, list_once=self._list,
                           events=self._events, apply=self._on_event, failed=self._on_error,
                           max_backoff_s=self._max_backoff_s)
        except NotServed:
            return  # stopped while waiting to list a resource not served
