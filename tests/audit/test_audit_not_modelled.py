"""An object of a kind gpuguard does not model is judged from a structural search and the audit
says so (issue 16 item 4: before, an unknown kind whose GPUs sat in a bare PodSpec or a
``resourcesPerNode``-style block was counted under ``ignored`` next to Services)."""

from __future__ import annotations

import json

from gpuguard.cli import main

OBJECTS = """\
apiVersion: example.com/v1
kind: FooJob
metadata: {name: f, namespace: ml}
spec:
  runner:
    numNodes: 2
    resourcesPerNode: {limits: {nvidia.com/gpu: 8}}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ml}
spec:
  ports: [{port: 80}]
"""


def test_an_unknown_kind_with_gpus_is_judged_and_named_not_ignored(tmp_path, capsys):
    (tmp_path / "snapshot.yaml").write_text(OBJECTS)
    code = main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["ignored"] == {"Service": 1}
    assert report["warnings"] == [
        "FooJob (example.com): kind not modelled by gpuguard; 1 object(s) judged from what a "
        "structural search found (ml/f at spec.runner.resourcesPerNode)"]
