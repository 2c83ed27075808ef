"""The declaration form of a CEL function library: names, overloads, CEL-neutral type names.

Owns :class:`FunctionSpec` and :class:`OverloadSpec`, which every library module (the Kubernetes
ones here, the GPU library in :mod:`policies.cel.gpu`) uses to declare its functions, and
:func:`function`, the short way to write one. ``policies/cel/runtime.py`` turns specs into runtime
declarations. Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OverloadSpec:
    """One overload: ``params`` and ``result`` are CEL type names.

    Type names: ``string int double bool bytes dyn list map`` and ``opaque`` (the map form of the
    Kubernetes opaque types). For member overloads ``params[0]`` is the receiver.
    """

    overload_id: str
    params: tuple[str, ...]
    result: str
    member: bool
    impl: Callable[..., Any]


@dataclass(frozen=True)
class FunctionSpec:
    """A CEL function name and its overloads."""

    name: str
    overloads: tuple[OverloadSpec, ...]


def function(
    name: str, *overloads: tuple[str, Sequence[str], str, bool, Callable[..., Any]]
) -> FunctionSpec:
    """A :class:`FunctionSpec` from ``(overload_id, params, result, member, impl)`` tuples."""
    return FunctionSpec(
        name, tuple(OverloadSpec(i, tuple(p), r, m, f) for i, p, r, m, f in overloads)
    )
