"""Prometheus metrics of ``gpuguard audit --watch`` (``prometheus-client``), on its ``/metrics``.

Owns the metric names and labels of the audit controller — the cluster's GPU state as of the
last full evaluation (:class:`ClusterStateCollector`, built from the audit report: one series
per team, namespace, node, MIG profile, GPUQuota, policy, and with a price table the cost per
namespace and GPU product) and the controller's own work
(:class:`WatchMetrics`). Label values are bounded by the cluster's teams, namespaces, nodes,
MIG profiles, quotas and policies; no pod or workload names. The table is in
``docs/audit-controller.md``; ``tests/project/test_dashboards.py`` checks that every name the
dashboards and alerts in ``deploy/monitoring/`` query is exported here or by the webhook.

Must not compute figures: every value is read from the report (docs/audit-report.md) as
:mod:`audit.report.assemble` made it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from audit.scan.compliance import SEVERITIES

#: Series name → (help, labels). The cluster state, refreshed at each full evaluation.
STATE_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpuguard_team_gpu_equivalents_allocated": (
        "GPU-equivalents allocated to the team's running pods.", ("team",)),
    "gpuguard_team_gpu_equivalents_pending": (
        "GPU-equivalents requested by the team's pending pods.", ("team",)),
    "gpuguard_team_gpu_equivalents_idle": (
        "GPU-equivalents allocated to the team that were idle over the DCGM metrics window "
        "(only with --metrics).", ("team",)),
    "gpuguard_namespace_gpu_equivalents_allocated": (
        "GPU-equivalents allocated to the namespace's running pods.", ("namespace", "team")),
    "gpuguard_namespace_gpu_equivalents_pending": (
        "GPU-equivalents requested by the namespace's pending pods.", ("namespace", "team")),
    "gpuguard_node_gpu_equivalents_allocatable": (
        "GPU-equivalents the node offers.", ("node", "model")),
    "gpuguard_node_gpu_equivalents_free": (
        "GPU-equivalents of the node no pod holds.", ("node", "model")),
    "gpuguard_node_gpu_equivalents_stranded": (
        "Free GPU-equivalents of the node that no pod can use (CPU or memory exhausted, "
        "tainted, cordoned, not ready).", ("node", "model")),
    "gpuguard_cluster_gpu_equivalents": (
        "Cluster GPU-equivalents by state (allocatable, allocated, free, stranded, pending).",
        ("state",)),
    "gpuguard_mig_instances_configured": (
        "MIG instances configured on the cluster's nodes, per profile.", ("profile",)),
    "gpuguard_mig_instances_used": (
        "MIG instances allocated to pods, per profile.", ("profile",)),
    "gpuguard_quota_used_gpu_equivalents": (
        "GPU-equivalents counted against the GPUQuota (pending and running pods).",
        ("quota", "team")),
    "gpuguard_quota_limit_gpu_equivalents": (
        "The GPUQuota's GPU-equivalents limit (absent when it sets none).", ("quota", "team")),
    "gpuguard_quota_headroom_gpu_equivalents": (
        "GPU-equivalents the GPUQuota still admits (absent without a GPU-equivalents limit).",
        ("quota", "team")),
    "gpuguard_quota_usage_ratio": (
        "The GPUQuota's highest usage / limit over its dimensions (1 = at the limit).",
        ("quota", "team")),
    "gpuguard_audit_findings": (
        "Findings of the last evaluation, per policy and severity.", ("policy", "severity")),
    "gpuguard_idle_cost_per_hour": (
        "What the namespace's idle GPU-equivalents cost per hour, priced with --prices (only "
        "with --prices and --metrics; unpriced ones are in gpuguard_unpriced_gpu_equivalents).",
        ("team", "namespace", "currency")),
    "gpuguard_stranded_cost_per_hour": (
        "What the stranded GPU-equivalents of a GPU product cost per hour, priced with --prices "
        "(only with --prices; product \"\" when the nodes have no nvidia.com/gpu.product).",
        ("product", "currency")),
    "gpuguard_unpriced_gpu_equivalents": (
        "Idle or stranded GPU-equivalents of a product the --prices table does not price.",
        ("state", "product")),
    "gpuguard_audit_last_full_evaluation_timestamp_seconds": (
        "Unix time of the last full evaluation (the figures above are as of then).", ()),
}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def state_samples(report: Mapping[str, Any], at: float
                  ) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """``name → [(label values, value)]`` of :data:`STATE_METRICS` from an audit report.

    Args:
        report: the audit report (docs/audit-report.md).
        at: Unix time of the evaluation (seconds).

    Values that the report does not know (None: no DCGM metrics, an unknown GPU size) are
    left out, never exported as 0.
    """
    out: dict[str, list[tuple[tuple[str, ...], float]]] = defaultdict(list)

    def put(name: str, labels: tuple[str, ...], value: Any) -> None:
        number = _num(value)
        if number is not None:
            out[name].append((labels, number))

    for team in report.get("teams", []):
        name = team["team"] or ""
        eq = team["gpu_equivalents"]
        put("gpuguard_team_gpu_equivalents_allocated", (name,), eq["allocated"])
        put("gpuguard_team_gpu_equivalents_pending", (name,), eq["pending"])
        put("gpuguard_team_gpu_equivalents_idle", (name,), eq["idle_allocated"])
    namespaces: dict[str, list[float]] = {}
    teams: dict[str, str] = {}
    for workload in report.get("workloads", []):
        namespace = workload["namespace"]
        if not namespace:
            continue
        sums = namespaces.setdefault(namespace, [0.0, 0.0])
        teams[namespace] = workload["team"] or ""
        eq = workload["gpu_equivalents"]
        sums[0] += eq["allocated"] or 0.0
        sums[1] += eq["pending"] or 0.0
    for namespace, (allocated, pending) in sorted(namespaces.items()):
        put("gpuguard_namespace_gpu_equivalents_allocated", (namespace, teams[namespace]),
            allocated)
        put("gpuguard_namespace_gpu_equivalents_pending", (namespace, teams[namespace]), pending)
    for node in report.get("nodes", []):
        if not node.get("gpu_node"):
            continue
        labels = (node["name"], node.get("model") or node.get("product") or "")
        eq = node["gpu_equivalents"]
        put("gpuguard_node_gpu_equivalents_allocatable", labels, eq["allocatable"])
        put("gpuguard_node_gpu_equivalents_free", labels, eq["free"])
        stranded = node.get("stranded")
        put("gpuguard_node_gpu_equivalents_stranded", labels,
            stranded["gpu_equivalents"] if stranded else 0.0)
    cluster = (report.get("cluster") or {}).get("gpu_equivalents") or {}
    for state in ("allocatable", "allocated", "free", "stranded"):
        put("gpuguard_cluster_gpu_equivalents", (state,), cluster.get(state))
    put("gpuguard_cluster_gpu_equivalents", ("pending",),
        ((report.get("summary") or {}).get("gpu_equivalents") or {}).get("pending"))
    for profile in (report.get("mig") or {}).get("profiles", []):
        put("gpuguard_mig_instances_configured", (profile["profile"],), profile["configured"])
        put("gpuguard_mig_instances_used", (profile["profile"],), profile["used"])
    for quota in report.get("quotas", []):
        labels = (quota["name"], quota["team"] or "")
        put("gpuguard_quota_used_gpu_equivalents", labels, quota["used"].get("gpuEquivalents"))
        put("gpuguard_quota_limit_gpu_equivalents", labels,
            quota["limits"].get("gpuEquivalents"))
        put("gpuguard_quota_headroom_gpu_equivalents", labels,
            quota["headroom_gpu_equivalents"])
        put("gpuguard_quota_usage_ratio", labels, quota["max_ratio"])
    for policy in report.get("policies", []):
        for severity in SEVERITIES:
            put("gpuguard_audit_findings", (policy["policy"], severity), policy.get(severity, 0))
    cost = report.get("cost")
    if cost is not None:
        currency, rate = cost["currency"], cost["rate"]
        for entry in rate["namespaces"]:
            put("gpuguard_idle_cost_per_hour",
                (entry["team"] or "", entry["namespace"] or "", currency),
                entry["idle_cost_per_hour"])
        for entry in rate["products"]:
            product = entry["product"] or ""
            if entry["priced_by"] is None:
                for state in ("idle", "stranded"):
                    if entry[f"{state}_gpu_equivalents"]:
                        put("gpuguard_unpriced_gpu_equivalents", (state, product),
                            entry[f"{state}_gpu_equivalents"])
            elif entry["stranded_gpu_equivalents"]:
                put("gpuguard_stranded_cost_per_hour", (product, currency),
                    entry["stranded_cost_per_hour"])
    put("gpuguard_audit_last_full_evaluation_timestamp_seconds", (), at)
    return dict(out)


class ClusterStateCollector(Collector):
    """Serves the samples of the last full evaluation (swapped whole: a scrape sees one
    evaluation, never a mix); series of teams, nodes or policies gone disappear with it."""

    def __init__(self) -> None:
        self._samples: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        self._lock = threading.Lock()

    def update(self, report: Mapping[str, Any], at: float) -> None:
        """Replace the samples with those of ``report`` (evaluated at Unix time ``at``)."""
        samples = state_samples(report, at)
        with self._lock:
            self._samples = samples

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge family per :data:`STATE_METRICS` entry (empty before the first
        evaluation)."""
        with self._lock:
            samples = self._samples
        for name, (documentation, labels) in STATE_METRICS.items():
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for values, value in samples.get(name, []):
                family.add_metric(list(values), value)
            yield family


