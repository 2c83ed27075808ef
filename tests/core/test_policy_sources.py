"""A policy source is whole or refused: files with no policy document and duplicate mapping keys
are errors in every command that reads policies, and a snapshot is built from the bytes it was
fingerprinted from (issue 13, items 1 and 3)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path

import pytest

from gpuguard import policy_set
from gpuguard.cli import main
from policies.facts.resource_names import GPUSettings
from policies.policy.loader import load_policies, load_quotas, load_snapshot, read_policy_files
from policies.sources import (
    DuplicateJSONKeyError,
    LoadError,
    load_json,
    read_documents,
    read_snapshot,
)
from tests.builders.corpus import DATA
from tests.builders.environment import ENV

POD = str(DATA / "manifests" / "gpuop__cuda-vector-add-legacy-pod.yaml")

DENY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: {name}
spec:
  validations:
  - expression: "false"
    message: {name} denies every pod
"""

# What an emptied file looks like: a writer that truncates before it writes (0 bytes), an
# editor that left the header comment, a generator that wrote only the separators.
NO_DOCUMENT = {
    "zero-bytes": ("", "the file is empty (0 bytes)"),
    "comment-only": ("# policies for team-llm\n",
                     "the file holds no document, only comments, blank lines or '---' (24 bytes)"),
    "separator-only": ("---\n", "the file holds no document, only comments, blank lines or "
                                "'---' (4 bytes)"),
    "separators-and-blank-lines": ("---\n\n---\n", "the file holds no document, only comments, "
                                                   "blank lines or '---' (9 bytes)"),
    "null-document": ("--- ~\n", "the file holds no document, only comments, blank lines or "
                                 "'---' (6 bytes)"),
}


def _policies(tmp_path: Path, empty_text: str) -> tuple[Path, Path]:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "a-good.yaml").write_text(DENY.format(name="good"))
    empty = directory / "b-emptied.yaml"
    empty.write_text(empty_text)
    return directory, empty


@pytest.mark.parametrize("case", NO_DOCUMENT)
def test_a_file_with_no_policy_document_is_an_error(tmp_path, case):
    """Before: the file was skipped and its policies silently left the set."""
    text, reason = NO_DOCUMENT[case]
    directory, empty = _policies(tmp_path, text)
    policy_set_, errors = load_policies([str(directory)], ENV)
    assert policy_set_.names() == ("good",)
    assert [str(e) for e in errors] == [
        f"{empty}: no policy document: {reason}; a policy file holds GPUPolicy, "
        "ValidatingAdmissionPolicy, MutatingAdmissionPolicy, their Bindings and param objects, "
        "or GPUQuota documents (to remove a file's policies, delete the file)"]


def test_an_empty_gzip_file_and_an_empty_quota_file_are_errors(tmp_path):
    directory, empty = _policies(tmp_path, "")
    empty.unlink()
    packed = directory / "c.yaml.gz"
    packed.write_bytes(gzip.compress(b"# nothing left\n"))
    _, errors = load_policies([str(directory)], ENV)
    assert [e.source for e in errors] == [str(packed)]
    assert "no policy document: the file holds no document" in errors[0].message
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("")
    assert [e.message.split(";")[0] for e in load_quotas([str(quotas)])[1]] == [
        "no policy document: the file is empty (0 bytes)"]


def test_a_file_whose_documents_are_not_policies_is_an_error(tmp_path):
    directory, other = _policies(tmp_path, Path(POD).read_text())
    _, errors = load_policies([str(directory)], ENV)
    assert [str(e).split(";")[0] for e in errors] == [
        f"{other}: no policy document: its documents are kind Pod"]


def _out(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


def test_every_command_that_reads_policies_refuses_an_emptied_file(tmp_path):
    """lint, check, test and audit all read policies through the one loader; serve and the
    reload too (tests/webhook/test_policy_reload.py). Before: lint passed with "1 policy loaded"."""
    directory, empty = _policies(tmp_path, "# emptied\n")
    message = f"{empty}: no policy document"
    code, out = _out(["lint", str(directory)])
    assert code == 1 and message in out and "1 error(s)" in out
    code, out = _out(["check", "-f", POD, "--policies", str(directory)])
    assert code == 2 and message in out
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: emptied}}
policies: [{directory}]
cases:
- name: denied
  resource: {POD}
  expect: {{allowed: false}}
