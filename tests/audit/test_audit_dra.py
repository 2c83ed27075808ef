"""Running pods whose GPUs are DRA claims are valued by their claims in the placement figures,
and a ResourceClaim shared by several pods is unknown (the streaming scan cannot split it), never
0 GPU-equivalents without a word (trial: five pods sharing a 2-GPU claim were GPU pods worth 0)."""

from __future__ import annotations

import json

import yaml

from gpuguard.cli import main
from tests.fakes.fake_kube_api import FakeKubeAPI

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


MIG_TEMPLATE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-slices, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: mig.nvidia.com
          count: 2
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
"""
MIG_CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: allocated, namespace: ml}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: mig.nvidia.com}
status:
  allocation:
    devices:
      results:
      - {request: gpus, driver: gpu.nvidia.com, pool: n1, device: gpu-0-mig-1-0-3}
"""
MIG_SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-gpu.nvidia.com-x}
spec:
  driver: gpu.nvidia.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0-mig-1-0-3
    attributes:
      type: {string: mig}
      profile: {string: 3g.40gb}
"""


def test_a_pod_of_a_mig_claim_template_is_worth_its_slices(tmp_path, capsys):
    report = _audit(tmp_path, capsys, NODE, MIG_TEMPLATE,
                    _pod("trainer", "resourceClaimTemplateName: two-slices"))
    [node] = report["nodes"]
    assert node["gpu_equivalents"]["allocated"] == round(2 / 7, 6)
    assert node["gpu_equivalents"]["unknown_pods"] == 0


def test_an_allocated_mig_claim_takes_its_profile_from_the_resource_slice(tmp_path, capsys):
    pod = _pod("trainer", "resourceClaimName: allocated").replace(
        "nodeName: n1", "nodeName: missing-node")  # valued by the pod alone: its claim
    report = _audit(tmp_path, capsys, MIG_SLICE, MIG_CLAIM, pod)
    assert report["summary"]["on_missing_nodes"]["gpu_equivalents"] == round(3 / 7, 6)
    assert report["summary"]["on_missing_nodes"]["unknown_pods"] == 0


def test_the_cluster_audit_lists_resource_claims_as_it_lists_templates(tmp_path, capsys):
    """A fresh-context trial's find: ``audit --cluster`` listed ResourceClaimTemplates but no
    ResourceClaims (nor the DeviceClasses and ResourceSlices a claim is resolved with), so a pod
    of a ResourceClaim was of unknown size live and known from a snapshot of the same objects.
    Both read the four DRA kinds, and count each in ``ignored`` alike."""
    pod = _pod("trainer", "resourceClaimName: allocated").replace("nodeName: n1",
                                                                  "nodeName: missing-node")
    texts = [MIG_SLICE, MIG_CLAIM, MIG_TEMPLATE, pod]
    from_files = _audit(tmp_path, capsys, *texts)
    with FakeKubeAPI([yaml.safe_load(t) for t in texts]) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        assert main(["audit", "--kubeconfig", kubeconfig, "-o", "json", "--jobs", "0"]) == 0
        live = json.loads(capsys.readouterr().out)
        listed = {path for _, path, _ in api.requests}
    assert {"/apis/resource.k8s.io/v1/resourceclaims", "/apis/resource.k8s.io/v1/deviceclasses",
            "/apis/resource.k8s.io/v1/resourceslices",
            "/apis/resource.k8s.io/v1/resourceclaimtemplates"} <= listed
    for report in (from_files, live):
        assert report["summary"]["on_missing_nodes"]["gpu_equivalents"] == round(3 / 7, 6)
        assert report["summary"]["on_missing_nodes"]["unknown_pods"] == 0
        assert report["ignored"] == {"ResourceClaim": 1, "ResourceClaimTemplate": 1,
                                     "ResourceSlice": 1}
