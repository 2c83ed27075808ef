"""The compiled policy model: what the loader builds and the engine runs.

Owns the frozen shapes of a loaded policy set — match rules, CEL rules already compiled, mutations,
exceptions — shared by GPUPolicy documents and native ValidatingAdmissionPolicy /
MutatingAdmissionPolicy (+ Binding) objects, which the loader maps onto the same shapes so the
engine has one code path. Field meanings follow the Kubernetes API reference for
``admissionregistration.k8s.io/v1``.

Must not parse files or evaluate anything.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from policies.cel.runtime import CompiledExpression
from policies.vocabulary import FailurePolicy, ValidationAction

if TYPE_CHECKING:
    from policies.policy.quota import Quota


@dataclass(frozen=True)
class Origin:
    """Where a policy came from: file, 0-based document index, and its 1-based line if known."""

    source: str
    index: int
    line: int | None = None

    def at(self, path: str, line: int | None = None) -> str:
        """``file:line: document N: path`` for messages."""
        where = f"{self.source}:{line}" if line else self.source
        return f"{where}: document {self.index}: {path}" if path else \
            f"{where}: document {self.index}"


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry of a label selector."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector; the empty selector matches everything."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, Any]) -> bool:
        """Whether ``labels`` satisfy every term (Kubernetes label-selector semantics)."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.requirements:
            present = req.key in labels
            key_value = labels.get(req.key)
            if req.operator == "In" and (not present or key_value not in req.values):
                return False
            if req.operator == "NotIn" and present and key_value in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True)
class ResourceRule:
    """One rule of ``matchConstraints.resourceRules`` (``*`` wildcards allowed)."""

    api_groups: tuple[str, ...] = ("*",)
    api_versions: tuple[str, ...] = ("*",)
    resources: tuple[str, ...] = ("*",)
    operations: tuple[str, ...] = ("*",)
    resource_names: tuple[str, ...] = ()
    # GPUPolicy matching pods (as its default does): also any kind the workload registry does
    # not model, once a structural search finds what makes pods in it ("kind not modelled")
    unmodelled_workloads: bool = False
    # matchPolicy Equivalent (a native policy's default): a request for the same group and
    # resource through another version matches too; the object is judged as sent, since
    # gpuguard cannot convert between versions (the API server converts for its webhook).
    any_version: bool = False


@dataclass(frozen=True)
class Subject:
    """A user, group or service account (``namespace`` empty: any namespace)."""

    kind: str
    name: str
    namespace: str = ""


@dataclass(frozen=True)
class Match:
    """What a policy applies to; every given part must match.

    ``rules`` / ``exclude_rules`` select resources and operations; selectors use the namespace's and
    the object's labels; ``namespaces`` / ``exclude_namespaces`` name namespaces directly;
    ``subjects`` / ``exclude_subjects`` the requesting user.
    """

    rules: tuple[ResourceRule, ...]
    narrowing_rules: tuple[ResourceRule, ...] = ()  # a binding's matchResources: must match too
    exclude_rules: tuple[ResourceRule, ...] = ()
    namespace_selector: LabelSelector = field(default_factory=LabelSelector)
    object_selector: LabelSelector = field(default_factory=LabelSelector)
    namespaces: tuple[str, ...] = ()
    exclude_namespaces: tuple[str, ...] = ()
    subjects: tuple[Subject, ...] = ()
    exclude_subjects: tuple[Subject, ...] = ()
    namespaced: bool | None = None  # True: namespaced requests only; False: cluster-scoped only


@dataclass(frozen=True)
class Rule:
    """A compiled CEL rule: a validation, matchCondition, variable or audit annotation.

    ``name`` is the rule's name (or ``validations[i]``); ``path`` its field path in the file.
    """

    name: str
    path: str
    expression: CompiledExpression
    message: str | None = None
    message_expression: CompiledExpression | None = None
    reason: str = "Forbidden"


@dataclass(frozen=True)
class Mutation:
    """One mutation: a CEL expression returning RFC 6902 operations, or a declarative shortcut.

    ``shortcut`` is ``(name, argument)`` for ``addToleration``, ``setRuntimeClassName``,
    ``setSchedulerName``, ``setLabel``, ``setAnnotation`` or ``setNodeSelector``; ``condition`` an
    optional CEL guard. ``patch_type`` is a native policy's ``patchType`` (``JSONPatch``, whose
    value may hold ``Object`` literals, or ``ApplyConfiguration``: an ``Object`` merged into the
    object, :mod:`policies.policy.apply`); "" for a GPUPolicy's RFC 6902 expression.
    """

    name: str
    path: str
    expression: CompiledExpression | None = None
    shortcut: tuple[str, Any] | None = None
    condition: CompiledExpression | None = None
    patch_type: str = ""


