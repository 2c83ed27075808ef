"""CEL type conversions and creation-time refusals against Kubernetes' recorded answers.

``tests/data/k8s-cel/conversions.yaml`` holds what cel-go (kube-apiserver 1.37's CEL, through
the celoracle) answers: 400 strings and doubles through ``int``/``uint``/``double``/``bool``/
``duration``/``timestamp`` and back through ``string`` (Go's parsers and formatters, ported in
:mod:`policies.cel.conversions`), and 51 expressions it refuses when a policy is created or
accepts (:mod:`policies.cel.instantiation`). ``tests/controlplane/test_cel_conversions_live.py``
keeps the file true against the oracle.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from policies.cel import conversions
from policies.cel.runtime import CelCompileError
from policies.policy.loader import build_policy_set
from policies.sources import Document, parse_text
from tests.builders.environment import ENV
from tests.paths import ROOT

RECORDED = yaml.safe_load((ROOT / "tests" / "data" / "k8s-cel" / "conversions.yaml").read_text())
_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*?)\n", re.S)


def _expected(case: dict[str, Any]) -> tuple[str, Any]:
    kind = next(k for k in ("value", "error", "refused") if k in case)
    return kind, case[kind]


def _converted(case: dict[str, Any]) -> tuple[str, Any]:
    value = conversions.Constant("string", case["text"])
    try:
        for function in [*case["chain"], "string"]:
            value = conversions.convert(function, value)
    except conversions.ConversionError as exc:
        return "error", str(exc)
    return "value", value.value


@pytest.mark.parametrize("case", RECORDED["conversions"],
                         ids=lambda c: f"{'-'.join(c['chain'])}({c['text']!r})")
def test_a_conversion_gives_cel_gos_value_or_error(case: dict[str, Any]) -> None:
    assert _converted(case) == _expected(case)


def test_the_recorded_conversions_cover_both_outcomes_of_every_function() -> None:
    """The file exercises acceptance and refusal of each parser (a file of only refusals would
    pass a port that refuses everything)."""
    seen = {(case["chain"][0], "value" in case) for case in RECORDED["conversions"]}
    for function in ("int", "uint", "double", "bool", "duration", "timestamp"):
        assert {(function, True), (function, False)} <= seen, function


def _issues(expression: str) -> list[tuple[int, int, str]] | None:
    try:
        ENV.compile(expression, field_path="x", written=expression)
    except CelCompileError as exc:
        return [(i.line, i.column, i.message) for i in exc.issues]
    return None


@pytest.mark.parametrize("case", RECORDED["creation"], ids=lambda c: c["expression"])
def test_an_expression_is_refused_at_creation_exactly_when_kubernetes_refuses_it(
        case: dict[str, Any]) -> None:
    """Refused with Kubernetes' text: ``program instantiation failed: ...`` (gpuguard adds where:
    the failing call), or the validators' ``invalid duration argument`` at the same line and
    column; accepted expressions compile (their values are the differential tests' matter)."""
    issues = _issues(case["expression"])
    refused = case.get("refused")
    if refused is None:
        assert issues is None
    elif refused.startswith("program instantiation failed: "):
        assert issues is not None and [m for _, _, m in issues] == [refused]
        assert issues[0][:2] != (0, 0)  # the failing call's position
    else:
        assert issues == [(int(line), int(column), message)
                          for line, column, message in _ERROR.findall(refused + "\n")]


def test_a_policy_with_a_failing_constant_conversion_is_refused_naming_file_and_field() -> None:
    """The loader reports it as it reports a compile error: file, document, field path, line
    in the expression; the API server refuses the VAP at creation with the same text."""
    text = yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "p"},
         "spec": {"failurePolicy": "Ignore",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": ["pods"]}]},
                  "validations": [{"expression": "object.spec.containers.size() < 9"},
                                  {"expression": "size(object.spec.containers) <= uint(-1)"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"},
         "spec": {"policyName": "p", "validationActions": ["Deny"]}}])
    documents = [Document("policy.yaml", i, None, body, lines)
                 for i, body, lines in parse_text("policy.yaml", text, with_lines=True)]
    _, errors = build_policy_set(documents, ENV)
    assert [str(e) for e in errors] == [
        "policy.yaml:19: document 0: spec.validations[1].expression: CEL error at "
        "expression line 1, column 33: program instantiation failed: unsigned integer overflow"]


@pytest.mark.parametrize(("expression", "issue"), [
    ("[string(object.s), b'abc'].size() == 2", (1, 20, "expected type 'string' but found 'bytes'")),
    ("[[1], ['a']].size() == 2", (1, 7, "expected type 'list(int)' but found 'list(string)'")),
    ("[timestamp('2000-01-01T00:00:00Z'), duration('1s')].size() == 2",
     (1, 45, "expected type 'timestamp' but found 'duration'")),
])
def test_aggregate_literals_of_mixed_checked_types_are_refused(expression, issue) -> None:
    """cel-go's HomogeneousAggregateLiterals compares checked types (kube-apiserver 1.37's
    answers: same line, column and words); elements written as literals were compared before."""
    assert _issues(expression) == [issue]


@pytest.mark.parametrize("expression", [
    "[1, object.s].size() == 2",  # dyn: Kubernetes refuses, gpuguard cannot tell (known)
    "'%s %d'.format([string(object.s), 1]) == ''",  # format's arguments may mix
    "['a', ?optional.of('v')] == ['a', 'v']",  # an optional element is its value's type
])
def test_aggregates_the_rule_leaves_alone(expression) -> None:
    assert _issues(expression) is None


@pytest.mark.parametrize(("function", "text"), [
    ("int", "1" * 5000), ("uint", "1" * 5000), ("duration", "1" * 5000 + "s"),
    ("int", "0" * 5000 + "1")])
def test_a_5000_digit_string_is_refused_not_a_crash(function, text) -> None:
    """Go's parsers stop at the 64-bit range; Python's int() refuses 4,300 digits with a
    ValueError that crashed the load (found reviewing this change)."""
    if text.startswith("0"):  # leading zeros do not count
        assert conversions.convert(function, conversions.Constant("string", text)).value == 1
        return
    with pytest.raises(conversions.ConversionError):
        conversions.convert(function, conversions.Constant("string", text))
    assert _issues(f"{function}('{text}') == {function}('1')") is not None
