"""Native MutatingAdmissionPolicy / ValidatingAdmissionPolicy as kube-apiserver 1.37 runs them.

ApplyConfiguration merges (the cases of Kubernetes' own
``staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch/smd_test.go``, with its
expected objects and error texts), typed ``Object`` literals in both patch types, and the
return-type and message checks the API server makes when a policy is created (texts recorded from
``kubectl apply --dry-run=server`` against the tier's kube-apiserver 1.37.2).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from policies.cel.runtime import CelEnvironment
from policies.facts.review import from_object
from policies.policy.loader import build_policy_set, load_policies, rewrite_typed_literals
from policies.sources import Document, parse_text
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV
from tests.core.test_engine import engine_for
from tests.paths import TESTS

RULE = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
        "resources": ["deployments"]}


def _map(expression: str, patch_type: str = "ApplyConfiguration") -> str:
    field = "applyConfiguration" if patch_type == "ApplyConfiguration" else "jsonPatch"
    return yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": "m"},
         "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "matchConstraints": {"resourceRules": [RULE]},
                  "mutations": [{"patchType": patch_type, field: {"expression": expression}}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": "b"}, "spec": {"policyName": "m"}}])


def _deployment(spec: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "default"}, "spec": spec}


def _pod_spec(**fields) -> dict:
    return {"template": {"spec": fields}}


def _errors(text: str) -> list[str]:
    documents = [Document("p.yaml", i, None, b, None) for i, b, _ in parse_text("p.yaml", text)]
    _, errors = build_policy_set(documents, ENV)
    return [f"{e.path}: {e.message}" for e in errors]


TEMPLATE_VOLUMES = """Object{spec: Object.spec{template: Object.spec.template{
  spec: Object.spec.template.spec{volumes: [Object.spec.template.spec.volumes{%s}]}}}}"""


@pytest.mark.parametrize(("expression", "before", "after"), [
    pytest.param(TEMPLATE_VOLUMES % 'name: "y"',
                 _pod_spec(volumes=[{"name": "x"}]),
                 _pod_spec(volumes=[{"name": "x"}, {"name": "y"}]),
                 id="add to listType=map"),
    pytest.param(TEMPLATE_VOLUMES % 'name: "y", hostPath: '
                 'Object.spec.template.spec.volumes.hostPath{path: "a"}',
                 _pod_spec(volumes=[{"name": "x"}, {"name": "y"}]),
                 _pod_spec(volumes=[{"name": "x"}, {"name": "y", "hostPath": {"path": "a"}}]),
                 id="update listType=map entry"),
    pytest.param("Object{spec: Object.spec{replicas: object.spec.replicas % 2 == 0 ? "
                 "object.spec.replicas + 1 : object.spec.replicas}}",
                 {"replicas": 2}, {"replicas": 3}, id="conditionals"),
    pytest.param("""Object{spec: Object.spec{replicas: 1, template: Object.spec.template{
        metadata: Object.spec.template.metadata{labels: {"app": "nginx"}},
        spec: Object.spec.template.spec{containers: [Object.spec.template.spec.containers{
          name: "nginx", image: "nginx:1.14.2",
          ports: [Object.spec.template.spec.containers.ports{containerPort: 80}],
          resources: Object.spec.template.spec.containers.resources{limits: {"cpu": "128M"}}
        }]}}}}""",
                 {},
                 {"replicas": 1, "template": {
                     "metadata": {"labels": {"app": "nginx"}},
                     "spec": {"containers": [{"name": "nginx", "image": "nginx:1.14.2",
                                              "ports": [{"containerPort": 80}],
                                              "resources": {"limits": {"cpu": "128M"}}}]}}},
                 id="complex initialization"),
    pytest.param("Object{spec: Object.spec{replicas: 3}}",
                 {"replicas": 1, **_pod_spec(containers=[{"name": "nginx", "env": [
                     {"name": "test", "value": "a"}, {"name": "test", "value": "b"}]}])},
                 {"replicas": 3, **_pod_spec(containers=[{"name": "nginx", "env": [
                     {"name": "test", "value": "a"}, {"name": "test", "value": "b"}]}])},
                 id="duplicate env vars in original object"),
    pytest.param("""Object{spec: Object.spec{template: Object.spec.template{
        spec: Object.spec.template.spec{containers: [Object.spec.template.spec.containers{
          name: "nginx",
          env: [Object.spec.template.spec.containers.env{name: "test", value: "c"}]}]}}}}""",
                 {"replicas": 1, **_pod_spec(containers=[{"name": "nginx", "env": [
                     {"name": "test", "value": "a"}, {"name": "test", "value": "b"},
                     {"name": "foo", "value": "bar"}]}])},
                 {"replicas": 1, **_pod_spec(containers=[{"name": "nginx", "env": [
                     {"name": "test", "value": "c"}, {"name": "foo", "value": "bar"}]}])},
                 id="modify existing env variable"),
    pytest.param("""Object{spec: Object.spec{template: Object.spec.template{
        spec: Object.spec.template.spec{containers: [Object.spec.template.spec.containers{
          name: "c", ports: [Object.spec.template.spec.containers.ports{containerPort: 80,
          name: "http"}]}]}}}}""",
                 _pod_spec(containers=[{"name": "c", "image": "i", "ports": [
                     {"containerPort": 80, "protocol": "TCP"},
                     {"containerPort": 80, "protocol": "UDP"}]}]),
                 _pod_spec(containers=[{"name": "c", "image": "i", "ports": [
                     {"containerPort": 80, "protocol": "TCP", "name": "http"},
                     {"containerPort": 80, "protocol": "UDP"}]}]),
                 id="ports keyed by containerPort and protocol (default TCP)"),
])
def test_apply_configuration_merges_as_structured_merge_diff(expression, before, after):
    engine = engine_for(_map(expression))
    verdict = engine.evaluate(from_object(_deployment(before), now=NOW))
    assert verdict.allowed, verdict.message
    assert verdict.final_object["spec"] == after


@pytest.mark.parametrize(("expression", "error"), [
    ("Object{spec: Object.spec{selector: Object.spec.selector{matchLabels: {'l': 'v'}}}}",
     "error applying patch: invalid ApplyConfiguration: may not mutate atomic arrays, maps or "
     "structs: .spec.selector"),
    ("Object{spec: Object.specx{replicas: 1}}",
     "type mismatch: unexpected type name 'Object.specx', expected 'Object.spec', which "
     "matches field name path from root Object type"),
    ("Object{spec: Object.spec{replicasx: 1}}",
     "error applying patch: failed to convert patch object to typed object: "
     ".spec.replicasx: field not declared in schema"),
])
def test_apply_configuration_errors_follow_the_failure_policy(expression, error):
    verdict = engine_for(_map(expression)).evaluate(
        from_object(_deployment({"replicas": 1}), now=NOW))
    assert not verdict.allowed
    assert verdict.message == f"m/b: {error}"  # the API server's text, no prefix


_CONTAINER = "Object.spec.template.spec.containers"
_QUANTITY_FORMAT = ("quantities must match the regular expression "
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


# Texts recorded from kube-apiserver 1.37.2 (a pod create with each policy bound, the same
# mutations on Pods; the paths here are a Deployment's): the patch applies, the result does not
# decode into the Go type of the object.
@pytest.mark.parametrize(("expression", "patch_type", "error"), [
    ("Object{metadata: Object.metadata{labels: {'a': 1}}}", "ApplyConfiguration",
     "error applying patch: failed to convert patch object to typed object: "
     ".metadata.labels.a: expected string, got &value.valueUnstructured{Value:1}"),
    (f"Object{{spec: Object.spec{{template: Object.spec.template{{spec: "
     f"Object.spec.template.spec{{containers: [{_CONTAINER}{{name: 'c', image: 5}}]}}}}}}}}",
     "ApplyConfiguration",
     "error applying patch: failed to convert patch object to typed object: "
     '.spec.template.spec.containers[name="c"].image: expected string, got '
     "&value.valueUnstructured{Value:5}"),
    ("Object{spec: Object.spec{template: Object.spec.template{spec: "
     "Object.spec.template.spec{hostNetwork: 'yes'}}}}", "ApplyConfiguration",
     "error applying patch: failed to convert patch object to typed object: "
     ".spec.template.spec.hostNetwork: expected boolean, got &{yes}"),
    ("Object{spec: Object.spec{replicas: 'three'}}", "ApplyConfiguration",
     "error applying patch: failed to convert patch object to typed object: "
     ".spec.replicas: expected numeric (int or float), got string"),
    ("Object{spec: Object.spec{template: Object.spec.template{spec: "
     "Object.spec.template.spec{terminationGracePeriodSeconds: 1.5}}}}", "ApplyConfiguration",
     "unable to convert unstructured object to apps/v1, Kind=Deployment: "
     "cannot convert float64 to int64"),
    (f"Object{{spec: Object.spec{{template: Object.spec.template{{spec: "
     f"Object.spec.template.spec{{containers: [{_CONTAINER}{{name: 'c', resources: "
     f"{_CONTAINER}.resources{{limits: {{'nvidia.com/gpu': true}}}}}}]}}}}}}}}",
     "ApplyConfiguration",
     f"unable to convert unstructured object to apps/v1, Kind=Deployment: {_QUANTITY_FORMAT}"),
    ("[JSONPatch{op: 'add', path: '/metadata/labels', value: {'a': 1}}]", "JSONPatch",
     "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type "
     "string"),
    ("[JSONPatch{op: 'replace', path: '/spec/template/spec/containers/0/image', value: 5}]",
     "JSONPatch", "json: cannot unmarshal number into Go struct field "
     "Container.spec.template.spec.containers.image of type string"),
    ("[JSONPatch{op: 'add', path: '/spec/template/spec/hostNetwork', value: 'yes'}]",
     "JSONPatch", "json: cannot unmarshal string into Go struct field "
     "PodSpec.spec.template.spec.hostNetwork of type bool"),
    ("[JSONPatch{op: 'add', path: '/spec/template/spec/terminationGracePeriodSeconds', "
     "value: 1.5}]", "JSONPatch", "json: cannot unmarshal number 1.5 into Go struct field "
     "PodSpec.spec.template.spec.terminationGracePeriodSeconds of type int64"),
    ("[JSONPatch{op: 'add', path: '/spec/template/spec/containers/0/resources', "
     "value: {'limits': {'nvidia.com/gpu': true}}}]", "JSONPatch", _QUANTITY_FORMAT),
    ("[JSONPatch{op: 'add', path: '/spec/template/spec/containers/0/env', value: 'x'}]",
     "JSONPatch", "json: cannot unmarshal string into Go struct field "
     "Container.spec.template.spec.containers.env of type []v1.EnvVar"),
    ("[JSONPatch{op: 'add', path: '/metadata/labels', value: ['x']}]", "JSONPatch",
     "json: cannot unmarshal array into Go struct field ObjectMeta.metadata.labels of type "
     "map[string]string"),
    ("[JSONPatch{op: 'add', path: '/spec/template/spec/containers/0/gpus', value: 1}]",
     "JSONPatch", 'strict decoding error: unknown field "spec.template.spec.containers[0].gpus"'),
], ids=["ac-label-number", "ac-image-number", "ac-bool-text", "ac-replicas-text",
        "ac-fractional-int", "ac-quantity-bool", "jp-label-number", "jp-image-number",
        "jp-bool-text", "jp-fractional-int", "jp-quantity-bool", "jp-env-text", "jp-labels-list",
        "jp-unknown-field"])
def test_a_mutation_result_that_does_not_decode_is_denied_with_the_api_servers_text(
        expression, patch_type, error):
    """``gpuguard check`` used to admit these: the patch applied, and nothing looked at the
    types. The API server refuses each when it decodes the mutated object."""
    before = _pod_spec(containers=[{"name": "c", "image": "i"}])
    verdict = engine_for(_map(expression, patch_type)).evaluate(
        from_object(_deployment(copy.deepcopy(before)), now=NOW))
    assert not verdict.allowed
    assert verdict.message == f"m/b: {error}"


def _ignoring(expression: str, patch_type: str) -> str:
    return _map(expression, patch_type).replace("failurePolicy: Fail", "failurePolicy: Ignore")


def test_under_failure_policy_ignore_an_apply_configuration_of_the_wrong_type_is_skipped():
    engine = engine_for(_ignoring("Object{metadata: Object.metadata{labels: {'a': 1}}}",
                                  "ApplyConfiguration"))
    verdict = engine.evaluate(from_object(_deployment({"replicas": 1}), now=NOW))
    assert verdict.allowed
    assert verdict.patch == ()  # admitted as it came, as the API server does


def test_a_json_patch_result_that_does_not_decode_is_denied_whatever_the_failure_policy():
    """kube-apiserver answers ``Internal error occurred: json: cannot unmarshal ...`` (500):
    the failurePolicy covers the policy's own errors, not an object that cannot be stored."""
    engine = engine_for(_ignoring(
        "[JSONPatch{op: 'add', path: '/metadata/labels', value: {'a': 1}}]", "JSONPatch"))
    verdict = engine.evaluate(from_object(_deployment({"replicas": 1}), now=NOW))
    assert not verdict.allowed
    assert verdict.message == ("m/b: json: cannot unmarshal number into Go struct field "
                               "ObjectMeta.metadata.labels of type string")


