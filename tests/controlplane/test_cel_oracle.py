"""gpuguard's CEL environment against Kubernetes' own (the ``celoracle`` built from k8s.io/apiserver).

Every disagreement is reported. Those known today are listed, each with its reason, in
``tests/data/k8s-cel/known-differences.yaml``: the tests fail on a new disagreement and on a
listed one that has become agreement, so the list shrinks as gpuguard closes the gaps (issue 15).
Counts (agree / differ by category) are printed on every run.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.controlplane import cel_expressions
from tests.controlplane.cel_differential import (
    Disagreement,
    case_request,
    classify,
    expected_by_case_file,
    gpuguard_outcome,
    load_cases,
    load_known,
)
from tests.controlplane.celoracle import CelOracle, Outcome

KNOWN = load_known()
CASES = load_cases()
GENERATED_BATCHES = 24
BATCH_SIZE = 40
# Derandomized (the seed comes from the test function), no example database, no shrinking: a
# failing batch already lists every disagreement in it, and shrinking 40 expressions is slow.
DETERMINISTIC = settings(max_examples=GENERATED_BATCHES, derandomize=True, database=None,
                         deadline=None, phases=[Phase.explicit, Phase.generate],
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def oracle(control_plane_bin: Path) -> Iterator[CelOracle]:
    with CelOracle(control_plane_bin / "celoracle") as running:
        yield running


def _report(capsys: pytest.CaptureFixture[str], title: str, total: int,
            differences: list[Disagreement]) -> None:
    by_category = collections.Counter(d.category for d in differences)
    line = ", ".join(f"{c} {n}" for c, n in sorted(by_category.items())) or "none"
    with capsys.disabled():
        print(f"\n{title}: {total} expressions, {total - len(differences)} agree, "
              f"{len(differences)} differ ({line})")


def test_oracle_is_the_kubernetes_environment(oracle: CelOracle) -> None:
    """The oracle is built from the pinned release and compiles as its API server does."""
    info = oracle.info()
    assert info["kubernetes"] == "1.37"
    assert info["compatibilityVersion"] == "1.36"  # n-1: what new policies are validated with
    [plain, bad_regex, no_math, typed] = oracle.outcomes([
        {"expression": "quantity('1Gi').isGreaterThan(quantity('1Mi'))"},
        {"expression": "'x'.matches('(')"},  # regex literals are checked at compile (1.29+)
        {"expression": "math.greatest(1, 2)"},  # the ext math library is not in the VAP env
        {"expression": "request.userInfo.username", "vars": {"request": {"userInfo": {
            "username": "alice"}}}},
    ])
    assert (plain.kind, plain.value) == ("value", True)
    assert bad_regex.kind == "compile" and "invalid matches argument" in bad_regex.message
    assert no_math.kind == "compile" and "undeclared reference to 'math'" in no_math.message
    assert (typed.kind, typed.value, typed.type_name) == ("value", "alice", "string")


def test_oracle_reproduces_the_kubernetes_case_file(oracle: CelOracle,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The case file's expectations (Kubernetes 1.34 tests) hold for the 1.37 oracle, except the
    listed ones, so a difference below is gpuguard's, not the oracle's."""
    outcomes = oracle.outcomes([case_request(c) for c in CASES])
    exceptions = KNOWN.oracle_exceptions()
    wrong, checked = {}, 0
    for case, outcome in zip(CASES, outcomes, strict=True):
        verdict = expected_by_case_file(case, outcome)
        if verdict is None:
            continue
        checked += 1
        if not verdict:
            wrong[case["id"]] = f"{case['expression']} -> {outcome.kind} {outcome.value!r} " \
                                f"{outcome.message[:200]}"
    with capsys.disabled():
        print(f"\noracle vs the case file: {checked} checked, {checked - len(wrong)} as "
              f"expected, {len(wrong)} listed as changed since 1.34")
    unexpected = {i: w for i, w in wrong.items() if i not in exceptions}
    stale = sorted(set(exceptions) - set(wrong))
    assert not unexpected, "oracle disagrees with the case file:\n" + "\n".join(
        f"[{i}] {w}" for i, w in sorted(unexpected.items()))
    assert not stale, f"listed under oracle_vs_case_file but now as expected: {stale}"


def test_case_file_differences_are_exactly_the_known_ones(
        oracle: CelOracle, capsys: pytest.CaptureFixture[str]) -> None:
    requests = [case_request(c) for c in CASES]
    kubernetes = oracle.outcomes(requests)
    differences = []
    for case, request, theirs in zip(CASES, requests, kubernetes, strict=True):
        ours = gpuguard_outcome(request)
        category = classify(ours, theirs)
        if category is not None:
            differences.append(Disagreement(str(case["id"]), category, request["expression"],
                                            ours, theirs))
    _report(capsys, "gpuguard vs Kubernetes 1.37 on the case file", len(CASES), differences)
    listed = KNOWN.case_categories()
    found = {int(d.key): d for d in differences}
    new = [d for i, d in sorted(found.items()) if listed.get(i) != d.category]
    gone = sorted(i for i in listed if i not in found)
    message = []
    if new:
        message.append("new or re-categorised disagreements (fix them or list them in "
                       "tests/data/k8s-cel/known-differences.yaml with the reason):\n" +
                       "\n".join(d.describe() +
                                 (f"\n    listed as {listed[int(d.key)]}"
                                  if int(d.key) in listed else "") for d in new))
    if gone:
        message.append(f"listed cases that now agree (remove them from the file): {gone}")
    assert not message, "\n".join(message)


