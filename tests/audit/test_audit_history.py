"""History: two runs in SQLite, and what changed between them."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3

import pytest

from audit.report.history import SCHEMA_VERSION, History, HistoryError, changes
from audit.report.tables import tables
from gpuguard.cli import main
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"


def audit(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["audit", *args, "-o", "json", "--policies", str(POLICIES),
                     "--jobs", "0"]) == 0
    return json.loads(out.getvalue())


def test_second_run_reports_new_and_fixed_findings_and_trends(tmp_path):
    history = str(tmp_path / "history.sqlite")
    snapshot = tmp_path / "cluster"
    shutil.copytree(EXAMPLE, snapshot)
    first = audit("-f", str(snapshot), "--history", history, "--metrics", str(METRICS))
    assert first["changes"] is None  # nothing to compare with yet

    # Between the runs: the ollama StatefulSet (no pods) and the KAI fraction pod are deleted,
    # mistral-7b gets a queue label, and a Deployment without a queue label appears.
    (snapshot / "workloads" / "ollama-requests-only.yaml").unlink()
    (snapshot / "workloads" / "kai-fraction-init.yaml").unlink()
    mistral = (snapshot / "workloads" / "vllm-mistral.yaml").read_text()
    (snapshot / "workloads" / "vllm-mistral.yaml").write_text(mistral.replace(
        "  labels:\n    app: mistral-7b\n", "  labels:\n    app: mistral-7b\n"
        "    kueue.x-k8s.io/queue-name: llm\n", 1))
    (snapshot / "workloads" / "extra.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: new-one, namespace: team-llm}\n"
        "spec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n      - name: c\n"
        "        resources: {limits: {nvidia.com/gpu: 1}}\n")
    second = audit("-f", str(snapshot), "--history", history, "--metrics", str(METRICS))
    diff = second["changes"]
    assert diff["previous_run"]["id"] == 1
    new = {(f["policy"], f["workload"]) for f in diff["new_findings"]}
    fixed = {(f["policy"], f["workload"]) for f in diff["fixed_findings"]}
    assert new == {("queue-label-audit", "Deployment.apps/team-llm/new-one")}
    assert fixed == {("queue-label-audit", "StatefulSet.apps/team-llm/ollama"),
                     ("queue-label-audit", "Deployment.apps/team-llm/mistral-7b"),
                     ("shared-gpu-notice", "Pod/team-research/gpu-sharing-init-container")}
    trends = {(t["scope"], t["name"]): t for t in diff["trends"]}
    # the KAI pod held 0.5 GPU: cluster 22.164286 -> 21.664286, research 8.85 -> 8.35
    assert trends[("cluster", None)]["allocated_change"] == -0.5
    assert trends[("team", "research")]["allocated_before"] == 8.85
    assert trends[("team", "research")]["allocated_change"] == -0.5
    assert trends[("team", "llm")]["allocated_change"] == 0.0
    # its idle GPU is still in the metrics, shared with a ray worker: idle unchanged (2.0)
    assert trends[("team", "research")]["idle_change"] == 0.0
    assert second["utilization"]["unmatched_pods"] == [
        {"namespace": "team-research", "pod": "gpu-sharing-init-container"}]
    with sqlite3.connect(history) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2


def test_history_file_from_elsewhere_is_refused(tmp_path, capsys):
    bad = tmp_path / "not-sqlite"
    bad.write_text("hello, this is not a database" * 100)
    with pytest.raises(HistoryError, match="not a gpuguard history file"):
        History(str(bad))
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    assert main(["audit", "-f", str(EXAMPLE), "--history", str(newer)]) == 2
    assert "newer gpuguard" in capsys.readouterr().err


LIMIT_POLICY = """apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: one-gpu}
spec:
  validationActions: [Audit]
  matchConditions: [{name: asks-for-gpus, expression: gpu.requested}]
  validations:
  - name: at-most-one
    expression: gpu.maxPerPod.count <= 1
    message: at most one GPU per pod
