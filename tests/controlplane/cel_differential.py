"""Comparing gpuguard's CEL environment with the Kubernetes CEL oracle, case by case.

Owns what counts as agreement and how a disagreement is classified (:func:`classify`), the
gpuguard side of an evaluation (:func:`gpuguard_outcome`, through the environment the CLI's
policy loader builds: ``CelEnvironment(GPU_LIBRARY)`` in ``gpuguard/policy_set.py``), and the
known-differences file (``tests/data/k8s-cel/known-differences.yaml``). Must not decide which
differences are acceptable: the file does, each entry with its reason.

Categories of a disagreement, gpuguard's outcome first:

=====================  ==================================================================
``gpuguard-refuses``   gpuguard does not compile what Kubernetes compiles (a missing function)
``kubernetes-refuses`` Kubernetes does not compile what gpuguard compiles (gpuguard accepts
                       more: an extension Kubernetes lacks, a check Kubernetes makes at load)
``gpuguard-errors``    gpuguard fails at runtime where Kubernetes gives a value
``kubernetes-errors``  Kubernetes fails at runtime where gpuguard gives a value
``value``              both give a value, not the same
``error-text``         both fail at runtime with a different message
=====================  ==================================================================

Two compile errors agree (cel-go's and cel-cpp's diagnostics never read alike).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.authorization import Attributes, Decision, Subject, Verdict
from policies.cel.gpu import GPU_LIBRARY
from policies.cel.library import authz
from policies.cel.runtime import CelCompileError, CelEnvironment, CelEvaluationError
from tests.controlplane.celoracle import Outcome, canonical_gpuguard

DATA = Path(__file__).resolve().parents[1] / "data" / "k8s-cel"
CASES_FILE = DATA / "cases.json"
KNOWN_FILE = DATA / "known-differences.yaml"
CATEGORIES = ("gpuguard-refuses", "kubernetes-refuses", "gpuguard-errors", "kubernetes-errors",
              "value", "error-text")

# As gpuguard/policy_set.py:load builds it for every policy the CLI and the webhook load.
ENVIRONMENT = CelEnvironment(GPU_LIBRARY)


def _opaque_string(value: Mapping[str, Any]) -> Any:
    """``string(v)`` of an opaque value as the oracle reports it: cel-go converts only IP and
    CIDR values to strings (Quantity, URL and Semver have no string conversion)."""
    [(key, inner)] = value.items()
    return inner if key in ("__ip__", "__cidr__") and isinstance(inner, str) else None


def gpuguard_outcome(request: Mapping[str, Any]) -> Outcome:
    """Compile and evaluate a protocol request (see :mod:`tests.controlplane.celoracle`) with
    gpuguard's environment; ``variables`` are compiled and evaluated lazily as a policy's are.
    """
    try:
        # written=: the policy loader's checks of an expression as its author wrote it.
        compiled = ENVIRONMENT.compile(request["expression"], field_path="expression",
                                       written=request["expression"])
        variables = [(v["name"], ENVIRONMENT.compile(v["expression"],
                                                     field_path=f"variables.{v['name']}",
                                                     written=v["expression"]))
                     for v in request.get("variables", ())]
    except CelCompileError as exc:
        return Outcome("compile", message=exc.message)
    data = dict(request.get("vars", {}))
    vars_request = data.get("request") if isinstance(data.get("request"), Mapping) else {}
    session = authz.Session(StaticAuthorizer(request.get("authorizer") or {}),
                            _subject(vars_request))
    with authz.bound(session, _resource(vars_request)) as authorizer:
        data["authorizer"] = authorizer
        try:
            value = ENVIRONMENT.activation(data, variables).evaluate(compiled)
        except CelEvaluationError as exc:
            return Outcome("error", message=exc.message)
    if compiled.output_type.startswith("type") and isinstance(value, str):
        value = value.partition("<")[0]  # a type's name: 'list<dyn>' is CEL's list
    return Outcome("value", canonical_gpuguard(value, _opaque_string),
                   type_name=compiled.output_type)


@dataclass(frozen=True)
class StaticAuthorizer:
    """The oracle's ``staticAuthorizer`` (tests/controlplane/kube/celoracle/main.go) on the
    gpuguard side, so that both answer a request's ``authorizer`` spec alike: the first rule
    whose set fields (``verb group resource subresource namespace name path``; ``""`` or
    ``*``: any) match decides, else the spec's ``decision`` (none: no opinion)."""

    spec: Mapping[str, Any]

    def authorize(self, attributes: Attributes) -> Decision:
        got = {"verb": attributes.verb, "group": attributes.api_group,
               "resource": attributes.resource, "subresource": attributes.subresource,
               "namespace": attributes.namespace, "name": attributes.name,
               "path": attributes.path}
        for rule in self.spec.get("rules") or ():
            if all(rule.get(k, "") in ("", "*", v) for k, v in got.items()):
                return Decision(_verdict(rule.get("decision", "")), rule.get("reason", ""))
        return Decision(_verdict(self.spec.get("decision", "")), self.spec.get("reason", ""))


