"""The registry of workload kinds: every API resource gpuguard knows to carry pod templates.

One row per kind — API group, version, plural, and where its pod templates live — so that the
review's resource names, the default ``match.resources`` of a GPUPolicy, the webhook prefilter
(and through it deploy/base/webhooks.yaml's rules, which tests/core/test_workload_kinds.py keeps
in step), the auditor's lists and the tests all read the same table. Sources of the facts: the
Kubernetes API reference (core, apps, batch), and each project's CRDs (Kubeflow training-operator
v1, MPI operator v2beta1 and Trainer v1alpha1, KubeRay v1, LeaderWorkerSet v1 and its
DisaggregatedSet v1, JobSet v1alpha2, Volcano v1alpha1 and v1beta1, KServe v1beta1 / v1alpha1 and
KFServing v1alpha2, Kueue v1beta1, KubeVirt v1 and ``pool.kubevirt.io/v1alpha1``, NVIDIA NIM
operator ``apps.nvidia.com/v1alpha1``
``api/apps/v1alpha1/{nimservice,dra}_types.go``, KAITO ``kaito.sh/v1beta1`` ``api/v1beta1/
{workspace,inferenceset}_types.go`` and its ``examples/mig``).

A kind keeps what makes its pods in one of three shapes, each a list of locations:

- ``templates``: PodTemplateSpecs (``{metadata, spec}``), as Deployments do;
- ``pod_specs``: bare PodSpecs (``{containers, ...}``), as KServe's components do;
- ``resources``: resource blocks that stand for one pod's containers — ResourceRequirements
  (``{limits, requests}``: Trainer's ``resourcesPerNode``, KServe model blocks' ``resources``) or a
  bare ResourceList (Volcano PodGroup ``minResources``).

and two operator fields that ask for accelerators without a resource name or a PodSpec:

- ``claim_refs``: lists of DRA claim references the operator writes into its pods'
  ``spec.resourceClaims`` (NIM operator ``draResources[]``: ``resourceClaimName``,
  ``resourceClaimTemplateName``, or a ``claimSpec`` it turns into a ResourceClaimTemplate);
- ``mig_requests``: MIG slices asked by profile (KAITO ``resource.mig``: ``{profile, count}``,
  one pod asking ``count`` instances of ``profile``, the device plugin's mixed-strategy
  ``nvidia.com/mig-<profile>``).

Locations are written ``a.b`` for fields, ``a[]`` for every element of a list, ``a.*`` for every
value of a map, and ``""`` for the object itself (a Pod; a KubeVirt VMI, whose spec holds
resourceClaims like a pod's). :mod:`policies.facts.workloads` reads the objects; each path it
reports is one of these locations (tests/core/test_prefilter.py checks it).

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
        templates: where its PodTemplateSpecs are (notation in the module docstring).
        pod_specs: where its bare PodSpecs are.
        resources: where its resource blocks are (ResourceRequirements or a ResourceList).
        claim_refs: where an operator lists DRA claim references for its pods.
        mig_requests: where an operator asks for MIG slices as ``{profile, count}``.
        devices: where a KubeVirt domain lists devices (``spec.template.spec.domain.devices``).
        replica_specs: the Kubeflow ``<x>ReplicaSpecs`` field, for the training operators.
        derived: made by a scheduler for a workload that is judged itself (Kueue Workload,
            Volcano PodGroup): its GPUs are read (``gpuguard gpus``), but default GPUPolicy
            matching, the webhook rules and the auditor's lists leave it out, so a job is never
            judged or counted twice.
    """

    kind: str
    group: str
    version: str
    plural: str
    templates: tuple[str, ...]
    devices: tuple[str, ...] = ()
    replica_specs: str = ""
    pod_specs: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    derived: bool = False
    claim_refs: tuple[str, ...] = ()
    mig_requests: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``group/version`` (``version`` alone for core)."""
        return f"{self.group}/{self.version}" if self.group else self.version


_RAY_CLUSTER = ("headGroupSpec.template", "workerGroupSpecs[].template")


_KSERVE_COMPONENTS = ("spec.predictor", "spec.transformer", "spec.explainer")
# KFServing v1alpha1 wrote the framework under the endpoint (spec.default.tensorflow), v1alpha2
# under a component (spec.default.predictor.tensorflow); "custom" holds a container.
_KFSERVICE_BLOCKS = tuple(
    f"spec.{endpoint}{component}.*.resources" for endpoint in ("default", "canary")
    for component in ("", ".predictor", ".transformer", ".explainer"))


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
    WorkloadKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", (),
                 resources=("spec.trainer.resourcesPerNode",)),
    WorkloadKind("InferenceService", "serving.kserve.io", "v1beta1", "inferenceservices", (),
                 pod_specs=(*_KSERVE_COMPONENTS, "spec.predictor.workerSpec"),
                 resources=tuple(f"{c}.*.resources" for c in _KSERVE_COMPONENTS)),
    WorkloadKind("LLMInferenceService", "serving.kserve.io", "v1alpha1", "llminferenceservices",
                 (), pod_specs=("spec.template", "spec.worker", "spec.prefill.template",
                                "spec.prefill.worker")),
    WorkloadKind("KFService", "serving.kubeflow.org", "v1alpha2", "kfservices", (),
                 resources=_KFSERVICE_BLOCKS),
    WorkloadKind("DisaggregatedSet", "disaggregatedset.x-k8s.io", "v1", "disaggregatedsets",
                 ("spec.roles[].spec.leaderWorkerTemplate.leaderTemplate",
                  "spec.roles[].spec.leaderWorkerTemplate.workerTemplate")),
    WorkloadKind("NIMService", "apps.nvidia.com", "v1alpha1", "nimservices", (),
                 resources=("spec.resources",), claim_refs=("spec.draResources",)),
    # KAITO's Go type keeps resource / inference at the top level; its published MIG examples
    # (examples/mig/workspace-mig.yaml) write them under spec: both are read.
    WorkloadKind("Workspace", "kaito.sh", "v1beta1", "workspaces",
                 ("inference.template", "spec.inference.template"),
                 mig_requests=("resource.mig", "spec.resource.mig")),
    WorkloadKind("InferenceSet", "kaito.sh", "v1beta1", "inferencesets",
                 ("spec.template.inference.template",),
                 mig_requests=("spec.template.resource.mig",)),
    WorkloadKind("VirtualMachine", "kubevirt.io", "v1", "virtualmachines", ("spec.template",),
                 devices=("spec.template.spec.domain.devices",)),
    WorkloadKind("VirtualMachineInstance", "kubevirt.io", "v1", "virtualmachineinstances", ("",),
                 devices=("spec.domain.devices",)),
    # A pool keeps VirtualMachines (spec.virtualMachineTemplate), a replica set VMIs
    # (spec.template), spec.replicas of them; pool.kubevirt.io v1alpha1 is served by every
    # KubeVirt release with pools (v1beta1 from 1.7 too).
    WorkloadKind("VirtualMachinePool", "pool.kubevirt.io", "v1alpha1", "virtualmachinepools",
                 ("spec.virtualMachineTemplate.spec.template",),
                 devices=("spec.virtualMachineTemplate.spec.template.spec.domain.devices",)),
    WorkloadKind("VirtualMachineInstanceReplicaSet", "kubevirt.io", "v1",
                 "virtualmachineinstancereplicasets", ("spec.template",),
                 devices=("spec.template.spec.domain.devices",)),
    WorkloadKind("Workload", "kueue.x-k8s.io", "v1beta1", "workloads",
                 ("spec.podSets[].template",), derived=True),
    WorkloadKind("PodGroup", "scheduling.volcano.sh", "v1beta1", "podgroups", (),
                 resources=("spec.minResources",), derived=True),
)
"""Every workload kind gpuguard understands, in the order the auditor lists them."""

JUDGED_KINDS: Final[tuple[WorkloadKind, ...]] = tuple(k for k in WORKLOAD_KINDS if not k.derived)
"""The kinds judged and counted in their own right (all but the ``derived`` ones)."""

EPHEMERAL_CONTAINERS: Final = "pods/ephemeralcontainers"
"""The subresource ``kubectl debug`` writes: it adds containers to a running Pod."""

DEFAULT_RESOURCES: Final[tuple[str, ...]] = tuple(dict.fromkeys(
    (*(k.plural for k in JUDGED_KINDS if k.plural == "pods"), EPHEMERAL_CONTAINERS,
     *(k.plural for k in JUDGED_KINDS if k.plural != "pods"))))
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
