"""Policy files in, a compiled :class:`~policies.policy.model.PolicySet` (and every error) out.

Owns: checking ``GPUPolicy`` documents against the JSON Schema shipped in the package
(``policies/data/gpupolicy.schema.json``; ``GPUPolicyException`` documents against
``gpupolicyexception.schema.json``, each adding an exception for its namespace to the GPUPolicies
it names, like an inline ``spec.exceptions`` entry with that one namespace), mapping native
``admissionregistration.k8s.io`` ValidatingAdmissionPolicy / MutatingAdmissionPolicy objects and
their Bindings (with param objects from the same files) onto the same model, and compiling every
CEL expression once. All errors are collected, each naming the file, line, document index and
field path (``spec.validations[2].expression``) and, for CEL, the expression's own line and
column — loading never stops at the first. A source is whole or refused: a file with no document,
or none the set uses, is an error (:func:`load_snapshot`), and the set built from a
:class:`~policies.sources.Snapshot` carries its digest and, per file, what it took from it
(``PolicySet.contents``: what a reload compares).

Must not evaluate policies, read the clock or touch files other than through
:mod:`policies.sources`.
"""

from __future__ import annotations

import datetime
import difflib
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import jsonschema
import yaml

from policies.cel import checked_expr as cel_checked
from policies.cel import scanner as cel_scanner
from policies.cel.gpu import GPU_FIELDS
from policies.cel.library import homogeneous
from policies.cel.runtime import CelCompileError, CelEnvironment, CompiledExpression
from policies.facts.openapi import kinds as apply_kinds
from policies.facts.workload_kinds import DEFAULT_RESOURCES
from policies.json_fields import mapping_at
from policies.policy.api_validation import api_problems
from policies.policy.apply import TYPE_KEY
from policies.policy.model import (
    Exception_,
    LabelSelector,
    Match,
    Mutation,
    Origin,
    Policy,
    PolicySet,
    Requirement,
    ResourceRule,
    Rule,
    Subject,
)
from policies.policy.mutation import SHORTCUTS
from policies.policy.quota import QUOTA_KIND, Quota, parse_quota
from policies.policy.revisions import document_identity
from policies.sources import (
    Document,
    LoadError,
    Snapshot,
    decode,
    file_documents,
    load_package_yaml,
    read_snapshot,
)
from policies.value_words import described
from policies.vocabulary import FailurePolicy, ValidationAction, parsed

GPUPOLICY_API = "gpuguard.io/v1alpha1"
EXCEPTION_KIND = "GPUPolicyException"
ADMISSION_GROUP = "admissionregistration.k8s.io"

@dataclass(frozen=True)
class PolicyError:
    """One problem in a policy file; ``str()`` is the full one-line message."""

    source: str
    index: int | None
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        """``file:line: document N: field.path: message``."""
        where = f"{self.source}:{self.line}" if self.line else self.source
        if self.index is not None:
            where += f": document {self.index}"
        if self.path:
            where += f": {self.path}"
        return f"{where}: {self.message}"


