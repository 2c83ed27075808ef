"""Running pods whose GPUs are DRA claims are valued by their claims in the placement figures,
and a ResourceClaim shared by several pods is unknown (the streaming scan cannot split it), never
0 GPU-equivalents without a word (trial: five pods sharing a 2-GPU claim were GPU pods worth 0)."""

from __future__ import annotations

import json

from gpuguard.cli import main

NODE = """\
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {nvidia.com/gpu: "8", cpu: "64", memory: 256Gi}}
"""
TEMPLATE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, count: 2}
"""
CLAIM = TEMPLATE.replace("ResourceClaimTemplate", "ResourceClaim").replace(
    "name: two-gpus", "name: shared").replace("spec:\n  spec:\n    devices", "spec:\n  devices") \
    .replace("\n      requests:\n      - name: gpus\n        exactly",
             "\n    requests:\n    - name: gpus\n      exactly")


def _pod(name: str, claim: str) -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: ml}}
spec:
  nodeName: n1
  resourceClaims: [{{name: gpus, {claim}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: gpus}}]}}}}]
"""


def _audit(tmp_path, capsys, *documents: str) -> dict:
    (tmp_path / "snapshot.yaml").write_text("---\n".join(documents))
    assert main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_pod_of_a_claim_template_is_worth_its_claims_devices(tmp_path, capsys):
    report = _audit(tmp_path, capsys, NODE, TEMPLATE,
                    _pod("trainer", "resourceClaimTemplateName: two-gpus"))
    [node] = report["nodes"]
    assert report["summary"]["gpu_pods"]["running"] == 1
    assert node["gpu_equivalents"]["allocated"] == 2.0
    assert node["gpu_equivalents"]["unknown_pods"] == 0


def test_pods_sharing_a_resource_claim_are_unknown_not_zero(tmp_path, capsys):
    report = _audit(tmp_path, capsys, NODE, CLAIM,
                    *(_pod(f"worker-{i}", "resourceClaimName: shared") for i in range(5)))
    [node] = report["nodes"]
    assert report["summary"]["gpu_pods"]["running"] == 5
    assert node["gpu_equivalents"]["allocated"] == 0.0
    assert node["gpu_equivalents"]["unknown_pods"] == 5
