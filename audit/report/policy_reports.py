"""PolicyReports (``wgpolicyk8s.io/v1alpha2``, Kubernetes Policy WG) built from an audit report.

Owns the mapping from the audit report to the report objects tools such as Policy Reporter and
the Kyverno UI read: **one** ``PolicyReport`` named ``gpuguard-audit`` per namespace that has
evaluated workloads — never one object per resource — holding a result per finding and per
exception, with ``summary`` counting those results by outcome; and one
``ClusterPolicyReport`` named ``gpuguard-audit`` for the findings of workloads without a namespace
and the cluster-scoped placement problems of nodes (stranded GPUs, broken MIG layouts, GFD label
inconsistencies): no finding is left out of the reports. The audit's input errors (an unreadable
file or document, an object that could not be audited) are results of the ClusterPolicyReport
too — policy ``gpuguard-audit``, rule ``input``, result ``error``, severity ``high``, the message
naming the file and document, listed first — and its annotation ``gpuguard.io/input-errors``
counts them: a report over part of the input never reads as a clean one in Policy Reporter or the
Kyverno UI (``summary.error`` is the count).

Mapping: ``deny`` → result ``fail``, severity ``high``; ``warn`` → ``warn`` / ``medium``;
``audit`` → ``fail`` / ``low``; ``error`` → ``error`` / ``medium``; an exception → ``skip`` /
``info``. ``info`` findings (mutations admission would apply) are not results. Results are
ordered by severity and cut so that one object stays under ``MAX_REPORT_BYTES`` (etcd's limit is
1.5 MiB); the ``gpuguard.io/truncated-results`` annotation then says how many were left out, and
``summary`` still counts them all. ``summary`` is always the count of the results (before a cut):
the audit knows how many rule evaluations passed, not which, so there are no ``pass`` results and
``summary.pass`` is 0; that count is the annotation ``gpuguard.io/passed-rules`` (namespaces) and
``gpuguard.io/nodes-without-problems`` (the ClusterPolicyReport).

Must not talk to the cluster (:mod:`kube.policy_reports` writes them).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

API_VERSION = "wgpolicyk8s.io/v1alpha2"
REPORT_NAME = "gpuguard-audit"
SOURCE = "gpuguard"
MAX_REPORT_BYTES = 1_000_000
_RESULT = {"deny": ("fail", "high"), "warn": ("warn", "medium"), "audit": ("fail", "low"),
           "error": ("error", "medium")}
LABELS = {"app.kubernetes.io/managed-by": "gpuguard"}


def _timestamp(report: Mapping[str, Any]) -> dict[str, int]:
    try:
        when = datetime.datetime.fromisoformat(report["generated"])
    except (KeyError, TypeError, ValueError):
        when = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return {"seconds": int(when.timestamp()), "nanos": 0}


def _resource(ref: Mapping[str, Any]) -> dict[str, str]:
    reference = {"kind": str(ref["kind"]), "name": str(ref["name"])}
    if ref.get("namespace"):
        reference["namespace"] = str(ref["namespace"])
    if ref.get("group") is not None:
        # The version is not known for owners named only by reference; the group is.
        reference["apiVersion"] = str(ref["group"]) or "v1"
    return reference


def _ref_text(ref: Mapping[str, Any] | None) -> str:
    if not ref:
        return ""
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    return f"{ref['kind']}/{where}{ref['name']}"


def _cut(results: list[dict[str, Any]], base_size: int) -> tuple[list[dict[str, Any]], int]:
    """Keep results (already ordered by severity) while the object stays under the limit."""
    kept = []
    size = base_size
    for result in results:
        size += len(json.dumps(result)) + 1
        if size > MAX_REPORT_BYTES:
            break
        kept.append(result)
    return kept, len(results) - len(kept)


def _summary(results: list[dict[str, Any]]) -> dict[str, int]:
    """The count of ``results`` by outcome (wgpolicyk8s.io's PolicyReportSummary)."""
    return {kind: sum(1 for r in results if r["result"] == kind)
            for kind in ("pass", "fail", "warn", "error", "skip")}


def _finish(obj: dict[str, Any], results: list[dict[str, Any]],
            annotations: dict[str, str]) -> dict[str, Any]:
    """``obj`` with its summary (of every result), its results cut to the size limit and its
    annotations."""
    obj["summary"] = _summary(results)
    kept, dropped = _cut(results, len(json.dumps(obj)) + len(json.dumps(annotations)))
    if dropped:
        annotations = {**annotations, "gpuguard.io/truncated-results": f"{dropped} results "
                       "left out to stay under the object size limit"}
    obj["metadata"]["annotations"] = annotations
    obj["results"] = kept
    return obj


def _finding_result(finding: Mapping[str, Any], stamp: Mapping[str, int]) -> dict[str, Any] | None:
    """The report result of one finding (None for ``info``: mutations are not results)."""
    mapped = _RESULT.get(finding["severity"])
    if mapped is None:
        return None
    result, severity = mapped
    properties = {"evaluated": _ref_text(finding["evaluated"]),
                  "actions": ",".join(finding["actions"]) or "none"}
    if finding["path"]:
        properties["path"] = finding["path"]
    if finding.get("team"):
        properties["team"] = str(finding["team"])
    return {"source": SOURCE, "policy": finding["policy"], "rule": finding["rule"],
            "category": "GPU compliance", "severity": severity, "result": result,
            "scored": True, "timestamp": stamp, "message": finding["message"],
            "resources": [_resource(finding["workload"])], "properties": properties}


def _exception_result(exception: Mapping[str, Any], stamp: Mapping[str, int]) -> dict[str, Any]:
    return {"source": SOURCE, "policy": exception["policy"], "rule": "exceptions",
            "category": "GPU compliance", "severity": "info", "result": "skip",
            "scored": False, "timestamp": stamp,
            "message": f"exempt: {exception['reason']}",
            "resources": [_resource(exception["workload"])],
            "properties": {"exception": exception["reason"]}}


def _compliance_results(report: Mapping[str, Any], stamp: Mapping[str, int]
                        ) -> dict[str | None, list[dict[str, Any]]]:
    """Findings and exceptions as results, by the workload's namespace (None: the workload is
    cluster-scoped or its manifest names no namespace; those go to the ClusterPolicyReport, so
    no finding is ever left out of the reports)."""
    by_namespace: dict[str | None, list[dict[str, Any]]] = {}
    for finding in report["findings"]:
        result = _finding_result(finding, stamp)
        if result is not None:
            by_namespace.setdefault(finding["workload"]["namespace"] or None, []).append(result)
    for exception in report["exceptions"]:
        by_namespace.setdefault(exception["workload"]["namespace"] or None, []).append(
            _exception_result(exception, stamp))
    return by_namespace


def namespace_reports(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``PolicyReport`` per namespace with evaluated workloads."""
    stamp = _timestamp(report)
    by_namespace = _compliance_results(report, stamp)
    reports = []
    for entry in report["namespaces"]:
        namespace = entry["namespace"]
        if not namespace:
            continue
        results = by_namespace.get(namespace, [])
        obj = {"apiVersion": API_VERSION, "kind": "PolicyReport",
               "metadata": {"name": REPORT_NAME, "namespace": namespace, "labels": dict(LABELS)}}
        reports.append(_finish(obj, results,
                               {"gpuguard.io/passed-rules": str(entry["passed_rules"])}))
    return reports


def cluster_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ClusterPolicyReport``: the findings of workloads without a namespace (cluster-scoped,
    or a manifest that names none), then the placement problems of nodes."""
    stamp = _timestamp(report)
    results = []
    for node in report["nodes"]:
        resource = [{"apiVersion": "v1", "kind": "Node", "name": node["name"]}]
        stranded = node.get("stranded")
        if stranded:
            eq = stranded["gpu_equivalents"]
            results.append({
                "source": SOURCE, "policy": "gpuguard-placement", "rule": "stranded-gpus",
                "category": "GPU placement", "severity": "medium", "result": "warn",
                "scored": False, "timestamp": stamp,
                "message": f"{'unknown' if eq is None else f'{eq:g}'} free GPU-equivalent(s) "
                           "no pod can use: " + "; ".join(stranded["reasons"]),
                "resources": resource,
                "properties": {"reasons": "; ".join(stranded["reasons"]),
                               "gpuEquivalents": "unknown" if eq is None else f"{eq:g}"}})
        for warning in node["warnings"]:
            results.append({
                "source": SOURCE, "policy": "gpuguard-placement", "rule": "node-gpu-labels",
                "category": "GPU placement", "severity": "low", "result": "warn",
                "scored": False, "timestamp": stamp, "message": warning,
                "resources": resource})
    compliance = _compliance_results(report, stamp).get(None, [])
    healthy = sum(1 for n in report["nodes"] if not n.get("stranded") and not n["warnings"])
    errors = [str(e) for e in report.get("errors") or ()]
    results = [*_input_error_results(errors, stamp), *compliance, *results]
    obj = {"apiVersion": API_VERSION, "kind": "ClusterPolicyReport",
           "metadata": {"name": REPORT_NAME, "labels": dict(LABELS)}}
    annotations = {"gpuguard.io/nodes-without-problems": str(healthy)}
    if errors:
        annotations["gpuguard.io/input-errors"] = (
            f"{len(errors)} input error(s): the report covers only the input that could be read")
    return _finish(obj, results, annotations)


def _input_error_results(errors: list[str], stamp: Mapping[str, int]) -> list[dict[str, Any]]:
    """One ``error`` result per input error (``"<file>: document N: <problem>"``): no resource,
    as there may be none (a file that does not parse names no object)."""
    return [{"source": SOURCE, "policy": "gpuguard-audit", "rule": "input",
             "category": "GPU audit input", "severity": "high", "result": "error",
             "scored": False, "timestamp": stamp, "message": error,
             "properties": {"inputError": "the audit could not read or audit this input: the "
                            "report leaves it out"}}
            for error in errors]


def build(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every report object: the namespaces' PolicyReports, then the ClusterPolicyReport."""
    return [*namespace_reports(report), cluster_report(report)]
