"""The API server's creation checks of native policies and bindings (issue 15, item 3).

Each expected text is what kube-apiserver 1.37.2 answered ``kubectl apply`` of the same object
(``Error from server (Invalid): ... is invalid: <path>: <message>``); before, gpuguard loaded
every one of these objects and enforced a binding the cluster would not store.
"""

from __future__ import annotations

import pytest

from policies.cel.runtime import CelEnvironment
from policies.policy.api_validation import api_problems
from policies.policy.loader import load_policies

POLICY = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p1}
spec:
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE],
                     resources: [configmaps]}]
  validations: [{expression: "true"}]
---
"""
SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
EXCLUSIVE = "Forbidden: name and selector are mutually exclusive"


def binding(spec: str, name: str = "b", kind: str = "ValidatingAdmissionPolicyBinding") -> str:
    return (f"apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\n"
            f"metadata: {{name: {name}}}\nspec: {spec}\n")


@pytest.mark.parametrize(("document", "expected"), [
    (binding("{policyName: p1, validationActions: [Deny], paramRef: {name: x}}"),
     [("spec.paramRef.parameterNotFoundAction", "Required value")]),
    (binding("{policyName: p1, paramRef: {name: x}}", kind="MutatingAdmissionPolicyBinding"),
     [("spec.paramRef.parameterNotFoundAction", "Required value")]),
    (binding("{policyName: p1, validationActions: [Deny], paramRef: {name: x, selector: "
             "{matchLabels: {a: b}}, parameterNotFoundAction: Deny}}"),
     [("spec.paramRef.name", EXCLUSIVE), ("spec.paramRef.selector", EXCLUSIVE)]),
    (binding("{policyName: p1, validationActions: [Deny], paramRef: "
             "{parameterNotFoundAction: Deny}}"),
     [("spec.paramRef", "Required value: one of name or selector must be specified")]),
    (binding("{policyName: p1, validationActions: [Deny, Warn]}"),
     [("spec.validationActions", 'Invalid value: ["Deny","Warn"]: must not contain both Deny '
       "and Warn (repeating the same validation failure information in the API response and "
       "headers serves no purpose)")]),
    (binding("{policyName: p1, validationActions: [Deny]}", name="Bad_Name"),
     [("metadata.name", f'Invalid value: "Bad_Name": {SUBDOMAIN}')]),
    (POLICY.replace("name: p1", "name: Not_DNS").removesuffix("---\n"),
     [("metadata.name", f'Invalid value: "Not_DNS": {SUBDOMAIN}')]),
])
def test_objects_the_api_server_refuses_are_refused_with_its_words(tmp_path, document,
                                                                   expected):
    path = tmp_path / "p.yaml"
    path.write_text(POLICY + document)
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert [(e.path, e.message) for e in errors] == expected
    assert all(e.index == 1 for e in errors)  # named on the refused document
    assert all(p.name != "p1/b" for p in policies.policies)  # its binding enforces nothing


@pytest.mark.parametrize("spec", [
    "{policyName: p1, validationActions: [Deny], paramRef: {name: x, "
    "parameterNotFoundAction: Allow}}",
    "{policyName: p1, validationActions: [Warn, Audit], paramRef: {selector: {}, "
    "parameterNotFoundAction: Deny}}",
])
def test_bindings_the_api_server_stores_load(tmp_path, spec):
    path = tmp_path / "p.yaml"
    path.write_text(POLICY + binding(spec, name="team-a.example.com"))
    _, errors = load_policies([str(path)], CelEnvironment())
    assert errors == []


def test_a_name_longer_than_253_characters_is_refused():
    name = "a" * 254
    assert api_problems({"kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}}) == [
        ("metadata.name", f'Invalid value: "{name}": must be no more than 253 characters')]
