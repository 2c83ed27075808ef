"""Compile a policy's variables and params into its expressions, so policies share activations.

Owns a load-time rewrite the engine applies for speed: every expression of a policy gets the
``variables`` it uses (and theirs) bound with ``cel.bind`` in declaration order, and the policy's
params bound as a literal, e.g. ``variables.n <= params.max`` becomes
``cel.bind(params, {"max": 8}, cel.bind(__var_n, gpu.count, __var_n <= params.max))``. The
rewritten policy reads only the request's data, so one CEL activation per request serves every
policy: the runtime converts ``object`` and ``gpu`` once instead of once per policy and per
variable layer (cel-expr-python cannot share converted values between activations).

The engine uses the rewritten matchConditions and mutations, and the helpers below to build each
policy's fused validation program (:mod:`policies.engine.fused`); validations and audit annotations
are not rewritten here: a validation pass that falls back to rule-by-rule evaluation runs on the
policy as written, so a variable's errors and iteration budget stay its own there. A variable is
computed again in each rewritten expression that uses it (a few microseconds; an activation
costs tens). When a policy cannot be rewritten safely — ``variables[...]`` indexing,
``has(variables.x)``, params the literal form cannot hold, or an expression nested past the
parser's depth limit — it is left as it is and the engine evaluates it the regular way.

Reached only through :mod:`policies.engine.compiled` (and :mod:`policies.engine.fused`; an
import-linter contract). Must not evaluate anything or change what a policy decides.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from policies.cel import scanner as cel_scanner
from policies.cel.runtime import CelCompileError, CelEnvironment, CompiledExpression
from policies.policy.model import Mutation, Policy, Rule


class CannotInline(Exception):
    """Raised when a policy (or a program built from it) must be evaluated the regular way."""


def variable_name(name: str) -> str:
    """How a bound variable is referenced: ``variables.x`` -> ``__var_x``."""
    return f"__var_{name}"


def _rename(source: str, reference: Callable[[str], str] = variable_name) -> str:
    """``variables.x`` -> ``reference("x")`` outside string literals; comments dropped (a
    trailing one would swallow what is appended after it)."""
    return cel_scanner.rename(source, "variables", reference)


def cel_literal(value: Any) -> str:
    """A CEL literal for a YAML / JSON value (maps, lists, strings, numbers, bools, null).

    Raises:
        CannotInline: a value CEL literals cannot hold (non-finite floats, huge ints, bytes).
    """
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise CannotInline
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CannotInline
        return repr(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no CEL string can hold it
            raise CannotInline from None
        # JSON escapes are CEL escapes (no '\/' emitted); characters past U+FFFF stay as they
        # are, since JSON would write surrogate pairs, which CEL refuses.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(cel_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {cel_literal(v)}"
                               for k, v in value.items()) + "}"
    raise CannotInline


def variables_used(sources: Iterable[str], policy: Policy) -> list[str]:
    """The variables ``sources`` use, directly or through other variables, in declaration order.

    Raises:
        CannotInline: a ``variables.<name>`` the policy does not declare.
    """
    declared = {rule.name: (index, rule.expression.expression)
                for index, rule in enumerate(policy.variables)}
    needed: set[str] = set()
    stack = [name for source in sources for name in cel_scanner.fields(source, "variables")]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        if name not in declared:
            raise CannotInline
        needed.add(name)
        stack.extend(cel_scanner.fields(declared[name][1], "variables"))
    return sorted(needed, key=lambda n: declared[n][0])


def bind_variables(source: str, policy: Policy, bound: frozenset[str] = frozenset(),
                   reference: Callable[[str], str] = variable_name) -> str:
    """``source`` with ``variables.x`` renamed and each variable it needs that is not in
    ``bound`` (already bound around it) bound with ``cel.bind``; params are left as they are.
    ``reference`` writes a reference to a variable (bound ones may live elsewhere, e.g. in a
    map); the ones bound here must be written by :func:`variable_name`.

    Raises:
        CannotInline: see :func:`variables_used`.
    """
    bodies = {rule.name: rule.expression.expression for rule in policy.variables}
    wrapped = _rename(source, reference)
    for name in reversed(variables_used([source], policy)):
        if name not in bound:
            wrapped = f"cel.bind({variable_name(name)}, {_rename(bodies[name], reference)}, " \
                      f"{wrapped})"
    return wrapped


def reads_params(sources: Iterable[str]) -> bool:
    """Whether any of ``sources`` mentions ``params`` outside string literals."""
    return any(cel_scanner.uses(source, "params") for source in sources)


def _inline(expression: CompiledExpression, policy: Policy, environment: CelEnvironment,
            params_literal: str) -> CompiledExpression:
    bodies = {rule.name: rule.expression.expression for rule in policy.variables}
    source = bind_variables(expression.expression, policy)
    used = [expression.expression,
            *(bodies[n] for n in variables_used([expression.expression], policy))]
    if reads_params(used):
        source = f"cel.bind(params, {params_literal}, {source})"
    if source == expression.expression:
        return expression
    try:
        return environment.compile(source, field_path=expression.field_path)
    except CelCompileError:
        raise CannotInline from None


def inline_policy(policy: Policy, environment: CelEnvironment) -> Policy:
    """The policy's matchConditions and mutations with its variables and params compiled in, or
    ``policy`` as it is when that is not safe (see the module docstring).

    The result has no variables, no params and no validations or audit annotations: the engine
    runs those as the fused program built from the policy as written, or rule by rule on the
    policy as written, so rewriting them would be compiled for nothing (and their default
    messages would show the rewritten expression).
    """
    if not policy.variables and policy.params is None:
        return policy
    sources = [r.expression.expression for r in policy.variables]
    for rule in (*policy.match_conditions, *policy.validations, *policy.audit_annotations):
        sources.append(rule.expression.expression)
        if rule.message_expression is not None:
            sources.append(rule.message_expression.expression)
    for mutation in policy.mutations:
        sources += [e.expression for e in (mutation.expression, mutation.condition) if e]
    # Any ``variables[...]`` or ``has(variables.x)`` anywhere keeps the whole policy as written:
    # its variables are then evaluated as the API server does in every pass.
    if any(cel_scanner.selections_only(s, "variables") is None for s in sources):
        return policy
    try:
        literal = cel_literal(policy.params)

        def inline_condition(item: Rule) -> Rule:
            return replace(item, expression=_inline(item.expression, policy, environment,
                                                    literal))

        def inline_mutation(item: Mutation) -> Mutation:
            return replace(
                item,
                expression=None if item.expression is None else
                _inline(item.expression, policy, environment, literal),
                condition=None if item.condition is None else
                _inline(item.condition, policy, environment, literal))

        return replace(
            policy,
            match_conditions=tuple(inline_condition(r) for r in policy.match_conditions),
            mutations=tuple(inline_mutation(m) for m in policy.mutations),
            validations=(),
            audit_annotations=(),
            variables=(),
            params=None,
        )
    except CannotInline:
        return policy
