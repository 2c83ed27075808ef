"""The bundled example cluster (examples/cluster), audited from files: every figure computed by hand.

The snapshot (see examples/cluster/README.md) has 15 nodes, 60 pods and 23 workloads. Each expected
value below is derived in the comment next to it from the files, not from gpuguard's output.
Compliance uses tests/data/audit/policies.yaml (one Deny, one Warn, one Audit policy and an
exception), so the figures do not move when the built-in library changes.
"""

from __future__ import annotations

import json

import pytest

from gpuguard.cli import main
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"


def run_audit(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["audit", *args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def report() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", "-f", str(EXAMPLE), "--metrics", str(METRICS),
                     "--policies", str(POLICIES), "-o", "json", "--jobs", "0"])
    assert code == 0
    return json.loads(out.getvalue())


def node(report: dict, name: str) -> dict:
    return next(n for n in report["nodes"] if n["name"] == name)


def test_inventory(report):
    s = report["summary"]
    # Nodes: 5 corpus nodes already in nodes/ (a100-mixed-01, h100-01, h100-mig-01, dgx single,
    # nvs-kwok) + 3 corpus copies (hami-2080ti, a100-pcie-01, a100-mig-invalid-01) + 7 in
    # gpu-pools.yaml (h100-02, a100-02..05, a100-mps-01, a100-ts-01) = 15, all GPU nodes.
    assert (s["nodes"], s["gpu_nodes"]) == (15, 15)
    # Pods: 59 in pods.yaml + gpu-sharing-init-container in workloads/kai-fraction-init.yaml.
    assert s["pods"] == 60
    # Finished (not counted): nccl-tests launcher (Succeeded), gpu-operator-test (Succeeded),
    # one j-e2e-1 attempt (Failed).
    assert s["finished_pods"] == 3
    # Running GPU pods per node: h100-01 5 (mistral, 3 pytorch, 1 j-e2e), h100-02 6 (3 volcano
    # workers, kai init pod, 2 ray workers), kwok 5 (j-e2e), a100-05 1 (gemma), a100-mixed 2
    # (tf-benchmarks workers), mps 4, ts 3 (notebooks), hami 2 (vllm-cross-vgpu, hami-gpu-pod),
    # a100-pcie 3 (flower), dgx single 2 (flower-single) = 33.
    # Pending GPU pods: 4 LWS pods + cuda-vector-add + mig-3g-20gb-test = 6.
    assert s["gpu_pods"] == {"running": 33, "pending": 6}
    # Workloads (roots): team-llm 6 (mistral-7b, vllm-cross-vgpu, vllm-gemma-deployment, ollama,
    # ollama-cpu, LWS vllm), team-vision 6 (flower, flower-single, mps-test, j-e2e-1,
    # tensorflow-benchmarks, mig-3g-20gb-test), team-research 8 (volcano job, nccl-tests,
    # pytorch, kai init pod, raycluster, hami-gpu-pod, notebooks, cuda-vector-add), sandbox 1
    # (debug-shell), gpu-operator 2 (gfd DaemonSet, gpu-operator-test) = 23; without GPUs:
    # ollama-cpu, debug-shell, gfd = 3, so 20 with GPUs.
    assert (s["workloads"], s["gpu_workloads"], s["evaluated_workloads"]) == (23, 20, 23)
    # Physical GPUs stated: 8 x h100-01/02, kwok, a100-02/03/05 (48) + a100-04 4 + mps 2 + ts 2
    # (gpu.count labels) + hami 2 (register annotation) = 58; a100-mixed, a100-pcie (MIG), dgx
    # (single strategy), h100-mig, mig-invalid do not say: 5.
    assert s["physical_gpus"] == {"known": 58, "nodes_unknown": 5}
    assert report["errors"] == []
    # gpu-operator#637's node advertises the reporter's own counters, renamed example.org/*:
    # accelerator-looking names gpuguard does not know, said once each, never valued silently
    # (after the MIG-INVALID node's own warning, which is one of the audit's warnings)
    assert [w.split(":")[0] for w in report["warnings"]] == [
        "Node gpu-node-a100-mig-invalid-01", "example.org/gpu-count", "example.org/gpu-mem"]


