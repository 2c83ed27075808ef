"""The list-then-watch loop shared by gpuguard's caches of cluster objects.

Owns the protocol the Kubernetes API reference describes for keeping a cache current: list (with
its resourceVersion), then watch from that version; a watch that expires (HTTP 410 Gone, or an
``ERROR`` event with code 410) means list again; other failures are retried with exponential
backoff. Runs in a worker thread and stops when its ``stop`` event is set.

Must not know what is cached (namespaces, pods): callers pass how to list, watch and apply.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_LOG = logging.getLogger("gpuguard.kube")
WATCHED = ("ADDED", "MODIFIED", "DELETED")


class _Gone(Exception):
    """The watch's resourceVersion expired: list again."""


def run_list_watch(
    *,
    what: str,
    stop: threading.Event,
    list_once: Callable[[], str],
    events: Callable[[str], Iterator[tuple[str, dict[str, Any]]]],
    apply: Callable[[str, dict[str, Any]], None],
    failed: Callable[[str], None],
    max_backoff_s: float = 30.0,
) -> None:
    """List and watch until ``stop`` is set.

    Args:
        what: a name for logs (``namespace``, ``pod``).
        stop: set to end the loop (also ends the waits between retries).
        list_once: list every object, fill the cache, return the list's resourceVersion.
        events: watch from a resourceVersion, yielding ``(type, object)`` events until the
            server closes the watch.
        apply: apply one ADDED / MODIFIED / DELETED event to the cache.
        failed: record an error message (for readiness reporting); called before each backoff.
        max_backoff_s: longest wait between retries after an error (seconds).
    """
    # Imported when a cache starts, not with the module: the client costs ~1 s of CPU at start-up
    # (gpuguard check --help imports this module through kube.pod_cache).
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
    backoff = 0.5
    while not stop.is_set():
        try:
            version = list_once()
            backoff = 0.5
            while not stop.is_set():
                started, count = time.monotonic(), 0
                for kind, obj in events(version):
                    count += 1
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone(str(obj.get("message") or "resourceVersion expired"))
                        raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in WATCHED:
                        apply(kind, obj)
                if not count and time.monotonic() - started < 1.0:
                    stop.wait(1.0)  # a watch closed at once: do not hammer the API
            continue
        except _Gone as exc:
            _LOG.info("%s watch expired (410 Gone); listing again", what,
                      extra={"fields": {"detail": str(exc)}})
            continue
        except ApiException as exc:
            if exc.status == 410:
                _LOG.info("%s watch expired (410 Gone); listing again", what)
                continue
            message = f"API error {exc.status} {exc.reason}"
        except Exception as exc:  # network errors of every kind: retry
            if stop.is_set():
                return
            message = f"{type(exc).__name__}: {exc}"
        failed(message)
        _LOG.warning("%s watch failed; retrying", what,
                     extra={"fields": {"error": message, "retry_in_s": backoff}})
        stop.wait(backoff)
        backoff = min(backoff * 2, max_backoff_s)


def watch_stream(
    list_call: Callable[..., Any], resource_version: str, *, timeout_s: int,
    stop: threading.Event, hold: Callable[[Any], None],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Watch events of one list call (``CoreV1Api.list_namespace``, …) from a resourceVersion.

    Args:
        list_call: the client's list method; called with ``watch=True``.
        timeout_s: server-side timeout of the watch (seconds).
        stop: ends the stream early.
        hold: receives the open response (and None when done), so a stopping cache can shut
            its socket down.

    Yields:
        ``(type, object)`` per event line (bookmarks included).
    """
    from kubernetes.watch.watch import iter_resp_lines  # noqa: PLC0415 - see run_list_watch
    response = list_call(
        watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
        timeout_seconds=timeout_s, _preload_content=False,
        _request_timeout=(10, timeout_s + 30))
    hold(response)
    try:
        for line in iter_resp_lines(response):
            if stop.is_set():
                return
            if line.strip():
                event = json.loads(line)
                yield str(event.get("type")), event.get("object") or {}
    finally:
        hold(None)
        response.close()
        response.release_conn()
