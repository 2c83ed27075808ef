"""Mutations: JSON Patch operations applied to a working copy as the API server applies them
(:mod:`policies.policy.json_patch`), and the response patch as an RFC 6902 diff.

Owns applying one policy mutation — operations returned by a CEL expression, or a declarative GPU
shortcut (``addToleration``, ``setRuntimeClassName``, ``setSchedulerName``, ``setLabel``,
``setAnnotation``, ``setNodeSelector``) — to a copy of the object, and :func:`diff`, the patch
sent back to the API server: ``jsonpatch.make_patch(original, final)``, so JSON Pointer escaping
(``~0``, ``~1``), missing parents (``annotations: null``) and untouched keys are right by
construction (DESIGN.md). Shortcuts act on every pod template of the object
(:mod:`policies.facts.workloads`), on the templates that ask for GPUs when some do: pod spec
shortcuts on PodTemplateSpecs and bare PodSpecs, metadata ones on PodTemplateSpecs only; a
resource block (Trainer ``resourcesPerNode``) has nothing either could change.

Must not decide whether a mutation runs (that is the engine) or do I/O.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import jsonpatch
import orjson

from policies.cel import conversions
from policies.cel.json_values import to_json_data
from policies.facts.workloads import POD_SPEC, RESOURCES, WorkloadFacts
from policies.policy.decoding import decoding_error, store_nulls
from policies.policy.json_patch import PatchError, PatchTestFailed, apply_patch
from policies.value_words import described

_OPS = {"add", "remove", "replace", "move", "copy", "test"}


class MutationError(ValueError):
    """A mutation could not be applied; the message says which operation and why."""


class UndecodableError(MutationError):
    """A JSONPatch applied but its result does not decode into its kind's Go type. The API
    server fails such a request with an internal error whatever the policy's failurePolicy
    (kube-apiserver 1.37: ``Internal error occurred: json: cannot unmarshal ...``), and so
    does a webhook's response patch that decodes no better."""


def validate_operations(value: Any) -> list[dict[str, Any]]:
    """Check a CEL result is a list of RFC 6902 operations.

    Raises:
        MutationError: not a list of maps with a known ``op`` and a string ``path`` (and
            ``from`` for move / copy, ``value`` for add / replace / test).
    """
    if not isinstance(value, list):
        raise MutationError(f"expected a list of JSONPatch operations, got {described(value)}")
    operations = []
    for index, op in enumerate(value):
        if not isinstance(op, Mapping):
            raise MutationError(f"operation {index}: expected a map with op and path")
        name, path = op.get("op"), op.get("path")
        if name not in _OPS:
            raise MutationError(f"operation {index}: op must be one of "
                                f"{', '.join(sorted(_OPS))}, got {described(name)}")
        if not isinstance(path, str) or (path and not path.startswith("/")):
            raise MutationError(f"operation {index}: path must be a JSON Pointer ('' or "
                                f"starting with '/'), got {described(path)}")
        if name in ("move", "copy") and not isinstance(op.get("from"), str):
            raise MutationError(f"operation {index}: {name} needs a 'from' JSON Pointer")
        if name in ("add", "replace", "test") and "value" not in op:
            raise MutationError(f"operation {index}: {name} needs a value")
        operations.append(dict(op))
    return operations


