"""Policy loading: every error listed, each with exact text and location."""

from gpuguard.cli import main
from policies.cel import CelEnvironment
from policies.cel_gpu import GPU_LIBRARY
from policies.loader import load_policies

ENV = CelEnvironment(GPU_LIBRARY)

BROKEN = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: fine
spec:
  validations:
  - expression: gpu.count <= 8
---
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: broken
spec:
  failurePolicy: Sometimes
  validationActions: [Deny, Shout]
  matchConditions:
  - name: gpu
    expression: gpu.requested
  variables:
  - name: n
    expression: gpu.count +
  validations:
  - expression: gpu.count <= 8
  - expression: |
      object.spec.containers.all(c,
        c.name ==)
  mutations:
  - setRuntimeClassName: nvidia
    setSchedulerName: kai-scheduler
  exceptions:
  - reason: no scope
"""


def test_every_error_is_listed_with_file_line_document_and_field(tmp_path):
    path = tmp_path / "policies.yaml"
    path.write_text(BROKEN)
    policy_set, errors = load_policies([str(path)], ENV)
    assert policy_set.names() == ("fine",)  # the broken policy is left out entirely
    messages = sorted(str(e).removeprefix(f"{path}:") for e in errors)
    assert messages == sorted([
        "14: document 1: spec.failurePolicy: 'Sometimes' is not one of Fail, Ignore",
        "15: document 1: spec.validationActions[1]: 'Shout' is not one of Deny, Warn, Audit",
        "21: document 1: spec.variables[0].expression: CEL error at expression line 1, column "
        "12: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', "
        "'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
        "24: document 1: spec.validations[1].expression: CEL error at expression line 2, column "
        "12: Syntax error: mismatched input ')' expecting {'[', '{', '(', '.', '-', '!', 'true', "
        "'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
        "28: document 1: spec.mutations[0]: expected exactly one of expression, addToleration, "
        "setRuntimeClassName, setSchedulerName, setLabel, setAnnotation, setNodeSelector",
        "31: document 1: spec.exceptions[0]: expected exactly one of namespaces, names, labels",
    ])


def test_type_errors_are_compile_errors(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BROKEN.split("---", maxsplit=1)[0].replace("gpu.count <= 8", "gpu.count <= 'eight' + 1"))
    _, [error] = load_policies([str(path)], ENV)
    assert error.path == "spec.validations[0].expression"
    assert error.line == 7
    assert "found no matching overload for '_+_'" in error.message


def test_lint_command_exit_codes(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(BROKEN.split("---", maxsplit=1)[0])
    bad.write_text(BROKEN)
    assert main(["lint", str(good)]) == 0
    assert "1 policy loaded, 0 error(s)" in capsys.readouterr().out
    assert main(["lint", str(bad)]) == 1
    out = capsys.readouterr().out
    assert sum(line.startswith("error: ") for line in out.splitlines()) == 6
    assert main(["lint", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml: no such file or directory" in capsys.readouterr().out


def test_unknown_field_points_at_its_own_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BROKEN.split("---", maxsplit=1)[0] + "  validation: []\n")
    _, [error] = load_policies([str(path)], ENV)
    assert (error.line, error.path) == (8, "spec.validation")
    assert error.message.startswith("unknown field(s) validation (allowed: auditAnnotations,")