def test_only_what_the_mutation_changed_is_decoded():
    """A manifest read offline may hold a mistyped field (``replicas: '2'``) the mutation does
    not touch: the API server would have refused it before admission, and it is not the
    policy's fault."""
    engine = engine_for(_map("[JSONPatch{op: 'add', path: '/metadata/labels', "
                             "value: {'team': 'ml'}}]", "JSONPatch"))
    verdict = engine.evaluate(from_object(_deployment({"replicas": "2"}), now=NOW))
    assert verdict.allowed, verdict.message
    assert verdict.final_object["metadata"]["labels"] == {"team": "ml"}


@pytest.mark.parametrize(("expression", "patch_type", "error"), [
    ('"I\'m a teapot!"', "ApplyConfiguration", "must evaluate to Object but got string"),
    ("Object.spec.metadata{}", "ApplyConfiguration",
     "must evaluate to Object but got Object.spec.metadata"),
    ("{'spec': {'replicas': 1}}", "ApplyConfiguration",
     "must evaluate to Object but got map(string, map(string, int))"),
    ("object", "ApplyConfiguration", "must evaluate to Object but got dyn"),
    ("object.spec.x", "JSONPatch", "must evaluate to list(JSONPatch) but got dyn"),
    ("JSONPatch{op: 'add', path: '/x', value: 1}", "JSONPatch",
     "must evaluate to list(JSONPatch) but got JSONPatch"),
])
def test_mutation_return_types_are_refused_at_load_as_the_api_server_does(
        expression, patch_type, error):
    field = "applyConfiguration" if patch_type == "ApplyConfiguration" else "jsonPatch"
    assert _errors(_map(expression, patch_type)) == [
        f"spec.mutations[0].{field}.expression: {error}"]


