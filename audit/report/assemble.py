"""The audit report: one JSON-ready dict with a stable, documented shape.

Owns assembling what a scan found (an :class:`audit.scan.result.ScanResult`: placement figures,
compliance findings, utilization, quotas) into the report every renderer reads (terminal, JSON,
Markdown, HTML, PolicyReports) and history stores: workloads and teams rolled up, findings sorted,
the summary counted, and the ``cost`` of idle and stranded GPUs when the settings carry a price
table (:mod:`audit.report.cost`). The shape is documented field by field in
``docs/audit-report.md``; ``apiVersion`` changes when a field changes meaning or disappears (new
fields may be added).

Must not read input, evaluate policies, render, or import :mod:`audit.scan.scanner` (the scan
result is the whole hand-over; an import-linter contract). Equal small dicts and lists of the
report are one object shared by the entries naming them (memory, :class:`_Refs`): readers must
copy before they change one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from audit.report import cost
from audit.scan.compliance import SEVERITIES, Finding
from audit.scan.ownership import ObjectKey, namespace_order
from audit.scan.placement import as_float
from audit.scan.result import ScanResult
from policies.policy.quota import QuotaStatus

API_VERSION = "gpuguard.io/v1alpha1"
KIND = "AuditReport"


def ref(key: ObjectKey) -> dict[str, Any]:
    """``{kind, group, namespace, name}`` of an object key."""
    return {"kind": key.kind, "group": key.group, "namespace": key.namespace, "name": key.name}


class _Refs:
    """One ``ref`` dict per object key, one ``actions`` list per tuple and one small dict per
    distinct value (a workload's pod counts, findings by severity, ...), shared by every entry
    that names them: a 1M-pod audit has ~240k findings over ~100k workloads, and a dict per
    mention made 580,176 ref dicts alone (51 MiB). Renderers and writers only read the report
    (the YAML writer writes a shared dict out again, no alias)."""

    def __init__(self) -> None:
        self._refs: dict[ObjectKey, dict[str, Any]] = {}
        self._actions: dict[tuple[str, ...], list[str]] = {}
        self._values: dict[tuple[tuple[str, type, Any], ...], dict[str, Any]] = {}

    def same(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` (a flat dict of hashable values), or one given before with the same keys
        and values of the same types (``1`` and ``1.0`` are equal but print differently)."""
        key = tuple((k, type(v), v) for k, v in value.items())
        return self._values.setdefault(key, value)

    def ref(self, key: ObjectKey) -> dict[str, Any]:
        found = self._refs.get(key)
        if found is None:
            found = self._refs[key] = ref(key)
        return found

    def actions(self, actions: tuple[str, ...]) -> list[str]:
        found = self._actions.get(actions)
        if found is None:
            found = self._actions[actions] = list(actions)
        return found


def _finding_dict(finding: Finding, team: str | None, refs: _Refs) -> dict[str, Any]:
    """One entry of ``findings`` (``refs``: the shared dicts of one report)."""
    return {
        "severity": finding.severity, "policy": finding.policy, "rule": finding.rule,
        "path": finding.path, "outcome": finding.outcome, "message": finding.message,
        "actions": refs.actions(finding.actions), "workload": refs.ref(finding.workload),
        "evaluated": refs.ref(finding.evaluated), "team": team,
    }


def quota_entry(status: QuotaStatus,
                team_of: Callable[[str | None], str | None]) -> dict[str, Any]:
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


def assemble(result: ScanResult) -> dict[str, Any]:
    """The report of one scan (docs/audit-report.md), with ``changes`` None (the history fills it).

    Args:
        result: what the scan found (:meth:`audit.scan.scanner.Scanner.finish`).

    Returns:
        The JSON-ready report: plain dicts, lists, strings, numbers, booleans and None.
    """
    refs = _Refs()
    workloads = _workloads(result, refs)
    compliance = result.compliance
    team_of = result.team_of
    findings = sorted(
        (_finding_dict(f, team_of(f.workload.namespace), refs) for f in compliance.findings),
        key=lambda f: (_severity_rank(f["severity"]), namespace_order(f["workload"]["namespace"]),
                       f["workload"]["kind"], f["workload"]["name"], f["policy"], f["rule"]))
    exceptions = [{"policy": e.policy, "workload": refs.ref(e.workload),
                   "team": team_of(e.workload.namespace), "reason": e.reason}
                  for e in compliance.exemptions]
    by_policy = [{"policy": policy, **{s: counts.get(s, 0) for s in SEVERITIES},
                  "pass": counts.get("pass", 0), "exempt": counts.get("exempt", 0)}
                 for policy, counts in compliance.by_policy.items()]
    quota_list = [quota_entry(status, team_of) for status in result.quotas]
    placement = result.placement
    policy_set = result.policy_set
    report: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "generated": result.generated.isoformat(),
        "source": dict(result.source),
        "policy_set": {"hash": policy_set.digest, "policies": list(policy_set.policies),
                       "policy_hashes": dict(sorted(policy_set.policy_digests.items())),
                       "rules": {name: list(rules) for name, rules in
                                 sorted(policy_set.rules.items())}}
        if policy_set is not None else None,
        "settings": {"team_label": result.settings.team_label,
                     "idle_below": result.settings.idle_below},
        "summary": _summary(result, workloads, exceptions, quota_list),
        "cluster": placement.cluster,
        "nodes": placement.nodes,
        "teams": _teams(result, workloads),
        "quotas": quota_list,
        "fragmentation": placement.fragmentation,
        "stranded": placement.stranded,
        "mig": placement.mig,
        "pending": placement.pending,
        "utilization": result.utilization,
        "workloads": _workload_list(result, workloads, refs),
        "findings": findings,
        "exceptions": exceptions,
        "policies": by_policy,
        "namespaces": _namespaces(result, workloads),
        "thresholds": placement.thresholds,
        "ignored": dict(sorted(result.ignored.items())),
        "changes": None,
        "warnings": list(result.warnings),
        "errors": list(result.errors),
        "inventory": result.inventory,
        "cost": None,
    }
    prices = result.settings.prices
    if prices is not None:
        report["cost"] = cost.section(report, prices)
    return report


