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


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}


def test_retyped_pod_fields_are_input_errors_and_the_pods_are_not_audited():
    retyped = [_pod("ns7", 1, "n1"), _pod("node7", 1, "n1"), _pod("phase1", 1, "n1"),
               _pod("status", 1, "n1")]
    retyped[0]["metadata"]["namespace"] = 7
    retyped[1]["spec"]["nodeName"] = 7
    retyped[2]["status"]["phase"] = 1
    retyped[3]["status"] = "Running"
    report = _report([NAMESPACE, NODE, *retyped, _pod("ok", 1, "n1")])
    tail = "; not audited (it asks for GPUs): these fields say which pod it is, where it runs " \
           "or in what state"
    assert report["errors"] == [
        f"input.yaml: document 2: Pod ns7: metadata.namespace: expected a string, got the number 7{tail}",
        f"input.yaml: document 3: Pod ml/node7: spec.nodeName: expected a string, got the number 7{tail}",
        f"input.yaml: document 4: Pod ml/phase1: status.phase: expected a string, got the number 1{tail}",
        f"input.yaml: document 5: Pod ml/status: status: expected a map, got the string 'Running'{tail}"]
    # not a pending pod with an invented cause, nor a pod of namespace null
    assert report["pending"] == []
    assert report["summary"]["gpu_pods"] == {"running": 1, "pending": 0}
    assert [w["name"] for w in report["workloads"]] == ["ok"]
    assert _summary_row(report, "problems").endswith("4 input error(s), 0 warning(s)")


def test_a_gpu_pod_without_metadata_is_an_input_error_not_an_ignored_count():
    nameless = _pod("x", 2, "n1")
    nameless["metadata"] = None
    report = _report([NODE, nameless])
    assert report["errors"] == [
        "input.yaml: document 1: Pod (no name): metadata.name: required, none given (neither "
        "metadata.name nor metadata.generateName is a non-empty string); not audited (it asks "
        "for GPUs): these fields say which pod it is, where it runs or in what state"]
    assert report["ignored"] == {}
    assert report["summary"]["errors"] == 1


def test_a_workload_with_a_retyped_namespace_is_an_input_error():
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": 7},
                  "spec": {"replicas": 1, "template": {"spec": {"containers": [
                      {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    report = _report([deployment])
    assert report["errors"] == [
        "input.yaml: document 0: Deployment d: metadata.namespace: expected a string, got the number 7; "
        "not audited: these fields say which object it is"]
    assert report["workloads"] == []


def test_a_node_allocated_beyond_its_allocatable_is_named():
    pods = [_pod(f"p{i}", 1, "n1") for i in range(1007)]
    report = _report([NAMESPACE, NODE, *pods])
    warning = ("Node n1: its running pods are allocated more than it offers (nvidia.com/gpu: "
               "1007 allocated to its running pods, 8 allocatable): the scheduler never binds "
               "beyond allocatable, so the pods or the node are stale or altered in the "
               "snapshot; free is counted as 0")
    assert report["warnings"] == [warning]
    assert report["nodes"][0]["gpu_equivalents"]["free"] == 0.0
