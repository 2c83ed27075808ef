"""The policy engine: one request (or audited object) in, a verdict out. Pure and thread-safe.

Owns the evaluation order and semantics, following ValidatingAdmissionPolicy /
MutatingAdmissionPolicy (Kubernetes API reference, "Validating Admission Policy"): match →
exceptions (:func:`policies.policy.matching.applicability`) → matchConditions (all must be
true) → mutations (policy order, each policy seeing the
previous ones' result) → variables (lazy, per request) → validations with ``message`` /
``messageExpression`` → ``validationActions`` (Deny → denial, Warn → warning, Audit → audit
annotation) → ``auditAnnotations``. An evaluation error never escapes: it becomes an ``error``
result, which denies under ``failurePolicy: Fail`` and is reported but allowed under ``Ignore``.
The response patch is the RFC 6902 diff of the original object to the final one.

At the ``audit`` point existing objects are judged as if created; mutations are reported as
``mutate`` results (what admission would change) and nothing is denied.

Must not do I/O, read the clock (``ReviewInput.now``) or keep state between requests (it only
caches compiled programs, which depend on the policy set alone).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from policies.cel import scanner as cel_scanner
from policies.cel.gpu import gpu_data
from policies.cel.runtime import (
    CelCompileError,
    CelEnvironment,
    CelEvaluationError,
    CompiledExpression,
    PreparedData,
    RequestActivation,
    prepare,
)
from policies.engine.fused import CONDITION_FALSE, FusedValidation, Outcome
from policies.engine.fused import build as build_fused
from policies.engine.fused import read as read_fused
from policies.engine.inlining import inline_policy
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.facts.review import ReviewInput
from policies.facts.workloads import WorkloadFacts, workload_facts
from policies.policy.matching import applicability
from policies.policy.model import Policy, PolicySet, Rule
from policies.policy.mutation import (
    MutationError,
    apply_operations,
    apply_shortcut,
    check_identity,
    diff,
    validate_operations,
)
from policies.sources import shortened
from policies.vocabulary import EvaluationPoint, FailurePolicy, ValidationAction


class RuleOutcome(StrEnum):
    """What happened to one rule on one request (:attr:`RuleResult.outcome`); the values are
    the words of ``gpuguard check`` / report JSON and of test-suite ``expect.results``."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"
    EXEMPT = "exempt"
    MUTATE = "mutate"


