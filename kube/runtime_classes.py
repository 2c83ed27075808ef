"""The cluster's RuntimeClasses for admission: a watch cache of their names.

Owns answering "which RuntimeClasses (``node.k8s.io/v1``) does this cluster have", so that a
``setRuntimeClassName`` mutation is applied only where the class exists (kube-apiserver's
RuntimeClass admission refuses a pod naming a missing one: GKE has no ``nvidia`` class, its GPU
nodes run the NVIDIA runtime by default). :class:`RuntimeClassWatch` lists then watches
``/apis/node.k8s.io/v1/runtimeclasses`` through the official client in a daemon worker thread,
with :func:`kube.list_watch.run_list_watch` (410 Gone relists, other errors back off), and hands
each change to the asyncio loop like :class:`kube.namespaces.NamespaceWatch`, so readers on the
loop need no lock.

Until the first list arrived (or while gpuguard may not list RuntimeClasses) :meth:`names` is
None, "not known", and the mutation applies as written (docs/policies.md says why).

Must not know about HTTP serving or policy semantics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client as k8s_client

from kube.list_watch import post_to_loop, run_list_watch, shut_down, watch_stream

_LOG = logging.getLogger("gpuguard.kube.runtime_classes")


class RuntimeClassWatch:
    """RuntimeClass names of a live cluster, kept current by list + watch in a worker thread.

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient`` (see :mod:`kube.config`).
        watch_timeout_s: server-side timeout of one watch call (seconds).
        max_backoff_s: longest wait between retries after an error (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, *, watch_timeout_s: int = 300,
                 max_backoff_s: float = 30.0) -> None:
        self._api = k8s_client.NodeV1Api(api_client)
        self._watch_timeout_s = watch_timeout_s
        self._max_backoff_s = max_backoff_s
        self._names: set[str] = set()
        self._synced = False
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._response: Any = None

    # --- readers (event-loop thread) -----------------------------------------------------------

    def names(self) -> frozenset[str] | None:
        """The RuntimeClass names, or None until the first list arrived (not known)."""
        return frozenset(self._names) if self._synced else None

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)``, for logs and readiness detail."""
        if self._synced:
            return True, f"{len(self._names)} RuntimeClasses, watching"
        return False, f"RuntimeClass list not received yet: {self._last_error or 'listing'}"

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the worker thread; changes are applied on ``loop`` (or in the thread if None)."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="runtimeclass-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the worker thread (its open watch's socket is shut down to wake its read)."""
        self._stop.set()
        shut_down(self._response, "RuntimeClass")
        if self._thread is not None:
            self._thread.join(timeout)

    # --- worker thread ------------------------------------------------------------------------

    def _post(self, change: Callable[[], None]) -> None:
        post_to_loop(self._loop, change, self._stop)

    def _list_once(self) -> str:
        response = self._api.list_runtime_class(_preload_content=False,
                                                _request_timeout=(10, 60))
        # _preload_content=False gives the raw urllib3 response; the client's types say not.
        page = json.loads(response.data)  # type: ignore[attr-defined]
        names = {str((item.get("metadata") or {}).get("name") or "")
                 for item in page.get("items") or []} - {""}
        version = str((page.get("metadata") or {}).get("resourceVersion") or "")

        def apply() -> None:
            self._names, self._synced, self._last_error = names, True, None
        self._post(apply)
        _LOG.info("RuntimeClasses listed", extra={"fields": {"runtimeClasses": sorted(names)}})
        return version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return

        def apply() -> None:  # a new set each time: a reader in another thread copies the old
            self._names = self._names - {name} if kind == "DELETED" else self._names | {name}
        self._post(apply)

    def _events(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        def hold(response: Any) -> None:
            self._response = response

        return watch_stream(self._api.list_runtime_class, resource_version,
                            timeout_s=self._watch_timeout_s, stop=self._stop, hold=hold)

    def _failed(self, message: str) -> None:
        def apply() -> None:
            self._last_error = message
        self._post(apply)

    def _run(self) -> None:
        run_list_watch(what="RuntimeClass", stop=self._stop, list_once=self._list_once,
                       events=self._events, apply=self._apply, failed=self._failed,
                       max_backoff_s=self._max_backoff_s)