class _Workload:
    """What the report sums for one workload (root owner) while it is assembled: pods by state,
    GPU pods, GPU-equivalents (exact fractions), resources, findings by severity. Slots, not a
    dict of Counters: a 1M-pod audit has ~100k workloads, and as dicts they took ~1.7 KB each
    of the report's peak. ``resources`` and ``findings`` stay None until there is one."""

    __slots__ = ("allocated", "allocated_unknown_pods", "evaluated", "findings", "finished",
                 "gpu", "gpu_pending", "gpu_running", "key", "pending", "pending_pods",
                 "pending_unknown_pods", "present", "resources", "running", "team")

    def __init__(self, key: ObjectKey, team: str | None) -> None:
        self.key = key
        self.team = team
        self.present = self.gpu = False
        self.running = self.pending_pods = self.finished = 0
        self.gpu_running = self.gpu_pending = 0
        self.allocated: Fraction | float = _NONE  # pods' float equivalents summed
        self.pending: Fraction = _NONE
        self.allocated_unknown_pods = self.pending_unknown_pods = 0
        self.resources: Counter[str] | None = None
        self.findings: Counter[str] | None = None
        self.evaluated: dict[str, Any] | None = None


_NONE = Fraction(0)


def _workloads(result: ScanResult, refs: _Refs) -> dict[ObjectKey, _Workload]:
    """Every workload (root owner) the scan saw: its pods, allocation and finding counts."""
    workloads: dict[ObjectKey, _Workload] = {}
    root = result.workload_of

    def workload(key: ObjectKey) -> _Workload:
        entry = workloads.get(key)
        if entry is None:
            entry = workloads[key] = _Workload(key, result.team_of(key.namespace))
        return entry

    for key, gpu in result.present.items():
        entry = workload(root(key))
        entry.gpu = entry.gpu or gpu
        entry.present = entry.present or root(key) == key
    for owner, tally in result.placement.tallies.items():
        entry = workload(root(owner))
        entry.gpu = entry.gpu or tally.gpu_requested
        entry.running += tally.running
        entry.pending_pods += tally.pending
        entry.finished += tally.finished
        entry.gpu_running += tally.gpu_running
        entry.gpu_pending += tally.gpu_pending
        entry.pending += tally.pending_eq
        entry.pending_unknown_pods += tally.pending_unknown
        if owner == root(owner) and owner.kind == "Pod" and not owner.group:
            entry.present = True
    for owner, usage in result.placement.owner_usage.items():
        entry = workload(root(owner))
        entry.allocated += usage.equivalents
        entry.allocated_unknown_pods += usage.unknown_pods
        if entry.resources is None:
            entry.resources = Counter()
        entry.resources.update(usage.resources)
    for key, evaluated in result.compliance.evaluated.items():
        workload(key).evaluated = refs.ref(evaluated)
    for finding in result.compliance.findings:
        entry = workload(finding.workload)
        if entry.findings is None:
            entry.findings = Counter()
        entry.findings[finding.severity] += 1
    return workloads


def _listed(entry: _Workload) -> bool:
    """Whether a workload is reported: it asks for GPUs or has a finding."""
    return bool(entry.gpu or entry.findings)


def _allocatable(result: ScanResult) -> float:
    return result.placement.cluster["gpu_equivalents"]["allocatable"] or 0.0


