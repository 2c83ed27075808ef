r"""``gpuguard test -o junit``: the suites' results as JUnit XML, the test-report format CI systems
(GitLab, Jenkins, GitHub's test reporters, Azure) show per case.

Owns the mapping: one ``<testsuite>`` per GPUPolicyTest suite (``file`` = its source), one
``<testcase>`` per case (``classname`` = the suite); a ``fail`` case gets ``<failure>``, an
``error`` case ``<error>``, a ``skip`` case ``<skipped>``, each with the case's differences; a
problem with a whole suite (unreadable, policies that do not load) is an ``<error>`` testcase named
``(suite)``. Characters XML 1.0 cannot hold are written as ``\uXXXX``. Must not run anything.

``gpuguard check -o junit`` too (:func:`check_suites`): one suite per input file, one case per
object; a denied object fails, one with an evaluation error errors (a denial wins), each failed
or errored rule and quota denial one line of the case.

``gpuguard audit -o junit`` goes through the same writer (:func:`audit_suites`): one suite per
namespace (``(cluster-scoped)`` for workloads without one), one case per evaluated workload; a
workload with a ``deny`` or ``audit`` finding fails, one with an evaluation error errors, each
finding one line of the case; ``warn`` and ``info`` findings do not fail a case (the PolicyReports
and ``-o sarif`` carry them).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from policies.suites import ERRORED, FAILED, PASSED, SKIPPED, CaseResult, SuiteResult

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ELEMENT = {FAILED: "failure", ERRORED: "error", SKIPPED: "skipped"}


def _text(value: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m[0]):04x}", value)


def _counts(element: ET.Element, cases: Sequence[ET.Element]) -> None:
    """``tests``, ``failures``, ``errors`` and ``skipped`` of ``element`` from its cases."""
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))


def junit_xml(results: Sequence[SuiteResult], name: str = "gpuguard test") -> str:
    """The JUnit XML document (UTF-8 text with its declaration) of ``results``; ``name`` is the
    ``<testsuites>`` element's (the command that ran)."""
    root = ET.Element("testsuites", name=name)
    every: list[ET.Element] = []
    for suite in results:
        element = ET.SubElement(root, "testsuite", name=_text(suite.name),
                                file=_text(suite.source))
        cases = []
        for problem in suite.errors:
            case = ET.SubElement(element, "testcase", classname=_text(suite.name),
                                 name="(suite)", file=_text(suite.source))
            ET.SubElement(case, "error", message=_text(problem)).text = _text(problem)
            cases.append(case)
        for result in suite.cases:
            case = ET.SubElement(element, "testcase", classname=_text(suite.name),
                                 name=_text(result.case), file=_text(result.source))
            tag = _ELEMENT.get(result.status)
            if tag is not None:
                detail = "\n".join(result.differences)
                first = result.differences[0] if result.differences else result.status
                child = ET.SubElement(case, tag, message=_text(first))
                if tag != "skipped":
                    child.text = _text(detail)
            cases.append(case)
        _counts(element, cases)
        every += cases
    _counts(root, every)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") \
        + "\n"


def _workload(ref: Mapping[str, Any]) -> str:
    return f"{ref['kind']}/{ref['name']}"


def audit_suites(report: Mapping[str, Any]) -> list[SuiteResult]:
    """The audit report (``gpuguard audit -o json``'s AuditReport) as suite results for
    :func:`junit_xml`: per namespace, one case per evaluated workload (see the module's text);
    the report's input ``errors`` are error cases of the suite :data:`INPUT_SUITE`."""
    lines: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for finding in report["findings"]:
        ref = finding["workload"]
        key = (ref["namespace"] or "", ref["kind"], ref["name"])
        lines.setdefault(key, []).append((finding["severity"], f"{finding['severity']} "
                                          f"{finding['policy']}/{finding['rule']}: "
                                          f"{finding['message']}"))
    cases: dict[str, list[CaseResult]] = {}
    # The snapshot's paths, or "cluster" for a live audit.
    given = report.get("source", {})
    source = ",".join(given.get("paths") or ()) or str(given.get("kind", ""))
    for workload in report["workloads"]:
        if not workload.get("evaluated"):
            continue
        namespace = workload["namespace"] or ""
        found = lines.get((namespace, workload["kind"], workload["name"]), [])
        severities = {severity for severity, _ in found}
        status = ERRORED if "error" in severities else FAILED if severities & {"deny", "audit"} \
            else PASSED
        suite = namespace or "(cluster-scoped)"
        cases.setdefault(suite, []).append(CaseResult(
            suite=suite, source=source, case=_workload(workload), status=status,
            differences=tuple(line for severity, line in found if severity != "info")))
    return [*(SuiteResult(source=source, name=name, cases=tuple(found))
              for name, found in sorted(cases.items())),
            *_input_errors(report.get("errors") or (), source)]


INPUT_SUITE = "(input)"
"""The suite whose ``(suite)`` error cases are the input errors of ``check`` and ``audit`` (a file
that holds no object, a document that is not one): a CI system must show them, not a green run of
what could be read."""


def _input_errors(errors: Sequence[str], source: str) -> list[SuiteResult]:
    return [SuiteResult(source=source, name=INPUT_SUITE, errors=tuple(errors))] if errors else []


def check_suites(evaluated: Sequence[tuple[str, Mapping[str, Any]]],
                 errors: Sequence[str] = ()) -> list[SuiteResult]:
    """``gpuguard check`` entries (``-o json``'s ``results``), each with the file it was read
    from (``-``: stdin), as suite results for :func:`junit_xml` (see the module's text); its
    input ``errors`` (``-o json``'s ``errors``) are error cases of the suite
    :data:`INPUT_SUITE`."""
    cases: dict[str, list[CaseResult]] = {}
    for source, entry in evaluated:
        what = f"{entry['kind']}/{entry['namespace'] + '/' if entry['namespace'] else ''}" \
            f"{entry['name']}"
        lines = [f"{r['outcome']} {r['policy']}/{r['rule']}: {r['message']}"
                 for r in entry["results"] if r["outcome"] in ("fail", "error")]
        lines += [f"quota: {denial}" for denial in entry["quota"]["denials"]]
        errored = any(r["outcome"] == "error" for r in entry["results"])
        status = FAILED if not entry["allowed"] else ERRORED if errored else PASSED
        cases.setdefault(source, []).append(CaseResult(
            suite=source, source=source, case=what, status=status, differences=tuple(lines)))
    return [*(SuiteResult(source=source, name=source, cases=tuple(found))
              for source, found in cases.items()), *_input_errors(errors, "-")]
