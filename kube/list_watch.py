"""The list-then-watch loop shared by gpuguard's caches of cluster objects.

Owns the protocol the Kubernetes API reference describes for keeping a cache current: list (with
its resourceVersion), then watch from that version; a watch that expires (HTTP 410 Gone, or an
``ERROR`` event with code 410) means list again; other failures are retried with exponential
backoff. Runs in a worker thread and stops when its ``stop`` event is set. Also owns reading
one open watch response as events (:func:`read_events`; :func:`watch_stream` opens it through a
client list method), waking a worker blocked on it (:func:`shut_down`: the namespace, pod,
RuntimeClass, gpuguard.io-object and audit-resource watches all stop through it) and handing a
change to the caches' asyncio loop (:func:`post_to_loop`).

Must not know what is cached (namespaces, pods): callers pass how to list, watch and apply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
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
    response = list_call(
        watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
        timeout_seconds=timeout_s, _preload_content=False,
        _request_timeout=(10, timeout_s + 30))
    yield from read_events(response, stop=stop, hold=hold)


def read_events(response: Any, *, stop: threading.Event, hold: Callable[[Any], None],
                ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of one open watch response (urllib3's, unread), line by line as they arrive.

    Args:
        response: the response of a ``watch=true`` request, status 2xx; closed and released
            when the stream ends, fails or is abandoned.
        stop: ends the stream early.
        hold: receives ``response`` now and None when done (for :func:`shut_down`).

    Yields:
        ``(type, object)`` per event line (bookmarks included); ``object`` is ``{}`` when absent.
    """
    from kubernetes.watch.watch import iter_resp_lines  # noqa: PLC0415 - see run_list_watch
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


def shut_down(response: Any, what: str) -> None:
    """Shut the socket of an open watch ``response`` down (None: nothing open), which wakes the
    worker thread's blocking read; closing the response from another thread would wait for that
    read, which holds the stream's lock. ``what`` names the watch in the debug line logged when
    the socket is already closed (the worker is then on its way out)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        _LOG.debug("shutting the %s watch socket down failed", what, exc_info=True)


def post_to_loop(loop: asyncio.AbstractEventLoop | None, change: Callable[[], None],
                 stop: threading.Event) -> None:
    """Run ``change`` on ``loop`` (``call_soon_threadsafe``: a cache read on the loop then needs
    no lock), or at once in this thread when ``loop`` is None. A closed loop (the server is gone)
    sets ``stop``, ending the worker."""
    if loop is None:
        change()
        return
    try:
        loop.call_soon_threadsafe(change)
    except RuntimeError:  # the loop is closed
        stop.set()
