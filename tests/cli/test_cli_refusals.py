"""Never fail open (issue 13): reports only from a good policy set, and input that names nothing
is an error.

Before, ``gpuguard audit --policies broken.yaml --fail-on deny`` printed the policy error and
exited 0 with every count at 0; an empty policy directory wrote PolicyReports with
``results: []``; ``gpus``, ``check`` and ``audit`` with ``-f EMPTY_DIR`` exited 0; a missing
``--metrics`` file exited 0. Now each of these is exit 2 with one line naming the path and what
was expected, and nothing is reported: no output on stdout, no ``--out`` files, nothing written
to the cluster or to the history. An API server that cannot be reached is exit 3.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from audit.sources.files import iter_snapshot
from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_USAGE
from policies.sources import Document
from tests.fakes.fake_kube_api import FakeKubeAPI
from tests.paths import ROOT, TESTS

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"
QUOTAS = ROOT / "tests" / "data" / "quota"
REVIEW = ROOT / "examples" / "admission" / "gpu-pod-review.json"
NOT_EXPECTED = "nothing audited, no report written"

#: A GPUPolicy cut off in the middle of a flow mapping: invalid YAML.
BROKEN_POLICY = """apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: max-gpus}
spec: {validationActions: [Deny], validations: [{expression: 'gpu.maxPerPod.count <= 4'
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv), environ={})
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err.splitlines()


@pytest.fixture()
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN_POLICY)
    return path


@pytest.fixture()
def empty_dir(tmp_path: Path) -> Path:
    path = tmp_path / "empty"
    path.mkdir()
    return path


# --- audit: reports only from a good policy set ---------------------------------------------


@pytest.mark.parametrize("fail_on", [["--fail-on", "deny"], []])
def test_audit_with_a_broken_policy_file_writes_nothing(capsys, tmp_path, broken, fail_on):
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--policies", str(broken),
                            *fail_on, "-o", "json", "--out", str(out), "--jobs", "0")
    assert code == EXIT_USAGE
    assert stdout == "" and not out.exists()
    assert err[0].startswith(f"gpuguard: policy error: {broken}: document 0: invalid YAML at "
                             "line 4")
    assert err[-1] == ("gpuguard: error: the policy set is broken or empty (gpuguard lint PATH "
                       f"lists every error): {NOT_EXPECTED}")


def test_audit_with_an_empty_policy_directory_writes_no_policy_reports(capsys, tmp_path,
                                                                      empty_dir):
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--policies", str(empty_dir),
                            "-o", "policyreport", "--out", str(out), "--jobs", "0")
    assert code == EXIT_USAGE
    assert stdout == "" and not out.exists()
    assert err[0].startswith(f"gpuguard: policy error: {empty_dir}: no policies found")


def test_audit_refuses_when_one_policy_source_of_several_is_broken(capsys, broken):
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--policies", str(POLICIES),
                            "--policies", str(broken), "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and stdout == ""
    assert sum("policy error" in line for line in err) == 1


@pytest.mark.parametrize("problem", ["missing", "empty-dir", "broken"])
def test_audit_refuses_unusable_quotas(capsys, tmp_path, empty_dir, broken, problem):
    path = {"missing": tmp_path / "nope.yaml", "empty-dir": empty_dir, "broken": broken}[problem]
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--quotas", str(path),
                            "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and stdout == ""
    assert str(path) in err[0] and err[0].startswith("gpuguard: policy error: ")
    if problem == "empty-dir":
        assert err[0] == (f"gpuguard: policy error: --quotas {path}: no GPUQuota documents "
                          "found (expected apiVersion: gpuguard.io/v1alpha1, kind: GPUQuota)")


def test_audit_with_good_quotas_still_reports(capsys):
    code, stdout, _ = run(capsys, "audit", "-f", str(EXAMPLE), "--quotas", str(QUOTAS),
                          "-o", "json", "--jobs", "0")
    assert code == 0 and json.loads(stdout)["quotas"]


