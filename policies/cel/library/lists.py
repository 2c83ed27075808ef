"""The Kubernetes CEL lists library (``k8s.io/apiserver/pkg/cel/library/lists.go``).

Owns ``isSorted``, ``sum``, ``min``, ``max``, ``indexOf`` and ``lastIndexOf`` on lists. The runtime
does not accept ``datetime`` or ``timedelta`` back from Python, so ``sum()``, ``min()`` and
``max()`` over timestamps or durations are refused with an error (``isSorted()`` works); lists of
``uint`` arrive as Python ints and their sums come back as ``int``.

Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from policies.cel.library.comparison import cel_equal, compare
from policies.cel.library.declarations import FunctionSpec, function

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# Python functions cannot hand timestamps or durations back to the runtime (it rejects them).
_NO_TIME_RESULTS: Final = "{name}() over timestamps or durations is not supported in gpuguard"


def list_is_sorted(values: list[Any]) -> bool:
    """``<list>.isSorted() -> bool`` for comparable elements (numbers, strings, bools, ...)."""
    return all(compare(values[i], values[i + 1]) <= 0 for i in range(len(values) - 1))


def list_sum(values: list[Any]) -> Any:
    """``<list>.sum()``: ints (int64-checked) or doubles; ``[].sum() == 0``; durations refused."""
    if not values:
        return 0
    kinds = {"bool" if isinstance(v, bool) else type(v).__name__ for v in values}
    if kinds == {"int"}:
        total = sum(values)
        if not _INT64_MIN <= total <= _INT64_MAX:
            raise ValueError("integer overflow")
        return total
    if kinds == {"float"}:
        return float(sum(values))
    if kinds == {"timedelta"}:
        raise TypeError(_NO_TIME_RESULTS.format(name="sum"))
    raise TypeError(f"no such overload: sum() over {', '.join(sorted(kinds))}")


def _extreme(values: list[Any], name: str, prefer: int) -> Any:
    if not values:
        raise ValueError(f"{name} called on empty list")
    best = values[0]
    for value in values[1:]:
        if compare(best, value) == prefer:
            best = value
    if isinstance(best, datetime.datetime | datetime.timedelta):
        raise TypeError(_NO_TIME_RESULTS.format(name=name))
    return best


def list_min(values: list[Any]) -> Any:
    """``<list>.min()``; an empty list is an error ("min called on empty list")."""
    return _extreme(values, "min", 1)


def list_max(values: list[Any]) -> Any:
    """``<list>.max()``; an empty list is an error ("max called on empty list")."""
    return _extreme(values, "max", -1)


def list_index_of(values: list[Any], item: object) -> int:
    """``<list>.indexOf(x) -> int``, -1 when absent (CEL equality)."""
    return next((i for i, v in enumerate(values) if cel_equal(v, item)), -1)


def list_last_index_of(values: list[Any], item: object) -> int:
    """``<list>.lastIndexOf(x) -> int``, -1 when absent (CEL equality)."""
    return next((i for i in range(len(values) - 1, -1, -1) if cel_equal(values[i], item)), -1)


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("isSorted", ("list_is_sorted", ["list"], "bool", True, list_is_sorted)),
    function("sum", ("list_sum", ["list"], "dyn", True, list_sum)),
    function("min", ("list_min", ["list"], "dyn", True, list_min)),
    function("max", ("list_max", ["list"], "dyn", True, list_max)),
    function("indexOf", ("list_index_of", ["list", "dyn"], "int", True, list_index_of)),
    function(
        "lastIndexOf", ("list_last_index_of", ["list", "dyn"], "int", True, list_last_index_of)
    ),
)
"""The lists library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
