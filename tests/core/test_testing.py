"""Tests for the GPUPolicyTest runner (policies/suites.py) and `gpuguard test`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpuguard.cli import main
from policies import suites as testing
from tests.builders.corpus import DATA
from tests.paths import ROOT

LIMITS = ROOT / "policies" / "library" / "gpu-requests-equal-limits.yaml"
OLLAMA = DATA / "manifests" / "imroc__ollama-statefulset-gpu-requests-only.yaml"
VLLM = DATA / "manifests" / "vllm__mistral-7b-nvidia-deployment.yaml"

# A small policy with a matchCondition, a warning rule, an expiring exception and a rule that
# cannot be evaluated on objects without spec.nope (failurePolicy Ignore: reported, allowed).
TOY_POLICY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: toy}
spec:
  failurePolicy: Ignore
  validationActions: [Deny]
  matchConditions:
  - name: requests-gpu
    expression: gpu.requested
  exceptions:
  - {namespaces: [legacy], reason: migration ticket 42, expires: "2025-01-01"}
  validations:
  - name: at-most-one-gpu
    expression: gpu.count <= 1
    messageExpression: "'asks for ' + string(gpu.count) + ' GPUs; at most 1'"
  - expression: "!has(object.metadata.labels) || !('broken' in object.metadata.labels) ||
      object.spec.nope == 1"
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def suite(tmp_path: Path, cases: str, policies: str = f"[{LIMITS}]") -> Path:
    return write(tmp_path, "suite.yaml", f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: demo}}
policies: {policies}
cases:
{textwrap.dedent(cases)}""")


def only_case(path: Path) -> testing.CaseResult:
    results = testing.run_paths([str(path)])
    assert len(results) == 1
    assert results[0].errors == ()
    assert len(results[0].cases) == 1
    return results[0].cases[0]


# --- expectations -------------------------------------------------------------------------------


def test_failing_expectations_are_reported_with_expected_and_got(tmp_path: Path) -> None:
    path = suite(tmp_path, f"""\
- name: ollama is wrongly expected to pass
  resource: {OLLAMA}
  namespace: llama
  expect:
    allowed: true
    results:
    - {{policy: gpu-requests-equal-limits, rule: requests-equal-limits, outcome: pass}}
    messageContains: ["limits 1"]
    warnings: ["something"]
    patch: [{{op: add, path: /x, value: 1}}]
""")
    case = only_case(path)
    assert case.status == testing.FAILED
    message = case.verdict.message
    assert case.differences == (
        f"allowed: expected true, got false ({message})",
        "results: expected {policy: gpu-requests-equal-limits, rule: requests-equal-limits, "
        "outcome: pass}, got: gpu-requests-equal-limits requests-equal-limits fail",
        f"messageContains: expected 'limits 1' in the denial message, got {message!r}",
        "warnings: expected a warning containing 'something', got none",
        'patch: expected [{"op": "add", "path": "/x", "value": 1}], got []',
    )
    assert message.startswith("gpu-requests-equal-limits: container 'ollama' "
                               "(spec.template.spec.containers[0]): nvidia.com/gpu requests 1, "
                               "limits not set")


def test_failure_is_exit_1_with_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = suite(tmp_path, f"""\
- name: passes
  resource: {VLLM}
  expect: {{allowed: true, patch: []}}
- name: fails
  resource: {VLLM}
  expect: {{allowed: false}}
""")
    assert main(["test", str(path)]) == 1
    out = capsys.readouterr().out
    assert "suite" in out and "case" in out and "result" in out and "details" in out
    assert "FAIL" in out
    assert "allowed: expected false, got true (no denial)" in out
    assert "1 suite(s), 2 case(s): 1 passed, 1 failed, 0 error(s), 0 skipped" in out