def test_write_reports_from_a_broken_set_sends_nothing_to_the_cluster(capsys, tmp_path,
                                                                      broken):
    objects = [d.body for d in _example_documents()]
    with FakeKubeAPI(objects) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        code, stdout, _ = run(capsys, "audit", "--kubeconfig", kubeconfig, "--policies",
                              str(broken), "--write-reports", "-o", "json", "--jobs", "0")
        assert code == EXIT_USAGE and stdout == ""
        assert api.reports == {} and api.requests == []  # not even listed
        # The same run from a good set writes them (the fake works).
        code, _, _ = run(capsys, "audit", "--kubeconfig", kubeconfig, "--policies",
                         str(POLICIES), "--write-reports", "-o", "json", "--jobs", "0")
        assert code == 0 and api.reports


def test_history_records_nothing_from_a_broken_set(capsys, tmp_path, broken):
    history = tmp_path / "history.db"
    code, _, _ = run(capsys, "audit", "-f", str(EXAMPLE), "--policies", str(broken),
                     "--history", str(history), "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and not history.exists()


# --- check and test: a broken set reports nothing as allowed --------------------------------


@pytest.mark.parametrize("output", ["table", "json"])
def test_check_with_a_broken_or_empty_set_allows_nothing(capsys, broken, empty_dir, output):
    for policies in (broken, empty_dir):
        code, stdout, err = run(capsys, "check", "-f", str(REVIEW), "--policies", str(policies),
                                "-o", output)
        assert code == EXIT_USAGE and stdout == ""
        assert err[0].startswith(f"gpuguard: policy error: {policies}")


def test_test_suite_over_a_broken_or_empty_set_passes_no_case(capsys, tmp_path, broken,
                                                             empty_dir):
    for policies in (broken, empty_dir):
        suite = tmp_path / f"suite-{policies.name}.yaml"
        suite.write_text(yaml.safe_dump({
            "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicyTest",
            "metadata": {"name": "s"}, "policies": [str(policies)],
            "cases": [{"name": "cpu pod is allowed", "object": {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "image": "x"}]}},
                "expect": {"allowed": True}}]}))
        code, stdout, _ = run(capsys, "test", str(suite), "-o", "json")
        assert code == EXIT_USAGE
        result = json.loads(stdout)
        assert result["summary"]["pass"] == 0 and result["suites"][0]["cases"] == []
        assert str(policies) in result["suites"][0]["errors"][0]


# --- input that names nothing ---------------------------------------------------------------


def _inputs(tmp_path: Path, empty_dir: Path) -> dict[str, tuple[Path, str]]:
    """Paths that name no object, with the message each gets (after ``-f PATH: ``)."""
    empty_file = tmp_path / "empty.yaml"
    empty_file.write_text("")
    comments = tmp_path / "comments.yaml"
    comments.write_text("# nothing here\n---\n---\n")
    no_manifest = tmp_path / "docs"
    no_manifest.mkdir()
    (no_manifest / "README.md").write_text("apiVersion: v1\nkind: Pod\n")
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    (hollow / "a.yaml").write_text("# exported nothing\n")
    (hollow / "b.json").write_text("")
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "bad.json").write_text("{")
    return {
        "empty-dir": (empty_dir, "no manifest file in the directory (expected files named "
                                 "*.yaml, *.yml or *.json, optionally gzipped as .gz)"),
        "empty-file": (empty_file, "no Kubernetes object in the file (it is empty or holds "
                                   "only comments or '---')"),
        "comments-only": (comments, "no Kubernetes object in the file"),
        "no-manifest-file": (no_manifest, "no manifest file in the directory"),
        "hollow-files": (hollow, "its 2 manifest file(s) hold no Kubernetes object"),
        "nothing-readable": (unreadable, "no object could be read (1 error(s) above)"),
        "missing": (tmp_path / "nope", "no object could be read (1 error(s) above)"),
    }


CASES = ["empty-dir", "empty-file", "comments-only", "no-manifest-file", "hollow-files",
         "nothing-readable", "missing"]


