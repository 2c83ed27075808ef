"""Who owns what: object keys, controller references, and rolling pods up to their workload.

Owns the identity of a workload as the audit reports it. A pod owned by a controller
(``metadata.ownerReferences``, the reference with ``controller: true``, else the first) belongs
to that controller; a controller that is itself owned belongs to its owner, and so on while the
owner is in the input — so a pod whose ReplicaSet is in the input rolls up to the Deployment, a Job
to its CronJob, a LeaderWorkerSet's StatefulSets to the LeaderWorkerSet. When an owner is not in
the input the chain stops at the reference (the workload is then named by it, e.g. a ReplicaSet
whose Deployment was not captured). Objects are keyed by namespace, API group, kind and name, so a
Volcano ``Job`` is not a ``batch`` Job.

Must not read files, evaluate policies or compute GPU facts.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.scan.pod_table import PodTable
from policies.facts.identity import namespace_of


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class ObjectKey:
    """An object's identity: ``namespace`` is None for cluster-scoped objects (and objects whose
    manifest names none), ``group`` ``""`` for the core API.

    Keys sort by :meth:`sort_key`: cluster-scoped first, then by namespace, group, kind and name
    — a snapshot mixes both, so None must never meet a string in a comparison.
    """

    namespace: str | None
    group: str
    kind: str
    name: str

    def sort_key(self) -> tuple[bool, str, str, str, str]:
        """``(namespaced, namespace or "", group, kind, name)``: a total order over any keys."""
        return (*namespace_order(self.namespace), self.group, self.kind, self.name)

    def __lt__(self, other: object) -> bool:
        """Order by :meth:`sort_key`."""
        if not isinstance(other, ObjectKey):
            return NotImplemented
        return self.sort_key() < other.sort_key()

    def __str__(self) -> str:
        """``Kind/namespace/name`` (``Kind/name`` when cluster-scoped)."""
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{where}{self.name}"


def namespace_order(namespace: str | None) -> tuple[bool, str]:
    """Sort key of an optional namespace: None (cluster-scoped, or named by no manifest) first,
    then names in order. Every sort over report entries with a ``namespace`` uses it."""
    return (namespace is not None, namespace or "")


def group_of(api_version: Any) -> str:
    """The API group of an ``apiVersion`` (``apps/v1`` → ``apps``, ``v1`` → ``""``)."""
    text = str(api_version or "")
    return text.rpartition("/")[0]


def key_of(obj: Mapping[str, Any]) -> ObjectKey | None:
    """The key of a Kubernetes object; None when it has no name (nor generateName)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    name = metadata.get("name") or metadata.get("generateName")
    if not isinstance(name, str) or not name:
        return None
    return ObjectKey(_shared(namespace_of(metadata)), sys.intern(group_of(obj.get("apiVersion"))),
                     sys.intern(str(obj.get("kind") or "")), name)


def _names_a_pod(reference: Mapping[str, Any]) -> bool:
    """Whether an owner reference names a core Pod."""
    return reference.get("kind") == "Pod" and group_of(reference.get("apiVersion")) == ""