def _teams(result: ScanResult,
           workloads: dict[ObjectKey, _Workload]) -> list[dict[str, Any]]:
    """The ``teams`` section: reported workloads summed per team, unlabelled (None) last."""
    teams: dict[str | None, dict[str, Any]] = {}
    for entry in workloads.values():
        if not _listed(entry):
            continue
        team = teams.setdefault(entry.team, {
            "team": entry.team, "namespaces": set(), "workloads": 0,
            "gpu_pods": Counter(), "allocated": Fraction(0), "allocated_unknown_pods": 0,
            "pending": Fraction(0), "pending_unknown_pods": 0, "resources": Counter(),
            "findings": Counter()})
        if entry.key.namespace:
            team["namespaces"].add(entry.key.namespace)
        team["workloads"] += 1
        team["gpu_pods"].update(running=entry.gpu_running, pending=entry.gpu_pending)
        team["allocated"] += entry.allocated
        team["allocated_unknown_pods"] += entry.allocated_unknown_pods
        team["pending"] += entry.pending
        team["pending_unknown_pods"] += entry.pending_unknown_pods
        team["resources"].update(entry.resources or {})
        team["findings"].update(entry.findings or {})
    idle_by_team = {t["team"]: t for t in (result.utilization or {}).get("teams", [])}
    allocatable = _allocatable(result)
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
    return team_list


def _workload_list(result: ScanResult,
                   workloads: dict[ObjectKey, _Workload], refs: _Refs) -> list[dict[str, Any]]:
    """The ``workloads`` section: workloads asking for GPUs or with findings, by key."""
    same = refs.same
    workload_list = []
    for key in sorted(workloads):
        entry = workloads[key]
        if not _listed(entry):
            continue
        workload_list.append({
            **ref(key), "team": entry.team, "in_snapshot": entry.present, "gpu": entry.gpu,
            "pods": same({"running": entry.running, "pending": entry.pending_pods,
                          "finished": entry.finished}),
            "gpu_pods": same({"running": entry.gpu_running, "pending": entry.gpu_pending}),
            "gpu_equivalents": same({"allocated": as_float(entry.allocated),
                                     "pending": as_float(entry.pending),
                                     "unknown_pods": entry.allocated_unknown_pods
                                     + entry.pending_unknown_pods}),
            "resources": same(dict(sorted((entry.resources or {}).items()))),
            "evaluated": entry.evaluated,
            "passed_rules": result.compliance.passes.get(key, 0),
            "findings": same({s: entry.findings.get(s, 0) if entry.findings else 0
                              for s in SEVERITIES}),
        })
    return workload_list


def _namespaces(result: ScanResult,
                workloads: dict[ObjectKey, _Workload]) -> list[dict[str, Any]]:
    """The ``namespaces`` section (the PolicyReport summaries), cluster scope first."""
    compliance = result.compliance
    namespaces: dict[str | None, dict[str, Any]] = {}
    for key in compliance.evaluated:
        entry = namespaces.setdefault(key.namespace, {
            "namespace": key.namespace, "team": result.team_of(key.namespace),
            "evaluated_workloads": 0, "passed_rules": 0, "findings": Counter(), "exceptions": 0})
        entry["evaluated_workloads"] += 1
        entry["passed_rules"] += compliance.passes.get(key, 0)
        if key in workloads:
            entry["findings"].update(workloads[key].findings or {})
    for exemption in compliance.exemptions:
        if exemption.workload.namespace in namespaces:
            namespaces[exemption.workload.namespace]["exceptions"] += 1
    return [{**entry, "findings": {s: entry["findings"].get(s, 0) for s in SEVERITIES}}
            for _, entry in sorted(namespaces.items(), key=lambda e: namespace_order(e[0]))]


def _summary(result: ScanResult, workloads: dict[ObjectKey, _Workload],
             exceptions: list[dict[str, Any]],
             quota_list: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``summary`` section: the counts a dashboard shows first."""
    placement = result.placement
    cluster = placement.cluster
    utilization = result.utilization
    allocatable = _allocatable(result)
    pending_eq = sum((w.pending for w in workloads.values()), Fraction(0))
    severities = Counter(f.severity for f in result.compliance.findings)
    return {
        "nodes": placement.node_count,
        "gpu_nodes": cluster["gpu_nodes"],
        "objects": result.objects,
        "pods": placement.pods_seen,
        "finished_pods": placement.finished_pods,
        "gpu_pods": {"running": sum(t.gpu_running for t in placement.tallies.values()),
                     "pending": sum(t.gpu_pending for t in placement.tallies.values())},
        "workloads": len(workloads),
        "gpu_workloads": sum(1 for w in workloads.values() if w.gpu),
        "evaluated_workloads": len(result.compliance.evaluated),
        "physical_gpus": cluster["physical_gpus"],
        "on_missing_nodes": cluster["on_missing_nodes"],
        "whole_gpus": cluster["whole_gpus"],
        "stranded_by_cause": cluster["stranded_by_cause"],
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
        "stranded_nodes": len(placement.stranded),
        "errors": len(result.errors),
        "warnings": len(result.warnings),
    }