def test_gpu_equivalents(report):
    eq = report["summary"]["gpu_equivalents"]
    # Allocatable: whole GPUs 54 (h100-01/02 8+8, kwok 8, a100-02/03 8+8, a100-04 4, a100-05 8,
    # a100-mixed 2) + a100-mixed MIG 6 x 1g.10gb (1/7) + 4 x 2g.20gb (2/7) = 2
    # + mps 8 replicas / 4 = 2 + ts 8 shared / 4 = 2 + hami 20 slots / split 10 = 2
    # + a100-pcie 4 x 1/7 + 2 x 2/7 = 8/7 + dgx 56 x 1g.5gb (1/7) = 8
    # + h100-mig 2 x 1/7 + 2/7 + 3/7 = 1 ; mig-invalid 0 -> 71 + 8/7 = 72.142857
    assert eq["allocatable"] == pytest.approx(71 + 8 / 7, abs=1e-6)
    # Allocated: h100-01 5, h100-02 3 + KAI 0.5 x 3 = 4.5, kwok 5, a100-05 2, a100-mixed 2,
    # mps 4 x 1/4 = 1, ts 3 x 1/4 = 0.75, hami 2 pods x (2 GPUs x 30 % cores) = 1.2,
    # a100-pcie 3 x 1/7, dgx 2 x 1/7 -> 21.45 + 5/7 = 22.164286
    assert eq["allocated"] == pytest.approx(21.45 + 5 / 7, abs=1e-6)
    # Stranded (free on unusable nodes): a100-02 8 (cordoned), a100-03 8 (not ready), a100-04 4
    # (taint nobody tolerates), a100-05 8 - 2 = 6 (CPU exhausted), mig-invalid 0 = 26.
    assert eq["stranded"] == 26.0
    # Free on usable nodes: h100-01 3, h100-02 3.5, kwok 3, a100-mixed 2, mps 1, ts 1.25,
    # hami 0.8, h100-mig 1, a100-pcie 8/7 - 3/7 = 5/7, dgx 8 - 2/7 = 54/7 -> 15.55 + 59/7
    assert eq["free"] == pytest.approx(15.55 + 59 / 7, abs=1e-6)
    # Pending: LWS 4 x 8 = 32, cuda-vector-add 1, mig-3g.20gb 3/7 (A100-40GB is the only model
    # offering 3g.20gb) -> 33 + 3/7.
    assert eq["pending"] == pytest.approx(33 + 3 / 7, abs=1e-6)
    # allocated / allocatable = 22.164286 / 72.142857
    assert eq["allocated_share"] == pytest.approx(22.164286 / 72.142857, abs=1e-4)


def test_whole_gpus_and_fragmentation(report):
    # Whole-GPU resources (unit 1): allocatable 54 as above; allocated h100-01 5, h100-02 3 +
    # ceil(1.5) KAI = 5, kwok 5, a100-05 2, a100-mixed 2 = 19; free on usable nodes 3 + 3 + 3 = 9
    # (a100-mixed has 0 left); stranded 8 + 8 + 4 + 6 = 26.
    assert report["summary"]["whole_gpus"] == {"allocatable": 54, "allocated": 19, "free": 9,
                                               "stranded": 26}
    frag = report["fragmentation"]["whole_gpus"]
    assert len(frag) == 1
    entry = frag[0]
    # 9 free, at most 3 on one node: no node can host a 4-GPU pod.
    assert entry["resource"] == "nvidia.com/gpu"
    assert (entry["free"], entry["largest_free_on_one_node"], entry["nodes_with_free"]) == (9, 3, 3)
    assert entry["fits"] == {"1": 3, "2": 3, "4": 0, "8": 0}
    assert entry["message"] == ("9 nvidia.com/gpu free, but no node can host a 4-GPU pod "
                                "(largest free on one node: 3)")
    # 1 - 3/9
    assert entry["index"] == pytest.approx(1 - 3 / 9, abs=1e-4)
    # GPU-equivalents: the largest free block is the dgx single node, 54/7.
    assert report["fragmentation"]["gpu_equivalents"]["largest_free_on_one_node"] == \
        pytest.approx(54 / 7, abs=1e-6)


