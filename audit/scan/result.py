"""What one audit scan found: the typed value the scan hands to the report.

Owns the shape of the hand-over between :mod:`audit.scan.scanner` (which fills it, once, at the end
of the scan) and :mod:`audit.report.assemble` (which turns it into the report dict). Neither of the
two imports the other; both import this module.

Must not compute anything beyond looking values up, read input, evaluate policies or render.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from audit.scan.compliance import ComplianceResult
from audit.scan.ownership import ObjectKey
from audit.scan.placement import PlacementFigures
from audit.settings import AuditSettings
from policies.policy.quota import QuotaStatus


@dataclass(frozen=True)
class PolicySetInfo:
    """The policy set an audit judged by: its digest (None when it has none), policy names, and
    per policy its content digest (:func:`policies.policy.model.policy_digest`) and rule names
    (:func:`policies.policy.model.rule_names`): what the history tells a changed policy by."""

    digest: str | None
    policies: tuple[str, ...]
    policy_digests: Mapping[str, str] = field(default_factory=dict)
    rules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ScanResult:
    """The figures of one scan, complete: the report is built from this value alone.

    Attributes:
        settings: the audit settings (``team_label`` and ``idle_below`` are reported).
        generated: the audit's time (the report's ``generated``).
        source: what was audited (the report's ``source``: paths, cluster, metrics, policies).
        policy_set: the policy set, None when compliance was skipped.
        objects: objects read.
        ignored: kind (or "<kind> without name") -> objects not audited.
        teams: namespace -> team (its team label's value), for labelled namespaces only.
        workloads: owner key (a workload object, a controller or a bare pod) -> the workload it
            belongs to (:meth:`audit.scan.ownership.Ownership.root`), for every key the placement
            tallies or the snapshot holds.
        present: workload objects of the snapshot -> whether one of its pod templates asks for GPUs.
        placement: the placement figures.
        compliance: findings, exceptions and per-policy counts.
        utilization: the ``utilization`` section (DCGM metrics), None without metrics.
        quotas: each GPUQuota's usage against its limits, in the order given.
        inventory: the ``inventory`` section (``--inventory``), None when not asked for.
        warnings: every warning of the run, in the order they are reported.
        errors: every input error of the run, in the order they are reported.
    """

    settings: AuditSettings
    generated: datetime.datetime
    source: Mapping[str, Any]
    policy_set: PolicySetInfo | None
    objects: int
    ignored: Mapping[str, int]
    teams: Mapping[str, str]
    workloads: Mapping[ObjectKey, ObjectKey]
    present: Mapping[ObjectKey, bool]
    placement: PlacementFigures
    compliance: ComplianceResult
    utilization: Mapping[str, Any] | None
    quotas: tuple[QuotaStatus, ...]
    inventory: Mapping[str, Any] | None
    warnings: tuple[str, ...]
    errors: tuple[str, ...]

    def team_of(self, namespace: str | None) -> str | None:
        """The team of a namespace, None when unlabelled, unknown or cluster-scoped."""
        return self.teams.get(namespace) if namespace else None

    def workload_of(self, key: ObjectKey) -> ObjectKey:
        """The workload ``key`` belongs to (``key`` itself when it has no owner in the input)."""
        return self.workloads.get(key, key)
