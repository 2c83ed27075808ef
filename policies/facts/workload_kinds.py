"""The registry of workload kinds: every API resource gpuguard knows to carry pod templates.

One row per kind — API group, version, plural, and where its pod templates live — so that the
review's resource names, the default ``match.resources`` of a GPUPolicy, the webhook prefilter,
the auditor's lists and the tests all read the same table. Sources of the facts: the Kubernetes
API reference (core, apps, batch), and each project's CRDs (Kubeflow training-operator v1 and
MPI operator v2beta1, KubeRay v1, LeaderWorkerSet v1, JobSet v1alpha2, Volcano v1alpha1,
KubeVirt v1).

Template locations are written ``a.b`` for fields, ``a[]`` for every element of a list, ``a.*``
for every value of a map, and ``""`` for the object itself (a Pod; a KubeVirt VMI, whose spec
holds resourceClaims like a pod's).

Must not read objects (that is :mod:`policies.facts.workloads`) nor import anything above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class WorkloadKind:
    """One API resource that makes pods (or is one).

    Attributes:
        kind: ``kind`` as written in objects (``PyTorchJob``).
        group / version: the API group (``""`` for core) and the served version the auditor lists.
        plural: the resource name in URLs and AdmissionRequest.resource (``pytorchjobs``).
        templates: where its pod templates are (notation in the module docstring).
        devices: where a KubeVirt domain lists devices (``spec.template.spec.domain.devices``).
        replica_specs: the Kubeflow ``<x>ReplicaSpecs`` field, for the training operators.
    """

    kind: str
    group: str
    version: str
    plural: str
    templates: tuple[str, ...]
    devices: tuple[str, ...] = ()
    replica_specs: str = ""

    @property
    def api_version(self) -> str:
        """``group/version`` (``version`` alone for core)."""
        return f"{self.group}/{self.version}" if self.group else self.version


_RAY_CLUSTER = ("headGroupSpec.template", "workerGroupSpecs[].template")


def _kubeflow(kind: str, version: str, replica_specs: str) -> WorkloadKind:
    return WorkloadKind(kind, "kubeflow.org", version, f"{kind.lower()}s",
                        (f"spec.{replica_specs}.*.template",), replica_specs=replica_specs)


WORKLOAD_KINDS: Final[tuple[WorkloadKind, ...]] = (
    WorkloadKind("Pod", "", "v1", "pods", ("",)),
    WorkloadKind("PodTemplate", "", "v1", "podtemplates", ("template",)),
    WorkloadKind("Deployment", "apps", "v1", "deployments", ("spec.template",)),
    WorkloadKind("ReplicaSet", "apps", "v1", "replicasets", ("spec.template",)),
    WorkloadKind("StatefulSet", "apps", "v1", "statefulsets", ("spec.template",)),
    WorkloadKind("DaemonSet", "apps", "v1", "daemonsets", ("spec.template",)),
    WorkloadKind("CronJob", "batch", "v1", "cronjobs", ("spec.jobTemplate.spec.template",)),
    WorkloadKind("Job", "batch", "v1", "jobs", ("spec.template",)),
    WorkloadKind("ReplicationController", "", "v1", "replicationcontrollers", ("spec.template",)),
    WorkloadKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets",
                 ("spec.leaderWorkerTemplate.leaderTemplate",
                  "spec.leaderWorkerTemplate.workerTemplate")),
    WorkloadKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets",
                 ("spec.replicatedJobs[].template.spec.template",)),
    _kubeflow("PyTorchJob", "v1", "pytorchReplicaSpecs"),
    _kubeflow("TFJob", "v1", "tfReplicaSpecs"),
    _kubeflow("MPIJob", "v2beta1", "mpiReplicaSpecs"),
    _kubeflow("XGBoostJob", "v1", "xgbReplicaSpecs"),
    _kubeflow("PaddleJob", "v1", "paddleReplicaSpecs"),
    _kubeflow("JAXJob", "v1", "jaxReplicaSpecs"),
    _kubeflow("MXJob", "v1", "mxReplicaSpecs"),
    WorkloadKind("RayCluster", "ray.io", "v1", "rayclusters",
                 tuple(f"spec.{p}" for p in _RAY_CLUSTER)),
    WorkloadKind("RayJob", "ray.io", "v1", "rayjobs",
                 tuple(f"spec.rayClusterSpec.{p}" for p in _RAY_CLUSTER)),
    WorkloadKind("RayService", "ray.io", "v1", "rayservices",
                 tuple(f"spec.rayClusterConfig.{p}" for p in _RAY_CLUSTER)),
    WorkloadKind("Job", "batch.volcano.sh", "v1alpha1", "jobs", ("spec.tasks[].template",)),
    WorkloadKind("VirtualMachine", "kubevirt.io", "v1", "virtualmachines", ("spec.template",),
                 devices=("spec.template.spec.domain.devices",)),
    WorkloadKind("VirtualMachineInstance", "kubevirt.io", "v1", "virtualmachineinstances", ("",),
                 devices=("spec.domain.devices",)),
)
"""Every workload kind gpuguard understands, in the order the auditor lists them."""

EPHEMERAL_CONTAINERS: Final = "pods/ephemeralcontainers"
"""The subresource ``kubectl debug`` writes: it adds containers to a running Pod."""

DEFAULT_RESOURCES: Final[tuple[str, ...]] = tuple(dict.fromkeys(
    (*(k.plural for k in WORKLOAD_KINDS if k.plural == "pods"), EPHEMERAL_CONTAINERS,
     *(k.plural for k in WORKLOAD_KINDS if k.plural != "pods"))))
"""What a GPUPolicy matches when ``match.resources`` is left out: every workload kind's plural,
and pods' ephemeral containers (subresources otherwise match only when listed)."""

PLURALS: Final[dict[str, str]] = {
    **{k.kind: k.plural for k in WORKLOAD_KINDS}, "Namespace": "namespaces", "Node": "nodes",
}
"""The plural resource name of each known kind (``Job`` is ``jobs`` in batch and Volcano alike)."""


def by_resource(group: str, plural: str) -> WorkloadKind | None:
    """The workload kind served as ``group``/``plural``, or None."""
    return _BY_RESOURCE.get((group, plural))


_BY_RESOURCE: Final = {(k.group, k.plural): k for k in WORKLOAD_KINDS}
