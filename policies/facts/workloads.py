"""Pod templates inside workload objects, and the replica arithmetic that turns them into pods.

Owns the knowledge of where each workload kind keeps its pod template(s) and how many pods each
template becomes: core kinds (Pod, Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob),
Kubeflow training jobs and Trainer TrainJob (``spec.trainer.resourcesPerNode`` times ``numNodes``),
KubeRay, LeaderWorkerSet and DisaggregatedSet (``spec.roles[].spec``, each an LWS spec), Volcano
Job and PodGroup (``spec.minResources``), JobSet, KServe InferenceService / LLMInferenceService
(bare PodSpecs) and KFServing KFService, Kueue Workload (``spec.podSets[]``), KubeVirt, and a
structural search of any other object for PodTemplateSpecs, bare PodSpecs and resource blocks
(``generic``: the kind is not modelled). The locations of each kind are those of the registry,
:mod:`policies.facts.workload_kinds`. Also counts the pods that share each DRA ResourceClaim
(:func:`dra_index_of`). The rules are listed in ``docs/gpu-facts.md``; field names follow each
project's API reference.

Must not decide GPU semantics (that is :mod:`policies.facts.gpu`) or read files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from policies.facts.dra import (
    DRA_KINDS,
    DraIndex,
    claim_devices,
    dra_objects,
    is_claim_object,
)
from policies.facts.gpu import (
    GPUFacts,
    claim_object_facts,
    merge,
    pod_facts,
    virtual_machine_facts,
)
from policies.facts.identity import NAME_FIELDS, identity_problems
from policies.facts.nodes import mig_resource_suffix
from policies.facts.quantity import MAX_COUNT
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings, ResourceKind, classify
from policies.facts.workload_kinds import WORKLOAD_KINDS
from policies.json_fields import as_mapping
from policies.sources import shortened
from policies.value_words import described

KUBEFLOW_REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "MXJob": "mxReplicaSpecs",
}
_REPLICATED = ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController")
_RAY = {"RayCluster": (), "RayService": ("rayClusterConfig",), "RayJob": ("rayClusterSpec",)}

TEMPLATE = "template"
"""``PodTemplate.shape`` of a PodTemplateSpec (``{metadata, spec}``)."""
POD_SPEC = "podSpec"
"""``PodTemplate.shape`` of a bare PodSpec: no metadata of its own."""
RESOURCES = "resources"
"""``PodTemplate.shape`` of a resource block standing for one pod's containers: nothing a pod
template shortcut could change."""


@dataclass(frozen=True)
class PodTemplate:
    """One pod template and how many pods it becomes.

    Attributes:
        path: field path of the template (``spec.template``; ``""`` for a Pod itself).
        spec_path: field path of its PodSpec (``spec.template.spec``).
        role: the replica group (``Worker``, ``leader``, a Ray group, a Volcano task) or ``""``.
        replicas: pods made from it; None for one per node (DaemonSet).
        min_replicas / max_replicas: autoscaling bounds where the kind has them (KubeRay).
        metadata / spec: the template's metadata and PodSpec.
        shape: :data:`TEMPLATE`, :data:`POD_SPEC` or :data:`RESOURCES` (what lies at ``path``:
            ``spec`` is then a PodSpec made of one container holding the block).
        claims_path: where the operator field that ``spec.resourceClaims`` stands for lies (NIM
            ``spec.draResources``), for the facts' paths; None for a real PodSpec.
        generated_claims: ``(name, ResourceClaimTemplate)`` the operator makes for the pods (NIM
            ``draResources[].claimSpec``), resolved like the input's own templates.
    """

    path: str
    spec_path: str
    role: str
    replicas: int | None
    min_replicas: int | None
    max_replicas: int | None
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    shape: str = TEMPLATE
    claims_path: str | None = None
    generated_claims: tuple[tuple[str, Mapping[str, Any]], ...] = ()


@dataclass(frozen=True)
class Workload:
    """A Kubernetes object that makes pods, with its templates.

    ``generic`` is True when the kind is not known and templates were found by searching;
    ``invalid`` lists replica fields that are not usable numbers.
    """

    kind: str
    api_version: str
    namespace: str | None
    name: str | None
    generic: bool
    templates: tuple[PodTemplate, ...]
    invalid: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()  # accelerators asked for outside any template, count unknown
    vm_domain_path: str | None = None  # KubeVirt: GPUs come from domain.devices, not a PodSpec
    stopped: str | None = None  # KubeVirt: the field that keeps the VM(s) stopped (no pods)

    @property
    def not_modelled(self) -> str | None:
        """For a ``generic`` workload, the word every report gives: the kind is not one gpuguard
        models, and where the search found what it counted; None for a known kind."""
        if not self.generic:
            return None
        group = self.api_version.rpartition("/")[0] or "core"
        paths = ", ".join(t.path or "(the object)" for t in self.templates)
        return (f"{self.kind or '(no kind)'} ({group}): kind not modelled; judged from what a "
                f"search found at {paths}")

    @property
    def replicas(self) -> int | None:
        """Total pods over all templates; None when some template runs one pod per node."""
        counts = [t.replicas for t in self.templates]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


@dataclass(frozen=True)
class WorkloadFacts:
    """GPU facts of a workload: per template (one pod) and the total over all its pods."""

    workload: Workload
    per_template: tuple[GPUFacts, ...]
    total: GPUFacts

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``gpuguard gpus -o json`` (see ``docs/gpu-facts.md``)."""
        w = self.workload
        return {
            "kind": w.kind,
            "apiVersion": w.api_version,
            "namespace": w.namespace,
            "name": w.name,
            "generic": w.generic,
            "not_modelled": w.not_modelled,
            "replicas": w.replicas,
            "per_pod": self.per_template[0].to_dict() if len(self.per_template) == 1 else None,
            "templates": [
                {
                    "path": t.path,
                    "role": t.role,
                    "replicas": t.replicas,
                    "min_replicas": t.min_replicas,
                    "max_replicas": t.max_replicas,
                    "per_pod": f.to_dict(),
                }
                for t, f in zip(w.templates, self.per_template, strict=True)
            ],
            "total": self.total.to_dict(),
        }


