"""Objects given more than once in a snapshot are named, never resolved silently (trial: two Pods
``team-llm/twin`` with 1 and 3 GPUs gave an anonymous count; a second Node or Namespace of a
name, e.g. one relabelling the team, gave no word at all)."""

from __future__ import annotations

import json

from gpuguard.cli import main

SNAPSHOT = """\
apiVersion: v1
kind: Namespace
metadata: {name: team-llm, labels: {gpuguard.io/team: llm}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-llm, labels: {gpuguard.io/team: hacked}}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {nvidia.com/gpu: "2"}}
---
apiVersion: v1
kind: Pod
metadata: {name: twin, namespace: team-llm, uid: a}
spec: {nodeName: n1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: twin, namespace: team-llm, uid: b}
spec: {nodeName: n1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 3}}}]}
"""


def test_each_kind_of_duplicate_is_one_warning_naming_the_objects(tmp_path, capsys):
    (tmp_path / "snapshot.yaml").write_text(SNAPSHOT)
    code = main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["warnings"] == [
        "1 Pod(s) appeared more than once in the input (team-llm/twin); the first copy counts",
        "1 Node(s) appeared more than once in the input (n1); the last copy counts",
        "1 Namespace(s) appeared more than once in the input (team-llm); the last copy counts",
    ]
    assert report["summary"]["gpu_equivalents"]["allocated"] == 1.0  # the first twin, once
