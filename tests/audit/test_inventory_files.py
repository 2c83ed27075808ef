"""audit.inventory.files: what `gpuguard audit --inventory PATH` reads — inventory documents,
summaries, Node objects with the annotation — and the one-line errors for the rest."""

import datetime
import gzip
import json

import yaml

from audit.inventory.files import inventories_from_objects, read_inventories
from audit.inventory.join import join_objects
from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import ANNOTATION, summarize
from tests.builders import inventory_scenario as scenario
from tests.builders.inventory_scenario import NOW
from tests.fakes.fake_nvml import FakeNvml, example_machine, h100


def inventory(node="gpu-node-01", at=NOW, machine=example_machine):
    return read_inventory(machine(), node=node, now=lambda: at)


def test_full_inventory_file(tmp_path):
    path = tmp_path / "n1.json"
    path.write_text(json.dumps(inventory("n1").to_dict(), indent=2))
    load = read_inventories([str(path)])
    assert load.errors == ()
    assert load.inventories == {"n1": summarize(inventory("n1"))}


def test_several_forms_in_a_directory(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([
        inventory("a").to_dict(), summarize(inventory("b")).to_dict()]))
    (tmp_path / "list.json").write_text(json.dumps(
        [inventory("c").to_dict(), {"kind": "List", "items": [inventory("d").to_dict()]}]))
    with gzip.open(tmp_path / "e.json.gz", "wt") as handle:
        handle.write(json.dumps(inventory("e").to_dict()))
    load = read_inventories([str(tmp_path)])
    assert load.errors == ()
    assert sorted(load.inventories) == ["a", "b", "c", "d", "e"]


def test_json_lines_from_the_interval_loop(tmp_path):
    lines = [json.dumps(inventory("n1", NOW - datetime.timedelta(minutes=5)).to_dict()),
             json.dumps(inventory("n1").to_dict()), ""]
    path = tmp_path / "loop.jsonl"
    path.write_text("\n".join(lines))
    load = read_inventories([str(path)])
    assert load.errors == ()
    assert load.inventories["n1"].collected_at == "2026-03-02T10:00:00Z"  # the latest wins


def test_nodes_carrying_the_annotation(tmp_path):
    nodes = scenario.nodes()
    inventories = scenario.inventories()
    for obj in nodes:
        name = obj["metadata"]["name"]
        obj["metadata"].setdefault("annotations", {})[ANNOTATION] = inventories[name].to_json()
    nodes.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}})
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    load = read_inventories([str(path)])
    assert load.errors == ()
    assert load.inventories == inventories
    # The same findings as from the inventories directly.
    from_files = join_objects(load.inventories, scenario.objects(), now=NOW)
    assert from_files == join_objects(inventories, scenario.objects(), now=NOW)
    assert inventories_from_objects(nodes).inventories == inventories


def test_annotation_names_its_node_from_the_node_object():
    summary = summarize(read_inventory(FakeNvml([h100()]), node=None, now=lambda: NOW))
    node = {"kind": "Node", "metadata": {"name": "n7", "annotations": {
        ANNOTATION: summary.to_json()}}}
    assert inventories_from_objects([node]).inventories["n7"].node == "n7"


def test_bad_inputs_are_one_line_each(tmp_path):
    bad_summary = summarize(inventory("n2")).to_dict()
    bad_summary["gpus"][0]["process_count"] = "many"
    nameless = inventory(None).to_dict()
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump_all([
        inventory("good").to_dict(), bad_summary, nameless, {"kind": "Pod"}, ["x"],
        {"kind": "Node", "metadata": {"name": "n3", "annotations": {ANNOTATION: "{oops"}}},
        {"kind": "Node", "metadata": {"name": "n4", "annotations": {
            ANNOTATION: summarize(inventory("n5")).to_json()}}},
    ]))
    (tmp_path / "broken.json").write_text('{"kind": ')
    (tmp_path / "lines.jsonl").write_text('{"kind": "GPUInventorySummary"}\n{nope\n')
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    load = read_inventories([str(tmp_path), str(tmp_path / "lines.jsonl"),
                             str(tmp_path / "missing.json")])
    assert list(load.inventories) == ["good"]
    mixed, broken, binary = (str(tmp_path / n) for n in ("mixed.yaml", "broken.json",
                                                         "binary.json"))
    lines = str(tmp_path / "lines.jsonl")
    assert list(load.errors) == [
        f"{binary}: not UTF-8 text (byte offset 0)",
        f"{broken}: document 0: invalid JSON at line 1 column 10: Expecting value",
        f"{mixed}: document 1: GPUInventorySummary: gpus[0].process_count: expected an integer, "
        "got the string 'many'",
        f"{mixed}: document 2: GPUInventory names no node (write it with gpuguard inventory "
        "--node NAME)",
        f"{mixed}: document 3: kind 'Pod' is not a GPUInventory, a GPUInventorySummary or a Node",
        f"{mixed}: document 4[0]: expected a GPUInventory, a GPUInventorySummary or a Node, got "
        "the string 'x'",
        f"{mixed}: document 5: Node n3: annotation gpuguard.io/inventory: not JSON: Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"{mixed}: document 6: Node n4: annotation gpuguard.io/inventory describes node n5; "
        "ignored",
        f"{lines}: line 1: GPUInventorySummary: version: expected an integer, got null",
        f"{lines}: line 2: invalid JSON: Expecting property name enclosed in double quotes",
        f"{tmp_path / 'missing.json'}: no such file or directory",
    ]


def test_node_list_from_kubectl_json(tmp_path):
    # What an operator does: kubectl get nodes -o json > nodes.json; audit --inventory nodes.json
    node = {"apiVersion": "v1", "kind": "NodeList", "items": [{"kind": "Node", "metadata": {
        "name": "gpu-node-01", "annotations": {
            ANNOTATION: summarize(inventory()).to_json()}}}]}
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps(node))
    assert list(read_inventories([str(path)]).inventories) == ["gpu-node-01"]