@functools.cache
def _schema_validator(name: str = "gpupolicy.schema.json") -> jsonschema.protocols.Validator:
    schema = load_package_yaml("policies.data", name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class _Builder:
    """Collects errors for one document while building its policy."""

    def __init__(self, document: Document, environment: CelEnvironment,
                 errors: list[PolicyError]) -> None:
        self.document = document
        self.environment = environment
        self.errors = errors
        self.expressions: list[tuple[str, str]] = []  # (field path, source) of each compiled one

    def error(self, path: str, message: str) -> None:
        self.errors.append(PolicyError(self.document.source, self.document.index,
                                       self.document.line_of(path), path, message))

    def compile(self, expression: Any, path: str,
                written: str | None = None) -> CompiledExpression | None:
        """Compile a policy's expression; ``written`` is its text before a rewrite (default: the
        expression), which gets Kubernetes' creation-time checks."""
        if not isinstance(expression, str) or not expression.strip():
            # The schema check has reported it already (a string, not empty, is required).
            if isinstance(expression, str):
                self.error(path, "expected a CEL expression, got an empty string")
            return None
        self.expressions.append((path, expression))
        try:
            compiled = self.environment.compile(
                expression, field_path=path, written=expression if written is None else written,
                typed_aggregates=self.document.body.get("kind") in _NATIVE_POLICIES)
        except CelCompileError as exc:
            for issue in exc.issues:
                where = f"expression line {issue.line}, column {issue.column}" if issue.line > 0 \
                    else "the expression as a whole"
                hint = " (the CEL parser allows 32 levels of nesting, e.g. 32 chained '+'; " \
                    "split it into variables)" if "recursion limit" in issue.message else ""
                self.error(path, f"CEL error at {where}: {issue.message}{hint}")
            return None
        limit = self.environment.cost_limits.estimated
        if limit and compiled.estimated_cost > limit \
                and self._gpu_policy_estimate(compiled) > limit:
            # Kubernetes refuses a CRD validation rule over StaticEstimatedCostLimit; a VAP or
            # MAP it does not (everything there is dyn): those are held to the runtime limits.
            cost = self._gpu_policy_estimate(compiled)
            self.error(path, f"estimated rule cost exceeds budget by factor of "
                             f"{cost / limit:.1f}x (estimated cost {cost:,}, limit "
                             f"{limit:,}; see docs/cel.md "
                             f"'Cost': bound a list with a size check, or split the rule)")
            return None
        return compiled

    def _gpu_policy_estimate(self, compiled: CompiledExpression) -> int:
        """A GPUPolicy expression's estimate with its inline ``spec.params`` known (0 for other
        kinds: Kubernetes does not refuse a VAP or MAP by estimated cost, everything there is
        ``dyn``; those are held to the runtime limits only)."""
        body = self.document.body
        if body.get("kind") != "GPUPolicy":
            return 0
        spec = body.get("spec")
        params = spec.get("params") if isinstance(spec, dict) else None
        return compiled.estimate({"params": params} if params is not None else {})

    def check_references(self, params: Any, variables: Sequence[str], *,
                         native: bool = False, param_kind: bool = True) -> None:
        """Static checks CEL's type checker cannot make on ``dyn`` data: every ``gpu.<field>``
        is a GPU fact, every ``variables.<name>`` is declared (before its use, for variables),
        for inline GPUPolicy params every ``params.<key>`` exists, and a native policy without
        ``paramKind`` does not read ``params`` (kube-apiserver does not declare it then). A typo
        here would otherwise fail at admission time, and under failurePolicy Fail deny every
        request."""
        for path, text in self.expressions:
            if native and not param_kind and (uses := cel_scanner.references(text, "params")):
                line = text.count("\n", 0, uses[0].start) + 1
                column = uses[0].start - (text.rfind("\n", 0, uses[0].start) + 1) + 1
                self.error(path, f"CEL error at expression line {line}, column {column}: "
                                 "undeclared reference to 'params' (in container '')")
            # Names a comprehension or cel.bind binds are local there, not the facts.
            for field in cel_scanner.fields(text, "gpu"):
                if field not in GPU_FIELDS:
                    close = difflib.get_close_matches(field, GPU_FIELDS, n=1)
                    hint = f" (did you mean gpu.{close[0]}?)" if close else ""
                    self.error(path, f"gpu.{field} is not a GPU fact{hint}; see docs/cel.md")
            visible = variables
            if path.startswith("spec.variables["):
                visible = variables[: int(path.split("[", 1)[1].split("]", 1)[0])]
            for name in cel_scanner.fields(text, "variables"):
                if name not in visible:
                    where = "declared" if name not in variables else "declared before this one"
                    self.error(path, f"variables.{name} is not {where} in spec.variables")
            if not native and isinstance(params, Mapping | type(None)):
                for key in cel_scanner.fields(text, "params"):
                    if key not in (params or {}):
                        known = ", ".join(sorted(params or {})) or "none"
                        self.error(path, f"params.{key} is not in spec.params (keys: {known})")

    def typed(self, compiled: CompiledExpression | None, path: str, expected: Sequence[str],
              *, native: bool) -> CompiledExpression | None:
        """``compiled`` when its type is one of ``expected`` (:func:`result_type_error`);
        else the error is reported and None returned."""
        if compiled is None:
            return None
        problem = result_type_error(compiled, expected, native=native)
        if problem is not None:
            self.error(path, problem)
            return None
        return compiled

    def rules(self, items: Any, path: str, key: str = "expression", *,
              native: bool = False) -> tuple[Rule, ...]:
        """The compiled rules of a list (validations, matchConditions, variables, audit
        annotations), with the API server's checks of their types and messages."""
        expected = {"expression": ("bool",), "valueExpression": ("string", "null_type")}
        rules = []
        for i, item in enumerate(items if isinstance(items, list) else []):
            item = item if isinstance(item, Mapping) else {}
            where = f"{path}[{i}]"
            compiled = self.compile(item.get(key), f"{where}.{key}")
            if not path.endswith("variables"):
                compiled = self.typed(compiled, f"{where}.{key}", expected[key], native=native)
            message_expression = None
            if "messageExpression" in item:
                message_expression = self.typed(
                    self.compile(item["messageExpression"], f"{where}.messageExpression"),
                    f"{where}.messageExpression", ("string",), native=native)
            message = item.get("message")
            # the API server's creation checks; a GPUPolicy message may hold a line break (the
            # webhook writes it as a space in a warning)
            if native and isinstance(message, str) and "\n" in message:
                self.error(f"{where}.message", "must not contain line breaks")
            elif native and isinstance(message, str) and not message.strip():
                self.error(f"{where}.message", "must be non-empty if specified")
            if compiled is not None:
                rules.append(Rule(
                    name=str(item.get("name") or item.get("key")
                             or where.rsplit(".", maxsplit=1)[-1]),
                    path=f"{where}.{key}", expression=compiled,
                    message=item.get("message"), message_expression=message_expression,
                    reason=str(item.get("reason") or "Forbidden"),
                ))
        names = [r.name for r in rules]
        if native and path.endswith("variables") and len(set(names)) < len(names):
            rules = self._redefined(rules, path)
        elif key == "expression" and path.endswith(("variables", "matchConditions")):
            for name in {n for n in names if names.count(n) > 1}:
                self.error(path, f"name {name!r} is used more than once")
        return tuple(rules)


    def _redefined(self, rules: list[Rule], path: str) -> list[Rule]:
        """A native policy's variables where a name is defined more than once: kube-apiserver
        1.37 stores such a policy and reads every ``variables.<name>`` from the last definition
        (each definition compiles; the earlier ones are never evaluated). The last one takes the
        first one's place, where the variables between them can read it; refused when it reads
        one of those itself (it could not run before them)."""
        names = [r.name for r in rules]
        last = {r.name: r for r in rules}
        kept = [last[name] for i, name in enumerate(names) if name not in names[:i]]
        order = [r.name for r in kept]
        for position, rule in enumerate(kept):
            later = set(order[position + 1:]) & set(
                cel_scanner.fields(rule.expression.expression, "variables"))
            for name in sorted(later):
                self.error(path, f"variables.{rule.name} is defined again in {rule.path}, which "
                                 f"reads variables.{name}, declared between the two; Kubernetes "
                                 f"reads variables.{rule.name} from its last definition, and "
                                 "gpuguard cannot run that one before the variables it follows")
        return kept


# Variables whose type Kubernetes declares but gpuguard's environment has as ``dyn``
# (``request`` and ``namespaceObject`` are typed objects there, ``variables.<name>`` has its
# expression's type, ``authorizer`` its library's) or that Kubernetes does not have at all: an
# expression reading one may be ``dyn`` here and typed in the API server.
_TYPED_ELSEWHERE: Final = ("request", "namespaceObject", "variables", "authorizer", "gpu",
                           "quota")


def cel_go_type(name: str) -> str:
    """A type as gpuguard's runtime names it (``map<string, int>``, ``null``) in cel-go's words,
    which the API server's messages use (``map(string, int)``, ``null_type``)."""
    return "null_type" if name == "null" else name.replace("<", "(").replace(">", ")")


def result_type_error(compiled: CompiledExpression, expected: Sequence[str], *,
                      native: bool) -> str | None:
    """The API server's return-type refusal for an expression that must have one of the
    ``expected`` types (cel-go names: ``bool``, ``string``, ``null_type``), or None.

    Kubernetes compares types exactly (``plugin/cel/compile.go``: ``must evaluate to bool but
    got dyn``). gpuguard's ``dyn`` is refused only for ``native`` policies whose expression
    reads none of :data:`_TYPED_ELSEWHERE` (there the API server may know a concrete type);
    a concrete type other than those expected is refused for every policy (it could only fail
    at admission).
    """
    got = cel_go_type(compiled.output_type)
    if got in expected:
        return None
    if got == "dyn" and (not native or any(
            cel_scanner.uses(compiled.expression, name) for name in _TYPED_ELSEWHERE)):
        return None
    if len(expected) == 1:
        return f"must evaluate to {expected[0]} but got {got}"
    return f"must evaluate to one of [{' '.join(expected)}] but got {got}"


def _selector(value: Any) -> LabelSelector:
    value = value if isinstance(value, Mapping) else {}
    labels = mapping_at(value, "matchLabels")
    requirements = tuple(
        Requirement(str(e.get("key")), str(e.get("operator")),
                    tuple(str(v) for v in e.get("values") or ()))
        for e in value.get("matchExpressions") or () if isinstance(e, Mapping)
    )
    return LabelSelector({str(k): str(v) for k, v in labels.items()}, requirements)


def _subjects(items: Any) -> tuple[Subject, ...]:
    return tuple(Subject(str(s["kind"]), str(s["name"]), str(s.get("namespace") or ""))
                 for s in items or () if isinstance(s, Mapping))


def _gpupolicy_match(match: Mapping[str, Any]) -> Match:
    resources = tuple(match.get("resources") or DEFAULT_RESOURCES)
    operations = tuple(match.get("operations") or ("CREATE", "UPDATE"))
    subjects = mapping_at(match, "subjects")
    return Match(
        rules=(ResourceRule(resources=resources, operations=operations,
                            unmodelled_workloads="pods" in resources),),
        namespace_selector=_selector(match.get("namespaceSelector")),
        object_selector=_selector(match.get("objectSelector")),
        namespaces=tuple(match.get("namespaces") or ()),
        exclude_namespaces=tuple(match.get("excludeNamespaces") or ()),
        subjects=_subjects(subjects.get("include")),
        exclude_subjects=_subjects(subjects.get("exclude")),
    )


def _exceptions(items: Any, builder: _Builder) -> tuple[Exception_, ...]:
    result = []
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, Mapping) or "reason" not in item:
            continue  # the schema check reports it
        expires = None
        if item.get("expires"):
            try:
                expires = datetime.date.fromisoformat(str(item["expires"]))
            except ValueError:
                builder.error(f"spec.exceptions[{i}].expires",
                              f"{item['expires']!r} is not a date (expected YYYY-MM-DD)")
                continue
        result.append(Exception_(
            namespaces=tuple(item.get("namespaces") or ()), names=tuple(item.get("names") or ()),
            labels=dict(item.get("labels") or {}), reason=str(item["reason"]), expires=expires,
        ))
    return tuple(result)


