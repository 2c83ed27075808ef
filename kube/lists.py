"""Paginated, read-only lists of Kubernetes resources through the official client.

Owns listing every object of one resource across all namespaces the way kube-apiserver wants to be
read (Kubernetes API concepts, "Retrieving large results sets in chunks"): ``GET`` with
``limit`` (500 by default) and the ``continue`` token of the previous page; on ``410 Gone``
(the continue token expired) a fresh list from the start, skipping the objects already delivered
(by uid, else namespace/name); on ``429 Too Many Requests`` (API Priority and Fairness) a wait
of ``Retry-After`` seconds before the same page is asked again; on ``5xx`` a few retries with
back-off. A resource the server does not serve (``404``: CRD not installed) is reported as such,
not as an error.

Only ``GET`` requests are made here: the audit is read-only (PolicyReports are written by
:mod:`kube.policy_reports`, and only when asked). Must not know about policy semantics or HTTP
serving; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.util import Retry

from policies.facts.dra import DRA_RESOURCES
from policies.facts.workload_kinds import JUDGED_KINDS
from policies.value_words import described

DEFAULT_PAGE_SIZE = 500
MAX_RETRY_AFTER_S = 60.0  # longest single wait honoured from a Retry-After header
MAX_THROTTLED = 30  # 429 answers in a row before giving up on a resource
MAX_SERVER_ERRORS = 4  # 5xx answers in a row before giving up on a resource
MAX_RELISTS = 5  # 410 answers in one list before giving up on a resource


@dataclass(frozen=True)
class Resource:
    """One listable resource: ``group`` ``""`` is the core API; ``kind`` names its objects."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def path(self) -> str:
        """The cluster-wide list path (``/api/v1/pods``, ``/apis/apps/v1/deployments``)."""
        if not self.group:
            return f"/api/{self.version}/{self.plural}"
        return f"/apis/{self.group}/{self.version}/{self.plural}"

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``: what list items lack and get filled in with."""
        return self.version if not self.group else f"{self.group}/{self.version}"


#: What the audit reads, in this order: namespaces and nodes first (policies need the namespace
#: object, placement the nodes), then the DRA objects (:data:`policies.facts.dra.DRA_RESOURCES`,
#: in its order: the claims workloads and pods name, resolved with DeviceClasses and
#: ResourceSlices), then the workload controllers, then pods. CRDs (and API versions) that a
#: cluster does not serve answer 404 and are skipped.
AUDIT_RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace"),
    Resource("", "v1", "nodes", "Node"),
    *(Resource("resource.k8s.io", "v1", plural, kind) for plural, kind in DRA_RESOURCES),
    # Pods come last; PodTemplates make no pods by themselves, VMIs run in pods, and the
    # derived kinds (Kueue Workload, Volcano PodGroup) stand for jobs that are listed.
    *(Resource(k.group, k.version, k.plural, k.kind) for k in JUDGED_KINDS
      if k.kind not in ("Pod", "PodTemplate", "VirtualMachineInstance")),
    Resource("", "v1", "pods", "Pod"),
)


class ListError(Exception):
    """A resource could not be listed; the message names the resource and the API's answer."""


class NotServed(ListError):
    """The API server does not serve the resource (404: the CRD is not installed)."""


class Unreachable(ListError):
    """The API server cannot be reached (connection refused or reset, DNS, TLS, timeouts): the
    environment, not the resource — listing anything else would fail the same way."""


@dataclass
class ListStats:
    """What listing one resource took: pages, objects, relists (410), waits (429), retries (5xx).

    ``waited_s`` is the sum of the Retry-After / back-off waits, in seconds.
    """

    pages: int = 0
    objects: int = 0
    relists: int = 0
    throttled: int = 0
    retries: int = 0
    waited_s: float = 0.0
    skipped_duplicates: int = 0
    notes: list[str] = field(default_factory=list)
    #: the List's resourceVersion once the last page arrived (where a watch starts from)
    resource_version: str = ""


