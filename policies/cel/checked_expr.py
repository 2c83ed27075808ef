"""The checked AST of a compiled CEL expression, read from its serialized ``CheckedExpr``.

Owns reading the protobuf bytes the runtime's ``Expression.serialize()`` gives (an ``Any``
holding a ``google.api.expr.v1alpha1.CheckedExpr``: ``expr`` = field 4, ``source_info`` = 5) into
:class:`Node` trees and source positions, with a protobuf wire-format reader of its own (the
runtime exposes no AST and the project takes no protobuf dependency for one message). Must not
decide anything about an expression: cost (:mod:`policies.cel.cost`) and the creation-time checks
(:mod:`policies.cel.instantiation`) walk the tree.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class Node:
    """One expression node of a checked AST.

    ``kind``: ``const``, ``ident``, ``select``, ``call``, ``list``, ``map`` (map and object
    literals; ``name`` is the message name of an object literal), ``comprehension``. ``name``: the
    identifier, selected field or function, or a constant's CEL type (``int``, ``uint``,
    ``double``, ``string``, ``bytes``, ``bool``, ``null``); ``value``: a constant's value (str,
    bytes, int, float, bool, None); ``children``: call target (when ``member``) then arguments /
    operand / list elements / map keys and values alternately / comprehension parts (range,
    accu_init, loop_condition, loop_step, result); ``variables``: a comprehension's
    (iter_var, iter_var2, accu_var); ``test_only``: a ``has()`` selection.
    """

    kind: str
    name: str = ""
    value: Any = None
    children: tuple[Node, ...] = ()
    member: bool = False
    variables: tuple[str, str, str] = ("", "", "")
    test_only: bool = False
    id: int = 0  # the expression id, the key of :func:`positions`
    optional: tuple[int, ...] = ()  # a list's ``[?x]`` element / a map's ``{?k: v}`` entry indexes


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: varints as int, fixed64 as bytes,
    length-delimited as bytes."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_CONSTANT_TYPES: Final = {1: "null", 2: "bool", 3: "int", 4: "uint", 5: "double", 6: "string",
                          7: "bytes"}


def _constant(data: bytes) -> tuple[str, Any]:
    """(CEL type, value) of a ``Constant`` message."""
    for number, _, value in _fields(data):
        if number == 1:
            return "null", None
        if number == 2:
            return "bool", bool(value)
        if number in (3, 4):
            return _CONSTANT_TYPES[number], _signed(value) if number == 3 else value
        if number == 5:
            return "double", struct.unpack("<d", value)[0]
        if number == 6:
            return "string", value.decode("utf-8", "surrogatepass")
        if number == 7:
            return "bytes", bytes(value)
    return "null", None


def _expr(data: bytes) -> Node:
    node = _expr_kind(data)
    ident = next((v for f, _, v in _fields(data) if f == 2), 0)  # Expr.id
    return replace(node, id=ident) if ident else node


def _expr_kind(data: bytes) -> Node:
    for number, _, value in _fields(data):
        if number == 3:
            kind, constant = _constant(value)
            return Node("const", name=kind, value=constant)
        if number == 4:
            return Node("ident", name=next(
                (v.decode() for f, _, v in _fields(value) if f == 1), ""))
        if number == 5:
            operand, name, test = None, "", False
            for f, _, v in _fields(value):
                if f == 1:
                    operand = _expr(v)
                elif f == 2:
                    name = v.decode()
                elif f == 3:
                    test = bool(v)
            return Node("select", name=name, children=(operand,) if operand else (),
                        test_only=test)
        if number == 6:
            target, function, args = None, "", []
            for f, _, v in _fields(value):
                if f == 1:
                    target = _expr(v)
                elif f == 2:
                    function = v.decode()
                elif f == 3:
                    args.append(_expr(v))
            return Node("call", name=function, member=target is not None,
                        children=((target,) if target else ()) + tuple(args))
        if number == 7:
            optional: list[int] = []
            for f, wire, v in _fields(value):
                if f == 2:  # optional_indices: packed (wire 2) or one varint each
                    optional += _packed(v) if wire == 2 else [v]
            return Node("list", children=tuple(_expr(v) for f, _, v in _fields(value) if f == 1),
                        optional=tuple(optional))
        if number == 8:
            name = ""
            parts: list[Node] = []
            entries: list[int] = []
            for f, _, v in _fields(value):
                if f == 1:
                    name = v.decode()
                elif f == 2:
                    key: Node = Node("const", value=None)
                    item: Node = Node("const", value=None)
                    for ef, _, ev in _fields(v):
                        if ef == 2:
                            key = Node("const", value=ev.decode())
                        elif ef == 3:
                            key = _expr(ev)
                        elif ef == 4:
                            item = _expr(ev)
                        elif ef == 5 and ev:
                            entries.append(len(parts) // 2)
                    parts += [key, item]
            return Node("map", name=name, children=tuple(parts), optional=tuple(entries))
        if number == 9:
            names = {1: "", 3: "", 8: ""}
            parts_by: dict[int, Node] = {}
            for f, _, v in _fields(value):
                if f in names:
                    names[f] = v.decode()
                elif f in (2, 4, 5, 6, 7):
                    parts_by[f] = _expr(v)
            empty = Node("const", value=None)
            return Node("comprehension", variables=(names[1], names[8], names[3]),
                        children=tuple(parts_by.get(f, empty) for f in (2, 4, 5, 6, 7)))
    return Node("const", value=None)


def _packed(data: bytes) -> list[int]:
    """The varints of a packed repeated integer field."""
    values, i = [], 0
    while i < len(data):
        value, i = _varint(data, i)
        values.append(value)
    return values


def _checked(serialized: bytes) -> bytes:
    body: bytes = next(v for f, _, v in _fields(serialized) if f == 2)  # Any.value
    return body


def checked_ast(serialized: bytes) -> Node:
    """The expression tree of ``Expression.serialize()`` (an ``Any`` holding a ``CheckedExpr``).

    Raises:
        ValueError: the bytes are not such a message.
    """
    try:
        expr = next(v for f, _, v in _fields(_checked(serialized)) if f == 4)
        return _expr(expr)
    except (StopIteration, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a serialized checked CEL expression ({exc})") from None




def positions(serialized: bytes) -> dict[int, int]:
    """Where each expression id of ``Expression.serialize()`` starts in the compiled source: id
    -> offset in code points (``SourceInfo.positions``); ids without a position are absent.

    Raises:
        ValueError: the bytes are not a serialized checked expression.
    """
    try:
        info = next((v for f, _, v in _fields(_checked(serialized)) if f == 5), b"")
        found = {}
        for number, _, entry in _fields(info):
            if number == 4:
                fields = {f: v for f, _, v in _fields(entry)}
                found[_signed(fields.get(1, 0))] = _signed(fields.get(2, 0))
        return found
    except (StopIteration, IndexError) as exc:
        raise ValueError(f"not a serialized checked CEL expression ({exc})") from None


_PRIMITIVES: Final = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}
_WELL_KNOWN: Final = {1: "any", 2: "timestamp", 3: "duration"}


def _type_name(data: bytes) -> str:
    """A ``google.api.expr.v1alpha1.Type`` as cel-go's checker writes it in its messages
    (``int``, ``list(string)``, ``map(string, dyn)``, ``null``, ``timestamp``)."""
    for number, _, value in _fields(data):
        if number == 1:
            return "dyn"
        if number == 2:
            return "null"
        if number == 3:
            return _PRIMITIVES.get(value, "dyn")
        if number == 4:
            return f"wrapper({_PRIMITIVES.get(value, 'dyn')})"
        if number == 5:
            return _WELL_KNOWN.get(value, "dyn")
        if number == 6:
            element = next((v for f, _, v in _fields(value) if f == 1), b"")
            return f"list({_type_name(element)})"
        if number == 7:
            parts = {f: v for f, _, v in _fields(value)}
            return f"map({_type_name(parts.get(1, b''))}, {_type_name(parts.get(2, b''))})"
        if number in (9, 10):
            return str(value.decode())
        if number == 11:
            return f"type({_type_name(value)})"
        if number == 12:
            return "*error*"
        if number == 14:  # abstract type: optional_type(string)
            name = next((v for f, _, v in _fields(value) if f == 1), b"").decode()
            params = [_type_name(v) for f, _, v in _fields(value) if f == 2]
            return f"{name}({', '.join(params)})" if params else str(name)
    return "dyn"


def types(serialized: bytes) -> dict[int, str]:
    """The checked type of each expression id of ``Expression.serialize()``
    (``CheckedExpr.type_map``), in cel-go's words (:func:`_type_name`).

    Raises:
        ValueError: the bytes are not a serialized checked expression.
    """
    try:
        found = {}
        for number, _, entry in _fields(_checked(serialized)):
            if number == 3:
                fields = {f: v for f, _, v in _fields(entry)}
                found[_signed(fields.get(1, 0))] = _type_name(fields.get(2, b""))
        return found
    except (StopIteration, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a serialized checked CEL expression ({exc})") from None
