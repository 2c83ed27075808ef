"""What the engine evaluates: one admission request (or one audited object), as plain data.

Owns turning an ``admission.k8s.io/v1`` (or ``v1beta1``) AdmissionRequest — or a bare object read
from a file — into a :class:`ReviewInput`: operation, object / oldObject, the resource and
subresource, userInfo, dryRun, and the namespace object when known. Field names follow the
Kubernetes API reference for AdmissionReview. The webhook parses the wire envelope and the CLI
reads files; both end here, so admission and audit see the same input.

Must not do I/O, read the clock (callers pass ``now``) or evaluate policies.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeGuard

from policies.facts.dra import DraIndex
from policies.facts.identity import identity_problems
from policies.facts.openapi import stored_form
from policies.facts.workload_kinds import PLURALS
from policies.json_fields import mapping_at
from policies.records import maker
from policies.value_words import described, type_words

OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label kube-apiserver sets on every Namespace to its name (immutable, and it wins over any
value written for it: Kubernetes API reference, "Well-Known Labels")."""


def namespace_stub(name: str, labels: Mapping[str, Any] | None = None,
                   annotations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Namespace object ``namespaceObject`` is for ``name``: ``labels`` (and
    ``annotations``) plus :data:`NAMESPACE_NAME_LABEL`, which always wins, as on the API server."""
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {**{str(k): str(v) for k, v in (labels or {}).items()},
                   NAMESPACE_NAME_LABEL: name},
    }
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def runtime_class_names(objects: Iterable[Mapping[str, Any]]) -> frozenset[str] | None:
    """The names of the RuntimeClass objects (``node.k8s.io``) among ``objects``, for
    :attr:`ReviewInput.runtime_classes`; None when there is none (nothing is known: an input
    without RuntimeClasses says nothing of the cluster's)."""
    names = {str(mapping_at(obj, "metadata").get("name") or "") for obj in objects
             if obj.get("kind") == "RuntimeClass"
             and str(obj.get("apiVersion", "")).startswith("node.k8s.io/")}
    names.discard("")
    return frozenset(names) if names else None


class ReviewError(ValueError):
    """An AdmissionRequest that cannot be evaluated.

    The message names the field and what was expected (e.g. ``request.operation: expected one of
    CREATE, UPDATE, DELETE, CONNECT``).
    """


@dataclass(frozen=True)
class GroupVersionResource:
    """``{group, version, resource}`` as in AdmissionRequest.resource (group ``""`` is core)."""

    group: str
    version: str
    resource: str


@dataclass(frozen=True)
class UserInfo:
    """The requesting user (AdmissionRequest.userInfo)."""

    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``userInfo`` map as the API writes it."""
        return {"username": self.username, "uid": self.uid, "groups": list(self.groups),
                "extra": dict(self.extra)}


@dataclass(frozen=True)
class ReviewInput:
    """One thing to evaluate.

    Attributes:
        operation: CREATE, UPDATE, DELETE or CONNECT.
        object / old_object: the new and old objects (None where the API sends null: DELETE has
            no ``object``, CREATE no ``oldObject``).
        resource: the resource requested; ``subresource`` e.g. ``ephemeralcontainers`` or ``""``.
        kind: the object's ``(group, version, kind)``.
        namespace / name: from the request (``name`` is empty for ``generateName`` objects).
        user: the requesting user. dry_run: nothing may be recorded or reserved.
        request: the AdmissionRequest map exposed to CEL as ``request``.
        namespace_object: the Namespace object when known (labels for namespaceSelector).
        now: the time the request is evaluated at (exception expiry).
        runtime_classes: the names of the cluster's RuntimeClasses (node.k8s.io/v1) when known
            (the webhook's RuntimeClass watch, RuntimeClass objects given to ``check``); None
            when unknown. A ``setRuntimeClassName`` mutation naming a class outside a known set
            is not applied.
        dra: the DRA objects (ResourceClaimTemplates, ResourceClaims, DeviceClasses,
            ResourceSlices) the pod's claims are resolved against (``check``: those of ``-f``
            and ``--snapshot``); None: none known, a claim's devices are unknown.
    """

    operation: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    resource: GroupVersionResource
    subresource: str
    kind: tuple[str, str, str]
    namespace: str | None
    name: str
    user: UserInfo
    dry_run: bool
    request: Mapping[str, Any]
    namespace_object: Mapping[str, Any] | None = None
    now: datetime.datetime = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    runtime_classes: frozenset[str] | None = None
    dra: DraIndex | None = None

    @property
    def subject(self) -> Mapping[str, Any] | None:
        """The object policies look at: ``object``, or ``oldObject`` for DELETE."""
        return self.object if self.object is not None else self.old_object

    @property
    def resource_path(self) -> str:
        """``pods`` or ``pods/ephemeralcontainers``: what match.resources names."""
        return f"{self.resource.resource}/{self.subresource}" if self.subresource \
            else self.resource.resource


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# Every admission request makes one of each: their frozen __init__ cost 38 k instructions of the
# 87 k of from_request (see policies.records).
_make_review = maker(ReviewInput)
_make_user = maker(UserInfo)


def _split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def plural_of(kind: str) -> str:
    """The plural resource name of a kind (``Deployment`` → ``deployments``)."""
    return PLURALS.get(kind, kind.lower() + "s")


def from_object(
    obj: Mapping[str, Any],
    *,
    operation: str = "CREATE",
    user: UserInfo | None = None,
    namespace_object: Mapping[str, Any] | None = None,
    now: datetime.datetime | None = None,
) -> ReviewInput:
    """A review of a bare object, as if it were being created (the audit and ``check`` path),
    or updated, deleted, connected to with ``operation``: on DELETE the object is ``oldObject``
    and ``object`` is null, as kube-apiserver sends it (Kubernetes API reference,
    AdmissionRequest).

    The object is judged in the form the API server would hand to admission
    (:func:`policies.facts.openapi.stored_form`): a manifest's ``nvidia.com/gpu: 8`` is the
    string ``"8"``, ``cpu: 0.5`` is ``"500m"``, as policies see them in the cluster.

    Raises:
        ReviewError: ``kind``, ``metadata`` or a name field is not of its API type
            (:func:`policies.facts.identity.identity_problems`): the API server refuses such an
            object, and reading ``namespace: 2024`` as ``"2024"`` would judge one it never admits.
    """
    problems = identity_problems(obj)
    if problems:
        raise ReviewError("; ".join(problems) + _QUOTE_HINT * any(
            p.rpartition(", got ")[2].startswith(("the number ", "the boolean "))
            for p in problems))
    obj = stored_form(obj)
    metadata = mapping_at(obj, "metadata")
    group, version = _split_api_version(str(obj.get("apiVersion", "")))
    kind = str(obj.get("kind", ""))
    user = user or UserInfo()
    namespace = metadata.get("namespace")
    if not namespace and isinstance(namespace_object, Mapping) and kind != "Namespace":
        ns_meta = namespace_object.get("metadata")
        namespace = ns_meta.get("name") if isinstance(ns_meta, Mapping) else None
    name = str(metadata.get("name") or "")
    resource = GroupVersionResource(group, version, plural_of(kind))
    current, old = (None, obj) if operation == "DELETE" else (obj, None)
    request = {
        "uid": "", "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource.resource},
        "name": name, "namespace": namespace, "operation": operation,
        "userInfo": user.to_dict(), "object": current, "oldObject": old, "dryRun": False,
    }
    return ReviewInput(
        operation=operation, object=current, old_object=old, resource=resource, subresource="",
        kind=(group, version, kind), namespace=namespace, name=name, user=user, dry_run=False,
        request=request, namespace_object=namespace_object,
        now=now or datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
    )


_RESOURCES: dict[tuple[str, str, str], GroupVersionResource] = {}
_RESOURCES_LIMIT = 4096  # a cluster serves a few hundred resources; a flood of made-up ones


def _resource(group: str, version: str, resource: str) -> GroupVersionResource:
    """The (frozen, so shared) GroupVersionResource of these names: one per resource a process
    sees, not one per request (each cost ~6 k instructions)."""
    key = (group, version, resource)
    found = _RESOURCES.get(key)
    if found is None:
        if len(_RESOURCES) >= _RESOURCES_LIMIT:
            _RESOURCES.clear()
        found = _RESOURCES[key] = GroupVersionResource(group, version, resource)
    return found


_QUOTE_HINT = " (YAML reads an unquoted number or true/false as that type: quote the value)"


def _gvk(value: Any, where: str) -> tuple[str, str, str]:
    _gvk_fields(value, where, ("group", "version", "kind"))
    return (value.get("group") or "", value.get("version") or "", value.get("kind") or "")


def _gvk_fields(value: Any, where: str, names: tuple[str, str, str]) -> None:
    """Refuse a ``kind`` / ``resource`` that is not an object of strings (null fields are
    empty), as the API server's types are.

    Raises:
        ReviewError: naming the field and what it holds.
    """
    if not _is_object(value):
        raise ReviewError(f"{where}: expected an object with {', '.join(names[:2])} and "
                          f"{names[2]}, got {described(value)}")
    for name in names:
        field_value = value.get(name)
        if field_value is not None and not isinstance(field_value, str):
            raise ReviewError(f"{where}.{name}: expected a string, got "
                              f"{described(field_value)}")


def _is_object(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is a JSON object: a dict (what JSON and YAML give, checked first: the
    ABC check is several times slower) or another Mapping."""
    return type(value) is dict or isinstance(value, Mapping)


class RequestShape(NamedTuple):
    """What a policy's resource rules are matched against, read from an AdmissionRequest by
    :func:`request_shape`: the resource (``resource``, or the plural of the object's kind when
    the request has none), the subresource (``""`` when none), the operation and the object's
    ``(group, version, kind)``. A named tuple: one is made per admission request, and a frozen
    dataclass costs several times as much to make."""

    resource: GroupVersionResource
    subresource: str
    operation: str
    kind: tuple[str, str, str]

    @property
    def key(self) -> tuple[str, str, str, str, str, str]:
        """:func:`shape_key` of this shape: the same for every request of it."""
        return shape_key(self.resource, self.subresource, self.operation, self.kind)


def shape_key(resource: GroupVersionResource, subresource: str, operation: str,
              kind: tuple[str, str, str]) -> tuple[str, str, str, str, str, str]:
    """``(group, version, resource, subresource, operation, kind)``: what a policy's resource
    rules are matched against, as one hashable key (the engine's per-shape selection)."""
    return (resource.group, resource.version, resource.resource, subresource, operation,
            kind[2])


def request_shape(request: Any) -> RequestShape:
    """Check an AdmissionRequest (the ``request`` of an AdmissionReview) as
    :func:`from_request` does, and read its :class:`RequestShape` — without building the
    review, for a caller that may not need one (the webhook, when no policy is written for
    requests of this shape).

    Raises:
        ReviewError: ``request`` is not an object, ``operation`` is unknown, ``object`` /
            ``oldObject`` is present but not an object (or null on CREATE / UPDATE), ``kind``
            or ``resource`` is not an object of strings, ``subResource`` or ``namespace`` is
            not a string, or ``userInfo`` or one of its fields is not of its type.
    """
    if not _is_object(request):
        raise ReviewError("request: expected an AdmissionRequest object")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation: expected one of {', '.join(OPERATIONS)}, got "
                          f"{operation!r}")
    current = request.get("object")
    old = request.get("oldObject")
    if current is not None and not _is_object(current):
        raise ReviewError(f"request.object: expected an object or null, got "
                          f"{described(current)}")
    if old is not None and not _is_object(old):
        raise ReviewError(f"request.oldObject: expected an object or null, got {described(old)}")
    if current is None and operation in ("CREATE", "UPDATE"):
        raise ReviewError(f"request.object: a {operation} carries the object, got null")
    subject = current if current is not None else old
    kind_value = request.get("kind")
    kind = _gvk(kind_value if kind_value is not None else {}, "request.kind")
    if not kind[2] and subject is not None:
        kind = (*_split_api_version(str(subject.get("apiVersion", ""))), str(subject.get("kind")))
    resource_value = request.get("resource")
    if resource_value is not None:
        _gvk_fields(resource_value, "request.resource", ("group", "version", "resource"))
    if resource_value and resource_value.get("resource"):
        resource = _resource(resource_value.get("group") or "",
                             resource_value.get("version") or "", resource_value["resource"])
    else:
        resource = _resource(kind[0], kind[1], plural_of(kind[2]))
    subresource = request.get("subResource")
    if subresource is not None and not isinstance(subresource, str):
        raise ReviewError(f"request.subResource: expected a string, got {described(subresource)}")
    info = request.get("userInfo")
    if info is not None:
        if not _is_object(info):
            raise ReviewError(f"request.userInfo: expected an object, got {described(info)}")
        for key, expected in _USER_FIELDS:
            value = info.get(key)
            if value is not None and not isinstance(value, expected):
                raise ReviewError(f"request.userInfo.{key}: expected {type_words(expected)}, "
                                  f"got {described(value)}")
    namespace = request.get("namespace")
    if not namespace and subject is not None:
        metadata = subject.get("metadata")
        namespace = metadata.get("namespace") if _is_object(metadata) else None
    if namespace is not None and not isinstance(namespace, str):
        raise ReviewError(f"request.namespace: expected a string, got {described(namespace)}")
    return RequestShape(resource, subresource or "", operation, kind)


_USER_FIELDS = (("username", str), ("uid", str), ("groups", list))


def _metadata(subject: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return mapping_at(subject, "metadata") if subject is not None else {}


def from_request(
    request: Any,
    *,
    namespace_object: Mapping[str, Any] | None = None,
    now: datetime.datetime | None = None,
    shape: RequestShape | None = None,
) -> ReviewInput:
    """Parse an AdmissionRequest (the ``request`` of an AdmissionReview).

    Tolerates what real API servers and hand-written fixtures send: missing ``resource`` (taken
    from the object's kind), ``kind`` without a group, null ``oldObject`` / ``options``.
    ``shape``: :func:`request_shape` of this very request, when the caller has it already (its
    checks are not made again).

    Raises:
        ReviewError: as :func:`request_shape` says.
    """
    if shape is None:
        shape = request_shape(request)
    current = request.get("object")
    old = request.get("oldObject")
    info = request.get("userInfo") or {}
    user = _make_user(
        username=str(info.get("username") or ""), uid=str(info.get("uid") or ""),
        groups=tuple(map(str, info.get("groups") or ())), extra=mapping_at(info, "extra"),
    )
    metadata = _metadata(current if current is not None else old)
    namespace = request.get("namespace") or metadata.get("namespace")
    return _make_review(
        operation=shape.operation, object=current, old_object=old, resource=shape.resource,
        subresource=shape.subresource, kind=shape.kind,
        namespace=namespace or None,
        name=str(request.get("name") or metadata.get("name") or ""), user=user,
        dry_run=request.get("dryRun") is True, request=request,
        namespace_object=namespace_object, now=now or _EPOCH,
    )
