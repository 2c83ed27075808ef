"""The Kubernetes CEL case file, case by case, through the environment the policy loader builds.

``tests/data/k8s-cel/cases.json`` holds 708 expressions with their expected value, error or compile
error, extracted from the Kubernetes 1.34 library tests (k8s.io/apiserver ``pkg/cel/library``,
apiextensions-apiserver's validation-expression tests, cel-go's strings/sets/two-variable
comprehension tests). Each runs as gpuguard runs a policy's expression: ``CelEnvironment(
GPU_LIBRARY)`` as ``gpuguard/policy_set.py`` builds it, with the loader's checks of the text as
written (:func:`tests.controlplane.cel_differential.gpuguard_outcome`, shared with the oracle
tier so both judge the same outcome).

A case passes when gpuguard's outcome is what the case file expects. The others are ``xfail``, each
with the reason from ``tests/data/k8s-cel/known-differences.yaml``, which docs/cel.md repeats:

- ``cases``: gpuguard differs from Kubernetes 1.37 (the oracle tier, tests/controlplane, checks
  that against the real thing), and so from the case file — strict: a fix makes it pass and the
  entry must go;
- ``case_file``: the oracle agrees with gpuguard, only the compile error's words differ — strict;
- ``oracle_vs_case_file``: Kubernetes 1.37's VAP environment itself answers otherwise than the 1.34
  test table, and gpuguard answers as Kubernetes — strict; listed in ``cases`` as well, gpuguard
  differs from Kubernetes and fails the table too — strict — unless its group lists the case in
  ``meets_case_file`` (gpuguard answers as the table: a plain pass, no mark). No case xpasses.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.controlplane.cel_differential import (
    case_request,
    expected_by_case_file,
    gpuguard_outcome,
    load_cases,
    load_known,
)
from tests.paths import ROOT

KNOWN = load_known()
CASES = load_cases()
DOC = ROOT / "docs" / "cel.md"


def _reasons() -> dict[int, tuple[str, bool]]:
    """Case id -> (reason, strict) for the cases expected not to meet the case file."""
    differs = {i: g.reason for g in KNOWN.cases for i in g.ids}
    wording = {i: g.reason for g in KNOWN.case_file for i in g.ids}
    kubernetes = KNOWN.oracle_exceptions()
    meets = {i for g in KNOWN.cases for i in g.meets_case_file}
    reasons: dict[int, tuple[str, bool]] = {}
    for i, reason in kubernetes.items():
        if i in meets:
            continue
        both = i in differs
        reasons[i] = (f"Kubernetes 1.37 answers otherwise than the 1.34 table: {reason}"
                      + (f"; and gpuguard differs from Kubernetes: {differs[i]}" if both else ""),
                      True)
    for i, reason in {**differs, **wording}.items():
        if i in meets:
            continue
        reasons.setdefault(i, (reason, True))
    return reasons


REASONS = _reasons()


def _param(case: dict[str, Any]) -> Any:
    marks = []
    if case["id"] in REASONS:
        reason, strict = REASONS[case["id"]]
        marks.append(pytest.mark.xfail(reason=reason, strict=strict))
    return pytest.param(case, id=f"{case['id']}-{case['library']}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    outcome = gpuguard_outcome(case_request(case))
    verdict = expected_by_case_file(case, outcome)
    assert verdict is not False, (
        f"{case['expression']}\n  expected: "
        f"{ {k: v for k, v in case.items() if k.startswith('expect')} }\n  gpuguard: {outcome}")


def test_every_case_is_checked() -> None:
    """No case without something to compare: each has an expectation the test can judge."""
    unjudged = [c["id"] for c in CASES if expected_by_case_file(c, gpuguard_outcome(
        case_request(c))) is None]
    assert not unjudged
    assert len(CASES) == 708


def test_listed_ids_are_case_ids() -> None:
    ids = {c["id"] for c in CASES}
    assert set(REASONS) <= ids, sorted(set(REASONS) - ids)
    meets = {i for g in KNOWN.cases for i in g.meets_case_file}
    # a case gpuguard answers as the table only matters where Kubernetes does not
    assert meets <= set(KNOWN.oracle_exceptions()), sorted(meets - set(KNOWN.oracle_exceptions()))


@pytest.mark.parametrize("group", [*KNOWN.cases, *KNOWN.case_file],
                         ids=[g.docs or str(g.ids[0]) for g in [*KNOWN.cases, *KNOWN.case_file]])
def test_docs_repeat_each_difference(group: Any) -> None:
    """docs/cel.md names every listed difference (by its ``docs`` title) with its case ids."""
    text = DOC.read_text(encoding="utf-8")
    assert group.docs, f"known-differences.yaml: the group of case {group.ids[0]} has no docs title"
    items = [item for item in text.split("\n- ") if item.startswith(f"**{group.docs}**")]
    assert items, f"docs/cel.md has no item '- **{group.docs}** (ids): ...'"
    listed = items[0].partition("(")[2].partition(")")[0].replace("\n", " ")
    assert [int(i) for i in listed.split(", ")] == list(group.ids), (group.docs, listed)
