"""Writing annotations on a Node with one JSON merge patch (``gpuguard inventory --annotate-node``).

Owns the single write the inventory agent makes: ``PATCH /api/v1/nodes/NAME`` with
``Content-Type: application/merge-patch+json`` and the body
``{"metadata": {"annotations": {KEY: VALUE}}}`` (RFC 7386: only those keys change; a None value
removes the key). No read-modify-write, so no resourceVersion conflict with the kubelet or the
device plugin updating the same Node; RBAC needs only ``patch`` on ``nodes``.

Must not build or interpret the annotation values; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

__all__ = ["AnnotationError", "NodeAnnotator", "merge_patch"]

MERGE_PATCH = "application/merge-patch+json"


class AnnotationError(Exception):
    """The Node could not be patched; ``str()`` is one line (status and reason)."""


def merge_patch(annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """The JSON merge patch that sets (or, for None, removes) ``annotations`` on an object."""
    return {"metadata": {"annotations": dict(annotations)}}


class NodeAnnotator:
    """Patches Node annotations through an authenticated ``kubernetes.client.ApiClient``.

    Args:
        api_client: e.g. ``kube.config.detect(...).api_client``.
        timeout_s: (connect, read) timeouts in seconds.
    """

    def __init__(self, api_client: k8s_client.ApiClient,
                 timeout_s: tuple[float, float] = (5.0, 30.0)) -> None:
        self._api = api_client
        self._timeout = timeout_s

    def annotate(self, node: str, annotations: Mapping[str, str | None]) -> None:
        """Set ``annotations`` on Node ``node`` (one merge patch).

        Raises:
            AnnotationError: the API server refused (403 without RBAC, 404 no such node, …) or
                could not be reached.
        """
        path = f"/api/v1/nodes/{quote(node, safe='')}"
        try:
            request = self._api.param_serialize(
                "PATCH", path,
                header_params={"Accept": "application/json", "Content-Type": MERGE_PATCH},
                body=merge_patch(annotations), auth_settings=["BearerToken"])
            response = self._api.call_api(*request, _request_timeout=self._timeout)
            data = response.read()
        except ApiException as exc:
            raise AnnotationError(f"node {node}: {exc.status} {exc.reason}") from None
        except Exception as exc:  # urllib3 / socket errors: one line, the caller decides
            raise AnnotationError(f"node {node}: {type(exc).__name__}: {exc}") from None
        if not 200 <= response.status <= 299:
            raise AnnotationError(f"node {node}: {response.status} {_reason(data)}")


def _reason(data: Any) -> str:
    """The ``message`` of a Kubernetes Status body, else the body's first 200 characters."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
    try:
        status = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return status["message"]
    return text[:200]
