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

Each policy is compiled once, when the engine is built, into a
:class:`~policies.engine.compiled.CompiledPolicy`: the fast path (inlined forms, fused and
combined programs, shared activations) is reached only through it. Whatever the fast path cannot
decide plainly (an error, a value that is not plain) is evaluated again on the policy as
written, so it reports exactly what ``EvaluationMode.REFERENCE`` (no fast path at all) reports.

Must not do I/O, read the clock (``ReviewInput.now``) or keep state between requests (it only
caches compiled programs, which depend on the policy set alone).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from policies.authorization import Authorizer, Subject, Unavailable
from policies.cel.cost import OUT_OF_BUDGET
from policies.cel.gpu import gpu_data
from policies.cel.library import authz
from policies.cel.runtime import (
    CelEnvironment,
    CelEvaluationError,
    CompiledExpression,
    CostGuard,
    PreparedData,
    RequestActivation,
    prepare,
)
from policies.engine.compiled import (
    REQUEST_ACTIVATION,
    CombinedPrograms,
    CompiledPolicy,
    PolicyForm,
    compile_policies,
)
from policies.engine.messages import (
    expression_message,
    expression_problem,
    fallback_message,
    static_message,
)
from policies.facts.dra import DraIndex
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.facts.review import RequestShape, ReviewInput, shape_key
from policies.facts.workloads import WorkloadFacts, workload_facts
from policies.policy.apply import apply_configuration, typed_value, untyped
from policies.policy.matching import (
    applicability,
    effective_operation,
    judges_unmodelled,
    rules_name_free,
    rules_select,
    selects_by_rules_alone,
    unmodelled_kind,
)
from policies.policy.model import Policy, PolicySet, Rule
from policies.policy.mutation import (
    MutationError,
    UndecodableError,
    apply_operations,
    apply_shortcut,
    check_identity,
    diff,
    native_operations,
    validate_operations,
)
from policies.records import maker
from policies.sources import shortened
from policies.value_words import described
from policies.vocabulary import EvaluationMode, EvaluationPoint, FailurePolicy, ValidationAction


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
SELECTION_CACHE_LIMIT = 1024  # request shapes (resource, subresource, operation) kept per engine
PARAMS_ALLOW = "Allow"  # Policy.param_missing of a binding whose missing params allow
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
    ``facts`` are the GPU facts the last policy pass saw (of the mutated object when a mutation
    changed it); None when no policy applied, so none were computed.
    """

    allowed: bool
    results: tuple[RuleResult, ...] = ()
    denials: tuple[Violation, ...] = ()
    warnings: tuple[Violation, ...] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)
    patch: tuple[dict[str, Any], ...] = ()
    final_object: Mapping[str, Any] | None = None
    facts: WorkloadFacts | None = None

    # Each read once per admission; most requests have no denial or warning, so the empty
    # case returns before building a generator (about 3 k instructions each).
    @property
    def message(self) -> str:
        """The denial message: every denying rule's message, each with its policy name."""
        return "; ".join(denial.text for denial in self.denials) if self.denials else ""

    @property
    def reason(self) -> str:
        """The HTTP status reason of the first denial (``Forbidden`` when none says otherwise)."""
        return self.denials[0].reason if self.denials else "Forbidden"

    @property
    def warning_texts(self) -> tuple[str, ...]:
        """The warnings as the AdmissionResponse lists them, ``policy: message`` each."""
        return tuple(warning.text for warning in self.warnings) if self.warnings else ()

    @property
    def denied_by(self) -> tuple[str, ...]:
        """Names of the policies that denied, each once, in evaluation order."""
        return tuple(dict.fromkeys(denial.policy for denial in self.denials)) \
            if self.denials else ()


# One verdict per request, a result and a violation per failed rule (see policies.records).
_make_verdict = maker(Verdict)
_make_result = maker(RuleResult)
_make_violation = maker(Violation)


