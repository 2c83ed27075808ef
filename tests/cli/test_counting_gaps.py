"""GPU counts a user sees (``gpuguard gpus``, ``check``, the audit) for the inputs a trial found
dropped or mis-sized: KAI annotations KAI rejects, KubeVirt pools / replica sets / halted VMs /
non-GPU host devices, bare Containers and PodSpecs in kinds gpuguard does not model, and HAMi's
old ``nvidia.com/cores`` name (tests/data/counting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuguard.cli import main

DATA = "tests/data/counting"
KAI_PODS = f"{DATA}/kai-quota-pods.yaml"
KAI_QUOTA = f"{DATA}/kai-half-gpu-quota.yaml"
KAI_SNAPSHOT = f"{DATA}/kai-quota-snapshot.yaml"


def _gpus(capsys, path: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> the object of ``gpuguard gpus -o json``."""
    assert main(["gpus", "-f", path, "-o", "json"]) == 0
    return {(o["kind"], o["name"]): o for o in json.loads(capsys.readouterr().out)["objects"]}


# gpu-fraction / gpu-memory as KAI's admission reads them: a float above 0 and below 1, a positive
# integer of MiB, no spaces. None: unknown, with the annotation named in `unknown`. k5 is 1e-9,
# valid; the JSON rounds GPU-equivalents to 6 digits.
KAI_EXPECTED = {
    "k0": 0.5, "k1": None, "k2": None, "k3": None, "k4": None, "k5": 0.0, "k6": None,
    "k7": None, "k8": None, "k9": None, "k10": None, "k11": None,
    "m0": None, "m1": None, "m2": None, "m3": None, "m4": None, "m5": None,
}


def test_kai_values_kai_rejects_are_of_unknown_size_never_zero(capsys) -> None:
    objects = _gpus(capsys, f"{DATA}/kai-invalid-annotations.yaml")
    seen = {name: o["total"]["gpu_equivalents"] for (_, name), o in objects.items()}
    assert seen == KAI_EXPECTED
    for name, expected in KAI_EXPECTED.items():
        total = objects[("Pod", name)]["total"]
        assert total["requested"] is True
        if expected is not None or name == "m0":  # m0: 2000 MiB, valid; its share needs the GPU
            assert total["invalid"] == [], name
            continue
        key = "gpu-fraction" if name.startswith("k") else "gpu-memory"
        assert any(u.startswith(f"metadata.annotations[{key}]: ") for u in total["unknown"]), name
        assert any(i.startswith(f"metadata.annotations[{key}]: ") for i in total["invalid"]), name
    assert objects[("Pod", "k11")]["total"]["unknown"] == [
        "metadata.annotations[gpu-fraction]: '2' is not a valid fraction, so the share of a GPU "
        "it asks for is unknown"]
    assert objects[("Pod", "k11")]["total"]["kai"]["fraction"] is None


