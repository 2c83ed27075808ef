"""GPU facts of one Node: what it offers, in which form, and what its labels say about it.

Owns reading a Node's GPU capacity and allocatable without double counting — whole GPUs, MIG
instances per profile (mixed strategy), MIG slices advertised as ``nvidia.com/gpu`` (single
strategy, ``-MIG-<profile>`` product), time-slicing / MPS replicas, HAMi splits (the
``hami.io/node-nvidia-register`` annotation in its CSV and JSON formats) — plus the GFD / MIG
manager labels (``nvidia.com/gpu.product``, ``mig.strategy``, ``mig.config``,
``mig.config.state``, ``gpu.replicas``, ``gpu.count``) and the inconsistencies between them. Label
meanings come from ``shared/reference/gpu-domain.md`` sections 2 and 3.

Every count read from a Node (capacity, allocatable, count labels, HAMi's records) is a whole
number from 0 to :data:`policies.facts.quantity.MAX_COUNT` (Kubernetes stores int64): a value
outside is reported — in ``warnings`` and ``invalid``, naming the field — and ignored, so no caller
has to guard its arithmetic or float conversions.

Must not look at pods or decide placement (that is the auditor's): it describes one Node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from policies.facts import mig, vgpu
from policies.facts.quantity import (
    MAX_COUNT,
    QuantityError,
    format_fraction,
    parse_count,
    parse_quantity,
)
from policies.facts.resource_names import (
    DEFAULT_SETTINGS,
    SPLIT_KINDS,
    GPUSettings,
    ResourceKind,
    classify,
    cores_per_device,
)
from policies.sources import load_json, shortened
from policies.value_words import described

HAMI_REGISTER = "hami.io/node-nvidia-register"
_MIG_LABEL_FAMILY = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/]+)\.count$")


@dataclass(frozen=True)
class HamiDevice:
    """One GPU as HAMi's device plugin registers it (``hami.io/node-nvidia-register``).

    ``split`` is how many vGPU slots it offers; ``memory_mib`` the memory HAMi schedules (after
    HAMi's memory scaling, so it can exceed the physical size); ``cores`` the schedulable core
    percentage (100 per GPU, more when oversubscribed).
    """

    uuid: str
    split: int
    memory_mib: int
    cores: int
    type: str
    healthy: bool
    mode: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form of one device."""
        return {"uuid": self.uuid, "split": self.split, "memory_mib": self.memory_mib,
                "cores": self.cores, "type": self.type, "healthy": self.healthy,
                "mode": self.mode}


def parse_hami_register(value: str) -> tuple[tuple[HamiDevice, ...], bool, list[str]]:
    """Parse HAMi's register annotation, in its CSV or JSON form.

    CSV: records ``uuid,split,mem,cores,type,numa,health`` (HAMi >= 2.5 adds ``,index,mode``)
    separated by ``:``; JSON: a list of device records (``id``, ``count``, ``devmem``, …).

    Returns:
        (devices, truncated, problems): ``truncated`` is True when the value was cut (``...``, as
        ``kubectl describe`` prints long values), in which case only whole records are kept.
    """
    text = value.strip()
    truncated = text.endswith("...")
    problems: list[str] = []
    if text.startswith("["):
        try:
            records = load_json(text)
        except json.JSONDecodeError as exc:
            return (), truncated, [f"{HAMI_REGISTER}: invalid JSON: {exc.msg}"]
        except RecursionError:
            return (), truncated, [f"{HAMI_REGISTER}: invalid JSON: nested too deeply"]
        devices = []
        for number, record in enumerate(records if isinstance(records, list) else []):
            if not isinstance(record, dict):
                continue
            where = f"{HAMI_REGISTER}: record {number}"
            devices.append(HamiDevice(
                uuid=str(record.get("id", "")),
                split=_int(record.get("count"), f"{where} count", problems),
                memory_mib=_int(record.get("devmem"), f"{where} devmem", problems),
                cores=_int(record.get("devcore"), f"{where} devcore", problems),
                type=str(record.get("type", "")), healthy=bool(record.get("health", True)),
                mode=record.get("mode"),
            ))
        return tuple(devices), truncated, problems
    records = [r for r in text.removesuffix("...").split(":") if r]
    if truncated and records:
        records = records[:-1]  # the last record was cut mid-way
    devices = []
    for number, record in enumerate(records):
        fields = record.split(",")
        if len(fields) < 7:
            problems.append(f"{HAMI_REGISTER}: record {number} has {len(fields)} fields, "
                            "expected 7 or 9")
            continue
        where = f"{HAMI_REGISTER}: record {number}"
        devices.append(HamiDevice(
            uuid=fields[0], split=_int(fields[1], f"{where} split", problems),
            memory_mib=_int(fields[2], f"{where} memory", problems),
            cores=_int(fields[3], f"{where} cores", problems), type=fields[4],
            healthy=fields[6].strip() == "true", mode=fields[8] if len(fields) > 8 else None,
        ))
    return tuple(devices), truncated, problems


def _int(value: Any, where: str, problems: list[str]) -> int:
    """A count of a HAMi record (an int in the JSON form, digits in the CSV form); a value that is
    not a whole number from 0 to MAX_COUNT is a problem and counts 0 (missing: 0, silently)."""
    if value is None:
        return 0
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) \
        else None
    count = parse_count(text)
    if count is None:
        problems.append(f"{where}: {shortened(repr(value))} is not a whole number from 0 to "
                        f"{MAX_COUNT}; counted as 0")
        return 0
    return count