""")
    code, out = _out(["test", str(suite)])
    assert code != 0 and message in out
    code, out = _out(["audit", "-f", POD, "--policies", str(directory), "-o", "json",
                      "--jobs", "0"])
    assert message in out  # the report's errors; its exit code is the audit command's own


def test_the_loader_exposes_a_broken_source_as_errors(tmp_path):
    """What the audit uses to refuse writing reports from a broken set: ``Loaded.errors``."""
    directory, _ = _policies(tmp_path, "")
    loaded = policy_set.load([str(directory)], GPUSettings())
    assert loaded.engine.policies.names() == ("good",) and len(loaded.errors) == 1


# --- duplicate mapping keys ----------------------------------------------------------------

DOWNGRADED = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: fine
spec:
  validations:
  - expression: "true"
---
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: max-gpus
spec:
  validationActions: [Deny]
  validations:
  - expression: gpu.count <= 8
  validationActions: [Audit]
"""


def test_a_duplicate_key_fails_lint_with_both_lines(tmp_path):
    """Before: the later ``validationActions: [Audit]`` won silently and lint passed, turning
    a denying policy into an audit-only one."""
    path = tmp_path / "policies.yaml"
    path.write_text(DOWNGRADED)
    policy_set_, errors = load_policies([str(path)], ENV)
    assert policy_set_.names() == ("fine",)
    assert [str(e) for e in errors] == [
        f"{path}:17: document 1: duplicate key 'validationActions' (first at line 14)"]
    code, out = _out(["lint", str(path)])
    assert code == 1 and "duplicate key 'validationActions' (first at line 14)" in out


@pytest.mark.parametrize(("text", "line", "first"), [
    ("kind: Pod\nmetadata:\n  name: a\n  name: b\n", 4, 3),
    # in a list item, deeper down
    ("kind: Pod\nspec:\n  containers:\n  - name: c\n    resources: {limits: {a: 1, a: 2}}\n",
     5, 5),
    # flow mapping on one line; quoted and plain spellings are the same key
    ('{"kind": Pod, kind: Pod}\n', 1, 1),
])
def test_duplicate_keys_in_manifests_are_errors(tmp_path, text, line, first):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    documents, errors = read_documents([str(path)])
    assert documents == []
    key = "name" if "name: b" in text else ("a" if "a: 2" in text else "kind")
    assert [str(e) for e in errors] == [
        f"{path}:{line}: document 0: duplicate key '{key}' (first at line {first})"]


def test_merge_keys_may_be_overridden_and_distinct_keys_load(tmp_path):
    """A YAML merge (``<<``) brings defaults that the mapping may override: not a duplicate.
    ``1`` and ``true`` are different keys although Python's True == 1."""
    path = tmp_path / "pod.yaml"
    path.write_text("base: &base {name: a, image: x}\nkind: Pod\nc:\n  <<: *base\n  name: b\n"
                    "m: {1: one, true: yes}\n")
    documents, errors = read_documents([str(path)])
    assert errors == [] and documents[0].body["c"] == {"name": "b", "image": "x"}


def test_duplicate_keys_in_json_files_are_errors_with_both_lines(tmp_path):
    path = tmp_path / "pod.json"
    path.write_text('{\n  "kind": "Pod",\n  "metadata": {"name": "a",\n'
                    '               "labels": {"x": "1"},\n  "name": "b"}\n}\n')
    documents, errors = read_documents([str(path)])
    assert documents == []
    assert [str(e) for e in errors] == [
        f"{path}:5: document 0: duplicate key 'name' (first at line 3)"]
    # the same JSON in a .yaml file: refused as well, not re-read as YAML
    (tmp_path / "pod.json").rename(tmp_path / "pod.yaml")
    _, errors = read_documents([str(tmp_path / "pod.yaml")])
    assert [e.message for e in errors] == ["duplicate key 'name' (first at line 3)"]