class WatchMetrics:
    """Every metric of the controller, in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.state = ClusterStateCollector()
        registry.register(self.state)
        self.events = Counter("gpuguard_audit_watch_events",
                              "Watch events that changed an object, per kind.", ["kind"],
                              registry=registry)
        self.lists = Counter("gpuguard_audit_watch_lists",
                             "Complete lists applied per kind (1 at start, then one per "
                             "relist: 410 Gone, reconnect).", ["kind"], registry=registry)
        self.report_writes = Counter(
            "gpuguard_audit_report_writes",
            "PolicyReport writes by action (created, replaced, deleted, failed).", ["action"],
            registry=registry)
        self.evaluations = Counter(
            "gpuguard_audit_evaluations", "Evaluations by scope (namespace, full).", ["scope"],
            registry=registry)
        self.report_latency = Histogram(
            "gpuguard_audit_report_latency_seconds",
            "From an object change to the write of the report it changed, in seconds.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=registry)
        self.objects = Gauge("gpuguard_audit_watch_objects", "Objects held in memory.",
                             registry=registry)
        self.pending = Gauge("gpuguard_audit_report_writes_pending",
                             "Report writes waiting for their rate limit.", registry=registry)
        self.synced = Gauge("gpuguard_audit_watch_synced",
                            "1 once every watched resource was listed.", registry=registry)
        self.leader = Gauge("gpuguard_audit_leader",
                            "1 while this replica holds the Lease and writes reports.",
                            registry=registry)
        self.policy_reloads = Counter(
            "gpuguard_audit_policy_reloads",
            "Policy set reloads by outcome (success, rejected; held: an update that removes "
            "content, waiting for --policy-removal-quiet-s).", ["outcome"], registry=registry)

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
