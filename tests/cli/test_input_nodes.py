"""``gpuguard check`` and ``gpuguard gpus`` value shared requests with the Nodes of the same
input (issue 16 item 5): a time-sliced pod pinned by nodeSelector to ``NVIDIA-A10-SHARED`` next
to the Node that carries ``nvidia.com/gpu.replicas`` is a quarter of a GPU, not "replica count
unknown". Also: a Node's unrecognized accelerator resources are named (``NodeFacts.
unrecognized``), and ``check`` says "kind not modelled" of an unknown CRD it judged."""

from __future__ import annotations

import json

import pytest

from gpuguard.cli import main

POD = """\
apiVersion: v1
kind: Pod
metadata: {name: sliced, namespace: ml}
spec:
  nodeSelector: {nvidia.com/gpu.product: NVIDIA-A10-SHARED}
  containers:
  - name: c
    image: x
    resources: {limits: {nvidia.com/gpu: 1}}
"""


def _node(name: str, replicas: str) -> str:
    return f"""\
---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{nvidia.com/gpu.product: NVIDIA-A10-SHARED, nvidia.com/gpu.replicas: "{replicas}",
           nvidia.com/gpu.sharing-strategy: time-slicing}}
status:
  capacity: {{nvidia.com/gpu: "4", acme.ai/npu: "2"}}
  allocatable: {{nvidia.com/gpu: "4", acme.ai/npu: "2"}}
"""


# A policy that reads what a user would: is the pod's share of a GPU known, and how big.
QUARTER = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: at-most-a-quarter}
spec:
  validations:
  - expression: "!gpu.requested || (gpu.equivalentsKnown && gpu.equivalents <= 0.25)"
    messageExpression: "gpu.equivalentsKnown ? 'too big a share' : gpu.unknown.join('; ')"
"""

UNKNOWN = "spec.containers[0]: nvidia.com/gpu on a node pinned to GPU sharing is a replica, " \
    "and the replica count is unknown (set --shared-replicas)"


def _gpus(tmp_path, text: str, capsys) -> dict:
    (tmp_path / "in.yaml").write_text(text)
    assert main(["gpus", "-f", str(tmp_path / "in.yaml"), "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_gpus_values_a_time_sliced_pod_with_the_node_of_the_same_input(tmp_path, capsys):
    alone = _gpus(tmp_path, POD, capsys)["objects"][0]["total"]
    assert alone["gpu_equivalents"] is None and alone["unknown"] == [UNKNOWN]
    # Before: the same, although the Node with nvidia.com/gpu.replicas: 4 was in the input.
    objects = _gpus(tmp_path, POD + _node("a10-1", "4"), capsys)["objects"]
    assert objects[0]["total"]["gpu_equivalents"] == 0.25 and objects[0]["total"]["unknown"] == []
    assert objects[1]["node"]["unrecognized"] == ["acme.ai/npu"]


def test_nodes_that_disagree_on_the_replica_count_leave_it_unknown(tmp_path, capsys):
    objects = _gpus(tmp_path, POD + _node("a10-1", "4") + _node("a10-2", "8"), capsys)["objects"]
    assert objects[0]["total"]["gpu_equivalents"] is None
    assert objects[0]["total"]["unknown"] == [UNKNOWN]


@pytest.mark.parametrize(("with_node", "allowed", "message"), [
    (False, False, f"at-most-a-quarter: {UNKNOWN}"),
    (True, True, ""),  # before: denied with the same "replica count unknown"
])
def test_check_values_a_time_sliced_pod_with_the_node_of_the_same_input(
        tmp_path, capsys, with_node, allowed, message):
    (tmp_path / "policy.yaml").write_text(QUARTER)
    (tmp_path / "in.yaml").write_text(POD + (_node("a10-1", "4") if with_node else ""))
    code = main(["check", "-f", str(tmp_path / "in.yaml"), "--policies",
                 str(tmp_path / "policy.yaml"), "-o", "json"])
    entry = json.loads(capsys.readouterr().out)["results"][0]
    assert (code, entry["allowed"], entry["message"]) == (0 if allowed else 1, allowed, message)


def test_check_flags_an_unknown_crd_it_judged(tmp_path, capsys):
    (tmp_path / "crd.yaml").write_text("""\
apiVersion: example.com/v1
kind: FooJob
metadata: {name: f, namespace: ml}
spec:
  runner:
    numNodes: 2
    resourcesPerNode: {limits: {nvidia.com/gpu: 8}}
""")
    code = main(["check", "-f", str(tmp_path / "crd.yaml"), "-o", "json"])
    entry = json.loads(capsys.readouterr().out)["results"][0]
    assert code == 0
    assert entry["notes"] == ["FooJob (example.com): kind not modelled; judged from what a "
                              "search found at spec.runner.resourcesPerNode"]
    # the library judged it (before: no library policy matched the kind at all)
    assert any(r["policy"] == "gpu-requests-equal-limits" and r["outcome"] != "skip"
               for r in entry["results"]) or any(r["outcome"] != "skip" for r in entry["results"])


GPU_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: g, namespace: ml}
spec:
  containers:
  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}
"""
GVISOR = """\
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
"""


@pytest.mark.parametrize("where", ["-f", "--snapshot"])
def test_check_sets_no_runtime_class_the_input_shows_missing(tmp_path, capsys, where):
    # Before: runtimeClassName: nvidia was added although the cluster's RuntimeClasses were in
    # the input and nvidia was not among them (a pod naming a missing class is refused).
    (tmp_path / "pod.yaml").write_text(GPU_POD)
    (tmp_path / "rc.yaml").write_text(GVISOR)
    code = main(["check", "-f", str(tmp_path / "pod.yaml"), where, str(tmp_path / "rc.yaml"),
                 "-o", "json"])
    pod = json.loads(capsys.readouterr().out)["results"][0]
    assert code == 0
    assert [op["path"] for op in pod["patch"]] == ["/spec/tolerations"]
    [skipped] = [r for r in pod["results"] if r["rule"] == "set-runtime-class"]
    assert skipped["outcome"] == "skip"
    assert skipped["message"] == (
        "setRuntimeClassName \"nvidia\" not applied: the cluster has no RuntimeClass 'nvidia' "
        "(it has: gvisor), and a pod naming one that does not exist is refused")
    assert pod["notes"] == []


def test_check_without_runtime_classes_applies_the_mutation_and_says_it_is_unverified(
        tmp_path, capsys):
    (tmp_path / "pod.yaml").write_text(GPU_POD)
    assert main(["check", "-f", str(tmp_path / "pod.yaml"), "-o", "json"]) == 0
    pod = json.loads(capsys.readouterr().out)["results"][0]
    assert [op["path"] for op in pod["patch"]] == ["/spec/tolerations", "/spec/runtimeClassName"]
    assert pod["notes"] == [
        "add-gpu-toleration-and-runtimeclass: setRuntimeClassName \"nvidia\" applied without "
        "knowing whether the cluster has that RuntimeClass (a pod naming a missing one is "
        "refused): give the cluster's RuntimeClass objects with -f or --snapshot to check it"]
