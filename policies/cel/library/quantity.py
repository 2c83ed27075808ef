"""Kubernetes ``quantity`` values for CEL, as plain maps.

Owns the CEL-side representation of a Kubernetes ``resource.Quantity`` and the functions of the
Kubernetes CEL quantity library (``k8s.io/apiserver/pkg/cel/library/quantity.go``): ``quantity``,
``isQuantity``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``, ``mul``,
``asInteger``, ``asApproximateFloat``, ``isInteger`` and ``sign``.

The CEL runtime (cel-expr-python) cannot carry opaque Python objects, so a quantity travels through
CEL as the one-key map ``{"__quantity__": "<n>"}`` or ``{"__quantity__": "<n>/<d>"}``: the exact
value as a reduced fraction of the base unit. Two quantities with the same value are therefore equal
maps, and CEL's ``==`` agrees with ``compareTo(...) == 0`` (``quantity('1000m') == quantity('1')``).

Parsing follows ``resource.ParseQuantity``: no surrounding whitespace, and values finer than 1n
are rounded up (away from zero) to the next nano unit. Decimal exponents (``1e3``) are limited to
+/-:data:`MAX_EXPONENT` so that a hostile string cannot make exact arithmetic explode.

Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Final

from policies.cel.library.declarations import FunctionSpec, function
from policies.facts.quantity import QuantityError, parse_quantity
from policies.facts.stored_quantity import FORMAT_WRONG

QUANTITY_KEY: Final = "__quantity__"
MAX_EXPONENT: Final = 1000
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_NANO: Final = 10**9
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)$")


def quantity_value(value: Fraction | int | Decimal) -> dict[str, str]:
    """Encode an exact number as a quantity's CEL map form, e.g. ``{"__quantity__": "3/2"}``."""
    return {QUANTITY_KEY: str(Fraction(value))}


def is_quantity_value(value: object) -> bool:
    """Tell whether ``value`` (a plain CEL result) is a quantity map from :func:`quantity_value`."""
    return isinstance(value, Mapping) and len(value) == 1 and QUANTITY_KEY in value


def quantity_fraction(value: object) -> Fraction:
    """Decode a quantity map back to its exact value.

    Raises:
        TypeError: ``value`` is not a quantity map (CEL reports it as a no-such-overload error).
    """
    if not is_quantity_value(value):
        raise TypeError(f"no such overload: expected a quantity, got {_describe(value)}")
    assert isinstance(value, Mapping)
    return _fraction(value[QUANTITY_KEY])


@functools.lru_cache(maxsize=4096)
def _fraction(text: str) -> Fraction:
    return Fraction(text)


@functools.lru_cache(maxsize=4096)
def parse_cel_quantity(text: str) -> Fraction:
    """Parse a quantity string as the Kubernetes ``quantity()`` function does.

    Raises:
        ValueError: the string is not a quantity (the message mirrors Kubernetes').
    """
    if not isinstance(text, str) or text != text.strip() or not text:
        raise ValueError(FORMAT_WRONG)
    exponent = _EXPONENT.search(text)
    if exponent is not None and abs(int(exponent.group(1))) > MAX_EXPONENT:
        raise ValueError(f"quantity exponent out of range (at most +/-{MAX_EXPONENT}): {text!r}")
    try:
        value = parse_quantity(text)
    except QuantityError:
        raise ValueError(FORMAT_WRONG) from None
    scaled = value * _NANO
    if scaled.denominator != 1:
        rounded = math.ceil(scaled) if scaled > 0 else math.floor(scaled)
        value = Fraction(rounded, _NANO)
    return value


def quantity(text: str) -> dict[str, str]:
    """``quantity(string) -> Quantity``; errors for strings that are not quantities."""
    return {QUANTITY_KEY: _encoded(text)}


@functools.lru_cache(maxsize=4096)
def _encoded(text: str) -> str:
    return str(parse_cel_quantity(text))


def is_quantity(text: str) -> bool:
    """``isQuantity(string) -> bool``: true exactly when ``quantity(string)`` succeeds."""
    try:
        parse_cel_quantity(text)
    except ValueError:
        return False
    return True


def compare_to(left: object, right: object) -> int:
    """``<Quantity>.compareTo(<Quantity>) -> int``: -1, 0 or 1."""
    a, b = quantity_fraction(left), quantity_fraction(right)
    return (a > b) - (a < b)


