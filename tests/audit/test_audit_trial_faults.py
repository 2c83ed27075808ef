"""Faults a fresh-context trial of ``gpuguard audit`` found (2026-12-02): each a kind of fault,
pinned by the value a user reads — the summary against the teams table, input errors for retyped
fields, no GPU object vanishing, one warning count."""

from __future__ import annotations

import datetime
from typing import Any

from audit.report.assemble import assemble
from audit.report.tables import tables
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from policies.sources import Document
from tests.paths import ROOT

SETTINGS = AuditSettings(now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))


def _pod(name: str, gpus: int, node: str | None, namespace: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {**({"nodeName": node} if node else {}),
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"}}


def _report(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    documents = [Document("input.yaml", i, None, body) for i, body in enumerate(bodies)]
    return assemble(scan(documents, SETTINGS, None))


def _summary_row(report: dict[str, Any], label: str) -> str:
    summary = next(t for t in tables(report) if t.key == "summary")
    return next(value for key, value in summary.rows if key == label)


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}


def test_gpus_on_a_node_missing_from_the_snapshot_are_in_the_summary():
    report = _report([NAMESPACE, _pod("a", 2, "n1"), _pod("b", 3, "n1")])
    assert report["teams"][0]["gpu_equivalents"]["allocated"] == 5.0
    # the summary says where the teams' 5 GPUs are: not in allocated, on the missing node
    assert report["summary"]["gpu_equivalents"]["allocated"] == 0.0
    assert report["summary"]["on_missing_nodes"] == {
        "nodes": 1, "pods": 2, "gpu_equivalents": 5.0, "unknown_pods": 0}
    assert "+ 5 allocated to 2 pod(s) on 1 node(s) missing from the snapshot" in \
        _summary_row(report, "GPU-equivalents")
    assert report["warnings"] == [
        "2 GPU pod(s) run on 1 node(s) missing from the snapshot (n1): their 5 "
        "GPU-equivalent(s) are valued from the pods' requests alone and counted in the teams and "
        "workloads and as on_missing_nodes in the summary, not in the cluster's allocatable or "
        "allocated"]


def test_ten_thousand_pods_on_missing_nodes_add_up():
    pods = [_pod(f"p{i}", 1 + i % 3, f"n{i % 1000}") for i in range(10_000)]
    report = _report([NAMESPACE, *pods])
    expected = sum(1 + i % 3 for i in range(10_000))
    assert report["teams"][0]["gpu_equivalents"]["allocated"] == expected
    assert report["summary"]["on_missing_nodes"] == {
        "nodes": 1000, "pods": 10_000, "gpu_equivalents": float(expected), "unknown_pods": 0}
    (warning,) = report["warnings"]
    # 1000 node names are not one line of the report: the first five and a count
    assert warning.startswith(
        f"10000 GPU pod(s) run on 1000 node(s) missing from the snapshot (n0, n1, n10, n100, "
        f"n101 and 995 more): their {expected} GPU-equivalent(s)")


def test_one_warning_count_on_the_bundled_example():
    report = assemble(scan(iter_snapshot([str(ROOT / "examples" / "cluster")]), SETTINGS, None))
    problems = next(t for t in tables(report) if t.key == "problems")
    warning_rows = [message for kind, message in problems.rows if kind == "warning"]
    # the MIG-INVALID node's own warning was a third row that summary.warnings (and stderr) left
    # out: one list now, which every count reads
    assert any(w.startswith("Node ") and "MIG-INVALID" in w for w in report["warnings"])
    assert warning_rows == report["warnings"]
    assert report["summary"]["warnings"] == len(report["warnings"]) == 3
    assert _summary_row(report, "problems").endswith(", 0 input error(s), 3 warning(s)")