def _missing_runtime_class(shortcut: tuple[str, Any],
                           known: frozenset[str] | None) -> str | None:
    """Why a ``setRuntimeClassName`` shortcut is not applied: the cluster's RuntimeClasses are
    known and lack the one it names (kube-apiserver's RuntimeClass admission refuses a pod that
    names a RuntimeClass that does not exist, so setting it would break the pod). None: apply
    it (another shortcut, the class exists, or nothing is known: see docs/policies.md)."""
    name, value = shortcut
    if name != "setRuntimeClassName" or known is None or value in known:
        return None
    have = ", ".join(sorted(known)) or "none"
    return (f"setRuntimeClassName {json.dumps(value)} not applied: the cluster has no "
            f"RuntimeClass {value!r} (it has: {have}), and a pod naming one that does not "
            "exist is refused")


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

    def __init__(self, expired: Callable[[], bool] | None = None,
                 session: authz.Session | None = None,
                 runtime_classes: frozenset[str] | None = None) -> None:
        self.expired = expired
        # The request's authorizer session and its errored-decision count when the current
        # policy's pass began: a rule that fails after an errored authorizer decision is an
        # evaluation error (failurePolicy decides), not a plain violation.
        self.session = session
        self.mark = 0
        self.runtime_classes = runtime_classes  # the cluster's RuntimeClasses; None: unknown
        self.results: list[RuleResult] = []
        self.skipped: set[tuple[Any, ...]] = set()  # the fields of each skip result added
        self.denials: list[Violation] = []
        self.warnings: list[Violation] = []
        self.audit: dict[str, str] = {}
        self.failures: dict[str, list[dict[str, str]]] = {}  # audit key -> failed rules
        # For the API server's reinvocation rule (mutating/dispatcher.go): whether the current
        # policy's matchConditions held (its mutations ran), and whether any native mutation
        # of the evaluation applied (the versioned object is "dirty" even when unchanged).
        self.invoked = False
        self.applied = False

    @property
    def errors(self) -> bool:
        """Whether a rule failed to evaluate."""
        return any(result.outcome == RuleOutcome.ERROR for result in self.results)

    def adopt(self, trial: _Run) -> None:
        """Take the results of a trial run without errors (a pass on a policy's inlined form:
        only ``skip`` and ``mutate`` results, nothing that denies, warns or annotates)."""
        assert not trial.errors and not (trial.denials or trial.warnings or trial.audit)
        for result in trial.results:
            self.add(result)
        self.invoked |= trial.invoked
        self.applied |= trial.applied

    def check_deadline(self) -> None:
        """Raise :class:`EvaluationExpired` when the caller's deadline has passed."""
        if self.expired is not None and self.expired():
            raise EvaluationExpired

    def add(self, result: RuleResult) -> None:
        if result.outcome == RuleOutcome.SKIP:
            # A policy with mutations and validations checks its conditions twice: one skip
            # result each. Looked up by its fields in a set: ``in self.results`` ran the
            # dataclass __eq__ against every earlier result (~60 k instructions a request).
            key = (result.policy, result.rule, result.path, result.message, result.actions)
            if key in self.skipped:
                return
            self.skipped.add(key)
        self.results.append(result)

    def begin(self) -> None:
        """A policy's pass begins: authorizer errors before it are not its own."""
        if self.session is not None:
            self.mark = self.session.errored

    def authorizer_error(self) -> str | None:
        """The error of an errored authorizer decision the current pass saw, if any."""
        if self.session is not None and self.session.errored > self.mark:
            return self.session.last_error
        return None

    def failure(self, policy: Policy, rule: str, path: str, message: str, *,
                error: bool = False, reason: str = "Forbidden",
                point: EvaluationPoint, undecodable: bool = False) -> None:
        """Record a violated (or failed-to-evaluate) rule and act on it; a violation after an
        errored authorizer decision of the same pass is recorded as an error naming it. An
        ``undecodable`` mutation result denies whatever the failurePolicy
        (:class:`~policies.policy.mutation.UndecodableError`)."""
        if not error and (cause := self.authorizer_error()) is not None:
            message, error = f"{message} (authorizer check errored: {cause})", True
        actions = policy.actions if not error else (
            (ValidationAction.DENY,) if policy.failure_policy == FailurePolicy.FAIL
            or undecodable else ())
        outcome = RuleOutcome.ERROR if error else RuleOutcome.FAIL
        self.add(_make_result(policy=policy.name, rule=rule, path=path, outcome=outcome,
                              message=message, actions=actions))
        if point == EvaluationPoint.AUDIT:
            return
        violation = _make_violation(policy=policy.name, rule=rule, message=message,
                                    reason=reason)
        if ValidationAction.DENY in actions:
            self.denials.append(violation)
        if ValidationAction.WARN in actions:
            self.warnings.append(violation)
        if ValidationAction.AUDIT in actions:
            key = audit_key(policy.name, "validation-failure")
            failures = self.failures.setdefault(key, [])
            failures.append({"rule": rule, "message": message})
            self.audit[key] = _bounded(json.dumps(failures))


class _RequestData:
    """One request's data for CEL (or why it cannot be used) and the activations made from it.

    Activations are shared as :attr:`PolicyForm.activation` says, so the runtime converts the
    object once per request, not once per policy. Built again when a mutation changes the object.
    """

    def __init__(self, environment: CelEnvironment, facts: WorkloadFacts | None,
                 prepared: PreparedData | str,
                 rebuild: Callable[[Mapping[str, Any]], _RequestData] | None = None) -> None:
        self.environment = environment
        self.facts = facts
        self.prepared = prepared
        self.rebuild = rebuild  # the same request's data with another object (after a mutation)
        self._shared: dict[int, RequestActivation] = {}

    def request(self) -> RequestActivation:
        """The request's own activation (params null, no variables)."""
        return self._activation(REQUEST_ACTIVATION, None, ())

    def of(self, form: PolicyForm) -> RequestActivation:
        """The activation of one form of a policy (its params and variables)."""
        return self._activation(form.activation, form.params, form.policy.variables)

    def _activation(self, key: int | None, params: Any,
                    variables: Sequence[Rule]) -> RequestActivation:
        if key is not None and key in self._shared:
            return self._shared[key]
        assert not isinstance(self.prepared, str), "checked by Engine._ready"
        activation = self.environment.activation(
            self.prepared.replaced(params=params) if self.prepared.profiles
            else PreparedData({**self.prepared, "params": params}), _named(variables))
        if key is not None:
            self._shared[key] = activation
        return activation


