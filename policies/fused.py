"""One CEL program per policy for its whole validation pass: the engine's fast path.

Owns a load-time rewrite and the reading of its result. A policy without ``variables`` has its
matchConditions, validations (with their messageExpressions) and auditAnnotations compiled into
one expression, evaluated once per request instead of once per rule::

    (c1) ? ((c2) ? [(v1) ? true : [<message1>], (v2) ? true : false, <audit1>] : 1) : 0

An ``int`` result names the first matchCondition that is false; a list holds, per validation,
``true`` or what the failure's message is made of (``[messageExpression's value]``, or ``false``
for a static message), then each auditAnnotation's value. The evaluation order and laziness are
the regular path's: a condition is evaluated only after the previous ones held, a
messageExpression only when its validation failed.

The fast path is only ever taken for the plain case. A result that is anything else — an
evaluation error anywhere (CEL errors poison the whole list), a condition or validation that is
not a bool, a messageExpression that is not a non-empty string, the iteration budget spent by
the rules together — makes :func:`read` return None, and the engine evaluates that policy rule
by rule, which reports each problem exactly as before. So the fused program can never decide
differently from the rules it was built from.

Must not evaluate anything itself or record results (that is :mod:`policies.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.cel import CelCompileError, CelEnvironment, CompiledExpression
from policies.model import Rule

CONDITION_FALSE = "condition-false"
RULES = "rules"


@dataclass(frozen=True)
class FusedValidation:
    """A policy's validation pass as one compiled expression.

    ``conditions`` are the matchConditions in the order the engine evaluates them;
    ``validations`` and ``audit_annotations`` the policy's rules, in order.
    """

    expression: CompiledExpression
    conditions: tuple[Rule, ...]
    validations: tuple[Rule, ...]
    audit_annotations: tuple[Rule, ...]


@dataclass(frozen=True)
class Outcome:
    """The plain result of a fused evaluation.

    ``kind`` is :data:`CONDITION_FALSE` (``condition`` is the false matchCondition) or
    :data:`RULES`: ``validations`` holds, per validation, None when it passed or the failure's
    message (the messageExpression's value stripped, or the static message); ``annotations``
    each auditAnnotation's value (None: omitted).
    """

    kind: str
    condition: Rule | None = None
    validations: tuple[str | None, ...] = ()
    annotations: tuple[Any, ...] = ()


def _group(source: str) -> str:
    # Newlines keep a trailing `// comment` of the source from swallowing the closing paren.
    return f"(\n{source}\n)"


def build(field_path: str, conditions: Sequence[Rule], validations: Sequence[Rule],
          audit_annotations: Sequence[Rule],
          environment: CelEnvironment) -> FusedValidation | None:
    """The fused program of one policy, or None when it does not compile (e.g. nested past the
    parser's depth limit): the policy is then evaluated rule by rule.

    ``field_path`` names the program in errors (``spec``); the rules must come from a policy
    without variables, compiled by ``environment``.
    """
    parts = []
    for rule in validations:
        # A messageExpression's value is wrapped in a list: it may itself be a bool.
        failure = "false" if rule.message_expression is None else \
            f"[{_group(rule.message_expression.expression)}]"
        parts.append(f"{_group(rule.expression.expression)} ? dyn(true) : dyn({failure})")
    parts += [f"dyn({_group(rule.expression.expression)})" for rule in audit_annotations]
    source = f"dyn([{', '.join(parts)}])"
    for index in reversed(range(len(conditions))):
        source = f"{_group(conditions[index].expression.expression)} ? ({source}) : dyn({index})"
    try:
        compiled = environment.compile(source, field_path=field_path)
    except CelCompileError:
        return None
    return FusedValidation(compiled, tuple(conditions), tuple(validations),
                           tuple(audit_annotations))


def read(fused: FusedValidation, value: Any) -> Outcome | None:
    """Read a fused evaluation's plain value; None when the policy must be evaluated rule by
    rule (see the module docstring)."""
    if type(value) is int:
        if 0 <= value < len(fused.conditions):
            return Outcome(CONDITION_FALSE, condition=fused.conditions[value])
        return None
    count = len(fused.validations)
    if type(value) is not list or len(value) != count + len(fused.audit_annotations):
        return None
    messages: list[str | None] = []
    for rule, result in zip(fused.validations, value, strict=False):
        if result is True:
            messages.append(None)
        elif result is False and rule.message_expression is None:
            messages.append(rule.message or
                            f"failed expression: {rule.expression.expression.strip()}")
        elif (rule.message_expression is not None and type(result) is list
              and len(result) == 1 and type(result[0]) is str and result[0].strip()):
            messages.append(result[0].strip())
        else:
            return None
    return Outcome(RULES, validations=tuple(messages), annotations=tuple(value[count:]))
