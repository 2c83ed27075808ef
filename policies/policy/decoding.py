"""What the API server's typed decoding refuses in an object a mutation changed.

A MutatingAdmissionPolicy's result is decoded back into the Go type of its kind before it is
stored; a value of the wrong type fails there even though the patch itself applied. Offline,
nothing else would catch it: ``gpuguard check`` would admit a pod the API server refuses. This
module owns those refusals, with the API server's words (kube-apiserver 1.37, checked against it
by the differential tier, ``tests/data/native-admission/typed-values.yaml``):

* after a JSONPatch, the JSON decoder (``sigs.k8s.io/json``, strict): ``json: cannot unmarshal
  number into Go struct field ObjectMeta.metadata.labels of type string``, then, when no value
  is mistyped, ``strict decoding error: unknown field "spec.bogus"``;
* after an ApplyConfiguration merge, the unstructured converter
  (``runtime.DefaultUnstructuredConverter``): ``unable to convert unstructured object to /v1,
  Kind=Pod: cannot convert float64 to int64``;
* in both, a ``resource.Quantity`` that does not parse: ``quantities must match the regular
  expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'``.

Only values that differ from the object before the mutation are checked: what the API server
stored was decoded once already, and a manifest read offline may carry a mistyped field the
mutation never touched. Also owns the Go formatting of values these texts use (``%v``, ``%#v``,
``%T``). Must not apply patches or evaluate CEL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from policies.facts.openapi import SCALARS, definition, field, resolve
from policies.facts.stored_quantity import json_number, quantity_error

_INTEGERS = {"scalar:int32": (-(2**31), 2**31 - 1), "scalar:int64": (-(2**63), 2**63 - 1)}
_GO_SCALARS = {"scalar:string": "string", "scalar:boolean": "bool", "scalar:int32": "int32",
               "scalar:int64": "int64", "scalar:double": "float64",
               "scalar:date-time": "v1.Time", "scalar:int-or-string": "intstr.IntOrString",
               "scalar:quantity": "resource.Quantity", "scalar:any": "interface {}"}


def _go_float(number: float) -> str:
    """Go's ``%v`` of a float64 (``strconv.FormatFloat(f, 'g', -1, 64)`` with ``%v``'s
    exponent rule: ``1e+21``, ``1.5``, ``2``)."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if number == 0:
        return "-0" if math.copysign(1, number) < 0 else "0"
    sign, digits, exponent = Decimal(repr(number)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # digits before the decimal point
    minus = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 21:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        power = point - 1
        return f"{minus}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{minus}{text}{'0' * (point - len(text))}"
    return f"{minus}{text[:point]}.{text[point:]}"


def go_literal(value: Any) -> str:
    """``value.ToString`` of structured-merge-diff: strings quoted, numbers and bools bare."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return go_value(value)


def go_value(value: Any, *, syntax: bool = False) -> str:
    """Go's ``%v`` (``syntax``: ``%#v``) of an unstructured value (what the API server holds
    after decoding JSON: string, bool, int64, float64, ``map[string]interface {}``,
    ``[]interface {}``, nil)."""
    if value is None:
        return "interface {}(nil)" if syntax else "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if syntax else value
    if isinstance(value, Mapping):
        keys = sorted(value, key=str)
        if syntax:
            return "map[string]interface {}{" + ", ".join(
                f"{json.dumps(str(k))}:{go_value(value[k], syntax=True)}" for k in keys) + "}"
        return "map[" + " ".join(f"{k}:{go_value(value[k])}" for k in keys) + "]"
    if isinstance(value, list | tuple):
        if syntax:
            return "[]interface {}{" + ", ".join(go_value(v, syntax=True) for v in value) + "}"
        return "[" + " ".join(go_value(v) for v in value) + "]"
    return str(value)


def go_type(value: Any) -> str:
    """Go's ``%T`` of an unstructured value."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return "map[string]interface {}" if isinstance(value, Mapping) else "[]interface {}"


