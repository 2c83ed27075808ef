"""Every command reads a ConfigMap volume's keys once (policies.sources.iter_paths).

A ConfigMap (or Secret) mounted as a volume holds each key twice: the visible ``KEY`` symlink to
``..data/KEY`` and the kubelet's ``..<timestamp>/KEY`` copy that ``..data`` points to. The shipped
audit CronJob mounts the policies this way; a walker that descends into the hidden folder reports
every policy twice ("policy name ... is already used").
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpuguard.cli import main
from tests.builders.corpus import DATA
from tests.paths import ROOT

LIBRARY = ROOT / "policies" / "library"
LIMITS = LIBRARY / "gpu-requests-equal-limits.yaml"
MANIFEST = DATA / "manifests" / "vllm__mistral-7b-nvidia-deployment.yaml"


def configmap_volume(root: Path, files: dict[str, Path]) -> Path:
    """``root`` laid out as the kubelet lays out a ConfigMap volume with ``files`` as keys."""
    stamped = root / "..2026_12_01_10_00_00.123456789"
    stamped.mkdir(parents=True)
    for key, source in files.items():
        shutil.copyfile(source, stamped / key)
    os.symlink(stamped.name, root / "..data")
    for key in files:
        os.symlink(f"..data/{key}", root / key)
    return root


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    library = {p.name: p for p in sorted(LIBRARY.glob("*.yaml"))}
    return configmap_volume(tmp_path / "policies", library)


def test_lint_reads_each_policy_once(policies: Path, capsys) -> None:
    assert main(["lint", str(policies)]) == 0
    assert "already used" not in capsys.readouterr().out


def test_check_reads_policies_and_manifests_once(policies: Path, tmp_path: Path,
                                                 capsys) -> None:
    manifests = configmap_volume(tmp_path / "manifests", {"app.yaml": MANIFEST})
    code = main(["check", "-f", str(manifests), "--policies", str(policies), "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert len(out["results"]) == 1 and out["errors"] == []


def test_test_reads_each_suite_once(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: demo}}
policies: [{LIMITS}]
cases:
- name: the vLLM deployment passes
  resource: {MANIFEST}
  expect: {{allowed: true}}
""", encoding="utf-8")
    suites = configmap_volume(tmp_path / "suites", {"suite.yaml": suite})
    assert main(["test", str(suites), "-o", "json"]) == 0
    [result] = json.loads(capsys.readouterr().out)["suites"]
    assert len(result["cases"]) == 1


def test_audit_and_gpus_read_each_object_once(policies: Path, tmp_path: Path, capsys) -> None:
    snapshot = configmap_volume(tmp_path / "snapshot", {"app.yaml": MANIFEST})
    assert main(["gpus", "-f", str(snapshot), "-o", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["objects"]) == 1
    assert main(["audit", "-f", str(snapshot), "--policies", str(policies), "-o", "json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == []
    assert (report["summary"]["objects"], report["summary"]["workloads"]) == (1, 1)
    assert report["policy_set"]["policies"] == sorted(p.stem for p in LIBRARY.glob("*.yaml"))
