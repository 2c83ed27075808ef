"""Namespace objects for admission: a watch cache on the cluster, or a file when standalone.

Owns answering "what is the Namespace object of ``name``" (labels for ``namespaceSelector``, the
``namespaceObject`` CEL variable) from:

- :class:`NamespaceWatch`: a paginated list then a watch of ``/api/v1/namespaces`` through the
  official ``kubernetes`` client, in a daemon worker thread that hands each change to the asyncio
  loop (``loop.call_soon_threadsafe``), so readers on the loop need no lock. A watch that expires
  (HTTP 410 Gone, or an ``ERROR`` event with code 410) is followed by a fresh list that replaces
  the whole cache (deletions missed meanwhile are dropped); other errors are retried with
  back-off. Code on the loop can wait for the cache to reach a state (a resourceVersion
  applied, the first list) with :meth:`NamespaceWatch.wait_for` instead of polling.
- :class:`StaticNamespaces`: a fixed map, e.g. read by :func:`read_namespace_file` from YAML
  (namespace name → labels map, or ``kubectl get ns -o yaml`` output).

A namespace the source does not know gets a stub carrying only the
``kubernetes.io/metadata.name`` label, which the API server sets on every namespace.

Must not know about HTTP serving or policy semantics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from kube.list_watch import post_to_loop, run_list_watch, shut_down, watch_stream
from kube.lists import ListStats, call_pages, leave_status_retries_to_lists
from policies.facts.review import NAMESPACE_NAME_LABEL, namespace_stub
from policies.sources import LoadError, parse_text

_LOG = logging.getLogger("gpuguard.kube.namespaces")


class NamespaceFileError(ValueError):
    """A namespace-labels file that cannot be used; the message names the file and the entry."""


def _trim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Namespace as CEL sees it: without managedFields, with the name label present."""
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("managedFields", None)
    name = str(metadata.get("name") or "")
    metadata["labels"] = {**(metadata.get("labels") or {}), NAMESPACE_NAME_LABEL: name}
    return {"apiVersion": "v1", "kind": "Namespace", **{k: v for k, v in obj.items()
                                                         if k in ("spec", "status")},
            "metadata": metadata}