def _verdict(name: str) -> Verdict:
    return {"allow": Verdict.ALLOW, "deny": Verdict.DENY}.get(name.lower(), Verdict.NO_OPINION)


def _subject(request: Mapping[str, Any]) -> Subject:
    user = request.get("userInfo") if isinstance(request.get("userInfo"), Mapping) else {}
    return Subject(str(user.get("username", "")), str(user.get("uid", "")),
                   tuple(user.get("groups") or ()))


def _resource(request: Mapping[str, Any]) -> dict[str, str]:
    resource = request.get("resource") if isinstance(request.get("resource"), Mapping) else {}
    return {"group": str(resource.get("group", "")),
            "resource": str(resource.get("resource", "")),
            "subresource": str(request.get("subResource", "")),
            "namespace": str(request.get("namespace", "")), "name": str(request.get("name", ""))}


def same_value(a: Any, b: Any) -> bool:
    """Canonical values equal, NaN equal to NaN."""
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] == b[:1] == ("double",):
        x, y = a[1], b[1]
        return x == y or (isinstance(x, float) and isinstance(y, float) and
                          math.isnan(x) and math.isnan(y)) or x == y == "NaN"
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_value, a, b))
    return type(a) is type(b) and a == b


def classify(gpuguard: Outcome, kubernetes: Outcome) -> str | None:
    """The category of a disagreement (see the module's table), None when the two agree."""
    pair = gpuguard.kind, kubernetes.kind
    if pair == ("compile", "compile"):
        return None
    if gpuguard.kind == "compile":
        return "gpuguard-refuses"
    if kubernetes.kind == "compile":
        return "kubernetes-refuses"
    if pair == ("error", "value"):
        return "gpuguard-errors"
    if pair == ("value", "error"):
        return "kubernetes-errors"
    if pair == ("error", "error"):
        return None if gpuguard.message == kubernetes.message else "error-text"
    return None if same_value(gpuguard.value, kubernetes.value) else "value"


@dataclass(frozen=True)
class Disagreement:
    """One expression on which the two sides differ."""

    key: str
    category: str
    expression: str
    gpuguard: Outcome
    kubernetes: Outcome

    def describe(self) -> str:
        """One paragraph for a failure message."""
        def side(o: Outcome) -> str:
            return f"{o.kind}: {o.value!r}" if o.kind == "value" else f"{o.kind}: {o.message}"
        return (f"[{self.key}] {self.category}: {self.expression}\n"
                f"    gpuguard   {side(self.gpuguard)[:300]}\n"
                f"    kubernetes {side(self.kubernetes)[:300]}")


# --- the case file ------------------------------------------------------------------------------


