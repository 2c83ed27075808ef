"""A snapshot that mixes objects with and without ``metadata.namespace`` (issue 13).

Cluster-scoped objects, and manifests from a repository that omit the namespace, have the key
namespace None; the audit sorted keys and report entries with None next to strings and crashed
(``TypeError: '<' not supported between instances of 'str' and 'NoneType'``, exit 1 — the code
``--fail-on`` uses for findings). Every sort over an optional field now uses one order: None
(cluster-scoped) first, then names.
"""

from __future__ import annotations

import json

import pytest
import yaml

from audit.scan.ownership import ObjectKey, namespace_order
from gpuguard.cli import main
from tests.paths import ROOT, TESTS

DATA = TESTS / "data"
EXAMPLE = ROOT / "examples" / "cluster"
MIXED = DATA / "edge" / "mixed-namespaces.yaml"
MIXED_METRICS = DATA / "edge" / "mixed-namespaces.prom"
MANIFESTS = DATA / "manifests"  # repositories' manifests: most omit the namespace


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["audit", *args, "-o", "json", "--jobs", "0"])
    return code, json.loads(capsys.readouterr().out)


def test_object_keys_with_and_without_namespace_sort_cluster_scoped_first():
    keys = [ObjectKey("team", "", "Pod", "b"), ObjectKey(None, "apps", "Deployment", "d"),
            ObjectKey("a", "", "Pod", "z"), ObjectKey(None, "", "Pod", "a")]
    assert sorted(keys) == [ObjectKey(None, "", "Pod", "a"),
                            ObjectKey(None, "apps", "Deployment", "d"),
                            ObjectKey("a", "", "Pod", "z"), ObjectKey("team", "", "Pod", "b")]
    assert max(keys) == ObjectKey("team", "", "Pod", "b")
    assert sorted([None, "b", "a"], key=namespace_order) == [None, "a", "b"]


def test_repository_manifests_without_namespace_next_to_a_cluster_are_audited(capsys):
    code, report = audit_json(capsys, "-f", str(MANIFESTS), "-f", str(EXAMPLE))
    assert code == 0
    namespaces = [w["namespace"] for w in report["workloads"]]
    assert None in namespaces and "team-llm" in namespaces
    first_named = namespaces.index(next(n for n in namespaces if n is not None))
    assert all(n is None for n in namespaces[:first_named])
    assert namespaces[first_named:] == sorted(namespaces[first_named:])
    # The manifests' workloads are judged like the cluster's: a privileged GPU pod is a denial.
    assert any(f["workload"]["namespace"] is None and f["severity"] == "deny"
               for f in report["findings"])
    assert report["namespaces"][0]["namespace"] is None


def test_mixed_snapshot_with_metrics_orders_every_section(capsys):
    code, report = audit_json(capsys, "-f", str(MIXED), "--metrics", str(MIXED_METRICS))
    assert code == 0 and report["errors"] == []
    assert [(w["namespace"], w["kind"], w["name"]) for w in report["workloads"]] == [
        (None, "Pod", "a"), (None, "Pod", "c"), (None, "Pod", "q"), (None, "Deployment", "d"),
        ("team", "Pod", "b"), ("team", "Pod", "p")]
    assert [(f["workload"]["namespace"], f["workload"]["name"], f["policy"])
            for f in report["findings"] if f["severity"] == "deny"] == [
        (None, "a", "no-privileged-gpu"), ("team", "b", "require-queue-label"),
        ("team", "p", "require-queue-label")]
    assert [(n["namespace"], n["evaluated_workloads"]) for n in report["namespaces"]] == [
        (None, 4), ("team", 2)]
    util = report["utilization"]
    assert util["unmatched_pods"] == [{"namespace": None, "pod": "zz"},
                                      {"namespace": "other", "pod": "yy"}]
    # The pods the snapshot lacks count for no workload (trial finding 7); the warning names
    # them in the same order.
    assert [(w["workload"]["namespace"], w["workload"]["name"])
            for w in util["idle_workloads"]] == [(None, "a"), ("team", "b")]
    assert "2 pod(s) named by the metrics are not in the snapshot (zz, other/yy)" in \
        util["warnings"][0]
    assert [n["node"] for n in util["nodes"]] == ["n1", None]  # a GPU whose exporter names none
    assert [t["team"] for t in util["teams"]] == ["t1", None]


@pytest.mark.parametrize("output", ["table", "markdown", "html", "policyreport"])
def test_every_output_renders_the_mixed_snapshot(capsys, tmp_path, output):
    code = main(["audit", "-f", str(MIXED), "-f", str(MANIFESTS), "--metrics",
                 str(MIXED_METRICS), "-o", output, "--jobs", "0", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    assert "team" in captured.out
    reports = list(yaml.safe_load_all((tmp_path / "policyreports.yaml").read_text()))
    assert {r["kind"] for r in reports} == {"PolicyReport", "ClusterPolicyReport"}
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["findings"]["deny"] > 0


def test_mixed_snapshot_in_worker_processes_gives_the_same_report(capsys):
    _, inline = audit_json(capsys, "-f", str(MIXED), "-f", str(MANIFESTS))
    code = main(["audit", "-f", str(MIXED), "-f", str(MANIFESTS), "-o", "json", "--jobs", "2"])
    parallel = json.loads(capsys.readouterr().out)
    assert code == 0
    assert parallel["findings"] == inline["findings"]
    assert parallel["workloads"] == inline["workloads"]


def test_findings_of_workloads_without_a_namespace_are_in_the_cluster_report(capsys):
    # Found by a fresh-context trial: a deny on a manifest that names no namespace was in the
    # report (and made --fail-on deny exit 1) but in no PolicyReport at all.
    from audit.report.policy_reports import build

    _, report = audit_json(capsys, "-f", str(MIXED))
    cluster = [obj for obj in build(report) if obj["kind"] == "ClusterPolicyReport"]
    assert len(cluster) == 1
    denied = {(r["policy"], r["resources"][0]["name"]) for r in cluster[0]["results"]
              if r["result"] == "fail"}
    expected = {(f["policy"], f["workload"]["name"]) for f in report["findings"]
                if f["severity"] == "deny" and not f["workload"]["namespace"]}
    assert expected and denied == expected
    assert cluster[0]["summary"]["fail"] == len(expected)
    namespaced = [obj for obj in build(report) if obj["kind"] == "PolicyReport"]
    assert sum(o["summary"]["fail"] for o in namespaced) == sum(
        1 for f in report["findings"] if f["severity"] == "deny" and f["workload"]["namespace"])
