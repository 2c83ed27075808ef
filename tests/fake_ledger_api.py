"""A local fake of kube-apiserver's ConfigMap and Pod endpoints, for the quota ledger tests.

On 127.0.0.1 and a free port, in a background thread (the synchronous ``kubernetes`` client talks
to it):

- ``GET/POST/PUT /api/v1/namespaces/{ns}/configmaps[/{name}]`` with kube-apiserver's optimistic
  concurrency: a PUT whose ``metadata.resourceVersion`` is not the stored one is ``409 Conflict``,
  a POST of an existing name ``409 AlreadyExists``; every write bumps one global resourceVersion;
- ``GET /api/v1/pods`` (list) and ``GET /api/v1/pods?watch=true`` (events from ``push``); with
  ``expire_watch`` set, the next watch answers an ``ERROR`` event with code 410;
- ``down``: answer every request with 503 (an API that cannot serve).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from typing import Any

from aiohttp import web

from tests.fake_api_server import ThreadedAPIServer


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
        self.expire_watch = False
        self._version = 100
        self._lock = threading.Lock()
        self._events: asyncio.Queue[dict[str, Any]] | None = None

    def _bump(self) -> str:
        self._version += 1
        return str(self._version)

    async def _configmap(self, request: web.Request) -> web.Response:
        if self.down:
            return self._status(503, "ServiceUnavailable", "down")
        namespace = request.match_info["namespace"]
        name = request.match_info.get("name")
        if request.method == "GET":
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
        if self.expire_watch:
            self.expire_watch = False
            error = {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                 "reason": "Expired", "message": "too old"}}
            await response.write(json.dumps(error).encode() + b"\n")
            return response
        assert self._events is not None
        while True:
            try:
                event = await asyncio.wait_for(self._events.get(), timeout=2.0)
            except TimeoutError:
                return response
            await response.write(json.dumps(event).encode() + b"\n")

    def push(self, kind: str, pod: dict[str, Any]) -> None:
        """Change a pod and send the watch event (ADDED, MODIFIED, DELETED)."""
        pod = copy.deepcopy(pod)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        pod["metadata"]["resourceVersion"] = self._bump()
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = pod
        assert self._loop is not None and self._events is not None
        self._loop.call_soon_threadsafe(self._events.put_nowait, {"type": kind, "object": pod})

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/configmaps", self._configmap)
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/configmaps/{name}",
                             self._configmap)
        app.router.add_get("/api/v1/pods", self._pods)
        return app

    def _on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events = asyncio.Queue()
