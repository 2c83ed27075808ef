"""The watched cluster's objects in memory, compressed, indexed by namespace and kind.

Owns what ``gpuguard audit --watch`` knows of the cluster between events: one entry per object
(its key, resourceVersion and its JSON without ``metadata.managedFields``, zlib-compressed), the
index of each namespace's objects, and turning list / watch events into *changes*: the namespaces
whose report must be evaluated again. An event carrying the resourceVersion already stored is
no change (a relist repeats every object; an ``ADDED`` after a reconnect repeats one), and a
relist (:meth:`ObjectStore.replace`) deletes what the list no longer holds, so a 410 Gone or an
API server restart neither duplicates nor loses an object.

Must not evaluate policies, talk to the cluster or build reports.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from audit.scan.ownership import ObjectKey, key_of
from policies.facts.dra import DRA_KINDS
from policies.sources import Document

#: The order a scan reads kinds in (the order of ``kube.lists.AUDIT_RESOURCES``): namespaces
#: and nodes first, then the DRA objects in :data:`~policies.facts.dra.DRA_KINDS` order
#: (DeviceClasses and ResourceSlices before the claims resolved with them), then workload
#: controllers, pods last.
_ORDER = {"Namespace": 0, "Node": 1, **{kind: 2 + n for n, kind in enumerate(DRA_KINDS)}}
_WORKLOAD_RANK = len(_ORDER) + 1
_ORDER["Pod"] = _WORKLOAD_RANK + 1


def _rank(key: ObjectKey) -> int:
    return _ORDER.get(key.kind, _WORKLOAD_RANK)


@dataclass(frozen=True, slots=True)
class Stored:
    """One object: its resourceVersion and compressed JSON."""

    version: str
    blob: bytes

    def body(self) -> dict[str, Any]:
        """The object, decompressed (a fresh dict each call)."""
        value: dict[str, Any] = orjson.loads(zlib.decompress(self.blob))
        return value


def pack(obj: Mapping[str, Any]) -> bytes:
    """``obj`` as compressed JSON, without ``metadata.managedFields`` (server-side apply's
    bookkeeping: often half of a pod's bytes, and read by no policy or figure)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return zlib.compress(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS), 1)


@dataclass(frozen=True)
class Change:
    """What one event or relist changed: ``namespaces`` whose compliance must be evaluated
    again (a Namespace object counts for its own name), and ``cluster``: whether the cluster's
    figures (nodes, placement, metrics) changed."""

    namespaces: frozenset[str]
    cluster: bool

    @property
    def empty(self) -> bool:
        """Nothing changed."""
        return not self.namespaces and not self.cluster


NO_CHANGE = Change(frozenset(), False)


class ObjectStore:
    """The objects of the watched resources (see module docstring). Single-threaded."""

    def __init__(self) -> None:
        self._objects: dict[ObjectKey, Stored] = {}
        self._by_namespace: dict[str | None, dict[ObjectKey, None]] = {}
        self._by_kind: dict[tuple[str, str], dict[ObjectKey, None]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def _affects(self, key: ObjectKey) -> frozenset[str]:
        if key.kind == "Namespace" and not key.group:
            return frozenset({key.name})
        return frozenset({key.namespace}) if key.namespace else frozenset()

    def _put(self, key: ObjectKey, stored: Stored) -> None:
        self._objects[key] = stored
        self._by_namespace.setdefault(key.namespace, {})[key] = None
        self._by_kind.setdefault((key.group, key.kind), {})[key] = None

    def _drop(self, key: ObjectKey) -> bool:
        if self._objects.pop(key, None) is None:
            return False
        members = self._by_namespace.get(key.namespace)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._by_namespace[key.namespace]
        kinds = self._by_kind.get((key.group, key.kind))
        if kinds is not None:
            kinds.pop(key, None)
            if not kinds:
                del self._by_kind[(key.group, key.kind)]
        return True

    def apply(self, event: str, obj: Mapping[str, Any]) -> Change:
        """Apply one watch event (``ADDED``, ``MODIFIED``, ``DELETED``).

        Objects without a name are not stored (the scan counts them as ignored when it reads
        them; a watch never delivers one).
        """
        key = key_of(obj)
        if key is None:
            return NO_CHANGE
        if event == "DELETED":
            return Change(self._affects(key), True) if self._drop(key) else NO_CHANGE
        metadata = obj.get("metadata")
        version = str(metadata.get("resourceVersion") or "") if isinstance(metadata, Mapping) \
            else ""
        current = self._objects.get(key)
        if current is not None and version and current.version == version:
            return NO_CHANGE
        self._put(key, Stored(version, pack(obj)))
        return Change(self._affects(key), True)

    def replace(self, group: str, kind: str, items: Iterable[Mapping[str, Any]]) -> Change:
        """Make the objects of ``group``/``kind`` exactly ``items`` (a fresh list after a start,
        a 410 Gone or a reconnect): new and changed objects are stored, those the list no longer
        holds deleted; unchanged ones cost nothing."""
        namespaces: set[str] = set()
        cluster = False
        listed: set[ObjectKey] = set()
        for obj in items:
            key = key_of(obj)
            if key is None:
                continue
            listed.add(key)
            change = self.apply("ADDED", obj)
            namespaces |= change.namespaces
            cluster = cluster or change.cluster
        for key in [k for k in self._by_kind.get((group, kind), {}) if k not in listed]:
            self._drop(key)
            namespaces |= self._affects(key)
            cluster = True
        return Change(frozenset(namespaces), cluster)

    def namespaces(self) -> set[str]:
        """Every namespace that holds an object or has a Namespace object."""
        names = {n for n in self._by_namespace if n}
        names.update(k.name for k in self._by_kind.get(("", "Namespace"), {}))
        return names

    def documents(self, namespace: str | None = None, *,
                  everything: bool = False) -> Iterator[Document]:
        """The stored objects as scan input, in scan order: those of ``namespace`` (its Namespace
        object first), or every object with ``everything``."""
        if everything:
            keys: list[ObjectKey] = list(self._objects)
        else:
            keys = list(self._by_namespace.get(namespace, {}))
            ns_key = ObjectKey(None, "", "Namespace", str(namespace))
            if ns_key in self._objects:
                keys.append(ns_key)
        keys.sort(key=_rank)
        for number, key in enumerate(keys):
            yield Document(f"watch:{key.kind}", number, None, self._objects[key].body())

    def size_bytes(self) -> int:
        """Compressed bytes held (the objects' JSON; the keys and indexes come on top)."""
        return sum(len(s.blob) for s in self._objects.values())
