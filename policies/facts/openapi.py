"""The OpenAPI facts of Pods and workloads, as a real kube-apiserver serves them.

Owns reading ``policies/data/apply-schema.json`` (written by ``python -m
tests.controlplane.apply_schema`` from the tier's kube-apiserver ``/openapi/v3``, and checked
against it by ``tests/controlplane/test_apply_schema.py``) and walking its shapes. A shape is:

* a definition name (``io.k8s.api.core.v1.PodSpec``), resolved by :func:`resolve` to a struct
  ``{"fields": {...}, "atomic"?: true, "defaults"?: {...}}`` or to another shape;
* ``{"list": "atomic" | "set" | "map", "keys"?: [...], "items": shape}``;
* ``{"map": shape, "atomic"?: true}`` (``additionalProperties``);
* a scalar, ``scalar:<type>`` (:data:`SCALARS`).

Its users are the ApplyConfiguration merge (:mod:`policies.policy.apply`), the typed decoding
checks of a mutated object (:mod:`policies.policy.decoding`) and the stored form of an object
read offline (:func:`stored_form`). Must not merge, patch or evaluate anything.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from policies.facts.stored_quantity import json_number, stored_quantity
from policies.sources import load_package_json

SCALARS: Final = frozenset({
    "scalar:string", "scalar:date-time", "scalar:boolean", "scalar:int32", "scalar:int64",
    "scalar:double", "scalar:int-or-string", "scalar:quantity", "scalar:any"})
"""The scalar shapes: OpenAPI ``type`` (and ``format``) of the field. ``quantity`` is
``resource.Quantity`` (``oneOf`` string or number), ``any`` an object the API server keeps as it
is (``FieldsV1``); see ``tests/controlplane/apply_schema.py`` ``scalar``."""
ANY: Final = "scalar:any"


@functools.cache
def _schema() -> Mapping[str, Any]:
    loaded = load_package_json("policies.data", "apply-schema.json")
    assert isinstance(loaded, Mapping)
    return loaded


def kinds() -> Mapping[str, str]:
    """``apiVersion/kind`` → OpenAPI definition name, for the kinds the facts cover."""
    return _schema()["kinds"]  # type: ignore[no-any-return]


def definition(obj: Mapping[str, Any]) -> str | None:
    """The definition name of ``obj``'s kind (from its ``apiVersion`` and ``kind``), or None for
    a kind the facts do not cover (a custom resource: its schema is in its CRD)."""
    return kinds().get(f"{obj.get('apiVersion')}/{obj.get('kind')}")


def resolve(shape: Any) -> Any:
    """``shape`` with definition names replaced by what they name (one level of structure)."""
    definitions = _schema()["definitions"]
    seen = 0
    while isinstance(shape, str) and shape not in SCALARS:
        shape = definitions[shape]
        seen += 1
        if seen > 16:  # a definition naming itself (none does); never loop
            return ANY
    return shape


def field(shape: Mapping[str, Any], name: str) -> Any:
    """The shape of field ``name`` of a resolved struct or map shape; None when a struct does
    not declare it."""
    if "fields" in shape:
        return shape["fields"].get(name)
    return shape.get("map")


_QUANTITY: Final = "scalar:quantity"
_LIST = "[]"  # a step of a quantity route: every item of a list


@functools.cache
def _routes(shape: str) -> Mapping[str, Any]:
    """The fields of definition ``shape`` that lead to a Quantity: ``{field: routes}``, where a
    route is the nested routes, ``{"[]": routes}`` for a list's items, or ``True`` (a Quantity)
    / ``"list"`` (a ResourceList: a map of Quantities)."""
    found: dict[str, Any] = {}
    resolved = resolve(shape)
    if not isinstance(resolved, Mapping) or "fields" not in resolved:
        return found
    for name, inner in resolved["fields"].items():
        route = _route(inner, depth=0)
        if route:
            found[name] = route
    return found


def _route(shape: Any, depth: int) -> Any:
    if depth > 40:  # recursive definitions (JSONSchemaProps) lead nowhere we look
        return None
    if shape == _QUANTITY:
        return True
    if isinstance(shape, str) and shape not in SCALARS:
        resolved = resolve(shape)
        if resolved == _QUANTITY:
            return True
        return _routes(shape) or None
    if isinstance(shape, Mapping) and "list" in shape:
        inner = _route(shape["items"], depth + 1)
        return {_LIST: inner} if inner else None
    if isinstance(shape, Mapping) and "map" in shape:
        return "list" if resolve(shape["map"]) == _QUANTITY else None
    return None


def _stored(route: Any, value: Any) -> Any:
    """``value`` with the Quantities along ``route`` in their stored form; the same object
    when nothing changes (copies only what it changes). Objects read from YAML and JSON are
    dicts and lists: another Mapping is left as it is."""
    if route is True:
        return _stored_one(value, False)
    if route == "list":  # a ResourceList
        if type(value) is not dict:
            return value
        result: dict[str, Any] | None = None
        for key, item in value.items():
            new = _stored_one(item, True)
            if new is not item:
                result = dict(value) if result is None else result
                result[key] = new
        return value if result is None else result
    if _LIST in route:
        if type(value) is not list:
            return value
        inner = route[_LIST]
        items: list[Any] | None = None
        for index, item in enumerate(value):
            new = _stored(inner, item)
            if new is not item:
                items = list(value) if items is None else items
                items[index] = new
        return value if items is None else items
    if type(value) is not dict:
        return value
    result = None
    for name, inner in route.items():
        item = value.get(name)
        if item is not None:
            new = _stored(inner, item)
            if new is not item:
                result = dict(value) if result is None else result
                result[name] = new
    return value if result is None else result


def _stored_one(value: Any, resource_list: bool) -> Any:
    if type(value) is str:
        text = stored_quantity(value, resource_list)
        return value if text is None or text == value else text
    if type(value) is int or type(value) is float:
        # the API server stores a string whatever the number; past the port's bounds, the
        # text kubectl sends is closer to it than a number CEL would read as a number
        return stored_quantity(value, resource_list) or json_number(value)
    return value  # not a quantity (a boolean, a map): the reader that needs it reports it


def stored_form(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj`` as kube-apiserver would store it, as far as admission can tell: every
    ``resource.Quantity`` of its kind in the API server's text
    (:func:`policies.facts.stored_quantity.stored_quantity`: ``nvidia.com/gpu: 8`` becomes
    ``"8"``, ``cpu: 0.5`` ``"500m"``, ``memory: 1024Mi`` ``"1Gi"``). ``obj`` itself when nothing
    changes or its kind has no facts here (a custom resource); never modified in place. A value
    that is no quantity is left as written for the reader that needs it to report."""
    root = definition(obj)
    if root is None:
        return obj
    routes = _routes(root)
    return _stored(routes, obj) if routes else obj