def test_quota_denies_invalid_kai_fractions_under_unknown_size_deny(capsys) -> None:
    code = main(["check", "-f", KAI_PODS, "--policies", KAI_QUOTA, "--snapshot", KAI_SNAPSHOT,
                 "-o", "json"])
    results = {r["name"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert code == 1
    assert {name: r["allowed"] for name, r in results.items()} == {
        "k0": False, "k1": False, "k2": False, "k3": True}
    assert results["k1"]["quota"]["denials"] == [
        "GPUQuota llm-geq: the GPU-equivalents of this pod are unknown "
        "(metadata.annotations[gpu-fraction]: 'abc' is not a valid fraction, so the share of a "
        "GPU it asks for is unknown), so the quota cannot be checked (unknownSize: Deny)"]


def test_the_audit_counts_invalid_kai_pods_as_unknown(capsys) -> None:
    assert main(["audit", "-f", KAI_PODS, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    pending = {w["name"]: w["gpu_equivalents"] for w in report["workloads"]}
    assert pending == {
        "k0": {"allocated": 0.0, "pending": 0.0, "unknown_pods": 1},
        "k1": {"allocated": 0.0, "pending": 0.0, "unknown_pods": 1},
        "k2": {"allocated": 0.0, "pending": 0.0, "unknown_pods": 1},
        "k3": {"allocated": 0.0, "pending": 0.5, "unknown_pods": 0},
    }


def test_kubevirt_pools_replica_sets_halted_vms_and_host_devices(capsys) -> None:
    objects = _gpus(capsys, f"{DATA}/kubevirt-pools-halted-hostdevices.yaml")
    a100 = "nvidia.com/GA100_A100_PCIE_40GB"
    pool = objects[("VirtualMachinePool", "pool")]
    assert pool["replicas"] == 3 and pool["generic"] is False
    assert pool["total"]["gpus"] == {a100: 3} and pool["total"]["gpu_equivalents"] == 3.0
    replica_set = objects[("VirtualMachineInstanceReplicaSet", "vmirs")]
    assert replica_set["replicas"] == 2 and replica_set["total"]["gpus"] == {a100: 2}
    halted = objects[("VirtualMachine", "vm-halted")]
    assert halted["replicas"] == 0 and halted["total"]["gpu_equivalents"] == 0.0
    assert halted["per_pod"]["gpus"] == {a100: 1}  # what policies judge: the VM's template
    assert halted["total"]["warnings"] == [
        "spec.runStrategy: Halted: stopped, so it holds no GPU now; once started each VM takes "
        "1 GPU device(s), 1 GPU-equivalent(s)"]
    amd = objects[("VirtualMachineInstance", "vmi-amd")]["total"]
    assert amd["gpus"] == {"amd.com/MI300X": 1} and amd["gpu_equivalents"] == 1.0
    assert amd["unrecognized"] == ["devices.kubevirt.io/vfio-gpu"]
    nic = objects[("VirtualMachineInstance", "vmi-nic")]["total"]  # QAT, a NIC, a USB disk
    assert nic["gpus"] == {} and nic["requested"] is False and nic["unrecognized"] == []


def test_gpus_table_shows_the_halted_vm_and_what_it_would_take(capsys) -> None:
    assert main(["gpus", "-f", f"{DATA}/kubevirt-pools-halted-hostdevices.yaml"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "VirtualMachine/team-llm/vm-halted: spec.runStrategy: Halted: stopped, so it holds " \
        "no GPU now; once started each VM takes 1 GPU device(s), 1 GPU-equivalent(s)" in out
    assert "VirtualMachineInstance/team-llm/vmi-nic" not in out


def test_running_false_stops_a_vm_and_a_pool_of_halted_vms_holds_nothing(tmp_path,
                                                                          capsys) -> None:
    domain = {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/GH100_H100_SXM5_80GB"}]}}
    objects = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "off"},
         "spec": {"running": False, "template": {"spec": {"domain": domain}}}},
        {"apiVersion": "pool.kubevirt.io/v1alpha1", "kind": "VirtualMachinePool",
         "metadata": {"name": "cold"}, "spec": {"replicas": 4, "virtualMachineTemplate": {
             "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": domain}}}}}},
    ]
    path = tmp_path / "vms.yaml"
    path.write_text("\n---\n".join(json.dumps(o) for o in objects), encoding="utf-8")
    found = _gpus(capsys, str(path))
    assert found[("VirtualMachine", "off")]["total"]["warnings"] == [
        "spec.running: false: stopped, so it holds no GPU now; once started each VM takes 1 GPU "
        "device(s), 1 GPU-equivalent(s)"]
    cold = found[("VirtualMachinePool", "cold")]
    assert cold["replicas"] == 0 and cold["total"]["gpu_equivalents"] == 0.0
    assert cold["total"]["warnings"][0].startswith(
        "spec.virtualMachineTemplate.spec.runStrategy: Halted (4 VM(s)): stopped")


def test_bare_containers_and_podspecs_of_unmodelled_kinds_are_found_and_judged(capsys) -> None:
    objects = _gpus(capsys, f"{DATA}/crd-bare-containers-and-podspecs.yaml")
    workflow = objects[("Workflow", "gpu-wf")]
    assert workflow["generic"] is True and workflow["total"]["gpus"] == {"nvidia.com/gpu": 4}
    assert [p["path"] for p in workflow["total"]["privileged"]] == [
        "spec.templates[0].containers[0].securityContext.privileged"]
    assert workflow["not_modelled"].endswith("judged from what a search found at spec.templates[0]")
    for kind in ("TrainerA", "TrainerB", "TrainerC"):
        trainer = next(o for (k, _), o in objects.items() if k == kind)
        assert trainer["replicas"] == 3 and trainer["total"]["gpus"] == {"nvidia.com/gpu": 6}


def test_check_denies_the_privileged_argo_template(capsys) -> None:
    code = main(["check", "-f", f"{DATA}/crd-bare-containers-and-podspecs.yaml", "--policies",
                 "policies/library/no-privileged-gpu.yaml", "-o", "json"])
    results = {r["name"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert code == 1
    assert results["gpu-wf"]["allowed"] is False
    assert "spec.templates[0].containers[0].securityContext.privileged" in \
        results["gpu-wf"]["message"]


@pytest.mark.parametrize("cores", ["nvidia.com/cores", "nvidia.com/gpucores"])
def test_hami_old_cores_name_is_a_share_of_each_gpu(tmp_path, capsys, cores) -> None:
    pod = tmp_path / "p.yaml"
    original = Path(f"{DATA}/hami-legacy-cores-pod.yaml").read_text(encoding="utf-8")
    pod.write_text(original.replace("nvidia.com/cores", cores), encoding="utf-8")
    total = _gpus(capsys, str(pod))[("Pod", "hami-legacy-cores")]["total"]
    assert total["gpu_equivalents"] == pytest.approx(0.6)
    assert total["hami"] == {"gpus": 2, "gpumem_mib": 4000, "gpumem_percentage": None,
                             "gpucores": 30}
    assert total["unrecognized"] == [] and total["shared"] is True


def test_a_bare_containers_own_count_and_argo_init_containers(tmp_path, capsys) -> None:
    runner = {"apiVersion": "example.com/v1", "kind": "Runner", "metadata": {"name": "r"},
              "spec": {"worker": {"image": "x", "replicas": 3,
                                  "resources": {"limits": {"nvidia.com/gpu": 2}}}}}
    # One Argo template: a script with 1 GPU, an init container with 2 and a sidecar with 1 run
    # as one pod: max(2, 1 + 1) = 2 GPUs, as Kubernetes counts a pod's effective request.
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
                "metadata": {"name": "w"}, "spec": {"templates": [{
                    "name": "t",
                    "script": {"image": "x", "source": "nvidia-smi",
                               "resources": {"limits": {"nvidia.com/gpu": 1}}},
                    "initContainers": [{"name": "i", "image": "x",
                                        "resources": {"limits": {"nvidia.com/gpu": 2}}}],
                    "sidecars": [{"name": "s", "image": "x",
                                  "resources": {"limits": {"nvidia.com/gpu": 1}}}]}]}}
    path = tmp_path / "crds.yaml"
    path.write_text(json.dumps(runner) + "\n---\n" + json.dumps(workflow), encoding="utf-8")
    found = _gpus(capsys, str(path))
    assert found[("Runner", "r")]["replicas"] == 3
    assert found[("Runner", "r")]["total"]["gpus"] == {"nvidia.com/gpu": 6}
    template = found[("WorkflowTemplate", "w")]
    assert template["replicas"] == 1 and template["total"]["gpus"] == {"nvidia.com/gpu": 2}
    assert [s["path"] for s in template["total"]["sources"]] == [
        "spec.templates[0].initContainers[0].resources.limits[nvidia.com/gpu]",
        "spec.templates[0].containers[0].resources.limits[nvidia.com/gpu]",
        "spec.templates[0].containers[1].resources.limits[nvidia.com/gpu]"]


def test_the_audit_judges_the_privileged_argo_template(capsys) -> None:
    assert main(["audit", "-f", f"{DATA}/crd-bare-containers-and-podspecs.yaml", "--policies",
                 "policies/library/no-privileged-gpu.yaml", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    denied = sorted((f["workload"]["kind"], f["workload"]["name"]) for f in report["findings"]
                    if f["policy"] == "no-privileged-gpu")
    assert denied == [("Trainer", "t"), ("Workflow", "gpu-wf")]


PER_POD_AND_TOTAL = """apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: no-gpu}
spec:
  validations:
  - expression: "gpu.maxPerPod.count < 1"
    messageExpression: "'per pod ' + string(gpu.maxPerPod.count) + ', total ' + string(gpu.count)
      + ', requested ' + string(gpu.requested)"
"""


def test_policies_judge_a_halted_vm_by_its_template_with_nothing_held(tmp_path, capsys) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(PER_POD_AND_TOTAL, encoding="utf-8")
    code = main(["check", "-f", f"{DATA}/kubevirt-pools-halted-hostdevices.yaml", "--policies",
                 str(policy), "-o", "json"])
    results = {r["name"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert code == 1
    # requested: a user who may not use GPUs cannot create the VM to start it later
    assert results["vm-halted"]["message"] == "no-gpu: per pod 1, total 0, requested true"
    assert results["pool"]["message"] == "no-gpu: per pod 1, total 3, requested true"
    assert results["vmirs"]["message"] == "no-gpu: per pod 1, total 2, requested true"
    assert results["vmi-nic"]["allowed"] is True
