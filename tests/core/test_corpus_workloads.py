"""Independent oracle for ``gpuguard gpus -o json`` over the workload corpus.

Every expected value below was computed BY HAND from the manifests in ``tests/data/manifests`` and
the rules in ``docs/gpu-facts.md`` (not by running the implementation). The comment beside each
entry says how. Only GPU-relevant objects are listed; Services, PVCs, Namespaces, Queues,
ConfigMaps, ResourceClaimTemplates... are not (the implementation may list them with
``requested: false``). Objects are looked up by (kind, name); for each file the set of objects
with ``total.requested == true`` must be exactly the set marked ``requested=True`` here.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuguard.cli import main
from tests.paths import TESTS

MANIFESTS = TESTS / "data" / "manifests"


class _Skip:
    """Sentinel: the field is not asserted."""

    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()


@dataclass(frozen=True)
class Tpl:
    """One entry of ``templates``; ``match`` alternatives are compared to ``role`` (equal) or
    ``path`` (substring)."""

    match: tuple[str, ...]
    replicas: Any = SKIP
    gpus: Any = SKIP  # per_pod.gpus of the template
    eq: Any = SKIP  # per_pod.gpu_equivalents of the template
    min_replicas: Any = SKIP
    max_replicas: Any = SKIP
    kai: Any = SKIP  # subset of per_pod.kai


@dataclass(frozen=True)
class Want:
    """Expected facts for one object of one file."""

    kind: str
    name: str | None  # None: the only object of this kind in the file (e.g. generateName)
    replicas: Any
    requested: bool
    gpus: dict[str, int] = field(default_factory=dict)
    mig: dict[str, int] = field(default_factory=dict)
    eq: Any = SKIP  # total.gpu_equivalents (float, or None => `unknown` must be non-empty)
    approximate: Any = SKIP
    shared: Any = False
    invalid: str | None = None  # None: total.invalid empty; else a substring of the joined list
    # total.unrequested_access: every substring must appear in the joined reasons; the number
    # of entries must equal len(unrequested) unless unrequested_count is given (a range).
    unrequested: tuple[str, ...] = ()
    unrequested_count: tuple[int, int] | None = None
    unrequested_container: str | None = None
    privileged: int = 0  # number of total.privileged entries
    privileged_paths: tuple[str, ...] = ()  # substrings that some privileged entry's path has
    per_pod_none: bool = False  # several templates => per_pod is null
    per_pod_gpus: Any = SKIP
    per_pod_mig: Any = SKIP
    per_pod_eq: Any = SKIP
    mig_single: Any = SKIP  # per_pod (or total) mig_single.status, or None for a null mig_single
    kai: Any = SKIP  # subset of per_pod.kai
    hami: Any = SKIP  # subset of per_pod.hami
    dra: Any = SKIP  # {"gpus": ..., "claims": [subset, ...]} checked on per_pod.dra
    gpu_memory_mib: Any = SKIP  # total
    per_pod_gpu_memory_mib: Any = SKIP
    vendors: Any = SKIP  # total.vendors (compared sorted)
    unrecognized: str | None = None  # substring that total.unrecognized must contain
    generic: bool = False
    namespace: Any = SKIP
    source_doc: Any = SKIP  # document index in `source`
    templates: tuple[Tpl, ...] = ()


@dataclass(frozen=True)
class Case:
    file: str
    objects: tuple[Want, ...]


NV = "nvidia.com/gpu"

CASES: list[Case] = [
    Case(
        "dcgm__nbody-pod-burstable-cpu.yaml",
        (
            # Pod, limits nvidia.com/gpu: 1 only (request defaults to the limit: valid) -> 1 GPU.
            Want(
                "Pod",
                "nbody-pod",
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                per_pod_gpus={NV: 1},
                mig_single="unknown",
                vendors=["nvidia"],
            ),
        ),
    ),
    Case(
        "dradriver__pod-two-gpus-resourceclaimtemplate.yaml",
        (
            # Doc 0 Namespace, doc 1 ResourceClaimTemplate double-gpu (count 2), doc 2 the Pod.
            # Claim twogpus -> template double-gpu (same input) -> 2 GPUs, 2.0 equivalents.
            # No extended resource: gpus {}; no nvidia.com/gpu -> mig_single null.
            # Device class gpu.nvidia.com -> vendor nvidia (as nvidia.com/gpu -> nvidia).
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={},
                eq=2.0,
                namespace="gpu-test1",
                source_doc=2,
                mig_single=None,
                vendors=["nvidia"],
                dra={
                    "gpus": 2,
                    "claims": [
                        {
                            "name": "twogpus",
                            "template": "double-gpu",
                            "device_class": "gpu.nvidia.com",
                            "count": 2,
                        }
                    ],
                },
            ),
        ),
    ),
    Case(
        "gke__vllm-gemma3-27b-a100-deployment.yaml",
        (
            # `nvidia.com/gpu : "2"` is the key nvidia.com/gpu; requests == limits == 2; 1 replica.
            # nodeSelector gke-accelerator nvidia-tesla-a100 (MIG-capable model, no partition size):
            # neither pinned to a MIG profile nor to a product without MIG -> "unknown".
            # /dev/shm is an emptyDir, not a hostPath -> no unrequested access.
            Want(
                "Deployment",
                "vllm-gemma-deployment",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                per_pod_gpus={NV: 2},
                mig_single="unknown",
                vendors=["nvidia"],
                source_doc=0,
            ),
        ),
    ),
    Case(
        "gpuop__cuda-vector-add-legacy-pod.yaml",
        (
            # limits nvidia.com/gpu: 1 -> 1 GPU.
            Want(
                "Pod",
                "gpu-operator-test",
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                per_pod_gpus={NV: 1},
                mig_single="unknown",
                vendors=["nvidia"],
            ),
        ),
    ),
    Case(
        "gpuop__mps-deployment-sharing-strategy-nodeselector.yaml",
        (
            # 4 replicas x 1 nvidia.com/gpu = 4, but nodeSelector sharing-strategy=mps -> shared
            # replicas; replica count unknown without --shared-replicas -> equivalents None.
            Want(
                "Deployment",
                "nvidia-plugin-mps-test",
                replicas=4,
                requested=True,
                gpus={NV: 4},
                eq=None,
                shared=True,
                per_pod_gpus={NV: 1},
                per_pod_eq=None,
            ),
        ),
    ),
    Case(
        "gpuop__timeslicing-mps-plugin-configmap.yaml",
        (
            # Only a ConfigMap: no workload, nothing requested.
        ),
    ),
    Case(
        "hami__default-use-gpumem-gpucores.yaml",
        (
            # HAMi: gpu 2, gpumem 3000 MiB/GPU, gpucores 30% -> 0.30 x 2 = 0.6 equivalents;
            # gpu_memory_mib = 3000 x 2 = 6000. gpus counts only nvidia.com/gpu.
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=0.6,
                shared=True,
                per_pod_gpus={NV: 2},
                gpu_memory_mib=6000,
                hami={"gpus": 2, "gpumem_mib": 3000, "gpumem_percentage": None, "gpucores": 30},
            ),
        ),
    ),
    Case(
        "hami__dynamic-mig-annotation.yaml",
        (
            # HAMi: gpu 2 + gpumem 8000 without gpucores / percentage -> memory share unknown
            # (needs the GPU's memory size) -> equivalents None; gpu_memory_mib = 8000 x 2 = 16000.
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=None,
                shared=True,
                per_pod_gpus={NV: 2},
                gpu_memory_mib=16000,
                hami={"gpus": 2, "gpumem_mib": 8000, "gpumem_percentage": None, "gpucores": None},
            ),
        ),
    ),
    Case(
        "hami__gpumem-percentage.yaml",
        (
            # HAMi: gpu 2 + gpumem-percentage 50 + gpucores 30 -> gpucores wins: 0.30 x 2 = 0.6.
            # No MiB given -> gpu_memory_mib None.
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=0.6,
                shared=True,
                per_pod_gpus={NV: 2},
                gpu_memory_mib=None,
                hami={"gpus": 2, "gpumem_mib": None, "gpumem_percentage": 50, "gpucores": 30},
            ),
        ),
    ),
    Case(
        "hami__specify-card-type-annotation.yaml",
        (
            # Only nvidia.com/gpu: 2 (use-gputype annotation picks a model, no split) -> 2 whole.
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                shared=False,
                per_pod_gpus={NV: 2},
            ),
        ),
    ),
    Case(
        "hami__static-mig-3g.20gb.yaml",
        (
            # nvidia.com/mig-3g.20gb: 1 -> mig {"3g.20gb": 1}; 3g.20gb exists only on A100-40GB
            # (7 compute slices) -> exactly 3/7, not approximate. No nvidia.com/gpu.
            Want(
                "Pod",
                "gpu-pod",
                replicas=1,
                requested=True,
                gpus={},
                mig={"3g.20gb": 1},
                eq=3 / 7,
                approximate=False,
                per_pod_mig={"3g.20gb": 1},
                mig_single=None,
                vendors=["nvidia"],
            ),
        ),
    ),
    Case(
        "hami__vllm-cross-vgpu-deployment.yaml",
        (
            # Doc 0 PVC, doc 1 Deployment (1 replica). HAMi gpu 2 + gpumem-percentage 30 +
            # gpucores 30 in requests == limits (valid) -> 0.30 x 2 = 0.6; no MiB -> memory None.
            Want(
                "Deployment",
                "vllm-cross-vgpu",
                replicas=1,
                requested=True,
                gpus={NV: 2},
                eq=0.6,
                shared=True,
                per_pod_gpus={NV: 2},
                gpu_memory_mib=None,
                source_doc=1,
                hami={"gpus": 2, "gpumem_mib": None, "gpumem_percentage": 30, "gpucores": 30},
            ),
        ),
    ),
    Case(
        "imroc__ollama-statefulset-gpu-requests-only.yaml",
        (
            # StatefulSet 1 replica; nvidia.com/gpu "1" in requests only -> invalid (no limit), and
            # "the larger of the two is counted" -> 1 GPU. Init container has no GPU / no access.
            Want(
                "StatefulSet",
                "ollama",
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                invalid=NV,
                per_pod_gpus={NV: 1},
                namespace="llama",
                source_doc=0,
            ),
        ),
    ),
    Case(
        "imroc__ollama-statefulset-gpu-zero-request.yaml",
        (
            # nvidia.com/gpu "0" -> zero means no GPU. It is still a request without a limit for a
            # non-overcommitable resource, which the API server rejects ("Limit must be set for non
            # overcommitable resources") -> invalid names nvidia.com/gpu. No nvidia.com/gpu asked
            # for -> mig_single null.
            Want(
                "StatefulSet",
                "ollama",
                replicas=1,
                requested=False,
                gpus={},
                eq=0.0,
                invalid=NV,
                per_pod_gpus={},
                mig_single=None,
                namespace="llama",
            ),
        ),
    ),
    Case(
        "k8sdocs__example-vector-add-vendor-neutral.yaml",
        (
            # gpu-vendor.example/example-gpu is no known GPU resource -> not requested by default,
            # reported in `unrecognized`.
            Want(
                "Pod",
                "example-vector-add",
                replicas=1,
                requested=False,
                gpus={},
                unrecognized="gpu-vendor.example/example-gpu",
            ),
        ),
    ),
    Case(
        "kai__gpu-fraction-init-container.yaml",
        (
            # KAI gpu-fraction 0.5 on init container gpu-init (1 device by default) -> 0.5.
            # No resources anywhere -> gpus {}; fraction -> shared. gpu-init holds the fraction, so
            # it is not unrequested access.
            Want(
                "Pod",
                "gpu-sharing-init-container",
                replicas=1,
                requested=True,
                gpus={},
                eq=0.5,
                shared=True,
                per_pod_eq=0.5,
                mig_single=None,
                kai={"fraction": 0.5, "container": "gpu-init", "memory_mib": None},
            ),
        ),
    ),
    Case(
        "kai__gpu-fraction-mps-hostpath.yaml",
        (
            # KAI gpu-fraction 0.5 -> 0.5. hostPath /tmp/nvidia-mps is not a device path -> no
            # unrequested access (and the container holds the fraction anyway).
            Want(
                "Pod",
                "gpu-sharing-with-mps",
                replicas=1,
                requested=True,
                gpus={},
                eq=0.5,
                shared=True,
                kai={"fraction": 0.5, "memory_mib": None},
            ),
        ),
    ),
    Case(
        "kai__gpu-fraction-non-default-container.yaml",
        (
            # KAI gpu-fraction 0.5 on the 2nd container "gpu-workload" -> 0.5; sidecars: nothing.
            Want(
                "Pod",
                "gpu-sharing-non-default",
                replicas=1,
                requested=True,
                gpus={},
                eq=0.5,
                shared=True,
                kai={"fraction": 0.5, "container": "gpu-workload"},
            ),
        ),
    ),
    Case(
        "kai__gpu-memory-annotation.yaml",
        (
            # KAI gpu-memory 2000 MiB alone -> fraction unknown -> equivalents None; 2000 MiB.
            Want(
                "Pod",
                "gpu-sharing",
                replicas=1,
                requested=True,
                gpus={},
                eq=None,
                shared=True,
                gpu_memory_mib=2000,
                kai={"fraction": None, "memory_mib": 2000},
            ),
        ),
    ),
    Case(
        "kai__pytorchjob-gpu.yaml",
        (
            # PyTorchJob: Master 1 + Worker 2 = 3 pods, each limits nvidia.com/gpu "1" -> 3 GPUs.
            Want(
                "PyTorchJob",
                "pytorch-dist-mnist-nccl",
                replicas=3,
                requested=True,
                gpus={NV: 3},
                eq=3.0,
                per_pod_none=True,
                templates=(
                    Tpl(("Master",), replicas=1, gpus={NV: 1}, eq=1.0),
                    Tpl(("Worker",), replicas=2, gpus={NV: 1}, eq=1.0),
                ),
            ),
        ),
    ),
    Case(
        "kftrain__legacy-tfjob-alpha-nvidia-gpu.yaml",
        (
            # Unknown kind TfJob -> generic search finds spec.replica_specs[0].template with sibling
            # replicas 1. alpha.kubernetes.io/nvidia-gpu is obsolete: invalid, reported, NOT counted
            # -> gpus {} and (nothing counted) requested False. hostPath mounts are driver libs,
            # not /dev paths -> no unrequested access.
            Want(
                "TfJob",
                "tf-smoke-gpu",
                replicas=1,
                requested=False,
                gpus={},
                invalid="alpha.kubernetes.io/nvidia-gpu",
                generic=True,
                templates=(Tpl(("replica_specs",), replicas=1),),
            ),
        ),
    ),
    Case(
        "kftrain__pytorchjob-mnist-nccl.yaml",
        (
            # PyTorchJob: Master 1 + Worker 1 = 2 pods x 1 GPU = 2 GPUs.
            Want(
                "PyTorchJob",
                "pytorch-dist-mnist-nccl",
                replicas=2,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                per_pod_none=True,
                templates=(
                    Tpl(("Master",), replicas=1, gpus={NV: 1}),
                    Tpl(("Worker",), replicas=1, gpus={NV: 1}),
                ),
            ),
        ),
    ),
    Case(
        "kuberay__raycluster-kai-gpu-fraction.yaml",
        (
            # Docs 0, 1 Queues; doc 2 RayCluster. Head 1 (no GPU) + worker group shared-gpu 2 pods,
            # each gpu-fraction 0.5 from the template annotation -> 3 pods, 2 x 0.5 = 1.0.
            Want(
                "RayCluster",
                "raycluster-half-gpu",
                replicas=3,
                requested=True,
                gpus={},
                eq=1.0,
                shared=True,
                per_pod_none=True,
                source_doc=2,
                templates=(
                    Tpl(("headGroupSpec",), replicas=1, gpus={}, eq=0.0),
                    Tpl(
                        ("workerGroupSpecs",),
                        replicas=2,
                        gpus={},
                        eq=0.5,
                        min_replicas=2,
                        kai={"fraction": 0.5},
                    ),
                ),
            ),
        ),
    ),
    Case(
        "kuberay__rayservice-vllm-gpu.yaml",
        (
            # RayService: head 1 (no GPU) + gpu-group 1 replica x 2 GPUs -> 2 pods, 2 GPUs;
            # the worker group is autoscaled min 0 / max 4.
            Want(
                "RayService",
                "llama-3-8b",
                replicas=2,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                per_pod_none=True,
                templates=(
                    Tpl(("headGroupSpec",), replicas=1, gpus={}, eq=0.0),
                    Tpl(
                        ("workerGroupSpecs",),
                        replicas=1,
                        gpus={NV: 2},
                        eq=2.0,
                        min_replicas=0,
                        max_replicas=4,
                    ),
                ),
            ),
        ),
    ),
    Case(
        "kueue__dra-job-resourceclaim.yaml",
        (
            # Job min(parallelism 1, completions 1) = 1 pod; DRA claim "gpu" -> template gpu-claim,
            # which is NOT in the input -> count unknown: dra.gpus None, equivalents None.
            Want(
                "Job",
                "gpu-job-admit",
                replicas=1,
                requested=True,
                gpus={},
                eq=None,
                namespace="default",
                dra={
                    "gpus": None,
                    "claims": [{"name": "gpu", "template": "gpu-claim", "count": None}],
                },
            ),
        ),
    ),
    Case(
        "kueue__hami-deployment-clusterqueue.yaml",
        (
            # Docs 0-3 ResourceFlavor, ClusterQueue, Namespace, LocalQueue; doc 4 the Deployment.
            # 3 replicas x (HAMi gpu 1, gpucores 30, gpumem 1024) -> gpus 3, 3 x 0.30 = 0.9,
            # memory 1024 x 1 GPU = 1024 per pod, x 3 = 3072.
            Want(
                "Deployment",
                "gpu-burn",
                replicas=3,
                requested=True,
                gpus={NV: 3},
                eq=0.9,
                shared=True,
                per_pod_gpus={NV: 1},
                per_pod_eq=0.3,
                per_pod_gpu_memory_mib=1024,
                gpu_memory_mib=3072,
                namespace="kueue-test",
                source_doc=4,
                hami={"gpus": 1, "gpumem_mib": 1024, "gpumem_percentage": None, "gpucores": 30},
            ),
        ),
    ),
    Case(
        "kueue__multikueue-job-generatename.yaml",
        (
            # generateName only. Job parallelism 1 / completions 1 -> 1 pod; GPU 1 in requests ==
            # limits (valid). gke-nodepool selector is no product pin -> mig_single unknown.
            Want(
                "Job",
                None,
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                per_pod_gpus={NV: 1},
                mig_single="unknown",
                namespace="default",
            ),
        ),
    ),
    Case(
        "lws__vllm-gpu-leaderworkerset.yaml",
        (
            # LWS: 2 groups x (1 leader + size 2 - 1 = 1 worker) = 4 pods x 8 GPUs = 32.
            Want(
                "LeaderWorkerSet",
                "vllm",
                replicas=4,
                requested=True,
                gpus={NV: 32},
                eq=32.0,
                per_pod_none=True,
                templates=(
                    Tpl(("leaderTemplate",), replicas=2, gpus={NV: 8}, eq=8.0),
                    Tpl(("workerTemplate",), replicas=2, gpus={NV: 8}, eq=8.0),
                ),
            ),
        ),
    ),
    Case(
        "mpiop__nccl-tests-mpijob.yaml",
        (
            # MPIJob: Launcher 1 (no GPU, privileged) + Worker 2 x 8 GPUs (privileged) = 3 pods,
            # 16 GPUs. Unrequested access: only the launcher container (privileged, no GPU) -> 1.
            # privileged lists every privileged container, merged per template (lists are not
            # multiplied by replicas): Launcher/nccl + Worker/nccl -> 2 entries.
            # Worker `annotations:` is null and must not break anything.
            Want(
                "MPIJob",
                "nccl-tests",
                replicas=3,
                requested=True,
                gpus={NV: 16},
                eq=16.0,
                per_pod_none=True,
                unrequested=("privileged",),
                unrequested_container="nccl",
                privileged=2,
                privileged_paths=("Launcher", "Worker"),
                templates=(
                    Tpl(("Launcher",), replicas=1, gpus={}, eq=0.0),
                    Tpl(("Worker",), replicas=2, gpus={NV: 8}, eq=8.0),
                ),
            ),
        ),
    ),
    Case(
        "mpiop__tensorflow-benchmarks-mpijob.yaml",
        (
            # MPIJob: Launcher 1 (no GPU) + Worker 2 x 1 GPU = 3 pods, 2 GPUs.
            Want(
                "MPIJob",
                "tensorflow-benchmarks",
                replicas=3,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                per_pod_none=True,
                templates=(
                    Tpl(("Launcher",), replicas=1, gpus={}),
                    Tpl(("Worker",), replicas=2, gpus={NV: 1}),
                ),
            ),
        ),
    ),
    Case(
        "ndp__e2e-job-nbody.yaml",
        (
            # Job without parallelism/completions -> min(1, 1) = 1 pod; limits "1" -> 1 GPU.
            Want(
                "Job",
                "j-e2e-1",
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                per_pod_gpus={NV: 1},
                mig_single="unknown",
            ),
        ),
    ),
    Case(
        "ndp__gfd-daemonset-mig-mixed-privileged.yaml",
        (
            # DaemonSet: one per node -> replicas None. No GPU request. The one container is
            # privileged AND sets NVIDIA_MIG_MONITOR_DEVICES=all -> unrequested access (one entry
            # per reason or one combined entry: 1..2 entries, both reasons, same container).
            # hostPath /sys is not a device path.
            Want(
                "DaemonSet",
                "gpu-feature-discovery",
                replicas=None,
                requested=False,
                gpus={},
                eq=0.0,
                unrequested=("privileged", "NVIDIA_MIG_MONITOR_DEVICES"),
                unrequested_count=(1, 2),
                unrequested_container="gpu-feature-discovery",
                privileged=1,
                mig_single=None,
            ),
        ),
    ),
    Case(
        "triton__mig-1g.5gb-deployment.yaml",
        (
            # 3 replicas x nvidia.com/mig-1g.5gb: 1 -> mig {"1g.5gb": 3}; 1g.5gb exists only on
            # A100-40GB (7 slices) -> 1/7 per pod, 3/7 total, exact.
            Want(
                "Deployment",
                "flower",
                replicas=3,
                requested=True,
                gpus={},
                mig={"1g.5gb": 3},
                eq=3 / 7,
                approximate=False,
                per_pod_mig={"1g.5gb": 1},
                per_pod_eq=1 / 7,
                mig_single=None,
                vendors=["nvidia"],
            ),
        ),
    ),
    Case(
        "vllm__mistral-7b-amd-rocm-deployment.yaml",
        (
            # amd.com/gpu "1" requests == limits, 1 replica -> 1 AMD GPU. SYS_PTRACE is not
            # SYS_ADMIN and nothing is privileged; hostNetwork/hostIPC are not in the access rules.
            Want(
                "Deployment",
                "mistral-7b",
                replicas=1,
                requested=True,
                gpus={"amd.com/gpu": 1},
                eq=1.0,
                per_pod_gpus={"amd.com/gpu": 1},
                vendors=["amd"],
                mig_single=None,
                namespace="default",
            ),
        ),
    ),
    Case(
        "vllm__mistral-7b-nvidia-deployment.yaml",
        (
            # nvidia.com/gpu "1" requests == limits, 1 replica -> 1 GPU.
            Want(
                "Deployment",
                "mistral-7b",
                replicas=1,
                requested=True,
                gpus={NV: 1},
                eq=1.0,
                per_pod_gpus={NV: 1},
                vendors=["nvidia"],
                mig_single="unknown",
                namespace="default",
            ),
        ),
    ),
    Case(
        "volcano__vcjob-mindspore-gpu.yaml",
        (
            # Volcano Job: mpimaster 1 (no GPU) + mpiworker 2 x 1 GPU = 3 pods, 2 GPUs.
            # The trailing `---` empty document is skipped (no error).
            Want(
                "Job",
                "mindspore-gpu",
                replicas=3,
                requested=True,
                gpus={NV: 2},
                eq=2.0,
                per_pod_none=True,
                templates=(
                    Tpl(("mpimaster", "tasks[0]", "tasks.0"), replicas=1, gpus={}),
                    Tpl(("mpiworker", "tasks[1]", "tasks.1"), replicas=2, gpus={NV: 1}),
                ),
            ),
        ),
    ),
    Case(
        "volcano__vcjob-tf-benchmark-gpu.yaml",
        (
            # Volcano Job: ps 1 (no GPU) + worker 3 x 1 GPU (requests == limits) = 4 pods, 3 GPUs.
            Want(
                "Job",
                "tensorflow-benchmark-gpu",
                replicas=4,
                requested=True,
                gpus={NV: 3},
                eq=3.0,
                per_pod_none=True,
                templates=(
                    Tpl(("ps", "tasks[0]", "tasks.0"), replicas=1, gpus={}),
                    Tpl(("worker", "tasks[1]", "tasks.1"), replicas=3, gpus={NV: 1}),
                ),
            ),
        ),
    ),
]

# Hand count of objects with total.requested == true over the whole directory (one per file
# above except: the ConfigMap file, the zero-request StatefulSet, the vendor-neutral pod, the
# obsolete TfJob and the GFD DaemonSet): 37 - 5 = 32.
REQUESTED_IN_DIRECTORY = 32


# --------------------------------------------------------------------------- helpers


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    rc = main(["gpus", *args, "-o", "json"])
    out = capsys.readouterr().out
    assert out.strip(), f"gpuguard gpus printed nothing (rc={rc})"
    return rc, json.loads(out)


def _total(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("total") or {}


def _find(objects: list[dict[str, Any]], kind: str, name: str | None) -> dict[str, Any]:
    if name is None:
        hits = [o for o in objects if o.get("kind") == kind]
    else:
        hits = [o for o in objects if o.get("kind") == kind and o.get("name") == name]
    assert len(hits) == 1, (
        f"expected one {kind} {name!r}, got {len(hits)}; objects: "
        f"{[(o.get('kind'), o.get('name')) for o in objects]}"
    )
    return hits[0]


def _find_template(obj: dict[str, Any], match: tuple[str, ...]) -> dict[str, Any]:
    templates = obj.get("templates") or []
    hits = [
        t
        for t in templates
        if any(m == t.get("role") or m in str(t.get("path", "")) for m in match)
    ]
    assert len(hits) == 1, (
        f"template {match} not found once in {[(t.get('role'), t.get('path')) for t in templates]}"
    )
    return hits[0]


def _approx(value: float) -> Any:
    # The JSON output may round floats (e.g. 3/7 -> 0.428571): allow 1e-6 absolute.
    return pytest.approx(value, rel=1e-6, abs=1e-6)


def _subset(actual: dict[str, Any] | None, expected: dict[str, Any], what: str) -> None:
    assert actual is not None, f"{what} is null, expected {expected}"
    for key, value in expected.items():
        got = actual.get(key)
        if isinstance(value, float):
            assert got == _approx(value), f"{what}.{key}: {got!r} != {value!r}"
        else:
            assert got == value, f"{what}.{key}: {got!r} != {value!r}"


def _check_eq(facts: dict[str, Any], expected: Any, what: str) -> None:
    got = facts.get("gpu_equivalents")
    if expected is None:
        assert got is None, f"{what}.gpu_equivalents: {got!r} != None"
        assert facts.get("unknown"), f"{what}.unknown must say why equivalents are null"
    else:
        assert got is not None, f"{what}.gpu_equivalents is null; unknown={facts.get('unknown')}"
        assert got == _approx(expected), f"{what}.gpu_equivalents: {got!r} != {expected!r}"
        assert not facts.get("unknown"), f"{what}.unknown should be empty: {facts.get('unknown')}"


def _joined(entries: list[Any]) -> str:
    return "\n".join(json.dumps(e) if not isinstance(e, str) else e for e in entries)


def _check(obj: dict[str, Any], want: Want, fname: str) -> None:
    total = _total(obj)
    label = f"{want.kind}/{want.name}"
    assert total, f"{label}: no `total` facts"

    assert obj.get("replicas") == want.replicas, f"{label}.replicas"
    assert total.get("requested") is want.requested, f"{label}.total.requested"
    assert total.get("gpus") == want.gpus, f"{label}.total.gpus"
    assert total.get("mig") == want.mig, f"{label}.total.mig"
    assert bool(obj.get("generic")) is want.generic, f"{label}.generic"
    if want.eq is not SKIP:
        _check_eq(total, want.eq, f"{label}.total")
    if want.approximate is not SKIP:
        assert total.get("gpu_equivalents_approximate") is want.approximate, (
            f"{label}.total.gpu_equivalents_approximate"
        )
    if want.shared is not SKIP:
        assert total.get("shared") is want.shared, f"{label}.total.shared"

    invalid = total.get("invalid") or []
    if want.invalid is None:
        assert invalid == [], f"{label}.total.invalid should be empty: {invalid}"
    else:
        assert invalid, f"{label}.total.invalid should not be empty"
        assert want.invalid in _joined(invalid), f"{label}.total.invalid: {invalid}"

    access = total.get("unrequested_access") or []
    low, high = want.unrequested_count or (len(want.unrequested), len(want.unrequested))
    assert low <= len(access) <= high, f"{label}.total.unrequested_access: {access}"
    reasons = "\n".join(str(a.get("reason", "")) for a in access)
    for needle in want.unrequested:
        assert needle in reasons, f"{label}: no unrequested_access reason has {needle!r}: {access}"
    if want.unrequested_container is not None:
        assert all(a.get("container") == want.unrequested_container for a in access), (
            f"{label}.total.unrequested_access containers: {access}"
        )

    privileged = total.get("privileged") or []
    assert len(privileged) == want.privileged, f"{label}.total.privileged: {privileged}"
    for needle in want.privileged_paths:
        assert any(needle in str(p.get("path", "")) for p in privileged), (
            f"{label}.total.privileged: no entry with {needle!r} in its path: {privileged}"
        )

    if want.unrecognized is not None:
        assert want.unrecognized in _joined(total.get("unrecognized") or []), (
            f"{label}.total.unrecognized: {total.get('unrecognized')}"
        )
    if want.gpu_memory_mib is not SKIP:
        assert total.get("gpu_memory_mib") == want.gpu_memory_mib, f"{label}.total.gpu_memory_mib"
    if want.vendors is not SKIP:
        assert sorted(total.get("vendors") or []) == sorted(want.vendors), f"{label}.vendors"
    if want.namespace is not SKIP:
        assert obj.get("namespace") == want.namespace, f"{label}.namespace"
    if want.source_doc is not SKIP:
        assert f"{fname}: document {want.source_doc}" in str(obj.get("source")), (
            f"{label}.source: {obj.get('source')!r}"
        )

    per_pod = obj.get("per_pod")
    if want.per_pod_none:
        assert per_pod is None, f"{label}.per_pod should be null (several templates)"
    else:
        assert per_pod is not None, f"{label}.per_pod should not be null (one template)"
        if want.per_pod_gpus is not SKIP:
            assert per_pod.get("gpus") == want.per_pod_gpus, f"{label}.per_pod.gpus"
        if want.per_pod_mig is not SKIP:
            assert per_pod.get("mig") == want.per_pod_mig, f"{label}.per_pod.mig"
        if want.per_pod_eq is not SKIP:
            _check_eq(per_pod, want.per_pod_eq, f"{label}.per_pod")
        if want.per_pod_gpu_memory_mib is not SKIP:
            assert per_pod.get("gpu_memory_mib") == want.per_pod_gpu_memory_mib, (
                f"{label}.per_pod.gpu_memory_mib"
            )
        if want.mig_single is not SKIP:
            ms = per_pod.get("mig_single")
            if want.mig_single is None:
                assert ms is None, f"{label}.per_pod.mig_single should be null: {ms}"
            else:
                assert ms is not None, f"{label}.per_pod.mig_single is null"
                assert ms.get("status") == want.mig_single, f"{label}.per_pod.mig_single: {ms}"
        if want.kai is not SKIP:
            _subset(per_pod.get("kai"), want.kai, f"{label}.per_pod.kai")
        if want.hami is not SKIP:
            _subset(per_pod.get("hami"), want.hami, f"{label}.per_pod.hami")
        if want.dra is not SKIP:
            dra = per_pod.get("dra")
            assert dra is not None, f"{label}.per_pod.dra is null"
            assert dra.get("gpus") == want.dra["gpus"], f"{label}.per_pod.dra.gpus: {dra}"
            claims = dra.get("claims") or []
            assert len(claims) == len(want.dra["claims"]), f"{label}.per_pod.dra.claims: {dra}"
            for got, exp in zip(claims, want.dra["claims"], strict=True):
                _subset(got, exp, f"{label}.per_pod.dra.claims[]")
            # total.dra.gpus follows (x replicas; every DRA case here has 1 pod)
            tdra = total.get("dra")
            assert tdra is not None and tdra.get("gpus") == want.dra["gpus"], (
                f"{label}.total.dra: {tdra}"
            )

    for tpl in want.templates:
        t = _find_template(obj, tpl.match)
        tlabel = f"{label}.templates[{tpl.match[0]}]"
        if tpl.replicas is not SKIP:
            assert t.get("replicas") == tpl.replicas, f"{tlabel}.replicas"
        if tpl.min_replicas is not SKIP:
            assert t.get("min_replicas") == tpl.min_replicas, f"{tlabel}.min_replicas"
        if tpl.max_replicas is not SKIP:
            assert t.get("max_replicas") == tpl.max_replicas, f"{tlabel}.max_replicas"
        facts = t.get("per_pod") or {}
        if tpl.gpus is not SKIP:
            assert facts.get("gpus") == tpl.gpus, f"{tlabel}.per_pod.gpus"
        if tpl.eq is not SKIP:
            _check_eq(facts, tpl.eq, f"{tlabel}.per_pod")
        if tpl.kai is not SKIP:
            _subset(facts.get("kai"), tpl.kai, f"{tlabel}.per_pod.kai")


# --------------------------------------------------------------------------- tests


def test_table_covers_every_manifest() -> None:
    files = sorted(p.name for p in MANIFESTS.glob("*.yaml"))
    assert len(files) == 37
    assert sorted(c.file for c in CASES) == files
    assert sum(w.requested for c in CASES for w in c.objects) == REQUESTED_IN_DIRECTORY


@pytest.mark.parametrize("case", CASES, ids=[c.file.removesuffix(".yaml") for c in CASES])
def test_corpus_manifest(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _run(capsys, "-f", str(MANIFESTS / case.file))
    assert rc == 0
    assert data.get("errors") == []
    objects = data.get("objects")
    assert isinstance(objects, list)

    for want in case.objects:
        _check(_find(objects, want.kind, want.name), want, case.file)

    # Nothing else in the file asks for a GPU.
    requested = sorted(
        (o.get("kind"), o.get("name") or "") for o in objects if _total(o).get("requested")
    )
    expected = sorted((w.kind, w.name or "") for w in case.objects if w.requested)
    if any(w.name is None for w in case.objects):  # generateName: compare kinds only
        requested = sorted(k for k, _ in requested)
        expected = sorted(k for k, _ in expected)
    assert requested == expected


def test_whole_directory(capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _run(capsys, "-f", str(MANIFESTS))
    assert rc == 0
    assert data.get("errors") == []
    requested = [o for o in data["objects"] if _total(o).get("requested")]
    by_file = Counter(str(o.get("source", "")).split(":")[0].rsplit("/", 1)[-1] for o in requested)
    expected = Counter(c.file for c in CASES for w in c.objects if w.requested)
    assert by_file == expected
    assert len(requested) == REQUESTED_IN_DIRECTORY


BAD_INPUT = """\
apiVersion: v1
kind: Pod
metadata:
  name: good-pod
spec:
  containers:
  - name: c
    image: busybox
    resources:
      limits:
        nvidia.com/gpu: 1
---
apiVersion: v1
kind: Pod
metadata: {name: [unclosed
---
apiVersion: v1
metadata:
  name: no-kind
"""


def test_bad_documents_are_reported_and_good_ones_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(BAD_INPUT, encoding="utf-8")
    rc, data = _run(capsys, "-f", str(path))
    assert rc == 2
    errors = data.get("errors")
    assert isinstance(errors, list)
    assert len(errors) == 2, errors
    for error, index in zip(errors, (1, 2), strict=True):
        assert "\n" not in error, error
        assert "mixed.yaml" in error, error
        assert f"document {index}" in error, error
    assert "kind" in errors[1], errors[1]
    pod = _find(data["objects"], "Pod", "good-pod")
    assert _total(pod).get("requested") is True
    assert _total(pod).get("gpus") == {NV: 1}
    assert pod.get("replicas") == 1