class _Identity(TypedDict):
    """The :class:`Workload` fields read from ``kind``, ``apiVersion`` and ``metadata``."""

    kind: str
    api_version: str
    namespace: str | None
    name: str | None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class _Replicas:
    """Reads replica-like integer fields, recording the unusable ones."""

    def __init__(self) -> None:
        self.invalid: list[str] = []
        self.unknown: list[str] = []  # GPUs the object asks for whose count it does not state

    def read(
        self, owner: Mapping[str, Any], key: str, path: str, default: int | None
    ) -> int | None:
        """``owner[key]`` as a non-negative int, else ``default`` (recording a bad value)."""
        value = owner.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            self.invalid.append(f"{path}.{key}: expected a non-negative integer, got "
                                f"{shortened(repr(value))}")
            return default
        return value

    def map(self, owner: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        """``owner[key]`` as a map (``{}`` when absent), recording any other type."""
        value = owner.get(key)
        if value is None or isinstance(value, Mapping):
            return value or {}
        where = f"{path}.{key}" if path else key
        self.invalid.append(f"{where}: expected a map, got {described(value)}")
        return {}

    def list(self, owner: Mapping[str, Any], key: str, path: str) -> list[Any]:
        """``owner[key]`` as a list (``[]`` when absent), recording any other type."""
        value = owner.get(key)
        if value is None or isinstance(value, list):
            return value or []
        where = f"{path}.{key}" if path else key
        self.invalid.append(f"{where}: expected a list, got {described(value)}")
        return []


def _template(
    reader: _Replicas,
    template: Any,
    path: str,
    role: str,
    replicas: int | None,
    bounds: tuple[int | None, int | None] = (None, None),
) -> PodTemplate:
    if template is not None and not isinstance(template, Mapping):
        reader.invalid.append(f"{path}: expected a pod template map, got {described(template)}")
    template = as_mapping(template)
    return PodTemplate(
        path=path,
        spec_path=f"{path}.spec",
        role=role,
        replicas=replicas,
        min_replicas=bounds[0],
        max_replicas=bounds[1],
        metadata=reader.map(template, "metadata", path),
        spec=reader.map(template, "spec", path),
    )


def _job_pods(job_spec: Mapping[str, Any], path: str, reader: _Replicas) -> int:
    """Pods a Job runs at once: parallelism (default 1), capped by completions when set."""
    parallelism = reader.read(job_spec, "parallelism", path, 1) or 0
    completions = reader.read(job_spec, "completions", path, None)
    return parallelism if completions is None else min(parallelism, completions)


def _known_templates(obj: Mapping[str, Any], reader: _Replicas) -> list[PodTemplate] | None:
    """Templates of a known kind, or None when the kind is not one gpuguard knows."""
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else ""
    api_version = str(obj.get("apiVersion", ""))
    spec = reader.map(obj, "spec", "")
    if kind == "Pod":
        return [PodTemplate("", "spec", "", 1, None, None, as_mapping(obj.get("metadata")), spec)]
    if kind == "PodTemplate":
        return [_template(reader, obj.get("template"), "template", "", 1)]
    if kind in _REPLICATED:
        return [
            _template(
                reader,
                spec.get("template"),
                "spec.template",
                "",
                reader.read(spec, "replicas", "spec", 1),
            )
        ]
    if kind == "DaemonSet":
        return [_template(reader, spec.get("template"), "spec.template", "", None)]
    if kind == "Job" and api_version.startswith("batch.volcano.sh/"):
        return [
            _template(
                reader,
                as_mapping(task).get("template"),
                f"spec.tasks[{i}].template",
                str(as_mapping(task).get("name", i)),
                reader.read(as_mapping(task), "replicas", f"spec.tasks[{i}]", 1),
            )
            for i, task in enumerate(reader.list(spec, "tasks", "spec"))
        ]
    if kind == "Job":
        return [
            _template(
                reader, spec.get("template"), "spec.template", "", _job_pods(spec, "spec", reader)
            )
        ]
    if kind == "CronJob":
        job = reader.map(reader.map(spec, "jobTemplate", "spec"), "spec", "spec.jobTemplate")
        return [
            _template(
                reader,
                job.get("template"),
                "spec.jobTemplate.spec.template",
                "",
                _job_pods(job, "spec.jobTemplate.spec", reader),
            )
        ]
    if kind in KUBEFLOW_REPLICA_SPECS and api_version.startswith("kubeflow.org/"):
        key = KUBEFLOW_REPLICA_SPECS[kind]
        return [
            _template(
                reader,
                as_mapping(group).get("template"),
                f"spec.{key}.{role}.template",
                str(role),
                reader.read(as_mapping(group), "replicas", f"spec.{key}.{role}", 1),
            )
            for role, group in reader.map(spec, key, "spec").items()
        ]
    if kind in _RAY and api_version.startswith("ray.io/"):
        return _ray_templates(spec, _RAY[kind], reader)
    if kind == "LeaderWorkerSet":
        return _lws_templates(spec, reader)
    if kind == "DisaggregatedSet" and api_version.startswith("disaggregatedset.x-k8s.io/"):
        # spec.slices: independent copies of the whole role topology (default 1), each role's
        # replicas counted per slice (llm-d guides/pd-disaggregation: "4-prefill + 1-decode" per
        # slice, "8 x TP=1 prefill and 2 x TP=4 decode in total" for 2 slices).
        slices = reader.read(spec, "slices", "spec", 1) or 0
        templates = []
        for i, role in enumerate(reader.list(spec, "roles", "spec")):
            role = as_mapping(role)
            name = str(role.get("name", i))
            templates += [replace(t, replicas=None if t.replicas is None else t.replicas * slices)
                          for t in _lws_templates(reader.map(role, "spec", f"spec.roles[{i}]"),
                                                  reader, f"spec.roles[{i}].spec", name)]
        return templates
    if kind == "NIMService" and api_version.startswith("apps.nvidia.com/"):
        return [_nim_template(obj, spec, reader)]
    if kind == "Workspace" and api_version.startswith("kaito.sh/"):
        return _kaito_templates(obj, "", 1, reader) + _kaito_templates(spec, "spec", 1, reader)
    if kind == "InferenceSet" and api_version.startswith("kaito.sh/"):
        workspaces = reader.read(spec, "replicas", "spec", 1) or 0
        return _kaito_templates(reader.map(spec, "template", "spec"), "spec.template",
                                workspaces, reader)
    if kind == "TrainJob" and api_version.startswith("trainer.kubeflow.org/"):
        trainer = reader.map(spec, "trainer", "spec")
        nodes = reader.read(trainer, "numNodes", "spec.trainer", 1)
        return [_resources_template(reader.map(trainer, "resourcesPerNode", "spec.trainer"),
                                    "spec.trainer.resourcesPerNode", "trainer", nodes)]
    if kind == "KFService" and api_version.startswith("serving.kubeflow.org/"):
        return _serving_templates(spec, reader, ("default", "canary"), nested=True)
    if kind == "InferenceService" and api_version.startswith("serving.kserve.io/"):
        return _serving_templates(spec, reader, ("predictor", "transformer", "explainer"))
    if kind == "LLMInferenceService" and api_version.startswith("serving.kserve.io/"):
        # spec.template is a PodSpec. spec.worker (multi-node) is counted one pod per replica:
        # a lower bound, the group size follows spec.parallelism, which is not read.
        replicas = reader.read(spec, "replicas", "spec", 1)
        templates = [PodTemplate(f"spec.{key}", f"spec.{key}", key, replicas, None, None, {},
                                 reader.map(spec, key, "spec"), POD_SPEC)
                     for key in ("template", "worker") if key in spec]
        prefill = reader.map(spec, "prefill", "spec")  # the disaggregated prefill pool
        count = reader.read(prefill, "replicas", "spec.prefill", 1)
        templates += [PodTemplate(f"spec.prefill.{key}", f"spec.prefill.{key}", f"prefill-{key}",
                                  count, None, None, {},
                                  reader.map(prefill, key, "spec.prefill"), POD_SPEC)
                      for key in ("template", "worker") if key in prefill]
        return templates
    if kind == "Workload" and api_version.startswith("kueue.x-k8s.io/"):
        return [
            _template(
                reader,
                as_mapping(pod_set).get("template"),
                f"spec.podSets[{i}].template",
                str(as_mapping(pod_set).get("name", i)),
                reader.read(as_mapping(pod_set), "count", f"spec.podSets[{i}]", 1),
            )
            for i, pod_set in enumerate(reader.list(spec, "podSets", "spec"))
        ]
    if kind == "PodGroup" and api_version.startswith("scheduling.volcano.sh/"):
        # minResources is the whole gang's minimum, one ResourceList: counted as one pod asking
        # for all of it (the gang's pods are counted through their Volcano Job).
        minimum = reader.map(spec, "minResources", "spec")
        return [_resources_template({"requests": minimum}, "spec.minResources", "minResources",
                                    1)] if minimum else []
    if kind == "JobSet" and api_version.startswith("jobset.x-k8s.io/"):
        templates = []
        for i, group in enumerate(reader.list(spec, "replicatedJobs", "spec")):
            group = as_mapping(group)
            job = as_mapping(as_mapping(group.get("template")).get("spec"))
            path = f"spec.replicatedJobs[{i}]"
            jobs = reader.read(group, "replicas", path, 1) or 0
            templates.append(
                _template(
                    reader,
                    job.get("template"),
                    f"{path}.template.spec.template",
                    str(group.get("name", i)),
                    jobs * _job_pods(job, f"{path}.template.spec", reader),
                )
            )
        return templates
    return None


def _ray_templates(
    spec: Mapping[str, Any], cluster_path: tuple[str, ...], reader: _Replicas
) -> list[PodTemplate]:
    cluster = spec
    for key in cluster_path:
        cluster = as_mapping(cluster.get(key))
    prefix = ".".join(("spec", *cluster_path))
    templates = [
        _template(
            reader,
            as_mapping(cluster.get("headGroupSpec")).get("template"),
            f"{prefix}.headGroupSpec.template",
            "head",
            1,
        )
    ]
    groups: list[tuple[str, Any]] = [
        (f"[{i}]", g) for i, g in enumerate(_list(cluster.get("workerGroupSpecs")))]
    written = cluster.get("workerGroupSpecs")
    if isinstance(written, Mapping):  # the API server rejects it; count what the author meant
        reader.invalid.append(f"{prefix}.workerGroupSpecs: expected a list of worker groups, got "
                              "a map (counted as the one group it describes)")
        groups = [("", written)]
    for i, (suffix, group) in enumerate(groups):
        group = as_mapping(group)
        path = f"{prefix}.workerGroupSpecs{suffix}"
        low = reader.read(group, "minReplicas", path, None)
        high = reader.read(group, "maxReplicas", path, None)
        replicas = reader.read(group, "replicas", path, low if low is not None else 1) or 0
        hosts = reader.read(group, "numOfHosts", path, 1) or 0
        templates.append(
            _template(
                reader,
                group.get("template"),
                f"{path}.template",
                str(group.get("groupName", i)),
                replicas * hosts,
                (None if low is None else low * hosts, None if high is None else high * hosts),
            )
        )
    return templates


def _lws_templates(
    spec: Mapping[str, Any], reader: _Replicas, path: str = "spec", role: str = ""
) -> list[PodTemplate]:
    """A LeaderWorkerSet spec at ``path``; ``role`` prefixes the roles (DisaggregatedSet)."""
    groups = reader.read(spec, "replicas", path, 1) or 0
    lwt = as_mapping(spec.get("leaderWorkerTemplate"))
    size = reader.read(lwt, "size", f"{path}.leaderWorkerTemplate", 1) or 0
    worker = _template(
        reader,
        lwt.get("workerTemplate"),
        f"{path}.leaderWorkerTemplate.workerTemplate",
        f"{role}-worker" if role else "worker",
        groups * max(size - 1, 0),
    )
    if "leaderTemplate" not in lwt:
        return [_template(reader, lwt.get("workerTemplate"), worker.path, role or "worker",
                          groups * size)]
    leader = _template(
        reader,
        lwt.get("leaderTemplate"),
        f"{path}.leaderWorkerTemplate.leaderTemplate",
        f"{role}-leader" if role else "leader",
        groups,
    )
    return [leader, worker]


def _nim_template(
    obj: Mapping[str, Any], spec: Mapping[str, Any], reader: _Replicas
) -> PodTemplate:
    """The pods of an NVIDIA NIM operator NIMService: one model container with ``spec.resources``
    and a pod claim per ``spec.draResources[]`` entry (``resourceClaimName``,
    ``resourceClaimTemplateName``, or a ``claimSpec`` whose ``devices[]`` — ``count`` default 1,
    ``deviceClassName`` default ``gpu.nvidia.com`` — become a ResourceClaimTemplate). Pods:
    ``spec.replicas`` (default 1; ``spec.scale.hpa.minReplicas`` when ``spec.scale.enabled``),
    times ``spec.multiNode.size`` (a LeaderWorkerSet whose leader and workers each get the
    resources). Source: NIM operator ``api/apps/v1alpha1/nimservice_types.go``, ``dra_types.go``.
    """
    replicas = reader.read(spec, "replicas", "spec", 1) or 0
    scale = reader.map(spec, "scale", "spec")
    if scale.get("enabled") is True:
        replicas = reader.read(reader.map(scale, "hpa", "spec.scale"), "minReplicas",
                               "spec.scale.hpa", 1) or 0
    if spec.get("multiNode") is not None:
        replicas *= reader.read(reader.map(spec, "multiNode", "spec"), "size", "spec.multiNode",
                                1) or 0
    owner = str(as_mapping(obj.get("metadata")).get("name") or "nimservice")
    claims: list[dict[str, Any]] = []
    generated: list[tuple[str, Mapping[str, Any]]] = []
    for i, entry in enumerate(reader.list(spec, "draResources", "spec")):
        where = f"spec.draResources[{i}]"
        if not isinstance(entry, Mapping):
            reader.invalid.append(f"{where}: expected a DRA resource map, got "
                                  f"{described(entry)}")
            continue
        claim: dict[str, Any] = {"name": f"dra-resource-{i}"}
        for key in ("resourceClaimName", "resourceClaimTemplateName"):
            if isinstance(entry.get(key), str) and entry[key]:
                claim[key] = entry[key]
        if len(claim) == 1 and isinstance(entry.get("claimSpec"), Mapping):
            name = f"{owner}/{where}.claimSpec"  # a '/' no real object's name has
            claim["resourceClaimTemplateName"] = name
            generated.append((name, _nim_claim_template(entry["claimSpec"], where, reader)))
        claims.append(claim)  # neither field: _dra reports it, naming the entry
    container = {"name": "nim", "resources": spec.get("resources") or {}}
    return PodTemplate("spec.resources", "spec", "nim", replicas, None, None, {},
                       {"containers": [container], "resourceClaims": claims}, RESOURCES,
                       "spec.draResources", tuple(generated))


def _nim_claim_template(
    claim_spec: Mapping[str, Any], where: str, reader: _Replicas
) -> Mapping[str, Any]:
    """The ResourceClaimTemplate the NIM operator makes of ``draResources[].claimSpec``."""
    requests = []
    for j, device in enumerate(reader.list(claim_spec, "devices", f"{where}.claimSpec")):
        device = as_mapping(device)
        count = reader.read(device, "count", f"{where}.claimSpec.devices[{j}]", 1)
        requests.append({"name": str(device.get("name", j)), "exactly": {
            "deviceClassName": str(device.get("deviceClassName") or "gpu.nvidia.com"),
            "allocationMode": "ExactCount", "count": count}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "spec": {"spec": {"devices": {"requests": requests}}}}


def _kaito_templates(
    owner: Mapping[str, Any], path: str, workspaces: int, reader: _Replicas
) -> list[PodTemplate]:
    """A KAITO Workspace's fields at ``path`` (``resource``, ``inference``): ``resource.mig``
    (``{profile, count}``, count default 1) is a pod asking ``count`` MIG instances of
    ``profile``, as the device plugin's mixed strategy names them (``nvidia.com/mig-1g.10gb``);
    ``inference.template`` a PodTemplateSpec. Pods: ``resource.count`` GPU nodes (default 1)
    per Workspace, ``workspaces`` Workspaces (an InferenceSet's ``spec.replicas``). With neither,
    an ``inference`` / ``tuning`` preset runs on GPUs KAITO chooses: recorded as unknown (the
    Workspace asks for GPUs, their count is not in the manifest), never as none."""
    at = f"{path}." if path else ""
    resource = reader.map(owner, "resource", path)
    pods = workspaces * (reader.read(resource, "count", f"{at}resource", 1) or 0)
    templates = []
    if resource.get("mig") is not None:
        mig_request = resource["mig"]
        where = f"{at}resource.mig"
        if isinstance(mig_request, str) and mig_request:  # what the author meant: one slice
            reader.invalid.append(f"{where}: expected a map {{profile, count}}, got a string "
                                  f"(counted as profile {shortened(repr(mig_request))}, count 1)")
            mig_request = {"profile": mig_request}
        if not isinstance(mig_request, Mapping):
            reader.invalid.append(f"{where}: expected a map {{profile, count}}, got "
                                  f"{described(mig_request)}")
        elif not isinstance(mig_request.get("profile"), str) or not mig_request["profile"]:
            reader.invalid.append(f"{where}.profile: expected a MIG profile such as 1g.10gb, "
                                  f"got {shortened(repr(mig_request.get('profile')))}")
        else:
            count = reader.read(mig_request, "count", where, 1)
            name = f"nvidia.com/mig-{mig_resource_suffix(mig_request['profile'])}"
            templates.append(_resources_template({"limits": {name: count}}, where, "mig", pods))
    inference = reader.map(owner, "inference", path)
    if inference.get("template") is not None:
        templates.append(_template(reader, inference["template"], f"{at}inference.template",
                                   "inference", pods))
    if not templates:  # a preset: KAITO picks the GPUs (instanceType, the model's needs)
        for key in ("inference", "tuning"):
            preset = as_mapping(reader.map(owner, key, path).get("preset"))
            if preset:
                reader.unknown.append(
                    f"{at}{key}.preset: KAITO runs preset {shortened(repr(preset.get('name')))} "
                    f"on the GPUs of {at}resource.instanceType "
                    f"({shortened(repr(resource.get('instanceType')))}) x {pods} node(s); "
                    "how many GPUs that is, the manifest does not say")
    return templates


def _resources_template(
    resources: Any, path: str, role: str, replicas: int | None
) -> PodTemplate:
    """A pod template for a kind that gives one node's resources, not a PodSpec (Kubeflow
    Trainer ``resourcesPerNode``, KFServing ``spec.default.<framework>.resources``): one
    container named after ``role`` with those resources. ``path`` is the block's; the facts'
    paths read ``<owner>.containers[0]``, ``<owner>`` the field holding the block."""
    container = {"name": role, "resources": resources}
    spec_path = path.rpartition(".")[0]  # messages name the block's owner, as before
    return PodTemplate(path, spec_path, role, replicas, None, None, {},
                       {"containers": [container]}, RESOURCES)


_KFSERVING_COMPONENTS = ("predictor", "transformer", "explainer")


def _serving_templates(
    spec: Mapping[str, Any], reader: _Replicas, components: tuple[str, ...], *,
    nested: bool = False,
) -> list[PodTemplate]:
    """KServe InferenceService components: a PodSpec inline (``containers``), a multi-node
    ``workerSpec`` PodSpec (counted one pod per replica: a lower bound), and each model /
    framework block with ``resources``; pods ``minReplicas`` (default 1). ``nested``: KFServing
    v1alpha2, whose endpoints (``default``, ``canary``) hold the components."""
    templates = []
    for component in components:
        part = as_mapping(spec.get(component))
        if not part:
            continue
        path = f"spec.{component}"
        replicas = reader.read(part, "minReplicas", path, 1)
        if isinstance(part.get("containers"), list):
            templates.append(PodTemplate(path, path, component, replicas, None, None,
                                         {}, part, POD_SPEC))
        for key, block in part.items():
            if not isinstance(block, Mapping):
                continue
            if key == "workerSpec":
                templates.append(PodTemplate(f"{path}.{key}", f"{path}.{key}", f"{component}/"
                                             "worker", replicas, None, None, {}, block, POD_SPEC))
            elif "resources" in block:
                templates.append(_resources_template(block.get("resources"),
                                                     f"{path}.{key}.resources",
                                                     f"{component}/{key}", replicas))
            elif nested and key in _KFSERVING_COMPONENTS:
                templates += [_resources_template(inner.get("resources"),
                                                  f"{path}.{key}.{name}.resources",
                                                  f"{component}/{key}/{name}", replicas)
                              for name, inner in block.items()
                              if isinstance(inner, Mapping) and "resources" in inner]
    return templates


_NOT_SEARCHED = frozenset({"metadata", "labels", "annotations", "nodeSelector", "status"})
_COUNT_FIELDS = ("replicas", "count", "numNodes", "minReplicas")


def _gpu_names(block: Any) -> bool:
    """Whether a ResourceList names a resource the GPU registry does not call ``OTHER``."""
    return isinstance(block, Mapping) and any(
        isinstance(name, str) and classify(name) is not ResourceKind.OTHER for name in block)


def _count(owner: Mapping[str, Any], path: str, reader: _Replicas) -> int | None:
    """The first count-like sibling field of what the search found (default 1)."""
    for key in _COUNT_FIELDS:
        if key in owner:
            return reader.read(owner, key, path, 1)
    return 1


def _bare_container(value: Any) -> bool:
    """Whether ``value`` is a Container outside a PodSpec (Argo ``templates[].container`` /
    ``script``, a step of some operator): a map with a string ``image`` and a field the GPU
    facts read, and no ``containers`` of its own."""
    return isinstance(value, Mapping) and isinstance(value.get("image"), str) \
        and "containers" not in value and any(k in value for k in _CONTAINER_FIELDS)


_CONTAINER_FIELDS = ("resources", "securityContext", "env", "envFrom", "volumeMounts")


def _containers_template(owner: Mapping[str, Any], path: str, reader: _Replicas,
                         replicas: int | None) -> PodTemplate | None:
    """One pod of the bare Containers that ``owner`` (at ``path``) holds, directly or in lists
    (Argo's ``container`` / ``script`` with ``sidecars``, and ``initContainers``), or None. Its
    PodSpec has those containers (init ones as ``initContainers``), so the facts read at
    ``<path>.containers[i]`` / ``<path>.initContainers[i]``, in the order found. Pods:
    ``replicas`` when given (the owner's count field), else a count field of a container
    itself (``worker: {image, replicas: 3, resources}``), else 1."""
    spec: dict[str, list[Any]] = {}
    for key, child in owner.items():
        entries = child if isinstance(child, list) else [child]
        found = [c for c in entries if _bare_container(c)]
        if found:
            spec.setdefault("initContainers" if key == "initContainers" else "containers",
                            []).extend(found)
            if replicas is None and isinstance(child, Mapping) \
                    and any(k in child for k in _COUNT_FIELDS):
                replicas = _count(child, f"{path}.{key}" if path else str(key), reader)
    if not spec:
        return None
    return PodTemplate(path, path, str(owner.get("name", "")), replicas, None, None, {}, spec,
                       POD_SPEC)


def _search_templates(value: Any, path: str, reader: _Replicas) -> Iterator[PodTemplate]:
    """Find what makes pods in a kind gpuguard does not model, with its path: PodTemplateSpecs
    (``template.spec.containers``), bare PodSpecs (``containers``), bare Containers (a map with
    an ``image``: Argo's ``templates[].container``, judged as one pod of them with their
    siblings, :func:`_containers_template`), and resource blocks that name an accelerator —
    ResourceRequirements (``{limits, requests}``, as Trainer's ``resourcesPerNode``) or a
    ResourceList under a ``*resources`` key (as PodGroup's ``minResources``). Pods per find: a
    sibling ``replicas`` / ``count`` / ``numNodes`` / ``minReplicas`` of the template, PodSpec
    or containers' owner, else 1. Metadata, labels, node selectors and status are not
    searched."""
    if isinstance(value, Mapping):
        template = as_mapping(value.get("template"))
        if isinstance(as_mapping(template.get("spec")).get("containers"), list):
            sub = f"{path}.template" if path else "template"
            role = str(value.get("name", value.get("tf_replica_type", "")))
            yield _template(reader, template, sub, role, _count(value, path, reader))
            return
        if isinstance(value.get("containers"), list):
            yield PodTemplate(path, path, str(value.get("name", "")), 1, None, None, {}, value,
                              POD_SPEC)
            return
        owned = any(k in value for k in _COUNT_FIELDS)
        containers = _containers_template(value, path, reader,
                                          _count(value, path, reader) if owned else None)
        if containers is not None:
            yield containers if containers.replicas is not None else replace(containers,
                                                                              replicas=1)
        for key, child in value.items():
            if key in _NOT_SEARCHED or (containers is not None and (
                    _bare_container(child) or (isinstance(child, list)
                    and any(_bare_container(c) for c in child)))):
                continue
            where = f"{path}.{key}" if path else str(key)
            if isinstance(child, Mapping) and isinstance(child.get("containers"), list) \
                    and not isinstance(as_mapping(child.get("template")).get("spec"), Mapping):
                # a bare PodSpec: its pods are counted by its owner's replicas, as a template's
                yield PodTemplate(where, where, str(child.get("name", key)),
                                  _count(value, path, reader), None, None, {}, child, POD_SPEC)
            elif isinstance(child, Mapping) and (
                    _gpu_names(child.get("limits")) or _gpu_names(child.get("requests"))):
                yield _resources_template(child, where, str(key), _count(value, path, reader))
            elif str(key).lower().endswith("resources") and _gpu_names(child):
                yield _resources_template({"requests": child}, where, str(key),
                                          _count(value, path, reader))
            else:
                yield from _search_templates(child, where, reader)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _search_templates(child, f"{path}[{index}]", reader)


def _pod_fields(pod: Mapping[str, Any], reader: _Replicas) -> None:
    """Record the mistyped Pod fields that say where it runs and in what state (``spec.nodeName``,
    ``status``, ``status.phase``: read by the audit), and a Pod without containers (the API
    server requires one; without, the pod asks for nothing)."""
    status = reader.map(pod, "status", "")
    phase = status.get("phase")
    if phase is not None and not isinstance(phase, str):
        reader.invalid.append(f"status.phase: expected a string, got {described(phase)}")
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        return  # "spec: expected a map" is recorded with the templates
    spec = spec or {}
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        reader.invalid.append(f"spec.nodeName: expected a string, got {described(node)}")
    containers = spec.get("containers")
    if pod.get("spec") is None or containers is None or containers == []:
        where = "spec" if pod.get("spec") is None else "spec.containers"
        reader.invalid.append(f"{where}: required, none given (a Pod has at least one container; "
                              "without, it asks for no GPU)")


_VIRTUAL_MACHINE_KINDS = {k.kind: k for k in WORKLOAD_KINDS if k.devices}
# Where a kind's VirtualMachine spec is (runStrategy, running): a VM's own, a pool's template's.
_VM_SPEC = {"VirtualMachine": "spec", "VirtualMachinePool": "spec.virtualMachineTemplate.spec"}
# KubeVirt runStrategy values that keep a VM stopped (KubeVirt user guide, "Run Strategies").
_STOPPED = ("Halted",)


def _virtual_machines(
    obj: Mapping[str, Any], path: str, base: _Identity, reader: _Replicas
) -> Workload:
    """A KubeVirt VM, VMI, VirtualMachinePool or VirtualMachineInstanceReplicaSet: one template
    (the domain at ``path``, whose GPUs come from ``domain.devices``) and how many run now —
    ``spec.replicas`` (default 1) of a pool or replica set, 0 for a VM that is stopped
    (``runStrategy: Halted``, or ``running: false`` without a runStrategy; ``stopped`` says so)."""
    domain: Mapping[str, Any] = obj
    keys = path.split(".")
    for depth, key in enumerate(keys):  # each level must be a map (null: absent)
        domain = reader.map(domain, key, ".".join(keys[:depth]))
    kind = base["kind"]
    replicas = 1
    if kind in ("VirtualMachinePool", "VirtualMachineInstanceReplicaSet"):
        replicas = reader.read(reader.map(obj, "spec", ""), "replicas", "spec", 1) or 0
    stopped = None
    if kind in _VM_SPEC:
        vm_spec: Mapping[str, Any] = obj
        for key in _VM_SPEC[kind].split("."):
            vm_spec = as_mapping(vm_spec.get(key))
        strategy, running = vm_spec.get("runStrategy"), vm_spec.get("running")
        if strategy in _STOPPED:
            stopped = f"{_VM_SPEC[kind]}.runStrategy: {strategy}"
        elif strategy is None and running is False:
            stopped = f"{_VM_SPEC[kind]}.running: false"
        if stopped and kind == "VirtualMachinePool":
            stopped += f" ({replicas} VM(s))"
    vm = PodTemplate(path, path, "virt-launcher", 0 if stopped else replicas, None, None, {},
                     domain)
    return Workload(**base, generic=False, templates=(vm,), invalid=tuple(reader.invalid),
                    vm_domain_path=path, stopped=stopped)


def _identity(obj: Mapping[str, Any], reader: _Replicas) -> _Identity:
    """The kind, apiVersion, namespace and name of ``obj``; unusable fields (metadata not a map,
    no name, labels not a map, a Pod's own fields) are reported in ``reader.invalid``."""
    reader.invalid.extend(identity_problems(obj))  # the one rule of kind / metadata's types
    kind = obj.get("kind", "")
    if not isinstance(kind, str):
        kind = ""
    metadata = as_mapping(obj.get("metadata"))
    names: dict[str, str | None] = {}
    for key in NAME_FIELDS:
        value = metadata.get(key)
        names[key] = value if isinstance(value, str) and value else None
    if not names["name"] and not names["generateName"] and "metadata.name" not in " ".join(
            reader.invalid):
        # no object of the API lacks both: one that does cannot be named in any report
        reader.invalid.append("metadata.name: required, none given (neither metadata.name nor "
                              "metadata.generateName is a non-empty string)")
    if kind == "Pod":
        _pod_fields(obj, reader)
    if kind != "Pod":  # a Pod's labels and annotations are its template's: pod_facts reads them
        for key in ("labels", "annotations"):  # queue labels, KAI annotations live here too
            reader.map(metadata, key, "metadata")
    base: _Identity = {
        "kind": kind,
        "api_version": str(obj.get("apiVersion", "")),
        "namespace": names["namespace"],
        "name": names["name"] or names["generateName"],
    }
    return base


def find_workload(obj: Mapping[str, Any]) -> Workload | None:
    """Locate the pod templates of one Kubernetes object.

    Returns:
        A :class:`Workload`, or None for objects that make no pods (Service, ConfigMap, …).
        KubeVirt VirtualMachine / VirtualMachineInstance give a workload without pod templates
        whose GPUs come from ``domain.devices`` (``vm_domain_path``).
    """
    reader = _Replicas()
    base = _identity(obj, reader)
    kind = base["kind"]
    metadata = as_mapping(obj.get("metadata"))
    virtual = _VIRTUAL_MACHINE_KINDS.get(kind)
    if virtual is not None and str(obj.get("apiVersion", "")).startswith(f"{virtual.group}/"):
        return _virtual_machines(obj, virtual.devices[0].removesuffix(".devices"), base, reader)
    templates = _known_templates(obj, reader)
    generic = templates is None
    if templates is None:
        if isinstance(as_mapping(obj.get("spec")).get("containers"), list):  # a Pod-like object
            templates = [
                PodTemplate("", "spec", "", 1, None, None, metadata, as_mapping(obj.get("spec")))
            ]
        else:  # under spec only: what kubectl would apply, not a document that quotes one
            templates = list(_search_templates(obj.get("spec"), "spec", reader))
        if not templates:
            return None
    return Workload(
        **base, generic=generic, templates=tuple(templates), invalid=tuple(reader.invalid),
        unknown=tuple(reader.unknown),
    )


def claim_template_devices(obj: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(GPU device class, device count) asked by a ResourceClaimTemplate (or ResourceClaim).

    The older pair shape of :func:`policies.facts.dra.claim_devices` (the one reading of DRA
    requests: v1beta1, v1 ``exactly``, ``firstAvailable`` as one device): ``(None, 0)`` when no
    request is for a GPU; count None when unknown (``allocationMode: All``, an invalid count).
    """
    devices = claim_devices(obj)
    if devices.gpu is False:
        return None, 0
    return devices.device_class, devices.count


def claim_templates_of(
    objects: Iterable[Mapping[str, Any]],
) -> dict[tuple[str | None, str], tuple[str | None, int | None]]:
    """Index the ResourceClaimTemplates among ``objects`` by (namespace, name)."""
    index: dict[tuple[str | None, str], tuple[str | None, int | None]] = {}
    for obj in objects:
        if obj.get("kind") == "ResourceClaimTemplate" and str(obj.get("apiVersion", "")).startswith(
            "resource.k8s.io/"
        ):
            metadata = as_mapping(obj.get("metadata"))
            namespace, name = metadata.get("namespace"), metadata.get("name")
            if not isinstance(name, str) or not name:
                continue  # no pod can name it; a claim naming it is reported as not found
            index[(namespace if isinstance(namespace, str) and namespace else None, name)] = \
                claim_template_devices(obj)
    return index


def dra_index_of(objects: Iterable[Mapping[str, Any]]) -> DraIndex:
    """The DRA objects among ``objects`` (:func:`policies.facts.dra.dra_objects`) and, for each
    ResourceClaim, how many pods of ``objects`` name it (templates x replicas; a per-node
    template counts once)."""
    found = [o for o in objects if isinstance(o, Mapping)]
    index = dra_objects(found)
    users: dict[tuple[str | None, str], int] = {}
    for obj in found:
        workload = find_workload(obj) if obj.get("kind") not in DRA_KINDS else None
        if workload is None:
            continue
        for template in workload.templates:
            spec = template.spec
            if workload.vm_domain_path is not None:
                spec = _vmi_spec(obj)
            for entry in _list(spec.get("resourceClaims")):
                entry = as_mapping(entry)
                name = entry.get("resourceClaimName") or as_mapping(
                    entry.get("source")).get("resourceClaimName")
                if isinstance(name, str) and name:
                    key = (workload.namespace, name)
                    users[key] = users.get(key, 0) + (template.replicas or 1)
    return replace(index, claim_users=users)


def _vmi_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The VMI spec of a KubeVirt VirtualMachine (``spec.template.spec``) or VMI (``spec``)."""
    spec = as_mapping(obj.get("spec"))
    if obj.get("kind") == "VirtualMachine":
        spec = as_mapping(as_mapping(spec.get("template")).get("spec"))
    return spec


def _stopped_note(workload: Workload, per_vm: GPUFacts) -> str:
    """What a stopped VM (or pool of stopped VMs) would take once started."""
    claimed = per_vm.dra_gpus
    devices = "an unknown number of GPU devices" if claimed is None else \
        f"{sum(per_vm.gpus.values()) + sum(per_vm.mig.values()) + claimed} GPU device(s)"
    equivalents = per_vm.gpu_equivalents
    size = "unknown GPU-equivalents" if equivalents is None else \
        f"{float(equivalents):g} GPU-equivalent(s)"
    return (f"{workload.stopped}: stopped, so it holds no GPU now; once started each VM takes "
            f"{devices}, {size}")


def _claim_shape(obj: Mapping[str, Any], reader: _Replicas) -> None:
    """Report the unusable levels of a claim object's requests (``spec``, a template's
    ``spec.spec``, ``devices``, ``requests`` and each request): what
    :func:`policies.facts.dra.claim_devices` reads as empty."""
    spec = reader.map(obj, "spec", "")
    path = "spec"
    if obj.get("kind") == "ResourceClaimTemplate":
        spec, path = reader.map(spec, "spec", "spec"), "spec.spec"
    devices = reader.map(spec, "devices", path)
    for i, request in enumerate(reader.list(devices, "requests", f"{path}.devices")):
        if not isinstance(request, Mapping):
            reader.invalid.append(f"{path}.devices.requests[{i}]: expected a map, got "
                                  f"{described(request)}")


def workload_facts(
    obj: Mapping[str, Any],
    *,
    settings: GPUSettings = DEFAULT_SETTINGS,
    claim_templates: Mapping[tuple[str | None, str], tuple[str | None, int | None]] | None = None,
    dra: DraIndex | None = None,
) -> WorkloadFacts | None:
    """GPU facts per template and in total for one object; None when it makes no pods.

    Per-node workloads (DaemonSet) are totalled for one node. ``dra`` (:func:`dra_index_of` of
    the whole input) resolves DRA claims; without it ``claim_templates`` (the older
    ``(namespace, name) -> (GPU class, count)`` shape) does. Never raises on malformed objects:
    problems are in the facts' ``invalid``. A ResourceClaim or ResourceClaimTemplate makes no
    pods but is judged itself (:func:`policies.facts.gpu.claim_object_facts`): a workload of no
    templates (0 replicas) whose ``total`` is what a pod naming it is given.
    """
    if is_claim_object(obj):
        reader = _Replicas()
        claim = Workload(**_identity(obj, reader), generic=False, templates=())
        _claim_shape(obj, reader)
        facts = claim_object_facts(obj, settings=settings, dra=dra)
        if reader.invalid:
            facts = replace(facts, invalid=tuple(dict.fromkeys((*reader.invalid,
                                                                 *facts.invalid))))
        return WorkloadFacts(replace(claim, invalid=tuple(reader.invalid)), (), facts)
    workload = find_workload(obj)
    if workload is None:
        return None
    if workload.vm_domain_path is not None:
        vm = workload.templates[0]
        vmi = _vmi_spec(obj)
        claim_names = [str(as_mapping(c).get("name")) for c in _list(vmi.get("resourceClaims"))]
        facts = virtual_machine_facts(vm.spec, vm.path, claim_names, settings)
        if claim_names:  # KubeVirt GPUsWithDRA: the claims of the VMI spec, as a pod's
            vmi_path = "spec.template.spec" if obj.get("kind") == "VirtualMachine" else "spec"
            claimed = pod_facts({"resourceClaims": vmi.get("resourceClaims")}, spec_path=vmi_path,
                                settings=settings, claim_templates=claim_templates,
                                namespace=workload.namespace, dra=dra)
            facts = merge([facts, claimed])
        if workload.invalid:
            facts = replace(facts, invalid=tuple(dict.fromkeys(facts.invalid + workload.invalid)))
        total = facts.scaled(vm.replicas or 0) if vm.replicas != 1 else facts
        if workload.stopped and facts.requested:
            total = replace(total, warnings=(*total.warnings, _stopped_note(workload, facts)))
        return WorkloadFacts(workload, (facts,), total)
    generated = {(workload.namespace, name): claim_devices(body)
                 for t in workload.templates for name, body in t.generated_claims}
    if generated and (dra is not None or not claim_templates):  # beside the input's own
        base = dra if dra is not None else DraIndex()
        dra = replace(base, templates={**base.templates, **generated})
    per_template = tuple(
        pod_facts(
            t.spec,
            t.metadata,
            spec_path=t.spec_path,
            settings=settings,
            claim_templates=claim_templates,
            namespace=workload.namespace,
            dra=dra,
            claims_path=t.claims_path,
        )
        for t in workload.templates
    )
    total = merge(
        f.scaled(1 if t.replicas is None else t.replicas)
        for t, f in zip(workload.templates, per_template, strict=True)
    )
    if workload.invalid:
        total = replace(total, invalid=tuple(dict.fromkeys(total.invalid + workload.invalid)))
    if workload.unknown:  # requested, with GPU-equivalents unknown and the reason
        total = replace(total, unknown=tuple(dict.fromkeys(total.unknown + workload.unknown)))
    return WorkloadFacts(workload, per_template, total)
