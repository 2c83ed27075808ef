"""``patchType: ApplyConfiguration``: an apply configuration merged into the object as the API
server merges it (structured merge, ``sigs.k8s.io/structured-merge-diff``).

Owns the semantics of ``k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch/smd.go``
(Kubernetes 1.37) for the kinds of :data:`KINDS`, with the OpenAPI facts the API server's type
converter uses, read from a real kube-apiserver into ``policies/data/apply-schema.json``
(``tests/controlplane/apply_schema.py``):

* the value must be an ``Object`` (``must evaluate to Object but got ...``), and each nested
  ``Object.a.b{...}`` literal's type name must be its field path from the root
  (``type mismatch: unexpected type name ...``);
* a field the schema does not declare fails (``.spec.replicasx: field not declared in
  schema``), and so does any atomic list, atomic map or atomic struct in the apply configuration
  (``may not mutate atomic arrays, maps or structs: .spec.selector``): the API server refuses to
  replace a whole atomic value from a partial one;
* merge: maps and structs key by key; ``x-kubernetes-list-type: map`` lists item by item on
  their ``x-kubernetes-list-map-keys`` (a missing key takes its schema default, ``protocol:
  TCP``), items only in the object keep their place, new ones follow in the configuration's
  order, duplicates of a key the configuration sets collapse into its item; ``set`` lists as
  sets of values; scalars are replaced.

A kind outside :data:`KINDS` (a custom resource, whose schema only its CRD has) is refused with a
message saying so, never merged with guessed semantics.

Must not evaluate CEL or decide whether a mutation runs (that is the engine).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from policies.facts.openapi import SCALARS, definition, field, kinds, resolve
from policies.policy import decoding
from policies.policy.mutation import MutationError

TYPE_KEY: Final = "@type"
"""The key :func:`policies.policy.loader.rewrite_typed_literals` gives each ``Object`` literal
(its type name): a key no Kubernetes field can have."""
ROOT_TYPE: Final = "Object"


def _typed(value: Any, expected: str | None, path: str) -> Any:
    """``value`` without :data:`TYPE_KEY`, checking each literal's type name is ``expected``
    (its field path from the root, as ``CheckTypeNamesMatchFieldPathNames``)."""
    if isinstance(value, list):
        return [_typed(v, expected, path) for v in value]
    if not isinstance(value, Mapping):
        return value
    name = value.get(TYPE_KEY)
    if name is not None and expected is not None and name != expected:
        raise MutationError(f"type mismatch: unexpected type name {name!r}, expected "
                            f"{expected!r}, which matches field name path from root Object type")
    inner = name if isinstance(name, str) else None
    return {k: _typed(v, f"{inner}.{k}" if inner else None, f"{path}.{k}")
            for k, v in value.items() if k != TYPE_KEY}


def typed_value(value: Any) -> dict[str, Any]:
    """An ApplyConfiguration expression's value as a plain map.

    Raises:
        MutationError: not an ``Object{...}`` (API server: ``must evaluate to Object but got
            <type>``) or a nested literal whose type name is not its field path.
    """
    if not isinstance(value, Mapping) or value.get(TYPE_KEY) != ROOT_TYPE:
        got = value.get(TYPE_KEY) if isinstance(value, Mapping) and TYPE_KEY in value else \
            ("map" if isinstance(value, Mapping) else type(value).__name__)
        raise MutationError(f"must evaluate to Object but got {got}")
    result = _typed(value, ROOT_TYPE, "")
    assert isinstance(result, dict)
    return result


def untyped(value: Any) -> Any:
    """``value`` with every ``Object`` literal's :data:`TYPE_KEY` removed (a JSONPatch value:
    the API server converts the literal to its fields)."""
    return _typed(value, None, "")


def _definition(obj: Mapping[str, Any]) -> str:
    name = definition(obj)
    if name is None:
        known = ", ".join(sorted(kinds()))
        raise MutationError(
            f"gpuguard has the structured-merge schema of {known} only; "
            f"{obj.get('apiVersion')}/{obj.get('kind')} would need its own (a custom "
            "resource's is in its CRD), so an ApplyConfiguration cannot be merged into it")
    return name


def _atomics(shape: Any, value: Any, path: str) -> list[str]:
    """Paths of the atomic lists, maps and structs in ``value`` (``findAtomics``)."""
    shape = resolve(shape)
    found: list[str] = []
    if isinstance(value, Mapping) and isinstance(shape, Mapping):
        if "fields" in shape:
            if shape.get("atomic"):
                found.append(path)
            for key, item in value.items():
                if key in shape["fields"]:
                    found += _atomics(shape["fields"][key], item, f"{path}.{key}")
        elif "map" in shape:
            if shape.get("atomic"):
                found.append(path)
            for key, item in value.items():
                found += _atomics(shape["map"], item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(shape, Mapping) and "list" in shape:
        if shape["list"] == "atomic":
            found.append(path)
        for index, item in enumerate(value):
            found += _atomics(shape["items"], item, f"{path}[{index}]")
    return found


def _go_verb_v(value: Any) -> str:
    """Go's ``%v`` of a structured-merge ``value.Value`` (``&{...}`` around the value)."""
    return "&{" + decoding.go_value(value) + "}"