@pytest.mark.parametrize("case", CASES)
def test_audit_of_a_path_that_names_nothing_is_exit_2(capsys, tmp_path, empty_dir, case):
    path, message = _inputs(tmp_path, empty_dir)[case]
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "audit", "-f", str(path), "-o", "json", "--out", str(out),
                            "--jobs", "0")
    assert code == EXIT_USAGE and stdout == "" and not out.exists()
    assert any(line.startswith(f"gpuguard: -f {path}: {message}") for line in err), err
    assert err[-1].startswith("gpuguard: error: a path names no object: " + NOT_EXPECTED)


def test_audit_of_a_good_path_next_to_an_empty_one_is_refused(capsys, tmp_path, empty_dir):
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "-f", str(empty_dir),
                            "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and stdout == ""
    assert err[0].startswith(f"gpuguard: -f {empty_dir}: no manifest file")


@pytest.mark.parametrize("case", CASES)
def test_gpus_of_a_path_that_names_nothing_is_exit_2(capsys, tmp_path, empty_dir, case):
    path, message = _inputs(tmp_path, empty_dir)[case]
    code, stdout, err = run(capsys, "gpus", "-f", str(path), "-o", "json")
    assert code == EXIT_USAGE
    errors = json.loads(stdout)["errors"]
    assert any(e.startswith(f"-f {path}: {message}") for e in errors), errors
    assert any(line.startswith(f"gpuguard: -f {path}: {message}") for line in err)


@pytest.mark.parametrize("case", CASES)
def test_check_of_a_path_that_names_nothing_is_exit_2(capsys, tmp_path, empty_dir, case):
    path, message = _inputs(tmp_path, empty_dir)[case]
    code, stdout, err = run(capsys, "check", "-f", str(path), "-o", "json")
    assert code == EXIT_USAGE
    assert json.loads(stdout)["results"] == []
    assert any(line.startswith(f"gpuguard: -f {path}: {message}") for line in err), err


def test_check_snapshot_that_names_nothing_is_exit_2(capsys, empty_dir):
    code, _, err = run(capsys, "check", "-f", str(REVIEW), "--policies", str(QUOTAS),
                       "--snapshot", str(empty_dir))
    assert code == EXIT_USAGE
    assert any(line.startswith(f"gpuguard: --snapshot {empty_dir}: no manifest file")
               for line in err)


def test_empty_standard_input_names_nothing(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("---\n# nothing\n"))
    code, _, err = run(capsys, "gpus", "-f", "-", "-o", "json")
    assert code == EXIT_USAGE
    assert err == ["gpuguard: -f standard input: no Kubernetes object (empty input); expected "
                   "Kubernetes objects (YAML or JSON manifests, kind: List, kubectl get -o yaml "
                   "output)"]


def test_a_directory_with_one_empty_file_among_manifests_is_still_audited(capsys, tmp_path):
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "pods.yaml").write_text((EXAMPLE / "pods.yaml").read_text())
    (snapshot / "placeholder.yaml").write_text("")
    code, stdout, _ = run(capsys, "audit", "-f", str(snapshot), "-o", "json", "--jobs", "0")
    assert code == 0 and json.loads(stdout)["summary"]["pods"] > 0


# --- --metrics, --inventory, --history -------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "directory", "not-utf8", "empty", "no-gpu-samples",
                                  "empty-query", "no-utilization"])