def test_nodes(report):
    h100 = node(report, "gpu-node-h100-02")
    # 3 volcano workers (3 slots) + KAI fractions 0.5 (init pod) + 2 x 0.5 (ray) = 1.5 -> the
    # fractions share ceil(1.5) = 2 whole GPUs.
    assert h100["resources"]["nvidia.com/gpu"]["allocated"] == 5
    assert h100["gpu_equivalents"]["allocated"] == 4.5
    # CPU: volcano ps 1 + 3 workers x 1 + ray head 1 (limit -> request) + 2 ray workers x 1 = 7.
    assert h100["cpu"]["requested_millicores"] == 7000
    single = node(report, "gpu-node-dgx-a100-mig-single")
    # nvidia.com/gpu is a 1g.5gb slice there: 2 pods x 1/7.
    assert single["resources"]["nvidia.com/gpu"]["unit_gpu_equivalents"] == \
        pytest.approx(1 / 7, abs=1e-6)
    assert single["gpu_equivalents"]["allocated"] == pytest.approx(2 / 7, abs=1e-6)
    assert single["whole_gpus"]["allocatable"] == 0
    hami = node(report, "gpu-node-hami-2080ti")
    # 20 slots (2 GPUs x split 10); the two HAMi pods take 2 slots each and 0.6 GPU each.
    assert hami["resources"]["nvidia.com/gpu"] == {
        "capacity": 20, "allocatable": 20, "allocated": 4, "free": 16,
        "unit_gpu_equivalents": 0.1}
    assert hami["gpu_equivalents"] == {"allocatable": 2.0, "allocated": 1.2, "free": 0.8,
                                       "approximate": False, "unknown_pods": 0}
    ts = node(report, "gpu-node-a100-ts-01")
    # renamed time-slicing: nvidia.com/gpu 0, nvidia.com/gpu.shared 8 (2 GPUs x 4 replicas)
    assert ts["resources"]["nvidia.com/gpu.shared"]["allocated"] == 3
    assert ts["gpu_equivalents"]["free"] == 1.25
    mixed = node(report, "gpu-node-a100-mixed-01")
    # gpuop-637: 2 whole GPUs next to MIG slices: 2 + 6/7 + 8/7 = 4, not double counted.
    assert mixed["gpu_equivalents"]["allocatable"] == 4.0
    assert mixed["resources"]["nvidia.com/mig-3g.40gb"]["allocatable"] == 0


def test_stranded(report):
    stranded = {s["node"]: s for s in report["stranded"]}
    assert set(stranded) == {"gpu-node-a100-02", "gpu-node-a100-03", "gpu-node-a100-04",
                             "gpu-node-a100-05", "gpu-node-a100-mig-invalid-01"}
    assert stranded["gpu-node-a100-02"]["reasons"] == ["cordoned"]
    assert stranded["gpu-node-a100-03"]["reasons"] == ["not-ready (NodeStatusUnknown)"]
    assert stranded["gpu-node-a100-04"]["reasons"] == [
        "untolerated-taint (dedicated=benchmark:NoSchedule)"]
    # a100-05: 22500m allocatable - gemma 10 CPU - 6 ollama-cpu x 2 CPU = 500m, below the
    # smallest CPU request of a GPU pod in the snapshot (ray / volcano workers: 1 CPU).
    assert stranded["gpu-node-a100-05"]["reasons"] == ["cpu-exhausted (500m free < 1000m)"]
    assert stranded["gpu-node-a100-05"]["whole_gpus"] == 6
    assert stranded["gpu-node-a100-mig-invalid-01"]["reasons"] == ["mig-invalid"]
    assert report["thresholds"]["min_gpu_pod_cpu_millicores"] == 1000
    # The nvidia.com/gpu=true taint of nvs-kwok-node-001 is tolerated (j-e2e-1, mps-test, ...).
    assert node(report, "nvs-kwok-node-001")["stranded"] is None


