"""audit.inventory.join: findings on a realistic cluster (tests/builders/inventory_scenario.py: Nodes from
tests/data/nodes, pods from tests/data/manifests, fake NVML per node), then each rule alone."""

import datetime

import pytest

from audit.inventory.join import (
    KINDS,
    PodGpus,
    join_inventories,
    join_objects,
    pods_on_nodes,
)
from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import summarize
from policies.facts.nodes import node_facts
from policies.facts.workloads import workload_facts
from tests.builders import inventory_scenario as scenario
from tests.builders.corpus import first
from tests.fakes.fake_nvml import MIB, FakeNvml, a100_mig, h100, lost_gpu
from tests.paths import ROOT

NOW = scenario.NOW


def findings():
    return [f.to_dict() for f in join_objects(scenario.inventories(), scenario.objects(),
                                              now=NOW)]


def test_scenario_findings():
    assert findings() == [
        {"kind": "mig-config-mismatch", "severity": "warn",
         "node": "gpu-node-a100-mig-invalid-01",
         "message": "nvidia.com/mig.config=all-1g.5gb, but GPU 0: NVIDIA A100 80GB PCIe has no "
                    "MIG profile 1g.5gb",
         "gpus": ["0 (GPU-04000000)"], "pods": []},
        {"kind": "gpu-lost", "severity": "warn", "node": "gpu-node-a100-mixed-01",
         "message": "GPU 1 is lost (NVML GPU_IS_LOST: fallen off the bus or needs a reset); "
                    "the node still advertises 2 nvidia.com/gpu",
         "gpus": ["1"], "pods": []},
        {"kind": "gpus-over-advertised", "severity": "warn", "node": "gpu-node-a100-mixed-01",
         "message": "the node advertises 2 GPU(s), NVML sees 1 healthy GPU(s) without MIG, 1 "
                    "lost or unreadable: pods can be scheduled onto GPUs that are not there",
         "gpus": ["1"], "pods": []},
        {"kind": "mig-advertised-mismatch", "severity": "warn", "node": "gpu-node-a100-pcie-01",
         "message": "MIG devices and MIG resources differ: nvidia.com/mig-3g.20gb 0 advertised "
                    "vs 1 in NVML",
         "gpus": ["0 (GPU-03000000)", "1 (GPU-03000001)"], "pods": []},
        {"kind": "allocated-idle-mig", "severity": "warn", "node": "gpu-node-a100-pcie-01",
         "message": "at least 2 of the 3 1g.5gb MIG device(s) held by pods run no process (1 of "
                    "4 1g.5gb device(s) on the node run one)",
         "gpus": ["0 (GPU-03000000)"], "pods": ["ml/triton-0", "ml/triton-1", "ml/triton-2"]},
        {"kind": "allocated-idle", "severity": "warn", "node": "gpu-node-h100-01",
         "message": "at least 3 of the 6 GPU(s) held by pods on this node are idle: 5 of 8 "
                    "GPU(s) at or below 5 % utilization in one NVML sample (GPU 3: 0 %, 0 "
                    "processes; GPU 4: 0 %, 0 processes; GPU 5: 0 %, 0 processes; GPU 6: 0 %, 0 "
                    "processes; GPU 7: 0 %, 0 processes)",
         "gpus": ["3 (GPU-01000003)", "4 (GPU-01000004)", "5 (GPU-01000005)",
                  "6 (GPU-01000006)", "7 (GPU-01000007)"],
         "pods": ["ml/vllm-0", "ml/vllm-1", "ml/vllm-2", "ml/vector-add", "ml/nbody",
                  "ml/kai-half"]},
        {"kind": "memory-over-request", "severity": "warn", "node": "gpu-node-hami-2080ti",
         "message": "processes use 11,300 MiB of GPU memory, the pods on this node may use at "
                    "most 6,000 MiB (ml/hami-default: 6,000 MiB (HAMi gpumem 3000 MiB x 2)): a "
                    "memory limit is not enforced (KAI fractions without HAMi or MPS limits, "
                    "HAMi without hami-core) or processes run outside the requests",
         "gpus": ["0 (GPU-06000000)", "1 (GPU-06000001)"], "pods": ["ml/hami-default"]},
    ]


def test_scenario_negative_control_and_finished_pods():
    nodes = {f["node"] for f in findings()}
    # all-balanced H100 NVL whose NVML layout and resources agree: nothing to say.
    assert "gpu-node-h100-mig-01" not in nodes
    pods = {p.pod for p in pods_on_nodes(scenario.objects())}
    assert "ml/nbody-done" not in pods  # Succeeded: holds nothing
    assert len(pods) == 11