class Engine:
    """Evaluates a :class:`PolicySet`; build once per policy set, call :meth:`evaluate` per request.

    Args:
        policies: the compiled policy set.
        environment: the CEL environment the policies were compiled with.
        settings: GPU naming and sharing, for the ``gpu`` facts.
        mode: ``fast`` (inlined variables and params, fused and combined programs; see
            :mod:`policies.engine.compiled`) or ``reference`` (every policy as written, rule by
            rule: the semantics the fast path must agree with; for comparisons).

    Attributes:
        policies: the policy set as written (what lint, the webhook's fallback and reports read).
        compiled: each policy as evaluated, in order (:class:`CompiledPolicy`).
    """

    def __init__(self, policies: PolicySet, environment: CelEnvironment,
                 settings: GPUSettings = DEFAULT_SETTINGS, *,
                 mode: EvaluationMode = EvaluationMode.FAST) -> None:
        self.policies = policies
        self.environment = environment
        self.settings = settings
        self.mode = mode
        self.compiled = compile_policies(policies.policies, environment, mode)
        self._combined = CombinedPrograms(environment) if mode == EvaluationMode.FAST else None
        # Per compiled policy: whether its resource rules can be decided from the request's
        # shape alone (no resourceNames), whether they then decide applicability whole (no
        # selector, namespace list, subject or exception), and whether they also judge kinds
        # the workload registry does not model (then, for such a kind, the object decides):
        # what the selection cache relies on.
        self._shape_only = tuple(
            (shape_only := rules_name_free(c.policy.match),
             shape_only and selects_by_rules_alone(c.policy.match) and not c.policy.exceptions,
             judges_unmodelled(c.policy.match))
            for c in self.compiled)
        self._selections: dict[tuple[Any, ...], tuple[tuple[CompiledPolicy, bool], ...]] = {}
        # The results of a fused pass in which every validation passed: the same objects each
        # time (results are frozen), so the plain case builds none.
        self._passes = {
            c.index: tuple(RuleResult(c.policy.name, rule.name, rule.path, RuleOutcome.PASS)
                           for rule in c.fused.validations)
            for c in self.compiled if c.fused is not None}
        # The skip result of each matchCondition of a fused program, by its index: a false
        # condition is the most common outcome after a pass, and results are frozen.
        self._skips = {c.index: tuple(_skipped(c.policy, rule) for rule in c.fused.conditions)
                       for c in self.compiled if c.fused is not None}
        # The value of such a pass in a combined program (one ``true`` per validation), for
        # policies without auditAnnotations: compared whole, it needs no reading.
        self._pass_values = {
            c.index: [True] * len(c.fused.validations)
            for c in self.compiled if c.fused is not None and not c.fused.audit_annotations}
        # Per compiled policy with a fast path: its expressions (as written) whose estimate is
        # over the per-call cost limit; for a request on which one of them may pass it, the
        # policy is evaluated rule by rule, where each is measured (policies/cel/cost.py).
        self._cost_guarded = {
            c.index: CostGuard(guarded) for c in self.compiled if c.fused is not None and (
                guarded := tuple(e for e in _expressions(c.policy, messages=False)
                                 if e.estimated_cost > environment.cost_limits.per_call))}
        # whether some expression is measured per request: then prepare() counts the size
        # class as it checks the data (policies/cel/cost.py); otherwise nothing needs it
        self._sized = any(e.measured for p in policies.policies for e in _expressions(p))
        self.uses_authorizer = any(uses_authorizer(p) for p in policies.policies)
        """Whether some policy mentions ``authorizer`` (its checks may call the injected
        authorizer: the webhook then evaluates on its event loop only with the authorizer's
        cached answers)."""

    @property
    def fused_policies(self) -> frozenset[str]:
        """Names of the policies whose validation pass runs as one CEL program."""
        return frozenset(c.policy.name for c in self.compiled if c.fused is not None)

    def _base(self, base: dict[str, Any], current: Mapping[str, Any] | None,
              facts: WorkloadFacts | None) -> PreparedData | str:
        """The request's data for CEL, checked once; the error text when it cannot be used."""
        try:
            return prepare({**base, "object": current, "gpu": gpu_data(facts)},
                           sized=self._sized)
        except CelEvaluationError as exc:
            return f"the request cannot be evaluated: {exc.message}"

    def _facts(self, obj: Mapping[str, Any] | None,
               dra: DraIndex | None = None) -> WorkloadFacts | None:
        if not isinstance(obj, Mapping):
            return None
        return workload_facts(obj, settings=self.settings, dra=dra)

    def _data(self, base: dict[str, Any], current: Mapping[str, Any] | None,
              subject: Mapping[str, Any] | None, dra: DraIndex | None = None) -> _RequestData:
        """GPU facts (of ``subject``: the object, or oldObject on DELETE) and the prepared CEL
        data with ``object`` = ``current`` (null on DELETE, as in Kubernetes); an internal failure
        becomes an error text every applicable policy reports under its failurePolicy."""
        try:
            facts = self._facts(subject, dra)
            return _RequestData(self.environment, facts, self._base(base, current, facts),
                                lambda changed: self._data(base, changed, changed, dra))
        except Exception as exc:  # a bug here (facts or their CEL view) must not crash admission
            return _RequestData(
                self.environment, None,
                f"the GPU facts of the object could not be computed: {_describe(exc)}")

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
        authorizer: Authorizer | None = None,
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
            authorizer: what CEL ``authorizer`` checks ask (for ``review.user``); None: every
                check is an errored decision. A rule that fails after an errored decision of
                its policy's pass is an ``error`` result: the policy's failurePolicy decides.

        Returns:
            The :class:`Verdict`. Never raises for policy or input problems.

        Raises:
            EvaluationExpired: ``expired`` returned True.
        """
        if not explain and not self._selection(review, point):
            # No policy is written for requests of this shape: what _evaluate answers when none
            # applies, without its run state or the authorizer session.
            return _make_verdict(allowed=True, results=(), audit_annotations={},
                                 final_object=review.object)
        if not self.uses_authorizer:
            return self._evaluate(review, point, mutate, validate, quota,
                                  _Run(expired, runtime_classes=review.runtime_classes),
                                  explain, None)
        session = authz.Session(authorizer if authorizer is not None else _NO_AUTHORIZER,
                                _subject(review))
        with authz.bound(session, _request_resource(review)) as value:
            return self._evaluate(review, point, mutate, validate, quota,
                                  _Run(expired, session, review.runtime_classes), explain, value)

    def _evaluate(self, review: ReviewInput, point: EvaluationPoint, mutate: bool,
                  validate: bool, quota: Mapping[str, Any] | None, run: _Run, explain: bool,
                  authorizer: Any) -> Verdict:
        expired = run.expired
        original = review.object
        current: Mapping[str, Any] | None = original
        applicable = self._applicable(review, point, run, explain)
        if not applicable:  # allowed and unchanged; no GPU facts or CEL data are built
            return _make_verdict(allowed=True, results=tuple(run.results),
                                 audit_annotations=run.audit, final_object=original)
        request = {k: v for k, v in review.request.items() if k not in ("object", "oldObject")}
        base = {
            "oldObject": review.old_object, "request": request,
            "namespaceObject": review.namespace_object, "quota": quota or {},
            "authorizer": authorizer,
        }
        data = self._data(base, current, review.subject, review.dra)
        stale = False  # the object changed since facts and CEL data were computed
        if mutate:
            # reinvocationPolicy IfNeeded (MutatingAdmissionPolicy), as the API server's
            # policy reinvocation context decides (mutating/dispatcher.go): once any mutation
            # of the pass applied, every IfNeeded policy whose matchConditions held in it runs
            # once more after the pass, in order; one whose conditions were false does not.
            invoked: set[int] = set()
            mutating = [c for c in applicable if c.policy.mutations]
            for reinvoked in (False, True):
                for compiled in mutating if not reinvoked else \
                        [c for c in mutating if run.applied and c.index in invoked]:
                    if expired is not None and expired():
                        raise EvaluationExpired
                    if stale:
                        data, stale = self._data(base, current, current, review.dra), False
                    run.begin()
                    run.invoked = False
                    try:
                        changed = self._mutation_pass(compiled, current, data, run, point)
                    except EvaluationExpired:
                        raise
                    except Exception as exc:  # one policy's bug must not crash admission
                        run.failure(compiled.policy, "internal", "",
                                    f"internal error: {_describe(exc)}", error=True,
                                    point=point)
                        continue
                    if changed is not current:
                        current, stale = changed, True
                        run.applied = True
                    if not reinvoked and run.invoked and \
                            compiled.policy.reinvocation == "IfNeeded":
                        invoked.add(compiled.index)
        if validate:
            if stale:
                data = self._data(base, current, current, review.dra)
            run.begin()
            checks = authz.checks_made()
            values = self._evaluate_combined(applicable, data)
            checks = authz.checks_made() - checks  # what the combined programs' checks cost
            if run.authorizer_error() is not None:
                values = {}  # each policy then runs on its own, its errors its own
            for compiled in applicable:
                policy = compiled.policy
                if not (policy.validations or policy.audit_annotations or policy.param_missing):
                    continue
                if expired is not None and expired():
                    raise EvaluationExpired
                run.begin()
                # a rule that may pass the CEL cost limit on a request of this size is evaluated
                # as written (gpuguard's generated programs are not held to the limits)
                over = compiled.index in self._cost_guarded \
                    and not isinstance(data.prepared, str) and data.request().cost_bound_over(
                        self._cost_guarded[compiled.index], checks)
                value = values.get(compiled.index, _NOT_EVALUATED) if not over \
                    else _NOT_EVALUATED
                if value is not _NOT_EVALUATED and value == self._pass_values.get(compiled.index):
                    # The plain pass, already evaluated: its elements are the fused program's
                    # literal ``true``s (see policies.engine.fused), so equality is exact.
                    run.results.extend(self._passes[compiled.index])
                    continue
                try:
                    if not over and self._validate_fused(compiled, data, run, point, value):
                        continue
                    activation = self._ready(compiled.written, data, run, point)
                    if activation is not None:
                        self._validate(policy, activation, run, point)
                except EvaluationExpired:
                    raise
                except Exception as exc:  # one policy's bug must not crash admission
                    run.failure(policy, "internal", "", f"internal error: {_describe(exc)}",
                                error=True, point=point)
        patch = tuple(diff(original, current)) if point == EvaluationPoint.ADMISSION else ()
        return _make_verdict(
            allowed=not run.denials, results=tuple(run.results), denials=tuple(run.denials),
            warnings=tuple(run.warnings), audit_annotations=run.audit, patch=patch,
            final_object=current, facts=data.facts,
        )

    def _mutation_pass(self, compiled: CompiledPolicy, current: Mapping[str, Any] | None,
                       data: _RequestData, run: _Run,
                       point: EvaluationPoint) -> Mapping[str, Any] | None:
        """The policy's matchConditions and mutations; returns the new object (or ``current``).

        They run on the inlined form; a pass with an error there is run again on the policy
        as written (nothing of the first try is kept), so the error names the variable that
        failed and each variable keeps its own iteration budget, as the API server does.
        """
        if compiled.policy.param_missing is not None:  # the binding has no params to run with
            if compiled.policy.param_missing != PARAMS_ALLOW:
                run.failure(compiled.policy, "paramRef", "spec.paramRef",
                            compiled.policy.param_missing, error=True, point=point)
            return current
        if compiled.inlined is not compiled.written:
            trial = _Run(run.expired, run.session, run.runtime_classes)
            trial.mark = run.mark
            changed = self._mutate_form(compiled.inlined, current, data, trial, point)
            if not trial.errors:
                run.adopt(trial)
                return changed
        return self._mutate_form(compiled.written, current, data, run, point)

    def _mutate_form(self, form: PolicyForm, current: Mapping[str, Any] | None,
                     data: _RequestData, run: _Run,
                     point: EvaluationPoint) -> Mapping[str, Any] | None:
        activation = self._ready(form, data, run, point)
        if activation is None:
            return current

        def renewed(changed: Mapping[str, Any]) -> RequestActivation | None:
            # the API server evaluates each mutation on the object the previous ones left,
            # variables included (mutating/dispatcher.go: dispatchOne per mutation)
            fresh = data.rebuild(changed) if data.rebuild is not None else None
            return None if fresh is None or isinstance(fresh.prepared, str) else fresh.of(form)

        return self._mutate(form.policy, current, data.facts, activation, run, point,
                            renewed if form.policy.native else None)

    def _evaluate_combined(self, applicable: Sequence[CompiledPolicy],
                           data: _RequestData) -> dict[int, Any]:
        """The fused programs' values of the applicable policies by :attr:`CompiledPolicy.index`,
        from one evaluation per group (:class:`CombinedPrograms`). An evaluation that fails gives
        no values: its policies then run on their own."""
        if self._combined is None or isinstance(data.prepared, str):
            return {}
        values: dict[int, Any] = {}
        for group, program in self._combined.groups(applicable):
            try:
                results = data.request().evaluate(program)
            except CelEvaluationError:
                continue
            values.update(zip((c.index for c in group), results, strict=True))
        return values

    def _validate_fused(self, compiled: CompiledPolicy, data: _RequestData, run: _Run,
                        point: EvaluationPoint, value: Any = _NOT_EVALUATED) -> bool:
        """The policy's validation pass in one evaluation (see :mod:`policies.engine.compiled`),
        or from ``value``, its program's value when already evaluated; False when it has no
        fused program or the result is not plain (nothing recorded then: the caller evaluates
        the policy as written, rule by rule)."""
        fused = compiled.fused
        if fused is None or isinstance(data.prepared, str):
            return False
        policy = compiled.policy
        try:
            if value is _NOT_EVALUATED:
                checks = authz.checks_made()
                value = data.of(compiled.inlined).evaluate(fused.expression)
                checks = authz.checks_made() - checks
                if checks and compiled.index in self._cost_guarded and \
                        data.request().cost_bound_over(self._cost_guarded[compiled.index], checks):
                    return False  # its authorizer checks may pass the cost limit: rule by rule
            if (skipped := fused.false_condition(value)) is not None:
                run.add(self._skips[compiled.index][skipped])
                return True
            outcome = fused.read(value)
        except CelEvaluationError:
            return False
        if outcome is None:
            return False
        if outcome.passed:
            run.results.extend(self._passes[compiled.index])
        elif outcome.condition is not None:
            run.add(_skipped(policy, outcome.condition))
            return True
        else:
            for rule, message in zip(fused.validations, outcome.validations, strict=True):
                self._record(policy, rule, message, run, point)
        for rule, value in zip(fused.audit_annotations, outcome.annotations, strict=True):
            _annotate(policy, rule, value, run, point)
        return True

    @staticmethod
    def _record(policy: Policy, rule: Rule, failure: str | None, run: _Run,
                point: EvaluationPoint) -> None:
        """A validation's result: passed (``failure`` None) or failed with that message."""
        if failure is None:
            run.add(RuleResult(policy.name, rule.name, rule.path, RuleOutcome.PASS))
        else:
            run.failure(policy, rule.name, rule.path, failure, reason=rule.reason, point=point)

    def _ready(self, form: PolicyForm, data: _RequestData, run: _Run,
               point: EvaluationPoint) -> RequestActivation | None:
        """The form's activation when its matchConditions hold (evaluated in order, each on the
        activation :attr:`PolicyForm.request_only` says), else None (result recorded)."""
        policy = form.policy
        if isinstance(data.prepared, str):
            run.failure(policy, "request", "", data.prepared, error=True, point=point)
            return None
        if form.params_error is not None:
            run.failure(policy, "params", _params_path(policy),
                        f"the params cannot be evaluated in CEL: {form.params_error}",
                        error=True, point=point)
            return None
        own: RequestActivation | None = None
        for condition, request_only in zip(policy.match_conditions, form.request_only,
                                           strict=True):
            if request_only:
                activation = data.request()
            else:
                own = own or data.of(form)
                activation = own
            if not self._condition_holds(policy, condition, activation, run, point):
                return None
        return own or data.of(form)

    def _applicable(self, review: ReviewInput, point: EvaluationPoint, run: _Run,
                    explain: bool) -> list[CompiledPolicy]:
        """Policies whose match selects the request and that no exception exempts
        (:func:`policies.policy.matching.applicability`); exemptions are ``exempt`` results, and
        with ``explain`` the policies the match leaves out are ``skip`` results too."""
        result = []
        candidates = ((c, False) for c in self.compiled) if explain else \
            self._selection(review, point)
        for compiled, decided in candidates:
            if decided:  # its resource rules selected the request and are all it has
                result.append(compiled)
                continue
            policy = compiled.policy
            reason = applicability(policy, review, point=point)
            if reason is None:
                result.append(compiled)
            elif reason.exemption is not None:
                run.add(RuleResult(policy.name, reason.rule, reason.path, RuleOutcome.EXEMPT,
                                   reason.message))
            elif explain:
                run.add(RuleResult(policy.name, reason.rule, reason.path, RuleOutcome.SKIP,
                                   reason.message))
        return result

    def written_for_none(self, shape: RequestShape) -> bool:
        """Whether no policy is written for admission requests of ``shape``: their resource
        rules select none of this engine's policies, as an earlier request of the same shape
        showed (the selection :meth:`evaluate` caches). False while not known: the first
        request of a shape is evaluated, and makes it known. :meth:`evaluate` of such a
        request allows it untouched, with no result: a caller may answer that itself without
        building the :class:`ReviewInput`."""
        return self._selections.get(shape.key) == ()

    def _selection(self, review: ReviewInput,
                   point: EvaluationPoint) -> tuple[tuple[CompiledPolicy, bool], ...]:
        """The policies that may apply to a request of this shape (group, version, resource,
        subresource, operation, kind), in order, each with whether its resource rules decided
        that whole; computed once per shape (:func:`policies.policy.matching.rules_select`).
        A policy whose rules depend on more than the shape for this request — resourceNames,
        or a kind the workload registry does not model under a rule that judges such kinds by
        their object — is always kept, undecided: its match is read from the request itself.
        Safe to share between threads: entries are only ever set whole, or all cleared."""
        operation = effective_operation(review, point)
        key = shape_key(review.resource, review.subresource, operation, review.kind)
        selection = self._selections.get(key)
        if selection is None:
            open_kind = unmodelled_kind(review)
            selection = tuple(
                (compiled, decided and not (unmodelled and open_kind))
                for compiled, (shape_only, decided, unmodelled)
                in zip(self.compiled, self._shape_only, strict=True)
                if not shape_only or (unmodelled and open_kind)
                or rules_select(compiled.policy.match, review, operation))
            if len(self._selections) >= SELECTION_CACHE_LIMIT:
                self._selections.clear()
            self._selections[key] = selection
        return selection

    @staticmethod
    def _condition_holds(policy: Policy, condition: Rule, activation: RequestActivation,
                         run: _Run, point: EvaluationPoint) -> bool:
        value = _value(policy, condition, "matchCondition", activation, run, point)
        if value is True:
            return True
        if value is False and (cause := run.authorizer_error()) is not None:
            run.failure(policy, condition.name, condition.path,
                        f"matchCondition {condition.name!r} is false after an errored "
                        f"authorizer check: {cause}", error=True, point=point)
        elif value is False:
            run.add(_skipped(policy, condition))
        elif value is not _FAILED:
            run.failure(policy, condition.name, condition.path,
                        f"matchCondition {condition.name!r} returned {described(value)}, not "
                        "a bool",
                        error=True, point=point)
        return False

    def _mutate(
        self, policy: Policy, current: Mapping[str, Any] | None, facts: WorkloadFacts | None,
        activation: RequestActivation, run: _Run, point: EvaluationPoint,
        renewed: Callable[[Mapping[str, Any]], RequestActivation | None] | None = None,
    ) -> Mapping[str, Any] | None:
        """Apply the policy's mutations in order; returns the new object (or ``current``).

        ``renewed``: the activation for the object as a mutation left it, for the next one
        (native policies; a GPUPolicy's mutations all read the object as the policy found it).
        """
        run.invoked = True
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
                if mutation.patch_type == "ApplyConfiguration":
                    assert mutation.expression is not None
                    configuration = typed_value(activation.evaluate(mutation.expression))
                    updated = apply_configuration(working, configuration)
                    changed = updated != working
                    change = shortened(f"apply {json.dumps(configuration, sort_keys=True)}",
                                       300)
                elif mutation.expression is not None:
                    value = activation.evaluate(mutation.expression)
                    operations = native_operations(untyped(value)) if mutation.patch_type \
                        else validate_operations(value)
                    updated = apply_operations(working, operations,
                                               native=bool(mutation.patch_type))
                    changed = updated != working
                    change = ", ".join(f"{o['op']} {o['path']}" for o in operations)
                else:
                    assert mutation.shortcut is not None
                    missing = _missing_runtime_class(mutation.shortcut, run.runtime_classes)
                    if missing is not None:
                        run.add(RuleResult(policy.name, mutation.name, mutation.path,
                                           RuleOutcome.SKIP, missing))
                        continue
                    # Once owned, ``working`` is the private dict made below or by a patch.
                    updated = working if owned and isinstance(working, dict) else \
                        copy.deepcopy(dict(working))
                    changed = apply_shortcut(updated, mutation.shortcut, facts)
                    change = f"{mutation.shortcut[0]} {json.dumps(mutation.shortcut[1])}"
                check_identity(updated, current)
            except (CelEvaluationError, MutationError) as exc:
                message = exc.message if isinstance(exc, CelEvaluationError) else str(exc)
                if not mutation.patch_type:  # a native policy's: the API server's text alone
                    message = f"mutation {mutation.name!r} failed: {message}"
                run.failure(policy, mutation.name, mutation.path, message, error=True,
                            point=point, undecodable=isinstance(exc, UndecodableError))
                if mutation.patch_type and not isinstance(exc, UndecodableError):
                    # The API server goes on with the policy's next mutation, keeping what the
                    # earlier ones did (its failurePolicy decides the request afterwards); an
                    # object it cannot decode ends the request (mutating/dispatcher.go).
                    continue
                return current
            run.applied = run.applied or bool(mutation.patch_type)
            if changed:
                # Described from the mutation itself (a diff per mutation costs more than the
                # whole evaluation); the response patch is one diff of the whole request.
                run.add(RuleResult(
                    policy.name, mutation.name, mutation.path, RuleOutcome.MUTATE,
                    f"would {change}" if point == EvaluationPoint.AUDIT else change))
            working, owned = updated, owned or changed or mutation.expression is None
            if changed and renewed is not None and mutation is not policy.mutations[-1]:
                activation = renewed(working) or activation
        return working if working != current else current

    def _validate(self, policy: Policy, activation: RequestActivation, run: _Run,
                  point: EvaluationPoint) -> None:
        if policy.param_missing is not None:
            if policy.param_missing != PARAMS_ALLOW and \
                    policy.kind != "MutatingAdmissionPolicy":  # its mutation pass reported it
                run.failure(policy, "paramRef", "spec.paramRef", policy.param_missing,
                            error=True, point=point)
            return  # parameterNotFoundAction: Allow
        budget = _budget(policy, activation)
        for rule in policy.validations:
            run.check_deadline()  # rule by rule, one rule's cost is the most it overruns
            if budget is not None:
                budget -= activation.cost(rule.expression)
                if budget < 0:  # the API server's RuntimeCELCostBudget: the policy stops here
                    run.failure(policy, rule.name, rule.path, OUT_OF_BUDGET, error=True,
                                point=point)
                    return
            value = _value(policy, rule, "", activation, run, point)
            if value is _FAILED:
                continue
            if value is not True and value is not False:
                run.failure(policy, rule.name, rule.path,
                            f"{rule.name} returned {described(value)}, not a bool", error=True,
                            point=point)
                continue
            self._record(policy, rule,
                         None if value else self._message(policy, rule, activation), run, point)
        for rule in policy.audit_annotations:
            run.check_deadline()
            value = _value(policy, rule, "auditAnnotation", activation, run, point)
            if value is not _FAILED:
                _annotate(policy, rule, value, run, point)

    def _message(self, policy: Policy, rule: Rule, activation: RequestActivation) -> str:
        """The failed validation's message (:mod:`policies.engine.messages`)."""
        if rule.message_expression is None:
            return static_message(rule)
        try:
            value = activation.evaluate(rule.message_expression)
        except CelEvaluationError as exc:
            problem = f"messageExpression failed: {exc.message}"
        else:
            message = expression_message(value)
            if message is not None:
                return message
            problem = expression_problem(value)
        return fallback_message(rule, problem, native=policy.native)


