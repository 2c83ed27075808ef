"""One CEL program per policy for its whole validation pass: the engine's fast path.

Owns a load-time rewrite and the reading of its result. A policy's matchConditions, validations
(with their messageExpressions) and auditAnnotations are compiled into one expression, evaluated
once per request instead of once per rule, with its params bound once as a literal and each
variable the validations and audit annotations use bound once, after the conditions held (in
layers: one map of the variables whose dependencies are bound already)::

    cel.bind(params, {...},
      ((c1) && (c2)) ? cel.bind(__layer0, {"x": <x>},
                                [(v1) ? true : [<message1>], (v2) ? true : false, <audit1>])
                     : (!(c1) ? 0 : (1)))

An ``int`` result names the first matchCondition that is false; a list holds, per validation,
``true`` or what the failure's message is made of (``[messageExpression's value]``, or ``false``
for a static message), then each auditAnnotation's value. The evaluation order and laziness are
the regular path's: a condition is evaluated only after the previous ones held, a
messageExpression only when its validation failed.

Variables only a messageExpression uses are bound inside it, so they are computed only for a
failure (the rule-by-rule path's laziness).

The fast path is only ever taken for the plain case. A result that is anything else — an
evaluation error anywhere (CEL errors poison the whole list; a variable bound eagerly that the
rules would not have needed), a condition or validation that is not a bool, a messageExpression
that is not a non-empty string, the iteration budget spent by the rules together — makes
:func:`read` return None, and the engine evaluates that policy rule by rule, which reports each
problem exactly as before. So the fused program can never decide differently from the rules it
was built from.

Built and read only through :mod:`policies.engine.compiled` (an import-linter contract). Must not
evaluate anything itself or record results (that is :mod:`policies.engine.evaluation`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.cel.runtime import CelCompileError, CelEnvironment, CompiledExpression
from policies.engine.inlining import (
    CannotInline,
    bind_variables,
    cel_literal,
    reads_params,
    variable_name,
    variables_used,
)
from policies.engine.messages import expression_message, static_message
from policies.policy.model import Policy, Rule


@dataclass(frozen=True)
class FusedValidation:
    """A policy's validation pass as one compiled expression.

    ``conditions``, ``validations`` and ``audit_annotations`` are the policy's rules as written,
    in order.
    """

    expression: CompiledExpression
    conditions: tuple[Rule, ...]
    validations: tuple[Rule, ...]
    audit_annotations: tuple[Rule, ...]

    def false_condition(self, value: Any) -> int | None:
        """The index in :attr:`conditions` of the first false matchCondition when ``value`` (of
        :attr:`expression`) says one is; else None."""
        return value if type(value) is int and 0 <= value < len(self.conditions) else None

    def read(self, value: Any) -> Outcome | None:
        """Read a value of :attr:`expression` as results; None when it is not plain and the
        policy must be evaluated rule by rule (see the module docstring)."""
        if type(value) is int:
            index = self.false_condition(value)
            return None if index is None else Outcome(condition=self.conditions[index])
        count = len(self.validations)
        if type(value) is not list or len(value) != count + len(self.audit_annotations):
            return None
        if not self.audit_annotations and all(result is True for result in value):
            return PASSED
        messages: list[str | None] = []
        for rule, result in zip(self.validations, value, strict=False):
            if result is True:
                messages.append(None)
            elif result is False and rule.message_expression is None:
                messages.append(static_message(rule))
            elif (rule.message_expression is not None and type(result) is list
                  and len(result) == 1 and (message := expression_message(result[0])) is not None):
                messages.append(message)
            else:
                return None
        return Outcome(validations=tuple(messages), annotations=tuple(value[count:]))


@dataclass(frozen=True)
class Outcome:
    """The plain result of a fused evaluation.

    ``condition`` is the first matchCondition that is false (nothing else is set then); else
    ``validations`` holds, per validation, None when it passed or the failure's message
    (:mod:`policies.engine.messages`), and ``annotations`` each auditAnnotation's value (None:
    omitted). :data:`PASSED` (``passed``) stands for "every validation passed" in a policy
    without auditAnnotations; its ``validations`` are not spelled out.
    """

    condition: Rule | None = None
    validations: tuple[str | None, ...] = ()
    annotations: tuple[Any, ...] = ()
    passed: bool = False  # every validation passed and there is no auditAnnotation


PASSED = Outcome(passed=True)


def _group(source: str) -> str:
    # Newlines keep a trailing `// comment` of the source from swallowing the closing paren.
    return f"(\n{source}\n)"


def build(policy: Policy, environment: CelEnvironment, *,
          params_in_activation: bool = False) -> FusedValidation | None:
    """The fused program of one policy as written (before inlining), or None when it cannot be
    built (``variables[...]`` indexing, params no literal can hold, nested past the parser's
    depth limit): the policy is then evaluated rule by rule.

    ``params_in_activation``: the engine puts the policy's params in the activation (they are
    then not bound as a literal).
    """
    if not policy.validations and not policy.audit_annotations:
        return None
    try:
        source = _source(policy, policy.match_conditions, bind_params=not params_in_activation)
        compiled = environment.compile(source, field_path="spec")
    except (CannotInline, CelCompileError):
        return None
    return FusedValidation(compiled, policy.match_conditions, policy.validations,
                           policy.audit_annotations)


def _source(policy: Policy, conditions: Sequence[Rule], *, bind_params: bool) -> str:
    checked = [rule.expression.expression for rule in (*policy.validations,
                                                         *policy.audit_annotations)]
    shared = variables_used(checked, policy)  # bound once, after the conditions held
    bodies = {rule.name: rule.expression.expression for rule in policy.variables}
    # Shared variables are bound in layers, one map per layer (a variable's layer is one past
    # its dependencies'), so ten variables cost a few nesting levels, not ten.
    layer: dict[str, int] = {}
    for name in shared:
        layer[name] = 1 + max((layer[d] for d in variables_used([bodies[name]], policy)
                               if d != name), default=-1)

    def reference(name: str) -> str:
        return f"__layer{layer[name]}.{name}" if name in layer else variable_name(name)

    bound = frozenset(shared)

    def code(text: str) -> str:
        return _group(bind_variables(text, policy, bound, reference))

    parts = []
    for rule in policy.validations:
        # A messageExpression's value is wrapped in a list: it may itself be a bool.
        failure = "false" if rule.message_expression is None else \
            f"[{code(rule.message_expression.expression)}]"
        parts.append(f"{code(rule.expression.expression)} ? dyn(true) : dyn({failure})")
    parts += [f"dyn({code(rule.expression.expression)})" for rule in policy.audit_annotations]
    source = f"dyn([{', '.join(parts)}])"
    for index in reversed(range(max(layer.values(), default=-1) + 1)):
        entries = ", ".join(f"{json.dumps(name)}: {code(bodies[name])}"
                            for name in shared if layer[name] == index)
        source = f"cel.bind(__layer{index}, {{{entries}}}, {source})"
    if conditions:
        # All conditions in one `&&` keep the body one level deep (the parser allows 32); only
        # when they do not all hold does the chain find the first false one. `&&` may skip an
        # error that the chain then meets: an error, so the rule-by-rule path decides.
        tests = [_group(bind_variables(c.expression.expression, policy)) for c in conditions]
        chain = f"dyn({len(tests) - 1})"
        for index in reversed(range(len(tests) - 1)):
            chain = f"!{tests[index]} ? dyn({index}) : ({chain})"
        source = f"({' && '.join(tests)}) ? ({source}) : ({chain})"
    everything = [*checked, *(r.expression.expression for r in policy.match_conditions),
                  *(r.message_expression.expression for r in policy.validations
                    if r.message_expression is not None), *bodies.values()]
    if bind_params and policy.params is not None and reads_params(everything):
        source = f"cel.bind(params, {cel_literal(policy.params)}, {source})"
    return source
