"""JSON Patch as the API server applies it (the evanphx/json-patch v4 port) and what a
MutatingAdmissionPolicy's patch does to a request through the engine.

Expected texts are kube-apiserver 1.37's (its denial is ``JSON Patch: <text>``), as the
differential set ``tests/data/native-admission/json-patch.yaml`` checks live on the corpus.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies.cel.runtime import CelEnvironment
from policies.policy.json_patch import PatchError, PatchTestFailed, apply_patch
from policies.policy.loader import load_policies
from policies.policy.mutation import MutationError, apply_operations, native_operations
from tests.paths import TESTS

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}},
    "spec": {"containers": [{"name": "c1", "image": "i"}, {"name": "c2", "image": "j"}]},
}


@pytest.mark.parametrize(("operations", "path", "expected"), [
    # a negative index counts from the end; "-" appends
    ([{"op": "replace", "path": "/spec/containers/-1/image", "value": "k"}],
     ("spec", "containers", 1, "image"), "k"),
    ([{"op": "add", "path": "/spec/containers/-", "value": {"name": "c3"}}],
     ("spec", "containers", 2, "name"), "c3"),
    ([{"op": "add", "path": "/spec/containers/-2", "value": {"name": "c0"}}],
     ("spec", "containers", 1, "name"), "c0"),
    # replace of a map key that does not exist adds it
    ([{"op": "replace", "path": "/metadata/labels/new", "value": "x"}],
     ("metadata", "labels", "new"), "x"),
    # add without a value adds null; the first segment of a path is dropped
    ([{"op": "add", "path": "/metadata/annotations"}], ("metadata", "annotations"), None),
    ([{"op": "add", "path": "metadata/annotations", "value": {}}], ("annotations",), {}),
    # ~1 is '/', ~0 is '~', in one pass (~01 is ~1)
    ([{"op": "add", "path": "/metadata/labels/example.com~1gpu~01", "value": "1"}],
     ("metadata", "labels", "example.com/gpu~1"), "1"),
    ([{"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/labels/copy"}],
     ("metadata", "labels", "copy"), "a"),
    ([{"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/moved"}],
     ("metadata", "labels", "moved"), "a"),
])
def test_the_libraries_semantics(operations: list[dict[str, Any]], path: tuple[Any, ...],
                                 expected: Any) -> None:
    value: Any = apply_patch(POD, operations)
    for part in path:
        value = value[part]
    assert value == expected
    assert POD["spec"]["containers"][1]["image"] == "j"  # the input is not changed


@pytest.mark.parametrize(("operation", "text"), [
    ({"op": "remove", "path": "/metadata/labels/x/y"},
     'remove operation does not apply: doc is missing path: "/metadata/labels/x/y": missing '
     "value"),
    ({"op": "remove", "path": "/metadata/labels/x"},
     "error in remove for path: '/metadata/labels/x': Unable to remove nonexistent key: x: "
     "missing value"),
    ({"op": "add", "path": "/spec/containers/7", "value": {}},
     "error in add for path: '/spec/containers/7': Unable to access invalid index: 7: invalid "
     "index referenced"),
    ({"op": "remove", "path": "/spec/containers/first"},
     "error in remove for path: '/spec/containers/first': strconv.Atoi: parsing \"first\": "
     "invalid syntax"),
    ({"op": "add", "path": "c", "value": 1},
     'add operation does not apply: doc is missing path: "c": missing value'),
    ({"op": "merge", "path": "/a"}, "Unexpected kind: merge"),
    ({"op": "move", "path": "/a"},
     "move operation failed to decode from: operation, missing from field: missing value"),
    ({"op": "move", "from": "/metadata/annotations/x", "path": "/a"},
     "move operation does not apply: doc is missing from path: /metadata/annotations/x: missing "
     "value"),
    ({"op": "replace", "path": "/spec/containers/9", "value": {}},
     "replace operation does not apply: doc is missing key: /spec/containers/9: missing value"),
    ({"op": "replace", "path": "/spec/containers/9/image", "value": "x"},
     "replace operation does not apply: doc is missing path: /spec/containers/9/image: missing "
     "value"),
    ({"op": "test", "path": "/metadata/annotations/x", "value": "x"},
     "test operation does not apply: is missing path: /metadata/annotations/x: missing value"),
])
def test_the_libraries_error_texts(operation: dict[str, Any], text: str) -> None:
    with pytest.raises(PatchError) as raised:
        apply_patch(POD, [{"op": "add", "path": "/metadata/labels/b", "value": "b"}, operation])
    assert str(raised.value) == text and raised.value.index == 1


@pytest.mark.parametrize(("operation", "holds"), [
    ({"op": "test", "path": "/metadata/name", "value": "p"}, True),
    ({"op": "test", "path": "/metadata/name", "value": "q"}, False),
    ({"op": "test", "path": "/spec/containers/0", "value": {"image": "i", "name": "c1"}}, True),
    ({"op": "test", "path": "/spec/nodeName"}, True),  # no value: a missing field holds
    ({"op": "test", "path": "/spec/nodeName", "value": None}, False),  # null is a value
    ({"op": "test", "path": "/metadata/name"}, False),
])
def test_a_test_operation(operation: dict[str, Any], holds: bool) -> None:
    if holds:
        assert apply_patch(POD, [operation]) == POD
    else:
        with pytest.raises(PatchTestFailed):
            apply_patch(POD, [operation])


def test_a_failed_test_leaves_a_native_patch_unapplied_and_is_an_error_in_a_gpupolicy() -> None:
    """The API server admits the object unchanged when a MutatingAdmissionPolicy's test fails
    (k8s.io/apiserver json_patch.go: ErrTestFailed); a GPUPolicy reports the failed operation."""
    operations = [{"op": "add", "path": "/metadata/labels/x", "value": "y"},
                  {"op": "test", "path": "/metadata/name", "value": "other"}]
    assert apply_operations(POD, operations, native=True) == POD
    with pytest.raises(MutationError, match=r"^operation 1 \(test /metadata/name\) does not apply: "
                                            r"testing value /metadata/name failed: test failed$"):
        apply_operations(POD, operations)


def test_a_native_failure_is_worded_as_the_api_server_words_it() -> None:
    with pytest.raises(MutationError) as raised:
        apply_operations(POD, native_operations([{"op": "remove", "path": "/spec/nodeName"}]),
                         native=True)
    assert str(raised.value) == (
        "JSON Patch: error in remove for path: '/spec/nodeName': Unable to remove nonexistent "
        "key: nodeName: missing value")


def test_native_operations_are_built_as_the_api_server_builds_them() -> None:
    """op and path always, from only when not empty, value only when set (null is set)."""
    assert native_operations([{"path": "/a"}, {"op": "add", "path": "/b", "from": "",
                                                "value": None}]) == [
        {"op": "", "path": "/a"}, {"op": "add", "path": "/b", "value": None}]
    with pytest.raises(MutationError, match="operation 0: path must be a string, got the "
                                            "number 5"):
        native_operations([{"op": "add", "path": 5}])


def test_a_null_written_by_a_native_patch_is_not_in_the_stored_object() -> None:
    """Decoding into the Pod type and encoding again drops a null map (the live API server's
    answer for ``add /metadata/annotations`` without a value: no annotations)."""
    result = apply_operations(POD, native_operations([
        {"op": "add", "path": "/metadata/annotations"},
        {"op": "add", "path": "/metadata/labels/k", "value": "v"}]), native=True)
    assert "annotations" not in result["metadata"] and result["metadata"]["labels"]["k"] == "v"


# --- JSONPatch literal fields, checked at load --------------------------------------------------

LITERAL_REFUSALS = {  # kube-apiserver 1.37.2's answers (line, column, message)
    "jsonpatch-path-int": [(1, 27, "expected type of field 'path' is 'string' but provided type "
                                   "is 'int'")],
    "jsonpatch-op-int": [(1, 14, "expected type of field 'op' is 'string' but provided type is "
                                 "'int'")],
    "jsonpatch-unknown-field": [(1, 26, "expected type of field 'pat' is '' but provided type "
                                        "is 'string'")],
    "jsonpatch-from-list": [(1, 28, "expected type of field 'from' is 'string' but provided "
                                    "type is 'list(string)'")],
    "jsonpatch-path-null": [(1, 30, "expected type of field 'path' is 'string' but provided "
                                    "type is 'null'")],
    "jsonpatch-two-literals-two-lines": [
        (2, 28, "expected type of field 'path' is 'string' but provided type is 'int'"),
        (3, 16, "expected type of field 'op' is 'string' but provided type is 'bool'")],
}
LITERALS = TESTS / "data" / "api-refusals" / "jsonpatch-literals.yaml"


def literal_documents() -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicies of ``jsonpatch-literals.yaml`` (no bindings: refused at
    creation)."""
    return list(yaml.safe_load_all(LITERALS.read_text(encoding="utf-8")))