_FAILED: Any = object()  # an evaluation that failed (its error result recorded)
_NO_AUTHORIZER: Any = Unavailable("this evaluation was given no authorizer")


def _expressions(policy: Policy, *, messages: bool = True) -> list[CompiledExpression]:
    """Every CEL expression of ``policy`` as written (``messages``: with messageExpressions)."""
    found = [r.expression for r in (*policy.match_conditions, *policy.variables,
                                    *policy.validations, *policy.audit_annotations)]
    if messages:
        found += [r.message_expression for r in policy.validations if r.message_expression]
    found += [e for m in policy.mutations for e in (m.expression, m.condition) if e]
    return found


def uses_authorizer(policy: Policy) -> bool:
    """Whether an expression of ``policy`` names ``authorizer`` (a conservative text scan)."""
    expressions = [r.expression for r in (*policy.match_conditions, *policy.variables,
                                          *policy.validations, *policy.audit_annotations)]
    expressions += [r.message_expression for r in policy.validations if r.message_expression]
    expressions += [e for m in policy.mutations for e in (m.expression, m.condition) if e]
    return any("authorizer" in e.expression for e in expressions)


def _subject(review: ReviewInput) -> Subject:
    """The request's user as authorization checks see it."""
    user = review.user
    extra = {str(k): tuple(str(v) for v in (vs if isinstance(vs, list | tuple) else [vs]))
             for k, vs in user.extra.items()}
    return Subject(user.username, user.uid, tuple(user.groups), extra)


