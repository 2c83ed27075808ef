"""The Kubernetes CEL libraries gpuguard declares, as one table (as Kubernetes'
``k8s.io/apiserver/pkg/cel/library/libraries.go`` lists its known libraries).

Owns :data:`LIBRARY`: every function of the library modules of this package, in one tuple,
functions that several modules extend (``ip``: ``ip(string)`` and ``<CIDR>.ip()``) merged into one
:class:`~policies.cel.library.declarations.FunctionSpec`. ``policies/cel/runtime.py`` turns it into
runtime declarations. To add a library: write its module with a ``DECLARATIONS`` tuple and list it
in :data:`MODULES`. Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from policies.cel.library import (
    authz,
    cidr,
    comprehensions,
    format,
    homogeneous,
    ip,
    jsonpatch,
    lists,
    opaque,
    quantity,
    regex,
    semver,
    sets,
    urls,
)
from policies.cel.library.declarations import FunctionSpec, OverloadSpec


def merged(specs: Sequence[FunctionSpec]) -> tuple[FunctionSpec, ...]:
    """One spec per function name, overloads in the order given (first name first).

    Raises:
        ValueError: two overloads share an overload id (the runtime would refuse the set).
    """
    overloads: dict[str, list[OverloadSpec]] = {}
    for spec in specs:
        overloads.setdefault(spec.name, []).extend(spec.overloads)
    ids = [o.overload_id for group in overloads.values() for o in group]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate overload ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(FunctionSpec(name, tuple(group)) for name, group in overloads.items())


MODULES: Final = (
    quantity, opaque, lists, sets, regex, semver, ip, cidr, urls, format, jsonpatch, authz
)
"""The library modules, each with its ``DECLARATIONS``."""

LIBRARY: Final[tuple[FunctionSpec, ...]] = merged(
    [spec for module in MODULES for spec in module.DECLARATIONS]
)
"""Every Kubernetes CEL function gpuguard declares (CEL-neutral type names)."""

SOURCE_CHECKS: Final[tuple[Callable[[str], list[tuple[int, str]]], ...]] = (
    regex.literal_errors,
    homogeneous.literal_errors,
)
"""What Kubernetes refuses when a policy is created and gpuguard's runtime would only fail per
request: each check returns ``(offset, message)`` per finding in an expression's source;
``policies/cel/runtime.py`` reports them as compile errors."""

SOURCE_REWRITES: Final[tuple[Callable[[str], str], ...]] = (
    format.expand,
    comprehensions.expand,
)
"""Rewrites of an expression's source before it compiles, for what Kubernetes' functions do and
Python functions cannot (return optionals) or the runtime spells otherwise; each returns the
source unchanged when it has nothing to do. ``policies/cel/runtime.py`` applies them in order."""
