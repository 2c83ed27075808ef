"""What Kubernetes refuses of a CEL expression after it type-checks and before any request.

Owns two steps of cel-go that kube-apiserver takes when a policy is created (the validators and
``cel.EvalOptions(cel.OptOptimize)`` of ``k8s.io/apiserver/pkg/cel/environment``; cel-go v0.29
``cel/validator.go`` and ``interpreter/decorators.go``):

* the **duration and timestamp literal validators**: ``duration('5')`` or
  ``timestamp(253402300800)`` with a literal argument cel-go cannot convert is a compile error,
  ``invalid duration argument``, at the argument;
* **constant folding at program instantiation**: a type conversion (``int``, ``uint``,
  ``double``, ``string``, ``bytes``, ``bool``, ``duration``, ``timestamp``, ``dyn``, ``type``)
  whose one argument is a constant (a literal, a list or map literal of constants, a folded
  conversion) is evaluated once when the program is built; an error refuses the policy,
  ``program instantiation failed: unsigned integer overflow`` for ``uint(-1)``, even in a branch
  no request reaches (``true || int('x') == 1``).

Regex literals are checked from the source (:mod:`policies.cel.library.regex`); the values come
from :mod:`policies.cel.conversions` (Go's rules). Must not evaluate anything that depends on a
request, nor compile expressions (the caller gives the checked tree).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.cel.checked_expr import Node
from policies.cel.conversions import FUNCTIONS, Constant, ConversionError, convert
from policies.cel.library import homogeneous

_VALIDATED = ("duration", "timestamp")
INSTANTIATION_FAILED = "program instantiation failed"
"""The prefix of kube-apiserver's text (``Internal error: program instantiation failed: ...``)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One reason Kubernetes refuses the expression: ``offset`` in code points of the compiled
    source (None when the tree has no position for it), ``message`` in Kubernetes' words."""

    offset: int | None
    message: str


class _Failed(Exception):
    def __init__(self, node: Node, message: str) -> None:
        super().__init__(message)
        self.node = node


def refusals(tree: Node, positions: Mapping[int, int], source: str = "",
             types: Mapping[int, str] | None = None) -> list[Refusal]:
    """The validators' findings (all of them, in source order, as cel-go reports them) or else
    the first conversion that fails when the program is built (cel-go stops there); ``[]`` when
    Kubernetes accepts the expression. ``positions`` maps expression ids to offsets in
    ``source`` (:func:`policies.cel.checked_expr.positions`; empty when unknown); with the
    checked ``types`` (of ``source`` as written, not rewritten), the homogeneous-literal
    validator compares checked types too
    (:func:`~policies.cel.library.homogeneous.checked_errors`)."""
    found = [Refusal(positions.get(argument.id), f"invalid {node.name} argument")
             for node in _calls(tree, _VALIDATED) if len(node.children) == 1
             and (argument := node.children[0]).kind == "const"
             and _fails(node.name, Constant(argument.name, argument.value))]
    if types is not None:
        found += [Refusal(positions.get(ident), message)
                  for ident, message in homogeneous.checked_errors(tree, types)]
    if found:
        return sorted(found, key=lambda r: -1 if r.offset is None else r.offset)
    try:
        _fold(tree)
    except _Failed as failed:
        offset = positions.get(failed.node.id)
        name = failed.node.name
        if offset is not None and source[offset - len(name):offset] == name:
            offset -= len(name)  # a call's position is its '('; point at the function's name
        return [Refusal(offset, f"{INSTANTIATION_FAILED}: {failed}")]
    return []


def _calls(node: Node, names: tuple[str, ...]) -> list[Node]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if current.kind == "call" and not current.member and current.name in names:
            found.append(current)
        stack.extend(current.children)
    return found


def _fails(function: str, value: Constant) -> bool:
    try:
        convert(function, value)
    except ConversionError:
        return True
    return False


def _fold(node: Node) -> Constant | None:
    """The node's value when cel-go plans it as a constant, else None; children first, left to
    right, as the planner visits them.

    Raises:
        _Failed: a folded conversion failed (the node and cel-go's text).
    """
    folded = [_fold(child) for child in node.children]
    if node.kind == "const":
        return Constant(node.name, node.value)
    if node.kind == "list" or (node.kind == "map" and not node.name):  # not object literals
        return Constant(node.kind, None) if all(v is not None for v in folded) else None
    if node.kind == "call" and not node.member and node.name in FUNCTIONS \
            and len(folded) == 1 and folded[0] is not None:
        try:
            return convert(node.name, folded[0])
        except ConversionError as exc:
            raise _Failed(node, str(exc)) from None
    return None
