"""Kubernetes' ``HomogeneousAggregateLiterals`` rule: the elements of a list literal, and the keys
and the values of a map literal, have one type.

Kubernetes' base CEL environment (``k8s.io/apiserver/pkg/cel/environment/base.go``) turns on
cel-go's ``cel.HomogeneousAggregateLiterals()``, so ``[1, 2.0]``, ``sets.contains([1], [1u])`` and
``{'a': 1, 'b': 'x'}`` are refused when a policy is created; cel-expr-python has no such checker
option, so :func:`literal_errors` applies it to elements written as literals (the case of every
such expression in the Kubernetes tests; an element whose type only the checker knows, such as
``[1, object.x]``, is not compared). Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

from typing import Final

from policies.cel import scanner

EXEMPT: Final = frozenset({"format"})
"""Functions whose literal argument may mix types (cel-go's strings extension exempts
``format``'s argument list, so ``'%s has %d'.format(['a', 1])`` compiles in Kubernetes)."""


def literal_errors(source: str) -> list[tuple[int, str]]:
    """``(offset, message)`` for each literal element whose type differs from its aggregate's
    first, with cel-go's text: ``expected type 'int' but found 'double'``."""
    if "[" not in source and "{" not in source:
        return []
    found = []
    for group in scanner.aggregate_literals(source, EXEMPT):
        first = group[0].kind
        found += [(element.start, f"expected type '{first}' but found '{element.kind}'")
                  for element in group[1:] if element.kind != first]
    return found