@pytest.mark.parametrize("document", literal_documents(), ids=lambda d: d["metadata"]["name"])
def test_a_jsonpatch_literal_field_of_the_wrong_type_is_refused_at_load(tmp_path, document):
    """The API server's checker knows the JSONPatch type (op, path, from: string; value: any)
    and refuses at creation; gpuguard's literals are maps, so the loader reads the checked types
    of their values: same line, column and words."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert [(e.path, e.message) for e in errors] == [
        ("spec.mutations[0].jsonPatch.expression",
         f"CEL error at expression line {line}, column {column}: {message}")
        for line, column, message in LITERAL_REFUSALS[document["metadata"]["name"]]]
    assert policies.policies == ()


def test_jsonpatch_literals_of_the_right_types_load(tmp_path):
    """dyn (read from the object) is accepted for a string field, any type for value."""
    document = literal_documents()[0]
    document["spec"]["mutations"][0]["jsonPatch"]["expression"] = (
        "[JSONPatch{op: 'add', path: '/metadata/labels/' + object.metadata.name, value: 1}, "
        "JSONPatch{op: object.kind, path: object.metadata.name, from: '', value: [{'a': 1}]}]")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert errors == [] and len(policies.warnings) == 1  # no binding


# --- a JSONPatch value as the API server writes it -----------------------------------------


@pytest.mark.parametrize(("value", "written"), [
    (2**53 - 1, 2**53 - 1),
    (2**53 + 1, "9007199254740993"),  # beyond a JSON-safe integer: its digits as a string
    (-(2**53), "-9007199254740992"),
    (18446744073709551615, "18446744073709551615"),
    (b"abc", "YWJj"),
    ([1, {"a": 2**60}], [1, {"a": "1152921504606846976"}]),
])
def test_a_value_is_written_as_cel_go_writes_it(value: Any, written: Any) -> None:
    [operation] = native_operations([{"op": "add", "path": "/x", "value": value}])
    assert operation["value"] == written


def test_a_nan_value_is_an_evaluation_error_in_the_api_servers_words() -> None:
    with pytest.raises(MutationError, match=r"could not marshal to JSON: .*number_value: "
                                            r"invalid NaN value$"):
        native_operations([{"op": "add", "path": "/x", "value": float("nan")}])


def test_a_null_string_map_entry_is_stored_as_an_empty_string() -> None:
    """Go decodes null into a map[string]string entry as "" (labels), and drops a null struct
    field (annotations itself); live: json-patch-values."""
    result = apply_operations(POD, native_operations([
        {"op": "add", "path": "/metadata/labels/empty", "value": None},
        {"op": "add", "path": "/metadata/annotations"}]), native=True)
    assert result["metadata"]["labels"]["empty"] == "" and "annotations" not in result["metadata"]


def test_an_optional_field_of_a_jsonpatch_literal_loads(tmp_path):
    """``JSONPatch{?op: optional.of('add'), ...}`` (a fresh-context trial's find: refused with
    ``undeclared reference to 'op'``; kube-apiserver stores it) is typed by the optional's
    value."""
    document = literal_documents()[0]
    document["spec"]["mutations"][0]["jsonPatch"]["expression"] = (
        "[JSONPatch{?op: optional.of('add'), path: '/metadata/labels/x', value: 'v'}]")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    policies, errors = load_policies([str(path)], CelEnvironment())
    assert errors == [] and len(policies.policies) == 0  # no binding: loaded, not enforced