def _vap(validation: dict | None = None, annotation: dict | None = None) -> str:
    spec: dict = {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [RULE]}}
    if validation:
        spec["validations"] = [validation]
    if annotation:
        spec["auditAnnotations"] = [annotation]
    return yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "v"}, "spec": spec},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"},
         "spec": {"policyName": "v", "validationActions": ["Deny"]}}])


@pytest.mark.parametrize(("validation", "annotation", "error"), [
    ({"expression": "true", "messageExpression": "1 + 1"}, None,
     "spec.validations[0].messageExpression: must evaluate to string but got int"),
    ({"expression": "true", "messageExpression": "object.metadata.name"}, None,
     "spec.validations[0].messageExpression: must evaluate to string but got dyn"),
    ({"expression": "object.spec.paused"}, None,
     "spec.validations[0].expression: must evaluate to bool but got dyn"),
    ({"expression": "1"}, None, "spec.validations[0].expression: must evaluate to bool but got int"),
    ({"expression": "true", "message": "a\nb"}, None,
     "spec.validations[0].message: must not contain line breaks"),
    ({"expression": "true", "message": "  "}, None,
     "spec.validations[0].message: must be non-empty if specified"),
    (None, {"key": "a", "valueExpression": "object.metadata.name"},
     "spec.auditAnnotations[0].valueExpression: must evaluate to one of [string null_type] but "
     "got dyn"),
    (None, {"key": "a", "valueExpression": "1"},
     "spec.auditAnnotations[0].valueExpression: must evaluate to one of [string null_type] but "
     "got int"),
])
def test_validation_types_and_messages_are_refused_at_load_as_the_api_server_does(
        validation, annotation, error):
    assert _errors(_vap(validation, annotation)) == [error]


