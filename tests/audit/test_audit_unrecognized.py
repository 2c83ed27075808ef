"""An accelerator the registry does not know is never counted as zero without a word (trial: a
Pod asking for ``acme.ai/npu`` and the Node advertising it were nowhere in the audit)."""

from __future__ import annotations

import json

from gpuguard.cli import main
from tests.paths import ROOT

OBJECTS = """\
apiVersion: v1
kind: Pod
metadata: {name: npu-pod, namespace: ml}
spec:
  nodeName: n1
  containers:
  - name: c
    image: x
    resources: {limits: {acme.ai/npu: 2, example.com/gpu: 1}}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
status:
  capacity: {acme.ai/npu: "8", cpu: "8", memory: 64Gi}
  allocatable: {acme.ai/npu: "8", cpu: "8", memory: 64Gi}
"""


def test_unrecognized_accelerators_are_one_warning_each_naming_who_uses_them(tmp_path, capsys):
    (tmp_path / "snapshot.yaml").write_text(OBJECTS)
    code = main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0  # a warning, not an input error: the rest of the audit stands
    assert report["warnings"] == [
        "acme.ai/npu: unrecognized accelerator resource, counted as no GPU (2 object(s): "
        "Pod ml/npu-pod, Node n1); --gpu-resource acme.ai/npu counts it as whole devices",
        "example.com/gpu: unrecognized accelerator resource, counted as no GPU (1 object(s): "
        "Pod ml/npu-pod); --gpu-resource example.com/gpu counts it as whole devices",
    ]
    assert report["summary"]["warnings"] == 2


def test_a_resource_named_by_gpu_resource_is_counted_and_not_warned_about(tmp_path, capsys):
    (tmp_path / "snapshot.yaml").write_text(OBJECTS)
    code = main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0",
                 "--gpu-resource", "acme.ai/npu"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert not any(w.startswith("acme.ai/npu") for w in report["warnings"])
    assert report["summary"]["gpu_pods"]["running"] == 1


def test_check_says_the_policies_judged_it_as_asking_for_no_gpu(tmp_path, capsys):
    # With a policy set that says nothing about them (here: only gpu-node-toleration), the note
    # of gpuguard's own, apart from the warnings the webhook would return, is the only word.
    (tmp_path / "pod.yaml").write_text(OBJECTS.split("---", maxsplit=1)[0])
    code = main(["check", "-f", str(tmp_path / "pod.yaml"), "-o", "json", "--policies",
                 str(ROOT / "policies" / "library" / "gpu-node-toleration.yaml")])
    [entry] = json.loads(capsys.readouterr().out)["results"]
    assert code == 0 and entry["allowed"]
    assert entry["warnings"] == []
    assert entry["notes"] == [
        "acme.ai/npu: unrecognized accelerator resource, judged as no GPU by every policy "
        "(--gpu-resource acme.ai/npu counts it as whole devices)",
        "example.com/gpu: unrecognized accelerator resource, judged as no GPU by every policy "
        "(--gpu-resource example.com/gpu counts it as whole devices)"]


def test_the_library_warns_as_the_webhook_would_and_check_does_not_say_it_twice(tmp_path,
                                                                                  capsys):
    # The built-in library's unrecognized-accelerator policy warns (the webhook returns it):
    # the note would repeat it, so there is none.
    (tmp_path / "pod.yaml").write_text(OBJECTS.split("---", maxsplit=1)[0])
    code = main(["check", "-f", str(tmp_path / "pod.yaml"), "-o", "json"])
    [entry] = json.loads(capsys.readouterr().out)["results"]
    assert code == 0 and entry["allowed"]
    [warning] = entry["warnings"]
    assert warning.startswith("unrecognized-accelerator: Pod 'npu-pod' asks for acme.ai/npu, "
                              "example.com/gpu, which look like accelerator resources")
    assert "--gpu-resource acme.ai/npu --gpu-resource example.com/gpu" in warning
    assert entry["notes"] == []
