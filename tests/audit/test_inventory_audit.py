"""`gpuguard audit --inventory`: inventories from files or from the audited Nodes' annotations are
joined with the snapshot's allocations into the report's ``inventory`` section."""

import json

import yaml

from audit.inventory.join import join_objects
from audit.inventory.summary import ANNOTATION
from gpuguard.cli import main
from tests.builders import inventory_scenario as scenario


def snapshot(tmp_path, annotate=False):
    objects = scenario.objects()
    if annotate:
        inventories = scenario.inventories()
        for obj in objects:
            if obj["kind"] == "Node":
                obj["metadata"].setdefault("annotations", {})[ANNOTATION] = \
                    inventories[obj["metadata"]["name"]].to_json()
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return str(path)


def audit(capsys, *argv):
    code = main(["audit", *argv, "-o", "json", "--jobs", "0"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def expected_findings():
    # The audit's clock is now, so none of the scenario's inventories (2026-03-02) is stale.
    return [f.to_dict() for f in join_objects(scenario.inventories(), scenario.objects())
            if f.kind != "inventory-stale"]


def test_inventory_files(tmp_path, capsys):
    directory = tmp_path / "inventories"
    directory.mkdir()
    for name, summary in scenario.inventories().items():
        (directory / f"{name}.json").write_text(json.dumps(summary.to_dict()))
    code, report, _ = audit(capsys, "-f", snapshot(tmp_path), "--inventory", str(directory))
    assert code == 0
    section = report["inventory"]
    assert section["nodes"] == sorted(scenario.MACHINES)
    assert section["sources"] == {"files": 6, "annotations": 0}
    assert section["gpus"] == {"lost": 1, "ok": 17}  # 8 + 4 + 2 + 1 + 1 + 2 GPUs
    found = [f for f in section["findings"] if f["kind"] != "inventory-stale"]
    assert found == expected_findings()
    assert section["counts"]["allocated-idle"] == 1


def test_node_annotations_without_a_path(tmp_path, capsys):
    code, report, _ = audit(capsys, "-f", snapshot(tmp_path, annotate=True), "--inventory")
    assert code == 0
    assert report["inventory"]["sources"] == {"files": 0, "annotations": 6}
    found = [f for f in report["inventory"]["findings"] if f["kind"] != "inventory-stale"]
    assert found == expected_findings()


def test_without_the_flag_there_is_no_section(tmp_path, capsys):
    _, report, _ = audit(capsys, "-f", snapshot(tmp_path, annotate=True))
    assert report["inventory"] is None


def test_bad_inventory_is_an_input_error(tmp_path, capsys):
    directory = tmp_path / "inventories"
    directory.mkdir()
    name, summary = next(iter(scenario.inventories().items()))
    (directory / f"{name}.json").write_text(json.dumps(summary.to_dict()))
    bad = directory / "bad.json"
    bad.write_text('{"kind": "GPUInventorySummary", "version": 9}')
    code, report, err = audit(capsys, "-f", snapshot(tmp_path), "--inventory", str(directory))
    line = f"--inventory {bad}: document 0: GPUInventorySummary: version: 9 is not supported " \
           "(this gpuguard reads version 1)"
    assert line in report["errors"]
    assert f"gpuguard: {line}" in err
    # the good inventory is used and the report printed; the bad file makes it exit 2
    assert code == 2 and report["inventory"]["nodes"] == [name]
    # A path that gives no inventory at all refuses the audit (issue 13), naming the error.
    code = main(["audit", "-f", snapshot(tmp_path), "--inventory", str(bad), "-o", "json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert f"gpuguard: {line}" in captured.err
