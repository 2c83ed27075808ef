"""Corpus objects with fields deleted, nulled or retyped: the mutations and the oracle.

Used by ``tests/core/test_object_shapes.py``. Every object of the corpus copied into ``tests/data``
(manifests, nodes, AdmissionReviews, bug cases, ``wild/``, ``edge/``) is a seed; a mutation picks
fields at any depth and deletes them, sets them to null, or replaces them with a value of another
type (int, huge int, float incl. inf / NaN, string, unicode, bool, list, map, and the types a YAML
safe loader also makes: dates, bytes). The oracle says which of those edits the GPU facts must
report, naming the field: a field the API server types (a map, a list, a container, a GPU
quantity) given a value of another type.

Deterministic in the normal run: the strategies draw from fixed tables and hypothesis runs under
a ``derandomize`` profile (see the test module).
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from policies.facts.resource_names import ResourceKind, classify
from policies.sources import LoadError, parse_text
from tests.paths import TESTS

DATA = TESTS / "data"
SEED_DIRS = ("manifests", "nodes", "admissionreviews", "bugs", "wild", "edge")
_NOT_OBJECTS = frozenset({"AdmissionReview", "List"})

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Seed:
    """One corpus object: ``body`` a Kubernetes object, or an AdmissionRequest when ``request``.

    ``source`` names the file; ``siblings`` are the other objects of the same file (the audit
    scans a file's objects together, as ``gpuguard audit -f FILE`` does).
    """

    source: str
    body: Mapping[str, Any]
    request: bool = False
    paths: tuple[Path_, ...] = ()
    hot: tuple[Path_, ...] = ()
    siblings: tuple[Mapping[str, Any], ...] = ()


def _is_request(value: Mapping[str, Any]) -> bool:
    return "operation" in value and ("object" in value or "oldObject" in value)


def _walk_objects(value: Any) -> Iterator[tuple[Mapping[str, Any], bool]]:
    """Kubernetes objects and AdmissionRequests anywhere inside a parsed document."""
    if isinstance(value, Mapping):
        if _is_request(value):
            yield value, True
        elif isinstance(value.get("kind"), str) and value["kind"] not in _NOT_OBJECTS and (
                "metadata" in value or "spec" in value or "status" in value):
            yield value, False
        for child in value.values():
            yield from _walk_objects(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk_objects(child)


# Fields whose shape decides GPU facts: a path through one of these is drawn more often.
HOT_KEYS = frozenset({
    "resources", "limits", "requests", "containers", "initContainers", "ephemeralContainers",
    "annotations", "labels", "template", "nodeSelector", "affinity", "resourceClaims", "volumes",
    "env", "securityContext", "capabilities", "volumeMounts", "devices", "gpus", "hostDevices",
    "allocatable", "capacity", "replicas", "tasks", "workerGroupSpecs", "headGroupSpec",
    "leaderWorkerTemplate", "replicatedJobs", "jobTemplate", "parallelism", "completions",
    "object", "oldObject", "userInfo", "operation", "kind", "metadata", "spec", "status",
    "domain", "deviceName", "nodeName", "hostPath", "name", "namespace",
})


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield (*prefix, key)
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield (*prefix, index)
            yield from _paths(child, (*prefix, index))


def load_seeds() -> tuple[Seed, ...]:
    """Every object and AdmissionRequest of the corpus files under ``tests/data`` (deduplicated;
    documents the reader refuses, such as alias bombs, are skipped: they never become objects)."""
    seeds: list[Seed] = []
    seen: set[str] = set()
    for directory in SEED_DIRS:
        for file in sorted((DATA / directory).iterdir()):
            if file.suffix not in (".yaml", ".yml", ".json"):
                continue
            found: list[tuple[Mapping[str, Any], bool]] = []
            for item in parse_text(str(file), file.read_text(encoding="utf-8")):
                if isinstance(item, LoadError):
                    continue
                found.extend(_walk_objects(item[1]))
            objects = tuple(body for body, is_request in found if not is_request)
            for body, is_request in found:
                key = json.dumps(body, sort_keys=True, default=str)
                if key in seen:
                    continue
                seen.add(key)
                paths = tuple(_paths(body))
                hot = tuple(p for p in paths if len(p) <= 2 or HOT_KEYS.intersection(
                    k for k in p if isinstance(k, str)))
                seeds.append(Seed(f"{directory}/{file.name}", body, is_request, paths, hot,
                                  objects))
    return tuple(seeds)


# --- values ---------------------------------------------------------------------------------

_TEXTS = ["", " ", "1", "0", "-1", "2", "0.5", "500m", "1e400", "1e3", "1Ei", "99999999999999999999",
          "nvidia.com/gpu", "true", "null", "None", "0x10", "1_000", "١٢", "²", "ünïcødé",
          "💥", "\x00", "\ud800", "a" * 300, "${GPU}", "[1]", "{}", "-", "*", "NaN", "inf",
          "2026-12-31", "GRID_A100-4C", "3g.40gb", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"]
_NUMBERS = [0, 1, -1, 2, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30,
            10**400, 0.5, 1.0, -0.0, 1e308, float("inf"), float("-inf"), float("nan")]
_EXOTIC = [datetime.date(2026, 12, 31), datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
           b"\x00\xff", (1, "a")]
_KEYS = ["", "nvidia.com/gpu", "name", "kind", "gpu-fraction", "ü", 0, 1, True, None, -1,
         "nvidia.com/mig-1g.10gb", "amd.com/gpu"]

leaves = st.one_of(
    st.none(), st.booleans(), st.sampled_from(_NUMBERS), st.sampled_from(_TEXTS),
    st.integers(-(2**70), 2**70), st.text(max_size=12), st.sampled_from(_EXOTIC),
)
values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


# --- edits ----------------------------------------------------------------------------------

_MISSING: Any = object()


@dataclass(frozen=True)
class Edit:
    """One change made: ``op`` is ``delete``, ``null``, ``set`` or ``add-key`` (a new key under
    the map at ``path``); ``value`` what was written (``_MISSING`` for delete)."""

    path: Path_
    op: str
    value: Any = _MISSING


class Mutated:
    """A seed after its edits (a plain class: its repr is the short description)."""

    def __init__(self, seed: Seed, body: dict[str, Any]) -> None:
        self.seed = seed
        self.body = body
        self.edits: list[Edit] = []

    def __repr__(self) -> str:
        return f"Mutated({self.describe()})"

    def describe(self) -> str:
        """For failure messages: the seed and each edit."""
        return f"{self.seed.source}: " + "; ".join(
            f"{e.op} {render(e.path)}" + ("" if e.value is _MISSING else f" = {e.value!r:.80}")
            for e in self.edits)


def _parent(body: Any, path: Path_) -> Any:
    for key in path[:-1]:
        if (isinstance(body, Mapping) and key in body) or (
                isinstance(body, list) and isinstance(key, int) and 0 <= key < len(body)):
            body = body[key]
        else:
            return _MISSING
    return body


def value_at(body: Any, path: Path_) -> Any:
    """The value at ``path``, or ``_MISSING`` when some step is gone."""
    parent = _parent(body, path)
    key = path[-1]
    if isinstance(parent, Mapping) and key in parent:
        return parent[key]
    if isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent):
        return parent[key]
    return _MISSING


@st.composite
def mutated(draw: st.DrawFn, seeds: tuple[Seed, ...]) -> Mutated:
    """A seed with one to three edits at paths drawn from the seed (hot paths more often)."""
    seed = draw(st.sampled_from(seeds))
    result = Mutated(seed, copy.deepcopy(dict(seed.body)))
    for _ in range(draw(st.integers(1, 3))):
        pool = seed.hot if seed.hot and draw(st.integers(0, 3)) else seed.paths
        if not pool:
            break
        path = draw(st.sampled_from(pool))
        parent = _parent(result.body, path)
        key = path[-1]
        present = value_at(result.body, path) is not _MISSING
        if not present:
            continue
        op = draw(st.sampled_from(("delete", "null", "set", "set", "add-key")))
        if op == "delete":
            del parent[key]  # a list element deleted shifts its followers: also a shape
            result.edits.append(Edit(path, op))
        elif op == "null":
            parent[key] = None
            result.edits.append(Edit(path, op, None))
        elif op == "set":
            value = draw(values)
            parent[key] = value
            result.edits.append(Edit(path, op, value))
        else:
            target = parent[key]
            if isinstance(target, dict):
                new_key = draw(st.sampled_from(_KEYS))
                value = draw(values)
                target[new_key] = value
                result.edits.append(Edit((*path, new_key), op, value))
    return result


# --- the oracle: which edits must be reported, naming the field ------------------------------

_BRACKETED = frozenset({"limits", "requests", "annotations", "labels", "nodeSelector",
                        "allocatable", "capacity"})


def render(path: Path_) -> str:
    """A path as gpuguard's messages write it: ``spec.containers[0].resources.limits[R]``."""
    text = ""
    for index, key in enumerate(path):
        if (isinstance(key, int) and not isinstance(key, bool)) or (
                index and path[index - 1] in _BRACKETED):
            text += f"[{key}]"
        else:
            text += f".{key}" if text else str(key)
    return text


MAP, LIST, ENTRY, STRING, QUANTITY = "map", "list", "entry", "string", "quantity"
_CTYPES = ("containers", "initContainers", "ephemeralContainers")
# Fields of a PodSpec (relative path patterns, ``*`` an index) and the type the API server
# requires; a value of another type (null aside: an absent field) must be reported.
POD_SPEC_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((), MAP),
    *(((ctype,), LIST) for ctype in _CTYPES),
    *(((ctype, "*"), ENTRY) for ctype in _CTYPES),
    *(((ctype, "*", "resources"), MAP) for ctype in _CTYPES),
    *(((ctype, "*", "resources", side), MAP) for ctype in _CTYPES[:2]
      for side in ("limits", "requests")),
    *(((ctype, "*", "resources", side, "R"), QUANTITY) for ctype in _CTYPES[:2]
      for side in ("limits", "requests")),
    *(((ctype, "*", "resources", "claims"), LIST) for ctype in _CTYPES),
    *(((ctype, "*", "resources", "claims", "*"), ENTRY) for ctype in _CTYPES),
    *(((ctype, "*", key), LIST) for ctype in _CTYPES for key in ("env", "volumeMounts")),
    *(((ctype, "*", key, "*"), ENTRY) for ctype in _CTYPES for key in ("env", "volumeMounts")),
    *(((ctype, "*", "securityContext"), MAP) for ctype in _CTYPES),
    *(((ctype, "*", "securityContext", "capabilities"), MAP) for ctype in _CTYPES),
    *(((ctype, "*", "securityContext", "capabilities", "add"), LIST) for ctype in _CTYPES),
    (("nodeSelector",), MAP), (("affinity",), MAP), (("affinity", "nodeAffinity"), MAP),
    (("volumes",), LIST), (("volumes", "*"), ENTRY), (("volumes", "*", "hostPath"), MAP),
    (("resourceClaims",), LIST), (("resourceClaims", "*"), ENTRY),
)
TEMPLATE_METADATA_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("annotations",), MAP), (("labels",), MAP),
)
OBJECT_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("kind",), STRING), (("metadata",), MAP), (("spec",), MAP),
    (("metadata", "name"), STRING), (("metadata", "namespace"), STRING),
    (("metadata", "generateName"), STRING),
    (("metadata", "labels"), MAP), (("metadata", "annotations"), MAP),
)
NODE_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("metadata",), MAP), (("metadata", "labels"), MAP), (("metadata", "annotations"), MAP),
    (("metadata", "name"), STRING), (("status",), MAP), (("status", "capacity"), MAP),
    (("status", "allocatable"), MAP), (("status", "capacity", "R"), QUANTITY),
    (("status", "allocatable", "R"), QUANTITY),
)
VM_DOMAIN_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((), MAP), (("devices",), MAP), (("devices", "gpus"), LIST),
    (("devices", "hostDevices"), LIST), (("devices", "gpus", "*"), ENTRY),
    (("devices", "hostDevices", "*"), ENTRY), (("devices", "gpus", "*", "deviceName"), STRING),
    (("devices", "hostDevices", "*", "deviceName"), STRING),
)