def test_load_json_refuses_duplicates_and_keeps_escaped_keys_apart():
    with pytest.raises(DuplicateJSONKeyError) as caught:
        load_json('[{"a": 1}, {"b": {"x": 1}, "c": "{\\"b\\": 2}", "b": 3}]')
    assert caught.value.key == "b" and caught.value.msg == "duplicate key 'b' (first at line 1)"
    # "a" and "\u0061" are the same key once decoded
    with pytest.raises(DuplicateJSONKeyError):
        load_json('{"a": 1, "\\u0061": 2}')
    assert load_json('{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}') == {
        "a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}


def _example_objects() -> list[dict]:
    from audit.sources.files import iter_snapshot
    from policies.sources import Document

    return [d.body for d in iter_snapshot([str(Path(__file__).parents[2] / "examples" /
                                                "cluster")]) if isinstance(d, Document)]


@pytest.mark.parametrize("layout", ["kubectl", "item per line", "compact escaped"])
def test_decode_json_value_gives_the_standard_librarys_value_and_end_in_every_layout(layout):
    """orjson decodes what its layout and write-back prove (``_decode_by_layout``); the value
    and the end must be what ``json.JSONDecoder.raw_decode`` gives, item by item."""
    from policies.sources import decode_json_value

    objects = _example_objects()
    objects.append({"kind": "Pod", "metadata": {"name": "é", "annotations": {
        "a": "<b>&\u2028", "big": 12345678901234567890123, "f": 1e-7}}})
    if layout == "kubectl":  # MarshalIndent's 4 spaces, UTF-8 as written
        items = ",\n".join("        " + json.dumps(o, indent=4, ensure_ascii=False)
                           .replace("\n", "\n        ") for o in objects)
    elif layout == "item per line":
        items = ",\n".join(json.dumps(o) for o in objects)
    else:
        items = ",".join(json.dumps(o, separators=(",", ":")) for o in objects)
    text = '{\n    "apiVersion": "v1",\n    "items": [\n' + items + "\n    ]\n}\n"
    pos, decoder = text.index("[") + 1, json.JSONDecoder()
    for obj in objects:
        pos = text.index("{", pos)
        value, end = decode_json_value(text, pos)
        assert (value, end) == decoder.raw_decode(text, pos) and value == obj
        pos = end
    assert len(objects) > 40


@pytest.mark.parametrize("text", [
    '{\n  "a": 1,\n  "a": 2\n}',  # indented
    '{"a": {"b": 1, "b": 2}},\n{"c": 3}',  # one value to a line
    '{\n  "a": {\n    "b": 1,\n  "b": 2\n  }\n}',  # misindented: the first candidate is short
])
def test_decode_json_value_refuses_a_key_given_twice_in_every_layout(text):
    from policies.sources import decode_json_value

    with pytest.raises(DuplicateJSONKeyError) as caught:
        decode_json_value(text, 0)
    assert caught.value.pos == text.rindex(f'"{caught.value.key}"')


@pytest.mark.parametrize("value", ['1e400', 'NaN', '"\\ud800"', '"\\u00e9"', '1.0e2',
                                   '123456789012345678901234567890', '-0', '[]', '{}'])
def test_decode_json_value_leaves_what_orjson_reads_otherwise_to_the_standard_library(value):
    """Numbers orjson reads another way or refuses, escapes, NaN and lone surrogates, inside
    an indented object: the value is the standard library's (``repr``: -0 and 0 differ)."""
    from policies.sources import decode_json_value

    text = '{\n    "x": [\n        ' + value + '\n    ]\n}'
    got, end = decode_json_value(text, 0)
    assert repr(got) == repr(json.loads(text)) and end == len(text)


def test_duplicate_keys_in_a_streamed_snapshot_are_errors(tmp_path):
    """The audit reads big ``kubectl get -o json|yaml`` files item by item: the same rule."""
    from audit.sources.files import iter_snapshot

    pod = '{"kind": "Pod", "metadata": {"name": "p%d", "namespace": "n"}}'
    items = ", ".join(pod % i for i in range(3)).replace('"name": "p1"',
                                                         '"name": "p1", "name": "p9"')
    path = tmp_path / "pods.json"
    path.write_text('{"kind": "List",\n "items": [' + items + ']}\n')
    errors = [e for e in iter_snapshot([str(path)], stream_above=0) if isinstance(e, LoadError)]
    assert [str(e) for e in errors] == [
        f"{path}: document 0: items[1]: invalid JSON at line 2 column 118: duplicate key "
        "'name' (first at line 2 column 104)"]
    # the refused item is complete: the items after it are read
    assert [d.body["metadata"]["name"] for d in iter_snapshot([str(path)], stream_above=0)
            if not isinstance(d, LoadError)] == ["p0", "p2"]
    top = tmp_path / "top.json"
    top.write_text('{"kind": "List", "items": [],\n "kind": "PodList"}\n')
    assert [str(e) for e in iter_snapshot([str(top)], stream_above=0)] == [
        f"{top}: document 0: invalid JSON at line 2 column 2: duplicate key 'kind' (first at "
        "line 1 column 2)"]
    yaml_path = tmp_path / "pods.yaml"
    yaml_path.write_text("kind: List\nitems:\n- kind: Pod\n  metadata: {name: a}\n"
                         "- kind: Pod\n  metadata:\n    name: b\n    name: c\n")
    assert [str(e) for e in iter_snapshot([str(yaml_path)], stream_above=0)
            if isinstance(e, LoadError)] == [
        f"{yaml_path}: document 0: items[1]: invalid YAML at line 8: duplicate key 'name' "
        "(first at line 7)"]


def test_a_streamed_kubectl_list_reads_every_item_and_refuses_a_key_given_twice(tmp_path):
    """kubectl's indented List, read item by item (orjson where the layout shows the end):
    the items, and a duplicate key's line and column, are what the standard library gives."""
    from audit.sources.files import iter_snapshot
    from policies.sources import Document

    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "n",
             "labels": {"app": "a b"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}
            for i in range(3)]
    items = ",\n".join("        " + json.dumps(p, indent=4).replace("\n", "\n        ")
                        for p in pods)
    good = '{\n    "apiVersion": "v1",\n    "items": [\n' + items + '\n    ],\n    "kind": "List"\n}\n'
    path = tmp_path / "pods.json"
    path.write_text(good)
    assert [d.body for d in iter_snapshot([str(path)], stream_above=0)] == pods
    path.write_text(good.replace('"name": "p1",', '"name": "p1",\n"name": "p9",'))
    found = list(iter_snapshot([str(path)], stream_above=0))
    assert [d.body["metadata"]["name"] for d in found if isinstance(d, Document)] == ["p0", "p2"]
    assert [str(e) for e in found if isinstance(e, LoadError)] == [
        f"{path}: document 0: items[1]: invalid JSON at line 28 column 1: duplicate key 'name' "
        "(first at line 27 column 17)"]