"""


def test_a_renamed_rule_or_a_relaxed_policy_fixes_nothing(tmp_path):
    """Before: renaming rule at-most-one inside the kept policy listed its findings under
    fixed_findings (and the same workloads under new_findings), and relaxing ``<= 1`` to
    ``<= 2`` called the workloads it no longer flags fixed although none had changed."""
    history = str(tmp_path / "history.sqlite")
    policy = tmp_path / "one-gpu.yaml"
    policy.write_text(LIMIT_POLICY)
    first = audit_with(history, str(policy))
    flagged = {f["workload"]["name"] for f in first["findings"]}
    assert len(flagged) > 2  # the example has several pods asking for 2 GPUs or more

    policy.write_text(LIMIT_POLICY.replace("name: at-most-one", "name: at-most-one-v2"))
    renamed = audit_with(history, str(policy))["changes"]
    assert renamed["fixed_findings"] == [] and renamed["policy_changed_findings"] == []
    assert {f["rule"] for f in renamed["rule_removed_findings"]} == {"at-most-one"}
    assert len(renamed["rule_removed_findings"]) == len(first["findings"])
    assert {f["rule"] for f in renamed["new_findings"]} == {"at-most-one-v2"}
    assert all(f["policy_changed"] for f in renamed["new_findings"])

    policy.write_text(LIMIT_POLICY.replace("name: at-most-one", "name: at-most-one-v2")
                      .replace("<= 1", "<= 2"))
    relaxed = audit_with(history, str(policy))
    diff = relaxed["changes"]
    still = {f["workload"]["name"] for f in relaxed["findings"]}
    assert diff["fixed_findings"] == [] and diff["rule_removed_findings"] == []
    assert len(diff["policy_changed_findings"]) == len(first["findings"]) - len(
        relaxed["findings"]) > 0
    assert {f["workload"].rsplit("/", 1)[1] for f in diff["policy_changed_findings"]} == \
        flagged - still
    # the terminal report says which is which
    table = next(t for t in tables(relaxed) if t.key == "changes")
    assert {row[0] for row in table.rows} == {"policy changed"}
    assert table.note.endswith(f"0 new, 0 fixed, {len(diff['policy_changed_findings'])} gone "
                               "as their policy changed (not fixed)")
    # and the same policy again: nothing changed, nothing gone
    again = audit_with(history, str(policy))["changes"]
    assert again["policy_changed_findings"] == again["fixed_findings"] == []


def test_changes_without_previous_run_is_none():
    assert changes({"findings": []}, None) is None


LIBRARY = ROOT / "policies" / "library"


def audit_with(history: str, *policies: str) -> dict:
    out = io.StringIO()
    flags = [arg for path in policies for arg in ("--policies", path)]
    with contextlib.redirect_stdout(out):
        assert main(["audit", "-f", str(EXAMPLE), "-o", "json", "--jobs", "0",
                     "--history", history, *flags]) == 0
    return json.loads(out.getvalue())


def test_a_finding_whose_policy_left_the_set_is_policy_removed_not_fixed(tmp_path):
    """Before: a full-library run, then a run with one policy, reported the other policies'
    findings as fixed_findings (44 of them) although no workload had changed."""
    history = str(tmp_path / "history.sqlite")
    first = audit_with(history)  # the built-in library
    one = str(LIBRARY / "require-queue-label.yaml")
    second = audit_with(history, one)
    diff = second["changes"]
    others = [f for f in first["findings"] if f["policy"] != "require-queue-label"]
    assert len(others) == 44
    assert diff["fixed_findings"] == [] and diff["new_findings"] == []
    assert len(diff["policy_removed_findings"]) == 44
    assert {f["policy"] for f in diff["policy_removed_findings"]} == \
        {f["policy"] for f in others}
    library = first["policy_set"]["policies"]
    assert second["policy_set"]["policies"] == ["require-queue-label"]
    assert diff["policy_set"] == {
        "hash": second["policy_set"]["hash"], "hash_before": first["policy_set"]["hash"],
        "changed": True, "policies_added": [],
        "policies_removed": sorted(set(library) - {"require-queue-label"})}
    # The same set again: nothing changed, nothing fixed or removed.
    third = audit_with(history, one)["changes"]
    assert third["policy_set"]["changed"] is False
    assert third["fixed_findings"] == third["policy_removed_findings"] == []
    # The terminal report says which is which.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["audit", "-f", str(EXAMPLE), "--jobs", "0", "--history", history])
    text = out.getvalue()
    assert f"the policy set changed ({len(library) - 1} polic(ies) added, 0 removed)" in text
    assert "0 fixed" in text and "policy removed" not in text  # back to the library: all new


def test_a_history_file_from_schema_1_still_opens_and_is_migrated(tmp_path):
    """A history written before the policy set was recorded: it opens, its last run reads back
    without a policy set, and a new run is recorded with one."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript("""
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL,
                   source TEXT NOT NULL, summary TEXT NOT NULL);
