"""Functions several Kubernetes opaque types share: ``compareTo``, ``isGreaterThan``,
``isLessThan`` (Quantity, Semver) and ``string()`` (IP, CIDR, URL).

Kubernetes declares these once per type; here every opaque value is the same CEL type (a one-key
map, see :mod:`~policies.cel.library.quantity`) and the runtime dispatches overloads by argument
*kind* only, so each has one implementation that looks at the map's key and calls the owning
library. Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do
I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from policies.cel.library import quantity
from policies.cel.library.cidr import CIDR_KEY
from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.ip import IP_KEY
from policies.cel.library.semver import SEMVER_KEY, semver_compare
from policies.cel.library.urls import URL_KEY


def _opaque_key(value: object) -> str:
    if isinstance(value, Mapping) and len(value) == 1 and \
            isinstance(key := next(iter(value)), str):
        return key
    raise TypeError("no such overload")


def compare_to(a: object, b: object) -> int:
    """``compareTo`` for Quantity and Semver."""
    if _opaque_key(a) == SEMVER_KEY:
        return semver_compare(a, b)
    return quantity.compare_to(a, b)


def is_greater_than(a: object, b: object) -> bool:
    """``isGreaterThan`` for Quantity and Semver."""
    return compare_to(a, b) > 0


def is_less_than(a: object, b: object) -> bool:
    """``isLessThan`` for Quantity and Semver."""
    return compare_to(a, b) < 0


def opaque_string(value: object) -> str:
    """``string(IP)``, ``string(CIDR)``, ``string(URL)``; these values are maps to the runtime,
    so any other map arrives here too: ``TypeError`` with cel-go's text, ``no such overload:
    string(map)``."""
    key = _opaque_key(value)
    if key not in (IP_KEY, CIDR_KEY, URL_KEY):
        raise TypeError("no such overload: string(map)")
    assert isinstance(value, Mapping)
    return str(value[key])


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("compareTo", ("opaque_compare_to", ["opaque", "opaque"], "int", True, compare_to)),
    function(
        "isGreaterThan",
        ("opaque_is_greater_than", ["opaque", "opaque"], "bool", True, is_greater_than),
    ),
    function(
        "isLessThan", ("opaque_is_less_than", ["opaque", "opaque"], "bool", True, is_less_than)
    ),
    function("string", ("opaque_to_string", ["opaque"], "string", False, opaque_string)),
)
"""The shared functions, as :mod:`~policies.cel.library.libraries` collects them."""