def _policy_exception(document: Document, builder: _Builder,
                      ) -> tuple[tuple[str, ...], Exception_] | None:
    """A GPUPolicyException checked against its schema: ``(policy names, exception)``, the
    exception limited to the document's namespace; None on any error."""
    before = len(builder.errors)
    _schema_errors(document, builder, "gpupolicyexception.schema.json")
    namespace = mapping_at(document.body, "metadata").get("namespace")
    if not namespace:
        builder.error("metadata.namespace", f"required: a {EXCEPTION_KIND} exempts the objects "
                      "of its own namespace only (kubectl apply -n does not reach a file)")
    if len(builder.errors) != before:
        return None
    spec = mapping_at(document.body, "spec")
    built = _exceptions([{**spec, "namespaces": [namespace]}], builder)
    if not built:  # the schema's date check and the loader's agree; this is the last guard
        return None
    return tuple(str(name) for name in spec["policies"]), built[0]


def _mutations(items: Any, builder: _Builder, base: str) -> tuple[Mutation, ...]:
    result = []
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, Mapping):
            continue  # the schema check reports it
        where = f"{base}[{i}]"
        name = str(item.get("name") or f"mutations[{i}]")
        condition = builder.compile(item["condition"], f"{where}.condition") \
            if "condition" in item else None
        if "expression" in item:
            compiled = builder.compile(item["expression"], f"{where}.expression")
            if compiled is not None:
                result.append(Mutation(name, f"{where}.expression", expression=compiled,
                                       condition=condition))
            continue
        for key in SHORTCUTS:
            if key in item:
                result.append(Mutation(name, f"{where}.{key}", shortcut=(key, item[key]),
                                       condition=condition))
    return tuple(result)


