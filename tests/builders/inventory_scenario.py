"""A realistic cluster for the inventory join: Nodes from tests/data/nodes, pods from
tests/data/manifests bound to them, and what a fake NVML shows on each node.

Nodes (all from real bug reports / docs, see each file's header):

- ``gpu-node-h100-01`` (k8s-device-plugin#1501): 8 x H100, MIG disabled; NVML: GPUs 0-2 busy,
  3-7 idle. Pods: the vLLM Deployment (3 replicas x 1 GPU), the CUDA vector-add and nbody pods
  (1 GPU each) and the KAI 0.5-fraction pod.
- ``gpu-node-a100-mixed-01`` (gpu-operator#637): 2 whole GPUs + 6 x 1g.10gb + 4 x 2g.20gb
  advertised; NVML: GPU 0 without MIG (busy), GPU 1 lost, GPUs 2-3 in MIG with 3 x 1g.10gb +
  2 x 2g.20gb each. Pod: nbody (1 GPU).
- ``gpu-node-a100-pcie-01`` (network-operator#211): mixed strategy, 4 x 1g.5gb + 2 x 2g.10gb
  advertised; NVML: GPU 0 4 x 1g.5gb + 2g.10gb, GPU 1 2g.10gb + 3g.20gb (not advertised); only
  one 1g.5gb runs a process. Pods: Triton Deployment, 3 replicas x 1 x mig-1g.5gb.
- ``gpu-node-a100-mig-invalid-01`` (gpu-operator#603): ``mig.config=all-1g.5gb`` on an A100 80GB
  PCIe; NVML: MIG enabled, no MIG device (1g.5gb does not exist on that GPU).
- ``gpu-node-h100-mig-01`` (kubectl-view-allocations#258): ``all-balanced`` on an H100 NVL;
  NVML agrees with labels and resources (a negative control: no finding).
- ``gpu-node-hami-2080ti`` (HAMi#441): 2 x RTX 2080 Ti under HAMi; the HAMi example pod asks
  2 GPUs x 3000 MiB; NVML: processes use 6200 + 5100 MiB.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import InventorySummary, summarize
from tests.builders.corpus import documents, first
from tests.fakes.fake_nvml import (
    A100_40GB_PROFILES,
    A100_80GB_PROFILES,
    A100_80GB_TOTAL,
    MIB,
    FakeGpu,
    FakeNvml,
    h100,
    lost_gpu,
    mig_device,
)

NOW = datetime.datetime(2026, 3, 2, 10, 0, 0, tzinfo=datetime.UTC)


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:02d}{gpu:06d}-0000-4000-8000-000000000000"


def _mig_uuid(node: int, gpu: int, slot: int) -> str:
    return f"MIG-{node:02d}{gpu:03d}{slot:03d}-0000-4000-8000-000000000000"


def _bus(gpu: int) -> str:
    return f"00000000:{0x10 + gpu:02x}:00.0"


def h100_node() -> FakeNvml:
    gpus = []
    for i in range(8):
        busy = i < 3
        gpus.append(h100(uuid=_uuid(1, i), bus_id=_bus(i), utilization=(93, 60) if busy else (0, 0),
                         processes=[(7000 + i, 70000 * MIB)] if busy else []))
    return FakeNvml(gpus)


def a100_mixed_node() -> FakeNvml:
    def mig_gpu(i: int) -> FakeGpu:
        table = A100_80GB_PROFILES
        migs = {0: mig_device(table, "2g.20gb", _mig_uuid(2, i, 0), 3),
                1: mig_device(table, "2g.20gb", _mig_uuid(2, i, 1), 4),
                2: mig_device(table, "1g.10gb", _mig_uuid(2, i, 2), 11),
                3: mig_device(table, "1g.10gb", _mig_uuid(2, i, 3), 12),
                4: mig_device(table, "1g.10gb", _mig_uuid(2, i, 4), 13)}
        return FakeGpu(uuid=_uuid(2, i), name="NVIDIA A100-SXM4-80GB", bus_id=_bus(i),
                       total_bytes=A100_80GB_TOTAL, used_bytes=600 * MIB, mig_mode=(1, 1),
                       max_mig=7, migs=migs)

    whole = FakeGpu(uuid=_uuid(2, 0), name="NVIDIA A100-SXM4-80GB", bus_id=_bus(0),
                    total_bytes=A100_80GB_TOTAL, used_bytes=30000 * MIB, utilization=(71, 30),
                    mig_mode=(0, 0), processes=[(9100, 29400 * MIB)])
    return FakeNvml([whole, lost_gpu(uuid=_uuid(2, 1), bus_id=_bus(1)), mig_gpu(2), mig_gpu(3)])


def a100_pcie_node() -> FakeNvml:
    table = A100_40GB_PROFILES
    total = 40960 * MIB
    gpu0 = FakeGpu(
        uuid=_uuid(3, 0), name="NVIDIA A100-PCIE-40GB", bus_id=_bus(0), total_bytes=total,
        used_bytes=4000 * MIB, mig_mode=(1, 1), max_mig=7,
        migs={0: mig_device(table, "2g.10gb", _mig_uuid(3, 0, 0), 5),
              1: mig_device(table, "1g.5gb", _mig_uuid(3, 0, 1), 7,
                            processes=[(8800, 3900 * MIB)]),
              2: mig_device(table, "1g.5gb", _mig_uuid(3, 0, 2), 8),
              3: mig_device(table, "1g.5gb", _mig_uuid(3, 0, 3), 9),
              4: mig_device(table, "1g.5gb", _mig_uuid(3, 0, 4), 10)})
    gpu1 = FakeGpu(
        uuid=_uuid(3, 1), name="NVIDIA A100-PCIE-40GB", bus_id=_bus(1), total_bytes=total,
        used_bytes=100 * MIB, mig_mode=(1, 1), max_mig=7,
        migs={0: mig_device(table, "3g.20gb", _mig_uuid(3, 1, 0), 1),
              1: mig_device(table, "2g.10gb", _mig_uuid(3, 1, 1), 5)})
    return FakeNvml([gpu0, gpu1])


def a100_invalid_node() -> FakeNvml:
    gpu = FakeGpu(uuid=_uuid(4, 0), name="NVIDIA A100 80GB PCIe", bus_id=_bus(0),
                  total_bytes=A100_80GB_TOTAL, used_bytes=0, mig_mode=(1, 1), max_mig=7)
    return FakeNvml([gpu])


def h100_nvl_balanced_node() -> FakeNvml:
    table = {"1g.12gb": (1, 1, 11008, 16), "2g.24gb": (2, 2, 22144, 32),
             "3g.47gb": (3, 3, 44032, 60)}
    gpu = FakeGpu(
        uuid=_uuid(5, 0), name="NVIDIA H100 NVL", bus_id=_bus(0), total_bytes=95830 * MIB,
        used_bytes=0, mig_mode=(1, 1), max_mig=7,
        migs={0: mig_device(table, "3g.47gb", _mig_uuid(5, 0, 0), 2),
              1: mig_device(table, "2g.24gb", _mig_uuid(5, 0, 1), 3),
              2: mig_device(table, "1g.12gb", _mig_uuid(5, 0, 2), 9),
              3: mig_device(table, "1g.12gb", _mig_uuid(5, 0, 3), 10)})
    return FakeNvml([gpu])


def hami_node() -> FakeNvml:
    gpus = [FakeGpu(uuid=_uuid(6, i), name="NVIDIA GeForce RTX 2080 Ti", bus_id=_bus(i),
                    total_bytes=11264 * MIB, used_bytes=(used + 300) * MIB, utilization=(45, 50),
                    processes=[(6000 + i, used * MIB)])
            for i, used in enumerate((6200, 5100))]
    return FakeNvml(gpus)


MACHINES = {
    "gpu-node-h100-01": h100_node,
    "gpu-node-a100-mixed-01": a100_mixed_node,
    "gpu-node-a100-pcie-01": a100_pcie_node,
    "gpu-node-a100-mig-invalid-01": a100_invalid_node,
    "gpu-node-h100-mig-01": h100_nvl_balanced_node,
    "gpu-node-hami-2080ti": hami_node,
}

NODE_FILES = (
    "nodes/issue-ndp-1501__h100-80gb-hbm3-x8-no-mig.yaml",
    "nodes/issue-gpuop-637__a100-mixed-gpu-and-mig-allocatable.yaml",
    "nodes/issue-netop-211__a100-pcie-40gb-mig-mixed.yaml",
    "nodes/issue-gpuop-603__a100-80gb-pcie-mig-invalid-labels.yaml",
    "nodes/issue-viewalloc-258__h100-mixed-mig-no-whole-gpu.yaml",
    "nodes/hami__node-register-annotation-formats.yaml",
)


def inventories() -> dict[str, InventorySummary]:
    """The summary each node's inventory DaemonSet would have written."""
    return {name: summarize(read_inventory(machine(), node=name, now=lambda: NOW))
            for name, machine in MACHINES.items()}