def test_a_null_audit_annotation_loads_and_omits_the_annotation():
    """kube-apiserver accepts ``valueExpression: null`` (null_type); the docs' ``cond ? 'text' :
    null`` is refused by both (no common type of string and null), see
    docs/compatibility.md."""
    engine = engine_for(_vap(annotation={"key": "a", "valueExpression": "null"}))
    verdict = engine.evaluate(from_object(_deployment({"replicas": 1}), now=NOW))
    assert verdict.allowed and verdict.audit_annotations == {}


@pytest.mark.parametrize(("value", "message"), [
    ("'a\\nb'", "static"),
    ("'" + "x" * 5121 + "'", "static"),
    ("string(object.spec.missing)", "static"),
    ("'  spaced  '", "spaced"),
])
def test_message_expression_with_a_line_break_or_too_long_falls_back_to_message(value, message):
    """validator.go: a messageExpression value with a line break, over 5 KiB, or that fails
    is not used; the static message alone is, with no note of why (kube-apiserver only logs
    it; tests/controlplane's differential runs tests/data/native/message-fallback.yaml)."""
    engine = engine_for(_vap({"expression": "false", "message": "static",
                              "messageExpression": value}))
    verdict = engine.evaluate(from_object(_deployment({"replicas": 1}), now=NOW))
    assert verdict.message == f"v/b: {message}"


