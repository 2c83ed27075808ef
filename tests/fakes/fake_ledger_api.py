"""A local fake of kube-apiserver's ConfigMap and Pod endpoints, for the quota ledger tests.

On 127.0.0.1 and a free port, in a background thread (the synchronous ``kubernetes`` client talks
to it):

- ``GET/POST/PUT /api/v1/namespaces/{ns}/configmaps[/{name}]`` with kube-apiserver's optimistic
  concurrency: a PUT whose ``metadata.resourceVersion`` is not the stored one is ``409 Conflict``,
  a POST of an existing name ``409 AlreadyExists``; every write bumps one global resourceVersion;
  with ``read_together`` at N, the next N reads are answered together once all N have arrived
  (N replicas that read the same version and then race to write it: a conflict made certain
  instead of left to thread scheduling);
- ``GET /api/v1/pods`` (list) and ``GET /api/v1/pods?watch=true`` (events from ``push``, in
  order, on whichever watch is open or opens next); ``expire`` sends an ``ERROR`` event with code
  410 in that stream, which ends it, as kube-apiserver does when a watch falls too far behind.
  ``watches`` counts the watches opened. A watch stays open until then or until the server
  stops: nothing here depends on a timer;
- ``down``: answer every request with 503 (an API that cannot serve).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from typing import Any

from aiohttp import web

from tests.fakes.fake_api_server import ThreadedAPIServer


class FakeLedgerAPI(ThreadedAPIServer):
    """The fake server (see module docstring). Use as a context manager."""

    thread_name = "fake-ledger-api"
    user = "webhook"

    def __init__(self) -> None:
        super().__init__()
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.conflicts = 0
        self.writes = 0
        self.down = False
        self.watches = 0
        self.read_together = 0
        self._version = 100
        self._lock = threading.Lock()
        self._events: asyncio.Queue[dict[str, Any] | None] | None = None
        self._reads_released: asyncio.Event | None = None

    def _bump(self) -> str:
        self._version += 1
        return str(self._version)

    async def _configmap(self, request: web.Request) -> web.Response:
        if self.down:
            return self._status(503, "ServiceUnavailable", "down")
        namespace = request.match_info["namespace"]
        name = request.match_info.get("name")
        if request.method == "GET":
            if self.read_together > 0:
                assert self._reads_released is not None
                self.read_together -= 1
                if self.read_together:
                    await self._reads_released.wait()
                else:
                    self._reads_released.set()
            found = self.configmaps.get((namespace, str(name)))
            if found is None:
                return self._status(404, "NotFound", f'configmaps "{name}" not found')
            return web.json_response(found)
        body = await request.json()
        name = name or body["metadata"]["name"]
        key = (namespace, str(name))
        with self._lock:  # handlers run on one loop; the lock documents the critical section
            current = self.configmaps.get(key)
            if request.method == "POST":
                if current is not None:
                    self.conflicts += 1
                    return self._status(409, "AlreadyExists", f'configmaps "{name}" already '
                                        "exists")
            elif request.method == "PUT":
                if current is None:
                    return self._status(404, "NotFound", f'configmaps "{name}" not found')
                if body["metadata"].get("resourceVersion") != \
                        current["metadata"]["resourceVersion"]:
                    self.conflicts += 1
                    return self._status(409, "Conflict", "Operation cannot be fulfilled on "
                                        f'configmaps "{name}": the object has been modified; '
                                        "please apply your changes to the latest version and "
                                        "try again")
            else:
                return self._status(405, "MethodNotAllowed", request.method)
            body["metadata"]["resourceVersion"] = self._bump()
            body["metadata"]["namespace"] = namespace
            self.configmaps[key] = body
            self.writes += 1
        return web.json_response(body, status=201 if request.method == "POST" else 200)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        if self.down:
            return self._status(503, "ServiceUnavailable", "down")
        if request.query.get("watch") not in ("true", "1"):
            body = {"kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._version)},
                    "items": list(self.pods.values())}
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.watches += 1
        assert self._events is not None
        while True:
            event = await self._events.get()
            if event is None:  # the server stops
                return response
            await response.write(json.dumps(event).encode() + b"\n")
            if event["type"] == "ERROR":
                return response

    def push(self, kind: str, pod: dict[str, Any]) -> str:
        """Change a pod and send the watch event (ADDED, MODIFIED, DELETED); returns the
        event's resourceVersion."""
        pod = copy.deepcopy(pod)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        version = pod["metadata"]["resourceVersion"] = self._bump()
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = pod
        assert self._loop is not None and self._events is not None
        self._loop.call_soon_threadsafe(self._events.put_nowait, {"type": kind, "object": pod})
        return version

    def expire(self) -> None:
        """End the watch with ``ERROR`` 410 Gone (the client must list again)."""
        error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                             "message": "too old resource version"}}
        assert self._loop is not None and self._events is not None
        self._loop.call_soon_threadsafe(self._events.put_nowait, error)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._events is not None:
            self._loop.call_soon_threadsafe(self._events.put_nowait, None)  # end a watch
        super().__exit__(*exc)

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/configmaps", self._configmap)
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/configmaps/{name}",
                             self._configmap)
        app.router.add_get("/api/v1/pods", self._pods)
        return app

    def _on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events = asyncio.Queue()
        self._reads_released = asyncio.Event()