def _schema_errors(document: Document, builder: _Builder,
                   schema: str = "gpupolicy.schema.json") -> None:
    """Report every JSON Schema error of a gpuguard document (GPUPolicy, GPUQuota)."""
    for error in sorted(_schema_validator(schema).iter_errors(document.body),
                        key=lambda e: [str(p) for p in e.absolute_path]):
        path = _path(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            extra = sorted(set(error.instance) - set(_schema_properties(error)))
            path = f"{path}.{extra[0]}" if path and extra else (extra[0] if extra else path)
        builder.error(path, _schema_message(error, _subject(document)))


def _subject(document: Document) -> str:
    """``Kind 'name'`` of a document, for a message about the object as a whole."""
    name = mapping_at(document.body, "metadata").get("name")
    return f"{document.body.get('kind')} {str(name or '')!r}"


def _build_quota(document: Document, builder: _Builder) -> Quota | None:
    """Check a GPUQuota against ``gpuquota.schema.json`` and build it; None on any error."""
    before = len(builder.errors)
    _schema_errors(document, builder, "gpuquota.schema.json")
    if len(builder.errors) != before:
        return None
    quota, problems = parse_quota(document.body, document.location)
    for path, message in problems:
        builder.error(path, message)
    return quota


def _build_gpupolicy(document: Document, builder: _Builder) -> Policy | None:
    """Check a GPUPolicy against the schema and compile its CEL; None when anything is wrong.

    CEL is compiled even when the schema check fails, so one run lists every error.
    """
    before = len(builder.errors)
    _schema_errors(document, builder)
    body = document.body
    spec = mapping_at(body, "spec")
    metadata = mapping_at(body, "metadata")
    name = str(metadata.get("name", ""))
    policy = Policy(
        name=name,
        kind="GPUPolicy",
        origin=Origin(document.source, document.index, document.line_of("")),
        description=str(spec.get("description") or ""),
        match=_gpupolicy_match(mapping_at(spec, "match")),
        failure_policy=parsed(FailurePolicy, spec.get("failurePolicy"), FailurePolicy.FAIL),
        actions=_actions(spec.get("validationActions")),
        match_conditions=builder.rules(spec.get("matchConditions"), "spec.matchConditions"),
        variables=builder.rules(spec.get("variables"), "spec.variables"),
        validations=builder.rules(spec.get("validations"), "spec.validations"),
        mutations=_mutations(spec.get("mutations"), builder, "spec.mutations"),
        audit_annotations=builder.rules(spec.get("auditAnnotations"), "spec.auditAnnotations",
                                        "valueExpression"),
        exceptions=_exceptions(spec.get("exceptions"), builder),
        params=spec.get("params"),
    )
    builder.check_references(spec.get("params"), _declared(spec))
    return policy if len(builder.errors) == before else None


def _schema_properties(error: jsonschema.ValidationError) -> Mapping[str, Any]:
    """The ``properties`` of the subschema that raised ``error`` (none for a boolean schema)."""
    schema = error.schema
    return schema.get("properties", {}) if isinstance(schema, Mapping) else {}


_JSON_TYPE_WORDS: Final = {"string": "a string", "integer": "an integer", "number": "a number",
                           "boolean": "a boolean", "object": "a map", "array": "a list",
                           "null": "null"}


def _schema_message(error: jsonschema.ValidationError, subject: str = "the object") -> str:
    """A jsonschema error in words a policy author understands (``subject``: ``Kind 'name'``
    of the document, named where the error is about the object as a whole)."""
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        extra = sorted(set(error.instance) - set(_schema_properties(error)))
        allowed = ", ".join(sorted(_schema_properties(error)))
        return f"unknown field(s) {', '.join(extra)} (allowed: {allowed})"
    if error.validator == "required":
        return error.message.replace("is a required property", "is required")
    if error.validator == "type":
        kinds = error.validator_value if isinstance(error.validator_value, list) \
            else [error.validator_value]
        expected = " or ".join(_JSON_TYPE_WORDS.get(str(k), str(k)) for k in kinds)
        return f"expected {expected}, got {described(error.instance)}"
    if error.validator == "enum" and isinstance(error.validator_value, list):
        found = repr(error.instance) if isinstance(error.instance, str) \
            else described(error.instance)
        return f"{found} is not one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "const":
        return f"expected {error.validator_value!r}, got {described(error.instance)}"
    if error.validator == "maxLength" and isinstance(error.instance, str):
        return f"longer than {error.validator_value} characters ({len(error.instance)})"
    if error.validator in ("oneOf", "anyOf") and isinstance(error.instance, Mapping) and \
            isinstance(error.validator_value, list):
        options = [next(iter(s.get("required", [])), "?") for s in error.validator_value]
        if error.validator == "anyOf" and all("properties" in s for s in error.validator_value):
            # Lists of which one must not be empty (the spec's rules): as the API server words
            # it for ValidatingAdmissionPolicy and MutatingAdmissionPolicy.
            listed = " or ".join(filter(None, (", ".join(options[:-1]), options[-1])))
            return f"{listed} must contain at least one item: {subject} would have no effect"
        how = "exactly one" if error.validator == "oneOf" else "at least one"
        return f"expected {how} of {', '.join(options)}"
    return error.message


# --- native admissionregistration.k8s.io policies -------------------------------------------


def _resource_rules(items: Any, *, equivalent: bool = False) -> tuple[ResourceRule, ...]:
    """``resourceRules`` / ``excludeResourceRules`` items; ``equivalent``: the matchResources'
    ``matchPolicy`` is ``Equivalent`` (the default), so a rule covers its group and resource in
    every version (Kubernetes API reference, MatchResources.matchPolicy)."""
    rules = []
    for item in items or ():
        if not isinstance(item, Mapping):
            continue
        rules.append(ResourceRule(
            api_groups=tuple(item.get("apiGroups") or ("*",)),
            api_versions=tuple(item.get("apiVersions") or ("*",)),
            resources=tuple(item.get("resources") or ("*",)),
            operations=tuple(item.get("operations") or ("*",)),
            resource_names=tuple(item.get("resourceNames") or ()),
            any_version=equivalent,
        ))
    return tuple(rules)


def _native_match(constraints: Any) -> Match:
    constraints = constraints if isinstance(constraints, Mapping) else {}
    equivalent = constraints.get("matchPolicy", "Equivalent") != "Exact"
    return Match(
        rules=_resource_rules(constraints.get("resourceRules"), equivalent=equivalent),
        exclude_rules=_resource_rules(constraints.get("excludeResourceRules"),
                                      equivalent=equivalent),
        namespace_selector=_selector(constraints.get("namespaceSelector")),
        object_selector=_selector(constraints.get("objectSelector")),
    )


def _combine(policy: Match, binding: Match | None) -> Match:
    """A binding's matchResources narrows the policy's matchConstraints (both must match)."""
    if binding is None:
        return policy
    return Match(
        rules=policy.rules,
        narrowing_rules=binding.rules,
        exclude_rules=policy.exclude_rules + binding.exclude_rules,
        namespace_selector=LabelSelector(
            {**policy.namespace_selector.match_labels, **binding.namespace_selector.match_labels},
            policy.namespace_selector.requirements + binding.namespace_selector.requirements),
        object_selector=LabelSelector(
            {**policy.object_selector.match_labels, **binding.object_selector.match_labels},
            policy.object_selector.requirements + binding.object_selector.requirements),
    )


def rewrite_jsonpatch_literals(expression: str) -> str:
    """Turn MutatingAdmissionPolicy's typed ``JSONPatch{op: ..., path: ...}`` into CEL maps.

    The runtime cannot construct the ``JSONPatch`` type, but a map with the same fields carries the
    same operation. Field names are quoted only at the top level of each literal and outside
    string literals; everything else is copied as written. ``Object{...}`` literals are rewritten
    too (:func:`rewrite_typed_literals`).
    """
    return rewrite_typed_literals(expression)


def rewrite_typed_literals(expression: str) -> str:
    """``JSONPatch{...}`` and ``Object{...}`` / ``Object.spec.x{...}`` literals as CEL maps.

    The runtime cannot declare Kubernetes' patch types (``JSONPatch``, and ``Object`` with its
    dotted field-path type names). A ``JSONPatch`` literal becomes the map of its fields; an
    ``Object`` literal the map of its fields plus the key
    :data:`~policies.policy.apply.TYPE_KEY` holding its type name, which
    :func:`policies.policy.apply.typed_value` checks (the API server's "type names match field
    path names" check) and removes before the value is used.
    """
    return _rewritten_literals(expression)[0]


def _rewritten_literals(expression: str
                        ) -> tuple[str, dict[int, tuple[str, int]], list[tuple[int, int, int]]]:
    """:func:`rewrite_typed_literals`'s text; for each ``JSONPatch`` field the offset of its
    quoted name in that text -> (field name, offset of its ``:`` in ``expression``); and the
    pieces the rewrite kept, ``(offset in the text, offset in expression, length)``."""
    edits: list[tuple[int, int, str]] = []
    patch_fields: set[tuple[int, int]] = set()
    for root in ("JSONPatch", "Object"):
        for literal in cel_scanner.typed_literals(expression, root):
            edits.append((literal.start, literal.end, ""))
            edits += [(start, end, f'"{expression[start:end]}"') for start, end in literal.fields]
            if root == "JSONPatch":
                patch_fields.update(literal.fields)
            if root == "Object":
                brace = expression.index("{", literal.end)
                empty = expression[brace + 1:].lstrip().startswith("}")
                edits.append((brace + 1, brace + 1,
                              f'"{TYPE_KEY}": "{literal.type_name}"' + ("" if empty else ", ")))
    out, position, length, keys = [], 0, 0, {}
    kept: list[tuple[int, int, int]] = []
    for start, end, text in sorted(edits):
        piece = expression[position:start]
        kept.append((length, position, len(piece)))
        length += len(piece)
        if (start, end) in patch_fields:
            keys[length] = (expression[start:end], expression.index(":", end))
        out += [piece, text]
        length += len(text)
        position = end
    kept.append((length, position, len(expression) - position))
    out.append(expression[position:])
    return "".join(out), keys, kept


_JSONPATCH_STRINGS: Final = ("op", "path", "from")  # Kubernetes' JSONPatch type; value is dyn


def _jsonpatch_field_errors(written: str, compiled: CompiledExpression) -> list[tuple[int, str]]:
    """The API server's type check of ``JSONPatch{...}`` literal fields (k8s.io/apiserver
    ``mutating/patch/json_patch.go``: ``op``, ``path`` and ``from`` are strings, ``value`` is
    any), which its checker makes when the policy is created and gpuguard's runtime cannot (the
    literals are maps there): ``(offset of the field's ':', message)`` in the checker's words,
    ``expected type of field 'path' is 'string' but provided type is 'int'``; an unknown field
    is ``expected type of field 'pat' is '' but provided type is 'string'``."""
    text, keys, kept = _rewritten_literals(written)
    checked = compiled.checked() if text == compiled.expression else None
    if checked is None:
        return []
    tree, positions, types = checked

    def typed_literal(node: cel_checked.Node) -> bool:
        return any(positions.get(key.id, -1) in keys or key.value == TYPE_KEY
                   for key in node.children[::2])

    def written_offset(offset: int) -> int:
        for out_start, start, size in kept:
            if out_start <= offset < out_start + size:
                return start + offset - out_start
        return 0

    # Kubernetes' homogeneous-literal rule on the rewritten maps too, but for the typed
    # literals (whose fields differ in type by design)
    found = [(written_offset(positions.get(ident, 0)), message) for ident, message
             in homogeneous.checked_errors(tree, types, skip=typed_literal)]
    stack = [tree]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.kind != "map":
            continue
        for entry, (key, value) in enumerate(zip(node.children[::2], node.children[1::2],
                                                 strict=True)):
            name, colon = keys.get(positions.get(key.id, -1), ("", -1))
            if colon < 0:
                continue
            provided = types.get(value.id, "dyn")
            if entry in node.optional and provided.startswith("optional_type("):
                provided = provided[len("optional_type("):-1]  # ``?op: optional.of('add')``
            if name not in (*_JSONPATCH_STRINGS, "value"):
                found.append((colon, f"expected type of field '{name}' is '' but provided type "
                                     f"is '{provided}'"))
            elif name != "value" and provided not in ("string", "dyn"):
                found.append((colon, f"expected type of field '{name}' is 'string' but provided "
                                     f"type is '{provided}'"))
    return sorted(found)


def _patch_type_error(patch_type: str, written: str, compiled: CompiledExpression) -> str | None:
    """The API server's return-type refusal of a mutation expression (``must evaluate to
    Object`` / ``list(JSONPatch)``), decided from the expression as written: the typed literals
    are maps in gpuguard's runtime, so the type is read from the source where the checker
    cannot tell it (an ``Object``: the expression is one ``Object{...}`` literal, or its value
    is a map built by other means and is checked at admission; a ``list(JSONPatch)``: the source
    writes ``JSONPatch{`` literals or reads ``variables``)."""
    got = cel_go_type(compiled.output_type)
    text = cel_scanner.code_only(written).strip()
    if patch_type == "ApplyConfiguration":
        literals = cel_scanner.typed_literals(written, "Object")
        whole = [lit for lit in literals if written[:lit.start].strip() == ""]
        if whole and whole[0].type_name != "Object":
            return f"must evaluate to Object but got {whole[0].type_name}"
        if whole or (got.startswith("map") and literals):
            return None
        if got == "dyn" and any(cel_scanner.uses(written, n) for n in _TYPED_ELSEWHERE):
            return None
        return f"must evaluate to Object but got {got}"
    if not got.startswith("list"):
        if got == "dyn" and any(cel_scanner.uses(written, n) for n in _TYPED_ELSEWHERE):
            return None
        shown = "JSONPatch" if text.startswith("JSONPatch") else got
        return f"must evaluate to list(JSONPatch) but got {shown}"
    if cel_scanner.typed_literals(written, "JSONPatch") or cel_scanner.uses(written, "variables"):
        return None
    return f"must evaluate to list(JSONPatch) but got {got}"


def _param_objects(documents: Sequence[Document], param_kind: Any) -> list[Mapping[str, Any]]:
    if not isinstance(param_kind, Mapping):
        return []
    return [d.body for d in documents
            if d.body.get("apiVersion") == param_kind.get("apiVersion")
            and d.body.get("kind") == param_kind.get("kind")]


NO_PARAMS_DENY: Final = ("failed to configure binding: no params found for policy binding with "
                         "`Deny` parameterNotFoundAction")
"""The API server's error when a binding's paramRef selects nothing and its action is Deny
(``policy/generic/policy_dispatcher.go``, ``CollectParams``); it follows the failurePolicy."""
_NAMESPACED_PARAM_KINDS: Final = frozenset({"v1/ConfigMap", "v1/Secret"})


@dataclass(frozen=True)
class _Bound:
    """One evaluation instance of a binding: its params (or why there are none) and the
    requests it is for (``namespaced``: True = namespaced requests only, False = cluster-scoped
    only; ``namespaces`` / ``exclude``: the request's namespace)."""

    params: Any = None
    missing: str | None = None
    namespaced: bool | None = None
    namespaces: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def _param_scope_namespaced(param_kind: Any, candidates: list[Mapping[str, Any]]) -> bool:
    """Whether the paramKind is namespaced: a built-in one gpuguard knows, or one whose objects
    in the input have a namespace (a custom resource's scope is in its CRD)."""
    kind = f"{param_kind.get('apiVersion')}/{param_kind.get('kind')}" \
        if isinstance(param_kind, Mapping) else ""
    return kind in _NAMESPACED_PARAM_KINDS or any(
        mapping_at(c, "metadata").get("namespace") for c in candidates)


def _bound_params(binding: Document, param_kind: Any, candidates: list[Mapping[str, Any]],
                  warnings: list[str]) -> list[_Bound]:
    """The instances of one binding, as ``CollectParams`` chooses params per request: a
    namespaced paramKind is looked up in ``paramRef.namespace``, else in the request's own
    namespace (a cluster-scoped request is then a configuration error); a name or a selector
    picks the objects (one instance per object); none found is ``parameterNotFoundAction``
    (Deny: :data:`NO_PARAMS_DENY`, under the failurePolicy; Allow: the binding does nothing)."""
    ref = (binding.body.get("spec") or {}).get("paramRef")
    if not isinstance(ref, Mapping) or not isinstance(param_kind, Mapping):
        return [_Bound()]
    action = str(ref.get("parameterNotFoundAction") or ValidationAction.DENY)
    missing = NO_PARAMS_DENY if action == ValidationAction.DENY else "Allow"
    namespaced = _param_scope_namespaced(param_kind, candidates)
    given = str(ref.get("namespace") or "")
    if given and not namespaced:
        return [_Bound(missing="failed to configure binding: paramRef.namespace must not be "
                               "provided for a cluster-scoped `paramKind`")]

    def picks(namespace: str | None) -> list[Mapping[str, Any]]:
        found = []
        for candidate in candidates:
            meta = mapping_at(candidate, "metadata")
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            if ref.get("name") and meta.get("name") != ref["name"]:
                continue
            if "selector" in ref and \
                    not _selector(ref["selector"]).matches(meta.get("labels") or {}):
                continue
            found.append(candidate)
        return found

    what = repr(ref["name"]) if ref.get("name") else "matching the selector"
    if not namespaced or given:
        found = picks(given if namespaced else None)
        if not found:
            warnings.append(f"{binding.location}: spec.paramRef: no param object {what} of "
                            "the policy's paramKind in the input; parameterNotFoundAction "
                            f"{action} applies")
            return [_Bound(missing=missing)]
        return [_Bound(params=c) for c in found]
    # namespaced paramKind, no paramRef.namespace: the request's namespace decides
    by_namespace: dict[str, list[Mapping[str, Any]]] = {}
    for candidate in picks(None):
        by_namespace.setdefault(str(mapping_at(candidate, "metadata").get("namespace")),
                                []).append(candidate)
    instances = [_Bound(params=c, namespaced=True, namespaces=(ns,))
                 for ns, found in by_namespace.items() for c in found]
    instances.append(_Bound(missing=missing, namespaced=True, exclude=tuple(by_namespace)))
    instances.append(_Bound(missing="failed to configure binding: cannot use namespaced "
                                    "paramRef in policy binding that matches cluster-scoped "
                                    "resources", namespaced=False))
    return instances


@functools.cache
def _native_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = load_package_yaml("policies.data", "native-admission.schema.json")
    cls = jsonschema.validators.validator_for(schema)
    return cls({**schema, "$ref": f"#/$defs/{kind}"})


def _check_spec(document: Document, builder: _Builder) -> bool:
    """Validate a native object against the admissionregistration fields (the schema) and the
    API server's creation checks (:mod:`policies.policy.api_validation`); True if clean."""
    spec = document.body.get("spec")
    if not isinstance(spec, Mapping):
        builder.error("spec", "required (expected a map)")
        return False
    before = len(builder.errors)
    validator = _native_validator(str(document.body.get("kind")))
    errors = sorted(validator.iter_errors(spec), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        path = _path(["spec", *error.absolute_path])
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            extra = sorted(set(error.instance) - set(_schema_properties(error)))
            path = f"{path}.{extra[0]}" if extra else path
        builder.error(path, _schema_message(error, _subject(document)))
    for path, message in api_problems(document.body):
        builder.error(path, message)
    return len(builder.errors) == before


def _native_template(document: Document, builder: _Builder) -> Policy | None:
    """A native policy compiled once (name, match and actions are filled per binding)."""
    body = document.body
    spec = body["spec"]
    kind = str(body.get("kind"))
    metadata = mapping_at(body, "metadata")
    before = len(builder.errors)
    mutations: list[Mutation] = []
    for i, mutation in enumerate(spec.get("mutations") or () if kind.startswith("Mutating")
                                 else ()):
        where = f"spec.mutations[{i}]"
        patch_type = str(mutation.get("patchType"))
        field = "jsonPatch" if patch_type == "JSONPatch" else "applyConfiguration"
        if not isinstance(mutation.get(field), Mapping):
            builder.error(f"{where}.{field}", f"required for patchType {patch_type}")
            continue
        source = str(mapping_at(mutation, field).get("expression") or "")
        path = f"{where}.{field}.expression"
        compiled = builder.compile(rewrite_typed_literals(source), path, written=source)
        if compiled is None:
            continue
        if patch_type == "JSONPatch" and (refused := _jsonpatch_field_errors(source, compiled)):
            for offset, message in refused:
                line = source.count("\n", 0, offset) + 1
                column = offset - (source.rfind("\n", 0, offset) + 1) + 1
                builder.error(path, f"CEL error at expression line {line}, column {column}: "
                                    f"{message}")
            continue
        if patch_type == "ApplyConfiguration":
            apply_kinds()  # read the merge facts now, not on the first request
        problem = _patch_type_error(patch_type, source, compiled)
        if problem is not None:
            builder.error(path, problem)
            continue
        mutations.append(Mutation(f"mutations[{i}]", path, expression=compiled,
                                  patch_type=patch_type))
    annotations = mapping_at(metadata, "annotations")
    policy = Policy(
        name=str(metadata.get("name", "")),
        kind=kind,
        origin=Origin(document.source, document.index, document.line_of("")),
        description=str(annotations.get("gpuguard.io/description", "")),
        match=_native_match(spec.get("matchConstraints")),
        failure_policy=parsed(FailurePolicy, spec.get("failurePolicy"), FailurePolicy.FAIL),
        actions=(ValidationAction.DENY,),
        match_conditions=builder.rules(spec.get("matchConditions"), "spec.matchConditions",
                                       native=True),
        variables=builder.rules(spec.get("variables"), "spec.variables", native=True),
        validations=builder.rules(spec.get("validations"), "spec.validations", native=True),
        mutations=tuple(mutations),
        audit_annotations=builder.rules(spec.get("auditAnnotations"), "spec.auditAnnotations",
                                        "valueExpression", native=True),
        reinvocation=str(spec.get("reinvocationPolicy") or "Never"),
    )
    builder.check_references(None, _declared(spec), native=True,
                             param_kind=spec.get("paramKind") is not None)
    return policy if len(builder.errors) == before else None


def _actions(value: Any) -> tuple[ValidationAction, ...]:
    """``validationActions`` as given, ``(Deny,)`` when absent (the schema rejects others)."""
    if not isinstance(value, (list, tuple)) or not value:
        return (ValidationAction.DENY,)
    return tuple(parsed(ValidationAction, action, ValidationAction.DENY) for action in value)


def _bind(template: Policy, binding: Document, bound: _Bound) -> Policy:
    """One evaluation instance of a native policy: its binding's name, match and actions."""
    spec = binding.body.get("spec") or {}
    name = str((binding.body.get("metadata") or {}).get("name", ""))
    actions = _actions(spec.get("validationActions"))
    match = _combine(template.match, _native_match(spec.get("matchResources"))
                     if spec.get("matchResources") else None)
    return replace(
        template,
        name=f"{template.name}/{name}",
        match=replace(match, namespaced=bound.namespaced, namespaces=bound.namespaces,
                      exclude_namespaces=bound.exclude),
        actions=actions if template.kind == "ValidatingAdmissionPolicy" else
        (ValidationAction.DENY,),
        params=bound.params,
        param_missing=bound.missing,
    )


def read_policy_files(paths: Sequence[str]) -> Snapshot:
    """Every policy file under ``paths``, read once into memory (one snapshot).

    Directories are walked skipping hidden entries, so that a mounted ConfigMap yields each key
    once (:func:`policies.sources.iter_paths`). Load it with :func:`load_snapshot`.
    """
    return read_snapshot(paths)


def load_policies(
    paths: Sequence[str], environment: CelEnvironment,
) -> tuple[PolicySet, list[PolicyError]]:
    """Load and compile every policy under ``paths`` (files, directories).

    :func:`read_policy_files`, then :func:`load_snapshot`.

    Returns:
        ``(policy set, errors)``; the set holds only policies that loaded cleanly.
    """
    return load_snapshot(read_policy_files(paths), environment)


NO_DOCUMENT = ("a policy file holds GPUPolicy, ValidatingAdmissionPolicy, "
               "MutatingAdmissionPolicy, their Bindings and param objects, or GPUQuota "
               "documents (to remove a file's policies, delete the file)")


def only_quotas(where: str, quotas: int, why: str) -> str:
    """The refusal of a command that has nothing to evaluate a set of ``quotas`` GPUQuotas and no
    policy with (``why``: what it would need, or who evaluates them). A GPUQuota is a policy
    source (lint, the webhook and the audit load and enforce a quota-only set), so the message
    never says "no policies found"."""
    return (f"{where} holds {quotas} GPUQuota document(s) and no GPUPolicy, "
            f"ValidatingAdmissionPolicy or MutatingAdmissionPolicy; {why}")


def _from_load_error(error: LoadError) -> PolicyError:
    return PolicyError(error.source, error.index, error.line, "", error.message)


def _snapshot_documents(snapshot: Snapshot, errors: list[PolicyError]) -> list[Document]:
    """The documents of every file of ``snapshot``; an unreadable path, a broken document and a
    file with no document at all (0 bytes; only comments, blank lines or ``---``: what a writer
    that truncates before it writes leaves) each add an error."""
    errors.extend(_from_load_error(e) for e in snapshot.errors)
    documents: list[Document] = []
    for file in snapshot.files:
        found = problems = 0
        for entry in file_documents(file, with_lines=True):
            if isinstance(entry, LoadError):
                errors.append(_from_load_error(entry))
                problems += 1
            else:
                documents.append(entry)
                found += 1
        if not found and not problems:
            what = "the file is empty (0 bytes)" if not file.data else \
                f"the file holds no document, only comments, blank lines or '---' " \
                f"({len(file.data)} bytes)"
            errors.append(PolicyError(file.path, None, None, "",
                                      f"no policy document: {what}; {NO_DOCUMENT}"))
    return documents


def load_snapshot(
    snapshot: Snapshot, environment: CelEnvironment,
) -> tuple[PolicySet, list[PolicyError]]:
    """Load and compile every policy in ``snapshot`` (built from its bytes only).

    GPUPolicy documents are checked against the schema; native ValidatingAdmissionPolicy /
    MutatingAdmissionPolicy objects become one policy per Binding (and per param object the
    binding selects); other documents are kept as candidate param objects. A policy with any error
    is left out; every error is returned. A file is whole or refused: one with no document, or
    with none the set uses (no policy, binding, param object or GPUQuota), is an error too —
    an emptied file must not drop its policies silently.

    Returns:
        ``(policy set, errors)``; the set holds only policies that loaded cleanly, its
        ``digest`` is the snapshot's and ``contents`` says what each file gave.
    """
    errors: list[PolicyError] = []
    documents = _snapshot_documents(snapshot, errors)
    policy_set, errors = build_policy_set(documents, environment, errors)
    # a file whose documents were all refused by name (a duplicate) already has its error
    used = {source for source, _ in policy_set.contents} | {e.source for e in errors}
    kinds: dict[str, list[str]] = {}
    for document in documents:
        if document.source not in used:
            kinds.setdefault(document.source, []).append(str(document.body.get("kind")))
    for source, found in kinds.items():
        listed = ", ".join(dict.fromkeys(found))
        errors.append(PolicyError(source, None, None, "", f"no policy document: its documents "
                                                          f"are kind {listed}; {NO_DOCUMENT}"))
    held = _held_despite_duplicates(snapshot, errors)
    if held:
        # A file refused for a duplicate key still holds its documents: say the duplicate key
        # alone, not also that the file "no longer holds" them (PolicySet.contents is what a
        # reload compares with the set it serves).
        merged = {source: dict.fromkeys(ids) for source, ids in policy_set.contents}
        for source, ids in held.items():
            merged.setdefault(source, {}).update(dict.fromkeys(ids))
        policy_set = replace(policy_set, contents=tuple((s, tuple(i)) for s, i in merged.items()))
    return replace(policy_set, digest=snapshot.digest), errors


def _held_despite_duplicates(snapshot: Snapshot, errors: Sequence[PolicyError]
                             ) -> dict[str, list[str]]:
    """``{file: [Kind/name, ...]}`` of the documents of each file whose only reading problem is a
    duplicate mapping key (``duplicate key 'K' (first at line N)``): read again with the
    last key winning, to know which documents the file still holds. A file that does not read
    even so (truncated, not YAML) is left out: it may really have lost them."""
    duplicated = {e.source for e in errors if e.index is not None and "duplicate key" in e.message}
    held: dict[str, list[str]] = {}
    for file in snapshot.files:
        if file.path not in duplicated:
            continue
        try:
            text = decode(file.data)
            if "*" in text and "&" in text:
                continue  # aliases: not expanded outside load_yaml's bound (alias bombs)
            bodies = list(yaml.safe_load_all(text))
        except (yaml.YAMLError, ValueError, OSError, EOFError, RecursionError):
            continue
        held[file.path] = [document_identity(Document(file.path, index, None, body))
                           for index, body in enumerate(bodies) if isinstance(body, dict)]
    return held


_NATIVE_POLICIES = ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")
_NATIVE_BINDINGS = ("ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding")
_ADMISSION_VERSIONS = ("v1", "v1beta1", "v1alpha1")  # admissionregistration.k8s.io's (API ref.)
_GPUGUARD_KINDS = ("GPUPolicy", QUOTA_KIND, EXCEPTION_KIND)


def _wrong_api_version(document: Document, errors: list[PolicyError]) -> bool:
    """Whether a document of a policy kind names an apiVersion that kind does not have
    (``admissionregistrations.k8s.io/v1``, ``admissionregistration.k8s.io/v2``,
    ``gpuguard.io/v1``); each is an error naming the field. Without this such a policy was
    ignored with a warning, and the rest of its file enforced without it."""
    body = document.body
    kind, api = body.get("kind"), str(body.get("apiVersion", ""))
    if kind in _NATIVE_POLICIES or kind in _NATIVE_BINDINGS:
        group, _, version = api.rpartition("/")
        if group == ADMISSION_GROUP and version in _ADMISSION_VERSIONS:
            return False
        expected = ", ".join(f"{ADMISSION_GROUP}/{v}" for v in _ADMISSION_VERSIONS)
    elif kind in _GPUGUARD_KINDS:
        if api == GPUPOLICY_API:
            return False
        expected = GPUPOLICY_API
    else:
        return False
    errors.append(PolicyError(document.source, document.index, document.line_of("apiVersion"),
                              "apiVersion", f"{api!r} is not an API version of {kind} "
                              f"(expected {expected}); the document is not loaded"))
    return True


def _declared(spec: Mapping[str, Any]) -> list[str]:
    """The variable names ``spec`` declares, in order, whether or not their expressions compile
    (a variable with a CEL error is reported there, not again where it is used)."""
    items = spec.get("variables")
    return [str(item.get("name")) for item in (items if isinstance(items, list) else [])
            if isinstance(item, Mapping)]


def build_policy_set(
    documents: Sequence[Document], environment: CelEnvironment,
    errors: list[PolicyError] | None = None,
) -> tuple[PolicySet, list[PolicyError]]:
    """Compile already-read documents; see :func:`load_policies`."""
    errors = errors if errors is not None else []
    policies: list[Policy] = []
    quotas: list[Quota] = []
    warnings: list[str] = []
    bindings: dict[str, list[Document]] = {}
    exempted: list[tuple[Document, tuple[str, ...], Exception_]] = []
    used: set[int] = set()
    for document in documents:
        if _wrong_api_version(document, errors):
            used.add(id(document))  # refused by name, not "ignored"
    documents = [d for d in documents if id(d) not in used]
    documents = _first_of_each_object(documents, errors)
    for document in documents:
        kind = document.body.get("kind")
        group = str(document.body.get("apiVersion", "")).rpartition("/")[0]
        if group != ADMISSION_GROUP:
            continue
        if kind in _NATIVE_BINDINGS:
            used.add(id(document))
            if _check_spec(document, _Builder(document, environment, errors)):
                name = str(document.body["spec"].get("policyName", ""))
                bindings.setdefault(f"{kind.removesuffix('Binding')}/{name}", []).append(document)
        elif kind not in _NATIVE_POLICIES:
            used.add(id(document))
            warnings.append(f"{document.location}: {ADMISSION_GROUP} kind {kind!r} is not one "
                            "gpuguard reads (ValidatingAdmissionPolicy, MutatingAdmissionPolicy "
                            "and their Bindings); ignored")
    policy_names = set()
    for document in documents:
        body = document.body
        kind = body.get("kind")
        group = str(body.get("apiVersion", "")).rpartition("/")[0]
        builder = _Builder(document, environment, errors)
        if kind == "GPUPolicy" or body.get("apiVersion") == GPUPOLICY_API:
            used.add(id(document))
            if kind == QUOTA_KIND:
                quota = _build_quota(document, builder)
                if quota is not None:
                    quotas.append(quota)
                continue
            if kind == EXCEPTION_KIND:
                found = _policy_exception(document, builder)
                if found is not None:
                    exempted.append((document, *found))
                continue
            policy = _build_gpupolicy(document, builder)
            if policy is not None:
                policies.append(policy)
        elif group == ADMISSION_GROUP and kind in _NATIVE_POLICIES:
            used.add(id(document))
            name = str((body.get("metadata") or {}).get("name", ""))
            policy_names.add(f"{kind}/{name}")
            template = _native_template(document, builder) if _check_spec(document, builder) \
                else None
            if template is None:
                continue
            if any(cel_scanner.fields(source, "gpu") for _, source in builder.expressions):
                warnings.append(f"{document.location}: {kind} {name!r} uses gpuguard's 'gpu' "
                                "variable: gpuguard evaluates it, Kubernetes itself cannot")
            bound = bindings.get(f"{kind}/{name}", [])
            if not bound:
                warnings.append(f"{document.location}: {kind} {name!r} has no binding in the "
                                "input; Kubernetes does not enforce it, and neither does gpuguard")
            candidates = _param_objects(documents, body["spec"].get("paramKind"))
            chosen = {id(c) for c in candidates}  # param bodies; `used` holds documents
            used.update(id(d) for d in documents if id(d.body) in chosen)
            for binding in bound:
                selected = _bound_params(binding, body["spec"].get("paramKind"), candidates,
                                         warnings)
                for choice in selected:
                    instance = _bind(template, binding, choice)
                    if choice.params is not None and sum(
                            c.params is not None and c.namespaces == choice.namespaces
                            for c in selected) > 1:
                        # a selector picked several param objects for the same requests
                        param_name = mapping_at(choice.params, "metadata").get("name", "?")
                        instance = replace(instance, name=f"{instance.name}/{param_name}")
                    policies.append(instance)
    for key, bound in bindings.items():
        if key not in policy_names:
            for binding in bound:
                warnings.append(f"{binding.location}: binds {key.replace('/', ' ', 1)!r}, which "
                                "is not in the input; the binding does nothing")
    contents: dict[str, dict[str, None]] = {}
    for document in documents:
        if id(document) in used:
            contents.setdefault(document.source, {})[document_identity(document)] = None
    ignored = [d for d in documents if id(d) not in used]
    if ignored:
        kinds = ", ".join(sorted({str(d.body.get("kind")) for d in ignored}))
        warnings.append(f"{len(ignored)} document(s) are not policies, bindings or their params "
                        f"(kinds: {kinds}); ignored")
    seen: dict[tuple[Any, ...], Policy] = {}
    for policy in policies:
        # instances of one binding for disjoint namespaces (paramRef by the request's
        # namespace) share the binding's name, as in the API server's messages; a VAP and a
        # MAP may share a name, as they are different resources in the API
        partition = _partition(policy)
        if partition in seen:
            first = seen[partition].origin
            errors.append(PolicyError(policy.origin.source, policy.origin.index,
                                      policy.origin.line, "metadata.name",
                                      f"policy name {policy.name!r} is already used by "
                                      f"{first.source}: document {first.index}"))
        seen.setdefault(partition, policy)
    policies = [p for p in policies if seen[_partition(p)] is p]
    policies = _with_exceptions(policies, exempted, warnings)
    quotas = unique_quotas(quotas, errors)
    return PolicySet(tuple(policies), tuple(warnings), tuple(quotas),
                     contents=tuple((s, tuple(ids)) for s, ids in contents.items())), errors


def _first_of_each_object(documents: Sequence[Document],
                          errors: list[PolicyError]) -> list[Document]:
    """``documents`` without a later policy document that names the same object (API group,
    kind, namespace, name) as an earlier one — one error each, naming both places. The API
    server keeps one object per name and kind (a VAP and a MAP may share a name; two
    ValidatingAdmissionPolicyBindings may not): applying both, the second replaces the first.
    GPUQuota names are checked with the served ones (:func:`unique_quotas`)."""
    first: dict[tuple[str, Any, Any, Any], Document] = {}
    kept: list[Document] = []
    for document in documents:
        body = document.body
        group = str(body.get("apiVersion", "")).rpartition("/")[0]
        kind = body.get("kind")
        metadata = body.get("metadata")
        if not isinstance(metadata, Mapping) or kind == QUOTA_KIND or not (
                (group == ADMISSION_GROUP and (kind in _NATIVE_POLICIES
                                               or kind in _NATIVE_BINDINGS))
                or body.get("apiVersion") == GPUPOLICY_API):
            kept.append(document)
            continue
        key = (group, kind, metadata.get("namespace"), metadata.get("name"))
        if key in first:
            errors.append(PolicyError(
                document.source, document.index, document.line_of("metadata.name"),
                "metadata.name", f"{kind} {metadata.get('name')!r} is defined twice (first in "
                f"{first[key].location}); a name names one object (applied to the API "
                "server, the second would replace the first): rename or remove one"))
            continue
        first[key] = document
        kept.append(document)
    return kept


def _partition(policy: Policy) -> tuple[Any, ...]:
    """What two loaded instances may not share: kind, name and the namespaces they match."""
    return (policy.kind, policy.name, policy.match.namespaced, policy.match.namespaces,
            policy.match.exclude_namespaces)


def _with_exceptions(policies: list[Policy],
                     exempted: Sequence[tuple[Document, tuple[str, ...], Exception_]],
                     warnings: list[str]) -> list[Policy]:
    """``policies`` with each GPUPolicyException added to the GPUPolicies it names (after their
    inline ``spec.exceptions``); a name no GPUPolicy of the input has is a warning."""
    extra: dict[str, list[Exception_]] = {}
    names = {p.name for p in policies if not p.native}
    for document, targets, exception in exempted:
        for name in targets:
            if name in names:
                extra.setdefault(name, []).append(exception)
            else:
                warnings.append(f"{document.location}: {EXCEPTION_KIND} names GPUPolicy "
                                f"{name!r}, which is not in the input; it exempts nothing "
                                "from it")
    return [replace(p, exceptions=(*p.exceptions, *extra[p.name]))
            if not p.native and p.name in extra else p for p in policies]


def unique_quotas(quotas: Sequence[Quota], errors: list[PolicyError],
                  served: Sequence[Quota] = ()) -> list[Quota]:
    """``quotas`` without those whose name is already used (by an earlier one, or by one of
    ``served``); each such duplicate is an error naming both places, since the name names the
    reservation ledger (two quotas on one ledger would count each other's reservations)."""
    first: dict[str, Quota] = {q.name: q for q in reversed(served)}
    kept: list[Quota] = []
    for quota in quotas:
        if quota.name in first:
            errors.append(PolicyError(quota.source, None, None, "metadata.name",
                                      f"GPUQuota name {quota.name!r} is already used by "
                                      f"{first[quota.name].source} (it names the reservation "
                                      "ledger)"))
            continue
        first[quota.name] = quota
        kept.append(quota)
    return kept


def load_quotas(paths: Sequence[str]) -> tuple[tuple[Quota, ...], list[PolicyError]]:
    """Load only the ``GPUQuota`` documents under ``paths`` (files, directories).

    Returns:
        ``(quotas in file order, errors)``; a quota with any error is left out, and a file with
        no document at all is an error (see :func:`load_snapshot`).
    """
    errors: list[PolicyError] = []
    documents = _snapshot_documents(read_policy_files(paths), errors)
    quotas = []
    for document in documents:
        if document.body.get("kind") == QUOTA_KIND and \
                document.body.get("apiVersion") == GPUPOLICY_API:
            quota = _build_quota(document, _Builder(document, None, errors))  # type: ignore[arg-type]
            if quota is not None:
                quotas.append(quota)
    return tuple(unique_quotas(quotas, errors)), errors