def _request_resource(review: ReviewInput) -> dict[str, str]:
    """``authorizer.requestResource``: the request's group, resource, subresource, namespace
    and name."""
    return {"group": review.resource.group, "resource": review.resource.resource,
            "subresource": review.subresource, "namespace": review.namespace or "",
            "name": review.name}


def _value(policy: Policy, rule: Rule, kind: str, activation: RequestActivation, run: _Run,
           point: EvaluationPoint) -> Any:
    """``rule``'s expression evaluated, or :data:`_FAILED` with an error result recorded:
    ``<kind> '<name>' failed to evaluate: <CEL error>`` (just ``<name> ...`` without ``kind``),
    for a native policy's validation the API server's ``expression '<source>' resulted in
    error: <CEL error>`` (validator.go; kube-apiserver 1.37 answers so)."""
    try:
        return activation.evaluate(rule.expression)
    except CelEvaluationError as exc:
        if not kind and policy.native:
            message = f"expression '{rule.expression.expression}' resulted in error: " \
                f"{exc.message}"
        else:
            what = f"{kind} {rule.name!r}" if kind else rule.name
            message = f"{what} failed to evaluate: {exc.message}"
        run.failure(policy, rule.name, rule.path, message, error=True, point=point)
        return _FAILED


def _annotate(policy: Policy, rule: Rule, value: Any, run: _Run,
              point: EvaluationPoint) -> None:
    """An auditAnnotation's value, as the API server's ``validator.go`` takes it: a string is
    stripped and published unless empty, null omits the annotation, any other type is an error
    (under the failurePolicy)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return
    if not isinstance(value, str):
        kind = "int" if type(value) is int else type(value).__name__
        run.failure(policy, rule.name, rule.path,
                    f"valueExpression '{rule.expression.expression}' resulted in unsupported "
                    f"return type: {kind}. Return type must be either string or null.",
                    error=True, point=point)
        return
    if point != EvaluationPoint.AUDIT:
        run.audit[audit_key(policy.name, rule.name)] = _bounded(value.strip())


def _budget(policy: Policy, activation: RequestActivation) -> int | None:
    """The cost budget of ``policy``'s validations on this request, or None when their
    estimates and those of its variables (charged to the budget at first use, as Kubernetes'
    composition context does) together are within it (nothing to count: the budget cannot run
    out)."""
    limit = activation.cost_limits.per_policy
    estimated = sum(rule.expression.estimated_cost
                    for rule in (*policy.validations, *policy.variables))
    return None if estimated <= limit else limit


def _params_path(policy: Policy) -> str:
    """Where a policy's params come from: its ``spec.params`` or its binding's ``paramRef``."""
    return "spec.paramRef" if policy.native else "spec.params"


def _skipped(policy: Policy, condition: Rule) -> RuleResult:
    return RuleResult(policy.name, condition.name, condition.path, RuleOutcome.SKIP,
                      f"matchCondition {condition.name!r} is false")


def _describe(exc: Exception) -> str:
    """An exception in one line, bounded: messages may embed object fragments."""
    return shortened(f"{type(exc).__name__}: {exc}", 300)


def _named(rules: Sequence[Rule]) -> list[tuple[str, Any]]:
    return [(rule.name, rule.expression) for rule in rules]