def test_kinds_are_documented():
    doc = (ROOT / "docs" / "inventory.md").read_text()
    assert all(f"`{kind}`" in doc for kind in KINDS)


# -- each rule on its own ---------------------------------------------------------------------


def node(name="n1", labels=None, allocatable=None, annotations=None):
    return node_facts({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": labels or {},
                                    "annotations": annotations or {}},
                       "status": {"allocatable": allocatable or {}}})


def summary(*gpus, name="n1", at=NOW):
    return summarize(read_inventory(FakeNvml(list(gpus)), node=name, now=lambda: at))


def pod(name, node_name="n1", limits=None, annotations=None):
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "ml", "annotations": annotations or {}},
           "spec": {"nodeName": node_name,
                    "containers": [{"name": "c", "resources": {"limits": limits or {}}}]}}
    return PodGpus(f"ml/{name}", node_name, workload_facts(obj).total)


def kinds(found):
    return [(f.kind, f.severity) for f in found]


def idle_h100(i):
    return h100(uuid=f"GPU-{i:08d}-0000-4000-8000-000000000000", utilization=(0, 0),
                processes=[])


def test_no_idle_finding_when_enough_gpus_are_busy():
    inventory = summary(h100(), idle_h100(1))
    found = join_inventories({"n1": inventory}, {"n1": node(allocatable={"nvidia.com/gpu": "2"})},
                             [pod("a", limits={"nvidia.com/gpu": 1})])
    assert found == []


def test_idle_threshold_is_inclusive_and_configurable():
    gpu = h100(utilization=(5, 1), processes=[])
    inventory = summary(gpu)
    nodes = {"n1": node(allocatable={"nvidia.com/gpu": "1"})}
    held = [pod("a", limits={"nvidia.com/gpu": 1})]
    assert kinds(join_inventories({"n1": inventory}, nodes, held)) == [("allocated-idle", "warn")]
    assert join_inventories({"n1": inventory}, nodes, held, idle_percent=4) == []


def test_time_sliced_node_counts_replicas():
    inventory = summary(idle_h100(0), idle_h100(1))
    labels = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    nodes = {"n1": node(labels=labels, allocatable={"nvidia.com/gpu": "8"})}
    held = [pod(f"p{i}", limits={"nvidia.com/gpu": 1}) for i in range(3)]  # 3/4 of a GPU
    [finding] = join_inventories({"n1": inventory}, nodes, held)
    assert finding.kind == "allocated-idle"
    assert finding.message.startswith("at least 1 of the 1 GPU(s) held by pods")
    nodes = {"n1": node(labels=labels, allocatable={"nvidia.com/gpu": "12"})}
    assert kinds(join_inventories({"n1": inventory}, nodes, held)) == [
        ("gpus-over-advertised", "warn"), ("allocated-idle", "warn")]


def test_gpus_not_advertised():
    inventory = summary(h100(), idle_h100(1))
    found = join_inventories({"n1": inventory}, {"n1": node(allocatable={"nvidia.com/gpu": "1"})},
                             [])
    assert kinds(found) == [("gpus-not-advertised", "warn"), ("unallocated-busy", "warn")]
    assert found[0].message.startswith("NVML sees 2 healthy GPU(s) without MIG; the node "
                                       "advertises 1")
    found = join_inventories({"n1": inventory}, {"n1": node()}, [])
    assert found[0].message.startswith("NVML sees 2 GPU(s) without MIG, but the node advertises "
                                       "no nvidia.com/gpu")


def test_unallocated_busy_whole_gpus():
    inventory = summary(h100(), h100(uuid="GPU-2"), idle_h100(2))
    nodes = {"n1": node(allocatable={"nvidia.com/gpu": "3"})}
    found = join_inventories({"n1": inventory}, nodes, [pod("a", limits={"nvidia.com/gpu": 1})])
    assert kinds(found) == [("unallocated-busy", "warn")]
    assert found[0].message.startswith("2 GPU(s) run processes or work, but the pods on this "
                                       "node can use at most 1: GPU access without a request")
    assert found[0].pods == ("ml/a",)


def test_unallocated_busy_mig_profile():
    inventory = summary(a100_mig())  # 3g.40gb and one 1g.10gb run processes
    nodes = {"n1": node(labels={"nvidia.com/mig.strategy": "mixed"},
                        allocatable={"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-2g.20gb": "1",
                                     "nvidia.com/mig-3g.40gb": "1"})}
    held = [pod("a", limits={"nvidia.com/mig-1g.10gb": 1})]
    found = join_inventories({"n1": inventory}, nodes, held)
    assert kinds(found) == [("unallocated-busy", "warn")]
    assert found[0].message.startswith("1 3g.40gb MIG device(s) run processes, but pods on this "
                                       "node hold 0")