def _retry_after(exc: ApiException, default: float) -> float:
    """Seconds asked by a Retry-After header (delta-seconds form); ``default`` when absent."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else default
    except (TypeError, ValueError):
        seconds = default  # an HTTP-date form: kube-apiserver never sends it
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _reason(exc: ApiException) -> str:
    """The API's Status message when the body has one, else the HTTP reason."""
    try:
        status = json.loads(exc.body or "")
        message = status.get("message") if isinstance(status, dict) else None
    except (TypeError, ValueError):
        message = None
    return f"{exc.status} {message or exc.reason or ''}".strip()


class Lister:
    """Lists resources page by page through an authenticated ``kubernetes.client.ApiClient``.

    Args:
        api_client: from :func:`kube.config.detect` or :func:`kube.connect.connect`.
        page_size: ``limit`` of each request (objects per page).
        sleep: how to wait (seconds); tests pass a recorder.
        timeout_s: (connect, read) timeouts of one request, in seconds.
    """

    def __init__(self, api_client: k8s_client.ApiClient, *, page_size: int = DEFAULT_PAGE_SIZE,
                 sleep: Callable[[float], object] = time.sleep,
                 timeout_s: tuple[float, float] = (10.0, 120.0)) -> None:
        self._api = api_client
        self._page_size = page_size
        self._sleep = sleep
        self._timeout = timeout_s
        leave_status_retries_to_lists(api_client)

    def _get(self, resource: Resource, token: str | None) -> dict[str, Any]:
        """One page, as the parsed List. Raises ApiException for non-2xx answers."""
        query: list[tuple[str, Any]] = [("limit", self._page_size)]
        if token:
            query.append(("continue", token))
        request = self._api.param_serialize(
            "GET", resource.path, query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        response = self._api.call_api(*request, _request_timeout=self._timeout)
        body = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=body.decode(
                "utf-8", "replace") if isinstance(body, bytes) else body, data=None)
        page = json.loads(body)
        if not isinstance(page, dict):
            raise ListError(f"{resource.path}: the API answered {described(page)}, "
                            "not a List")
        return page

    def iter_pages(self, resource: Resource,
                   stats: ListStats | None = None) -> Iterator[list[dict[str, Any]]]:
        """Yield each page's items (with ``apiVersion`` and ``kind`` filled in, as kubectl does),
        an object delivered before a 410 restart not again (by uid, else namespace/name).

        Raises:
            NotServed: the resource is not served (404).
            Unreachable: the API server cannot be reached (network errors).
            ListError: any other failure (403 forbidden, repeated 429 / 5xx / 410, network
                errors); the message names the resource.
        """
        stats = stats if stats is not None else ListStats()
        seen: set[str] = set()
        for page in fetch_pages(lambda token: self._get(resource, token), resource.path,
                                sleep=self._sleep, stats=stats):
            items = page.get("items")
            fresh = []
            for item in items if isinstance(items, list) else []:
                if not isinstance(item, dict):
                    continue
                metadata = item.get("metadata")
                if not isinstance(metadata, dict):
                    metadata = {}
                identity = str(metadata.get("uid") or
                               f"{metadata.get('namespace')}/{metadata.get('name')}")
                if identity in seen:
                    stats.skipped_duplicates += 1
                    continue
                seen.add(identity)
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
                fresh.append(item)
            stats.objects += len(fresh)
            yield fresh


class ListCancelled(ListError):
    """The list was stopped while it waited to retry (its cache is shutting down)."""


