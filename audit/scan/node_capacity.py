"""What one Node offers to the scheduler, per extended resource, and what each slot is worth.

Owns the per-node view placement needs on top of :func:`policies.facts.nodes.node_facts` (which
reads the GFD / MIG-manager labels, HAMi's register annotation and the label inconsistencies):

- allocatable and capacity **per extended resource name**, as the scheduler accounts them
  (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``, HAMi / Volcano
  split resources);
- the GPU-equivalents of one slot of each resource on *this* node (its unit): 1 for a whole device;
  the profile's compute slices over the model's for a MIG instance, also under the single strategy
  where ``nvidia.com/gpu`` is a MIG slice; 1/replicas for a time-slicing / MPS replica; 1/split for
  a HAMi slot; 0 for split dimensions (``gpumem``, ``gpucores``), which describe a slot rather than
  add one; None when unknown (shared replicas without a replica count). The sum of allocatable x
  unit is the node's allocatable GPU-equivalents, as :mod:`policies.facts.nodes` counts them;
- which resources are whole physical GPUs (unit 1): the ones fragmentation is about;
- readiness (``Ready`` condition; no conditions at all = unknown, treated as ready),
  ``spec.unschedulable`` (cordoned), ``NoSchedule`` / ``NoExecute`` taints, allocatable CPU
  (millicores) and memory (bytes).

Every count is an int from 0 to :data:`policies.facts.quantity.MAX_COUNT` (Kubernetes stores int64),
so placement's sums and float conversions cannot overflow: a GPU value outside is left out (as
:mod:`policies.facts.nodes` reports it), a CPU or memory value outside becomes unknown (None) and is
added to the facts' ``invalid`` (and ``warnings``).

Must not look at pods.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from audit.scan.scheduling import Taint, taints_of
from policies.facts import mig
from policies.facts.nodes import NodeFacts, device_count, node_facts, slot_unit
from policies.facts.quantity import MAX_COUNT, QuantityError, format_fraction, parse_quantity
from policies.facts.resource_names import (
    DEFAULT_SETTINGS,
    SPLIT_KINDS,
    GPUSettings,
    ResourceKind,
    classify,
)
from policies.json_fields import as_mapping
from policies.value_words import described

_DEVICE_KINDS = (ResourceKind.WHOLE, ResourceKind.CORES, ResourceKind.MIG, ResourceKind.SHARED)


@dataclass(frozen=True)
class NodeCapacity:
    """One node as placement sees it (see module docstring).

    Attributes:
        name: the node name.
        facts: the GPU facts of :mod:`policies.facts.nodes` (product, model, MIG strategy,
        warnings). labels: the node's labels (string values).
        allocatable / capacity: GPU extended resource → slots.
        units: resource → GPU-equivalents of one slot (None: unknown).
        whole: the resources whose slots are whole physical GPUs on this node.
        mig_profiles: resource → MIG profile of its slots (mixed resources, and
            ``nvidia.com/gpu`` under the single strategy).
        ready: the Ready condition (None: the node reports no conditions).
        not_ready: the Ready condition's reason when it is not True.
        unschedulable: ``spec.unschedulable`` (cordoned).
        taints: ``(key, value, effect)`` of its NoSchedule / NoExecute taints.
        cpu_millicores / memory_bytes: allocatable CPU and memory (None when not reported).
    """

    name: str
    facts: NodeFacts
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    capacity: Mapping[str, int]
    units: Mapping[str, Fraction | None]
    whole: frozenset[str]
    mig_profiles: Mapping[str, str]
    ready: bool | None
    not_ready: str | None
    unschedulable: bool
    taints: tuple[Taint, ...]
    cpu_millicores: int | None
    memory_bytes: int | None

    @property
    def gpu_equivalents(self) -> Fraction | None:
        """Allocatable GPU-equivalents (None when some resource's unit is unknown)."""
        total = Fraction(0)
        for resource, count in self.allocatable.items():
            unit = self.units.get(resource)
            if unit is None:
                if count:
                    return None
                continue
            total += count * unit
        return total

    @property
    def has_gpus(self) -> bool:
        """Whether the node advertises any GPU resource (even at 0) or is a broken GPU node."""
        return bool(self.allocatable or self.capacity or self.facts.mig_invalid
                    or self.facts.product)


def is_split(resource: str, settings: GPUSettings | None = None) -> bool:
    """Whether ``resource`` is a dimension of a HAMi / Volcano split (memory, cores, count)."""
    return classify(resource, settings or DEFAULT_SETTINGS) in SPLIT_KINDS


def _gpu_resources(resources: Any, settings: GPUSettings) -> dict[str, int]:
    """The GPU extended resources of a capacity / allocatable map; unusable values skipped
    (node_facts reports them)."""
    found: dict[str, int] = {}
    for resource, raw in as_mapping(resources).items():
        kind = classify(str(resource), settings)
        if kind not in _DEVICE_KINDS and kind not in SPLIT_KINDS:
            continue
        try:
            found[str(resource)] = device_count(raw)
        except QuantityError:
            continue
    return found


def _scalar(resources: Mapping[str, Any], name: str, scale: int, where: str,
            invalid: list[str]) -> int | None:
    """``resources[name]`` times ``scale`` rounded down (CPU: millicores; memory: bytes), 0 to
    MAX_COUNT; None when absent or unusable (reported in ``invalid``; ``where``: the map's path).
    """
    raw = resources.get(name)
    if raw is None:
        return None
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        invalid.append(f"{where}[{name}]: {exc}; ignored")
        return None
    if value < 0:
        invalid.append(f"{where}[{name}]: {format_fraction(value)} is negative; ignored")
        return None
    scaled = math.floor(value * scale)
    if scaled > MAX_COUNT:
        invalid.append(f"{where}[{name}]: {format_fraction(value)} is out of range (at most "
                       f"{MAX_COUNT // scale}); ignored")
        return None
    return scaled


def _unit(resource: str, kind: ResourceKind, facts: NodeFacts,
          settings: GPUSettings) -> Fraction | None:
    """GPU-equivalents of one slot of ``resource`` on this node (policies.facts.nodes.slot_unit)."""
    return slot_unit(resource, kind, model=facts.model, single_profile=facts.mig_single_profile,
                     replicas=facts.replicas,
                     hami_split=facts.hami_devices[0].split if facts.hami_devices else None,
                     settings=settings)[0]


def _shared_strings(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with its label keys and values, and the resource names of its allocatable and
    capacity, interned (a shallow copy; the input is not changed).

    What the audit keeps of a node — its labels, its facts, its resource maps — outlives the
    decoded object; most of those strings are the same on every node of a pool
    (``nvidia.com/gpu.present: "true"``, the product, ``nvidia.com/gpu``), and each node's copy
    is a string object of its own: at 5,000 nodes 119,000 duplicate strings (6.8 MiB)."""
    metadata = node.get("metadata")
    status = node.get("status")
    if not isinstance(metadata, Mapping) or not isinstance(status, Mapping):
        return node
    copy = dict(node)
    labels = metadata.get("labels")
    if isinstance(labels, Mapping):
        copy["metadata"] = {**metadata, "labels": {
            _intern(k): _intern(v) for k, v in labels.items()}}
    shared = dict(status)
    for key in ("allocatable", "capacity"):
        resources = status.get(key)
        if isinstance(resources, Mapping):
            shared[key] = {_intern(k): v for k, v in resources.items()}
    copy["status"] = shared
    return copy


def _intern(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _readiness(status: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        condition = as_mapping(condition)
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, None
            return False, str(condition.get("reason") or f"Ready={condition.get('status')}")
    return None, None


def node_capacity(node: Mapping[str, Any], settings: GPUSettings) -> NodeCapacity:
    """Read one Node object (as ``kubectl get node -o yaml`` prints it); never raises."""
    node = _shared_strings(node)
    facts = node_facts(node, settings)
    metadata = as_mapping(node.get("metadata"))
    status = as_mapping(node.get("status"))
    spec = as_mapping(node.get("spec"))
    raw_allocatable = as_mapping(status.get("allocatable")) or as_mapping(status.get("capacity"))
    where = "status.allocatable" if as_mapping(status.get("allocatable")) else "status.capacity"
    invalid: list[str] = []
    cpu = _scalar(raw_allocatable, "cpu", 1000, where, invalid)
    memory = _scalar(raw_allocatable, "memory", 1, where, invalid)
    if node.get("spec") is not None and not isinstance(node.get("spec"), Mapping):
        invalid.append(f"spec: expected a map, got {described(node.get('spec'))}; ignored")
    for path, value in (("status.conditions", status.get("conditions")),
                        ("spec.taints", spec.get("taints"))):
        if value is not None and not isinstance(value, list):
            invalid.append(f"{path}: expected a list, got {described(value)}; ignored")
    if invalid:
        facts = dataclasses.replace(facts, warnings=(*facts.warnings, *invalid),
                                    invalid=(*facts.invalid, *invalid))
    allocatable = _gpu_resources(raw_allocatable, settings)
    capacity = _gpu_resources(status.get("capacity"), settings) or dict(allocatable)
    units: dict[str, Fraction | None] = {}
    whole = set()
    profiles: dict[str, str] = {}
    for resource in {*allocatable, *capacity}:
        kind = classify(resource, settings)
        units[resource] = _unit(resource, kind, facts, settings)
        if kind is ResourceKind.WHOLE and units[resource] == 1:
            whole.add(resource)
        if kind is ResourceKind.MIG:
            parsed = mig.profile_from_resource(resource)
            if parsed:
                profiles[resource] = parsed[0]
        elif resource == "nvidia.com/gpu" and facts.mig_single_profile:
            profiles[resource] = facts.mig_single_profile
    ready, reason = _readiness(status)
    labels = {str(k): str(v) for k, v in as_mapping(metadata.get("labels")).items()
              if isinstance(v, str | int | float | bool)}
    return NodeCapacity(
        name=facts.name,
        facts=facts,
        labels=labels,
        allocatable=allocatable,
        capacity=capacity,
        units=units,
        whole=frozenset(whole),
        mig_profiles=profiles,
        ready=ready,
        not_ready=reason,
        unschedulable=spec.get("unschedulable") is True,
        taints=taints_of(node),
        cpu_millicores=cpu,
        memory_bytes=memory,
    )
