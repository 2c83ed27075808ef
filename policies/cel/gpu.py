"""The GPU library of gpuguard's CEL: the ``gpu`` variable and the ``mig.*`` functions.

Owns how the GPU facts (:mod:`policies.facts.gpu`, :mod:`policies.facts.workloads`) look inside a
policy, so admission, audit and quota read the very same numbers, and the MIG catalog lookups
exposed as CEL functions. Every name is documented in ``docs/cel.md`` with an example.

``gpu`` (a map; absent parts are ``{}`` or ``[]``, never null, so ``has()`` and indexing are safe):

========================  =====================================================================
``requested``             bool: the object asks for any GPU of any kind (in some template,
                          even at 0 replicas: a stopped VM, a Deployment scaled to 0)
``count``                 int: devices asked for in total (the sum of ``gpus``)
``gpus``                  map resource -> int: effective devices per extended resource
``migProfiles``           map profile -> int: MIG instances per profile (``1g.10gb+me`` form)
``effectiveRequests``     map resource -> int: every GPU-related extended resource (HAMi too)
``equivalents``           double: GPU-equivalents of the parts whose size is known
``equivalentsKnown``      bool: every part's size is known (``equivalents`` is then exact)
``approximate``           bool: a MIG profile was valued without knowing the GPU model
``shared``                bool: time-slicing / MPS replica, HAMi / Volcano split, KAI fraction
``memoryMiB``             int: GPU memory asked explicitly (0 when none)
``vendors``               list of string: ``nvidia``, ``amd``, ``intel``, ...
``migSingle``             map {status, profile}: ``unknown`` / ``pinned`` / ``excluded``
``kai``, ``hami``, ``dra`` maps (see docs/gpu-facts.md), ``{}`` when absent
``unrequestedAccess``     list of {container, containerType, path, reason, certain}
``privileged``            list of {container, containerType, path, reason, certain}
``invalid``, ``warnings``, ``unknown``, ``unrecognized``  lists of string
``resourceProblems``      list of {container, containerType, path, field, resource, requests,
                          limits, problem}: the ``invalid`` entries about containers' extended
                          resources (each is ``field + ': ' + problem``), with the values as
                          written (``'not set'`` when absent)
``replicas``              int: pods the object makes (``-1``: one per node)
``templates``             list of {path, specPath, role, replicas, minReplicas, maxReplicas
                          (-1: no autoscaling bounds), requested, count, equivalents,
                          equivalentsKnown, migProfiles, gpus, metadata {labels, annotations},
                          spec}
                          per pod template (``spec`` holds the PodSpec's scheduling fields:
                          nodeSelector, affinity, tolerations, runtimeClassName, schedulerName,
                          ...; not the containers, which ``object`` has)
``maxPerPod``             map {count, equivalents}: the largest single pod
========================  =====================================================================

Must not import the CEL runtime (that is :mod:`policies.cel.runtime`); functions are plain Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.cel.library.declarations import FunctionSpec, OverloadSpec
from policies.facts import mig
from policies.facts.gpu import Access, GPUFacts, ResourceProblem
from policies.facts.workloads import WorkloadFacts

# The PodSpec fields exposed per template: where and how the pod is scheduled and run. Containers
# are left out (they are large, and their GPU facts are already summarised); policies that need
# them read ``object``.
SCHEDULING_FIELDS = frozenset({
    "nodeSelector", "affinity", "tolerations", "runtimeClassName", "schedulerName",
    "priorityClassName", "topologySpreadConstraints", "nodeName", "hostNetwork", "hostIPC",
    "hostPID", "serviceAccountName", "resourceClaims",
})


def _access(items: tuple[Access, ...]) -> list[dict[str, Any]]:
    return [{"container": a.container, "containerType": a.container_type, "path": a.path,
             "reason": a.reason, "certain": a.certain} for a in items]


def _resource_problems(items: tuple[ResourceProblem, ...]) -> list[dict[str, str]]:
    """``gpu.resourceProblems``: one ``{container, containerType, path, field, resource,
    requests, limits, problem}`` map per :class:`ResourceProblem` (all strings)."""
    return [{"container": p.container, "containerType": p.container_type, "path": p.path,
             "field": p.field, "resource": p.resource, "requests": p.requests,
             "limits": p.limits, "problem": p.problem} for p in items]


def _string_map(value: Any) -> dict[str, Any]:
    """A labels / annotations map as CEL should see it: a map (``{}`` for null or a wrong type,
    which the facts already report in ``invalid``)."""
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _summary(facts: GPUFacts) -> dict[str, Any]:
    """The figures every level has (the object, each template): ``equivalents`` is the known
    part, ``equivalentsKnown`` False when some part's size is unknown (``unknown`` says which)."""
    known = facts.equivalents_known
    return {
        "requested": facts.requested,
        "count": sum(facts.gpus.values()),
        "gpus": dict(facts.gpus),
        "migProfiles": dict(facts.mig),
        # None is "unknown", never 0 silently: no known part, and equivalentsKnown is False.
        "equivalents": 0.0 if known is None else float(known),
        "equivalentsKnown": known is not None and not facts.unknown,
    }


