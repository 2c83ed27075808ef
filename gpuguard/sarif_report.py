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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

#: SARIF's schema, named in the log as the standard asks (never fetched).
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVELS = (("Deny", "error"), ("Warn", "warning"), ("Audit", "note"))


def _level(result: Mapping[str, Any]) -> str:
    if result["outcome"] == "error":
        return "error"
    actions = set(result.get("actions") or ())
    return next((level for action, level in _LEVELS if action in actions), "warning")


def sarif_log(evaluated: Iterable[tuple[str, int | None, Mapping[str, Any]]],
              version: str, errors: Iterable[str] = ()) -> str:
    """The SARIF log (JSON text) of ``evaluated``: (file as given, 1-based line or None, the
    ``check -o json`` entry of one object) triples; ``version`` is gpuguard's. Input ``errors``
    (what could not be read) make the run's invocation ``executionSuccessful: false`` with one
    error notification each, so a code-scanning tool does not show an incomplete scan as clean."""
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
                       "shortDescription": {"text": f"GPU policy rule {rule}"}}
                      for rule in rules]}},
                  "invocations": [{
                      "executionSuccessful": not (problems := list(errors)),
                      "toolExecutionNotifications": [
                          {"level": "error", "message": {"text": problem}}
                          for problem in problems]}],
                  "results": results}],
    }
    return json.dumps(log, indent=2) + "\n"


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