def test_a_gpupolicy_audit_annotation_of_another_type_is_an_error():
    """validator.go: ``resulted in unsupported return type`` — it was published as str(value)."""
    text = yaml.safe_dump({
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "g"},
        "spec": {"failurePolicy": "Fail", "match": {"resources": ["deployments"]},
                 "auditAnnotations": [{"key": "r", "valueExpression": "object.spec.replicas"}]}})
    verdict = engine_for(text).evaluate(from_object(_deployment({"replicas": 3}), now=NOW))
    assert verdict.audit_annotations == {}
    assert verdict.message == ("g: valueExpression 'object.spec.replicas' resulted in "
                               "unsupported return type: int. Return type must be either string "
                               "or null.")


DOCS = TESTS / "data" / "native-admission" / "k8sdocs"


def _pod(init: list | None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "i"}]}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "demo"},
            "spec": spec}


def test_docs_sidecar_json_patch_with_a_typed_object_literal_adds_the_sidecar():
    engine = engine_for((DOCS / "sidecar-json-patch.yaml").read_text(encoding="utf-8"))
    pod = _pod([{"name": "setup", "image": "busybox"}])
    verdict = engine.evaluate(from_object(copy.deepcopy(pod), now=NOW))
    assert verdict.allowed
    assert verdict.final_object["spec"]["initContainers"] == [
        {"name": "setup", "image": "busybox"},
        {"name": "mesh-proxy", "image": "mesh-proxy/v1.0.0", "restartPolicy": "Always"}]