def is_greater_than(left: object, right: object) -> bool:
    """``<Quantity>.isGreaterThan(<Quantity>) -> bool``."""
    return quantity_fraction(left) > quantity_fraction(right)


def is_less_than(left: object, right: object) -> bool:
    """``<Quantity>.isLessThan(<Quantity>) -> bool``."""
    return quantity_fraction(left) < quantity_fraction(right)


def add(left: object, right: object) -> dict[str, str]:
    """``<Quantity>.add(<Quantity>|<int>) -> Quantity``, exact."""
    return quantity_value(quantity_fraction(left) + _operand(right))


def sub(left: object, right: object) -> dict[str, str]:
    """``<Quantity>.sub(<Quantity>|<int>) -> Quantity``, exact."""
    return quantity_value(quantity_fraction(left) - _operand(right))


def mul(left: object, right: object) -> dict[str, str]:
    """``<Quantity>.mul(<int>) -> Quantity``, exact."""
    if not _is_int(right):
        raise TypeError(f"no such overload: mul expects an int, got {_describe(right)}")
    assert isinstance(right, int)
    return quantity_value(quantity_fraction(left) * right)


def sign(value: object) -> int:
    """``<Quantity>.sign() -> int`` (also ``sign(<Quantity>)``): -1, 0 or 1."""
    v = quantity_fraction(value)
    return (v > 0) - (v < 0)


def is_integer(value: object) -> bool:
    """``<Quantity>.isInteger() -> bool``: true when ``asInteger()`` would succeed."""
    v = quantity_fraction(value)
    return v.denominator == 1 and _INT64_MIN <= v.numerator <= _INT64_MAX


def as_integer(value: object) -> int:
    """``<Quantity>.asInteger() -> int``.

    Raises:
        ValueError: the value has a fractional part or does not fit in an int64
            (Kubernetes: "cannot convert value to integer").
    """
    if not is_integer(value):
        raise ValueError("cannot convert value to integer")
    return quantity_fraction(value).numerator


def as_approximate_float(value: object) -> float:
    """``<Quantity>.asApproximateFloat() -> double``; +/-Inf beyond the float range."""
    v = quantity_fraction(value)
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _operand(value: object) -> Fraction:
    if _is_int(value):
        assert isinstance(value, int)
        return Fraction(value)
    return quantity_fraction(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "double", str: "string", list: "list"}.get(type(value), "value")


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("quantity", ("string_to_quantity", ["string"], "opaque", False, quantity)),
    function("isQuantity", ("is_quantity_string", ["string"], "bool", False, is_quantity)),
    function(
        "add",
        ("quantity_add", ["opaque", "opaque"], "opaque", True, add),
        ("quantity_add_int", ["opaque", "int"], "opaque", True, add),
    ),
    function(
        "sub",
        ("quantity_sub", ["opaque", "opaque"], "opaque", True, sub),
        ("quantity_sub_int", ["opaque", "int"], "opaque", True, sub),
    ),
    function("mul", ("quantity_multiply_int", ["opaque", "int"], "opaque", True, mul)),
    function(
        "sign",
        ("quantity_sign", ["opaque"], "int", False, sign),
        ("quantity_sign_member", ["opaque"], "int", True, sign),
    ),
    function("isInteger", ("quantity_is_integer", ["opaque"], "bool", True, is_integer)),
    function("asInteger", ("quantity_get_int", ["opaque"], "int", True, as_integer)),
    function(
        "asApproximateFloat",
        ("quantity_get_float", ["opaque"], "double", True, as_approximate_float),
    ),
)
"""The quantity library's functions (``compareTo``, ``isGreaterThan`` and ``isLessThan`` are
shared with Semver in :mod:`~policies.cel.library.opaque`), as
:mod:`~policies.cel.library.libraries` collects them."""


__all__ = [
    "DECLARATIONS",
    "MAX_EXPONENT",
    "QUANTITY_KEY",
    "add",
    "as_approximate_float",
    "as_integer",
    "compare_to",
    "is_greater_than",
    "is_integer",
    "is_less_than",
    "is_quantity",
    "is_quantity_value",
    "mul",
    "parse_cel_quantity",
    "quantity",
    "quantity_fraction",
    "quantity_value",
    "sign",
    "sub",
]
