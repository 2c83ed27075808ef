"""Policy test suites: ``GPUPolicyTest`` files in, a verdict per case out (``gpuguard test``).

Owns the suite format — in the spirit of ``kyverno test`` and ``gator verify``: a suite names the
policy files to load and lists cases, each an object or AdmissionReview with the namespace,
namespace labels, user and operation to evaluate it under, and what the engine must decide — and
comparing the engine's :class:`~policies.engine.evaluation.Verdict` with those expectations. The
format is documented with an example in ``policies/library/README.md``::

    apiVersion: gpuguard.io/v1alpha1
    kind: GPUPolicyTest
    metadata: {name: mig-profile-allowed}
    policies: [../../policies/library/mig-profile-allowed.yaml]  # relative to this file
    cases:
    - name: inference team may not use 3g.20gb
      resource: ../data/manifests/hami__static-mig-3g.20gb.yaml   # or object: / admissionReview:
      namespace: serving
      namespaceLabels: {gpuguard.io/team: inference}
      userInfo: {username: alice, groups: [ml]}
      operation: CREATE
      expect:
        allowed: false
        results: [{policy: mig-profile-allowed, rule: "validations[0]", outcome: fail}]
        messageContains: ["3g.20gb"]

Semantics: ``results`` is a subset match (each expected entry must equal some actual result on
the keys it gives; ``rule`` is a rule's name or its position, ``validations[0]``); a policy that
produced no result is reported as ``outcome: skip`` with ``rule`` ``match`` (its match left the
request out) or the name of the first false matchCondition; an ``error`` result fails the case
unless an expected entry has ``outcome: error``; ``messageContains`` entries are substrings of the
denial message (``messageNotContains``: must not be); ``warnings`` entries are substrings of some
warning (``[]``: no warning at all); ``patch`` is the exact RFC 6902 patch (``[]``: no patch).

Problems with the suite itself (unreadable files, unknown fields, policy load errors) are
``error`` results naming the file, line and field, never exceptions. Pure: files are read only
through :mod:`policies.sources`; the evaluation time is fixed (1970-01-01, or a case's ``now``).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from policies.authorization import Authorizer, Unavailable
from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import CelEnvironment
from policies.engine.evaluation import Engine, RuleOutcome, RuleResult, Verdict
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.facts.review import (
    OPERATIONS,
    ReviewError,
    ReviewInput,
    UserInfo,
    from_object,
    from_request,
    namespace_stub,
)
from policies.json_fields import mapping_at
from policies.policy.loader import load_policies, only_quotas
from policies.rbac import NO_RBAC_OBJECTS, offline_authorizer
from policies.sources import (
    Document,
    LoadError,
    iter_paths,
    parse_text,
    printable,
    read_documents,
    read_text,
)
from policies.value_words import described
from policies.vocabulary import EvaluationPoint

API_VERSION: Final = "gpuguard.io/v1alpha1"
KIND: Final = "GPUPolicyTest"
PASSED, FAILED, ERRORED, SKIPPED = "pass", "fail", "error", "skip"
EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

_SUITE_FIELDS: Final = frozenset({"apiVersion", "kind", "metadata", "policies", "rbac",
                                  "cases"})
_NO_RBAC: Final = ("the suite names no rbac files, so authorizer checks cannot be decided "
                   "offline (add rbac: [files] with the Roles, ClusterRoles and bindings)")
_CASE_FIELDS: Final = frozenset({
    "name", "resource", "document", "field", "object", "admissionReview", "oldObject",
    "namespace", "namespaceLabels", "userInfo", "operation", "subResource", "point", "now",
    "skip", "expect",
})
_EXPECT_FIELDS: Final = frozenset({"allowed", "results", "messageContains", "messageNotContains",
                                   "warnings", "patch"})
_RESULT_FIELDS: Final = frozenset({"policy", "rule", "outcome", "path", "message",
                                   "messageContains"})
_OUTCOMES: Final = frozenset(RuleOutcome)
_SOURCES: Final = ("resource", "object", "admissionReview")


class SuiteError(ValueError):
    """A problem with a suite file; the message names the file, line and field."""


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case.

    Attributes:
        suite: the suite's ``metadata.name``; source: its file.
        case: the case's ``name``.
        status: ``pass``, ``fail`` (an expectation did not hold), ``error`` (the case could not
            be evaluated: bad input or missing file) or ``skip`` (the case has ``skip:``).
        differences: for ``fail``, one line per unmet expectation (``expected ..., got ...``);
            for ``error``, the problem; for ``skip``, the reason.
        verdict: the engine's verdict when the case was evaluated.
    """

    suite: str
    source: str
    case: str
    status: str
    differences: tuple[str, ...] = ()
    verdict: Verdict | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``gpuguard test -o json``."""
        return {"suite": self.suite, "source": self.source, "case": self.case,
                "status": self.status, "differences": list(self.differences)}


@dataclass(frozen=True)
class SuiteResult:
    """The outcome of one suite: its cases, and problems with the suite as a whole.

    ``errors`` holds suite-level problems (unreadable file, bad structure, policy load errors),
    each naming the file, line and field; a suite with errors may have no cases run.
    """

    source: str
    name: str
    cases: tuple[CaseResult, ...] = ()
    errors: tuple[str, ...] = ()

    def count(self, status: str) -> int:
        """Number of cases with ``status`` (``pass``, ``fail``, ``error``, ``skip``)."""
        return sum(1 for case in self.cases if case.status == status)


@dataclass
class _Context:
    """Where a suite came from, for error messages: the file and its line map."""

    document: Document
    errors: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.document.source

    def where(self, path: str) -> str:
        line = self.document.line_of(path)
        return f"{self.source}:{line}" if line else self.source

    def error(self, path: str, message: str) -> str:
        text = f"{self.where(path)}: {path}: {message}" if path else \
            f"{self.where(path)}: {message}"
        self.errors.append(text)
        return text


class EngineCache:
    """Engines by policy paths, so suites sharing policies compile them once."""

    def __init__(self, settings: GPUSettings) -> None:
        self.settings = settings
        self.environment = CelEnvironment(GPU_LIBRARY)
        self.engines: dict[tuple[str, ...], tuple[Engine, tuple[str, ...]]] = {}

    def get(self, paths: tuple[str, ...]) -> tuple[Engine, tuple[str, ...]]:
        """The engine over ``paths`` and every policy load error (``file:line: ...`` strings)."""
        if paths not in self.engines:
            policy_set, errors = load_policies(list(paths), self.environment)
            engine = Engine(policy_set, self.environment, self.settings)
            self.engines[paths] = (engine, tuple(str(e) for e in errors))
        return self.engines[paths]


# --- reading ---------------------------------------------------------------------------------


def _parse_file(path: str) -> tuple[list[tuple[int, Any, dict[str, int] | None]], str | None]:
    """Every document of one file (index, value, line map), or the problem reading it."""
    for entry in iter_paths([path]):
        if isinstance(entry, LoadError):
            return [], entry.message
    try:
        text = read_text(path)
    except UnicodeDecodeError as exc:
        return [], f"not UTF-8 text (byte offset {exc.start})"
    except (OSError, EOFError) as exc:
        return [], f"cannot read: {exc}"
    documents = []
    for parsed in parse_text(path, text, with_lines=True):
        if isinstance(parsed, LoadError):
            # "document N: [line L: ]message", from the error's fields (the suite names the file)
            parts = [f"document {parsed.index}"] if parsed.index is not None else []
            parts += [f"line {parsed.line}"] if parsed.line is not None else []
            return [], ": ".join([*parts, printable(parsed.message)])
        documents.append(parsed)
    return documents, None


def _relative(base: str, target: str) -> str:
    """``target`` resolved against the directory of the file ``base`` (absolute stays)."""
    if os.path.isabs(target):
        return target
    return os.path.normpath(os.path.join(os.path.dirname(base), target))


def _select(value: Any, dotted: str) -> Any:
    """The value at a dotted key path (``input.explicit_env``) inside a parsed document."""
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise KeyError(key)
        value = value[key]
    return value


def _load_input(context: _Context, where: str, spec: Any, case: Mapping[str, Any],
                *, use_document: bool = True) -> Mapping[str, Any]:
    """The mapping a case field names: inline, or a file (``document`` / ``field`` select).

    Raises:
        SuiteError: the file is missing or unreadable, the document or field does not exist, or
            the value is not a mapping.
    """
    if isinstance(spec, Mapping):
        return spec
    if not isinstance(spec, str) or not spec:
        raise SuiteError(context.error(where, "expected a file path or an inline mapping"))
    path = _relative(context.source, spec)
    case_where = where.rsplit(".", 1)[0]
    documents, problem = _parse_file(path)
    if problem is not None:
        raise SuiteError(context.error(where, f"{spec}: {problem}"))
    values = [value for _, value, _ in documents]
    wanted = case.get("document") if use_document else None
    if wanted is None:
        chosen = next((v for v in values if isinstance(v, Mapping)), None)
        if chosen is None:
            raise SuiteError(context.error(where, f"{spec}: no object in the file"))
    else:
        indexes = {index: value for index, value, _ in documents}
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted not in indexes:
            raise SuiteError(context.error(
                f"{case_where}.document",
                f"{spec} has no document {wanted!r} (documents: "
                f"{', '.join(map(str, sorted(indexes))) or 'none'})"))
        chosen = indexes[wanted]
    selector = case.get("field") if use_document else None
    if selector is not None:
        try:
            chosen = _select(chosen, str(selector))
        except KeyError as exc:
            raise SuiteError(context.error(f"{case_where}.field", f"{spec}: no key "
                                           f"{exc.args[0]!r} on the path {selector!r}")) from None
    if not isinstance(chosen, Mapping):
        raise SuiteError(context.error(where, f"{spec}: expected a mapping, got "
                                              f"{described(chosen)}"))
    return chosen


# --- building the review ---------------------------------------------------------------------


def _user(context: _Context, where: str, value: Any) -> UserInfo:
    if not isinstance(value, Mapping):
        raise SuiteError(context.error(where, "expected a mapping {username, groups, uid}"))
    unknown = sorted(set(value) - {"username", "groups", "uid", "extra"})
    if unknown:
        raise SuiteError(context.error(f"{where}.{unknown[0]}", "unknown field (allowed: "
                                                                 "username, groups, uid, extra)"))
    groups = value.get("groups") or []
    if not isinstance(groups, list):
        raise SuiteError(context.error(f"{where}.groups", "expected a list of group names"))
    extra = mapping_at(value, "extra")
    return UserInfo(username=str(value.get("username") or ""), uid=str(value.get("uid") or ""),
                    groups=tuple(str(g) for g in groups), extra=dict(extra))


def _now(context: _Context, where: str, value: Any) -> datetime.datetime:
    if value is None:
        return EPOCH
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if isinstance(value, datetime.date):
        return datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.UTC)
    try:
        parsed = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        raise SuiteError(context.error(where, f"{value!r} is not a date or time (expected "
                                              "YYYY-MM-DD or an ISO 8601 time)")) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def _build_review(context: _Context, where: str, case: Mapping[str, Any]) -> ReviewInput:
    """The :class:`ReviewInput` one case describes.

    Raises:
        SuiteError: a missing or malformed input; the message names the file, line and field.
    """
    now = _now(context, f"{where}.now", case.get("now"))
    labels = case.get("namespaceLabels") or {}
    if not isinstance(labels, Mapping):
        raise SuiteError(context.error(f"{where}.namespaceLabels", "expected a mapping of labels"))
    user = _user(context, f"{where}.userInfo", case["userInfo"]) if "userInfo" in case else None
    operation = case.get("operation")
    if operation is not None and operation not in OPERATIONS:
        raise SuiteError(context.error(f"{where}.operation", f"{operation!r} is not one of "
                                                             f"{', '.join(OPERATIONS)}"))
    given = [key for key in _SOURCES if key in case]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise SuiteError(context.error(where, "expected exactly one of resource, object, "
                                              f"admissionReview (got {got})"))
    key = given[0]
    if key == "admissionReview":
        body = _load_input(context, f"{where}.admissionReview", case[key], case)
        request = body.get("request", body)
        try:
            review = from_request(request, now=now)
        except ReviewError as exc:
            raise SuiteError(context.error(f"{where}.admissionReview", str(exc))) from None
        request_map = dict(review.request)
        if operation is not None:
            review = replace(review, operation=str(operation))
            request_map["operation"] = operation
    else:
        obj = _load_input(context, f"{where}.{key}", case[key], case, use_document=key != "object")
        try:
            review = from_object(obj, operation=str(operation or "CREATE"), user=user, now=now)
        except ReviewError as exc:
            raise SuiteError(context.error(f"{where}.{key}", str(exc))) from None
        request_map = dict(review.request)
    if "oldObject" in case:
        old = _load_input(context, f"{where}.oldObject", case["oldObject"], case,
                          use_document=False)
        review = replace(review, old_object=old)
        request_map["oldObject"] = old
    if "subResource" in case:
        review = replace(review, subresource=str(case["subResource"] or ""))
        request_map["subResource"] = case["subResource"]
    if user is not None:
        review = replace(review, user=user)
        request_map["userInfo"] = user.to_dict()
    namespace = case.get("namespace", review.namespace or "default")
    if namespace is not None:
        namespace = str(namespace)
        request_map["namespace"] = namespace
    review = replace(review, namespace=namespace, request=request_map,
                     namespace_object=None if namespace is None else
                     namespace_stub(namespace, labels))
    point = case.get("point", EvaluationPoint.ADMISSION)
    if point not in tuple(EvaluationPoint):
        raise SuiteError(context.error(f"{where}.point", f"{point!r} is not admission or audit"))
    return review


# --- comparing -------------------------------------------------------------------------------


def _rule_matches(expected: str, result: RuleResult) -> bool:
    """A rule is named by its name or by its position (``validations[0]``)."""
    return expected in (result.rule, result.path.removeprefix("spec.").rsplit(".", 1)[0])


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _result_matches(expected: Mapping[str, Any], result: RuleResult) -> bool:
    for key, value in expected.items():
        if key == "rule":
            if not _rule_matches(str(value), result):
                return False
        elif key == "messageContains":
            if not all(str(part) in result.message for part in _as_list(value)):
                return False
        elif str(getattr(result, key)) != str(value):
            return False
    return True


def _describe(expected: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in expected.items()) + "}"


def _summary(results: Iterable[RuleResult]) -> str:
    parts = [f"{r.policy} {r.rule} {r.outcome}" for r in results]
    return "; ".join(parts) if parts else "no results"


def compare(expect: Mapping[str, Any], verdict: Verdict) -> list[str]:
    """Every expectation of ``expect`` that ``verdict`` does not meet, as ``expected/got`` lines.

    Args:
        expect: the case's ``expect`` mapping (already checked for unknown fields).
        verdict: what the engine decided (with ``explain``: every policy has a result).

    Returns:
        One line per difference; empty when the case passes.
    """
    differences = []
    results = list(verdict.results)
    if "allowed" in expect and bool(expect["allowed"]) != verdict.allowed:
        got = verdict.message or "no denial"
        differences.append(f"allowed: expected {str(expect['allowed']).lower()}, got "
                           f"{str(verdict.allowed).lower()} ({got})")
    wanted = [r for r in _as_list(expect.get("results")) if isinstance(r, Mapping)]
    for entry in wanted:
        if not any(_result_matches(entry, result) for result in results):
            differences.append(f"results: expected {_describe(entry)}, got: "
                               f"{_summary(results)}")
    if not any(str(entry.get("outcome")) == RuleOutcome.ERROR for entry in wanted):
        for result in verdict.results:
            if result.outcome == RuleOutcome.ERROR:
                differences.append(f"results: unexpected error in {result.policy} "
                                   f"{result.rule}: {result.message}")
    for part in _as_list(expect.get("messageContains")):
        if str(part) not in verdict.message:
            differences.append(f"messageContains: expected {str(part)!r} in the denial "
                               f"message, got {verdict.message or 'no denial'!r}")
    for part in _as_list(expect.get("messageNotContains")):
        if str(part) in verdict.message:
            differences.append(f"messageNotContains: expected no {str(part)!r} in the denial "
                               f"message, got {verdict.message!r}")
    if "warnings" in expect:
        warnings = _as_list(expect["warnings"])
        texts = list(verdict.warning_texts)
        if not warnings and texts:
            differences.append(f"warnings: expected none, got {texts}")
        for part in warnings:
            if not any(str(part) in warning for warning in texts):
                differences.append(f"warnings: expected a warning containing {str(part)!r}, "
                                   f"got {texts or 'none'}")
    if "patch" in expect:
        want = expect["patch"] or []
        if list(want) != list(verdict.patch):
            differences.append(f"patch: expected {json.dumps(want)}, got "
                               f"{json.dumps(list(verdict.patch))}")
    return differences


# --- running ---------------------------------------------------------------------------------


def _check_fields(context: _Context, where: str, value: Mapping[str, Any],
                  allowed: frozenset[str]) -> None:
    for key in sorted(str(k) for k in value if k not in allowed):
        context.error(f"{where}.{key}" if where else key,
                      f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _check_expect(context: _Context, where: str, expect: Any, policy_names: set[str]) -> None:
    """Check ``expect``: known fields, types, result entries naming loaded policies."""
    if not isinstance(expect, Mapping):
        context.error(where, "expected a mapping (allowed, results, messageContains, warnings, "
                             "patch)")
        return
    _check_fields(context, where, expect, _EXPECT_FIELDS)
    if not any(key in expect for key in ("allowed", "warnings", "patch")) and not any(
            _as_list(expect.get(key)) for key in ("results", "messageContains",
                                                  "messageNotContains")):
        # a case that asserts nothing passes whatever the policies decide
        context.error(where, "asserts nothing: give at least one of allowed, results, "
                             "messageContains, messageNotContains, warnings (an empty list: "
                             "none), patch (an empty list: no mutation)")
    if "allowed" in expect and not isinstance(expect["allowed"], bool):
        context.error(f"{where}.allowed", "expected true or false")
    if "patch" in expect and not isinstance(expect["patch"], list | type(None)):
        context.error(f"{where}.patch", "expected a list of RFC 6902 operations")
    results = expect.get("results", [])
    if not isinstance(results, list):
        context.error(f"{where}.results", "expected a list of {policy, rule, outcome} entries")
        return
    for i, entry in enumerate(results):
        path = f"{where}.results[{i}]"
        if not isinstance(entry, Mapping):
            context.error(path, "expected a mapping {policy, rule, outcome, ...}")
            continue
        _check_fields(context, path, entry, _RESULT_FIELDS)
        if "outcome" in entry and entry["outcome"] not in _OUTCOMES:
            context.error(f"{path}.outcome", f"{entry['outcome']!r} is not one of "
                                             f"{', '.join(sorted(_OUTCOMES))}")
        if "policy" in entry and str(entry["policy"]) not in policy_names:
            context.error(f"{path}.policy", f"no policy {entry['policy']!r} in this suite's "
                                            f"policies ({', '.join(sorted(policy_names))})")


def _run_case(context: _Context, suite: str, index: int, case: Any, engine: Engine,
              policy_names: set[str], authorizer: Authorizer) -> CaseResult:
    where = f"cases[{index}]"
    if not isinstance(case, Mapping):
        message = context.error(where, "expected a mapping with name, a resource and expect")
        return CaseResult(suite, context.source, where, ERRORED, (message,))
    name = str(case.get("name") or where)
    before = len(context.errors)
    _check_fields(context, where, case, _CASE_FIELDS)
    if "name" not in case:
        context.error(where, "name is required")
    if "expect" not in case:
        context.error(where, "expect is required")
    else:
        _check_expect(context, f"{where}.expect", case["expect"], policy_names)
    if len(context.errors) > before:
        return CaseResult(suite, context.source, name, ERRORED, tuple(context.errors[before:]))
    if case.get("skip"):
        return CaseResult(suite, context.source, name, SKIPPED, (f"skipped: {case['skip']}",))
    try:
        review = _build_review(context, where, case)
    except SuiteError as exc:
        return CaseResult(suite, context.source, name, ERRORED, (str(exc),))
    point = EvaluationPoint(str(case.get("point", EvaluationPoint.ADMISSION)))  # checked above
    # explain: every policy that does not apply says why (match, exception, matchCondition),
    # decided by the engine itself, so a case can expect a skip.
    verdict = engine.evaluate(review, point=point, explain=True, authorizer=authorizer)
    differences = compare(case["expect"], verdict)
    status = FAILED if differences else PASSED
    return CaseResult(suite, context.source, name, status, tuple(differences), verdict)


def _authorizer(context: _Context, document: Document, rbac: Any) -> Authorizer:
    """The suite's CEL ``authorizer``: the RBAC rules over the objects of its ``rbac`` files
    (relative to the suite file); without the field every check is an errored decision."""
    if rbac is None:
        return Unavailable(_NO_RBAC)
    if not isinstance(rbac, list) or not all(isinstance(p, str) and p for p in rbac):
        context.error("rbac", "expected a list of file paths (relative to this file) holding "
                              "Roles, ClusterRoles, RoleBindings and ClusterRoleBindings")
        return Unavailable(_NO_RBAC)
    documents, errors = read_documents([_relative(document.source, p) for p in rbac])
    for error in errors:
        context.error("rbac", str(error))
    authorizer = offline_authorizer(d.body for d in documents)
    if isinstance(authorizer, Unavailable):
        context.error("rbac", f"{', '.join(rbac)}: {NO_RBAC_OBJECTS}")
    return authorizer


def _run_document(document: Document, cache: EngineCache) -> SuiteResult:
    context = _Context(document)
    body = document.body
    name = str((body.get("metadata") or {}).get("name") or os.path.basename(document.source)) \
        if isinstance(body.get("metadata"), Mapping) else os.path.basename(document.source)
    _check_fields(context, "", body, _SUITE_FIELDS)
    if body.get("apiVersion") != API_VERSION:
        context.error("apiVersion", f"expected {API_VERSION!r}, got {body.get('apiVersion')!r}")
    if not isinstance(body.get("metadata"), Mapping) or not body["metadata"].get("name"):
        context.error("metadata.name", "is required")
    policies = body.get("policies")
    paths: list[str] = []
    named: list[str] = []  # as written, for messages
    if not isinstance(policies, list) or not policies or \
            not all(isinstance(p, str) and p for p in policies):
        context.error("policies", "expected a non-empty list of policy file paths (relative to "
                                  "this file)")
    else:
        for i, entry in enumerate(policies):
            path = _relative(document.source, entry)
            missing = next((e for e in iter_paths([path]) if isinstance(e, LoadError)), None)
            if missing is not None:
                context.error(f"policies[{i}]", f"{entry}: {missing.message}")
            paths.append(path)
            named.append(entry)
    authorizer = _authorizer(context, document, body.get("rbac"))
    cases = body.get("cases")
    if not isinstance(cases, list) or not cases:
        context.error("cases", "expected a non-empty list of cases")
    if context.errors:
        return SuiteResult(document.source, name, (), tuple(context.errors))
    engine, load_errors = cache.get(tuple(paths))
    errors = [f"{context.where('policies')}: policies: policy error: {e}" for e in load_errors]
    policy_names = set(engine.policies.names())
    if not policy_names and not errors:
        quotas = len(engine.policies.quotas)
        errors.append(f"{context.where('policies')}: policies: " + (only_quotas(
            ", ".join(named), quotas,
            "a test case evaluates policies only (GPUQuotas are judged by `gpuguard check "
            "--snapshot`, the webhook and the audit)") if quotas else
            f"no policies found in {', '.join(named)}"))
    if errors:
        return SuiteResult(document.source, name, (), tuple(errors))
    assert isinstance(cases, list)
    names = [c.get("name") for c in cases if isinstance(c, Mapping)]
    for duplicate in sorted({str(n) for n in names if n is not None and names.count(n) > 1}):
        context.error("cases", f"case name {duplicate!r} is used more than once")
    suite_errors = list(context.errors)
    results = []
    for index, case in enumerate(cases):
        context.errors = []
        results.append(_run_case(context, name, index, case, engine, policy_names,
                                 authorizer))
    return SuiteResult(document.source, name, tuple(results), tuple(suite_errors))


def run_file(path: str, cache: EngineCache | None = None, *,
             settings: GPUSettings = DEFAULT_SETTINGS,
             required: bool = True) -> list[SuiteResult]:
    """Run every ``GPUPolicyTest`` document of one file.

    Args:
        path: the suite file.
        cache: engines shared between files (one is made when None).
        settings: GPU naming and sharing for the engine.
        required: a file with no suite is an error (a path given explicitly); False skips it
            (files met while walking a directory).

    Returns:
        One :class:`SuiteResult` per suite document, or one with ``errors`` when the file cannot
        be read or (``required``) holds no suite.
    """
    cache = cache or EngineCache(settings)
    documents, problem = _parse_file(path)
    if problem is not None:
        return [SuiteResult(path, os.path.basename(path), (), (f"{path}: {problem}",))]
    suites = []
    for index, value, lines in documents:
        if isinstance(value, Mapping) and value.get("kind") == KIND:
            suites.append(_run_document(Document(path, index, None, dict(value), lines), cache))
    if not suites and required:
        kinds = sorted({str(v.get("kind")) for _, v, _ in documents if isinstance(v, Mapping)})
        message = f"{path}: no {KIND} document (kinds found: {', '.join(kinds) or 'none'})"
        return [SuiteResult(path, os.path.basename(path), (), (message,))]
    return suites


def run_paths(paths: Sequence[str], settings: GPUSettings = DEFAULT_SETTINGS
              ) -> list[SuiteResult]:
    """Run the suites under ``paths`` (suite files, or directories searched recursively).

    Files found in a directory that hold no ``GPUPolicyTest`` are ignored; a directory with no
    suite at all, or a path that does not exist, gives a :class:`SuiteResult` with an error.

    Returns:
        Every suite's result, in path order (directories sorted).
    """
    cache = EngineCache(settings)
    results: list[SuiteResult] = []
    for raw in paths:
        entries = list(iter_paths([raw]))
        is_dir = entries != [raw] and not any(isinstance(e, LoadError) for e in entries)
        found: list[SuiteResult] = []
        for entry in entries:
            if isinstance(entry, LoadError):
                found.append(SuiteResult(entry.source, os.path.basename(entry.source), (),
                                         (str(entry),)))
                continue
            found.extend(run_file(entry, cache, settings=settings, required=not is_dir))
        if is_dir and not found:
            found.append(SuiteResult(raw, os.path.basename(raw.rstrip("/")), (),
                                     (f"{raw}: no {KIND} suites found",)))
        results.extend(found)
    return results


def exit_code(results: Sequence[SuiteResult]) -> int:
    """0 when every case passed (or was skipped), 1 on a failed case, 2 on any error."""
    if any(s.errors or s.count(ERRORED) for s in results):
        return 2
    return 1 if any(s.count(FAILED) for s in results) else 0