def test_mig(report):
    profiles = {p["profile"]: p for p in report["mig"]["profiles"]}
    # 1g.5gb: 4 on a100-pcie (mixed) + 56 on the dgx (single) = 60 configured; used 3 flower +
    # 2 flower-single = 5.
    assert (profiles["1g.5gb"]["configured"], profiles["1g.5gb"]["used"]) == (60, 5)
    assert profiles["1g.5gb"]["used_gpu_equivalents"] == pytest.approx(5 / 7, abs=1e-6)
    # configured, never used: 1g.10gb 6, 2g.20gb 4 (a100-mixed), 1g.12gb 2, 2g.24gb 1,
    # 3g.47gb 1 (h100-mig), 2g.10gb 2 (a100-pcie)
    for name, count in (("1g.10gb", 6), ("2g.20gb", 4), ("1g.12gb", 2), ("2g.24gb", 1),
                        ("3g.47gb", 1), ("2g.10gb", 2)):
        assert (profiles[name]["configured"], profiles[name]["used"]) == (count, 0)
    # The pending pod asks 3g.20gb, which no node offers.
    assert report["mig"]["unmet_profiles"] == [
        {"profile": "3g.20gb", "pending_pods": 1, "pending_instances": 1}]


def test_pending(report):
    pending = {p["pod"]: p for p in report["pending"]}
    assert set(pending) == {"vllm-0", "vllm-0-1", "vllm-1", "vllm-1-1", "cuda-vector-add",
                            "mig-3g-20gb-test"}
    # LWS pods: pinned to H100; both H100 nodes are usable but have 3 GPUs free, not 8.
    lws = pending["vllm-0-1"]
    assert lws["reason"] == "insufficient-resource"
    assert lws["nodes"] == {"selected": 2, "available": 2, "tolerated": 2, "fit": 0}
    assert lws["short_of"] == {"nvidia.com/gpu": 2}
    # leader pod -> StatefulSet vllm -> LeaderWorkerSet; worker pod -> StatefulSet vllm-0 ->
    # leader pod vllm-0 -> StatefulSet vllm -> LeaderWorkerSet vllm.
    assert lws["workload"] == {"kind": "LeaderWorkerSet", "group": "leaderworkerset.x-k8s.io",
                               "namespace": "team-llm", "name": "vllm"}
    # cuda-vector-add: pinned to A100-SXM4-80GB: kwok (tainted), a100-02 (cordoned), a100-03
    # (not ready); the only available one is tainted.
    assert pending["cuda-vector-add"]["reason"] == "taint"
    assert pending["cuda-vector-add"]["nodes"] == {"selected": 3, "available": 1,
                                                   "tolerated": 0, "fit": 0}
    assert pending["mig-3g-20gb-test"]["reason"] == "no-node-offers-resource"
    assert pending["cuda-vector-add"]["scheduler_message"].startswith(
        "Unschedulable: 0/15 nodes are available")


def test_teams(report):
    teams = {t["team"]: t for t in report["teams"]}
    assert set(teams) == {"llm", "vision", "research", None}
    # llm: mistral 1 + vllm-cross-vgpu 0.6 + gemma 2 = 3.6; pending LWS 32.
    assert teams["llm"]["gpu_equivalents"]["allocated"] == 3.6
    assert teams["llm"]["gpu_equivalents"]["pending"] == 32.0
    # vision: flower 3/7 + flower-single 2/7 + mps 1 + j-e2e 6 + tf-benchmarks 2 = 9 + 5/7;
    # pending mig-3g 3/7.
    assert teams["vision"]["gpu_equivalents"]["allocated"] == pytest.approx(9 + 5 / 7, abs=1e-6)
    # research: volcano 3 + pytorch 3 + KAI 0.5 + ray 1 + hami pod 0.6 + notebooks 0.75 = 8.85
    assert teams["research"]["gpu_equivalents"]["allocated"] == 8.85
    # sum over teams = cluster allocated (3.6 + 9.714286 + 8.85 = 22.164286)
    assert sum(t["gpu_equivalents"]["allocated"] for t in teams.values()) == \
        pytest.approx(report["summary"]["gpu_equivalents"]["allocated"], abs=1e-5)
    # (no team): gpu-operator's finished test pod asks for a GPU; the sandbox pod asks for none
    # and breaks none of these policies, so it is not listed.
    assert teams[None]["namespaces"] == ["gpu-operator"]
    # Findings per team (policies.yaml): llm 1 deny (LWS), 1 warn (vllm-cross-vgpu), 5 audit.
    assert teams["llm"]["findings"] == {"deny": 1, "warn": 1, "audit": 5, "error": 0, "info": 0}


