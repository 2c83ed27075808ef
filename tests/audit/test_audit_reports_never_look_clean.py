"""An audit over part of its input never reads as a clean report (found by a fresh-context trial:
``audit -o policyreport`` on a directory with an unreadable file printed PolicyReports with no
trace of the error — JUnit and SARIF carried it — and ``audit -f`` of a directory of
AdmissionReviews audited nothing and exited 0 without a word)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import jsonschema
import yaml

from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_OK, EXIT_USAGE
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"
REVIEWS = ROOT / "tests" / "data" / "admissionreviews"
SCHEMA = json.loads((ROOT / "tests" / "data" / "audit" / "policyreport-v1alpha2.schema.json")
                    .read_text())


def audit(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", *args, "--jobs", "0"])
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def _snapshot_with_bad_files(tmp_path: Path) -> Path:
    snapshot = tmp_path / "snapshot"
    shutil.copytree(EXAMPLE, snapshot, ignore=shutil.ignore_patterns("metrics", "*.md"))
    (snapshot / "broken.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [x\n")
    unreadable = snapshot / "unreadable.yaml"
    unreadable.write_bytes(b"\xff\xfe not utf-8")
    return snapshot


def _cluster_report(out: str) -> dict:
    objects = list(yaml.safe_load_all(out))
    for obj in objects:
        jsonschema.validate(obj, SCHEMA)
    (cluster,) = [o for o in objects if o["kind"] == "ClusterPolicyReport"]
    return cluster


def test_policyreport_output_carries_the_input_errors_and_exits_2(tmp_path):
    snapshot = _snapshot_with_bad_files(tmp_path)
    code, out, err = audit("-f", str(snapshot), "--policies", str(POLICIES), "-o",
                           "policyreport")
    assert code == EXIT_USAGE
    errors = [line.removeprefix("gpuguard: ") for line in err.splitlines()
              if line.startswith(f"gpuguard: {snapshot}/")]
    assert [e.split(":")[0] for e in errors] == [f"{snapshot}/broken.yaml",
                                                 f"{snapshot}/unreadable.yaml"]
    cluster = _cluster_report(out)
    assert cluster["summary"]["error"] == 2
    assert cluster["metadata"]["annotations"]["gpuguard.io/input-errors"] == (
        "2 input error(s): the report covers only the input that could be read")
    inputs = [r for r in cluster["results"] if r["rule"] == "input"]
    assert cluster["results"][:2] == inputs  # first: never cut for size before a finding
    assert [r["message"] for r in inputs] == errors
    assert {(r["policy"], r["result"], r["severity"]) for r in inputs} == {
        ("gpuguard-audit", "error", "high")}


def test_the_same_snapshot_without_the_bad_files_has_no_input_error_result(tmp_path):
    code, out, _ = audit("-f", str(EXAMPLE), "--policies", str(POLICIES), "-o", "policyreport")
    assert code == EXIT_OK
    cluster = _cluster_report(out)
    assert cluster["summary"]["error"] == 0
    assert "gpuguard.io/input-errors" not in cluster["metadata"]["annotations"]
    assert not [r for r in cluster["results"] if r["rule"] == "input"]


def test_out_dir_policyreports_carry_the_errors_too(tmp_path):
    snapshot = _snapshot_with_bad_files(tmp_path)
    code, _, _ = audit("-f", str(snapshot), "--policies", str(POLICIES), "--out",
                       str(tmp_path / "out"), "-o", "json")
    assert code == EXIT_USAGE
    cluster = _cluster_report((tmp_path / "out" / "policyreports.yaml").read_text())
    assert cluster["summary"]["error"] == 2


def test_a_directory_of_admission_reviews_is_not_an_empty_clean_audit():
    code, out, err = audit("-f", str(REVIEWS), "-o", "json")
    assert code == EXIT_USAGE
    assert out == ""  # no report: it would list nothing and look clean
    assert err.splitlines() == [
        f"gpuguard: -f {REVIEWS}: 7 object(s) read, none of them a Node, Pod or workload the "
        "audit reports on (7 AdmissionReview without name); AdmissionReviews are admission "
        "requests, not cluster objects: 'gpuguard check -f PATH' evaluates them; expected Nodes, "
        "Pods and workloads (Deployments, Jobs, training jobs, ...), e.g. kubectl get "
        "nodes,pods,deployments,jobs -A -o yaml output",
        "gpuguard: error: nothing in the input is auditable: nothing audited, no report written"]


def test_a_snapshot_of_only_config_objects_says_what_it_found(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "x"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "x"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}]))
    code, out, err = audit("-f", str(path))
    assert code == EXIT_USAGE and out == ""
    assert err.splitlines()[0] == (
        f"gpuguard: -f {path}: 3 object(s) read, none of them a Node, Pod or workload the audit "
        "reports on (2 ConfigMap, 1 Namespace or refused object(s)); expected "
        "Nodes, Pods and workloads (Deployments, Jobs, training jobs, ...), e.g. kubectl get "
        "nodes,pods,deployments,jobs -A -o yaml output")