def _generated_differences(oracle: CelOracle, batch: list[dict[str, Any]]
                           ) -> list[Disagreement]:
    kubernetes = oracle.outcomes(batch)
    found = []
    for n, (request, theirs) in enumerate(zip(batch, kubernetes, strict=True)):
        ours = gpuguard_outcome(request)
        category = classify(ours, theirs)
        if category is not None:
            found.append(Disagreement(f"g{n}", category, request["expression"], ours, theirs))
    return found


def test_generated_expressions_differ_only_as_known(oracle: CelOracle,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Hypothesis-generated expressions over every library and random objects (deterministic:
    derandomized, no database); a disagreement no pattern of the file explains fails the run."""
    seen: list[Disagreement] = []
    total = 0

    @DETERMINISTIC
    @given(st.lists(cel_expressions.requests, min_size=BATCH_SIZE, max_size=BATCH_SIZE))
    def run(batch: list[dict[str, Any]]) -> None:
        nonlocal total
        total += len(batch)
        seen.extend(_generated_differences(oracle, batch))

    run()  # every batch first, so that the failure below lists every unexplained disagreement
    _report(capsys, "gpuguard vs Kubernetes 1.37 on generated expressions", total, seen)
    assert total == GENERATED_BATCHES * BATCH_SIZE
    unexplained = [d for d in seen if KNOWN.pattern_for(d) is None]
    assert not unexplained, (
        "disagreements no entry of known-differences.yaml (generated) explains:\n" +
        "\n".join(d.describe() for d in unexplained))


@pytest.mark.parametrize("pattern", KNOWN.generated,
                         ids=[f"{n}-{p.category}" for n, p in enumerate(KNOWN.generated)])
def test_each_known_generated_difference_still_differs(oracle: CelOracle, pattern: Any) -> None:
    """A pattern's example must still differ in its category: once gpuguard agrees, the entry
    goes."""
    [theirs] = oracle.outcomes([pattern.example])
    ours: Outcome = gpuguard_outcome(pattern.example)
    category = classify(ours, theirs)
    example = Disagreement("example", category or "agree", pattern.example["expression"], ours,
                           theirs)
    assert pattern.explains(example), (
        f"{example.describe()}\n    listed as {pattern.category} ({pattern.reason}): if "
        "gpuguard now agrees, remove the entry from known-differences.yaml")


AUTHORIZER_SPEC = {"decision": "noOpinion", "reason": "no rule", "rules": [
    {"verb": "use", "group": "gpuguard.io", "resource": "gpus", "namespace": "ml",
     "name": "NVIDIA-H100-80GB-HBM3", "decision": "allow", "reason": "RBAC: allowed by x"},
    {"verb": "create", "resource": "pods", "subresource": "", "decision": "allow",
     "reason": "pods ok"},
    {"verb": "get", "path": "/healthz", "decision": "deny", "reason": "no health"}]}
AUTHORIZER_EXPRESSIONS = [
    "authorizer.group('gpuguard.io').resource('gpus').namespace('ml')"
    ".name('NVIDIA-H100-80GB-HBM3').check('use').allowed()",
    "authorizer.group('gpuguard.io').resource('gpus').namespace('ml').name('x').check('use')"
    ".reason()",
    "authorizer.group('gpuguard.io').resource('gpus').namespace('ml')"
    ".name('NVIDIA-H100-80GB-HBM3').check('use').reason()",
    "authorizer.requestResource.check('create').allowed()",
    "authorizer.requestResource.subresource('status').check('create').allowed()",
    "authorizer.path('/healthz').check('get').allowed()",
    "authorizer.path('/healthz').check('get').reason()",
    "authorizer.path('/healthz').check('get').errored()",
    "authorizer.path('/healthz').check('get').error()",
    "authorizer.serviceAccount('ml', 'runner').group('').resource('pods').check('create')"
    ".allowed()",
    "authorizer.path('')",
    "authorizer.group('').resource('  ')",
    "authorizer.serviceAccount('ml', 'Runner')",
    "authorizer.serviceAccount('m_l', 'runner')",
    "type(authorizer.group('').resource('pods').check('get')) == "
    "type(authorizer.path('/x').check('get'))",
]


def test_authorizer_decisions_agree_with_kubernetes(oracle: CelOracle) -> None:
    """authz.go's semantics through an authorizer both sides answer alike (the oracle's
    staticAuthorizer, cel_differential.StaticAuthorizer): decisions, reasons, the request's own
    resource, service accounts and the argument errors."""
    request = {"resource": {"group": "", "version": "v1", "resource": "pods"},
               "namespace": "ml", "name": "train", "userInfo": {"username": "alice"}}
    requests = [{"expression": e, "vars": {"request": request}, "authorizer": AUTHORIZER_SPEC}
                for e in AUTHORIZER_EXPRESSIONS]
    differences = []
    for req, kubernetes in zip(requests, oracle.outcomes(requests), strict=True):
        ours = gpuguard_outcome(req)
        category = classify(ours, kubernetes)
        if category is not None:
            differences.append(f"{category}: {req['expression']}\n  gpuguard {ours}\n  "
                               f"kubernetes {kubernetes}")
    assert not differences, "\n".join(differences)
