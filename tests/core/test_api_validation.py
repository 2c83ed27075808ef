"""The API server's creation checks of native policies and bindings (issue 15, item 3).

Each expected text is what kube-apiserver 1.37.2 answered ``kubectl apply`` of the same object
(``Error from server (Invalid): ... is invalid: <path>: <message>``); before, gpuguard loaded
every one of these objects and enforced a binding the cluster would not store.
"""

from __future__ import annotations

import pytest
import yaml

from policies.cel.runtime import CelEnvironment
from policies.policy.api_validation import api_problems
from policies.policy.loader import load_policies
from tests.paths import TESTS

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


QUALIFIED = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
             "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
             "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
REFUSALS = {  # policy name -> what kube-apiserver 1.37.2 answered (path, message)
    "audit-key-bad": [("spec.auditAnnotations[0].key",
                       f'Invalid value: "audit-key-bad/bad key!": name part {QUALIFIED}')],
    "audit-key-dup": [("spec.auditAnnotations[1].key", 'Duplicate value: "k"')],
    "audit-key-long": [("spec.auditAnnotations[0].key", f'Invalid value: "audit-key-long/{"k" * 70}"'
                        ": name part must be no more than 63 bytes")],
    "var-name-bad": [("spec.variables[0].name",
                      'Invalid value: "1bad": must be a valid CEL identifier')],
    "var-name-dash": [("spec.variables[0].name",
                       'Invalid value: "a-b": must be a valid CEL identifier')],
    "mc-name-bad": [("spec.matchConditions[0].name",
                     f'Invalid value: "bad name!": name part {QUALIFIED}')],
    "mc-name-dup": [("spec.matchConditions[1].name", 'Duplicate value: "a"')],
    "params-no-kind": [("spec.validations[0].expression", "CEL error at expression line 1, "
                        "column 1: undeclared reference to 'params' (in container '')")],
    "paramkind-empty": [("spec.paramKind.apiVersion", "Required value"),
                        ("spec.paramKind.kind", "Required value")],
    "selector-in-no-values": [("spec.matchConstraints.namespaceSelector.matchExpressions[0]"
                               ".values", "Required value: must be specified when `operator` "
                               "is 'In' or 'NotIn'")],
    "objsel-bad-key": [("spec.matchConstraints.objectSelector.matchLabels",
                        f'Invalid value: "bad key!": name part {QUALIFIED}')],
    "exists-with-values": [("spec.matchConstraints.namespaceSelector.matchExpressions[0]"
                            ".values", "Forbidden: may not be specified when `operator` is "
                            "'Exists' or 'DoesNotExist'")],
    "mc-name-long": [("spec.matchConditions[0].name", f'Invalid value: "{"a" * 70}": name part '
                      "must be no more than 63 bytes")],
    # a fresh-context trial's find: gpuguard ran the JSONPatch and ignored the other field
    "mutation-both-patches": [("spec.mutations[0].applyConfiguration",
                               'Invalid value: "{applyConfiguration}": must not be specified '
                               "when patchType is JSONPatch")],
}
REFUSED = TESTS / "data" / "api-refusals" / "names-and-selectors.yaml"


def _refused_documents() -> list[dict]:
    return list(yaml.safe_load_all(REFUSED.read_text(encoding="utf-8")))


@pytest.mark.parametrize("document", _refused_documents(), ids=lambda d: d["metadata"]["name"])
def test_names_keys_and_selectors_the_api_server_refuses(tmp_path, document):
    """gpuguard loaded each of these (all but the duplicate matchCondition, refused in its own
    words); the API server's params rule (no ``params`` without ``paramKind``) is a CEL
    compile error there, worded as gpuguard words compile errors."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert [(e.path, e.message) for e in errors] == REFUSALS[document["metadata"]["name"]]
    assert policies.policies == ()


def test_every_refusal_case_is_in_the_file():
    assert sorted(d["metadata"]["name"] for d in _refused_documents()) == sorted(REFUSALS)


@pytest.mark.parametrize("selector", [
    {"matchLabels": {"team": 1}},
    {"matchExpressions": ["x"]},
    {"matchExpressions": [{"key": "a", "operator": "Matches", "values": ["b"]}]},
    {"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]},
    {"matchExpressions": [{"operator": "Exists"}]},
])
def test_a_selector_of_the_wrong_shape_is_refused_not_a_policy_that_never_matches(tmp_path,
                                                                                selector):
    """A fresh-context trial's find: such a selector loaded, matched nothing, and a deny-all
    policy allowed everything offline; the API server refuses to decode or validate it."""
    document = _refused_documents()[0]
    document["metadata"]["name"] = "selector-shape"
    document["spec"].pop("auditAnnotations")
    document["spec"]["matchConstraints"]["objectSelector"] = selector
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert policies.policies == ()
    assert errors and all(e.path.startswith("spec.matchConstraints.objectSelector")
                          for e in errors), [(e.path, e.message) for e in errors]