_NOT_EVALUATED: Any = object()  # a fused program's value not computed yet
AUDIT_VALUE_LIMIT = 10_240  # characters per audit annotation value (the VAP valueExpression cap)
_AUDIT_KEY = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class RuleResult:
    """The outcome of one policy rule on one request.

    ``outcome`` is ``pass``, ``fail`` (the rule was violated; ``actions`` says what that did),
    ``error`` (evaluation failed; ``message`` has the CEL error), ``skip`` (the policy matched
    but a matchCondition was false; policies whose match rules do not select the request leave
    no result), ``exempt`` (an exception applies; ``message`` has its reason) or ``mutate`` (a
    mutation changed the object).
    """

    policy: str
    rule: str
    path: str
    outcome: RuleOutcome
    message: str = ""
    actions: tuple[ValidationAction, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``gpuguard check`` and reports (plain strings: YAML's safe dumper
        cannot write an enum member)."""
        return {"policy": self.policy, "rule": self.rule, "path": self.path,
                "outcome": str(self.outcome), "message": self.message,
                "actions": [str(action) for action in self.actions]}


@dataclass(frozen=True)
class Violation:
    """One failed (or failed-to-evaluate) rule that denied the request or warned about it.

    ``policy`` and ``rule`` name it (``rule`` as in :attr:`RuleResult.rule`), ``message`` is the
    rule's message (or the error), ``reason`` the HTTP status reason it gives a denial
    (``Forbidden`` unless the validation says otherwise). What users read is :attr:`text`.
    """

    policy: str
    rule: str
    message: str
    reason: str = "Forbidden"

    @property
    def text(self) -> str:
        """``policy: message``: one part of the AdmissionResponse message, or one warning."""
        return f"{self.policy}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    """What the engine decided for one request.

    ``denials`` are the violations that deny (a ``Deny`` action, or an error under
    ``failurePolicy: Fail``), ``warnings`` those with a ``Warn`` action, in evaluation order;
    ``patch`` is RFC 6902 (empty when nothing changed) and ``final_object`` the mutated object.
    """

    allowed: bool
    results: tuple[RuleResult, ...] = ()
    denials: tuple[Violation, ...] = ()
    warnings: tuple[Violation, ...] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)
    patch: tuple[dict[str, Any], ...] = ()
    final_object: Mapping[str, Any] | None = None

    @property
    def message(self) -> str:
        """The denial message: every denying rule's message, each with its policy name."""
        return "; ".join(denial.text for denial in self.denials)

    @property
    def reason(self) -> str:
        """The HTTP status reason of the first denial (``Forbidden`` when none says otherwise)."""
        return self.denials[0].reason if self.denials else "Forbidden"

    @property
    def warning_texts(self) -> tuple[str, ...]:
        """The warnings as the AdmissionResponse lists them, ``policy: message`` each."""
        return tuple(warning.text for warning in self.warnings)

    @property
    def denied_by(self) -> tuple[str, ...]:
        """Names of the policies that denied, each once, in evaluation order."""
        return tuple(dict.fromkeys(denial.policy for denial in self.denials))


def audit_key(policy: str, suffix: str = "") -> str:
    """A valid auditAnnotations key (a label-name segment, at most 63 characters)."""
    raw = f"{policy}.{suffix}" if suffix else policy
    key = _AUDIT_KEY.sub("-", raw).strip("-._") or "policy"
    if len(key) > 63:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        key = f"{key[:54].rstrip('-._')}-{digest}"
    return key


def _bounded(text: str) -> str:
    return text if len(text) <= AUDIT_VALUE_LIMIT else text[: AUDIT_VALUE_LIMIT - 3] + "..."


class EvaluationExpired(Exception):
    """Raised by :meth:`Engine.evaluate` when its ``expired`` callback says time is up.

    Checked before each policy's pass and, on the rule-by-rule path, before each rule, so an
    evaluation overruns the deadline by at most one evaluation: one rule, or one fused program
    (see :mod:`policies.engine.fused`); each is bounded by CEL's iteration budget over the object.
    The caller then applies the failurePolicy fallback.
    """


class _Run:
    """Mutable state of one evaluation (results, denials, ...), frozen into a Verdict at the end."""

    def __init__(self, expired: Callable[[], bool] | None = None) -> None:
        self.expired = expired
        self.results: list[RuleResult] = []
        self.denials: list[Violation] = []
        self.warnings: list[Violation] = []
        self.audit: dict[str, str] = {}
        self.failures: dict[str, list[dict[str, str]]] = {}  # audit key -> failed rules

    def check_deadline(self) -> None:
        """Raise :class:`EvaluationExpired` when the caller's deadline has passed."""
        if self.expired is not None and self.expired():
            raise EvaluationExpired

    def add(self, result: RuleResult) -> None:
        if result.outcome == RuleOutcome.SKIP and result in self.results:
            return  # a policy with mutations and validations checks its conditions twice
        self.results.append(result)

    def failure(self, policy: Policy, rule: str, path: str, message: str, *,
                error: bool = False, reason: str = "Forbidden",
                point: EvaluationPoint) -> None:
        """Record a violated (or failed-to-evaluate) rule and act on it."""
        actions = policy.actions if not error else (
            (ValidationAction.DENY,) if policy.failure_policy == FailurePolicy.FAIL else ())
        outcome = RuleOutcome.ERROR if error else RuleOutcome.FAIL
        self.add(RuleResult(policy.name, rule, path, outcome, message, actions))
        if point == EvaluationPoint.AUDIT:
            return
        violation = Violation(policy.name, rule, message, reason)
        if ValidationAction.DENY in actions:
            self.denials.append(violation)
        if ValidationAction.WARN in actions:
            self.warnings.append(violation)
        if ValidationAction.AUDIT in actions:
            key = audit_key(policy.name, "validation-failure")
            failures = self.failures.setdefault(key, [])
            failures.append({"rule": rule, "message": message})
            self.audit[key] = _bounded(json.dumps(failures))


class Engine:
    """Evaluates a :class:`PolicySet`; build once per policy set, call :meth:`evaluate` per request.

    Args:
        policies: the compiled policy set.
        environment: the CEL environment the policies were compiled with.
        settings: GPU naming and sharing, for the ``gpu`` facts.
        fuse: evaluate each policy's validation pass as one CEL program where possible
            (:mod:`policies.engine.fused`); False evaluates validations rule by rule as written (the
            reference the fused programs must agree with; for comparisons).
    """

    def __init__(self, policies: PolicySet, environment: CelEnvironment,
                 settings: GPUSettings = DEFAULT_SETTINGS, *, fuse: bool = True) -> None:
        # Variables and params compiled into each policy's expressions: policies then share one
        # activation per request (see policies.engine.inlining); names, matches and paths are
        # unchanged.
        self.policies = replace(policies, policies=tuple(
            inline_policy(policy, environment) for policy in policies.policies))
        self.environment = environment
        self.settings = settings
        # Each inlined policy as written: its rule-by-rule validation pass (the fallback of the
        # fused program) runs on it, so errors name the variable that failed and each variable
        # keeps its own iteration budget, as the API server evaluates them.
        self._originals: dict[int, Policy] = {
            id(inlined): original
            for original, inlined in zip(policies.policies, self.policies.policies, strict=True)
            if inlined is not original}
        both = (*self.policies.policies, *self._originals.values())
        # Params are fixed per policy: check them for CEL once, not per request. Policies with
        # equal params share one prepared value, and so (without variables) one activation.
        self._params: dict[int, Any] = {}
        by_value: dict[str, Any] = {}
        for policy in both:
            key = json.dumps(policy.params, sort_keys=True, default=str)
            if key not in by_value:
                try:
                    by_value[key] = prepare({"params": policy.params})["params"]
                except CelEvaluationError:
                    by_value[key] = None
            self._params[id(policy)] = by_value[key]
        # matchConditions that read neither params nor variables run on one activation shared
        # by every policy of the request: policies that do not apply never convert the object.
        self._conditions: dict[int, tuple[tuple[Rule, ...], tuple[Rule, ...]]] = {
            id(policy): (
                tuple(c for c in policy.match_conditions if _reads_only_request(c.expression)),
                tuple(c for c in policy.match_conditions if not _reads_only_request(c.expression)),
            )
            for policy in both
        }
        # Each policy's validation pass as one CEL program (policies.engine.fused): one evaluation
        # per policy per request; a result that is not plain falls back to rule-by-rule evaluation.
        self._fused: dict[int, FusedValidation] = {}
        self._together: dict[tuple[int, ...], Any] = {}
        for original, policy in zip(policies.policies, self.policies.policies, strict=True):
            if not fuse or policy.variables or policy.param_missing is not None:
                continue
            order = [policy.match_conditions.index(c) for c in (*self._conditions[id(policy)][0],
                                                                *self._conditions[id(policy)][1])]
            fused = build_fused(original, [original.match_conditions[i] for i in order],
                                environment, params_in_activation=policy.params is not None)
            if fused is not None:
                self._fused[id(policy)] = fused

    @property
    def fused_policies(self) -> frozenset[str]:
        """Names of the policies whose validation pass runs as one CEL program."""
        return frozenset(p.name for p in self.policies.policies if id(p) in self._fused)

    def _activation(self, policy: Policy, base: PreparedData,
                    shared: dict[int, RequestActivation]) -> RequestActivation:
        """A policy's activation for this request.

        Policies without variables and with the same params share one, so the runtime converts
        the object once per request, not once per policy.
        """
        params = self._params.get(id(policy))
        if not policy.variables and id(params) in shared:
            return shared[id(params)]
        data = PreparedData({**base, "params": params})
        activation = self.environment.activation(data, _named(policy.variables))
        if not policy.variables:
            shared[id(params)] = activation
        return activation

    def _base(self, base: dict[str, Any], current: Mapping[str, Any] | None,
              facts: WorkloadFacts | None) -> PreparedData | str:
        """The request's data for CEL, checked once; the error text when it cannot be used."""
        try:
            return prepare({**base, "object": current, "gpu": gpu_data(facts)})
        except CelEvaluationError as exc:
            return f"the request cannot be evaluated: {exc.message}"

    def _facts(self, obj: Mapping[str, Any] | None) -> WorkloadFacts | None:
        if not isinstance(obj, Mapping):
            return None
        return workload_facts(obj, settings=self.settings)

    def _base_or_error(self, base: dict[str, Any], current: Mapping[str, Any] | None,
                       subject: Mapping[str, Any] | None,
                       ) -> tuple[WorkloadFacts | None, PreparedData | str]:
        """GPU facts (of ``subject``: the object, or oldObject on DELETE) and the prepared CEL
        data with ``object`` = ``current`` (null on DELETE, as in Kubernetes); an internal failure
        becomes an error text every applicable policy reports under its failurePolicy."""
        try:
            facts = self._facts(subject)
            return facts, self._base(base, current, facts)
        except Exception as exc:  # a bug here (facts or their CEL view) must not crash admission
            return None, f"the GPU facts of the object could not be computed: {_describe(exc)}"

    def evaluate(
        self,
        review: ReviewInput,
        *,
        point: EvaluationPoint = EvaluationPoint.ADMISSION,
        mutate: bool = True,
        validate: bool = True,
        quota: Mapping[str, Any] | None = None,
        expired: Callable[[], bool] | None = None,
        explain: bool = False,
    ) -> Verdict:
        """Evaluate every policy on one request.

        Args:
            review: the request (see :mod:`policies.facts.review`).
            point: ``admission`` or ``audit``.
            mutate: run mutations (the webhook's ``/mutate``); validations then see the result.
            validate: run validations and audit annotations (the webhook's ``/validate``).
            quota: quota usage and limits exposed to CEL as ``quota``.
            expired: called before each policy's pass and each rule evaluated on its own;
                True stops the evaluation (the caller's deadline: the engine does not read the
                clock itself).
            explain: also give a ``skip`` result (rule ``match``) for each policy whose match
                leaves the request out, so every policy has a result (policy test suites).

        Returns:
            The :class:`Verdict`. Never raises for policy or input problems.

        Raises:
            EvaluationExpired: ``expired`` returned True.
        """
        run = _Run(expired)
        original = review.object
        current: Mapping[str, Any] | None = original
        request = {k: v for k, v in review.request.items() if k not in ("object", "oldObject")}
        base = {
            "oldObject": review.old_object, "request": request,
            "namespaceObject": review.namespace_object, "quota": quota or {}, "authorizer": None,
        }
        applicable = self._applicable(review, point, run, explain)
        facts, prepared = self._base_or_error(base, current, review.subject) if applicable \
            else (None, PreparedData())
        shared: dict[int, RequestActivation] = {}
        stale = False  # the object changed since facts and CEL data were computed
        if mutate:
            for policy in applicable:
                if not policy.mutations:
                    continue
                if expired is not None and expired():
                    raise EvaluationExpired
                if stale:
                    facts, prepared = self._base_or_error(base, current, current)
                    shared, stale = {}, False
                try:
                    activation = self._ready(policy, prepared, shared, run, point)
                    if activation is None:
                        continue
                    changed = self._mutate(policy, current, facts, activation, run, point)
                except EvaluationExpired:
                    raise
                except Exception as exc:  # one policy's bug must not crash admission
                    run.failure(policy, "internal", "", f"internal error: {_describe(exc)}",
                                error=True, point=point)
                    continue
                if changed is not current:
                    current, stale = changed, True
        if validate:
            if stale:
                facts, prepared = self._base_or_error(base, current, current)
                shared = {}
            values = self._evaluate_together(applicable, prepared, shared)
            for policy in applicable:
                if not (policy.validations or policy.audit_annotations or policy.param_missing):
                    continue
                if expired is not None and expired():
                    raise EvaluationExpired
                try:
                    if self._validate_fused(policy, prepared, shared, run, point,
                                            values.get(id(policy), _NOT_EVALUATED)):
                        continue
                    self._validate_rules(policy, prepared, shared, run, point)
                except EvaluationExpired:
                    raise
                except Exception as exc:  # one policy's bug must not crash admission
                    run.failure(policy, "internal", "", f"internal error: {_describe(exc)}",
                                error=True, point=point)
        patch = tuple(diff(original, current)) if point == EvaluationPoint.ADMISSION else ()
        return Verdict(
            allowed=not run.denials, results=tuple(run.results), denials=tuple(run.denials),
            warnings=tuple(run.warnings), audit_annotations=run.audit, patch=patch,
            final_object=current,
        )

    def _validate_rules(self, policy: Policy, prepared: PreparedData | str,
                        shared: dict[int, RequestActivation], run: _Run,
                        point: EvaluationPoint) -> None:
        """The policy's validation pass rule by rule, as written (see ``_originals``): the fused
        program is the fast path, this the reference it falls back to."""
        written = self._originals.get(id(policy), policy)
        activation = self._ready(written, prepared, shared, run, point)
        if activation is not None:
            self._validate(written, activation, run, point)

    def _evaluate_together(self, applicable: Sequence[Policy], prepared: PreparedData | str,
                           shared: dict[int, RequestActivation]) -> dict[int, Any]:
        """The fused programs' values of the applicable inlined policies, from one evaluation
        per group of up to :data:`_TOGETHER_SIZE` policies (each group's program compiled once,
        see :data:`_TOGETHER_LIMIT`). A group with one policy, a program that does not compile
        (nesting) or an evaluation that fails gives no values: its policies then run on their
        own."""
        together = [p for p in applicable if id(p) in self._fused and p.params is None]
        if len(together) < 2 or isinstance(prepared, str):
            return {}
        values: dict[int, Any] = {}
        for start in range(0, len(together), _TOGETHER_SIZE):
            group = together[start:start + _TOGETHER_SIZE]
            program = self._together_program(group) if len(group) > 1 else None
            if program is None:
                continue
            try:
                results = self._activation(group[0], prepared, shared).evaluate(program)
            except CelEvaluationError:
                continue
            values.update(zip((id(p) for p in group), results, strict=True))
        return values

    def _together_program(self, group: Sequence[Policy]) -> CompiledExpression | None:
        """The program listing ``group``'s fused programs (None: it does not compile)."""
        key = tuple(id(p) for p in group)
        program: CompiledExpression | None = self._together.get(key, _NOT_EVALUATED)
        if program is _NOT_EVALUATED:
            source = "[" + ",\n".join(self._fused[id(p)].expression.expression
                                       for p in group) + "]"
            try:
                program = self.environment.compile(source, field_path="spec")
            except CelCompileError:
                program = None
            if len(self._together) >= _TOGETHER_LIMIT:
                self._together.clear()
            self._together[key] = program
        return program

    def _validate_fused(self, policy: Policy, prepared: PreparedData | str,
                        shared: dict[int, RequestActivation], run: _Run,
                        point: EvaluationPoint,
                        value: Any = _NOT_EVALUATED) -> bool:
        """The policy's validation pass in one evaluation (see :mod:`policies.engine.fused`), or
        from ``value``, its program's value when already evaluated; False when it has no fused
        program or the result is not plain (nothing recorded then)."""
        fused = self._fused.get(id(policy))
        if fused is None or isinstance(prepared, str):
            return False
        try:
            if value is _NOT_EVALUATED:
                value = self._activation(policy, prepared, shared).evaluate(fused.expression)
            outcome: Outcome | None = read_fused(fused, value)
        except CelEvaluationError:
            return False
        if outcome is None:
            return False
        if outcome.kind == CONDITION_FALSE:
            assert outcome.condition is not None
            run.add(_skipped(policy, outcome.condition))
            return True
        for rule, message in zip(fused.validations, outcome.validations, strict=True):
            self._record(policy, rule, message, run, point)
        for rule, value in zip(fused.audit_annotations, outcome.annotations, strict=True):
            # null omits it (VAP semantics)
            if value is not None and point != EvaluationPoint.AUDIT:
                run.audit[audit_key(policy.name, rule.name)] = _bounded(str(value))
        return True

    @staticmethod
    def _record(policy: Policy, rule: Rule, failure: str | None, run: _Run,
                point: EvaluationPoint) -> None:
        """A validation's result: passed (``failure`` None) or failed with that message."""
        if failure is None:
            run.add(RuleResult(policy.name, rule.name, rule.path, RuleOutcome.PASS))
        else:
            run.failure(policy, rule.name, rule.path, failure, reason=rule.reason, point=point)

    def _ready(self, policy: Policy, prepared: PreparedData | str,
               shared: dict[int, RequestActivation], run: _Run,
               point: EvaluationPoint) -> RequestActivation | None:
        """The policy's activation when its matchConditions hold, else None (result recorded)."""
        if isinstance(prepared, str):
            run.failure(policy, "request", "", prepared, error=True, point=point)
            return None
        plain, rest = self._conditions[id(policy)]
        if plain:
            # The request-only activation, also the one of every inlined policy (params null).
            if id(None) not in shared:
                shared[id(None)] = self.environment.activation(
                    PreparedData({**prepared, "params": None}))
            if not self._conditions_hold(policy, plain, shared[id(None)], run, point):
                return None
        activation = self._activation(policy, prepared, shared)
        return activation if self._conditions_hold(policy, rest, activation, run, point) \
            else None

    def _applicable(self, review: ReviewInput, point: EvaluationPoint, run: _Run,
                    explain: bool) -> list[Policy]:
        """Policies whose match selects the request and that no exception exempts
        (:func:`policies.policy.matching.applicability`); exemptions are ``exempt`` results, and
        with ``explain`` the policies the match leaves out are ``skip`` results too."""
        result = []
        for policy in self.policies.policies:
            reason = applicability(policy, review, point=point)
            if reason is None:
                result.append(policy)
            elif reason.exemption is not None:
                run.add(RuleResult(policy.name, reason.rule, reason.path, RuleOutcome.EXEMPT,
                                   reason.message))
            elif explain:
                run.add(RuleResult(policy.name, reason.rule, reason.path, RuleOutcome.SKIP,
                                   reason.message))
        return result

    def _conditions_hold(self, policy: Policy, conditions: Sequence[Rule],
                         activation: RequestActivation, run: _Run, point: EvaluationPoint) -> bool:
        for condition in conditions:
            try:
                value = activation.evaluate(condition.expression)
            except CelEvaluationError as exc:
                run.failure(policy, condition.name, condition.path,
                            f"matchCondition {condition.name!r} failed to evaluate: {exc.message}",
                            error=True, point=point)
                return False
            if value is not True:
                if value is not False:
                    run.failure(policy, condition.name, condition.path,
                                f"matchCondition {condition.name!r} returned {value!r}, not a "
                                "bool", error=True, point=point)
                else:
                    run.add(_skipped(policy, condition))
                return False
        return True

    def _mutate(
        self, policy: Policy, current: Mapping[str, Any] | None, facts: WorkloadFacts | None,
        activation: RequestActivation, run: _Run, point: EvaluationPoint,
    ) -> Mapping[str, Any] | None:
        """Apply the policy's mutations in order; returns the new object (or ``current``)."""
        if not isinstance(current, Mapping):
            return current
        # Expression steps return a new object (jsonpatch copies); shortcuts change a private
        # copy in place, made at most once per policy.
        working: Mapping[str, Any] = current
        owned = False
        for mutation in policy.mutations:
            run.check_deadline()
            try:
                if mutation.condition is not None and \
                        activation.evaluate(mutation.condition) is not True:
                    continue
                if mutation.expression is not None:
                    operations = validate_operations(activation.evaluate(mutation.expression))
                    updated = apply_operations(working, operations)
                    changed = updated != working
                    change = ", ".join(f"{o['op']} {o['path']}" for o in operations)
                else:
                    assert mutation.shortcut is not None
                    # Once owned, ``working`` is the private dict made below or by a patch.
                    updated = working if owned and isinstance(working, dict) else \
                        copy.deepcopy(dict(working))
                    changed = apply_shortcut(updated, mutation.shortcut, facts)
                    change = f"{mutation.shortcut[0]} {json.dumps(mutation.shortcut[1])}"
                check_identity(updated, current)
            except (CelEvaluationError, MutationError) as exc:
                message = exc.message if isinstance(exc, CelEvaluationError) else str(exc)
                run.failure(policy, mutation.name, mutation.path,
                            f"mutation {mutation.name!r} failed: {message}", error=True,
                            point=point)
                return current
            if changed:
                # Described from the mutation itself (a diff per mutation costs more than the
                # whole evaluation); the response patch is one diff of the whole request.
                run.add(RuleResult(
                    policy.name, mutation.name, mutation.path, RuleOutcome.MUTATE,
                    f"would {change}" if point == EvaluationPoint.AUDIT else change))
            working, owned = updated, owned or changed or mutation.expression is None
        return working if working != current else current

    def _validate(self, policy: Policy, activation: RequestActivation, run: _Run,
                  point: EvaluationPoint) -> None:
        if policy.param_missing == ValidationAction.DENY:
            run.failure(policy, "paramRef", "spec.paramRef",
                        "no params found for this binding (parameterNotFoundAction: Deny)",
                        error=True, point=point)
            return
        if policy.param_missing is not None:
            return  # parameterNotFoundAction: Allow
        for rule in policy.validations:
            run.check_deadline()  # rule by rule, one rule's cost is the most it overruns
            try:
                value = activation.evaluate(rule.expression)
            except CelEvaluationError as exc:
                run.failure(policy, rule.name, rule.path,
                            f"{rule.name} failed to evaluate: {exc.message}", error=True,
                            point=point)
                continue
            if value is not True and value is not False:
                run.failure(policy, rule.name, rule.path,
                            f"{rule.name} returned {value!r}, not a bool", error=True, point=point)
                continue
            self._record(policy, rule, None if value else self._message(rule, activation), run,
                         point)
        for rule in policy.audit_annotations:
            run.check_deadline()
            try:
                value = activation.evaluate(rule.expression)
            except CelEvaluationError as exc:
                run.failure(policy, rule.name, rule.path,
                            f"auditAnnotation {rule.name!r} failed to evaluate: {exc.message}",
                            error=True, point=point)
                continue
            if value is None:
                continue  # a null value omits the annotation (VAP semantics)
            if point != EvaluationPoint.AUDIT:
                run.audit[audit_key(policy.name, rule.name)] = _bounded(str(value))

    def _message(self, rule: Rule, activation: RequestActivation) -> str:
        """messageExpression, else message, else the failed expression (VAP semantics)."""
        problem = ""
        if rule.message_expression is not None:
            try:
                value = activation.evaluate(rule.message_expression)
                if isinstance(value, str) and value.strip():
                    return value.strip()
                problem = "messageExpression returned an empty string" if \
                    isinstance(value, str) else \
                    f"messageExpression returned {type(value).__name__}, not a string"
            except CelEvaluationError as exc:
                problem = f"messageExpression failed: {exc.message}"
        # Fall back to the static message as the API server does, saying why.
        text = rule.message or f"failed expression: {rule.expression.expression.strip()}"
        return f"{text} ({problem})" if problem else text


def _reads_only_request(expression: Any) -> bool:
    """Whether an expression reads only the request's data (no params, no variables)."""
    source = expression.expression
    return not (cel_scanner.uses(source, "params") or cel_scanner.uses(source, "variables"))


_TOGETHER_SIZE = 16
"""Policies per combined program: bounds the one-off compile (~1 ms per policy) that the first
request of a new set of matching policies pays on the event loop."""
_TOGETHER_LIMIT = 256
"""Groups of policies whose combined program is kept compiled (then the cache restarts):
requests differ in kind, namespace and operation, so only a few sets occur."""


def _skipped(policy: Policy, condition: Rule) -> RuleResult:
    return RuleResult(policy.name, condition.name, condition.path, RuleOutcome.SKIP,
                      f"matchCondition {condition.name!r} is false")


def _describe(exc: Exception) -> str:
    """An exception in one line, bounded: messages may embed object fragments."""
    return shortened(f"{type(exc).__name__}: {exc}", 300)


def _named(rules: Sequence[Rule]) -> list[tuple[str, Any]]:
    return [(rule.name, rule.expression) for rule in rules]
