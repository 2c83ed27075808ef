"""Policy loading: every error listed, each with exact text and location."""


import pytest

from gpuguard.cli import main
from policies.policy.loader import load_policies
from tests.builders.environment import ENV
from tests.paths import TESTS

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
        "31: document 1: spec.exceptions[0]: expected at least one of namespaces, names, labels",
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


def _load_text(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_policies([str(path)], ENV)


POLICY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: {name}
spec:
  params: {{max: 8}}
  variables:
  - name: n
    expression: gpu.count
  validations:
  - expression: {expression}
"""


@pytest.mark.parametrize(("expression", "message"), [
    ("gpu.equivalent <= 8.0",
     "gpu.equivalent is not a GPU fact (did you mean gpu.equivalents?); see docs/cel.md"),
    ("variables.m <= params.max", "variables.m is not declared in spec.variables"),
    ("variables.n <= params.maximum", "params.maximum is not in spec.params (keys: max)"),
])
def test_references_cel_cannot_check_are_checked_at_load(tmp_path, expression, message):
    _, [error] = _load_text(tmp_path, POLICY.format(name="p", expression=expression))
    assert (error.path, error.message) == ("spec.validations[0].expression", message)


def test_names_inside_strings_and_bound_variables_are_not_references(tmp_path):
    ok = "\"'nvidia.com/gpu.product ' + string(gpu.count) != '' && [{'x': 1}].all(gpu, gpu.x == 1)\""
    policy_set, errors = _load_text(tmp_path, POLICY.format(name="p", expression=ok))
    assert errors == [] and policy_set.names() == ("p",)


def test_a_variable_that_fails_to_compile_is_still_declared(tmp_path):
    broken = POLICY.format(name="p", expression="variables.n <= params.max").replace(
        "expression: gpu.count", "expression: 'gpu.requested &&'")
    _, errors = _load_text(tmp_path, broken)
    assert [e.path for e in errors] == ["spec.variables[0].expression"]


def test_names_in_comments_are_not_references(tmp_path):
    commented = "\"gpu.count < 1000 // TODO variables.limit, params.maximum, gpu.equivalent\""
    policy_set, errors = _load_text(tmp_path, POLICY.format(name="p", expression=commented))
    assert errors == [] and policy_set.names() == ("p",)


def test_duplicate_policy_names_are_an_error(tmp_path):
    text = POLICY.format(name="same", expression="gpu.count >= 0") + "---\n" + \
        POLICY.format(name="same", expression="gpu.count < 0")
    policy_set, [error] = _load_text(tmp_path, text)
    assert policy_set.names() == ("same",)
    assert error.message.startswith("GPUPolicy 'same' is defined twice (first in "
                                    f"{tmp_path / 'p.yaml'}: document 0)")
    assert (error.index, error.path) == (1, "metadata.name")


SAME_NAME = """\
apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata: {{name: {name}}}
spec:
  matchConstraints:
    resourceRules: [{{apiGroups: [""], apiVersions: [v1], operations: [CREATE],
                     resources: [configmaps]}}]
  {body}
---
apiVersion: admissionregistration.k8s.io/v1
kind: {kind}Binding
metadata: {{name: {binding}}}
spec: {{policyName: {name}{actions}}}
"""
VAP_BODY = "validations: [{expression: 'true'}]"
MAP_BODY = ("reinvocationPolicy: Never\n  mutations:\n  - patchType: JSONPatch\n"
            "    jsonPatch: {expression: \"[JSONPatch{op: 'add', path: '/metadata/labels', "
            "value: {'a': 'b'}}]\"}")


def _native(kind: str, name: str, binding: str) -> str:
    return SAME_NAME.format(kind=kind, name=name, binding=binding,
                            body=VAP_BODY if kind.startswith("Validating") else MAP_BODY,
                            actions=", validationActions: [Deny]"
                            if kind.startswith("Validating") else "")


def test_a_vap_and_a_map_may_share_a_name_as_in_the_api(tmp_path):
    """They are different resources (kube-apiserver 1.37 stores both)."""
    text = _native("ValidatingAdmissionPolicy", "same", "same") + "---\n" + \
        _native("MutatingAdmissionPolicy", "same", "same")
    policy_set, errors = _load_text(tmp_path, text)
    assert errors == []
    assert [(p.kind, p.name) for p in policy_set.policies] == [
        ("ValidatingAdmissionPolicy", "same/same"), ("MutatingAdmissionPolicy", "same/same")]


def test_two_bindings_of_one_name_are_one_error_even_for_different_policies(tmp_path):
    text = _native("ValidatingAdmissionPolicy", "x", "b") + "---\n" + \
        _native("ValidatingAdmissionPolicy", "y", "b")
    policy_set, [error] = _load_text(tmp_path, text)
    assert error.index == 3 and error.message.startswith(
        "ValidatingAdmissionPolicyBinding 'b' is defined twice (first in "
        f"{tmp_path / 'p.yaml'}: document 1)")
    assert policy_set.names() == ("x/b",)


NATIVE = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: vap}
spec:
  matchConstraint: {}
  validations:
  - expression: object.spec.replicas <= 5
    messageExpresion: "'too many'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: b}
spec:
  policyName: other
  validationActions: [Denyy]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBindings
metadata: {name: typo}
"""


def test_native_policies_are_checked_field_by_field(tmp_path):
    policy_set, errors = _load_text(tmp_path, NATIVE)
    assert sorted((e.index, e.path, e.message) for e in errors) == [
        (0, "spec.matchConstraint",
         "unknown field(s) matchConstraint (allowed: auditAnnotations, failurePolicy, "
         "matchConditions, matchConstraints, paramKind, validations, variables)"),
        (0, "spec.validations[0].messageExpresion",
         "unknown field(s) messageExpresion (allowed: expression, message, messageExpression, "
         "reason)"),
        (1, "spec.validationActions[0]", "'Denyy' is not one of Deny, Warn, Audit"),
    ]
    assert policy_set.policies == ()
    assert any("kind 'ValidatingAdmissionPolicyBindings' is not one gpuguard reads" in w
               for w in policy_set.warnings)


def test_binding_to_a_missing_policy_and_stray_documents_are_warnings(tmp_path):
    binding = NATIVE.split("---")[1].replace("[Denyy]", "[Deny]")
    stray = (DATA_POD := (TESTS / "data" / "manifests" /
                          "gpuop__cuda-vector-add-legacy-pod.yaml").read_text())
    policy_set, errors = _load_text(tmp_path, binding + "---\n" + stray)
    assert errors == []
    assert any("binds 'ValidatingAdmissionPolicy other', which is not in the input" in w
               for w in policy_set.warnings)
    assert any("1 document(s) are not policies, bindings or their params (kinds: Pod)" in w
               for w in policy_set.warnings)
    assert DATA_POD


def test_param_objects_of_a_binding_are_not_reported_as_ignored(tmp_path):
    from tests.core.test_engine import NATIVE_VAP

    policy_set, errors = _load_text(tmp_path, NATIVE_VAP)
    assert errors == [] and len(policy_set.policies) == 1
    assert policy_set.warnings == ()


def test_lint_and_check_refuse_an_empty_policy_set(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["lint", str(tmp_path / "empty")]) == 1
    assert "no policies found" in capsys.readouterr().out
    pod = str(TESTS / "data" / "manifests" / "gpuop__cuda-vector-add-legacy-pod.yaml")
    assert main(["check", "-f", pod, "--policies", str(tmp_path / "empty")]) == 2
    assert "no policies found" in capsys.readouterr().err


@pytest.mark.parametrize("expression", [
    "\"[1].all(gpu, gpu > 0) && variables.typo < params.mxa\"",
    "\"cel.bind(gpu, 1, gpu > 0) && variables.typo < params.mxa\"",
    "\"[1].exists_one(gpu, gpu == 1) && variables.typo < params.mxa\"",
])
def test_a_bound_gpu_name_checks_the_rest_of_the_expression(tmp_path, expression):
    # A comprehension naming its variable 'gpu' used to turn off every reference check of the
    # expression: the typos loaded clean and then failed every request under failurePolicy Fail.
    _, errors = _load_text(tmp_path, POLICY.format(name="p", expression=expression))
    assert [e.message for e in errors] == [
        "variables.typo is not declared in spec.variables",
        "params.mxa is not in spec.params (keys: max)",
    ]


def test_gpu_facts_outside_a_binding_scope_are_still_checked(tmp_path):
    expression = "\"[{'x': 1}].all(gpu, gpu.x == 1) && gpu.cuont > 0\""
    _, [error] = _load_text(tmp_path, POLICY.format(name="p", expression=expression))
    assert error.message.startswith("gpu.cuont is not a GPU fact (did you mean gpu.count?)")


# A policy must have something to enforce (trial finding 10): `validations: []` and nothing else
# loaded with no warning, and a reload to it silently removed enforcement.
EMPTY_RULES = TESTS / "data" / "loader"
NOTHING = ("spec: validations, mutations or auditAnnotations must contain at least one item: "
           "GPUPolicy 'no-privileged-gpu' would have no effect")


def test_a_gpupolicy_with_empty_validations_and_nothing_else_is_an_error():
    path = EMPTY_RULES / "empty-validations.yaml"
    policy_set, errors = load_policies([str(path)], ENV)
    assert policy_set.names() == ()
    assert [str(e) for e in errors] == [f"{path}:28: document 0: {NOTHING}"]


@pytest.mark.parametrize("lists", [
    {"validations": []}, {"mutations": []}, {"auditAnnotations": []},
    {"validations": [], "mutations": [], "auditAnnotations": []}, {},
])
def test_every_form_of_no_rule_is_the_same_error(lists, tmp_path):
    path = tmp_path / "p.yaml"
    text = (EMPTY_RULES / "empty-validations.yaml").read_text().replace("  validations: []\n", "")
    path.write_text(text + "".join(f"  {key}: []\n" for key in lists))
    _, errors = load_policies([str(path)], ENV)
    assert [f"{e.path}: {e.message}" for e in errors] == [NOTHING]


@pytest.mark.parametrize("rules", [
    "  mutations:\n  - setRuntimeClassName: nvidia\n",
    "  auditAnnotations:\n  - key: gpus\n    valueExpression: string(gpu.count)\n",
    "  mutations: []\n  auditAnnotations:\n  - key: gpus\n    valueExpression: string(gpu.count)\n",
])
def test_one_rule_of_any_kind_is_enough(rules, tmp_path):
    path = tmp_path / "p.yaml"
    text = (EMPTY_RULES / "empty-validations.yaml").read_text().replace("  validations: []\n", "")
    path.write_text(text + rules)
    policy_set, errors = load_policies([str(path)], ENV)
    assert errors == [] and policy_set.names() == ("no-privileged-gpu",)


def test_native_policies_without_rules_are_refused_as_the_api_server_refuses_them():
    """kube-apiserver's texts (pkg/apis/admissionregistration/validation): "validations or
    auditAnnotations must contain at least one item", "mutations must contain at least one
    item"; the binding of a refused policy adds no error of its own."""
    path = EMPTY_RULES / "empty-native.yaml"
    policy_set, errors = load_policies([str(path)], ENV)
    assert policy_set.names() == ()
    assert [str(e) for e in errors] == [
        f"{path}:12: document 0: spec: validations or auditAnnotations must contain at least one "
        "item: ValidatingAdmissionPolicy 'demo-policy.example.com' would have no effect",
        f"{path}:34: document 2: spec: mutations must contain at least one item: "
        "MutatingAdmissionPolicy 'sidecar-policy.example.com' would have no effect"]


def test_a_native_policy_with_only_audit_annotations_loads(tmp_path):
    path = tmp_path / "vap.yaml"
    text = (EMPTY_RULES / "empty-native.yaml").read_text().split("---\n")
    path.write_text("---\n".join(text[:2]).replace(
        "  validations: []\n",
        "  auditAnnotations:\n  - key: replicas\n    valueExpression: string(object.spec.replicas)\n"))
    policy_set, errors = load_policies([str(path)], ENV)
    assert errors == []
    assert policy_set.names() == ("demo-policy.example.com/demo-binding-test.example.com",)


@pytest.mark.parametrize(("command", "code"), [
    (["lint", "{policy}"], 1),
    (["check", "-f", "{pod}", "--policies", "{policy}"], 2),
    (["audit", "-f", "{pod}", "--policies", "{policy}", "-o", "json"], 2),
    (["test", "{suite}"], 2),
])
def test_every_command_refuses_a_policy_without_rules(command, code, tmp_path, capsys):
    policy = tmp_path / "no-privileged-gpu.yaml"
    policy.write_text((EMPTY_RULES / "empty-validations.yaml").read_text())
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team}\nspec:\n"
                   "  containers:\n  - name: c\n    image: x\n    securityContext: "
                   "{privileged: true}\n    resources: {limits: {nvidia.com/gpu: 1}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("apiVersion: gpuguard.io/v1alpha1\nkind: GPUPolicyTest\n"
                     "metadata: {name: s}\npolicies: [no-privileged-gpu.yaml]\ncases:\n"
                     "- name: privileged\n  object: {apiVersion: v1, kind: Pod, metadata: "
                     "{name: p, namespace: x}, spec: {containers: [{name: c, image: x}]}}\n"
                     "  expect: {allowed: true}\n")
    names = {"policy": str(policy), "pod": str(pod), "suite": str(suite)}
    assert main([part.format(**names) for part in command]) == code
    printed = capsys.readouterr()
    assert f"{policy}:28: document 0: {NOTHING}" in printed.out + printed.err