def _scalar_error(scalar: str, value: Any) -> str | None:
    """``validateScalar`` of structured-merge-diff (typed/validate.go): the scalar types of the
    schema are numeric, string, boolean and untyped (int-or-string, Quantity)."""
    if value is None or scalar == "scalar:any":
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if scalar in ("scalar:int32", "scalar:int64", "scalar:double"):
        if not number:
            return f"expected numeric (int or float), got {decoding.go_type(value)}"
    elif scalar in ("scalar:string", "scalar:date-time"):
        if not isinstance(value, str):
            return "expected string, got &value.valueUnstructured{Value:" \
                f"{decoding.go_value(value, syntax=True)}}}"
    elif scalar == "scalar:boolean":
        if not isinstance(value, bool):
            return f"expected boolean, got {_go_verb_v(value)}"
    elif not (number or isinstance(value, str | bool)):
        return f"expected any scalar, got {_go_verb_v(value)}"
    return None


def _element(shape: Mapping[str, Any], index: int, item: Any) -> str:
    """The path element of a list item (``fieldpath.PathElement.String``): ``[name="c"]`` for
    an associative list (keys sorted, a missing key from its default), ``[="v"]`` for a set,
    ``[0]`` for an atomic list."""
    if shape["list"] == "set":
        return f"[={decoding.go_literal(item)}]"
    if shape["list"] != "map" or not isinstance(item, Mapping):
        return f"[{index}]"
    items = resolve(shape["items"])
    defaults = items.get("defaults", {}) if isinstance(items, Mapping) else {}
    keys = sorted(k for k in shape.get("keys", ()) if k in item or k in defaults)
    return "[" + ",".join(f"{k}={decoding.go_literal(item.get(k, defaults.get(k)))}"
                          for k in keys) + "]"


def typed_errors(shape: Any, value: Any, path: str = "") -> list[str]:
    """What structured-merge-diff's ``ObjectToTyped`` refuses in ``value`` against ``shape``
    (typed/validate.go): ``<path>: field not declared in schema``, ``<path>: expected string,
    got ...``, ``expected list``/``expected map``. Every error, in the value's order (the API
    server's order follows Go map iteration, so only a single error is worded the same)."""
    shape = resolve(shape)
    if isinstance(shape, str):
        error = _scalar_error(shape, value) if shape in SCALARS else None
        return [f"{path}: {error}"] if error else []
    if value is None:
        return []  # null is a valid list, map and struct
    if "list" in shape:
        if not isinstance(value, list):
            return [f"{path}: expected list, got {_go_verb_v(value)}"]
        return [error for index, item in enumerate(value)
                for error in typed_errors(shape["items"], item,
                                          path + _element(shape, index, item))]
    if not isinstance(value, Mapping):
        return [f"{path}: expected map, got {_go_verb_v(value)}"]
    errors: list[str] = []
    for key, item in value.items():
        inner = field(shape, key)
        if inner is None:
            errors.append(f"{path}.{key}: field not declared in schema")
            break  # visitMapItems stops at an undeclared field
        errors += typed_errors(inner, item, f"{path}.{key}")
    return errors


def _validation_error(errors: list[str]) -> str:
    """``ValidationErrors.Error()``: one error alone, several under ``errors:``."""
    return errors[0] if len(errors) == 1 else "\n".join(["errors:", *("  " + e for e in errors)])