def test_unusable_metrics_refuse_the_audit(capsys, tmp_path, case):
    path = tmp_path / "metrics.prom"
    if case == "directory":
        path.mkdir()
    elif case == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif case == "empty":
        path.write_text("")
    elif case == "no-gpu-samples":
        path.write_text('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="n"} 1000\n')
    elif case == "no-utilization":  # the trial's NaN, -5, 1e400 and +Inf (finding 7)
        path.write_text((TESTS / "data" / "metrics" / "trial-weird.prom").read_text())
    elif case == "empty-query":
        path.write_text(json.dumps({"status": "success",
                                    "data": {"resultType": "vector", "result": []}}))
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--metrics", str(path),
                            "-o", "json", "--out", str(out), "--jobs", "0")
    assert code == EXIT_USAGE and stdout == "" and not out.exists()
    assert err[0].startswith(f"gpuguard: error: --metrics {path}: ")
    assert err[-1] == f"gpuguard: error: the metrics cannot be used: {NOT_EXPECTED}"
    if case in ("empty", "no-gpu-samples", "empty-query"):
        assert "no DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL sample" in err[0]
    if case == "no-utilization":
        assert "sample is refused, so idle GPUs cannot be measured: DCGM_FI_DEV_GPU_UTIL{" \
            'Hostname="gpu-node-h100-01",gpu="0"' in err[0] and "refused (NaN;" in err[0]


def test_good_metrics_still_report(capsys):
    code, stdout, _ = run(capsys, "audit", "-f", str(EXAMPLE), "--metrics", str(METRICS),
                          "-o", "json", "--jobs", "0")
    assert code == 0 and json.loads(stdout)["utilization"]["devices"] > 0


@pytest.mark.parametrize("case", ["missing", "empty-dir", "empty-file"])
def test_inventory_path_that_names_nothing_refuses_the_audit(capsys, tmp_path, empty_dir, case):
    path = {"missing": tmp_path / "nope.json", "empty-dir": empty_dir,
            "empty-file": tmp_path / "inventory.json"}[case]
    if case == "empty-file":
        path.write_text("")
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--inventory", str(path),
                            "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and stdout == ""
    assert any(line.startswith(f"gpuguard: --inventory {path}: ") and "expected GPUInventory"
               in line for line in err), err


def test_inventory_from_annotations_that_no_node_has_is_a_warning(capsys):
    code, stdout, _ = run(capsys, "audit", "-f", str(EXAMPLE), "--inventory", "-o", "json",
                          "--jobs", "0")
    report = json.loads(stdout)
    assert code == 0 and report["inventory"]["nodes"] == []
    assert any(w.startswith("--inventory: no audited Node carries the gpuguard.io/inventory "
                            "annotation") for w in report["warnings"])


def test_history_in_a_missing_directory_names_the_directory(capsys, tmp_path):
    path = tmp_path / "no" / "such" / "history.db"
    code, stdout, err = run(capsys, "audit", "-f", str(EXAMPLE), "--history", str(path),
                            "-o", "json", "--jobs", "0")
    assert code == EXIT_USAGE and stdout == ""
    assert err == [f"gpuguard: error: --history {path}: the directory {path.parent} does not "
                   "exist (expected a file in an existing directory; it is created on the "
                   "first run)"]


# --- the environment ------------------------------------------------------------------------


def test_an_unreachable_api_server_is_exit_3_and_no_report(capsys, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    with FakeKubeAPI([]) as api:
        api.kubeconfig(kubeconfig)
    # The fake has stopped: its port refuses connections.
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "audit", "--kubeconfig", str(kubeconfig), "-o", "json",
                            "--out", str(out), "--jobs", "0")
    assert code == EXIT_ENVIRONMENT and stdout == "" and not out.exists()
    assert err[0].startswith("gpuguard: error: /api/v1/namespaces: cannot reach the API server")
    assert err[-1] == ("gpuguard: error: the API server cannot be reached: the scan is "
                       "incomplete, no report written")


def _example_documents() -> list[Document]:
    return [d for d in iter_snapshot([str(EXAMPLE)]) if isinstance(d, Document)]


@pytest.mark.parametrize(("text", "says"), [
    ("garbage: [\n", "the kubeconfig is not valid YAML at line 2"),
    ("apiVersion: v1\nkind: Config\nclusters: 5\n", "expected a kubeconfig"),
])
@pytest.mark.parametrize("command", [["audit", "--cluster"], ["diff", "--cluster",
                                                               "--candidate", "policies/library"]])