def test_utilization(report):
    util = report["utilization"]
    # 8 GPUs each on h100-01, h100-02, kwok + 6 MIG instances on a100-pcie = 30 devices
    assert util["devices"] == 30
    # with pods: h100-01 gpu0-4, h100-02 gpu0-4, kwok gpu0-4, a100-pcie 3 flower instances = 18
    assert util["allocated_devices"] == 18
    # below 5 %: h100-01 gpu0 (mistral 0.03), h100-02 gpu1 (volcano worker-1 0.02), h100-02 gpu3
    # (KAI init pod + ray worker 0.01), kwok gpu2 (j-e2e, 0 %), a100-pcie instance 8 (0.02)
    assert util["idle_allocated_devices"] == 5
    # 4 whole GPUs + one 1g.5gb instance (1/7)
    assert util["idle_allocated_gpu_equivalents"] == pytest.approx(4 + 1 / 7, abs=1e-6)
    # mean over the 18 allocated devices: (3.43 + 2.22 + 3.78 + 0.77) / 18
    assert util["mean_utilization_allocated"] == pytest.approx(10.2 / 18, abs=1e-4)
    teams = {t["team"]: t for t in util["teams"]}
    # research: volcano worker-1 1 + the shared GPU 0.5 (init pod) + 0.5 (ray worker) = 2
    assert teams["research"]["idle_gpu_equivalents"] == 2.0
    assert teams["vision"]["idle_gpu_equivalents"] == pytest.approx(1 + 1 / 7, abs=1e-6)
    idle = {(w["workload"]["kind"], w["workload"]["name"]): w for w in util["idle_workloads"]}
    assert set(idle) == {("Deployment", "mistral-7b"), ("Job", "tensorflow-benchmark-gpu"),
                         ("Job", "j-e2e-1"), ("Pod", "gpu-sharing-init-container"),
                         ("RayCluster", "raycluster-half-gpu"), ("Deployment", "flower")}
    # both label generations were read: kwok uses pod_name/pod_namespace, h100-02 `hostname`
    assert util["unmatched_pods"] == []
    assert {n["node"] for n in util["nodes"]} == {"gpu-node-h100-01", "gpu-node-h100-02",
                                                  "nvs-kwok-node-001", "gpu-node-a100-pcie-01"}


def test_compliance(report):
    # max-gpus-per-pod (Deny): LWS vllm asks 8 per pod -> 1 deny; passes: the other 4 GPU
    # workloads of team-llm + 6 of team-vision = 10; team-research's 8 are exempt.
    # shared-gpu-notice (Warn): vllm-cross-vgpu, mps-test, kai init pod, raycluster,
    # hami-gpu-pod, notebooks = 6; the other 14 GPU workloads pass.
    # queue-label-audit (Audit): GPU workloads in team namespaces without a queue label on the
    # object: llm 5, vision 6, research 3 (volcano job, nccl-tests, hami-gpu-pod) = 14; pass 5.
    assert report["summary"]["findings"] == {"deny": 1, "warn": 6, "audit": 14, "error": 0,
                                             "info": 0}
    assert report["summary"]["exceptions"] == 8
    policies = {p["policy"]: p for p in report["policies"]}
    assert (policies["max-gpus-per-pod"]["pass"], policies["max-gpus-per-pod"]["exempt"]) == \
        (10, 8)
    assert policies["shared-gpu-notice"]["pass"] == 14
    assert policies["queue-label-audit"]["pass"] == 5
    deny = [f for f in report["findings"] if f["severity"] == "deny"]
    assert [(f["workload"]["name"], f["message"]) for f in deny] == [
        ("vllm", "a pod asks for 8 GPUs; the limit is 4")]
    # one finding per workload, not per replica: j-e2e-1 runs 6 pods, has 1 audit finding
    assert sum(1 for f in report["findings"] if f["workload"]["name"] == "j-e2e-1") == 1
    assert all(e["reason"] == "benchmark campaign, ticket OPS-1234 (until 2099-12-31)"
               for e in report["exceptions"])