def _item_key(shape: Mapping[str, Any], item: Any) -> Any:
    """A list item's identity: its key fields (``map`` lists, missing keys from their schema
    default, absent ones skipped) or its value (``set`` lists)."""
    if shape["list"] == "set":
        return repr(item)
    items = resolve(shape["items"])
    defaults = items.get("defaults", {}) if isinstance(items, Mapping) else {}
    if not isinstance(item, Mapping):
        return repr(item)
    return tuple((k, repr(item[k]) if k in item else repr(defaults.get(k)))
                 for k in shape.get("keys", ()) if k in item or k in defaults)


def _merge(shape: Any, live: Any, patch: Any) -> Any:
    shape = resolve(shape)
    if isinstance(patch, Mapping) and isinstance(live, Mapping) and isinstance(shape, Mapping) \
            and ("fields" in shape or "map" in shape):
        merged = dict(live)
        for key, item in patch.items():
            inner = field(shape, key) or "scalar:any"
            merged[key] = _merge(inner, live[key], item) if key in live else copy.deepcopy(item)
        return merged
    if isinstance(patch, list) and isinstance(live, list) and isinstance(shape, Mapping) \
            and shape.get("list") in ("map", "set"):
        return _merge_list(shape, live, patch)
    return copy.deepcopy(patch)


def _merge_list(shape: Mapping[str, Any], live: list[Any], patch: list[Any]) -> list[Any]:
    """``visitListItems`` of structured-merge-diff's merging walker: items of ``live`` that the
    patch does not name keep their place, shared items are merged in the patch's order, new
    items come where the patch puts them."""
    live_keys = [_item_key(shape, item) for item in live]
    patch_keys = [_item_key(shape, item) for item in patch]
    live_by: dict[Any, Any] = {}
    for key, item in zip(live_keys, live, strict=True):
        live_by[key] = None if key in live_by else item  # a duplicated key: no single item
    patch_by = dict(zip(patch_keys, patch, strict=True))
    shared = [k for k in patch_keys if k in live_by]
    out: list[Any] = []
    done: set[Any] = set()
    left = right = 0

    def merged(key: Any) -> Any:
        before = live_by.get(key)
        return _merge(shape["items"], before, patch_by[key]) if before is not None else \
            copy.deepcopy(patch_by[key])

    while left < len(live) or right < len(patch):
        if left < len(live) and right < len(patch):
            key = live_keys[left]
            if key == patch_keys[right]:
                done.add(key)
                out.append(merged(key))
                left += 1
                right += 1
                shared = shared[1:] if shared and shared[0] == key else shared
                continue
            if key in patch_by and shared and shared[0] != key:
                left += 1
                continue
        if left < len(live):
            key = live_keys[left]
            if key not in patch_by:
                out.append(copy.deepcopy(live[left]))
                left += 1
                continue
            if key in done:
                left += 1
                continue
        if right < len(patch):
            key = patch_keys[right]
            if key not in done:
                done.add(key)
                out.append(merged(key))
            right += 1
            shared = shared[1:] if shared and shared[0] == key else shared
    return out


def apply_configuration(obj: Mapping[str, Any], configuration: Mapping[str, Any]
                        ) -> dict[str, Any]:
    """``obj`` with ``configuration`` (from :func:`typed_value`) merged in, as a new object.

    Raises:
        MutationError: the kind has no facts here, a field is not declared, or the
            configuration holds an atomic value or a value of the wrong type, or the merged
            object does not convert to its Go type; the text is the API server's where it has
            one (``error applying patch: invalid ApplyConfiguration: may not mutate atomic
            arrays, maps or structs: .spec.selector``, ``error applying patch: failed to
            convert patch object to typed object: .metadata.labels.a: expected string, got
            &value.valueUnstructured{Value:1}``).
    """
    root = _definition(obj)
    patch = {**configuration, "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind")}
    if errors := typed_errors(root, patch):
        raise MutationError("error applying patch: failed to convert patch object to typed "
                            f"object: {_validation_error(errors)}")
    if atomics := _atomics(root, patch, ""):
        raise MutationError("error applying patch: invalid ApplyConfiguration: may not mutate "
                            f"atomic arrays, maps or structs: {', '.join(atomics)}")
    result = _merge(root, obj, patch)
    assert isinstance(result, dict)
    if (error := decoding.conversion_error(result, obj)) is not None:
        raise MutationError(error)
    return result