_COUNT_TEXT = re.compile(r"[0-9]{1,18}")


def _matches(relative: Path_, pattern: tuple[str, ...]) -> bool:
    if len(relative) != len(pattern):
        return False
    for key, want in zip(relative, pattern, strict=True):
        if want == "*":
            if not isinstance(key, int) or isinstance(key, bool):
                return False
        elif want == "R":
            if not isinstance(key, str) or classify(key) in (ResourceKind.OTHER,
                                                             ResourceKind.UNRECOGNIZED):
                return False
        elif key != want:
            return False
    return True


def wrong_type(expected: str, value: Any) -> bool:
    """Whether ``value`` certainly breaks the type (None is an absent field and not judged,
    except as an entry of a list of maps, which cannot be null)."""
    if value is _MISSING:
        return False
    if expected == ENTRY:
        return not isinstance(value, Mapping)
    if value is None:
        return False
    if expected == MAP:
        return not isinstance(value, Mapping)
    if expected == LIST:
        return not isinstance(value, list)
    if expected == STRING:
        return not isinstance(value, str)
    # A GPU quantity: only values that are certainly not a device count are judged (a
    # non-negative int within int64, or digits; floats and suffixes are left to the unit tests).
    if isinstance(value, bool | list | dict | tuple | bytes | datetime.date):
        return True
    if isinstance(value, int):
        return not 0 <= value < 2**63
    if isinstance(value, str):
        text = value.strip()
        return not (_COUNT_TEXT.fullmatch(text) or re.fullmatch(
            r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?",
            text))
    return False


