"""The CEL sets library (cel-go ``ext.Sets``, part of Kubernetes' CEL environment since 1.29).

Owns ``sets.contains``, ``sets.equivalent`` and ``sets.intersects`` with CEL equality (numbers
compare across int/double). Must not import the CEL runtime (only ``policies/cel/runtime.py``
may) and must not do I/O.
"""

from __future__ import annotations

from typing import Any, Final

from policies.cel.library.comparison import cel_equal
from policies.cel.library.declarations import FunctionSpec, function


def sets_contains(values: list[Any], subset: list[Any]) -> bool:
    """``sets.contains(list, list) -> bool``: every element of the second is in the first."""
    return all(any(cel_equal(v, s) for v in values) for s in subset)


def sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    """``sets.equivalent(list, list) -> bool``: same elements, ignoring order and duplicates."""
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: list[Any], b: list[Any]) -> bool:
    """``sets.intersects(list, list) -> bool``: at least one common element."""
    return any(cel_equal(x, y) for x in a for y in b)


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function(
        "sets.contains",
        ("list_sets_contains_list", ["list", "list"], "bool", False, sets_contains),
    ),
    function(
        "sets.equivalent",
        ("list_sets_equivalent_list", ["list", "list"], "bool", False, sets_equivalent),
    ),
    function(
        "sets.intersects",
        ("list_sets_intersects_list", ["list", "list"], "bool", False, sets_intersects),
    ),
)
"""The sets library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
