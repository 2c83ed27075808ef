"""CEL equality and ordering on plain Python values, for the library functions that need them.

Owns :func:`cel_equal` (CEL ``==``) and :func:`compare` (CEL ordering) on the plain values the
runtime hands to Python functions; used by :mod:`~policies.cel.library.lists` and
:mod:`~policies.cel.library.sets`. Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

import datetime
from typing import Any


def cel_equal(a: object, b: object) -> bool:
    """CEL ``==`` on plain values: numbers compare across int/double, bool never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, bytes | bytearray) and isinstance(b, bytes | bytearray):
        return bytes(a) == bytes(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return len(a) == len(b) and all(k in b and cel_equal(v, b[k]) for k, v in a.items())
    return type(a) is type(b) and a == b


def _order_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    for kind, types in (
        ("string", str),
        ("bytes", bytes | bytearray),
        ("timestamp", datetime.datetime),
        ("duration", datetime.timedelta),
    ):
        if isinstance(value, types):
            return kind
    raise TypeError(f"no such overload: {type(value).__name__} values are not comparable")


def compare(a: Any, b: Any) -> int:
    """CEL ordering of two plain values: -1, 0 or 1 (numbers across int/double).

    Raises:
        TypeError: the values are not comparable with each other ("no such overload").
    """
    if _order_kind(a) != _order_kind(b):
        raise TypeError(f"no such overload: cannot compare {_order_kind(a)} with {_order_kind(b)}")
    return int(a > b) - int(a < b)