def gpu_data(facts: WorkloadFacts | None) -> dict[str, Any]:
    """The ``gpu`` CEL variable for one object (``facts`` None: an object that makes no pods)."""
    if facts is None:
        return empty_gpu_data()
    total = facts.total
    templates = []
    for template, per_pod in zip(facts.workload.templates, facts.per_template, strict=True):
        templates.append({
            "path": template.path, "role": template.role,
            "replicas": -1 if template.replicas is None else template.replicas,
            # Autoscaling bounds (KubeRay): -1 when the kind has none.
            "minReplicas": -1 if template.min_replicas is None else template.min_replicas,
            "maxReplicas": -1 if template.max_replicas is None else template.max_replicas,
            "specPath": template.spec_path,
            # YAML null maps (``annotations:`` with no value) are read as empty maps.
            "metadata": {"labels": _string_map(template.metadata.get("labels")),
                         "annotations": _string_map(template.metadata.get("annotations"))},
            "spec": {k: v for k, v in template.spec.items() if k in SCHEDULING_FIELDS},
            **_summary(per_pod),
        })
    largest = max((t for t in templates if t["requested"]), default=None,
                  key=lambda t: (t["equivalents"], t["count"]))
    dra = {}
    if total.dra_claims:
        dra = {"gpus": total.dra_gpus,
               "claims": [c.to_dict() for c in total.dra_claims]}
    replicas = facts.workload.replicas
    summary = _summary(total)
    # A template that asks for GPUs makes the object ask for them even at 0 replicas (a stopped
    # KubeVirt VM, a Deployment scaled to 0): starting or scaling it must not bypass a policy.
    summary["requested"] = summary["requested"] or any(t["requested"] for t in templates)
    return {
        **summary,
        "effectiveRequests": dict(total.effective_requests),
        "approximate": total.approximate,
        "shared": total.shared,
        "memoryMiB": total.gpu_memory_mib or 0,
        "vendors": list(total.vendors),
        "migSingle": total.mig_single.to_dict() if total.mig_single else {},
        "kai": total.kai.to_dict() if total.kai else {},
        "hami": total.hami.to_dict() if total.hami else {},
        "dra": dra,
        "unrequestedAccess": _access(total.unrequested_access),
        "privileged": _access(total.privileged),
        "invalid": list(total.invalid),
        "resourceProblems": _resource_problems(total.resource_problems),
        "warnings": list(total.warnings),
        "unknown": list(total.unknown),
        "unrecognized": list(total.unrecognized),
        "replicas": -1 if replicas is None else replicas,
        "templates": templates,
        "maxPerPod": {"count": largest["count"] if largest else 0,
                      "equivalents": largest["equivalents"] if largest else 0.0},
    }


def empty_gpu_data() -> dict[str, Any]:
    """``gpu`` for an object that makes no pods (a Namespace, a ConfigMap, a CONNECT options)."""
    return gpu_data_from_totals(GPUFacts())


