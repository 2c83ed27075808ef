"""GPUQuota offline: ``gpuguard check --snapshot`` and the audit report, on examples/cluster."""

from __future__ import annotations

import json
from pathlib import Path

from audit.render.markdown import render as render_markdown
from audit.report.assemble import assemble
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from gpuguard import serve_run
from gpuguard.cli import main
from policies.policy.loader import load_quotas
from tests.audit.test_audit_live import NOW

QUOTAS = "tests/data/quota/example-cluster-quotas.yaml"
DENIAL = ("team llm (GPUQuota llm) uses 35.6 of 36 GPU-equivalents; this pod needs 1 "
          "(headroom 0.4 GPU-equivalents)")
POD = """apiVersion: v1
kind: Pod
metadata: {name: new-trainer, namespace: team-llm}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: GPUS}}}
"""


def _check(tmp_path: Path, capsys, gpus: int) -> tuple[int, dict]:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.replace("GPUS", str(gpus)), encoding="utf-8")
    code = main(["check", "-f", str(manifest), "--policies", QUOTAS,
                 "--snapshot", "examples/cluster", "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_snapshot_denies_over_quota_with_the_webhook_message(tmp_path, capsys) -> None:
    code, out = _check(tmp_path, capsys, 1)
    assert code == 1
    entry = out["results"][0]
    assert entry["allowed"] is False
    assert entry["message"] == DENIAL
    assert entry["quota"]["denials"] == [DENIAL]
    used = entry["quota"]["usage"]["quotas"]["llm"]["used"]
    assert used["gpuEquivalents"] == 35.6 and used["gpus"] == {"nvidia.com/gpu": 37}
    assert used["pods"] == 13  # pending and running pods only


def test_check_snapshot_admits_what_fits(tmp_path, capsys) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.replace("GPUS", "1").replace("team-llm", "team-research"),
                        encoding="utf-8")
    code = main(["check", "-f", str(manifest), "--policies", QUOTAS,
                 "--snapshot", "examples/cluster", "-o", "json"])
    entry = json.loads(capsys.readouterr().out)["results"][0]
    assert code == 0 and entry["allowed"] is True
    assert entry["quota"]["usage"]["quotas"]["research"]["headroomGpuEquivalents"] == 10.9


def test_audit_report_has_usage_against_each_quota() -> None:
    quotas, errors = load_quotas([QUOTAS])
    assert not errors
    report = assemble(scan(iter_snapshot(["examples/cluster"]), AuditSettings(now=NOW), None,
                           quotas=quotas))
    by_name = {q["name"]: q for q in report["quotas"]}
    assert report["summary"]["quotas"] == {"over": ["vision"], "near": ["llm"],
                                           "ok": ["research"]}
    llm = by_name["llm"]
    assert (llm["team"], llm["state"], llm["max_ratio"]) == ("llm", "near", 0.9889)
    assert llm["used"]["gpuEquivalents"] == 35.6
    assert llm["usage_ratio"] == {"gpuEquivalents": 0.9889, "gpus[nvidia.com/gpu]": 0.925}
    assert llm["headroom_gpu_equivalents"] == 0.4
    vision = by_name["vision"]
    assert (vision["state"], vision["usage_ratio"], vision["used"]["unknownPods"]) == \
        ("over", {"gpuEquivalents": 1.0159}, 4)
    assert vision["headroom_gpu_equivalents"] == 0.0
    research = by_name["research"]
    assert (research["team"], research["state"], research["used"]["gpuEquivalents"]) == \
        ("research", "ok", 9.1)
    markdown = render_markdown(report)
    assert "| llm | llm | 35.6/36 GPU-eq; 37/40 nvidia.com/gpu | 99% | 0.4 | near |" in markdown
    assert "over: vision; at 90 % or more: llm" in markdown


def test_audit_command_reads_quotas(tmp_path, capsys) -> None:
    code = main(["audit", "-f", "examples/cluster", "--quotas", QUOTAS, "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert [q["name"] for q in report["quotas"]] == ["llm", "vision", "research"]
    assert report["source"]["quotas"] == [QUOTAS]


def test_audit_without_quotas_reports_none() -> None:
    report = assemble(scan(iter_snapshot(["examples/cluster"]), AuditSettings(now=NOW), None))
    assert report["quotas"] == []
    assert report["summary"]["quotas"] == {"over": [], "near": [], "ok": []}


def test_serve_quota_namespace_and_standalone_gate(tmp_path) -> None:
    assert serve_run.default_quota_namespace(str(tmp_path / "missing")) == "gpuguard-system"
    (tmp_path / "ns").write_text("gpuguard\n", encoding="utf-8")
    assert serve_run.default_quota_namespace(str(tmp_path / "ns")) == "gpuguard"


SECOND_LLM = """apiVersion: gpuguard.io/v1alpha1
kind: GPUQuota
metadata: {name: llm}
spec:
  scope: {namespace: team-llm}
  limits: {gpuEquivalents: 1000}
"""


def test_a_second_gpuquota_with_a_used_name_is_an_error_and_not_served(tmp_path) -> None:
    # It names the same reservation ledger; the audit used to let the later one win.
    extra = tmp_path / "more-quotas.yaml"
    extra.write_text(SECOND_LLM, encoding="utf-8")
    quotas, errors = load_quotas([QUOTAS, str(extra)])
    assert [q.name for q in quotas] == ["llm", "vision", "research"]
    assert QUOTAS in quotas[0].source  # the first llm is served, not the later one
    [error] = errors
    assert error.path == "metadata.name" and str(extra) in str(error)
    assert "GPUQuota name 'llm' is already used by " in error.message


def test_audit_refuses_a_duplicate_gpuquota_name(tmp_path, capsys) -> None:
    extra = tmp_path / "more-quotas.yaml"
    extra.write_text(SECOND_LLM, encoding="utf-8")
    out = tmp_path / "out"
    code = main(["audit", "-f", "examples/cluster", "--quotas", QUOTAS, "--quotas", str(extra),
                 "--out", str(out)])
    assert code == 2
    assert "GPUQuota name 'llm' is already used" in capsys.readouterr().err
    assert not out.exists()


def test_check_refuses_a_policy_set_with_a_duplicate_gpuquota_name(tmp_path, capsys) -> None:
    extra = tmp_path / "more-quotas.yaml"
    extra.write_text(SECOND_LLM, encoding="utf-8")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.replace("GPUS", "1"), encoding="utf-8")
    code = main(["check", "-f", str(manifest), "--policies", QUOTAS, "--policies", str(extra)])
    assert code == 2
    assert "GPUQuota name 'llm' is already used" in capsys.readouterr().err