def test_evaluated_object_is_the_workload(report):
    workloads = {(w["kind"], w["name"]): w for w in report["workloads"]}
    # The Deployment is in the snapshot: it is evaluated, not its ReplicaSet or pods.
    assert workloads[("Deployment", "mistral-7b")]["evaluated"]["kind"] == "Deployment"
    # nccl-tests finished: its MPIJob is still evaluated (the launcher pod is not counted).
    nccl = workloads[("MPIJob", "nccl-tests")]
    assert nccl["pods"] == {"running": 0, "pending": 0, "finished": 1}
    # the ollama StatefulSet's pods never got created (requests without limits)
    assert workloads[("StatefulSet", "ollama")]["pods"] == {"running": 0, "pending": 0,
                                                             "finished": 0}


def test_builtin_library_finds_violations(capsys):
    code, result = run_audit(capsys, "-f", str(EXAMPLE), "--jobs", "0")
    assert code == 0
    assert result["summary"]["findings"]["deny"] > 0
    assert result["source"]["policies"] == "built-in library"
    # --fail-on deny turns those into a failing exit code for CI
    capsys.readouterr()
    assert main(["audit", "-f", str(EXAMPLE), "--fail-on", "deny", "-o", "json",
                 "--jobs", "0"]) == 1


def test_parallel_evaluation_gives_the_same_report(report, capsys):
    code, parallel = run_audit(capsys, "-f", str(EXAMPLE), "--metrics", str(METRICS),
                               "--policies", str(POLICIES), "--jobs", "2")
    assert code == 0
    for key in ("summary", "findings", "exceptions", "workloads", "teams", "nodes"):
        assert parallel[key] == report[key], key


@pytest.mark.parametrize("policies", [(), ("--policies", str(POLICIES))],
                         ids=["built-in-library", "test-policies"])
def test_every_jobs_count_gives_the_whole_same_report(policies, capsys):
    """In-process (0), one worker and several workers: the whole report is the same —
    findings, their order, counts, exceptions — only its time differs."""
    reports = {}
    for jobs in ("0", "1", "3"):
        code, result = run_audit(capsys, "-f", str(EXAMPLE), *policies, "--jobs", jobs)
        result.pop("generated")
        reports[jobs] = (code, result)
    assert reports["0"][1]["summary"]["findings"]["deny"] > 0
    assert reports["1"] == reports["0"]
    assert reports["3"] == reports["0"]


def test_replaced_policy_workers_lose_no_result(monkeypatch, capsys):
    """Workers are replaced after a number of batches (the CEL runtime never frees what a
    Python function call passes it); here after every batch of one workload, so each result
    comes from a different process, and results are folded in while others are still out:
    the report is the in-process one."""
    from audit.scan import compliance

    code, in_process = run_audit(capsys, "-f", str(EXAMPLE), "--jobs", "0")
    monkeypatch.setattr(compliance, "_BATCH", 1)
    monkeypatch.setattr(compliance, "_BATCHES_PER_WORKER", 1)
    replaced_code, replaced = run_audit(capsys, "-f", str(EXAMPLE), "--jobs", "2")
    in_process.pop("generated")
    replaced.pop("generated")
    assert in_process["summary"]["evaluated_workloads"] > 20
    assert (replaced_code, replaced) == (code, in_process)


def test_default_jobs_is_every_cpu_the_audit_may_use(monkeypatch):
    """Without --jobs, one policy worker per CPU this process may run on (its affinity, not the
    machine's count: a container limited to 2 of 64 cores gets 2); none on one CPU."""
    import argparse
    import datetime

    from gpuguard import audit_run
    from policies.facts.resource_names import GPUSettings

    def settings(cpus: int) -> int:
        monkeypatch.setattr(audit_run.os, "sched_getaffinity", lambda _pid: set(range(cpus)),
                            raising=False)
        args = argparse.Namespace(idle_below="5", jobs=None, team_label="gpuguard.io/team")
        return audit_run.settings_from_args(args, GPUSettings(),
                                            datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)).jobs

    assert settings(1) == 0
    assert settings(2) == 2
    assert settings(16) == 16