CREATE TABLE findings (run INTEGER NOT NULL REFERENCES runs(id), fingerprint TEXT NOT NULL,
    severity TEXT NOT NULL, policy TEXT NOT NULL, rule TEXT NOT NULL, workload TEXT NOT NULL,
    team TEXT, message TEXT NOT NULL);
CREATE TABLE allocations (run INTEGER NOT NULL REFERENCES runs(id), scope TEXT NOT NULL,
    name TEXT, allocatable REAL, allocated REAL, idle REAL);
INSERT INTO runs (at, source, summary) VALUES ('2026-11-01T00:00:00+00:00', '{}', '{}');
INSERT INTO findings VALUES (1, 'f1', 'audit', 'gone-policy', 'r', 'Pod/ns/p', NULL, 'm');
PRAGMA user_version = 1;
""")
    history = History(str(path))
    old = history.latest()
    assert old is not None and old.policy_hash is None and old.policies is None
    history.close()
    report = audit_with(str(path), str(LIBRARY / "require-queue-label.yaml"))
    diff = report["changes"]
    assert [f["policy"] for f in diff["policy_removed_findings"]] == ["gone-policy"]
    assert diff["policy_set"]["hash_before"] is None and diff["policy_set"]["changed"] is None
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT policy_hash, policies FROM runs WHERE id = 2").fetchone() == (
            report["policy_set"]["hash"], '["require-queue-label"]')
        assert json.loads(db.execute("SELECT policy_hashes FROM runs WHERE id = 2").fetchone()[
            0]) == report["policy_set"]["policy_hashes"]
    # the schema-1 run kept no idle / stranded figures: the cost window cannot count it
    history = History(str(path))
    assert [figures is None for _, figures in history.waste_series()] == [True, False]
    history.close()


def test_history_series_feeds_the_html_trend_charts(tmp_path):
    from audit.render import html as render_html
    from audit.render import svg_charts

    history = str(tmp_path / "history.sqlite")
    snapshot = tmp_path / "cluster"
    shutil.copytree(EXAMPLE, snapshot)
    first = audit("-f", str(snapshot), "--history", history, "--metrics", str(METRICS))
    assert len(first["history"]) == 1
    assert svg_charts.trends(first) == []  # one run: no line to draw
    (snapshot / "workloads" / "kai-fraction-init.yaml").unlink()
    second = audit("-f", str(snapshot), "--history", history, "--metrics", str(METRICS))
    points = second["history"]
    assert [p["at"] for p in points] == [first["generated"], second["generated"]]
    # the KAI pod held 0.5 GPU (see the test above); the figures are each run's summary
    assert [p["allocated"] for p in points] == [
        first["summary"]["gpu_equivalents"]["allocated"],
        second["summary"]["gpu_equivalents"]["allocated"]]
    assert round(points[0]["allocated"] - points[1]["allocated"], 6) == 0.5
    assert points[1]["idle"] == second["summary"]["gpu_equivalents"]["idle_allocated"]
    assert points[1]["findings"] == {s: second["summary"]["findings"][s]
                                     for s in ("deny", "warn", "audit", "error")}
    page = render_html.render(second)
    assert 'aria-label="GPU-equivalents over time"' in page
    assert 'aria-label="Findings over time"' in page
    allocation = svg_charts.trends(second)[0]
    # three series, two points each: allocatable, allocated, idle
    assert allocation.count("<polyline") == 3
    assert all(len(line.split('points="')[1].split('"')[0].split()) == 2
               for line in allocation.split("<polyline")[1:])