def expected_reports(
    body: Mapping[str, Any], edits: list[Edit], anchors: list[tuple[Path_, tuple[Any, ...]]],
) -> list[tuple[str, ...]]:
    """For each edit the facts must name: its rendered path, with the alternatives that also
    name it.

    ``anchors`` are ``(base path, field table)`` pairs: the object's own fields at ``()``, each
    pod template's PodSpec and metadata, a VM's domain. An edit counts when its value is still in
    the final object (a later edit did not remove it) and breaks the type its table gives.
    """
    wanted = []
    for edit in edits:
        if edit.op not in ("null", "set", "add-key"):
            continue
        current = value_at(body, edit.path)
        if current is _MISSING or current is not edit.value:
            continue
        if any(isinstance(key, int) and not isinstance(value_at(body, edit.path[:i]), list)
               for i, key in enumerate(edit.path) if i):
            continue  # an int key of a map (YAML allows them), not a list index
        for base, table in anchors:
            if edit.path[:len(base)] != base:
                continue
            relative = edit.path[len(base):]
            for pattern, expected in table:
                if _matches(relative, pattern) and wrong_type(expected, current):
                    names = [render(edit.path)]
                    if expected == QUANTITY and edit.path[-2] in ("limits", "requests"):
                        # Value problems judged on the effective value name the resource of
                        # both sides: <container>.resources[R].
                        names.append(f"{render(edit.path[:-2])}[{edit.path[-1]}]")
                    wanted.append(tuple(names))
    return wanted


def parse_path(text: str) -> Path_:
    """``spec.template.spec`` -> ``('spec', 'template', 'spec')`` (the paths gpuguard gives for
    templates; indices as ints)."""
    parts: list[str | int] = []
    for piece in filter(None, text.split(".")):
        name, *indices = piece.split("[")
        if name:
            parts.append(name)
        parts.extend(int(i.rstrip("]")) for i in indices)
    return tuple(parts)