def _is_pod(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Pod" and group_of(obj.get("apiVersion")) == ""


def pod_owners(obj: Mapping[str, Any]) -> list[str]:
    """The names of the Pods a Pod's ``ownerReferences`` name (not followed, see
    :func:`controller_of`), for the warning that says so; [] for any other object."""
    metadata = obj.get("metadata")
    references = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not isinstance(references, list) or not _is_pod(obj):
        return []
    return [r["name"] for r in references
            if isinstance(r, Mapping) and _names_a_pod(r) and isinstance(r.get("name"), str)]


def controller_of(obj: Mapping[str, Any], namespace: str | None) -> ObjectKey | None:
    """The key of the object's controller (``ownerReferences``), or None when it has none.

    Owner references name objects in the dependent's namespace (or cluster-scoped ones, which
    never own namespaced workloads in practice). A Pod's reference to a Pod is not followed:
    no controller makes pods own pods (a LeaderWorkerSet's leader pod owns its workers'
    StatefulSet, which owns their pods), and a pod naming a harmless pod as its controller would
    otherwise be judged by that pod's spec; it is its own workload, audited by its own spec.
    """
    metadata = obj.get("metadata")
    references = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not references or not isinstance(references, list):
        return None
    chosen = None
    for reference in references:
        if not isinstance(reference, Mapping):
            continue
        kind, name = reference.get("kind"), reference.get("name")
        if not (isinstance(kind, str) and isinstance(name, str) and name) or \
                (_names_a_pod(reference) and _is_pod(obj)):
            continue
        if reference.get("controller") is True:
            chosen = reference
            break
        chosen = chosen or reference
    if chosen is None:
        return None
    return ObjectKey(_shared(namespace), sys.intern(group_of(chosen.get("apiVersion"))),
                     sys.intern(chosen["kind"]), chosen["name"])


def _shared(namespace: str | None) -> str | None:
    """The namespace interned: keys outlive the decoded objects (the audit keeps one per
    controller), and a snapshot has few namespaces but a string object per object naming one."""
    return sys.intern(namespace) if type(namespace) is str else namespace


class Ownership:
    """The owner links between the objects of one snapshot (filled while streaming).

    ``record(key, owner)`` is called for every workload object in the input that can own pods or
    be owned, :meth:`record_pod` for every Pod; :meth:`root` then follows the links.

    Pods are most of a snapshot (a million in a large cluster) and own few objects (a
    LeaderWorkerSet's leader pod owns a StatefulSet), so they are not kept as keys: a pod is
    remembered in a :class:`~audit.scan.pod_table.PodTable` as the 64-bit hash of its
    (namespace, name) with its controller's key, one shared key object per controller — 24 bytes
    a pod instead of ~470 (two keys and their strings). The same entry tells a pod read twice
    (the first copy counts); two pods whose hashes collide would be taken for one, as before
    this table existed (the duplicate check was always a set of these hashes).
    """

    def __init__(self) -> None:
        self._owner: dict[ObjectKey, ObjectKey | None] = {}
        self._pods = PodTable()  # hash((namespace, name)) -> controller

    def record(self, key: ObjectKey, owner: ObjectKey | None) -> None:
        """``key`` is in the input; its controller is ``owner`` (None: it is top-level)."""
        self._owner[key] = owner

    def record_pod(self, namespace: str | None, name: str, owner: ObjectKey | None,
                   ) -> ObjectKey | bool | None:
        """A Pod of the input, owned by ``owner``: returns False when a pod of this namespace
        and name was recorded already (the input holds it twice), else the shared key object
        equal to ``owner`` (None when it has none) — callers keep that one, not their own."""
        return self._pods.add(hash((namespace, name)), owner)

    def _owner_of(self, key: ObjectKey) -> ObjectKey | None:
        owner = self._owner.get(key)
        if owner is None and key.kind == "Pod" and not key.group:
            owner = self._pods.owner(hash((key.namespace, key.name)))
        return owner

    def present(self, key: ObjectKey) -> bool:
        """Whether the object is in the input."""
        if key in self._owner:
            return True
        return key.kind == "Pod" and not key.group and \
            hash((key.namespace, key.name)) in self._pods

    def root(self, key: ObjectKey) -> ObjectKey:
        """The workload ``key`` belongs to: follow owners while the current object is present."""
        seen = {key}
        current = key
        while True:
            owner = self._owner_of(current)
            if owner is None or owner in seen:
                return current
            seen.add(owner)
            current = owner

    def chain(self, key: ObjectKey) -> list[ObjectKey]:
        """``key`` and its owners up to :meth:`root`, nearest first."""
        chain = [key]
        while True:
            owner = self._owner_of(chain[-1])
            if owner is None or owner in chain:
                return chain
            chain.append(owner)
