"""The audit report: one JSON-ready dict with a stable, documented shape.

Owns assembling the scan's parts — placement figures, compliance findings, utilization — into the
report every renderer reads (terminal, JSON, Markdown, HTML, PolicyReports) and history stores. The
shape is documented field by field in ``docs/audit-report.md``; ``apiVersion`` changes when a field
changes meaning or disappears (new fields may be added).

Must not read input, evaluate policies or render.
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from audit.compliance import SEVERITIES, ComplianceResult, Finding
from audit.ownership import ObjectKey, namespace_order
from audit.placement import as_float
from audit.settings import AuditSettings
from policies.quota import QuotaStatus

if TYPE_CHECKING:
    from audit.scanner import Scanner

API_VERSION = "gpuguard.io/v1alpha1"
KIND = "AuditReport"


def ref(key: ObjectKey) -> dict[str, Any]:
    """``{kind, group, namespace, name}`` of an object key."""
    return {"kind": key.kind, "group": key.group, "namespace": key.namespace, "name": key.name}


def finding_dict(finding: Finding, team: str | None) -> dict[str, Any]:
    """One entry of ``findings``."""
    return {
        "severity": finding.severity, "policy": finding.policy, "rule": finding.rule,
        "path": finding.path, "outcome": finding.outcome, "message": finding.message,
        "actions": list(finding.actions), "workload": ref(finding.workload),
        "evaluated": ref(finding.evaluated), "team": team,
    }


def quota_entry(status: QuotaStatus, team_of: Any) -> dict[str, Any]:
    """One entry of ``quotas``: a GPUQuota's usage against its limits (docs/audit-report.md)."""
    quota = status.quota
    scope = quota.scope
    team = scope.value if scope.kind == "Team" else \
        team_of(scope.namespace) if scope.kind == "Namespace" else None
    ratios = status.ratios()
    return {
        "name": quota.name, "source": quota.source, "team": team,
        "scope": scope.to_cel(), "limits": quota.limits.to_cel(), "used": status.used.to_cel(),
        # A limit of 0 with usage is an infinite ratio: null (JSON has no infinity).
        "usage_ratio": {k: round(v, 4) if math.isfinite(v) else None for k, v in ratios.items()},
        "max_ratio": (round(max(ratios.values()), 4) if math.isfinite(max(ratios.values()))
                      else None) if ratios else None,
        "headroom_gpu_equivalents": status.to_cel().get("headroomGpuEquivalents"),
        "state": status.state(),
    }


