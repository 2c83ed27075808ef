"""The CRDs of deploy/crds: generated from the lint schemas, structural, and agreeing with lint.

One source of truth: the JSON Schemas in policies/data are what ``gpuguard lint`` checks files
against; ``gpuguard crds`` writes the CRDs from them, and the shipped files must be what it writes.
Every GPUPolicy, GPUQuota and GPUPolicyException document of the repository's corpus that lint
accepts is accepted by its CRD's ``openAPIV3Schema``, and each document of
tests/data/crds/invalid.yaml — refused by lint for one reason, at the field path its annotation
names — is refused by it too. Here the CRD schema is evaluated with ``jsonschema`` (value rules:
types, enums, patterns, formats, required, bounds); what only the API server does (pruning and
strict field validation of unknown fields, ``x-kubernetes-list-type`` uniqueness, the CEL rules)
is checked against a real kube-apiserver in tests/controlplane/test_crds_live.py.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuguard import cli, crds_command, policy_set
from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.vocabulary import FailurePolicy, ValidationAction
from tests.paths import ROOT

DEPLOY_CRDS = ROOT / "deploy" / "crds"
INVALID = ROOT / "tests" / "data" / "crds" / "invalid.yaml"
# Every file of the repository holding gpuguard.io documents (policies, quotas, exceptions).
CORPUS = [*sorted((ROOT / "policies" / "library").glob("*.yaml")),
          ROOT / "tests" / "data" / "audit" / "policies.yaml",
          ROOT / "tests" / "data" / "audit" / "warn-only.yaml",
          ROOT / "tests" / "data" / "quota" / "example-cluster-quotas.yaml",
          ROOT / "tests" / "data" / "diff" / "require-queue-label-every-namespace.yaml",
          ROOT / "tests" / "data" / "diff" / "gpu-operator-queue-exception.yaml",
          ROOT / "tests" / "controlplane" / "data" / "e2e-policies.yaml",
          ROOT / "tests" / "controlplane" / "data" / "quota-policies.yaml"]
# Refusals that are the API server's own behaviour, not a value rule of the schema: unknown
# fields are pruned (and refused by strict field validation), list-type set / map uniqueness,
# the x-kubernetes-validations CEL rules.
API_SERVER_ONLY = {"unknown-field", "duplicate-action", "duplicate-variable", "other-namespaces",
                   "not-a-mig-profile"}


def _schemas() -> dict[str, dict[str, Any]]:
    """Kind -> the openAPIV3Schema of its shipped CRD."""
    found = {}
    for path in sorted(DEPLOY_CRDS.glob("*.gpuguard.io.yaml")):
        definition = yaml.safe_load(path.read_text(encoding="utf-8"))
        [version] = definition["spec"]["versions"]
        found[definition["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return found


def _crd_errors(document: dict[str, Any]) -> list[str]:
    """The CRD schema's value-rule errors for ``document``, as ``path: message``."""
    schema = _schemas()[document["kind"]]
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return [f"{_field_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def _field_path(parts: Iterable[Any]) -> str:
    """``spec.validations[0].expression``: how lint and the API server write a field path."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _lint_errors(document: dict[str, Any], tmp_path: Path) -> list[str]:
    path = tmp_path / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return [str(e) for e in policy_set.load([str(path)], DEFAULT_SETTINGS).errors]


def _gpuguard_documents(path: Path) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if isinstance(document, dict) and document.get("apiVersion") == "gpuguard.io/v1alpha1":
            yield document


def test_the_shipped_crds_are_what_the_generator_writes(capsys):
    assert cli.main(["crds", "-o", str(DEPLOY_CRDS), "--check"], environ={}) == EXIT_OK
    assert sorted(p.name for p in DEPLOY_CRDS.glob("*.gpuguard.io.yaml")) == sorted(
        crds_command.rendered())


def test_check_names_a_stale_or_missing_file(capsys, tmp_path):
    assert cli.main(["crds", "-o", str(tmp_path)], environ={}) == EXIT_OK
    stale = tmp_path / "gpuquotas.gpuguard.io.yaml"
    stale.write_text(stale.read_text(encoding="utf-8").replace("minimum: 0", "minimum: 1"),
                     encoding="utf-8")
    (tmp_path / "gpupolicies.gpuguard.io.yaml").unlink()
    capsys.readouterr()
    assert cli.main(["crds", "-o", str(tmp_path), "--check"], environ={}) == EXIT_FINDINGS
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gpuquotas.gpuguard.io.yaml'} is out of date" in err
    assert f"{tmp_path / 'gpupolicies.gpuguard.io.yaml'} is missing" in err
    assert f"run `gpuguard crds -o {tmp_path}`" in err
    assert cli.main(["crds", "-o", str(tmp_path / "none"), "--check"], environ={}) == EXIT_USAGE
    assert cli.main(["crds", "--check"], environ={}) == EXIT_USAGE


def test_without_a_directory_the_crds_are_printed(capsys):
    assert cli.main(["crds"], environ={}) == EXIT_OK
    printed = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in printed] == [
        "gpupolicies.gpuguard.io", "gpuquotas.gpuguard.io", "gpupolicyexceptions.gpuguard.io"]


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("kind", ["GPUPolicy", "GPUQuota", "GPUPolicyException"])
def test_the_schemas_are_structural(kind):
    # https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
    # custom-resource-definitions/#specifying-a-structural-schema
    for path, node in _walk(_schemas()[kind], kind):
        assert "type" in node, path
        assert not {"$ref", "const", "uniqueItems", "propertyNames", "$defs"} & set(node), path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        for junctor in ("anyOf", "oneOf"):
            for branch in node.get(junctor, []):
                assert set(branch) <= {"required", "properties"}, f"{path}.{junctor}"
                assert set(branch["required"]) <= set(node["properties"]), f"{path}.{junctor}"
                # Inside a junctor: value validations of properties specified outside it, and
                # no type, description, default, additionalProperties or nullable.
                for name, rules in branch.get("properties", {}).items():
                    assert name in node["properties"], f"{path}.{junctor}.{name}"
                    assert not {"type", "description", "default", "additionalProperties",
                                "nullable", "properties", "items"} & set(rules), \
                        f"{path}.{junctor}.{name}"


def test_the_crds_have_a_status_subresource_printer_columns_and_scopes():
    by_kind = {}
    for path in DEPLOY_CRDS.glob("*.gpuguard.io.yaml"):
        definition = yaml.safe_load(path.read_text(encoding="utf-8"))
        by_kind[definition["spec"]["names"]["kind"]] = definition["spec"]
    assert {k: s["scope"] for k, s in by_kind.items()} == {
        "GPUPolicy": "Cluster", "GPUQuota": "Cluster", "GPUPolicyException": "Namespaced"}
    for spec in by_kind.values():
        [version] = spec["versions"]
        assert spec["group"] == "gpuguard.io" and version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}
        columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
        assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
        assert columns["Age"] == ".metadata.creationTimestamp"
    policy_columns = by_kind["GPUPolicy"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in policy_columns] == ["Actions", "Failure Policy", "Ready", "Age"]


def test_lint_names_lists_the_crd_makes_map_lists():
    spec = _schemas()["GPUPolicy"]["properties"]["spec"]["properties"]
    for name in ("matchConditions", "variables"):
        assert spec[name]["x-kubernetes-list-type"] == "map"
        assert spec[name]["x-kubernetes-list-map-keys"] == ["name"]
        assert spec[name]["items"]["required"] == ["name", "expression"]  # a map key is required
    assert spec["validationActions"]["x-kubernetes-list-type"] == "set"


def test_the_defaults_the_crd_stores_are_the_loaders(tmp_path):
    # The API server stores the schema's default when the field is absent; the loader must
    # assume the same value for a file without it.
    spec = _schemas()["GPUPolicy"]["properties"]["spec"]["properties"]
    path = tmp_path / "defaults.yaml"
    path.write_text(json.dumps({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                                "metadata": {"name": "defaults"},
                                "spec": {"validations": [{"expression": "true"}]}}),
                    encoding="utf-8")
    [policy] = policy_set.load([str(path)], DEFAULT_SETTINGS).engine.policies.policies
    assert spec["failurePolicy"]["default"] == str(policy.failure_policy) == \
        str(FailurePolicy.FAIL)
    assert spec["validationActions"]["default"] == [str(a) for a in policy.actions] == \
        [str(ValidationAction.DENY)]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(ROOT)))
def test_what_lint_accepts_the_crd_accepts(path):
    # With a policy beside it: an exception alone is an empty set, refused as such.
    with_policy = [str(path)] if "exception" not in path.name else \
        [str(path), str(ROOT / "policies" / "library" / "require-queue-label.yaml")]
    loaded = policy_set.load(with_policy, DEFAULT_SETTINGS)
    assert not loaded.errors, loaded.errors
    documents = list(_gpuguard_documents(path))
    assert documents
    for document in documents:
        assert _crd_errors(document) == [], document["metadata"]["name"]


def _invalid() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(INVALID.read_text(encoding="utf-8")) if d]


@pytest.mark.parametrize("document", _invalid(), ids=lambda d: d["metadata"]["name"])
def test_what_lint_refuses_the_crd_refuses(document, tmp_path):
    expected = document["metadata"]["annotations"]["gpuguard.io/expected-path"]
    lint = _lint_errors(document, tmp_path)
    assert lint, "lint accepts it"
    assert any(f": {expected}: " in e for e in lint), lint
    if document["metadata"]["name"] in API_SERVER_ONLY:
        # The value rules pass; tests/controlplane/test_crds_live.py sees the API server refuse.
        assert _crd_errors(document) == []
        return
    errors = _crd_errors(document)
    assert errors, "the CRD schema accepts it"
    # The same field, or (for a whole-object rule: required, anyOf, oneOf) the object itself.
    assert any(e.startswith((f"{expected}: ", f"{expected}.", f"{expected}[")) for e in errors), \
        errors


def test_a_policy_exception_in_a_file_exempts_its_namespace_only(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps({
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
        "metadata": {"name": "no-gpus"},
        "spec": {"validations": [{"expression": "false", "message": "no"}],
                 "exceptions": [{"names": ["inline"], "reason": "inline still works"}]}}),
        encoding="utf-8")
    exception = ROOT / "tests" / "data" / "diff" / "gpu-operator-queue-exception.yaml"
    text = exception.read_text(encoding="utf-8").replace("require-queue-label", "no-gpus")
    (tmp_path / "exception.yaml").write_text(text, encoding="utf-8")
    loaded = policy_set.load([str(tmp_path)], DEFAULT_SETTINGS)
    assert not loaded.errors
    [compiled] = loaded.engine.policies.policies
    inline, separate = compiled.exceptions
    today = datetime.date(2026, 1, 1)
    assert inline.applies("anywhere", "inline", {}, today)
    assert separate.reason == "the GPU operator's own validation pods are not queued"
    assert separate.applies("gpu-operator", "any-name", {}, today)
    assert not separate.applies("team-llm", "any-name", {}, today)


def test_a_policy_exception_without_namespace_or_policy_is_reported(tmp_path):
    exception = ROOT / "tests" / "data" / "diff" / "gpu-operator-queue-exception.yaml"
    text = exception.read_text(encoding="utf-8")
    (tmp_path / "no-namespace.yaml").write_text(
        text.replace("  namespace: gpu-operator\n", ""), encoding="utf-8")
    loaded = policy_set.load([str(tmp_path / "no-namespace.yaml")], DEFAULT_SETTINGS)
    assert any("metadata.namespace: required" in str(e) for e in loaded.errors), loaded.errors
    (tmp_path / "no-namespace.yaml").unlink()
    (tmp_path / "elsewhere.yaml").write_text(text, encoding="utf-8")
    loaded = policy_set.load([str(tmp_path / "elsewhere.yaml"),
                              str(ROOT / "policies" / "library" / "gpu-requesters.yaml")],
                             DEFAULT_SETTINGS)
    assert not loaded.errors
    assert any("names GPUPolicy 'require-queue-label', which is not in the input" in w
               for w in loaded.warnings), loaded.warnings


def test_the_webhook_may_write_only_the_status_of_its_objects():
    documents = list(yaml.safe_load_all((DEPLOY_CRDS / "rbac.yaml").read_text(encoding="utf-8")))
    roles = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ClusterRole"}
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    webhook = roles["gpuguard-webhook-policies"]["rules"]
    for rule in webhook:
        assert rule["apiGroups"] == ["gpuguard.io"]
        if writes & set(rule["verbs"]):
            assert all(r.endswith("/status") for r in rule["resources"]), rule
    granted = {(r, v) for rule in webhook for r in rule["resources"] for v in rule["verbs"]}
    assert ("gpupolicies", "watch") in granted and ("gpupolicies/status", "patch") in granted
    # Only the exception requester may write, and only exceptions; it is aggregated nowhere.
    requester = roles["gpuguard-exception-requester"]
    assert [r["resources"] for r in requester["rules"]] == [["gpupolicyexceptions"]]
    assert "labels" not in requester["metadata"]
    viewer = roles["gpuguard-policy-viewer"]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in viewer["rules"])
    [binding] = [d for d in documents if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "gpuguard-webhook-policies"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-webhook",
                                    "namespace": "gpuguard-system"}]
