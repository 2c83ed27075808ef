"""What one Pod takes: its state, node, GPU resources, CPU and memory, and scheduling constraints.

Owns turning a Pod object into a small :class:`PodUsage` that placement can aggregate and drop:

- state: ``finished`` (``status.phase`` Succeeded / Failed: holds nothing), ``running`` (bound:
  ``spec.nodeName`` set — running, or starting on its node), else ``pending``;
- GPU resources from :func:`policies.facts.gpu.pod_facts` (the Kubernetes effective request of every
  GPU extended resource, MIG instances, GPU-equivalents, KAI fractions, HAMi splits);
- CPU (millicores) and memory (bytes) as the scheduler counts them: the effective request
  (containers and sidecars summed, against the largest init container), a limit standing in for a
  missing request, plus ``spec.overhead``;
- tolerations, ``nodeSelector`` and required node affinity, for the pending-pod analysis.

The spec-derived part is cached by content (the fields it depends on), so the replicas of one
template cost one fact computation; never by controller and revision label (``pod-template-hash``),
which any pod may claim: a pod's GPUs are always the ones its own spec asks for. Must not look at
nodes or other pods.
"""

from __future__ import annotations

import marshal
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from audit.scan.ownership import ObjectKey, controller_of, group_of
from policies.facts.dra import DraIndex
from policies.facts.gpu import KAI_CONTAINER, KAI_DEVICES, KAI_FRACTION, KAI_MEMORY, pod_facts
from policies.facts.identity import namespace_of
from policies.facts.quantity import MAX_COUNT, QuantityError, parse_quantity
from policies.facts.resource_names import GPUSettings
from policies.json_fields import as_mapping

RUNNING, PENDING, FINISHED = "running", "pending", "finished"
_KAI_KEYS = (KAI_FRACTION, KAI_MEMORY, KAI_DEVICES, KAI_CONTAINER)
_CACHE_LIMIT = 20_000

Toleration = tuple[str, str, str, str]  # (key, operator, value, effect)
Expression = tuple[str, str, tuple[str, ...]]  # (key, operator, values)
Term = tuple[tuple[Expression, ...], tuple[Expression, ...]]  # (matchExpressions, matchFields)


@dataclass(frozen=True, slots=True)
class TemplateUsage:
    """The part of a pod's usage that depends on its spec only (shared by a workload's replicas).

    Attributes:
        gpu_requested: the pod asks for any GPU (devices, MIG, shares, splits, fractions, DRA).
        requests: effective request per GPU extended resource (``nvidia.com/gpu``,
            ``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpumem``, …): what node allocatable is
            consumed by.
        equivalents: GPU-equivalents from the pod alone (None when a part is unknown); placement
            re-values the devices with the node's own unit when the pod is bound.
        kai_share: GPU-equivalents taken through KAI / Run:ai annotations (fraction x devices),
            which consume no extended resource; None when the pod has no KAI fraction.
        hami: HAMi / Volcano split per GPU (``{gpus, gpumem_mib, gpumem_percentage, gpucores}``).
        mig: MIG instances per profile (mixed strategy).
        shared: time-slicing / MPS replica, HAMi split or KAI fraction.
        dra: the pod claims GPUs through DRA (not in node allocatable; counted apart).
        cpu_millicores / memory_bytes: the scheduler's CPU and memory request.
        tolerations: ``(key, operator, value, effect)``, operator defaulted to ``Equal``.
        node_selector: ``nodeSelector`` items; affinity: required node-affinity terms or None.
        invalid: what the API server would reject (such pods cannot exist in a real cluster).
        input_errors: the entries of ``invalid`` no policy judges (``GPUFacts.input_errors``),
            reported by the scan as input errors.
        unrecognized: accelerator-looking extended resources the GPU registry does not know
            (``policies.facts.resource_names.classify``): not counted, and reported by the scan.
        dra_shared: a DRA claim names a ResourceClaim (not a template): one allocation that
            several pods may share, which the streaming scan cannot split between them.
    """

    gpu_requested: bool
    requests: Mapping[str, int]
    equivalents: Fraction | None
    kai_share: Fraction | None
    hami: Mapping[str, Any] | None
    mig: Mapping[str, int]
    shared: bool
    dra: bool
    cpu_millicores: int
    memory_bytes: int
    tolerations: tuple[Toleration, ...]
    node_selector: tuple[tuple[str, str], ...]
    affinity: tuple[Term, ...] | None
    invalid: tuple[str, ...]
    input_errors: tuple[str, ...]
    unrecognized: tuple[str, ...] = ()
    dra_shared: bool = False


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One pod, reduced to what placement needs (see module docstring).

    ``owner`` is the controller reference (None for a bare pod); ``scheduler_message`` the
    ``PodScheduled=False`` condition's reason and message, when the scheduler left one.
    """

    key: ObjectKey
    owner: ObjectKey | None
    uid: str
    node: str | None
    state: str
    template: TemplateUsage
    scheduler_message: str | None


def _list(value: Any) -> list[Any]:
    return value if type(value) is list or isinstance(value, list) else []


def _scaled(value: Any, scale: int) -> int:
    """A quantity times ``scale`` rounded up, from 0 to MAX_COUNT (Kubernetes stores int64).

    Beyond int64 saturates: such a pod fits no node, as it asks for more than any node states,
    and node and pod figures stay ints a float can hold (placement divides memory into MiB).

    Raises:
        QuantityError: not a quantity.
    """
    return min(MAX_COUNT, max(0, math.ceil(parse_quantity(value) * scale)))


def _quantity(resources: Mapping[str, Any], name: str, *, scale: int) -> int:
    """A container's request for ``name`` (the limit when no request), scaled, rounded up."""
    value = as_mapping(resources.get("requests")).get(name)
    if value is None:
        value = as_mapping(resources.get("limits")).get(name)
    if value is None:
        return 0
    try:
        return _scaled(value, scale)
    except QuantityError:
        return 0  # policies report malformed quantities; placement counts them as nothing