def test_docs_sidecar_apply_configuration_is_refused_for_its_atomic_args():
    """The documentation's example sets ``args``, an atomic list (``+listType=atomic``): the API
    server refuses the merge, and under ``failurePolicy: Fail`` the pod."""
    engine = engine_for((DOCS / "sidecar-apply-configuration.yaml").read_text(encoding="utf-8"))
    verdict = engine.evaluate(from_object(_pod(None), now=NOW))
    assert not verdict.allowed
    assert verdict.message.endswith(
        "may not mutate atomic arrays, maps or structs: .spec.initContainers[0].args")


def test_typed_literal_rewrite_marks_object_types_and_leaves_strings_alone():
    source = 'Object{spec: Object.spec{x: "Object{a: 1}", y: [Object.spec.y{}]}}'
    assert rewrite_typed_literals(source) == (
        '{"@type": "Object", "spec": {"@type": "Object.spec", "x": "Object{a: 1}", '
        '"y": [{"@type": "Object.spec.y"}]}}')


PARAMS = TESTS / "data" / "native-admission" / "params" / "by-request-namespace.yaml"


def _gpu_deployment(namespace: str, gpus: int) -> dict:
    container = {"name": "c", "image": "i",
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    body = _deployment(_pod_spec(containers=[container]))
    body["metadata"]["namespace"] = namespace
    return body


@pytest.mark.parametrize(("namespace", "gpus", "message"), [
    ("team-a", 1, ""),
    ("team-a", 2, "gpu-limit-per-namespace/gpu-limit-per-namespace: at most 1 GPUs per "
                  "container in team-a"),
    ("demo", 2, ""),
    ("default", 1, "gpu-limit-per-namespace/gpu-limit-per-namespace: failed to configure "
                   "binding: no params found for policy binding with `Deny` "
                   "parameterNotFoundAction"),
])
def test_params_come_from_the_requests_namespace_without_paramref_namespace(
        namespace, gpus, message):
    engine = engine_for(PARAMS.read_text(encoding="utf-8"))
    verdict = engine.evaluate(from_object(_gpu_deployment(namespace, gpus), now=NOW))
    assert verdict.message == message


def test_a_namespaced_paramref_on_a_cluster_scoped_request_is_a_configuration_error():
    text = PARAMS.read_text(encoding="utf-8").replace(
        'apiGroups: ["apps"]\n      apiVersions: ["v1"]\n      operations: ["CREATE"]\n'
        '      resources: ["deployments"]',
        'apiGroups: [""]\n      apiVersions: ["v1"]\n      operations: ["CREATE"]\n'
        '      resources: ["namespaces"]')
    engine = engine_for(text)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "new"}}
    verdict = engine.evaluate(from_object(namespace, now=NOW))
    assert verdict.message == ("gpu-limit-per-namespace/gpu-limit-per-namespace: failed to "
                               "configure binding: cannot use namespaced paramRef in policy "
                               "binding that matches cluster-scoped resources")


def test_parameter_not_found_action_allow_lets_the_request_through():
    text = PARAMS.read_text(encoding="utf-8").replace("parameterNotFoundAction: Deny",
                                                      "parameterNotFoundAction: Allow")
    verdict = engine_for(text).evaluate(from_object(_gpu_deployment("default", 9), now=NOW))
    assert verdict.allowed and verdict.results == ()


REINVOKED = TESTS / "data" / "native-admission" / "reinvocation-apply-configuration.yaml"