def fetch_pages(fetch: Callable[[str | None], dict[str, Any]], what: str, *,
                sleep: Callable[[float], object] = time.sleep,
                stats: ListStats | None = None,
                on_restart: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """The pages of one paginated List, each the parsed List object, following ``continue``.

    The one place that decides how gpuguard reads a large list (the module docstring): a 410
    on a continue token starts again from the first page (``on_restart`` is called first, so a
    caller that accumulates can drop what it has); a 429 waits ``Retry-After`` seconds (at most
    :data:`MAX_RETRY_AFTER_S`) and asks for the same page again; a 5xx backs off 1, 2, 4, 8 s
    unless Retry-After says otherwise. ``stats.resource_version`` is the List's resourceVersion
    once the last page arrived.

    Args:
        fetch: one page for a continue token (None: the first page); raises
            ``ApiException`` for non-2xx answers.
        what: names the resource in messages (``/api/v1/pods``, ``namespaces``).
        sleep: how to wait (seconds); a result that is true (``threading.Event.wait`` of a
            stopping cache) cancels the list.

    Raises:
        NotServed: 404. Unreachable: network errors. ListCancelled: ``sleep`` said stop.
        ListError: anything else (403, repeated 429 / 5xx / 410, a body that is not a List).
    """
    stats = stats if stats is not None else ListStats()
    token: str | None = None
    throttled = server_errors = 0
    while True:
        try:
            page = fetch(token)
        except ApiException as exc:
            if exc.status == 404:
                raise NotServed(f"{what}: not served by this cluster") from None
            if exc.status == 410 and token:
                stats.relists += 1
                if stats.relists > MAX_RELISTS:
                    raise ListError(f"{what}: the list expired (410) {stats.relists} times; "
                                    "giving up") from None
                stats.notes.append(f"{what}: continue token expired (410 Gone); "
                                   "listing again from the start")
                if on_restart is not None:
                    on_restart()
                token = None
                continue
            if exc.status == 429:
                throttled += 1
                stats.throttled += 1
                if throttled > MAX_THROTTLED:
                    raise ListError(f"{what}: throttled (429) {throttled} times in a row; "
                                    "giving up") from None
                wait = _retry_after(exc, 1.0)
            elif exc.status is not None and 500 <= exc.status <= 599:
                server_errors += 1
                stats.retries += 1
                if server_errors > MAX_SERVER_ERRORS:
                    raise ListError(f"{what}: {_reason(exc)} ({server_errors} times)") from None
                wait = _retry_after(exc, min(0.5 * 2 ** server_errors, 8.0))
            else:
                raise ListError(f"{what}: {_reason(exc)}") from None
            stats.waited_s += wait
            if sleep(wait):
                raise ListCancelled(f"{what}: stopped while waiting to list again") from None
            continue
        except OSError as exc:
            raise Unreachable(f"{what}: cannot reach the API server: "
                              f"{type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            raise ListError(f"{what}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # urllib3 raises its own hierarchy (MaxRetryError, ...)
            if type(exc).__module__.startswith("urllib3"):
                raise Unreachable(f"{what}: cannot reach the API server: "
                                  f"{type(exc).__name__}") from None
            raise
        throttled = server_errors = 0
        stats.pages += 1
        yield page
        page_metadata = page.get("metadata")
        token = (page_metadata.get("continue") or None) \
            if isinstance(page_metadata, dict) else None
        if not token:
            if isinstance(page_metadata, dict):
                stats.resource_version = str(page_metadata.get("resourceVersion") or "")
            return


def call_pages(call: Callable[..., Any], what: str, *, page_size: int = DEFAULT_PAGE_SIZE,
               sleep: Callable[[float], object] = time.sleep,
               stats: ListStats | None = None,
               on_restart: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """:func:`fetch_pages` through one of the client's typed list methods
    (``CoreV1Api.list_namespace``, a ``functools.partial`` of
    ``CustomObjectsApi.list_cluster_custom_object``), read raw (``_preload_content=False``) so
    the objects stay plain JSON. Same errors as :func:`fetch_pages`."""
    def fetch(token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"limit": page_size, "_preload_content": False,
                                  "_request_timeout": (10, 60)}
        if token:
            kwargs["_continue"] = token
        page = json.loads(call(**kwargs).data)
        if not isinstance(page, dict):
            raise ListError(f"{what}: the API answered {described(page)}, not a List")
        return page

    return fetch_pages(fetch, what, sleep=sleep, stats=stats, on_restart=on_restart)


def leave_status_retries_to_lists(api_client: Any) -> None:
    """Stop urllib3 retrying 429 / 503 answers of ``api_client`` itself (3 times, then
    ``MaxRetryError``, reported as unreachable): they must reach :func:`fetch_pages`, which
    honours Retry-After without that limit. Connection errors are still retried by urllib3."""
    pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool is not None:
        pool.connection_pool_kw["retries"] = Retry(
            total=3, status=0, respect_retry_after_header=False, raise_on_status=False)