# --- one snapshot --------------------------------------------------------------------------


def test_a_snapshot_is_built_from_the_bytes_it_was_fingerprinted_from(tmp_path):
    """Reading, fingerprinting and building all use the bytes read once: a file rewritten after
    the read does not slip into the set (before: the files were fingerprinted, then read again
    to build)."""
    path = tmp_path / "policies.yaml"
    path.write_text(DENY.format(name="first"))
    snapshot = read_policy_files([str(path)])
    path.write_text(DENY.format(name="second"))
    built, errors = load_snapshot(snapshot, ENV)
    assert errors == [] and built.names() == ("first",)
    assert built.digest == snapshot.digest != read_policy_files([str(path)]).digest
    assert built.contents == ((str(path), ("GPUPolicy/first",)),)


def test_the_digest_names_content_and_paths(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("kind: A\n")
    second.write_text("kind: B\n")
    digest = read_snapshot([str(tmp_path)]).digest
    assert digest.startswith("sha256:") and len(digest) == 71
    assert read_snapshot([str(tmp_path)]).digest == digest
    second.write_text("kind: A\n")  # the same bytes under another name still differ
    assert read_snapshot([str(tmp_path)]).digest != digest
    # the same files elsewhere (another mount point, another install): the same digest
    import shutil
    copy = shutil.copytree(tmp_path, tmp_path.parent / f"{tmp_path.name}-copy")
    assert read_snapshot([str(copy)]).digest == read_snapshot([str(tmp_path)]).digest
    second.unlink()
    missing = read_snapshot([str(tmp_path), str(tmp_path / "gone.yaml")])
    assert [str(e) for e in missing.errors] == [f"{tmp_path / 'gone.yaml'}: no such file or "
                                                "directory"]
    assert missing.digest != read_snapshot([str(tmp_path)]).digest


def configmap_mount(directory: Path, documents: dict[str, str]) -> None:
    """A ConfigMap volume as the kubelet lays it out: ``..<stamp>/`` with the keys, ``..data``
    pointing at it, and each key a symlink through ``..data``."""
    directory.mkdir()
    version = directory / "..2026_11_29_12_00_00.1"
    version.mkdir()
    for name, text in documents.items():
        (version / name).write_text(text)
        (directory / name).symlink_to(f"..data/{name}")
    (directory / "..data").symlink_to(version.name)


def test_lint_and_audit_read_a_configmap_mount_once_per_key(tmp_path):
    """The audit CronJob reads its policies from the ConfigMap volume. Before: lint and audit
    read the ``..<stamp>`` copies too and failed with "policy name ... is already used"."""
    mount = tmp_path / "policies"
    configmap_mount(mount, {"good.yaml": DENY.format(name="good")})
    code, out = _out(["lint", "-o", "json", str(mount)])
    assert code == 0 and json.loads(out)["policies"] == ["good"]


def test_a_duplicate_key_in_a_test_suite_is_an_error_with_its_line(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: twice}}
policies: [{DATA.parent.parent / "policies" / "library" / "require-queue-label.yaml"}]
cases:
- name: a
  resource: {POD}
  expect: {{allowed: true}}
  expect: {{allowed: false}}
""")
    code, out = _out(["test", str(suite)])
    assert code == 2
    assert f"{suite}: document 0: line 9: duplicate key 'expect' (first at line 8)" in out