def _json_word(value: Any) -> str:
    """How Go's JSON decoder names a JSON value in an ``UnmarshalTypeError``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, Mapping) else "array"


def _same(left: Any, right: Any) -> bool:
    """Equal as JSON values: ``1``, ``1.0`` and ``true`` are three values here. Compared as
    orjson's bytes (C speed: the walk asks this of every sibling on a changed path, so a whole
    unchanged ``spec`` is compared once per mutation); key order counts there, so a reordered map
    is only walked, never missed."""
    try:
        return orjson.dumps(left) == orjson.dumps(right)
    except TypeError:  # what JSON cannot hold (YAML timestamps as keys, huge ints): in Python
        return _same_values(left, right)


def _same_values(left: Any, right: Any) -> bool:
    if type(left) is not type(right):
        return isinstance(left, int | float) and isinstance(right, int | float) and \
            not isinstance(left, bool) and not isinstance(right, bool) and left == right
    if isinstance(left, Mapping):
        return left.keys() == right.keys() and \
            all(_same_values(v, right[k]) for k, v in left.items())
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same_values, left, right))
    return bool(left == right)


def _go_type(shape: Any) -> str:
    """The Go type a shape decodes into, as ``reflect.Type.String()`` words it: ``string``,
    ``int64``, ``[]v1.EnvVar``, ``map[string]string``, ``v1.PodSpec``. A field of a named
    string type (``v1.RestartPolicy``) is ``string`` here: OpenAPI does not carry Go names."""
    if isinstance(shape, str) and shape not in SCALARS:
        parts = shape.split(".")
        return f"{parts[-2]}.{parts[-1]}"
    if isinstance(shape, str):
        return _GO_SCALARS[shape]
    if "list" in shape:
        return "[]" + _go_type(shape["items"])
    if "map" in shape:
        return "map[string]" + _go_type(shape["map"])
    return "interface {}"


class _Walk:
    """One walk of a mutated object against its schema, collecting the first type error (in
    document order, as the decoder meets them) and every unknown field."""

    def __init__(self, converter: bool) -> None:
        self.converter = converter
        self.first: str | None = None
        self.unknown: list[str] = []

    def visit(self, shape: Any, value: Any, before: Any, struct: str, fields: str,
              strict: str) -> None:
        if value is None or _same(value, before):
            return  # null decodes into anything; an unchanged value was decoded before
        resolved = resolve(shape)
        if isinstance(resolved, str):
            self._scalar(resolved, shape, value, struct, fields)
            return
        if "list" in resolved:
            if not isinstance(value, list):
                self._mistyped(value, shape, struct, fields)
                return
            previous = before if isinstance(before, list) else []
            for index, item in enumerate(value):
                self.visit(resolved["items"], item,
                           previous[index] if index < len(previous) else _ABSENT,
                           struct, fields, f"{strict}[{index}]")
            return
        if not isinstance(value, Mapping):
            self._mistyped(value, shape, struct, fields)
            return
        previous_map = before if isinstance(before, Mapping) else {}
        if "fields" in resolved:
            name = shape.split(".")[-1] if isinstance(shape, str) else struct
            for key, item in value.items():
                inner = field(resolved, key)
                path = f"{fields}.{key}" if fields else key
                if inner is None:
                    self.unknown.append(f"{strict}.{key}" if strict else key)
                    continue
                self.visit(inner, item, previous_map.get(key, _ABSENT), name, path,
                           f"{strict}.{key}" if strict else key)
            return
        for key, item in value.items():
            self.visit(resolved["map"], item, previous_map.get(key, _ABSENT), struct, fields,
                       f"{strict}.{key}" if strict else key)

    def _fail(self, message: str) -> None:
        if self.first is None:
            self.first = message

    def _mistyped(self, value: Any, shape: Any, struct: str, fields: str,
                  word: str | None = None) -> None:
        """``value`` does not fit ``shape``: the converter's or the JSON decoder's error
        (``word``: how the decoder names the value, when not by its JSON type)."""
        if self.converter:
            kind = "map" if isinstance(value, Mapping) else \
                "slice" if isinstance(value, list) else go_type(value)
            self._fail(f"cannot convert {kind} to {_go_type(shape)}")
        elif resolve(shape) == "scalar:date-time":  # metav1.Time decodes a string first
            self._fail(f"json: cannot unmarshal {_json_word(value)} into Go value of type "
                       "string")
        else:
            self._fail(f"json: cannot unmarshal {word or _json_word(value)} into Go struct "
                       f"field {struct}.{fields} of type {_go_type(shape)}")

    def _scalar(self, scalar: str, shape: Any, value: Any, struct: str, fields: str) -> None:
        if scalar == "scalar:quantity":
            if (error := quantity_error(value)) is not None:
                self._fail(error)
            return
        if scalar == "scalar:any" or (scalar == "scalar:int-or-string" and \
                isinstance(value, str | int) and not isinstance(value, bool)):
            return
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if scalar in _INTEGERS and number:
            low, high = _INTEGERS[scalar]
            integral = isinstance(value, int) or (math.isfinite(value) and value == int(value))
            if integral and low <= int(value) <= high:
                return
            if self.converter and integral:
                return  # the converter wraps an integer that overflows; nothing to say
            self._mistyped(value, shape, struct, fields, f"number {json_number(value)}")
            return
        expected = {"scalar:string": str, "scalar:date-time": str, "scalar:boolean": bool}
        if (scalar in expected and isinstance(value, expected[scalar])) or \
                (scalar == "scalar:double" and number):
            return
        self._mistyped(value, shape, struct, fields)


_ABSENT = object()


def _kind_words(obj: Mapping[str, Any]) -> str:
    """``schema.GroupVersionKind.String()``: ``/v1, Kind=Pod``, ``apps/v1, Kind=Deployment``."""
    version = str(obj.get("apiVersion", ""))
    return f"{version if '/' in version else '/' + version}, Kind={obj.get('kind')}"


def decoding_error(obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> str | None:
    """What the API server's JSON decoder says about ``obj`` (a JSONPatch result) where it
    differs from ``before``; None when it decodes, or when its kind has no facts here.

    Returns:
        The first type error (``json: cannot unmarshal ...``), else every unknown field
        (``strict decoding error: unknown field "spec.bogus", unknown field ...``).
    """
    root = definition(obj)
    if root is None:
        return None
    walk = _Walk(converter=False)
    walk.visit(root, obj, before if before is not None else _ABSENT, "", "", "")
    if walk.first is not None:
        return walk.first
    if walk.unknown:
        return "strict decoding error: " + ", ".join(
            f"unknown field {json.dumps(path)}" for path in walk.unknown)
    return None


def conversion_error(obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> str | None:
    """What the API server's unstructured converter says about ``obj`` (an ApplyConfiguration
    merge result) where it differs from ``before``: ``unable to convert unstructured object to
    /v1, Kind=Pod: cannot convert float64 to int64``; None when it converts."""
    root = definition(obj)
    if root is None:
        return None
    walk = _Walk(converter=True)
    walk.visit(root, obj, before if before is not None else _ABSENT, "", "", "")
    if walk.first is None:
        return None
    return f"unable to convert unstructured object to {_kind_words(obj)}: {walk.first}"


def store_nulls(obj: dict[str, Any], before: Mapping[str, Any] | None) -> None:
    """What decoding a JSONPatch result into its kind's Go type and encoding it again does to
    the nulls a patch wrote (``add`` without a value, ``value: null``), where ``obj`` differs
    from ``before``, in place: a null struct field is absent (Go's nil pointers, maps and
    slices are ``omitempty``), a null entry of a string map is ``""`` (labels, annotations:
    ``map[string]string`` has no nil). Live: ``tests/data/native-admission/json-patch.yaml``.
    A kind without facts here is left as it is."""
    root = definition(obj)
    if root is not None:
        _store_nulls(root, obj, before if before is not None else _ABSENT)


def _store_nulls(shape: Any, value: Any, before: Any) -> None:
    if _same(value, before):
        return
    resolved = resolve(shape)
    if isinstance(resolved, str):
        return
    if "list" in resolved:
        if isinstance(value, list):
            previous = before if isinstance(before, list) else []
            for index, item in enumerate(value):
                _store_nulls(resolved["items"], item,
                             previous[index] if index < len(previous) else _ABSENT)
        return
    if not isinstance(value, dict):
        return
    previous_map = before if isinstance(before, Mapping) else {}
    if "fields" in resolved:
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for key, item in value.items():
            inner = field(resolved, key)
            if inner is not None:
                _store_nulls(inner, item, previous_map.get(key, _ABSENT))
        return
    entry = resolve(resolved["map"])
    for key, item in value.items():
        if item is None and entry == "scalar:string":
            value[key] = ""
        else:
            _store_nulls(resolved["map"], item, previous_map.get(key, _ABSENT))