def test_a_kubeconfig_that_cannot_be_read_is_bad_input_in_one_line(tmp_path, capsys, monkeypatch,
                                                                   text, says, command):
    # Was internal error 70 (PyYAML's ParserError escaped kube.config.detect).
    monkeypatch.chdir(ROOT)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    code = main([*command, "--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and says in err[0] and "internal error" not in err[0], err


# --- a policy set of GPUQuotas only ---------------------------------------------------------

QUOTA_ONLY = "tests/data/quota/example-cluster-quotas.yaml"  # 3 GPUQuotas, no policy


def test_a_quota_only_set_is_a_policy_source_and_no_command_calls_it_empty(capsys, tmp_path):
    """A fresh-context trial's find: ``check --policies`` of a file holding only a GPUQuota said
    "no policies found". lint, audit and serve load and enforce such a set; check needs
    --snapshot to judge a quota and says so; a test suite evaluates policies only and says so."""
    code, stdout, _ = run(capsys, "lint", QUOTA_ONLY)
    assert code == 0 and stdout.splitlines()[-1] == (
        "0 policies and 3 GPUQuota(s) loaded, 0 error(s), 0 warning(s)")
    code, stdout, err = run(capsys, "check", "-f", str(REVIEW), "--policies", QUOTA_ONLY)
    assert code == EXIT_USAGE and stdout == ""
    assert err == [
        f"gpuguard: error: {QUOTA_ONLY} holds 3 GPUQuota document(s) and no GPUPolicy, "
        "ValidatingAdmissionPolicy or MutatingAdmissionPolicy; check judges GPUQuotas against "
        "the usage of a cluster snapshot: give --snapshot PATH (its Pods and Namespaces), or "
        "policy files with a policy to evaluate"]
    assert "no policies found" not in " ".join(err)
    code, stdout, _ = run(capsys, "audit", "-f", "examples/cluster", "--policies", QUOTA_ONLY,
                          "-o", "json", "--jobs", "0")
    assert code == 0 and len(json.loads(stdout)["quotas"]) == 3
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicyTest", "metadata": {"name": "s"},
        "policies": [str(Path(QUOTA_ONLY).resolve())],
        "cases": [{"name": "cpu pod", "object": {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}},
            "expect": {"allowed": True}}]}))
    code, stdout, _ = run(capsys, "test", str(suite), "-o", "json")
    assert code == EXIT_USAGE
    [error] = json.loads(stdout)["suites"][0]["errors"]
    assert "holds 3 GPUQuota document(s) and no GPUPolicy" in error
    assert "a test case evaluates policies only" in error


def test_check_of_a_vap_without_a_binding_says_why_nothing_was_evaluated(capsys, tmp_path):
    """A ValidatingAdmissionPolicy without its binding is not enforced (as in Kubernetes): check
    refuses the empty set and says which policy lacked the binding, not only "no policies
    found"; with the binding the same file is evaluated and denies."""
    vap = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
           "metadata": {"name": "no-gpus"},
           "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
               "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
               "resources": ["pods"]}]},
               "validations": [{"expression": "object.metadata.namespace != 'team-llm'"}]}}
    alone = tmp_path / "alone.yaml"
    alone.write_text(yaml.safe_dump(vap))
    code, stdout, err = run(capsys, "check", "-f", str(REVIEW), "--policies", str(alone))
    assert code == EXIT_USAGE and stdout == ""
    assert err[0].startswith(f"gpuguard: policy error: {alone}: no policies found")
    assert err[1] == (f"gpuguard: policy warning: {alone}: document 0: ValidatingAdmissionPolicy "
                      "'no-gpus' has no binding in the input; Kubernetes does not enforce it, "
                      "and neither does gpuguard")
    bound = tmp_path / "bound.yaml"
    bound.write_text(yaml.safe_dump_all([vap, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"},
        "spec": {"policyName": "no-gpus", "validationActions": ["Deny"]}}]))
    code, stdout, err = run(capsys, "check", "-f", str(REVIEW), "--policies", str(bound))
    assert code == 1 and "DENIED" in stdout and err == []
