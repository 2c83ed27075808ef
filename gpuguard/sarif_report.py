"""``gpuguard check -o sarif``: the policies' findings on manifest files as a SARIF 2.1.0 log, the
format code-scanning tools (GitHub code scanning, GitLab, Azure DevOps) annotate files with.

Owns the mapping: one rule per policy rule (``POLICY/RULE``), one result per failed or errored rule
of an evaluated object (and per GPUQuota denial, rule ``gpuquota``), located at the object's file
and first line. Level from the rule's validation actions: ``Deny`` → ``error``, ``Warn`` →
``warning``, ``Audit`` → ``note``; an evaluation error is an ``error``. Standard input has no file
to point at: its results have no location. Must not evaluate anything.

``gpuguard audit -o sarif`` goes through the same writer (:func:`audit_entries`): one result per
``deny``, ``warn``, ``audit`` or ``error`` finding of the audit report, at no file location (a
snapshot or a cluster is scanned, not files); ``info`` findings (mutations) are not results.

``gpuguard test -o sarif`` too (:func:`test_entries`): one rule per suite case (``SUITE/CASE``)
and one ``error`` result per failed or errored case, at the suite's file; an errored case and a
suite that could not be read are also the invocation's error notifications.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuguard.output_formats import json_text

if TYPE_CHECKING:  # the suite runner is imported by test only (check and audit do not need it)
    from policies.suites import SuiteResult

#: SARIF's schema, named in the log as the standard asks (never fetched).
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVELS = (("Deny", "error"), ("Warn", "warning"), ("Audit", "note"))


def _level(result: Mapping[str, Any]) -> str:
    if result["outcome"] == "error":
        return "error"
    actions = set(result.get("actions") or ())
    return next((level for action, level in _LEVELS if action in actions), "warning")


def sarif_log(evaluated: Iterable[tuple[str, int | None, Mapping[str, Any]]],
              version: str, errors: Iterable[str] = (), *,
              rule_kind: str = "GPU policy rule") -> str:
    """The SARIF log (JSON text) of ``evaluated``: (file as given, 1-based line or None, the
    ``check -o json`` entry of one object) triples; ``version`` is gpuguard's. Input ``errors``
    (what could not be read) make the run's invocation ``executionSuccessful: false`` with one
    error notification each, so a code-scanning tool does not show an incomplete scan as clean.
    ``rule_kind`` opens each rule's short description (``GPU policy rule POLICY/RULE``)."""
    rules: dict[str, int] = {}
    results = []
    for source, line, entry in evaluated:
        what = f"{entry['kind']} {entry['namespace'] + '/' if entry['namespace'] else ''}" \
            f"{entry['name']}"
        found = [(f"{r['policy']}/{r['rule']}" if r.get("rule") else r["policy"], _level(r),
                  r["message"]) for r in entry["results"] if r["outcome"] in ("fail", "error")]
        found += [("gpuquota", "error", denial) for denial in entry["quota"]["denials"]]
        for rule, level, message in found:
            index = rules.setdefault(rule, len(rules))
            result: dict[str, Any] = {"ruleId": rule, "ruleIndex": index, "level": level,
                                      "message": {"text": f"{what}: {message}"}}
            if source != "-":
                region = {"region": {"startLine": line}} if line else {}
                result["locations"] = [{"physicalLocation": {
                    "artifactLocation": {"uri": source}, **region}}]
            results.append(result)
    log = {
        "$schema": SCHEMA, "version": "2.1.0",
        "runs": [{"tool": {"driver": {
            "name": "gpuguard", "version": version,
            "rules": [{"id": rule, "name": rule,
                       "shortDescription": {"text": f"{rule_kind} {rule}"}}
                      for rule in rules]}},
                  "invocations": [{
                      "executionSuccessful": not (problems := list(errors)),
                      "toolExecutionNotifications": [
                          {"level": "error", "message": {"text": problem}}
                          for problem in problems]}],
                  "results": results}],
    }
    return json_text(log) + "\n"


def audit_entries(report: Mapping[str, Any]) -> list[tuple[str, int | None, dict[str, Any]]]:
    """The audit report's findings (``gpuguard audit -o json``) as :func:`sarif_log` triples:
    one ``check``-shaped entry per finding, with no file (source ``-``)."""
    entries: list[tuple[str, int | None, dict[str, Any]]] = []
    for finding in report["findings"]:
        if finding["severity"] == "info":
            continue
        ref = finding["workload"]
        outcome = "error" if finding["severity"] == "error" else "fail"
        entries.append(("-", None, {
            "kind": ref["kind"], "namespace": ref["namespace"] or "", "name": ref["name"],
            "results": [{"policy": finding["policy"], "rule": finding["rule"], "outcome": outcome,
                         "actions": finding["actions"], "message": finding["message"]}],
            "quota": {"denials": []}}))
    return entries


def test_entries(results: Sequence[SuiteResult]) -> tuple[
        list[tuple[str, int | None, dict[str, Any]]], list[str]]:
    """The ``gpuguard test`` results as :func:`sarif_log` triples — one ``check``-shaped entry
    per failed or errored case, ruled ``SUITE/CASE`` at the case's file — and the input errors
    (each suite's own problems, each errored case's) for the invocation."""
    from policies.suites import ERRORED, FAILED  # noqa: PLC0415 - see the import above

    entries: list[tuple[str, int | None, dict[str, Any]]] = []
    errors: list[str] = []
    for suite in results:
        errors += list(suite.errors)
        for case in suite.cases:
            if case.status not in (FAILED, ERRORED):
                continue
            message = "; ".join(case.differences) or case.status
            if case.status == ERRORED:
                errors.append(f"{suite.name}/{case.case}: {message}")
            entries.append((case.source, None, {
                "kind": "GPUPolicyTest", "namespace": "", "name": suite.name,
                "results": [{"policy": suite.name, "rule": case.case,
                             "outcome": "error" if case.status == ERRORED else "fail",
                             "actions": ["Deny"], "message": f"case {case.case}: {message}"}],
                "quota": {"denials": []}}))
    return entries, errors
