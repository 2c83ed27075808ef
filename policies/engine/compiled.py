"""Each policy of a set compiled once for evaluation: the one door to the engine's fast path.

Owns :class:`CompiledPolicy`, built per policy when an :class:`~policies.engine.evaluation.Engine`
is made, which holds the policy as written and everything derived from it for speed:

- its inlined form (:mod:`policies.engine.inlining`): matchConditions and mutations with the
  variables and params compiled in, so they run on the request's one shared activation;
- per form, its params checked for CEL once (or why they cannot be used), which activation it
  shares, and which of its matchConditions read only the request (those run on the shared
  activation, so a policy that does not apply never builds its own);
- its fused validation program (:mod:`policies.engine.fused`);

and :class:`CombinedPrograms`, the fused programs of a request's matching policies evaluated as
one list. :func:`compile_policies` builds them in an :class:`~policies.vocabulary.EvaluationMode`:
``fast``, what the product runs, or ``reference``: every policy as written, with no inlining, no
fused or combined program, no activation shared between policies and every matchCondition on
the policy's own activation, the plain semantics the corpus equivalence tests hold the fast path
to.

The engine reaches inlining and fused programs only through this module (an import-linter
``protected`` contract in pyproject.toml). Must not evaluate policies or record results.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.cel import scanner as cel_scanner
from policies.cel.runtime import (
    CelCompileError,
    CelEnvironment,
    CelEvaluationError,
    CompiledExpression,
    prepare,
)
from policies.engine.fused import FusedValidation
from policies.engine.fused import build as build_fused
from policies.engine.inlining import inline_policy
from policies.policy.model import Policy, Rule
from policies.vocabulary import EvaluationMode

REQUEST_ACTIVATION = 0
"""The :attr:`PolicyForm.activation` key of the request's own activation: params null, no
variables. The request-only matchConditions of every policy run on it."""

GROUP_SIZE = 16
"""Policies per combined program: bounds the one-off compile (~1 ms per policy) that the first
request of a new set of matching policies pays on the event loop."""

_UNKNOWN = object()  # a group whose program has not been compiled yet

CACHE_LIMIT = 256
"""Groups of policies whose combined program is kept compiled (then the cache restarts):
requests differ in kind, namespace and operation, so only a few sets occur."""


@dataclass(frozen=True)
class PolicyForm:
    """One form of a policy that the engine evaluates, with what its activation needs.

    Attributes:
        policy: the policy as written, or its inlined form.
        params: its params as checked for CEL once (None: no params, or they cannot be used).
        params_error: why its params cannot be used in CEL (the CEL runtime's message, naming
            the field), or None; every pass of the policy is then an error.
        activation: forms with the same key share one activation per request (no variables,
            equal params; :data:`REQUEST_ACTIVATION`: the request's own); None: the form gets its
            own activation each pass (variables, or the reference mode).
        request_only: per matchCondition, in order: whether it runs on the request's own
            activation (it reads neither params nor variables; always False in the reference).
    """

    policy: Policy
    params: Any
    params_error: str | None
    activation: int | None
    request_only: tuple[bool, ...]


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy as the engine evaluates it; built once per policy by :func:`compile_policies`.

    Attributes:
        index: the policy's position in its set (names it in :class:`CombinedPrograms`).
        policy: the policy as written (``written.policy``).
        written: the policy as written: exceptions and match are read from it, validations and
            audit annotations run on it rule by rule (the fused program's fallback).
        inlined: the form its matchConditions and mutations run on (``written`` itself when the
            policy has no variables and no params, cannot be inlined, or in the reference mode).
        fused: its validation pass as one CEL program, or None (evaluated rule by rule); its
            :meth:`~policies.engine.fused.FusedValidation.read` reads a value of it.
    """

    index: int
    policy: Policy
    written: PolicyForm
    inlined: PolicyForm
    fused: FusedValidation | None

    @property
    def combinable(self) -> bool:
        """Whether its fused program can join a combined one: it reads the request alone (the
        params, if any, bound in it as a literal), so it runs on the request's activation."""
        return self.fused is not None and self.inlined.activation == REQUEST_ACTIVATION


def compile_policies(policies: Sequence[Policy], environment: CelEnvironment,
                     mode: EvaluationMode) -> tuple[CompiledPolicy, ...]:
    """Each policy compiled for ``mode``, in order.

    Policies with equal params share one checked params value and, without variables, one
    activation per request. Never raises for a policy: what cannot be inlined or fused is
    evaluated as written, and params CEL cannot take become :attr:`PolicyForm.params_error`.
    """
    keys: dict[str, tuple[int, Any, str | None]] = {}

    def form(policy: Policy) -> PolicyForm:
        params, error, key = None, None, REQUEST_ACTIVATION
        if policy.params is not None:
            text = json.dumps(policy.params, sort_keys=True, default=str)
            if text not in keys:
                try:
                    keys[text] = (len(keys) + 1, prepare({"params": policy.params})["params"],
                                  None)
                except CelEvaluationError as exc:
                    keys[text] = (len(keys) + 1, None, exc.message)
            key, params, error = keys[text]
        if mode == EvaluationMode.REFERENCE:
            return PolicyForm(policy, params, error, None,
                              tuple(False for _ in policy.match_conditions))
        return PolicyForm(
            policy, params, error, None if policy.variables else key,
            tuple(_reads_only_request(c) for c in policy.match_conditions))

    compiled = []
    for index, policy in enumerate(policies):
        written = form(policy)
        if mode == EvaluationMode.REFERENCE:
            compiled.append(CompiledPolicy(index, policy, written, written, None))
            continue
        inlined_policy = inline_policy(policy, environment)
        inlined = written if inlined_policy is policy else form(inlined_policy)
        fused = None
        if not inlined_policy.variables and policy.param_missing is None \
                and written.params_error is None:
            fused = build_fused(policy, environment,
                                params_in_activation=inlined_policy.params is not None)
        compiled.append(CompiledPolicy(index, policy, written, inlined, fused))
    return tuple(compiled)


class CombinedPrograms:
    """The fused programs of a request's matching policies as one list program, per group of up
    to :data:`GROUP_SIZE` :attr:`~CompiledPolicy.combinable` policies, so they cost one
    evaluation. Each group's program is compiled on first use and kept (up to
    :data:`CACHE_LIMIT` groups); a group that does not compile (nesting) is remembered as such.

    Safe to share between threads: the cache is only ever read, set or cleared whole (a program
    compiled twice by two threads is the same program).
    """

    def __init__(self, environment: CelEnvironment) -> None:
        self._environment = environment
        self._programs: dict[tuple[int, ...], CompiledExpression | None] = {}
        # applicable policies' indices -> their groups: the same few sets recur request after
        # request, so the grouping is worked out once per set.
        self._groups: dict[tuple[int, ...],
                           list[tuple[tuple[CompiledPolicy, ...], CompiledExpression]]] = {}

    def groups(self, applicable: Sequence[CompiledPolicy],
               ) -> list[tuple[tuple[CompiledPolicy, ...], CompiledExpression]]:
        """The groups of ``applicable``'s combinable policies (two or more, in order) with the
        program whose value lists their fused programs' values; none when fewer than two are
        combinable. A group whose program does not compile is left out: its policies then run
        on their own."""
        key = tuple(policy.index for policy in applicable)
        known = self._groups.get(key)
        if known is not None:
            return known
        result = self._group(applicable)
        if len(self._groups) >= CACHE_LIMIT:
            self._groups.clear()
        self._groups[key] = result
        return result

    def _group(self, applicable: Sequence[CompiledPolicy],
               ) -> list[tuple[tuple[CompiledPolicy, ...], CompiledExpression]]:
        together = [policy for policy in applicable if policy.combinable]
        if len(together) < 2:
            return []
        result = []
        for start in range(0, len(together), GROUP_SIZE):
            group = tuple(together[start:start + GROUP_SIZE])
            program = self._program(group) if len(group) > 1 else None
            if program is not None:
                result.append((group, program))
        return result

    def _program(self, group: Sequence[CompiledPolicy]) -> CompiledExpression | None:
        key = tuple(policy.index for policy in group)
        known = self._programs.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return known if isinstance(known, CompiledExpression) else None
        source = "[" + ",\n".join(policy.fused.expression.expression
                                  for policy in group if policy.fused is not None) + "]"
        program: CompiledExpression | None
        try:
            program = self._environment.compile(source, field_path="spec")
        except CelCompileError:
            program = None
        if len(self._programs) >= CACHE_LIMIT:
            self._programs.clear()
        self._programs[key] = program
        return program


def _reads_only_request(condition: Rule) -> bool:
    """Whether a matchCondition reads only the request's data (no params, no variables)."""
    source = condition.expression.expression
    return not (cel_scanner.uses(source, "params") or cel_scanner.uses(source, "variables"))