def nodes() -> list[dict[str, Any]]:
    found = []
    for relative in NODE_FILES:
        found += [d for d in documents(relative) if d.get("kind") == "Node"
                  and d["metadata"]["name"] in MACHINES]
    return found


def _pod_from(template_owner: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    """A running pod made from a Deployment's template (or a Pod), bound to ``node``."""
    if template_owner["kind"] == "Pod":
        pod = copy.deepcopy(template_owner)
    else:
        template = template_owner["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(
            template.get("metadata") or {}), "spec": copy.deepcopy(template["spec"])}
    pod["metadata"]["name"] = name
    pod["metadata"]["namespace"] = "ml"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def pods() -> list[dict[str, Any]]:
    vllm = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml", "Deployment")
    vector_add = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml", "Pod")
    nbody = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml", "Pod")
    kai = first("manifests/kai__gpu-fraction-non-default-container.yaml", "Pod")
    triton = first("manifests/triton__mig-1g.5gb-deployment.yaml", "Deployment")
    hami = first("manifests/hami__default-use-gpumem-gpucores.yaml", "Pod")
    h100_node_name = "gpu-node-h100-01"
    found = [_pod_from(vllm, f"vllm-{i}", h100_node_name) for i in range(3)]
    found += [_pod_from(vector_add, "vector-add", h100_node_name),
              _pod_from(nbody, "nbody", h100_node_name),
              _pod_from(kai, "kai-half", h100_node_name),
              _pod_from(nbody, "nbody-a100", "gpu-node-a100-mixed-01")]
    found += [_pod_from(triton, f"triton-{i}", "gpu-node-a100-pcie-01") for i in range(3)]
    found.append(_pod_from(hami, "hami-default", "gpu-node-hami-2080ti"))
    finished = _pod_from(nbody, "nbody-done", "gpu-node-a100-mig-invalid-01")
    finished["status"]["phase"] = "Succeeded"
    found.append(finished)
    return found


def objects() -> list[dict[str, Any]]:
    return nodes() + pods()
