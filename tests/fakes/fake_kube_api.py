"""A local fake of kube-apiserver's list and PolicyReport endpoints, for tests and the benchmark.

Serves, on 127.0.0.1 and a free port, what the auditor reads and writes, the way kube-apiserver
answers (Kubernetes API concepts, "Retrieving large results sets in chunks"):

- ``GET /api/v1/<plural>`` and ``GET /apis/<group>/<version>/<plural>``: ``limit`` / ``continue``
  pagination; an unknown resource is a 404 Status (a CRD that is not installed);
- injected faults per resource path: ``expire``: the first continue token used gets ``410 Gone``
  (reason ``Expired``); ``throttle``: that many ``429 Too Many Requests`` with ``Retry-After``;
  ``forbid``: ``403``;
- ``GET/POST/PUT/DELETE`` PolicyReports and ClusterPolicyReports (resourceVersion bumped on each
  write; DELETE honours ``preconditions`` uid/resourceVersion with 409), and the list of
  PolicyReports across namespaces with equality ``labelSelector`` / ``fieldSelector``
  (``metadata.name``, ``metadata.namespace``), as kube-apiserver serves a CRD's collection.

Every request is recorded (method, path, query) for assertions. Runs an aiohttp app in a
background thread so the synchronous ``kubernetes`` client can talk to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from policies.facts.dra import DRA_RESOURCES
from tests.fakes.fake_api_server import ThreadedAPIServer

_PLURALS = {
    "Pod": ("", "v1", "pods"), "Node": ("", "v1", "nodes"), "Namespace": ("", "v1", "namespaces"),
    "Deployment": ("apps", "v1", "deployments"), "ReplicaSet": ("apps", "v1", "replicasets"),
    "StatefulSet": ("apps", "v1", "statefulsets"), "DaemonSet": ("apps", "v1", "daemonsets"),
    "Job": ("batch", "v1", "jobs"), "CronJob": ("batch", "v1", "cronjobs"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs"),
    "RayCluster": ("ray.io", "v1", "rayclusters"),
    **{kind: ("resource.k8s.io", "v1", plural) for plural, kind in DRA_RESOURCES},
}


def path_of(obj: Mapping[str, Any]) -> str | None:
    """The list path that serves ``obj`` (None for kinds the fake does not serve)."""
    kind = obj.get("kind")
    api = str(obj.get("apiVersion", ""))
    if kind == "Job" and api.startswith("batch.volcano.sh/"):
        return "/apis/batch.volcano.sh/v1alpha1/jobs"
    if kind not in _PLURALS:
        return None
    group, version, plural = _PLURALS[kind]
    return f"/api/{version}/{plural}" if not group else f"/apis/{group}/{version}/{plural}"


class FakeKubeAPI(ThreadedAPIServer):
    """The fake server (see module docstring). Use as a context manager.

    Args:
        objects: what the lists serve (by :func:`path_of`).
        expire: list paths whose first continue token expires (410).
        throttle: list path → number of 429 answers before serving.
        forbid: list paths answered with 403.
        retry_after: the Retry-After header of the 429s (seconds).
    """

    def __init__(self, objects: Iterable[Mapping[str, Any]] = (), *,
                 expire: Iterable[str] = (), throttle: Mapping[str, int] | None = None,
                 forbid: Iterable[str] = (), retry_after: str = "0") -> None:
        super().__init__()
        self.lists: dict[str, list[bytes]] = {}
        for obj in objects:
            path = path_of(obj)
            if path is not None:
                item = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
                self.lists.setdefault(path, []).append(json.dumps(item).encode())
        self.expire = set(expire)
        self.throttle = dict(throttle or {})
        self.forbid = set(forbid)
        self.retry_after = retry_after
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.reports: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self._version = 1000

    # --- handlers -------------------------------------------------------------------------------

    async def _list(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests.append((request.method, path, dict(request.query)))
        if path in self.forbid:
            return self._status(403, "Forbidden", f'cannot list resource at "{path}"')
        if self.throttle.get(path, 0) > 0:
            self.throttle[path] -= 1
            response = self._status(429, "TooManyRequests", "too many requests, retry later")
            response.headers["Retry-After"] = self.retry_after
            return response
        if path not in self.lists:
            return self._status(404, "NotFound", "the server could not find the requested "
                                "resource")
        items = self.lists[path]
        limit = int(request.query.get("limit") or 0) or len(items) or 1
        token = request.query.get("continue")
        start = 0
        if token:
            if path in self.expire:
                self.expire.discard(path)
                return self._status(410, "Expired", "The provided continue parameter is too "
                                    "old to display a consistent list result. You can start a "
                                    "new list without the continue parameter.")
            start = int(token.split(":")[1])
        page = items[start:start + limit]
        following = start + limit
        metadata = {"resourceVersion": str(self._version)}
        if following < len(items):
            metadata["continue"] = f"page:{following}:{self._version}"
            metadata["remainingItemCount"] = len(items) - following
        body = (b'{"kind":"List","apiVersion":"v1","metadata":' + json.dumps(metadata).encode()
                + b',"items":[' + b",".join(page) + b"]}")
        return web.Response(body=body, content_type="application/json")

    def _report_key(self, request: web.Request) -> tuple[str, str | None, str | None]:
        kind = "ClusterPolicyReport" if "clusterpolicyreports" in request.path \
            else "PolicyReport"
        return kind, request.match_info.get("namespace"), request.match_info.get("name")

    async def _all_reports(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path, dict(request.query)))

        def pairs(selector: str) -> list[tuple[str, str]]:
            return [tuple(term.split("=", 1)) for term in selector.split(",") if term]  # type: ignore[misc]
        labels = pairs(request.query.get("labelSelector", ""))
        fields = pairs(request.query.get("fieldSelector", ""))
        items = []
        for (kind, namespace, name), report in sorted(self.reports.items(), key=str):
            metadata = report["metadata"]
            field_values = {"metadata.name": name, "metadata.namespace": namespace}
            if kind == "PolicyReport" and all(
                    (metadata.get("labels") or {}).get(k) == v for k, v in labels) and all(
                    field_values.get(k) == v for k, v in fields):
                items.append(report)
        return web.json_response({"apiVersion": "wgpolicyk8s.io/v1alpha2",
                                  "kind": "PolicyReportList", "metadata": {},
                                  "items": items})

    async def _report(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path, dict(request.query)))
        kind, namespace, name = self._report_key(request)
        if request.method == "GET":
            found = self.reports.get((kind, namespace, str(name)))
            if found is None:
                return self._status(404, "NotFound", f"{kind} {name} not found")
            return web.json_response(found)
        if request.method == "DELETE":
            key = (kind, namespace, str(name))
            current = self.reports.get(key)
            if current is None:
                return self._status(404, "NotFound", f"{kind} {name} not found")
            wanted = (await request.json() if request.can_read_body else {}).get(
                "preconditions") or {}
            for field in ("uid", "resourceVersion"):
                if field in wanted and wanted[field] != current["metadata"].get(field):
                    return self._status(409, "Conflict", f"Precondition failed: {field}")
            del self.reports[key]
            return web.json_response(current)
        body = await request.json()
        name = name or body["metadata"]["name"]
        key = (kind, namespace, str(name))
        if request.method == "POST" and key in self.reports:
            return self._status(409, "AlreadyExists", f"{kind} {name} already exists")
        if request.method == "PUT":
            current = self.reports.get(key)
            if current is None:
                return self._status(404, "NotFound", f"{kind} {name} not found")
            if body["metadata"].get("resourceVersion") != \
                    current["metadata"]["resourceVersion"]:
                return self._status(409, "Conflict", "the object has been modified")
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)
        self.reports[key] = body
        return web.json_response(body, status=201 if request.method == "POST" else 200)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        reports = "/apis/wgpolicyk8s.io/v1alpha2"
        app.router.add_get(f"{reports}/policyreports", self._all_reports)
        for route in (f"{reports}/namespaces/{{namespace}}/policyreports",
                      f"{reports}/namespaces/{{namespace}}/policyreports/{{name}}",
                      f"{reports}/clusterpolicyreports",
                      f"{reports}/clusterpolicyreports/{{name}}"):
            app.router.add_route("*", route, self._report)
        app.router.add_get("/api/{version}/{plural}", self._list)
        app.router.add_get("/apis/{group}/{version}/{plural}", self._list)
        return app

    def kubeconfig(self, path: Path, context: str = "fake",
                   extra_contexts: tuple[str, ...] = ("other",)) -> Path:
        """A kubeconfig with the ``fake`` context and an ``other`` one (for --context tests)."""
        return super().kubeconfig(path, context, extra_contexts)
