"""Writing PolicyReports (``wgpolicyk8s.io/v1alpha2``) to the cluster: create, or replace in place.

Owns the only writes the audit makes, and only when asked (``gpuguard audit --write-reports``):
one ``PolicyReport`` per namespace and one ``ClusterPolicyReport``, each created when missing and
otherwise replaced with the resourceVersion just read (optimistic concurrency; a ``409 Conflict``
is retried a few times); then :meth:`ReportWriter.prune` deletes gpuguard's own PolicyReports of
namespaces the complete scan no longer reports on (their workloads are gone), so no report keeps
saying a namespace fails after its last violating workload was deleted. The report objects are
built by the auditor; this module only moves them.

Must not build or interpret reports; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

GROUP = "wgpolicyk8s.io"
VERSION = "v1alpha2"
_CONFLICT_RETRIES = 3


@dataclass(frozen=True)
class WriteResult:
    """What happened to one report: ``action`` is ``created``, ``replaced``, ``deleted`` (a
    namespace with nothing left to report) or ``failed``."""

    kind: str
    namespace: str | None
    name: str
    action: str
    message: str = ""


def _path(kind: str, namespace: str | None, name: str | None = None) -> str:
    plural = "policyreports" if kind == "PolicyReport" else "clusterpolicyreports"
    base = f"/apis/{GROUP}/{VERSION}"
    base += f"/namespaces/{namespace}/{plural}" if kind == "PolicyReport" else f"/{plural}"
    return f"{base}/{name}" if name else base


class ReportWriter:
    """Creates or replaces report objects through an authenticated ``ApiClient``."""

    def __init__(self, api_client: k8s_client.ApiClient,
                 timeout_s: tuple[float, float] = (10.0, 60.0)) -> None:
        self._api = api_client
        self._timeout = timeout_s

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        request = self._api.param_serialize(
            method, path, header_params={"Accept": "application/json",
                                         "Content-Type": "application/json"},
            body=dict(body) if body is not None else None, auth_settings=["BearerToken"])
        response = self._api.call_api(*request, _request_timeout=self._timeout)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=data.decode(
                "utf-8", "replace") if isinstance(data, bytes) else data, data=None)
        return json.loads(data) if data else None

    def write(self, report: Mapping[str, Any]) -> WriteResult:
        """Create ``report``, or replace the existing object of the same name."""
        kind = str(report.get("kind"))
        metadata = report.get("metadata") or {}
        name = str(metadata.get("name"))
        namespace = metadata.get("namespace")
        for _ in range(_CONFLICT_RETRIES):
            try:
                try:
                    current = self._call("GET", _path(kind, namespace, name))
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    self._call("POST", _path(kind, namespace), report)
                    return WriteResult(kind, namespace, name, "created")
                version = (current.get("metadata") or {}).get("resourceVersion")
                body = {**report, "metadata": {**metadata, "resourceVersion": version}}
                self._call("PUT", _path(kind, namespace, name), body)
                return WriteResult(kind, namespace, name, "replaced")
            except ApiException as exc:
                if exc.status == 409:
                    continue
                detail = exc.reason or ""
                if exc.status == 404:
                    detail = (f"the {kind} CRD ({GROUP}/{VERSION}) is not installed "
                              "(kubernetes-sigs/wg-policy-prototypes)")
                return WriteResult(kind, namespace, name, "failed", f"{exc.status} {detail}")
            except Exception as exc:  # network failures: report, keep writing the others
                return WriteResult(kind, namespace, name, "failed",
                                   f"{type(exc).__name__}: {exc}")
        return WriteResult(kind, namespace, name, "failed", "409 Conflict: changed meanwhile "
                           f"{_CONFLICT_RETRIES} times")

    def delete(self, kind: str, namespace: str | None, name: str) -> WriteResult:
        """Delete one report object (``gpuguard audit --watch``: its namespace has nothing left
        to report); one already gone counts as deleted. Failures are returned, never raised."""
        try:
            self._call("DELETE", _path(kind, namespace, name))
        except ApiException as exc:
            if exc.status != 404:
                return WriteResult(kind, namespace, name, "failed",
                                   f"{exc.status} {exc.reason or ''}")
        except Exception as exc:  # network failures: report, the caller retries
            return WriteResult(kind, namespace, name, "failed", f"{type(exc).__name__}: {exc}")
        return WriteResult(kind, namespace, name, "deleted")

    def write_all(self, reports: Iterable[Mapping[str, Any]]) -> list[WriteResult]:
        """Write every report; failures are returned, never raised."""
        return [self.write(report) for report in reports]

    def prune(self, written: Iterable[Mapping[str, Any]], *, name: str,
              labels: Mapping[str, str]) -> list[WriteResult]:
        """Delete the ``PolicyReport`` objects called ``name`` carrying ``labels`` in namespaces
        that ``written`` has none for; failures are returned, never raised.

        Only call after a complete scan: a namespace missing from a partial one would lose a
        report that is still true. Each delete is conditional on the uid and resourceVersion
        just listed (``Preconditions``), so a report another audit rewrote meanwhile stays.
        """
        keep = {str((r.get("metadata") or {}).get("namespace")) for r in written
                if r.get("kind") == "PolicyReport"}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        query = f"?labelSelector={quote(selector)}&fieldSelector={quote('metadata.name=' + name)}"
        try:
            listed = self._call("GET", f"/apis/{GROUP}/{VERSION}/policyreports{query}")
        except ApiException as exc:
            return [WriteResult("PolicyReport", None, name, "failed",
                                f"listing the reports to prune: {exc.status} {exc.reason or ''}")]
        except Exception as exc:  # network failures: report, the written reports stand
            return [WriteResult("PolicyReport", None, name, "failed",
                                f"listing the reports to prune: {type(exc).__name__}: {exc}")]
        results = []
        for item in (listed or {}).get("items") or []:
            metadata = item.get("metadata") or {}
            namespace = str(metadata.get("namespace"))
            if namespace in keep or metadata.get("name") != name:
                continue
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {
                "uid": metadata.get("uid"), "resourceVersion": metadata.get("resourceVersion")}}
            try:
                self._call("DELETE", _path("PolicyReport", namespace, name), body)
                results.append(WriteResult("PolicyReport", namespace, name, "deleted"))
            except ApiException as exc:
                if exc.status in (404, 409):  # gone, or rewritten meanwhile: not ours to delete
                    continue
                results.append(WriteResult("PolicyReport", namespace, name, "failed",
                                           f"{exc.status} {exc.reason or ''}"))
            except Exception as exc:
                results.append(WriteResult("PolicyReport", namespace, name, "failed",
                                           f"{type(exc).__name__}: {exc}"))
        return results