def _effective(spec: Mapping[str, Any], name: str, scale: int) -> int:
    """Kubernetes ``PodRequests`` for one resource (KEP-753 sidecars), plus ``spec.overhead``."""
    app = sum(_quantity(as_mapping(as_mapping(c).get("resources")), name, scale=scale)
              for c in _list(spec.get("containers")))
    sidecars = 0
    init_peak = 0
    for container in _list(spec.get("initContainers")):
        container = as_mapping(container)
        value = _quantity(as_mapping(container.get("resources")), name, scale=scale)
        if container.get("restartPolicy") == "Always":
            sidecars += value
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + value)
    overhead = as_mapping(spec.get("overhead")).get(name)
    extra = 0
    if overhead is not None:
        try:
            extra = _scaled(overhead, scale)
        except QuantityError:
            extra = 0
    return max(app + sidecars, init_peak) + extra


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    found = []
    for item in _list(spec.get("tolerations")):
        item = as_mapping(item)
        found.append((str(item.get("key") or ""), str(item.get("operator") or "Equal"),
                      str(item.get("value") or ""), str(item.get("effect") or "")))
    return tuple(found)


def _expressions(items: Any) -> tuple[Expression, ...]:
    return tuple((str(as_mapping(e).get("key") or ""), str(as_mapping(e).get("operator") or ""),
                  tuple(str(v) for v in _list(as_mapping(e).get("values"))))
                 for e in _list(items))


