"""Who owns what: object keys, controller references, and rolling pods up to their workload.

Owns the identity of a workload as the audit reports it. A pod owned by a controller (the
``metadata.ownerReferences`` entry with ``controller: true``, as Kubernetes' ``GetControllerOf``
reads it: other references are for garbage collection only, and anyone who may create a pod may
write them) belongs to that controller; a controller that is itself owned belongs to its owner,
and so on while the owner is in the input — so a pod whose ReplicaSet is in the input rolls up to
the Deployment, a Job to its CronJob, a LeaderWorkerSet's StatefulSets to the LeaderWorkerSet.
A reference to a built-in kind is followed only where that kind's controller creates the
dependent's kind, so that an object cannot be judged by a harmless owner's spec: not a Pod's to a
Pod, not a Deployment's to a Job; a StatefulSet's to a Pod only when the pod is a
LeaderWorkerSet's leader and the StatefulSet its workers' (the one case where a pod owns a
workload). When an owner is not in
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
from policies.value_words import described


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


# What Kubernetes' own controllers create, by (group, kind) of the controller: a reference from
# anything else to one of these kinds is not a controller's (anyone who may create an object may
# write it). A Node is the controller of its static pods' mirror pods. Custom resources' operators
# may create anything: their references are followed.
_BUILT_IN_GROUPS = frozenset({"", "apps", "batch"})
_LWS_GROUP = "leaderworkerset.x-k8s.io"
_CREATES: dict[tuple[str, str], frozenset[tuple[str, str]]] = {
    ("apps", "Deployment"): frozenset({("apps", "ReplicaSet")}),
    ("apps", "ReplicaSet"): frozenset({("", "Pod")}),
    ("apps", "StatefulSet"): frozenset({("", "Pod")}),
    ("apps", "DaemonSet"): frozenset({("", "Pod")}),
    ("batch", "Job"): frozenset({("", "Pod")}),
    ("batch", "CronJob"): frozenset({("batch", "Job")}),
    ("", "ReplicationController"): frozenset({("", "Pod")}),
    ("", "Node"): frozenset({("", "Pod")}),
    # a LeaderWorkerSet's leader pod owns its workers' StatefulSet: Ownership decides it,
    # once the whole input is read
    ("", "Pod"): frozenset({("apps", "StatefulSet")}),
}


def refused_controller(obj: Mapping[str, Any]) -> str | None:
    """``Kind name`` of the object's controller reference when :func:`controller_of` does not
    follow it (a built-in kind that never creates this kind, e.g. a Pod's reference to a Pod or a
    Deployment's to a Job), for the warning that says so; None when it is followed or absent."""
    reference = _controller_reference(obj)
    if reference is None or _creates(reference, obj):
        return None
    return f"{reference['kind']} {reference['name']}"


def _creates(reference: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    # every kind: Pod is a pod, whatever its apiVersion says (as the scanner reads it)
    owner_kind, kind = reference["kind"], obj.get("kind")
    owner_group = "" if owner_kind == "Pod" else group_of(reference.get("apiVersion"))
    if owner_group not in _BUILT_IN_GROUPS:
        return True
    made = _CREATES.get((owner_group, owner_kind), frozenset())
    return ("" if kind == "Pod" else group_of(obj.get("apiVersion")), kind) in made


def owner_reference_problems(obj: Mapping[str, Any]) -> list[str]:
    """What makes ``metadata.ownerReferences`` unusable, one message per fault, with its path
    (``metadata.ownerReferences[1]: expected an owner reference map, got the string 'rs'``); []
    when it is a list of maps or absent. The API server refuses such objects; here the object is
    audited as its own workload (no controller can be read from it), and the run says why."""
    metadata = obj.get("metadata")
    references = metadata.get("ownerReferences") if type(metadata) is dict or \
        isinstance(metadata, Mapping) else None
    if references is None:
        return []
    if not isinstance(references, list):
        return [f"metadata.ownerReferences: expected a list of owner references, got "
                f"{described(references)}; audited as its own workload"]
    problems = []
    for index, reference in enumerate(references):
        where = f"metadata.ownerReferences[{index}]"
        if not (type(reference) is dict or isinstance(reference, Mapping)):
            problems.append(f"{where}: expected an owner reference map, got "
                            f"{described(reference)}")
        elif reference.get("controller") is True and not all(
                isinstance(reference.get(k), str) and reference.get(k) for k in ("kind", "name")):
            problems.append(f"{where}: a controller reference needs a kind and a name (strings); "
                            "audited as its own workload")
    return problems


def _controller_reference(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``ownerReferences`` entry with ``controller: true`` and a kind and name, or None
    (Kubernetes' ``metav1.GetControllerOf``; the API server allows one such entry)."""
    metadata = obj.get("metadata")
    references = metadata.get("ownerReferences") if type(metadata) is dict or \
        isinstance(metadata, Mapping) else None
    if not references or not isinstance(references, list):
        return None
    for reference in references:
        if (type(reference) is dict or isinstance(reference, Mapping)) and \
                reference.get("controller") is True:
            kind, name = reference.get("kind"), reference.get("name")
            if isinstance(kind, str) and kind and isinstance(name, str) and name:
                return reference
            return None
    return None


def controller_of(obj: Mapping[str, Any], namespace: str | None) -> ObjectKey | None:
    """The key of the object's controller (its ``ownerReferences`` entry with ``controller:
    true``), or None when it has none or the reference cannot be a controller's.

    Owner references name objects in the dependent's namespace (or cluster-scoped ones, which
    never own namespaced workloads in practice). A reference without ``controller: true`` is not
    a controller (it only ties the object's deletion to its owner's). A reference naming a
    built-in kind is followed only where that kind's controller creates this kind (a
    Deployment's ReplicaSets, a ReplicaSet's Pods, a CronJob's Jobs, ...; see
    :func:`refused_controller`): a pod naming a harmless pod, or a Deployment naming a harmless
    Job, would otherwise be judged by that owner's spec; it is its own workload, audited by its
    own. (A StatefulSet's reference to a Pod is kept here: a LeaderWorkerSet's leader pod owns
    its workers' StatefulSet; :class:`Ownership` follows it only for such a pod.)
    """
    reference = _controller_reference(obj)
    if reference is None or not _creates(reference, obj):
        return None
    kind = reference["kind"]
    group = "" if kind == "Pod" else sys.intern(group_of(reference.get("apiVersion")))
    return ObjectKey(_shared(namespace), group, sys.intern(kind), reference["name"])


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
        if owner is None:
            if key.kind == "Pod" and not key.group:
                owner = self._pods.owner(hash((key.namespace, key.name)))
        elif owner.kind == "Pod" and not owner.group and not self._leader_owns(key, owner):
            return None  # an object naming a Pod as its controller: its own workload
        return owner

    def _leader_owns(self, key: ObjectKey, pod: ObjectKey) -> bool:
        """Whether ``pod`` may own ``key``: only a LeaderWorkerSet's leader pod owns an object,
        its workers' StatefulSet, which the LeaderWorkerSet controller names as the pod
        (``<lws>-<group>``), and the pod's own controllers lead to a LeaderWorkerSet of the
        input. Anything else naming a Pod as its controller would be judged by that pod's
        spec, not its own."""
        if key.kind != "StatefulSet" or key.group != "apps" or key.name != pod.name:
            return False
        current = self._pods.owner(hash((pod.namespace, pod.name)))
        seen: set[ObjectKey] = set()
        while current is not None and current not in seen:
            if current.kind == "LeaderWorkerSet" and current.group == _LWS_GROUP \
                    and current in self._owner:
                return True
            seen.add(current)
            current = self._owner.get(current)  # the recorded links, this rule aside
        return False

    def pod_owned(self) -> list[tuple[ObjectKey, ObjectKey]]:
        """``(object, pod)`` for each object of the input (not a Pod) whose controller is a Pod
        it is not rolled up to (see :meth:`_leader_owns`), in input order, for the warning that
        says so."""
        return [(key, owner) for key, owner in self._owner.items()
                if owner is not None and owner.kind == "Pod" and not owner.group
                and not self._leader_owns(key, owner)]

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