def test_if_needed_policy_is_reinvoked_after_a_later_policy_changed_the_object():
    engine = engine_for(REINVOKED.read_text(encoding="utf-8"))
    body = _deployment(_pod_spec(containers=[
        {"name": "c", "image": "i", "env": [{"name": "A", "value": "x"}]}]))
    body["metadata"]["labels"] = {"app": "x"}
    final = engine.evaluate(from_object(body, now=NOW)).final_object
    assert final["metadata"]["labels"] == {"app": "x", "example.com/mutated-by": "b"}
    assert final["metadata"]["annotations"] == {"example.com/labels-seen": "2"}  # not "1"
    assert final["spec"]["template"]["spec"]["containers"] == [
        {"name": "c", "image": "i",
         "env": [{"name": "A", "value": "x"}, {"name": "GPUGUARD_SEEN", "value": "1"}]}]


def test_never_policy_is_not_reinvoked():
    text = REINVOKED.read_text(encoding="utf-8").replace("reinvocationPolicy: IfNeeded",
                                                         "reinvocationPolicy: Never")
    body = _deployment(_pod_spec(containers=[{"name": "c", "image": "i"}]))
    final = engine_for(text).evaluate(from_object(body, now=NOW)).final_object
    assert final["metadata"]["annotations"] == {"example.com/labels-seen": "0"}


MATCH_RESOURCES = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: deny-all}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
    excludeResourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments],
       resourceNames: [skip-me]}
    objectSelector:
      matchExpressions: [{key: gpu, operator: In, values: ["yes"]}]
  validations: [{expression: "false", message: denied}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: b}
spec:
  policyName: deny-all
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {team: a}
"""


@pytest.mark.parametrize(("name", "labels", "namespace_labels", "denied"), [
    ("d", {"gpu": "yes"}, {"team": "a"}, True),
    ("skip-me", {"gpu": "yes"}, {"team": "a"}, False),  # excludeResourceRules by name
    ("d", {"gpu": "no"}, {"team": "a"}, False),  # the policy's objectSelector
    ("d", {"gpu": "yes"}, {"team": "b"}, False),  # the binding's matchResources narrows
])
def test_match_resources_exclude_rules_object_and_binding_selectors(
        name, labels, namespace_labels, denied):
    body = _deployment({"replicas": 1})
    body["metadata"].update(name=name, labels=labels)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "default", "labels": namespace_labels}}
    review = from_object(body, now=NOW, namespace_object=namespace)
    assert engine_for(MATCH_RESOURCES).evaluate(review).allowed is not denied


@pytest.mark.parametrize(("match_policy", "denied"), [
    (None, True),  # Equivalent is the default (Kubernetes API reference, MatchResources)
    ("Equivalent", True),
    ("Exact", False),
])
def test_match_policy_equivalent_matches_another_version_of_the_resource(
        match_policy, denied):
    """A policy written for apps/v1 Deployments also judges one sent as apps/v1beta2 unless it
    says matchPolicy: Exact; gpuguard judges the object as sent (it cannot convert versions)."""
    text = MATCH_RESOURCES.replace("    excludeResourceRules:\n", (
        f"    matchPolicy: {match_policy}\n" if match_policy else "") + "    excludeResourceRules:\n")
    body = _deployment({"replicas": 1})
    body["apiVersion"] = "apps/v1beta2"
    body["metadata"].update(name="d", labels={"gpu": "yes"})
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "default", "labels": {"team": "a"}}}
    review = from_object(body, now=NOW, namespace_object=namespace)
    assert review.resource.version == "v1beta2"
    assert engine_for(text).evaluate(review).allowed is not denied


REINVOKED_PATCH = TESTS / "data" / "native-admission" / "reinvocation-json-patch.yaml"


def _named_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


def test_an_if_needed_policy_runs_again_once_any_mutation_applied_even_its_own():
    """The API server marks the object dirty after every applied mutation, so an IfNeeded
    policy that matched runs a second time although no other policy changed anything
    (a-append-env alone: name length 4, 4 % 3 == 1); the live differential agrees."""
    final = engine_for(REINVOKED_PATCH.read_text(encoding="utf-8")).evaluate(
        from_object(_named_pod("abcd"), now=NOW)).final_object
    assert final["spec"]["containers"][0]["env"] == [
        {"name": "REINVOKED", "value": "first"}, {"name": "REINVOKED-1", "value": "again"}]


SKIPPED_THEN_MATCHING = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: c-label-when-annotated}
spec:
  failurePolicy: Fail
  reinvocationPolicy: IfNeeded
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}
  matchConditions:
  - {name: annotated, expression: "has(object.metadata.annotations)"}
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{labels: {"example.com/saw": "yes"}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: c}
spec: {policyName: c-label-when-annotated}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: d-annotate}
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{annotations: {"example.com/late": "yes"}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: d}
spec: {policyName: d-annotate}
"""