def test_passing_suite_is_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = suite(tmp_path, f"""\
- name: vllm passes
  resource: {VLLM}
  expect:
    allowed: true
    results: [{{policy: gpu-requests-equal-limits, rule: "validations[0]", outcome: pass}}]
""")
    assert main(["test", str(path)]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = suite(tmp_path, f"""\
- name: fails
  resource: {VLLM}
  expect: {{allowed: false}}
""")
    assert main(["test", "-o", "json", str(path)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["summary"] == {"suites": 1, "cases": 1, "suite_errors": 0, "pass": 0,
                                   "fail": 1, "error": 0, "skip": 0}
    assert document["suites"][0]["cases"][0] == {
        "suite": "demo", "source": str(path), "case": "fails", "status": "fail",
        "differences": ["allowed: expected false, got true (no denial)"]}


def test_skip_results_name_the_match_or_the_false_condition(tmp_path: Path) -> None:
    toy = write(tmp_path, "toy.yaml", TOY_POLICY)
    path = suite(tmp_path, f"""\
- name: a Service is not matched
  resource: {OLLAMA}
  document: 1
  expect:
    results: [{{policy: toy, rule: match, outcome: skip}}]
- name: a CPU workload fails the matchCondition
  resource: {DATA / "manifests" / "imroc__ollama-statefulset-gpu-zero-request.yaml"}
  expect:
    results: [{{policy: toy, rule: requests-gpu, outcome: skip}}]
""", policies=f"[{toy}]")
    results = testing.run_paths([str(path)])
    assert [c.status for c in results[0].cases] == ["pass", "pass"]


def test_messages_warnings_and_rule_positions(tmp_path: Path) -> None:
    toy = write(tmp_path, "toy.yaml", TOY_POLICY)
    path = suite(tmp_path, f"""\
- name: two GPUs
  resource: {DATA / "manifests" / "gke__vllm-gemma3-27b-a100-deployment.yaml"}
  expect:
    allowed: false
    results:
    - {{policy: toy, rule: at-most-one-gpu, outcome: fail, message: "asks for 2 GPUs; at most 1"}}
    - {{policy: toy, rule: "validations[0]", messageContains: [asks for 2]}}
    - {{policy: toy, rule: "validations[1]", outcome: pass}}
    messageContains: ["toy: asks for 2 GPUs"]
    messageNotContains: ["3 GPUs"]
    warnings: []
""", policies=f"[{toy}]")
    case = only_case(path)
    assert case.status == testing.PASSED, case.differences


def test_an_unexpected_evaluation_error_fails_the_case(tmp_path: Path) -> None:
    toy = write(tmp_path, "toy.yaml", TOY_POLICY)
    broken = """\
  object:
    apiVersion: v1
    kind: Pod
    metadata: {name: p, labels: {broken: "yes"}}
    spec:
      containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
"""
    path = suite(tmp_path, f"""\
- name: the error is not expected
{broken}  expect: {{allowed: true}}
- name: the error is expected
{broken}  expect:
    allowed: true
    results: [{{policy: toy, rule: "validations[1]", outcome: error}}]
""", policies=f"[{toy}]")
    first, second = testing.run_paths([str(path)])[0].cases
    assert first.status == testing.FAILED
    assert len(first.differences) == 1
    assert first.differences[0].startswith("results: unexpected error in toy validations[1]: "
                                           "validations[1] failed to evaluate: ")
    assert second.status == testing.PASSED


def test_now_decides_whether_an_exception_has_expired(tmp_path: Path) -> None:
    toy = write(tmp_path, "toy.yaml", TOY_POLICY)
    gke = DATA / "manifests" / "gke__vllm-gemma3-27b-a100-deployment.yaml"
    path = suite(tmp_path, f"""\
- name: before expiry the exception applies
  resource: {gke}
  namespace: legacy
  now: 2024-06-01
  expect:
    allowed: true
    results: [{{policy: toy, rule: exceptions, outcome: exempt,
               message: "migration ticket 42 (until 2025-01-01)"}}]
- name: after expiry it does not
  resource: {gke}
  namespace: legacy
  now: "2025-01-02T08:00:00Z"
  expect: {{allowed: false}}
""", policies=f"[{toy}]")
    assert [c.status for c in testing.run_paths([str(path)])[0].cases] == ["pass", "pass"]


def test_admission_review_with_field_and_overrides(tmp_path: Path) -> None:
    path = suite(tmp_path, f"""\
- name: bug 154 as sent, user and namespace overridden
  admissionReview: {DATA / "bugs" / "NVIDIA-k8s-device-plugin-154.yaml"}
  field: input
  namespace: team-b
  userInfo: {{username: bob, groups: [ml]}}
  expect:
    allowed: false
    messageContains: ["requests 1, limits 3"]
""")
    case = only_case(path)
    assert case.status == testing.PASSED, case.differences


def test_skipped_case_is_not_run(tmp_path: Path) -> None:
    path = suite(tmp_path, f"""\
- name: later
  skip: waiting for a fix
  resource: {tmp_path / "does-not-exist.yaml"}
  expect: {{allowed: true}}
""")
    case = only_case(path)
    assert (case.status, case.differences) == (testing.SKIPPED, ("skipped: waiting for a fix",))
    assert testing.exit_code(testing.run_paths([str(path)])) == 0


# --- problems with the suite: exit 2, naming file, line and field -----------------------------


def test_missing_resource_file_names_the_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = suite(tmp_path, """\
- name: missing
  resource: ../nowhere/ollama.yaml
  expect: {allowed: false}
""")
    case = only_case(path)
    assert case.status == testing.ERRORED
    assert case.differences == (
        f"{path}:7: cases[0].resource: ../nowhere/ollama.yaml: no such file or directory",)
    assert main(["test", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"gpuguard: test error: {path}:7: cases[0].resource: "
                            "../nowhere/ollama.yaml: no such file or directory\n")
    assert "ERROR" in captured.out


def test_missing_policy_file_names_the_field(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = suite(tmp_path, f"""\
- name: x
  resource: {VLLM}
  expect: {{allowed: true}}
""", policies="[missing-policy.yaml]")
    assert main(["test", str(path)]) == 2
    captured = capsys.readouterr()
    assert f"{path}:4: policies[0]: missing-policy.yaml: no such file or directory" in \
        captured.err
    assert "ERROR" in captured.out


def test_policy_load_error_names_the_policy_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.yaml", TOY_POLICY.replace("gpu.count <= 1", "gpu.count <= )"))
    path = suite(tmp_path, f"""\
- name: x
  resource: {VLLM}
  expect: {{allowed: true}}
""", policies=f"[{bad}]")
    assert main(["test", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: policies: policy error: {bad}:" in err
    assert "spec.validations[0].expression: CEL error at expression line 1" in err


def test_bad_suite_yaml_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "broken.yaml", """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
cases:
- name: [unclosed
""")
    assert main(["test", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"gpuguard: test error: {path}: document 0: invalid YAML at line 4" in err


def test_unknown_and_missing_fields_are_errors(tmp_path: Path) -> None:
    path = suite(tmp_path, f"""\
- name: typo
  resource: {VLLM}
  expected: {{allowed: true}}
- resource: {VLLM}
  expect: {{allowed: maybe, results: [{{policy: nope, outcome: passed}}]}}
""")
    results = testing.run_paths([str(path)])
    first, second = results[0].cases
    assert first.status == second.status == testing.ERRORED
    assert first.differences[0].startswith(
        f"{path}:8: cases[0].expected: unknown field (allowed: admissionReview, document, ")
    assert first.differences[1] == f"{path}:6: cases[0]: expect is required"
    assert second.differences == (
        f"{path}:9: cases[1]: name is required",
        f"{path}:10: cases[1].expect.allowed: expected true or false",
        f"{path}:10: cases[1].expect.results[0].outcome: 'passed' is not one of error, exempt, "
        "fail, mutate, pass, skip",
        f"{path}:10: cases[1].expect.results[0].policy: no policy 'nope' in this suite's "
        "policies (gpu-requests-equal-limits)",
    )
    assert testing.exit_code(results) == 2


def test_wrong_suite_header_and_document_index(tmp_path: Path) -> None:
    path = write(tmp_path, "suite.yaml", f"""\
apiVersion: gpuguard.io/v1
kind: GPUPolicyTest
metadata: {{name: demo}}
policies: [{LIMITS}]
cases: []
""")
    (result,) = testing.run_paths([str(path)])
    assert result.errors == (
        f"{path}:1: apiVersion: expected 'gpuguard.io/v1alpha1', got 'gpuguard.io/v1'",
        f"{path}:5: cases: expected a non-empty list of cases",
    )
    path = suite(tmp_path, f"""\
- name: no such document
  resource: {OLLAMA}
  document: 7
  expect: {{allowed: true}}
- name: no such field
  admissionReview: {DATA / "bugs" / "NVIDIA-k8s-device-plugin-61.yaml"}
  field: input.implicit_env
  expect: {{allowed: true}}
""")
    first, second = testing.run_paths([str(path)])[0].cases
    assert first.differences == (
        f"{path}:8: cases[0].document: {OLLAMA} has no document 7 (documents: 0, 1)",)
    assert second.differences == (
        f"{path}:12: cases[1].field: {DATA / 'bugs' / 'NVIDIA-k8s-device-plugin-61.yaml'}: no "
        "key 'implicit_env' on the path 'input.implicit_env'",)


def test_a_directory_without_suites_is_an_error(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "policy.yaml", TOY_POLICY)
    assert main(["test", str(tmp_path)]) == 2
    assert f"{tmp_path}: no GPUPolicyTest suites found" in capsys.readouterr().err
    assert main(["test", str(tmp_path / "policy.yaml")]) == 2
    assert "no GPUPolicyTest document (kinds found: GPUPolicy)" in capsys.readouterr().err
    assert main(["test", str(tmp_path / "nothing-here")]) == 2
    assert "nothing-here: no such file or directory" in capsys.readouterr().err


DELETE_POLICY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: on-delete}
spec:
  match: {operations: [DELETE]}
  matchConditions:
  - name: deleting
    expression: object == null
  mutations:
  - name: nothing-to-change
    condition: "false"
    expression: "[]"
"""


def test_the_suite_runner_sees_what_the_engine_ran_on_delete(tmp_path: Path) -> None:
    # The engine binds `object` to null on DELETE; the runner used to re-derive skips with
    # `object` bound to oldObject, so it reported this policy as skipped while the engine ran it.
    policy = write(tmp_path, "on-delete.yaml", DELETE_POLICY)
    path = suite(tmp_path, f"""\
- name: the condition holds on DELETE
  resource: {VLLM}
  operation: DELETE
  expect:
    results: [{{policy: on-delete, rule: deleting, outcome: skip}}]
""", policies=f"[{policy}]")
    case = only_case(path)
    assert case.status == "fail"
    assert case.differences == ("results: expected {policy: on-delete, rule: deleting, "
                                "outcome: skip}, got: no results",)


def test_namespace_labels_cannot_override_the_name_label(tmp_path: Path) -> None:
    # kube-apiserver sets kubernetes.io/metadata.name to the namespace's name whatever is
    # written: one Namespace stub (policies.facts.review.namespace_stub) for suites, check and audit.
    from policies.facts.review import namespace_stub

    stub = namespace_stub("team-a", {"kubernetes.io/metadata.name": "kube-system", "x": "y"})
    assert stub["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a", "x": "y"}
    policy = write(tmp_path, "ns.yaml", """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: not-system}
spec:
  validations:
  - expression: namespaceObject.metadata.labels['kubernetes.io/metadata.name'] != 'kube-system'
    message: spoofed
""")
    path = suite(tmp_path, f"""\
- name: a spoofed name label is not believed
  resource: {VLLM}
  namespace: team-a
  namespaceLabels: {{kubernetes.io/metadata.name: kube-system}}
  expect: {{allowed: true}}
""", policies=f"[{policy}]")
    assert only_case(path).status == "pass"


def test_a_duplicate_key_in_a_suite_file_names_document_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "dup.yaml", """\
        apiVersion: gpuguard.io/v1alpha1
        kind: GPUPolicyTest
        metadata: {name: demo}
        ---
        apiVersion: gpuguard.io/v1alpha1
        kind: GPUPolicyTest
        kind: GPUPolicyTest
        """)
    [result] = testing.run_paths([str(path)])
    assert result.errors == (
        f"{path}: document 1: line 7: duplicate key 'kind' (first at line 6)",)