def test_mig_single_strategy():
    labels = {"nvidia.com/mig.strategy": "single",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"}
    nodes = {"n1": node(labels=labels, allocatable={"nvidia.com/gpu": "4"})}
    found = join_inventories({"n1": summary(a100_mig())}, nodes,
                             [pod("a", limits={"nvidia.com/gpu": 2})])
    # The pod's 2 nvidia.com/gpu are 1g.10gb devices; only one of the two runs a process.
    assert kinds(found) == [("mig-advertised-mismatch", "warn"), ("allocated-idle-mig", "warn"),
                            ("unallocated-busy", "warn")]
    assert found[0].message == ("single strategy for 1g.10gb, but NVML also shows 2g.20gb, "
                                "3g.40gb")
    nodes = {"n1": node(labels=labels, allocatable={"nvidia.com/gpu": "5"})}
    found = join_inventories({"n1": summary(a100_mig())}, nodes, [])
    assert found[0].message.startswith("the node advertises 5 nvidia.com/gpu, NVML shows 4 MIG "
                                       "device(s) (2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb)")


def test_mig_devices_without_a_mig_strategy():
    found = join_inventories({"n1": summary(a100_mig())}, {"n1": node()}, [])
    assert kinds(found)[0] == ("mig-advertised-mismatch", "warn")
    assert "the device plugin runs with strategy none" in found[0].message


@pytest.mark.parametrize(("config", "state", "expected"), [
    ("all-disabled", "success",
     "nvidia.com/mig.config=all-disabled (nvidia.com/mig.config.state=success), but GPU 0: MIG "
     "enabled with 2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb, expected MIG disabled"),
    ("all-1g.10gb", None,
     "nvidia.com/mig.config=all-1g.10gb, but GPU 0: MIG enabled with 2 x 1g.10gb, 1 x 2g.20gb, "
     "1 x 3g.40gb, expected 7 x 1g.10gb"),
    ("all-1g.10gb.me", None,
     "nvidia.com/mig.config=all-1g.10gb.me, but GPU 0: MIG enabled with 2 x 1g.10gb, 1 x "
     "2g.20gb, 1 x 3g.40gb, expected 1 x 1g.10gb+me"),
    ("all-balanced", None, None),  # A100 80GB all-balanced is exactly 2 x 1g.10gb + 2g + 3g
    ("all-enabled", None, None),
    ("custom-layout", None, None),  # not a standard name: content unknown, not checked
])
def test_mig_config_label_vs_nvml(config, state, expected):
    labels = {"nvidia.com/mig.config": config, "nvidia.com/mig.strategy": "mixed"}
    if state:
        labels["nvidia.com/mig.config.state"] = state
    nodes = {"n1": node(labels=labels, allocatable={
        "nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-2g.20gb": "1",
        "nvidia.com/mig-3g.40gb": "1"})}
    found = [f for f in join_inventories({"n1": summary(a100_mig())}, nodes, [])
             if f.kind == "mig-config-mismatch"]
    assert [f.message for f in found] == ([expected] if expected else [])


def test_mig_config_mismatch_while_applying_is_info():
    labels = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending"}
    gpu = h100()
    gpu.mig_mode = (0, 1)
    found = join_inventories({"n1": summary(gpu)}, {"n1": node(
        labels=labels, allocatable={"nvidia.com/gpu": "1"})}, [])
    assert kinds(found) == [("mig-config-mismatch", "info"), ("mig-mode-pending", "info"),
                            ("unallocated-busy", "warn")]
    assert found[1].message == ("GPU 0 (GPU-9d8c7b6a): MIG disabled now, enabled after the "
                                "next GPU reset or reboot")


def test_memory_over_request_for_a_kai_fraction():
    gpu = h100(processes=[(1, 60000 * MIB)])
    nodes = {"n1": node(allocatable={"nvidia.com/gpu": "1"})}
    kai = first("manifests/kai__gpu-fraction-non-default-container.yaml", "Pod")
    kai["metadata"]["namespace"] = "ml"
    kai["spec"]["nodeName"] = "n1"
    found = join_inventories({"n1": summary(gpu)}, nodes, pods_on_nodes([kai]))
    assert kinds(found) == [("memory-over-request", "warn")]
    assert found[0].message.startswith(
        "processes use 60,000 MiB of GPU memory, the pods on this node may use at most 40,780 MiB "
        "(ml/gpu-sharing-non-default: 40,780 MiB (KAI gpu-fraction 0.5 x 81559 MiB))")
    # Within the fraction: nothing to say.
    gpu = h100(processes=[(1, 30000 * MIB)])
    assert join_inventories({"n1": summary(gpu)}, nodes, pods_on_nodes([kai])) == []


def test_memory_check_needs_every_process_memory():
    gpu = h100(processes=[(1, 60000 * MIB), (2, None)])
    nodes = {"n1": node(allocatable={"nvidia.com/gpu": "1"})}
    held = [pod("k", annotations={"gpu-memory": "2000"})]
    assert join_inventories({"n1": summary(gpu)}, nodes, held) == []


def test_lost_gpu_still_advertised():
    found = join_inventories({"n1": summary(h100(), lost_gpu())},
                             {"n1": node(allocatable={"nvidia.com/gpu": "2"})},
                             [pod("a", limits={"nvidia.com/gpu": 1})])
    assert kinds(found) == [("gpu-lost", "warn"), ("gpus-over-advertised", "warn")]


def test_coverage_findings():
    old = NOW - datetime.timedelta(hours=3)
    inventories = {"n1": summary(h100(), at=old), "ghost": summary(h100(), name="ghost")}
    nodes = {"n1": node(allocatable={"nvidia.com/gpu": "1"}),
             "n2": node("n2", allocatable={"nvidia.com/mig-1g.10gb": "7"}),
             "cpu": node("cpu"), "amd": node("amd", allocatable={"amd.com/gpu": "8"})}
    found = join_inventories(inventories, nodes, [pod("a", limits={"nvidia.com/gpu": 1})],
                             now=NOW)
    assert [(f.node, f.kind, f.severity) for f in found] == [
        ("ghost", "inventory-unknown-node", "info"),
        ("n1", "inventory-stale", "info"),
        ("n2", "inventory-missing", "info")]
    assert found[1].message.startswith("the inventory was collected at 2026-03-02T07:00:00Z, "
                                       "more than 60 minutes before this audit")
    assert join_inventories({}, nodes, []) == []  # no inventories given: nothing is "missing"


def test_truncated_summary_skips_count_checks():
    inventory = summarize(read_inventory(FakeNvml([h100(), h100(uuid="GPU-2")]), node="n1",
                                         now=lambda: NOW), max_bytes=700)
    assert inventory.truncated
    found = join_inventories({"n1": inventory}, {"n1": node(allocatable={"nvidia.com/gpu": "5"})},
                             [pod("a", limits={"nvidia.com/gpu": 5})])
    assert "gpus-over-advertised" not in [f.kind for f in found]


def test_plain_tuples_are_accepted():
    facts = workload_facts({"kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}).total
    found = join_inventories({"n1": summary(idle_h100(0))},
                             {"n1": node(allocatable={"nvidia.com/gpu": "1"})},
                             [("ml/a", "n1", facts)])
    assert kinds(found) == [("allocated-idle", "warn")]


def test_memory_entitlement_counts_unlimited_pods_as_whole_gpus():
    # One GPU time-sliced (no memory limit) next to a KAI pod limited to 2000 MiB.
    gpu = h100(processes=[(1, 80000 * MIB), (2, 5000 * MIB)])
    labels = {"nvidia.com/gpu.replicas": "2"}
    nodes = {"n1": node(labels=labels, allocatable={"nvidia.com/gpu": "2"})}
    held = [pod("ts", limits={"nvidia.com/gpu": 1}), pod("k", annotations={"gpu-memory": "2000"})]
    [finding] = join_inventories({"n1": summary(gpu)}, nodes, held)
    assert finding.kind == "memory-over-request"
    assert finding.message.startswith(
        "processes use 85,000 MiB of GPU memory, the pods on this node may use at most 83,559 MiB "
        "(ml/ts: 1 whole GPU(s) (time-sliced: no memory limit); ml/k: 2,000 MiB (KAI gpu-memory "
        "2000 MiB x 1))")


def test_hami_pod_without_a_core_share_claims_no_lower_bound_beyond_one_gpu():
    inventory = summary(idle_h100(0), idle_h100(1), idle_h100(2))
    hami = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "h", "namespace": "ml"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": 3, "nvidia.com/gpumem": 1000}}}]}}
    register = ":".join(f"GPU-{i},10,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true"
                        for i in range(3)) + ":"
    hami_node = node(allocatable={"nvidia.com/gpu": "30"},
                     annotations={"hami.io/node-nvidia-register": register})
    [finding] = join_inventories({"n1": inventory}, {"n1": hami_node}, pods_on_nodes([hami]))
    assert finding.kind == "allocated-idle"
    assert finding.message.startswith("at least 1 of the 1 GPU(s) held by pods")