def test_an_if_needed_policy_whose_conditions_were_false_is_not_reinvoked():
    """c does not match before d adds the annotation, and is not run again after: the API
    server adds a policy to its reinvocable set only when its matchConditions held
    (mutating/dispatcher.go). Not in the live differential: kube-apiserver runs policies in no
    fixed order, and with d first, c matches in the first pass."""
    final = engine_for(SKIPPED_THEN_MATCHING).evaluate(
        from_object(_named_pod("ab"), now=NOW)).final_object
    assert final["metadata"]["annotations"] == {"example.com/late": "yes"}
    assert "labels" not in final["metadata"]


def test_a_failed_mutation_under_ignore_does_not_stop_the_policys_next_one():
    """e-keep-going (name length 5 % 4 == 1): its JSONPatch fails, its ApplyConfiguration still
    applies and the request is admitted, as the API server does."""
    verdict = engine_for(REINVOKED_PATCH.read_text(encoding="utf-8")).evaluate(
        from_object(_named_pod("abcde"), now=NOW))
    assert verdict.allowed
    assert verdict.final_object["metadata"]["labels"]["example.com/second-mutation"] == "ran"
    assert any(r.outcome == "error" and r.policy.startswith("e-keep-going")
               and r.message.startswith("JSON Patch: ") for r in verdict.results)


REDEFINED = TESTS / "data" / "native-admission" / "variables-redefined.yaml"


@pytest.mark.parametrize("name", ["abc", "abcde"])  # odd lengths: redefined-after denies
def test_a_variable_defined_twice_is_read_from_its_last_definition(name: str) -> None:
    """kube-apiserver 1.37 stores the policy and uses the last definition, also in a variable
    declared between the two (the live differential agrees on the corpus)."""
    pod = _named_pod(name)
    pod["spec"]["containers"].append({"name": "d", "image": "i"})
    verdict = engine_for(REDEFINED.read_text(encoding="utf-8")).evaluate(
        from_object(pod, now=NOW))
    assert not verdict.allowed
    assert {v.message for v in verdict.denials} == {"a=2 b=20"}


def test_a_redefinition_reading_a_variable_declared_between_is_refused(tmp_path) -> None:
    text = REDEFINED.read_text(encoding="utf-8").replace(
        '  - {name: a, expression: "object.spec.containers.size()"}\n  validations:',
        '  - {name: a, expression: "variables.b + 1"}\n  validations:')
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    _, errors = load_policies([str(path)], CelEnvironment())
    assert [e.message for e in errors] == [
        "variables.a is defined again in spec.variables[2].expression, which reads variables.b, "
        "declared between the two; Kubernetes reads variables.a from its last definition, and "
        "gpuguard cannot run that one before the variables it follows"]


SEQUENCE = TESTS / "data" / "native-admission" / "mutation-sequence.yaml"


def test_each_mutation_reads_the_object_the_previous_ones_left_and_its_variables_again():
    """A fresh-context trial's find: every mutation of a MAP read the object as the policy found
    it (the API server dispatches mutation by mutation; live: mutation-sequence agrees)."""
    pod = _named_pod("p")
    pod["metadata"]["labels"] = {"app": "x"}
    final = engine_for(SEQUENCE.read_text(encoding="utf-8")).evaluate(
        from_object(pod, now=NOW)).final_object
    assert final["metadata"]["labels"] == {
        "app": "x", "example.com/first": "1", "example.com/second": "2",
        "example.com/saw-second": "yes"}