def _labels_of(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise NamespaceFileError(f"{where}: expected a map of label names to values")
    labels = {}
    for key, label in value.items():
        if not isinstance(key, str) or not key:
            raise NamespaceFileError(f"{where}: label name {key!r} is not a string")
        if isinstance(label, (dict, list)):
            raise NamespaceFileError(f"{where}.{key}: expected a label value (a string)")
        labels[key] = "" if label is None else (str(label).lower() if isinstance(label, bool)
                                                else str(label))
    return labels


def parse_namespace_documents(documents: list[Any], source: str) -> dict[str, dict[str, Any]]:
    """Namespace objects by name from parsed YAML documents (see :func:`read_namespace_file`).

    Raises:
        NamespaceFileError: an entry that is neither form; the message names it.
    """
    namespaces: dict[str, dict[str, Any]] = {}
    for index, document in enumerate(documents):
        if document is None:
            continue
        where = f"{source}: document {index}"
        if not isinstance(document, Mapping):
            raise NamespaceFileError(f"{where}: expected a map of namespace names to labels, a "
                                     "Namespace or a List of Namespaces")
        kind = document.get("kind")
        if kind in ("List", "NamespaceList", "Namespace") and "apiVersion" in document:
            items = document.get("items") if kind != "Namespace" else [document]
            if not isinstance(items, list):
                raise NamespaceFileError(f"{where}: items: expected a list of Namespaces")
            for i, item in enumerate(items):
                item_where = where if kind == "Namespace" else f"{where}: items[{i}]"
                if not isinstance(item, Mapping) or item.get("kind", "Namespace") != "Namespace":
                    raise NamespaceFileError(f"{item_where}: expected a Namespace")
                metadata = item.get("metadata")
                name = metadata.get("name") if isinstance(metadata, Mapping) else None
                if not isinstance(metadata, Mapping) or not isinstance(name, str) or not name:
                    raise NamespaceFileError(f"{item_where}: metadata.name: expected a name")
                labels = _labels_of(metadata.get("labels"), f"{item_where}: metadata.labels")
                namespaces[name] = _trim({**item, "metadata": {**metadata, "labels": labels}})
            continue
        for name, labels in document.items():
            if not isinstance(name, str) or not name:
                raise NamespaceFileError(f"{where}: namespace name {name!r} is not a string")
            namespaces[name] = namespace_stub(name, _labels_of(labels, f"{where}: {name}"))
    return namespaces


def read_namespace_file(path: str) -> dict[str, dict[str, Any]]:
    """Read namespace labels from YAML: ``name: {label: value}`` maps, or Namespace objects.

    Accepted forms: a map of namespace name to its labels map (``team-a: {gpuguard.io/team:
    a}``), ``kubectl get ns -o yaml`` output (a ``List`` of Namespaces), or Namespace documents
    separated by ``---``.

    Raises:
        NamespaceFileError: the file cannot be read or parsed, or an entry is malformed.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NamespaceFileError(f"{path}: cannot be read: {exc}") from None
    documents = []
    for parsed in parse_text(path, text):  # the one YAML reader (it refuses alias bombs)
        if isinstance(parsed, LoadError):
            raise NamespaceFileError(str(parsed))
        documents.append(parsed[1])
    return parse_namespace_documents(documents, path)


class StaticNamespaces:
    """A fixed set of namespaces (from a file, or none at all).

    Args:
        namespaces: Namespace objects by name.
        source: where they came from, for logs (``file PATH`` or ``none``).
    """

    def __init__(self, namespaces: Mapping[str, Mapping[str, Any]], source: str) -> None:
        self._namespaces = dict(namespaces)
        self.source = source

    def get(self, name: str) -> Mapping[str, Any]:
        """The Namespace object of ``name`` (a stub when unknown)."""
        found = self._namespaces.get(name)
        return found if found is not None else namespace_stub(name)

    def status(self) -> tuple[bool, str]:
        """Always synced: ``(True, description)``."""
        return True, f"{len(self._namespaces)} namespaces from {self.source}"

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""



class NamespaceWatch:
    """Namespaces of a live cluster, kept current by list + watch in a worker thread.

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient`` (see :mod:`kube.config`).
        watch_timeout_s: server-side timeout of one watch call (seconds); the watch is resumed
            from the last resourceVersion after it.
        page_size: namespaces per list page.
        max_backoff_s: longest wait between retries after an error (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, *, watch_timeout_s: int = 300,
                 page_size: int = 500, max_backoff_s: float = 30.0) -> None:
        leave_status_retries_to_lists(api_client)
        self._api = k8s_client.CoreV1Api(api_client)
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._max_backoff_s = max_backoff_s
        self._namespaces: dict[str, dict[str, Any]] = {}
        self._synced = False
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._response: Any = None
        self._waiters: list[asyncio.Future[None]] = []
        self.lists = 0  # completed lists (the first, then one per relist)
        self.resource_version = ""  # of the last list or event applied
        self.source = "cluster watch"

    # --- readers (event-loop thread) -----------------------------------------------------------

    def get(self, name: str) -> Mapping[str, Any]:
        """The Namespace object of ``name`` (a stub when unknown, e.g. created a moment ago)."""
        found = self._namespaces.get(name)
        return found if found is not None else namespace_stub(name)

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)``: synced once the first list arrived."""
        if self._synced:
            return True, f"{len(self._namespaces)} namespaces, watching"
        return False, f"namespace list not received yet: {self._last_error or 'listing'}"

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds: checked now, then after each change applied on
        the loop (a list, an event, an error). Only with a loop given to :meth:`start`; the
        caller bounds the wait (``asyncio.timeout``), as the cluster may never get there.

        E.g. ``await watch.wait_for(lambda: watch.resource_version == "200")``; a
        resourceVersion is opaque, so compare it for equality only.
        """
        while not condition():
            future = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            try:
                await future
            finally:
                if future in self._waiters:
                    self._waiters.remove(future)

    def _changed(self) -> None:
        """Wake :meth:`wait_for` (on the loop, after a change was applied)."""
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the worker thread; changes are applied on ``loop`` (or in the thread if None)."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="namespace-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the worker thread and wait up to ``timeout`` seconds for it.

        The open watch's socket is shut down, which wakes the thread's blocking read (closing
        the response from here would wait for that read: it holds the stream's lock).
        """
        self._stop.set()
        shut_down(self._response, "namespace")
        if self._thread is not None:
            self._thread.join(timeout)

    # --- worker thread ------------------------------------------------------------------------

    def _post(self, change: Callable[[], None]) -> None:
        post_to_loop(self._loop, change, self._stop)

    def _replace(self, namespaces: dict[str, dict[str, Any]], version: str) -> None:
        def apply() -> None:
            self._namespaces = namespaces
            self._synced = True
            self._last_error = None
            self.lists += 1
            self.resource_version = version
            self._changed()
        self._post(apply)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return

        version = str(obj["metadata"].get("resourceVersion") or "")

        def apply() -> None:
            if kind == "DELETED":
                self._namespaces.pop(name, None)
            else:
                self._namespaces[name] = obj
            self.resource_version = version or self.resource_version
            self._changed()
        self._post(apply)

    def _list(self) -> tuple[dict[str, dict[str, Any]], str]:
        namespaces: dict[str, dict[str, Any]] = {}
        stats = ListStats()
        for page in call_pages(self._api.list_namespace, "namespaces", page_size=self._page_size,
                               sleep=self._stop.wait, stats=stats, on_restart=namespaces.clear):
            for item in page.get("items") or []:
                trimmed = _trim(item)
                namespaces[trimmed["metadata"]["name"]] = trimmed
        return namespaces, stats.resource_version

    def _events(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        def hold(response: Any) -> None:
            self._response = response

        return watch_stream(self._api.list_namespace, resource_version,
                            timeout_s=self._watch_timeout_s, stop=self._stop, hold=hold)

    def _run(self) -> None:
        def list_once() -> str:
            namespaces, version = self._list()
            self._replace(namespaces, version)
            _LOG.info("namespace cache listed", extra={"fields": {
                "namespaces": len(namespaces), "resourceVersion": version}})
            return version

        run_list_watch(what="namespace", stop=self._stop, list_once=list_once,
                       events=self._events, apply=lambda kind, obj: self._apply(kind, _trim(obj)),
                       failed=self._failed, max_backoff_s=self._max_backoff_s)

    def _failed(self, message: str) -> None:
        def apply() -> None:
            self._last_error = message
            self._changed()
        self._post(apply)
