"""Snapshot files: the streaming reader gives what the core reader gives, item by item."""

from __future__ import annotations

import gzip
import json

import pytest
import yaml

from audit.sources.files import iter_snapshot
from policies.sources import Document, LoadError, iter_documents
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"


def summary(items):
    return [(i.source, i.index, i.item, json.dumps(i.body, sort_keys=True))
            if isinstance(i, Document) else str(i) for i in items]


@pytest.mark.parametrize("paths", [[str(EXAMPLE)], [str(ROOT / "tests" / "data" / "manifests")],
                                   [str(ROOT / "tests" / "data" / "nodes")]])
def test_streaming_equals_the_core_reader(paths):
    # stream_above=0 forces the item-by-item parser on every file
    assert summary(iter_snapshot(paths, stream_above=0)) == summary(iter_documents(paths))


def kubectl_json(items: list[dict]) -> str:
    # kubectl writes items before kind and metadata
    return json.dumps({"apiVersion": "v1", "items": items, "kind": "List",
                       "metadata": {"resourceVersion": ""}}, indent=4)


def pods(count: int) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{i}", "namespace": "a", "labels": {"n": str(i) * 50}},
             "spec": {"containers": [{"name": "c", "resources": {"limits": {
                 "nvidia.com/gpu": 1}}}]}} for i in range(count)]


def test_large_json_list_is_streamed_across_buffer_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr("audit.sources.files._CHUNK", 97)  # cut values everywhere
    path = tmp_path / "pods.json"
    path.write_text(kubectl_json(pods(40)))
    got = list(iter_snapshot([str(path)], stream_above=0))
    assert [d.body["metadata"]["name"] for d in got] == [f"p{i}" for i in range(40)]
    assert [d.item for d in got] == list(range(40))
    assert got[0].location == f"{path}: document 0 items[0]"


def test_an_item_with_a_key_given_twice_is_refused_alone_across_buffer_boundaries(
        tmp_path, monkeypatch):
    """The refused item is complete JSON: its end is found (reading more text where the buffer
    cuts it) and the items after it are audited; nothing is dropped without a word."""
    monkeypatch.setattr("audit.sources.files._CHUNK", 97)
    text = kubectl_json(pods(5)).replace('"name": "p1",', '"name": "p1",\n"name": "x",', 1)
    path = tmp_path / "pods.json"
    path.write_text(text)
    got = list(iter_snapshot([str(path)], stream_above=0))
    assert [g.body["metadata"]["name"] for g in got if isinstance(g, Document)] == [
        "p0", "p2", "p3", "p4"]
    line = text.count("\n", 0, text.index('"name": "x"')) + 1
    assert [str(g) for g in got if isinstance(g, LoadError)] == [
        f"{path}: document 0: items[1]: invalid JSON at line {line} column 1: duplicate key "
        f"'name' (first at line {line - 1} column 17)"]


def test_large_yaml_list_and_gzip(tmp_path):
    path = tmp_path / "pods.yaml.gz"
    text = "# kubectl get pods -A -o yaml\n" + yaml.safe_dump(
        {"apiVersion": "v1", "items": pods(25)}, sort_keys=False) + "kind: List\nmetadata:\n" \
        "  resourceVersion: \"\"\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"
    path.write_bytes(gzip.compress(text.encode()))
    got = list(iter_snapshot([str(path)], stream_above=0))
    assert [d.body["kind"] for d in got] == ["Pod"] * 25 + ["Node"]
    assert (got[-1].index, got[-1].item) == (1, None)


def test_broken_items_are_reported_and_reading_goes_on(tmp_path):
    items = pods(3)
    text = kubectl_json(items).replace('"name": "p1"', '"name": "p1" "oops": 1', 1)
    path = tmp_path / "broken.json"
    path.write_text(text)
    got = list(iter_snapshot([str(path)], stream_above=0))
    errors = [str(g) for g in got if isinstance(g, LoadError)]
    # where the next item starts is unknown after a syntax error: the error says what is lost
    assert [g.body["metadata"]["name"] for g in got if isinstance(g, Document)] == ["p0"]
    assert len(errors) == 1 and errors[0].startswith(
        f"{path}: document 0: items[1]: invalid JSON at line")
    assert errors[0].endswith(": Expecting ',' delimiter; it and every item after it were not "
                              "read")
    yaml_path = tmp_path / "broken.yaml"
    yaml_path.write_text("apiVersion: v1\nitems:\n- kind: Pod\n  metadata: {name: a}\n"
                         "- kind: Pod\n  metadata: {name: [b}\n- metadata: {name: c}\n"
                         "- kind: Pod\n  metadata: {name: d}\nkind: List\n")
    got = list(iter_snapshot([str(yaml_path)], stream_above=0))
    assert [g.body["metadata"]["name"] for g in got if isinstance(g, Document)] == ["a", "d"]
    errors = [str(g) for g in got if isinstance(g, LoadError)]
    assert errors[0].startswith(f"{yaml_path}: document 0: items[1]: invalid YAML at line 6: "
                                "while parsing a flow sequence")
    assert errors[1:] == [f"{yaml_path}: document 0: items[2] has no kind"]


def test_truncated_gzip_is_one_error(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(kubectl_json(pods(50)).encode())[:300])
    got = list(iter_snapshot([str(path)], stream_above=0))
    assert isinstance(got[-1], LoadError)
    assert str(got[-1]).startswith(f"{path}: ")