def _affinity(spec: Mapping[str, Any]) -> tuple[Term, ...] | None:
    required = as_mapping(as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return None
    return tuple((_expressions(as_mapping(term).get("matchExpressions")),
                  _expressions(as_mapping(term).get("matchFields")))
                 for term in _list(required.get("nodeSelectorTerms")))


def _fingerprint(spec: Mapping[str, Any], metadata: Mapping[str, Any], namespace: str | None,
                 ) -> bytes | str:
    """A cache key over every field :class:`TemplateUsage` depends on: the fields' ``marshal``
    (format 2: no back-references, so equal values give equal bytes whatever objects they
    share), exact — it tells ``1``, ``1.0`` and ``True`` apart, as the facts do — and 18 k
    instructions for a 2 KB pod where ``repr`` took 57 k; ``repr`` (also exact) for what marshal
    refuses (a YAML date, a str subclass)."""
    annotations = as_mapping(metadata.get("annotations"))
    parts: list[Any] = [namespace if spec.get("resourceClaims") else None,
                        tuple(annotations.get(k) for k in _KAI_KEYS)]
    for ctype in ("initContainers", "containers"):
        for container in _list(spec.get(ctype)):
            container = as_mapping(container)
            parts.append((ctype, container.get("name"), container.get("resources"),
                          container.get("restartPolicy")))
    parts.append(tuple(spec.get(key) for key in ("nodeSelector", "affinity", "tolerations",
                                                 "resourceClaims", "overhead")))
    try:
        return marshal.dumps(parts, 2)
    except ValueError:
        return repr(parts)


class PodReader:
    """Turns Pod objects into :class:`PodUsage`, caching the spec-derived part by content.

    Args:
        settings: GPU naming and sharing.
        claim_templates: DRA ResourceClaimTemplates known so far, by (namespace, name), as
            ``(device class, count)`` pairs.
        dra: the DRA objects known so far (templates, claims, DeviceClasses); replaces
            ``claim_templates`` when given (its MIG slices keep their profiles).
    """

    def __init__(self, settings: GPUSettings,
                 claim_templates: Mapping[tuple[str | None, str], tuple[str | None, int | None]]
                 | None = None, *, dra: DraIndex | None = None) -> None:
        self._settings = settings
        self._claims = claim_templates if claim_templates is not None else {}
        self._dra = dra
        self._cache: dict[bytes | str, TemplateUsage] = {}
        self.computed = 0  # spec analyses actually run (the rest came from the cache)

    def template(self, spec: Mapping[str, Any], metadata: Mapping[str, Any],
                 namespace: str | None) -> TemplateUsage:
        """The spec-derived usage of a pod (or pod template)."""
        key = _fingerprint(spec, metadata, namespace)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        self.computed += 1
        facts = pod_facts(spec, metadata, settings=self._settings,
                          claim_templates=self._claims, namespace=namespace, dra=self._dra)
        kai_share = None
        if facts.kai and facts.kai.fraction is not None:
            kai_share = Fraction(str(facts.kai.fraction)) * facts.kai.devices
        usage = TemplateUsage(
            gpu_requested=facts.requested,
            requests=dict(facts.effective_requests),
            equivalents=facts.gpu_equivalents,
            kai_share=kai_share,
            hami=facts.hami.to_dict() if facts.hami else None,
            mig=dict(facts.mig),
            shared=facts.shared,
            dra=bool(facts.dra_claims),
            cpu_millicores=_effective(spec, "cpu", 1000),
            memory_bytes=_effective(spec, "memory", 1),
            tolerations=_tolerations(spec),
            node_selector=tuple(sorted((str(k), str(v)) for k, v in
                                       as_mapping(spec.get("nodeSelector")).items())),
            affinity=_affinity(spec),
            invalid=tuple(facts.invalid),
            input_errors=facts.input_errors,
            unrecognized=tuple(facts.unrecognized),
            dra_shared=any(c.resource_claim is not None for c in facts.dra_claims),
        )
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = usage
        return usage

    def read(self, pod: Mapping[str, Any]) -> PodUsage | None:
        """The usage of one Pod object; None when it has no name."""
        metadata = as_mapping(pod.get("metadata"))
        name = metadata.get("name") or metadata.get("generateName")
        if not isinstance(name, str) or not name:
            return None
        namespace = namespace_of(metadata)  # "" is unset, as for every other object
        spec = as_mapping(pod.get("spec"))
        status = as_mapping(pod.get("status"))
        owner = controller_of(pod, namespace)
        # By content, never by the controller and its revision label: a pod can name any
        # controller and any pod-template-hash, and its GPUs are the ones it asks for.
        template = self.template(spec, metadata, namespace)
        phase = status.get("phase")
        node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
        if phase in ("Succeeded", "Failed"):
            state = FINISHED
        elif node:
            state = RUNNING
        else:
            state = PENDING
        message = None
        if state == PENDING:
            for condition in _list(status.get("conditions")):
                condition = as_mapping(condition)
                if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                    message = ": ".join(str(p) for p in (condition.get("reason"),
                                                         condition.get("message")) if p)
        return PodUsage(
            key=ObjectKey(namespace, group_of(pod.get("apiVersion")), "Pod", name),
            owner=owner,
            uid=str(metadata.get("uid") or ""),
            node=node or None,
            state=state,
            template=template,
            scheduler_message=message or None,
        )