def native_operations(value: Any) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy's JSONPatch value as the operations the API server builds from
    it (k8s.io/apiserver ``mutating/patch/json_patch.go``): ``op`` and ``path`` always (an unset
    one is ``""``), ``from`` only when not empty, ``value`` only when set (``value: null`` is
    set). Shapes are not judged here: :func:`apply_operations` fails as the API server does.

    Raises:
        MutationError: not a list of maps, or an ``op``/``path``/``from`` that is not a string.
    """
    if not isinstance(value, list):
        raise MutationError(f"expected a list of JSONPatch operations, got {described(value)}")
    operations = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise MutationError(f"operation {index}: expected a JSONPatch, got {described(item)}")
        for field in ("op", "path", "from"):
            if item.get(field) is not None and not isinstance(item[field], str):
                raise MutationError(f"operation {index}: {field} must be a string, got "
                                    f"{described(item[field])}")
        operation: dict[str, Any] = {"op": item.get("op") or "", "path": item.get("path") or ""}
        if item.get("from"):
            operation["from"] = item["from"]
        if "value" in item:
            operation["value"] = _patch_value(item["value"])
        operations.append(operation)
    return operations


_SAFE_INTEGER: Final = 2**53 - 1  # JavaScript's MAX_SAFE_INTEGER, cel-go's JSON number limit


def _patch_value(value: Any) -> Any:
    """A JSONPatch ``value`` as the API server turns the CEL value into JSON (cel-go
    ``ConvertToNative(structpb.Value)``, then ``json.Marshal``): an integer beyond
    ±(2^53-1) is a string of its digits, a duration ``"1.5s"``, a timestamp RFC 3339, bytes
    base64.

    Raises:
        MutationError: NaN or an infinity, which protojson cannot write (the API server's
            words; an evaluation error, so the failurePolicy decides).
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -_SAFE_INTEGER <= value <= _SAFE_INTEGER else str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        word = "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"
        raise MutationError(
            "JSONPath valueExpression evaluated to a type that could not marshal to JSON: json: "
            "error calling MarshalJSON for type *structpb.Value: proto: "
            f"google.protobuf.Value.number_value: invalid {word} value")
    if isinstance(value, list | tuple):
        return [_patch_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _patch_value(v) for k, v in value.items()}
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return conversions.format_duration(
            (value.days * 86400 + value.seconds) * 10**9 + value.microseconds * 1000)
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        offset = moment.utcoffset() or datetime.timedelta()
        return conversions.format_timestamp(
            (int(moment.timestamp() // 1), moment.microsecond * 1000,
             int(offset.total_seconds())))
    return value


def apply_operations(target: Mapping[str, Any], operations: list[dict[str, Any]], *,
                     native: bool = False) -> dict[str, Any]:
    """Apply JSON Patch operations to a copy of ``target`` and return it, with the semantics of
    the API server's library (:mod:`policies.policy.json_patch`).

    ``native``: a MutatingAdmissionPolicy's patch. A failed ``test`` then means "leave the
    object as it is" (``target`` is returned), and a failure is worded as the API server words
    it (``JSON Patch: ...``); in a GPUPolicy a failed ``test`` is an error naming the operation.

    Raises:
        MutationError: an operation does not apply (missing path, failed test, bad index).
        UndecodableError: the result holds a value the API server's decoder refuses where
            the operations changed it (:func:`policies.policy.decoding.decoding_error`: a
            number for a label, a field its kind does not have).
    """
    try:
        result: Any = apply_patch(target, operations)
    except PatchTestFailed as exc:
        if native:
            return dict(target)
        raise MutationError(_failed_operation(operations, exc.index, str(exc))) from None
    except PatchError as exc:
        if native:
            raise MutationError(f"JSON Patch: {exc}") from None
        raise MutationError(_failed_operation(operations, exc.index, str(exc))) from None
    patched = check_identity(result)
    if (error := decoding_error(patched, target)) is not None:
        raise UndecodableError(error)
    if native and any(_may_write_null(operation) for operation in operations):
        store_nulls(patched, target)
    return patched


def _may_write_null(operation: Mapping[str, Any]) -> bool:
    if operation["op"] in ("move", "copy"):
        return True
    return operation["op"] in ("add", "replace") and (
        "value" not in operation or b"null" in orjson.dumps(operation["value"]))


def _failed_operation(operations: list[dict[str, Any]], index: int, reason: str) -> str:
    operation = operations[index] if 0 <= index < len(operations) else {}
    return (f"operation {index} ({operation.get('op')} {operation.get('path')}) does not "
            f"apply: {reason}")


_IDENTITY = (("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
             ("metadata", "uid"))


def check_identity(result: Any, original: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Refuse a result that is not an object, or that renames, moves or retypes it.

    Raises:
        MutationError: the mutated document is not a map, or ``apiVersion``, ``kind``,
            ``metadata.name`` / ``namespace`` / ``uid`` differ from ``original``.
    """
    if not isinstance(result, dict):
        raise MutationError(f"the patched object is {described(result)}, not an object")
    if original is not None:
        for path in _IDENTITY:
            before: Any = original
            after: Any = result
            for key in path:
                before = before.get(key) if isinstance(before, Mapping) else None
                after = after.get(key) if isinstance(after, Mapping) else None
            if before != after:
                raise MutationError(f"a mutation may not change {'.'.join(path)} "
                                    f"(from {described(before)} to {described(after)})")
    return result


def diff(original: Mapping[str, Any] | None,
         final: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The RFC 6902 patch turning ``original`` into ``final`` (``[]`` when they are equal)."""
    if original is None or final is None or original == final:
        return []
    try:
        patch = jsonpatch.make_patch(original, final).patch
        json.dumps(patch)  # small; what the response carries
        return patch
    except (TypeError, ValueError):
        # YAML input (``gpuguard check``, the audit) may hold what JSON cannot: timestamps,
        # binary, keys that are not strings. The patch is a JSON document: diff the JSON forms.
        return jsonpatch.make_patch(to_json_data(original), to_json_data(final)).patch


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _at(obj: dict[str, Any], field_path: str) -> dict[str, Any] | None:
    """The dict at a field path (``spec.template.spec``, ``spec.workerGroupSpecs[0].template``),
    or None when some step is missing or of another type."""
    node: Any = obj
    for name, index in _STEP.findall(field_path):
        if name:
            node = node.get(name) if isinstance(node, dict) else None
        else:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
    return node if isinstance(node, dict) else None


def _pod_targets(obj: dict[str, Any], facts: WorkloadFacts | None) -> list[tuple[str, str]]:
    """(spec path, metadata path) of each pod template to change; GPU templates when any."""
    if facts is None:
        return []
    pairs = []
    asking = [per.requested for per in facts.per_template]
    for template, wants in zip(facts.workload.templates, asking, strict=True):
        if (any(asking) and not wants) or template.shape == RESOURCES:
            continue  # a resource block (TrainJob resourcesPerNode) has no pod spec to change
        if template.shape == POD_SPEC:  # a bare PodSpec (KServe) has no metadata of its own
            pairs.append((template.spec_path, ""))
            continue
        metadata = f"{template.path}.metadata" if template.path else "metadata"
        pairs.append((template.spec_path, metadata))
    return pairs


def _tolerates(existing: Any, wanted: Mapping[str, Any]) -> bool:
    if not isinstance(existing, Mapping):
        return False
    if existing.get("key") != wanted.get("key") and existing.get("key") not in (None, ""):
        return False
    if existing.get("effect") not in (None, "", wanted.get("effect")):
        return False
    if existing.get("operator", "Equal") == "Exists":
        return True
    return existing.get("value") == wanted.get("value") and wanted.get("operator") != "Exists"


def _wrong_type(parent: Mapping[str, Any], field: str, kind: type) -> None:
    """Refuse to change a field that is present but not of its API type (``tolerations: 5``,
    ``nodeSelector: "x"``): replacing it would hide an input the API server refuses, and the
    validating policies would then pass a mutated object the webhook never sees (its /validate
    gets the original and reports the evaluation error).

    Raises:
        MutationError: ``"<field>: expected a list, got int"`` (the caller adds the path).
    """
    value = parent.get(field)
    if value is not None and not isinstance(value, kind):
        expected = "a list" if kind is list else "a map"
        raise MutationError(f"{field}: expected {expected}, got {described(value)}; "
                            "not changed")


def _add_toleration(spec: dict[str, Any], toleration: Any) -> bool:
    _wrong_type(spec, "tolerations", list)
    tolerations = spec.get("tolerations")
    changed = False
    if not isinstance(tolerations, list):
        tolerations = spec["tolerations"] = []
        changed = True
    if not any(_tolerates(t, toleration) for t in tolerations):
        tolerations.append(dict(toleration))
        changed = True
    return changed


def _setter(field: str) -> Callable[[dict[str, Any], Any], bool]:
    def set_field(spec: dict[str, Any], value: Any) -> bool:
        changed = bool(spec.get(field) != value)
        spec[field] = value
        return changed
    return set_field


def _set_node_selector(spec: dict[str, Any], argument: Any) -> bool:
    return _set_key(spec, "nodeSelector", argument["key"], argument["value"])


# The declarative shortcuts, by what they change: a pod template's spec, or metadata (of the
# object, or of its pod templates). The schema (data/gpupolicy.schema.json, "mutation") lists
# the same names; tests/core/test_mutation_shortcuts.py keeps them equal.
_POD_SPEC_SHORTCUTS: Final[Mapping[str, Callable[[dict[str, Any], Any], bool]]] = {
    "addToleration": _add_toleration,
    "setRuntimeClassName": _setter("runtimeClassName"),
    "setSchedulerName": _setter("schedulerName"),
    "setNodeSelector": _set_node_selector,
}
_METADATA_SHORTCUTS: Final[Mapping[str, str]] = {"setLabel": "labels",
                                                 "setAnnotation": "annotations"}
SHORTCUTS: Final[tuple[str, ...]] = (*_POD_SPEC_SHORTCUTS, *_METADATA_SHORTCUTS)
"""Every declarative mutation shortcut a GPUPolicy may use, in schema order."""


def apply_shortcut(
    obj: dict[str, Any], shortcut: tuple[str, Any], facts: WorkloadFacts | None,
) -> bool:
    """Apply one declarative GPU shortcut to ``obj`` in place; True when it changed something.

    The caller owns ``obj`` (a private copy of the request's object). ``setLabel`` /
    ``setAnnotation`` take ``target: object`` (default, the object's own metadata: where Kueue
    reads ``kueue.x-k8s.io/queue-name``) or ``podTemplates``.

    Raises:
        MutationError: the object's metadata is not a map, or a field the shortcut changes is
            present and not of its API type (``tolerations: 5``: replacing it would hide input
            the API server refuses).
    """
    name, argument = shortcut
    field = _METADATA_SHORTCUTS.get(name)
    if field is not None and argument.get("target", "object") == "object":
        if not isinstance(obj.get("metadata"), dict):
            raise MutationError(f"{name}: the object's metadata is "
                                f"{described(obj.get('metadata'))}, not a map")
        try:
            return _set_key(obj["metadata"], field, argument["key"], argument["value"])
        except MutationError as exc:
            raise MutationError(f"{name}: metadata.{exc}") from None
    changed = False
    for spec_path, metadata_path in _pod_targets(obj, facts):
        spec = _at(obj, spec_path)
        if spec is None:
            continue
        try:
            if field is None:
                changed = _POD_SPEC_SHORTCUTS[name](spec, argument) or changed
                continue
            if not metadata_path:
                continue
            parent_path, _, key = metadata_path.rpartition(".")
            parent = _at(obj, parent_path)
            if parent is None:
                continue
            _wrong_type(parent, key, dict)
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
                changed = True
            changed = _set_key(parent[key], field, argument["key"], argument["value"]) or changed
        except MutationError as exc:
            where = spec_path if field is None else metadata_path
            raise MutationError(f"{name}: {where}.{exc}") from None
    return changed


def _set_key(parent: dict[str, Any], field: str, key: str, value: Any) -> bool:
    """``parent[field][key] = value``, creating the map (a null one too); True when it changed.

    Raises:
        MutationError: ``parent[field]`` is present and not a map.
    """
    _wrong_type(parent, field, dict)
    if not isinstance(parent.get(field), dict):
        parent[field] = {}
    if parent[field].get(key) == value and key in parent[field]:
        return False
    parent[field][key] = value
    return True