def case_request(case: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol request a case stands for.

    A case whose expectation is a CEL expression (``expect.cel``, Kubernetes' own way of checking
    opaque results such as quantities) is compared as ``(expression) == (expected)``; an
    ``optional`` result as ``[value]`` or ``[]``, because gpuguard's evaluation API returns plain
    values and an optional has none.
    """
    expression = case["expression"]
    expect = case.get("expect", {})
    if "cel" in expect and expect.get("type") != "optional":
        expression = f"({expression}) == ({expect['cel']})"
    elif expect.get("type") == "optional" or "cel_optional_of" in expect:
        expression = f"(({expression}).hasValue() ? [({expression}).value()] : [])"
    request: dict[str, Any] = {"expression": expression}
    if "object" in case:
        request["vars"] = {"object": case["object"]}
    return request


def load_cases() -> list[dict[str, Any]]:
    """The cases of ``tests/data/k8s-cel/cases.json`` (a copy of the shared corpus file)."""
    import json

    return list(json.loads(CASES_FILE.read_text(encoding="utf-8"))["cases"])


def expected_by_case_file(case: Mapping[str, Any], oracle: Outcome) -> bool | None:
    """Whether the oracle's outcome is what the case file expects (None: nothing to check).

    The case file was extracted from the Kubernetes 1.34 tests; the oracle is 1.37, so a few
    answers may have moved — the known-differences file lists those.
    """
    expect = case.get("expect", {})
    if "value" in expect:
        return oracle.kind == "value" and _loose_equal(oracle.value, expect["value"])
    if "cel" in expect or "cel_optional_of" in expect:
        if "cel_optional_of" in expect:
            return oracle.kind == "value" and oracle.value == [list(expect["cel_optional_of"])]
        if expect.get("type") == "optional":
            return oracle.kind == "value" and oracle.value == []
        return oracle.kind == "value" and oracle.value is True
    if "expect_error" in case:
        if oracle.kind == "value":
            return False
        # The Go tables' regexes are often literal texts with parentheses, so a substring also
        # counts; "compile error: " is how the library tests prefix a program-creation error.
        pattern = case["expect_error"].removeprefix("compile error: ")
        return pattern in oracle.message or (case.get("error_match") == "regex" and
                                             re.search(pattern, oracle.message) is not None)
    if "expect_compile_error" in case:
        errors = case["expect_compile_error"]
        patterns = errors if isinstance(errors, list) else [errors]
        return oracle.kind == "compile" and all(re.search(p, oracle.message) for p in patterns)
    if case.get("expect_no_error"):
        return oracle.kind == "value"
    if case.get("expect_compiles"):
        return oracle.kind != "compile"
    return None


def _loose_equal(canonical: Any, plain: Any) -> bool:
    """A canonical oracle value against a plain JSON expectation (1 and 1.0 alike)."""
    if isinstance(canonical, tuple) and canonical[:1] == ("double",):
        return isinstance(plain, int | float) and not isinstance(plain, bool) and \
            float(plain) == canonical[1]
    if isinstance(canonical, tuple) and canonical[:1] == ("map",):
        return isinstance(plain, dict) and len(plain) == len(canonical[1]) and all(
            k in plain and _loose_equal(v, plain[k]) for k, v in canonical[1])
    if isinstance(canonical, list):
        return isinstance(plain, list) and len(plain) == len(canonical) and all(
            map(_loose_equal, canonical, plain))
    return type(canonical) is type(plain) and canonical == plain


# --- the known-differences file -----------------------------------------------------------------


@dataclass(frozen=True)
class KnownGroup:
    """Cases that differ for one reason: ``ids`` of the case file, all of ``category``;
    ``docs`` is the title docs/cel.md gives the difference (``cases`` and ``case_file``)."""

    category: str
    reason: str
    ids: tuple[int, ...]
    docs: str = ""
    meets_case_file: tuple[int, ...] = ()
    """Those of ``ids`` (``cases`` only) where Kubernetes 1.37 answers otherwise than the 1.34
    case file (``oracle_vs_case_file``) and gpuguard, differing from Kubernetes, answers as the
    case file does (cel-go's tests with ``cel.bind``, which gpuguard has)."""


def side(outcome: Outcome) -> str:
    """What a pattern's ``gpuguard`` / ``kubernetes`` regex is matched against: the message of an
    error, the ``repr`` of a value."""
    return repr(outcome.value) if outcome.kind == "value" else outcome.message


@dataclass(frozen=True)
class KnownPattern:
    """Generated expressions that differ for one reason: those with ``category`` whose expression
    matches ``match`` and whose two sides (see :func:`side`) match ``gpuguard`` and
    ``kubernetes`` (regexes, searched); ``example`` is a request that must still differ so."""

    category: str
    reason: str
    match: re.Pattern[str]
    gpuguard: re.Pattern[str]
    kubernetes: re.Pattern[str]
    example: dict[str, Any]

    def explains(self, d: Disagreement) -> bool:
        """Whether this entry is the reason for ``d``."""
        return d.category == self.category and bool(
            self.match.search(d.expression) and self.gpuguard.search(side(d.gpuguard)) and
            self.kubernetes.search(side(d.kubernetes)))


@dataclass(frozen=True)
class Known:
    """The parsed known-differences file."""

    cases: tuple[KnownGroup, ...]
    oracle_vs_case_file: tuple[KnownGroup, ...]
    generated: tuple[KnownPattern, ...]
    case_file: tuple[KnownGroup, ...] = ()

    def case_categories(self) -> dict[int, str]:
        """Case id -> listed category (each id in one group only)."""
        return _by_id(self.cases, "cases")

    def oracle_exceptions(self) -> dict[int, str]:
        """Case id -> why the 1.37 oracle does not answer what the 1.34 case file expects."""
        return {i: g.reason for g in self.oracle_vs_case_file for i in g.ids}

    def pattern_for(self, disagreement: Disagreement) -> KnownPattern | None:
        """The first pattern that explains a generated disagreement, if any."""
        for pattern in self.generated:
            if pattern.explains(disagreement):
                return pattern
        return None


def _by_id(groups: Sequence[KnownGroup], section: str) -> dict[int, str]:
    result: dict[int, str] = {}
    for group in groups:
        for i in group.ids:
            if i in result:
                raise ValueError(f"{KNOWN_FILE}: {section}: case {i} is listed twice")
            result[i] = group.category
    return result


def load_known(path: Path = KNOWN_FILE) -> Known:
    """Parse the known-differences file.

    Raises:
        ValueError: a section or entry lacks a field, names an unknown category, or a regex does
            not compile (the message names the entry).
    """
    document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}

    def groups(section: str, categorised: bool) -> tuple[KnownGroup, ...]:
        result = []
        for n, entry in enumerate(document.get(section) or ()):
            where = f"{path}: {section}[{n}]"
            if not isinstance(entry, dict) or not entry.get("reason") or not entry.get("ids"):
                raise ValueError(f"{where}: expected reason and ids")
            category = entry.get("category", "")
            if categorised and category not in CATEGORIES:
                raise ValueError(f"{where}: category {category!r} is not one of {CATEGORIES}")
            ids = tuple(int(i) for i in entry["ids"])
            meets = tuple(int(i) for i in entry.get("meets_case_file") or ())
            if not set(meets) <= set(ids):
                raise ValueError(f"{where}: meets_case_file {sorted(set(meets) - set(ids))} "
                                 "are not among its ids")
            result.append(KnownGroup(category, str(entry["reason"]), ids,
                                     str(entry.get("docs", "")), meets))
        return tuple(result)

    patterns = []
    for n, entry in enumerate(document.get("generated") or ()):
        where = f"{path}: generated[{n}]"
        if not isinstance(entry, dict) or not all(entry.get(k) for k in
                                                  ("category", "reason", "example")):
            raise ValueError(f"{where}: expected category, reason and example (match, "
                             "gpuguard, kubernetes: optional regexes)")
        if entry["category"] not in CATEGORIES:
            raise ValueError(f"{where}: category {entry['category']!r} is not one of "
                             f"{CATEGORIES}")
        regexes = {}
        for key in ("match", "gpuguard", "kubernetes"):
            try:
                regexes[key] = re.compile(str(entry.get(key, "")))
            except re.error as exc:
                raise ValueError(f"{where}: {key}: {exc}") from None
        example = entry["example"]
        if isinstance(example, str):
            example = {"expression": example}
        if not regexes["match"].search(example.get("expression", "")):
            raise ValueError(f"{where}: the example does not match its own pattern")
        patterns.append(KnownPattern(entry["category"], str(entry["reason"]),
                                     example=example, **regexes))
    return Known(groups("cases", True), groups("oracle_vs_case_file", False), tuple(patterns),
                 groups("case_file", False))