@dataclass(frozen=True)
class Exception_:
    """A documented exemption: objects it matches are skipped, and listed as exempted."""

    namespaces: tuple[str, ...]
    names: tuple[str, ...]
    labels: Mapping[str, str]
    reason: str
    expires: datetime.date | None

    def applies(self, namespace: str | None, name: str, labels: Mapping[str, Any],
                today: datetime.date) -> bool:
        """Whether it exempts this object today (an expired exception exempts nothing)."""
        if self.expires is not None and today > self.expires:
            return False
        if self.namespaces and namespace not in self.namespaces:
            return False
        if self.names and name not in self.names:
            return False
        return all(labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class Policy:
    """One loaded policy instance (a GPUPolicy, or a native policy bound by one binding and param).

    Attributes:
        name: policy name (``policy/binding`` for native bindings).
        kind: ``GPUPolicy``, ``ValidatingAdmissionPolicy`` or ``MutatingAdmissionPolicy``.
        origin: where it was defined.
        failure_policy: ``Fail`` or ``Ignore``; actions: validationActions (in file order).
        params: the params object (inline GPUPolicy params or a bound param object).
        param_missing: a binding's paramRef gives no params: ``Allow`` (its
            parameterNotFoundAction: the instance does nothing), or the API server's error that
            fails the request under the failurePolicy
            (:data:`~policies.policy.loader.NO_PARAMS_DENY`, a namespaced paramRef on a
            cluster-scoped request).
        reinvocation: ``IfNeeded`` runs the policy's mutations once more when a later policy
            changed the object after them (``reinvocationPolicy``); ``Never`` otherwise.
    """

    name: str
    kind: str
    origin: Origin
    description: str
    match: Match
    failure_policy: FailurePolicy
    actions: tuple[ValidationAction, ...]
    match_conditions: tuple[Rule, ...] = ()
    variables: tuple[Rule, ...] = ()
    validations: tuple[Rule, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    audit_annotations: tuple[Rule, ...] = ()
    exceptions: tuple[Exception_, ...] = ()
    params: Any = None
    param_missing: str | None = None
    reinvocation: str = "Never"  # a MutatingAdmissionPolicy's reinvocationPolicy

    @property
    def native(self) -> bool:
        """Whether this is a ValidatingAdmissionPolicy or MutatingAdmissionPolicy, run with the
        API server's semantics and texts, rather than a GPUPolicy."""
        return self.kind != "GPUPolicy"


@dataclass(frozen=True)
class PolicySet:
    """Everything loaded from policy files, in file order; evaluation follows this order.

    Attributes:
        digest: ``sha256:<hex>`` of the bytes the set was built from
            (:attr:`policies.sources.Snapshot.digest`); "" when built from documents in memory.
        contents: per source file, the documents the set took from it (``GPUPolicy/name``,
            ``ValidatingAdmissionPolicyBinding/name``, ``GPUQuota/name``, a param object's
            ``Kind/namespace/name``), in file order: what a reload compares to notice a file
            that lost a policy.
    """

    policies: tuple[Policy, ...]
    warnings: tuple[str, ...] = ()
    quotas: tuple[Quota, ...] = ()  # GPUQuota documents (policies.policy.quota), in file order
    digest: str = ""
    contents: tuple[tuple[str, tuple[str, ...]], ...] = ()
    skipped: tuple[str, ...] = ()  # under --skip-broken: ``file: document N`` of each left out

    def names(self) -> tuple[str, ...]:
        """Policy names, in evaluation order."""
        return tuple(p.name for p in self.policies)

    def counts(self) -> str:
        """What the set holds, as lint, ``/readyz`` and the logs say it: ``3 policies``, ``0
        policies and 1 GPUQuota(s)`` — a GPUQuota is a policy source, so a quota-only set is
        never described as empty."""
        policies = len(self.policies)
        return (f"{policies} polic{'y' if policies == 1 else 'ies'}"
                + (f" and {len(self.quotas)} GPUQuota(s)" if self.quotas else ""))

    @property
    def empty(self) -> bool:
        """Whether the set holds neither a policy nor a GPUQuota: it would allow everything."""
        return not self.policies and not self.quotas


def _canonical(value: Any) -> Any:
    """Plain, order-stable data of a model value: dataclass fields but ``origin`` and those left
    out of ``repr`` (compiled programs), a compiled expression as its text, enums by value, sets
    sorted."""
    if isinstance(value, CompiledExpression):
        return value.expression
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in fields(value)
                if f.repr and f.name != "origin"}
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, default=str))
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value


def policy_digest(policy: Policy) -> str:
    """``sha256:<hex>`` of what ``policy`` says — match, actions, CEL text, messages, params,
    exceptions — but not where it was read (``origin``): the same policy moved to another file
    or document keeps its digest, any change of its rules gives another. What the audit history
    compares to tell a finding its policy's change removed from one its workload fixed."""
    text = json.dumps(_canonical(policy), sort_keys=True, default=str, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def rule_names(policy: Policy) -> tuple[str, ...]:
    """The names of the rules a finding of ``policy`` can name (validations, mutations, audit
    annotations, match conditions, variables), in that order."""
    return tuple(rule.name for group in (policy.validations, policy.mutations,
                                         policy.audit_annotations, policy.match_conditions,
                                         policy.variables) for rule in group)