def gpu_data_from_totals(facts: GPUFacts) -> dict[str, Any]:
    """``gpu`` for bare facts without a workload (no templates)."""
    return {
        **_summary(facts), "effectiveRequests": {},
        "approximate": False, "shared": False, "memoryMiB": 0, "vendors": [], "migSingle": {},
        "kai": {}, "hami": {}, "dra": {}, "unrequestedAccess": [], "privileged": [],
        "invalid": [], "resourceProblems": [], "warnings": [], "unknown": [], "unrecognized": [],
        "replicas": 0,
        "templates": [],
        "maxPerPod": {"count": 0, "equivalents": 0.0},
    }


GPU_FIELDS: tuple[str, ...] = ()  # set below from the empty facts: every key ``gpu`` has


# --- mig.* functions --------------------------------------------------------------------------


def _model(product: str) -> str | None:
    """A catalog model key from a model key or any product label / NVML name."""
    if product in mig.models():
        return product
    return mig.parse_product(product).model or mig.model_from_name(product)


def mig_profile(name: str) -> dict[str, Any]:
    """``mig.profile('3g.40gb')``: what the name itself says (valid for any GPU model)."""
    parsed = mig.parse_profile(name)
    if parsed is None:
        return {"name": name, "valid": False, "computeSlices": 0, "memoryGB": 0,
                "attributes": []}
    return {"name": parsed.canonical, "valid": True, "computeSlices": parsed.ci_slices,
            "instanceSlices": parsed.gi_slices, "memoryGB": parsed.memory_gb,
            "attributes": list(parsed.attributes)}


def mig_profile_on(name: str, product: str) -> dict[str, Any]:
    """``mig.profile('3g.40gb', 'NVIDIA-A100-SXM4-80GB')``: the catalog row for that GPU model."""
    base = mig_profile(name)
    model = _model(product)
    row = mig.lookup(model, name) if model else None
    if row is None:
        return {**base, "found": False, "model": model or ""}
    return {**base, "found": True, "model": model, "memorySlices": row.memory_slices,
            "maxInstances": row.max_instances, "totalSlices": row.total_compute_slices,
            "equivalents": float(row.equivalents)}


def mig_valid_for(name: str, product: str) -> bool:
    """``mig.validFor('1g.10gb', 'NVIDIA-H100-80GB-HBM3')``: the GPU model offers that profile."""
    model = _model(product)
    return bool(model and mig.lookup(model, name))


def mig_equivalents(name: str) -> float:
    """``mig.equivalents('3g.40gb')``: GPU-equivalents of one instance (catalog-wide value)."""
    return float(mig.equivalents(name, None)[0])


def mig_equivalents_on(name: str, product: str) -> float:
    """``mig.equivalents('1g.24gb', 'NVIDIA-H100-NVL')``: for that GPU model."""
    return float(mig.equivalents(name, _model(product))[0])


def mig_profiles(product: str) -> list[str]:
    """``mig.profiles('NVIDIA-H100-80GB-HBM3')``: the profiles that GPU model offers, or ``[]``."""
    model = _model(product)
    return [row.name for row in mig.profiles_for(model)] if model else []


def mig_model(product: str) -> str:
    """``mig.model('NVIDIA-A100-SXM4-80GB-MIG-1g.10gb')``: the catalog model key, or ``''``."""
    return _model(product) or ""


GPU_LIBRARY: tuple[FunctionSpec, ...] = (
    FunctionSpec("mig.profile", (
        OverloadSpec("mig_profile_string", ("string",), "dyn", False, mig_profile),
        OverloadSpec("mig_profile_string_string", ("string", "string"), "dyn", False,
                     mig_profile_on),
    )),
    FunctionSpec("mig.validFor", (
        OverloadSpec("mig_valid_for_string_string", ("string", "string"), "bool", False,
                     mig_valid_for),
    )),
    FunctionSpec("mig.equivalents", (
        OverloadSpec("mig_equivalents_string", ("string",), "double", False, mig_equivalents),
        OverloadSpec("mig_equivalents_string_string", ("string", "string"), "double", False,
                     mig_equivalents_on),
    )),
    FunctionSpec("mig.profiles", (
        OverloadSpec("mig_profiles_string", ("string",), "list_string", False, mig_profiles),
    )),
    FunctionSpec("mig.model", (
        OverloadSpec("mig_model_string", ("string",), "string", False, mig_model),
    )),
)


GPU_FIELDS = tuple(sorted(empty_gpu_data()))