@dataclass(frozen=True)
class Offer:
    """GPU resources of one node list (capacity or allocatable), by kind."""

    gpus: Mapping[str, int] = field(default_factory=dict)
    mig: Mapping[str, int] = field(default_factory=dict)
    shared: Mapping[str, int] = field(default_factory=dict)
    split: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """JSON form: ``{gpus, mig, shared, split}``, each resource (or profile) → count."""
        return {"gpus": dict(self.gpus), "mig": dict(self.mig), "shared": dict(self.shared),
                "split": dict(self.split)}


@dataclass(frozen=True)
class NodeFacts:
    """What one Node offers (see module docstring); equivalents are Fractions of a GPU.

    ``warnings`` lists label / resource inconsistencies and unusable values; ``invalid`` repeats
    the unusable values alone (a field of the wrong type, a quantity that is not a count from 0
    to MAX_COUNT), each ``field path: problem; ignored``: what the auditor reports as input
    errors. ``unrecognized`` lists, sorted, the accelerator-looking resource names of
    ``status.capacity`` / ``allocatable`` the GPU registry does not know (``ResourceKind.
    UNRECOGNIZED``, as :attr:`policies.facts.gpu.GPUFacts.unrecognized` for pods): counted as no
    GPU, and every report says so.
    """

    name: str
    product: str | None
    model: str | None
    mig_strategy: str | None
    mig_single_profile: str | None
    mig_invalid: bool
    mig_config: str | None
    mig_config_state: str | None
    sharing_strategy: str | None
    replicas: int | None
    physical_gpus: int | None
    capacity: Offer
    allocatable: Offer
    gpu_equivalents: Fraction | None
    approximate: bool
    hami_devices: tuple[HamiDevice, ...]
    hami_truncated: bool
    warnings: tuple[str, ...]
    invalid: tuple[str, ...] = ()
    unrecognized: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``node`` object of ``gpuguard gpus -o json`` (documented in docs/gpu-facts.md)."""
        eq = self.gpu_equivalents
        return {
            "product": self.product,
            "model": self.model,
            "mig_strategy": self.mig_strategy,
            "mig_single_profile": self.mig_single_profile,
            "mig_invalid": self.mig_invalid,
            "mig_config": self.mig_config,
            "mig_config_state": self.mig_config_state,
            "sharing_strategy": self.sharing_strategy,
            "replicas": self.replicas,
            "physical_gpus": self.physical_gpus,
            "capacity": self.capacity.to_dict(),
            "allocatable": self.allocatable.to_dict(),
            "gpu_equivalents_allocatable": None if eq is None else round(float(eq), 6),
            "gpu_equivalents_approximate": self.approximate,
            "hami": None if not self.hami_devices and not self.hami_truncated else {
                "devices": [d.to_dict() for d in self.hami_devices],
                "truncated": self.hami_truncated,
            },
            "warnings": list(self.warnings),
            "unrecognized": list(self.unrecognized),
        }


def device_count(raw: Any) -> int:
    """A capacity / allocatable value of a device resource as a count of slots.

    Raises:
        QuantityError: not a quantity, negative or fractional, or above MAX_COUNT (the most
            Kubernetes stores); the message says which.
    """
    value = parse_quantity(raw)
    if value > MAX_COUNT:
        raise QuantityError(f"{format_fraction(value)} is out of range (at most {MAX_COUNT})")
    if value < 0 or value.denominator != 1:
        raise QuantityError(f"{format_fraction(value)} is not a device count (expected a whole "
                            "number from 0)")
    return int(value)


def _offer(resources: Any, settings: GPUSettings, invalid: list[str], where: str) -> Offer:
    """The GPU resources of ``status.<where>``; unusable values are added to ``invalid``."""
    gpus: dict[str, int] = {}
    migs: dict[str, int] = {}
    shared: dict[str, int] = {}
    split: dict[str, int] = {}
    for resource, raw in (resources.items() if isinstance(resources, Mapping) else ()):
        kind = classify(str(resource), settings)
        if kind in (ResourceKind.OTHER, ResourceKind.UNRECOGNIZED, ResourceKind.OBSOLETE,
                    ResourceKind.QUALIFIER):
            continue
        try:
            count = device_count(raw)
        except QuantityError as exc:
            invalid.append(f"status.{where}[{resource}]: {exc}; ignored")
            continue
        if kind is ResourceKind.MIG:
            migs[(mig.profile_from_resource(resource) or ("?", False))[0]] = count
        elif kind in (ResourceKind.SHARED, ResourceKind.VGPU):
            shared[resource] = count
        elif kind in (ResourceKind.WHOLE, ResourceKind.CORES):
            gpus[resource] = count
        else:
            split[resource] = count
    return Offer(gpus, migs, shared, split)


def _label_int(labels: Mapping[str, Any], key: str, invalid: list[str]) -> int | None:
    """An integer label (GFD writes them as strings), 0 to MAX_COUNT; anything else is reported
    in ``invalid`` and None."""
    value = labels.get(key)
    if value is None:
        return None
    count = parse_count(value)
    if count is None:
        problem = f"is out of range (at most {MAX_COUNT})" \
            if isinstance(value, str) and value.isascii() and value.isdigit() \
            else "is not a non-negative integer"
        invalid.append(f"metadata.labels[{key}]: {shortened(repr(value))} {problem}; ignored")
    return count


def _map(parent: Mapping[str, Any], key: str, path: str, invalid: list[str]) -> Mapping[str, Any]:
    """``parent[key]`` when it is a map; empty when absent or null; anything else is reported
    (``path``: the field's path) and read as empty."""
    value = parent.get(key)
    if isinstance(value, Mapping):
        return value
    if value is not None:
        invalid.append(f"{path}: expected a map, got {described(value)}; ignored")
    return {}


def _string_labels(labels: Mapping[str, Any], invalid: list[str]) -> dict[str, str]:
    """Labels with string values only (the API server stores nothing else); others reported."""
    clean = {}
    for key, value in labels.items():
        if isinstance(value, str):
            clean[str(key)] = value
        elif isinstance(value, int | float | bool):
            clean[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
        else:
            invalid.append(f"metadata.labels[{key}]: expected a string, got "
                            f"{described(value)}; ignored")
    return clean


def node_facts(node: Mapping[str, Any], settings: GPUSettings = DEFAULT_SETTINGS) -> NodeFacts:
    """Describe the GPUs of one Node object (as ``kubectl get node -o yaml`` prints it).

    Never raises on malformed nodes: unusable values become ``invalid`` (and ``warnings``).
    """
    invalid: list[str] = []  # unusable values, in field order
    warnings: list[str] = []  # inconsistencies between usable values
    metadata = _map(node, "metadata", "metadata", invalid)
    if metadata.get("name") is not None and not isinstance(metadata.get("name"), str):
        invalid.append(f"metadata.name: expected a string, got "
                       f"{described(metadata.get('name'))}; ignored")
    labels = _string_labels(_map(metadata, "labels", "metadata.labels", invalid), invalid)
    annotations = _map(metadata, "annotations", "metadata.annotations", invalid)
    status = _map(node, "status", "status", invalid)
    raw_capacity = _map(status, "capacity", "status.capacity", invalid)
    capacity = _offer(raw_capacity, settings, invalid, "capacity")
    # Kubernetes defaults allocatable to capacity; a capacity value is reported once.
    raw_allocatable = _map(status, "allocatable", "status.allocatable", invalid)
    allocatable = _offer(raw_allocatable, settings, invalid, "allocatable") if raw_allocatable \
        else capacity

    product_label = labels.get("nvidia.com/gpu.product")
    product = mig.parse_product(str(product_label)) if product_label else None
    model = product.model if product else None
    if model is None:
        for key, value in labels.items():
            if re.fullmatch(r"nvidia\.com/mig-[^/]+\.product", str(key)):
                model = mig.parse_product(str(value)).model or model
    strategy = labels.get("nvidia.com/mig.strategy")
    if strategy is None and allocatable.mig:
        strategy = "mixed"
    if strategy is None and product and product.mig_profile:
        strategy = "single"
    single_profile = product.mig_profile if product and strategy == "single" else None
    mig_invalid = bool(product and product.mig_invalid)
    replicas = _label_int(labels, "nvidia.com/gpu.replicas", invalid)
    sharing = labels.get("nvidia.com/gpu.sharing-strategy")

    hami_devices: tuple[HamiDevice, ...] = ()
    truncated = False
    if isinstance(annotations.get(HAMI_REGISTER), str):
        hami_devices, truncated, problems = parse_hami_register(annotations[HAMI_REGISTER])
        invalid += problems
        if truncated:
            warnings.append(f"{HAMI_REGISTER} is truncated ('...'): only "
                            f"{len(hami_devices)} complete device record(s) could be read")
        if model is None and hami_devices:
            model = mig.model_from_name(hami_devices[0].type.removeprefix("NVIDIA-"))

    if mig_invalid:
        warnings.append(
            f"nvidia.com/gpu.product={product_label}: GFD reports an invalid MIG single-strategy "
            "layout (mixed MIG / non-MIG GPUs, an empty MIG GPU or several profiles); the node "
            "advertises no usable GPUs"
        )
    state = labels.get("nvidia.com/mig.config.state")
    if state is not None and state != "success":
        warnings.append(f"nvidia.com/mig.config.state={state}: the MIG layout "
                        f"{labels.get('nvidia.com/mig.config')!r} is not applied")
    label_profiles = {m["profile"] for k in labels if (m := _MIG_LABEL_FAMILY.match(str(k)))}
    advertised = set(allocatable.mig) | set(capacity.mig)
    if label_profiles and advertised and label_profiles != advertised:
        warnings.append(
            "GFD label families (" + ", ".join(sorted(label_profiles)) + ") disagree with the "
            "advertised MIG resources (" + ", ".join(sorted(advertised)) + "); the resources "
            "are what pods must request"
        )
    if labels.get("nvidia.com/mig.config") == "all-disabled" and advertised:
        warnings.append("nvidia.com/mig.config=all-disabled, yet MIG resources are advertised")

    physical = _physical_gpus(labels, strategy, mig_invalid, hami_devices, truncated, allocatable,
                              replicas, invalid)
    equivalents, approximate = _equivalents(
        allocatable, model, single_profile, replicas, hami_devices, settings, warnings)
    return NodeFacts(
        name=node_name if isinstance(node_name := metadata.get("name"), str) else "",
        product=str(product_label) if product_label else None,
        model=model,
        mig_strategy=str(strategy) if strategy else None,
        mig_single_profile=single_profile,
        mig_invalid=mig_invalid,
        mig_config=labels.get("nvidia.com/mig.config"),
        mig_config_state=state,
        sharing_strategy=str(sharing) if sharing else None,
        replicas=replicas,
        physical_gpus=physical,
        capacity=capacity,
        allocatable=allocatable,
        gpu_equivalents=equivalents,
        approximate=approximate,
        hami_devices=hami_devices,
        hami_truncated=truncated,
        warnings=(*invalid, *warnings),
        invalid=tuple(invalid),
        unrecognized=tuple(sorted(
            {str(name) for name in (*raw_capacity, *raw_allocatable)
             if classify(str(name), settings) is ResourceKind.UNRECOGNIZED})),
    )


def node_replicas(nodes: Iterable[NodeFacts]) -> tuple[tuple[str, int], ...]:
    """``(nvidia.com/gpu.product, replicas)`` of time-slicing / MPS nodes (``nvidia.com/gpu.
    replicas`` above 1), for :attr:`policies.facts.resource_names.GPUSettings.node_replicas`:
    how a pod pinned to that product by nodeSelector is valued. A product whose nodes disagree
    on the count is left out (its pods stay "replica count unknown")."""
    seen: dict[str, set[int]] = {}
    for node in nodes:
        if node.product and node.replicas and node.replicas > 1:
            seen.setdefault(node.product, set()).add(node.replicas)
    return tuple(sorted((product, next(iter(counts))) for product, counts in seen.items()
                        if len(counts) == 1))


def _physical_gpus(
    labels: Mapping[str, Any], strategy: Any, mig_invalid: bool,
    hami: tuple[HamiDevice, ...], truncated: bool, allocatable: Offer, replicas: int | None,
    invalid: list[str],
) -> int | None:
    """Physical GPUs on the node, when some source states it; None when it cannot be known.

    ``nvidia.com/gpu.count`` counts physical GPUs except under the single MIG strategy (where it
    counts MIG devices) and when GFD marks the layout invalid (0).
    """
    if mig_invalid:
        return None  # GFD zeroes every count label; the GPUs are there but unusable
    count = _label_int(labels, "nvidia.com/gpu.count", invalid)
    if count is not None and strategy != "single":
        return count
    if hami and not truncated:
        return len(hami)
    whole = allocatable.gpus.get("nvidia.com/gpu")
    if whole is not None and not allocatable.mig and not allocatable.shared and not hami \
            and strategy != "single" and (replicas or 1) == 1:
        return whole
    return None


def slot_unit(
    resource: str, kind: ResourceKind, *, model: str | None, single_profile: str | None,
    replicas: int | None, hami_split: int | None, settings: GPUSettings,
) -> tuple[Fraction | None, bool]:
    """GPU-equivalents of one allocatable slot of ``resource`` on a node, and whether the value is
    approximate (a MIG profile valued without its GPU model).

    Whole devices are 1; a MIG instance its compute slices over the model's; ``nvidia.com/gpu`` is
    a MIG slice under the single strategy, 1/split on a HAMi node, 1/replicas on a time-slicing /
    MPS node; a renamed shared replica is its device over the configured replicas (None when the
    count is unknown); an NVIDIA vGPU type its framebuffer share (:func:`policies.facts.vgpu.
    share`, None for a board not in the table); a legacy Cloud TPU core 1/2 of a chip; HAMi /
    Volcano split dimensions and AWS neuroncores (the same chips as ``aws.amazon.com/neuron``)
    add nothing.
    """
    if kind in SPLIT_KINDS or resource == "aws.amazon.com/neuroncore":
        return Fraction(0), False
    if kind is ResourceKind.CORES and (cores := cores_per_device(resource)) is not None:
        return Fraction(1, cores), False
    if kind is ResourceKind.VGPU:
        return vgpu.share(resource)[0], False
    if kind is ResourceKind.MIG:
        parsed = mig.profile_from_resource(resource)
        return mig.equivalents(parsed[0], model) if parsed else (None, False)
    if kind is ResourceKind.SHARED:
        per = settings.replicas_for(resource) or (replicas if replicas and replicas > 1 else None)
        if per is None:
            return None, False
        parsed = mig.profile_from_resource(resource)
        per_device, approximate = mig.equivalents(parsed[0], model) if parsed \
            else (Fraction(1), False)
        return per_device / per, approximate
    if resource != "nvidia.com/gpu":
        return Fraction(1), False
    if single_profile:
        return mig.equivalents(single_profile, model)
    if hami_split is not None:
        return Fraction(1, hami_split or 1), False
    if replicas and replicas > 1:
        return Fraction(1, replicas), False
    return Fraction(1), False


def _equivalents(
    allocatable: Offer, model: str | None, single_profile: str | None, replicas: int | None,
    hami: tuple[HamiDevice, ...], settings: GPUSettings, warnings: list[str],
) -> tuple[Fraction | None, bool]:
    """Allocatable GPU-equivalents: whole GPUs, MIG slices and replicas in one unit."""
    total = Fraction(0)
    approximate = False
    slots = [(r, c) for r, c in allocatable.gpus.items()]
    slots += [(f"nvidia.com/mig-{mig_resource_suffix(p)}", c) for p, c in allocatable.mig.items()]
    slots += list(allocatable.shared.items())
    for resource, count in slots:
        unit, approx = slot_unit(
            resource, classify(resource, settings), model=model, single_profile=single_profile,
            replicas=replicas, hami_split=hami[0].split if hami else None, settings=settings)
        if unit is None and classify(resource, settings) is ResourceKind.VGPU:
            warnings.append(f"{resource}: {count} vGPUs; {vgpu.share(resource)[1]}")
            return None, approximate
        if unit is None:
            warnings.append(f"{resource}: {count} shared replicas, but the replicas per GPU are "
                            "unknown (no nvidia.com/gpu.replicas label; set --shared-replicas)")
            return None, approximate
        total += count * unit
        approximate = approximate or approx
    return total, approximate


def mig_resource_suffix(profile: str) -> str:
    """The device plugin's resource suffix of a MIG profile (``1g.10gb+me`` -> ``1g.10gb.me``)."""
    return profile.replace("+", ".")