def _severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def assemble(*, settings: AuditSettings, source: Mapping[str, Any], scanner: Scanner,
             placement: dict[str, Any], compliance: ComplianceResult,
             utilization: dict[str, Any] | None, errors: list[str],
             generated: datetime.datetime,
             quotas: list[QuotaStatus] | None = None) -> dict[str, Any]:
    """Build the report (see module docstring)."""
    root = scanner.ownership.root
    team_of = scanner.team_of_namespace

    # --- workloads -----------------------------------------------------------------------------
    workloads: dict[ObjectKey, dict[str, Any]] = {}

    def workload(key: ObjectKey) -> dict[str, Any]:
        entry = workloads.get(key)
        if entry is None:
            entry = workloads[key] = {
                **ref(key), "team": team_of(key.namespace), "present": False, "gpu": False,
                "pods": Counter(), "gpu_pods": Counter(), "allocated": Fraction(0),
                "allocated_unknown_pods": 0, "pending": Fraction(0), "pending_unknown_pods": 0,
                "resources": Counter(), "findings": Counter(), "evaluated": None}
        return entry

    for key, gpu in scanner.present.items():
        entry = workload(root(key))
        entry["gpu"] = entry["gpu"] or gpu
        entry["present"] = entry["present"] or root(key) == key
    for owner, tally in scanner.placement.tallies.items():
        entry = workload(root(owner))
        entry["gpu"] = entry["gpu"] or tally.gpu_requested
        entry["pods"].update(running=tally.running, pending=tally.pending,
                             finished=tally.finished)
        entry["gpu_pods"].update(running=tally.gpu_running, pending=tally.gpu_pending)
        entry["pending"] += tally.pending_eq
        entry["pending_unknown_pods"] += tally.pending_unknown
        if owner == root(owner) and owner.kind == "Pod" and not owner.group:
            entry["present"] = True
    for owner, usage in scanner.placement.owner_usage().items():
        entry = workload(root(owner))
        entry["allocated"] += usage.equivalents
        entry["allocated_unknown_pods"] += usage.unknown_pods
        entry["resources"].update(usage.resources)
    for key, evaluated in compliance.evaluated.items():
        workload(key)["evaluated"] = ref(evaluated)
    for finding in compliance.findings:
        workload(finding.workload)["findings"][finding.severity] += 1

    # --- findings, exceptions ------------------------------------------------------------------
    findings = sorted(
        (finding_dict(f, team_of(f.workload.namespace)) for f in compliance.findings),
        key=lambda f: (_severity_rank(f["severity"]), namespace_order(f["workload"]["namespace"]),
                       f["workload"]["kind"], f["workload"]["name"], f["policy"], f["rule"]))
    exceptions = [{"policy": e.policy, "workload": ref(e.workload),
                   "team": team_of(e.workload.namespace), "reason": e.reason}
                  for e in compliance.exemptions]
    by_policy = [{"policy": policy, **{s: counts.get(s, 0) for s in SEVERITIES},
                  "pass": counts.get("pass", 0), "exempt": counts.get("exempt", 0)}
                 for policy, counts in compliance.by_policy.items()]

    # --- teams ---------------------------------------------------------------------------------
    teams: dict[str | None, dict[str, Any]] = {}
    for entry in workloads.values():
        if not (entry["gpu"] or entry["findings"]):
            continue
        team = teams.setdefault(entry["team"], {
            "team": entry["team"], "namespaces": set(), "workloads": 0,
            "gpu_pods": Counter(), "allocated": Fraction(0), "allocated_unknown_pods": 0,
            "pending": Fraction(0), "pending_unknown_pods": 0, "resources": Counter(),
            "findings": Counter()})
        if entry["namespace"]:
            team["namespaces"].add(entry["namespace"])
        team["workloads"] += 1
        team["gpu_pods"].update(entry["gpu_pods"])
        team["allocated"] += entry["allocated"]
        team["allocated_unknown_pods"] += entry["allocated_unknown_pods"]
        team["pending"] += entry["pending"]
        team["pending_unknown_pods"] += entry["pending_unknown_pods"]
        team["resources"].update(entry["resources"])
        team["findings"].update(entry["findings"])
    idle_by_team = {t["team"]: t for t in (utilization or {}).get("teams", [])}
    allocatable = placement["cluster"]["gpu_equivalents"]["allocatable"] or 0.0
    team_list = []
    for team in sorted(teams.values(), key=lambda t: (t["team"] is None, t["team"] or "")):
        idle = idle_by_team.get(team["team"])
        team_list.append({
            "team": team["team"], "namespaces": sorted(team["namespaces"]),
            "workloads": team["workloads"],
            "gpu_pods": {"running": team["gpu_pods"]["running"],
                         "pending": team["gpu_pods"]["pending"]},
            "gpu_equivalents": {
                "allocated": as_float(team["allocated"]),
                "share_of_cluster": round(float(team["allocated"]) / allocatable, 4)
                if allocatable else None,
                "pending": as_float(team["pending"]),
                "idle_allocated": idle["idle_gpu_equivalents"] if idle else None,
                "unknown_pods": team["allocated_unknown_pods"] + team["pending_unknown_pods"],
            },
            "mean_utilization": idle["mean_utilization"] if idle else None,
            "resources": dict(sorted(team["resources"].items())),
            "findings": {s: team["findings"].get(s, 0) for s in SEVERITIES},
        })

    # --- workloads list --------------------------------------------------------------------------
    workload_list = []
    for key in sorted(workloads):
        entry = workloads[key]
        if not (entry["gpu"] or entry["findings"]):
            continue
        workload_list.append({
            "kind": entry["kind"], "group": entry["group"], "namespace": entry["namespace"],
            "name": entry["name"], "team": entry["team"], "in_snapshot": entry["present"],
            "gpu": entry["gpu"],
            "pods": {s: entry["pods"][s] for s in ("running", "pending", "finished")},
            "gpu_pods": {s: entry["gpu_pods"][s] for s in ("running", "pending")},
            "gpu_equivalents": {"allocated": as_float(entry["allocated"]),
                                "pending": as_float(entry["pending"]),
                                "unknown_pods": entry["allocated_unknown_pods"]
                                + entry["pending_unknown_pods"]},
            "resources": dict(sorted(entry["resources"].items())),
            "evaluated": entry["evaluated"],
            "passed_rules": compliance.passes.get(key, 0),
            "findings": {s: entry["findings"].get(s, 0) for s in SEVERITIES},
        })

    # --- namespaces (PolicyReport summaries) ---------------------------------------------------
    namespaces: dict[str | None, dict[str, Any]] = {}
    for key in compliance.evaluated:
        entry = namespaces.setdefault(key.namespace, {
            "namespace": key.namespace, "team": team_of(key.namespace), "evaluated_workloads": 0,
            "passed_rules": 0, "findings": Counter(), "exceptions": 0})
        entry["evaluated_workloads"] += 1
        entry["passed_rules"] += compliance.passes.get(key, 0)
        entry["findings"].update(workloads[key]["findings"] if key in workloads else {})
    for exemption in compliance.exemptions:
        if exemption.workload.namespace in namespaces:
            namespaces[exemption.workload.namespace]["exceptions"] += 1
    namespace_list = [{**entry, "findings": {s: entry["findings"].get(s, 0) for s in SEVERITIES}}
                      for _, entry in sorted(namespaces.items(),
                                             key=lambda e: namespace_order(e[0]))]

    # --- quotas --------------------------------------------------------------------------------
    quota_list = [quota_entry(status, team_of) for status in quotas or ()]

    # --- summary -------------------------------------------------------------------------------
    cluster = placement["cluster"]
    pending_eq = sum((w["pending"] for w in workloads.values()), Fraction(0))
    gpu_running = sum(t.gpu_running for t in scanner.placement.tallies.values())
    gpu_pending = sum(t.gpu_pending for t in scanner.placement.tallies.values())
    severities = Counter(f.severity for f in compliance.findings)
    warnings = [*scanner.warnings, *(utilization or {}).get("warnings", [])]
    summary = {
        "nodes": len(scanner.placement.nodes),
        "gpu_nodes": cluster["gpu_nodes"],
        "objects": scanner.objects,
        "pods": scanner.placement.pods_seen,
        "finished_pods": scanner.placement.finished,
        "gpu_pods": {"running": gpu_running, "pending": gpu_pending},
        "workloads": len(workloads),
        "gpu_workloads": sum(1 for w in workloads.values() if w["gpu"]),
        "evaluated_workloads": len(compliance.evaluated),
        "physical_gpus": cluster["physical_gpus"],
        "whole_gpus": cluster["whole_gpus"],
        "gpu_equivalents": {
            **{k: v for k, v in cluster["gpu_equivalents"].items() if k != "nodes_unknown"},
            "pending": as_float(pending_eq),
            "idle_allocated": utilization["idle_allocated_gpu_equivalents"]
            if utilization else None,
            "allocated_share": round(cluster["gpu_equivalents"]["allocated"]
                                     / allocatable, 4) if allocatable else None,
        },
        "findings": {s: severities.get(s, 0) for s in SEVERITIES},
        "exceptions": len(exceptions),
        "quotas": {state: sorted(e["name"] for e in quota_list if e["state"] == state)
                   for state in ("over", "near", "ok")},
        "stranded_nodes": len(placement["stranded"]),
        "errors": len(errors),
        "warnings": len(warnings),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "generated": generated.isoformat(),
        "source": dict(source),
        "policy_set": {"hash": scanner.policy_set.digest or None,
                       "policies": list(scanner.policy_set.names())}
        if scanner.policy_set is not None else None,
        "settings": {"team_label": settings.team_label, "idle_below": settings.idle_below},
        "summary": summary,
        "cluster": cluster,
        "nodes": placement["nodes"],
        "teams": team_list,
        "quotas": quota_list,
        "fragmentation": placement["fragmentation"],
        "stranded": placement["stranded"],
        "mig": placement["mig"],
        "pending": placement["pending"],
        "utilization": utilization,
        "workloads": workload_list,
        "findings": findings,
        "exceptions": exceptions,
        "policies": by_policy,
        "namespaces": namespace_list,
        "thresholds": placement["thresholds"],
        "ignored": dict(sorted(scanner.ignored.items())),
        "changes": None,
        "warnings": warnings,
        "errors": errors,
    }