GOOD_VAP = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: good
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["pods"]
  validations:
  - expression: "true"
"""


@pytest.mark.parametrize(("api", "kind"), [
    ("admissionregistrations.k8s.io/v1", "ValidatingAdmissionPolicy"),  # a typo in the group
    ("admissionregistration.k8s.io/v2", "ValidatingAdmissionPolicy"),  # a version it lacks
    ("v1", "ValidatingAdmissionPolicyBinding"),
    ("gpuguard.io/v1", "GPUQuota"),
], ids=["group-typo", "no-such-version", "core-group-binding", "gpuguard-version"])
def test_a_policy_kind_with_a_wrong_api_version_is_an_error_not_ignored(tmp_path, api, kind):
    """A trial's find: a Fail policy with ``admissionregistrations.k8s.io/v1`` in a file with a
    good one was "ignored" with a warning naming no file, and the rest enforced without it
    (lint exit 0); ``/v2`` or ``/v99`` loaded as if they existed."""
    path = tmp_path / "policies.yaml"
    path.write_text(GOOD_VAP + "---\n" + f"apiVersion: {api}\nkind: {kind}\nmetadata:\n"
                    "  name: typo\nspec: {}\n")
    _, errors = load_policies([str(path)], ENV)
    expected = "gpuguard.io/v1alpha1" if kind == "GPUQuota" else \
        "admissionregistration.k8s.io/v1, admissionregistration.k8s.io/v1beta1, " \
        "admissionregistration.k8s.io/v1alpha1"
    assert [str(e) for e in errors] == [
        f"{path}:16: document 1: apiVersion: {api!r} is not an API version of {kind} "
        f"(expected {expected}); the document is not loaded"]


def test_a_value_of_the_wrong_type_is_named_in_yaml_words_not_python_reprs(tmp_path):
    """A trial's find: jsonschema's own text showed Python reprs (``{'a': 1} is not of type
    'string'``, ``None is not of type 'object'``)."""
    text = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: vap}
spec:
  matchConstraints: {resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE],
                                      resources: [pods]}]}
  validations:
  - expression: "true"
    messageExpression: {a: 1}
  variables: ~
"""
    _, errors = _load_text(tmp_path, text)
    messages = sorted((e.path, e.message) for e in errors)
    assert messages == [("spec.validations[0].messageExpression", "expected a string, got a map"),
                        ("spec.variables", "expected a list, got null")]
