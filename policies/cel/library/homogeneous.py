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

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from policies.cel import scanner
from policies.cel.checked_expr import Node

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


def checked_errors(tree: Node, types: Mapping[int, str],
                   skip: Callable[[Node], bool] | None = None) -> list[tuple[int, str]]:
    """The same rule on the checked tree (cel-go's validator, which compares checked types):
    ``(expression id, message)`` for the first element of each list, and the first key and
    value of each map, whose type differs from the first one's — so ``[string(x), b'a']`` is
    refused too. Types gpuguard's environment has as ``dyn`` where Kubernetes declares them
    (``request``, ``variables``) are not compared; nor are aggregates under an exempt call, nor
    maps ``skip`` names (typed object literals gpuguard rewrote to maps)."""
    found: list[tuple[int, str]] = []
    stack: list[tuple[Node, bool]] = [(tree, False)]
    while stack:
        node, exempt = stack.pop()
        exempt = exempt or (node.kind == "call" and node.name in EXEMPT)
        stack.extend((child, exempt) for child in node.children)
        if exempt:
            continue
        if node.kind == "list":
            found += _first_mismatch(node.children, types, node.optional)
        elif node.kind == "map" and not node.name and not (skip and skip(node)):
            # an object literal's fields may differ
            found += _first_mismatch(node.children[::2], types)
            found += _first_mismatch(node.children[1::2], types, node.optional)
    return found


def _first_mismatch(elements: Sequence[Node], types: Mapping[int, str],
                    optional: Sequence[int] = ()) -> list[tuple[int, str]]:
    """``optional``: indexes of ``[?x]`` elements / ``{?k: v}`` values, compared by the type
    they hold (``optional_type(string)`` is ``string``), as cel-go does."""
    kinds = [types.get(element.id, "dyn") for element in elements]
    for index in optional:
        if index < len(kinds) and kinds[index].startswith("optional_type("):
            kinds[index] = kinds[index][len("optional_type("):-1]
    for element, kind in zip(elements[1:], kinds[1:], strict=True):
        if "dyn" in kinds[0] or "dyn" in kind:
            continue
        if kind != kinds[0]:
            return [(element.id, f"expected type '{kinds[0]}' but found '{kind}'")]
    return []
