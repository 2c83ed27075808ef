"""History: two runs in SQLite, and what changed between them."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from audit.history import History, HistoryError, changes
from gpuguard.cli import main

ROOT = Path(__file__).resolve().parent.parent
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


def test_changes_without_previous_run_is_none():
    assert changes({"findings": []}, None) is None
