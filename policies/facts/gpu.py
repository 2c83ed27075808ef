"""GPU facts of one pod (or pod template): how much GPU, of what kind, and from where.

Owns the answer every other part of gpuguard relies on — admission policies (``gpu`` in CEL), quota
and the auditor: per extended resource the *effective* request as Kubernetes computes it
(``PodRequests``: app containers and sidecars summed, against the largest init container), MIG
instances, shared replicas, HAMi / Volcano splits, KAI / Run:ai fraction annotations, DRA claims,
containers that can reach GPUs without asking, and one normalised unit, GPU-equivalents. The rules
are written down in ``docs/gpu-facts.md``; the GPU facts themselves come from
``shared/reference/gpu-domain.md``.

Must not read files, the clock or the environment, and must not know workload kinds (that is
:mod:`policies.facts.workloads`): it sees one pod spec and its metadata.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Any, Final, TypeVar

from policies.facts import mig, vgpu
from policies.facts.dra import (
    MIG_DEVICE_CLASSES,
    UNKNOWN_MIG_PROFILE,
    ClaimDevices,
    DraIndex,
    claim_devices,
    claim_requests_path,
)
from policies.facts.quantity import (
    MAX_COUNT,
    QuantityError,
    format_fraction,
    parse_count,
    parse_quantity,
)
from policies.facts.resource_names import (
    DEFAULT_SETTINGS,
    OBSOLETE_RESOURCES,
    SPLIT_KINDS,
    GPUSettings,
    ResourceKind,
    SplitFamily,
    classify,
    cores_per_device,
    device_class_is_gpu,
    split_family,
    vendor_of,
)
from policies.json_fields import as_mapping
from policies.sources import shortened
from policies.value_words import described

KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER = "gpu-fraction-container-name"
# KAI's gpu-fraction: a decimal, the exponent bounded so that Fraction() stays instant.
_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]{1,64}(?:\.[0-9]{0,64})?|\.[0-9]{1,64})(?:[eE][+-]?[0-9]{1,3})?"
)
PRODUCT_LABEL = "nvidia.com/gpu.product"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"

# Environment variables the NVIDIA / Habana runtimes read to expose devices (gpu-domain.md 2.5).
_DEVICE_ENV = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "HABANA_VISIBLE_DEVICES",
)
_NO_DEVICE_VALUES = {"", "void", "none"}
_DEVICE_PATHS = ("/dev/nvidia", "/dev/dri", "/dev/kfd", "/dev/accel", "/dev/neuron")
# Capabilities that make a container "privileged" to the NVIDIA toolkit (it then ignores device
# restrictions), upper case without CAP_; "ALL" is every capability to containerd and CRI-O
# (capabilities.add is matched case-insensitively, with or without the CAP_ prefix).
_PRIVILEGED_CAPABILITIES = ("SYS_ADMIN",)
_ALL_CAPABILITIES = "ALL"
_CONTAINER_TYPES = ("initContainers", "containers", "ephemeralContainers")
_N = TypeVar("_N", int, Fraction)
ZERO: Final = Fraction(0)
"""Zero GPU-equivalents (one shared immutable value: building Fractions is not free)."""


@dataclass(frozen=True)
class Access:
    """A container that can reach GPUs (or is privileged); ``path`` is the offending field.

    ``certain`` is False when the access depends on content the object does not hold: an
    ``envFrom`` without a prefix may set a device variable, or may not (its ConfigMap / Secret
    keys are unknown at admission) — most applications that use ``envFrom`` set none, so the
    library reports these and denies only the certain ones (param ``includeUncertain``).
    """

    container: str
    container_type: str
    path: str
    reason: str
    certain: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{container, container_type, path, reason, certain}``."""
        return {
            "container": self.container,
            "container_type": self.container_type,
            "path": self.path,
            "reason": self.reason,
            "certain": self.certain,
        }


@dataclass(frozen=True)
class Source:
    """Where one counted value came from (``quantity`` as written, after defaulting)."""

    resource: str
    quantity: str
    container: str
    container_type: str
    path: str

    def to_dict(self) -> dict[str, str]:
        """JSON form: ``{resource, quantity, container, container_type, path}``."""
        return {
            "resource": self.resource,
            "quantity": self.quantity,
            "container": self.container,
            "container_type": self.container_type,
            "path": self.path,
        }


@dataclass(frozen=True)
class ResourceProblem:
    """One GPU extended resource of one container that the API server would reject.

    The structured twin of one ``invalid`` entry about resources, which reads
    ``f"{field}: {problem}"``. ``container`` is the container's name (``""`` when it has none),
    ``container_type`` ``containers`` / ``initContainers`` / ``ephemeralContainers``, ``path`` the
    container's field path (``spec.template.spec.containers[0]``), ``field`` the field the entry
    names: ``<path>.resources[R]`` (both sides, or the resource itself),
    ``<path>.resources.requests[R]`` or ``<path>.resources.limits[R]`` (one side). ``requests``
    and ``limits`` are the values under ``resources.requests[R]`` / ``resources.limits[R]`` as
    written, rendered as CEL's ``string()`` renders them (``"1"``, ``"500m"``, ``"0.5"``), or
    ``"not set"`` when absent.
    """

    container: str
    container_type: str
    path: str
    field: str
    resource: str
    requests: str
    limits: str
    problem: str

    def to_dict(self) -> dict[str, str]:
        """JSON form: ``{container, container_type, path, field, resource, requests, limits,
        problem}``."""
        return {
            "container": self.container,
            "container_type": self.container_type,
            "path": self.path,
            "field": self.field,
            "resource": self.resource,
            "requests": self.requests,
            "limits": self.limits,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class DraClaim:
    """One pod-level ResourceClaim; ``count`` is the number of GPU devices, None when unknown.

    ``resource_claim`` names the ResourceClaim (not a template) the pod uses: one allocation for
    every pod naming it, so totals count it once (:meth:`GPUFacts.scaled` does not multiply it)
    and each of its ``shared_by`` pods of the input gets ``count / shared_by`` GPU-equivalents.
    ``mig`` is the MIG slices among ``count`` by profile (``unknown``: a profile not pinned),
    also counted in the pod's ``mig``. ``found`` is False when the ResourceClaim or template is
    not among the DRA objects the pod was resolved against: its devices (whole GPUs, MIG slices
    of some profile, or none) are unknown, ``device_class`` and ``count`` None.
    """

    name: str
    template: str | None
    device_class: str | None
    count: int | None
    path: str
    resource_claim: str | None = None
    shared_by: int = 1
    mig: Mapping[str, int] = field(default_factory=dict)
    found: bool = True

    @property
    def source(self) -> str:
        """The object the claim names, as a user writes it: ``ResourceClaimTemplate 'name'`` or
        ``ResourceClaim 'name'``."""
        if self.template is not None:
            return f"ResourceClaimTemplate {self.template!r}"
        return f"ResourceClaim {self.resource_claim!r}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{name, template, resource_claim, shared_by, device_class, count, mig,
        path}``."""
        return {
            "name": self.name,
            "template": self.template,
            "resource_claim": self.resource_claim,
            "shared_by": self.shared_by,
            "device_class": self.device_class,
            "count": self.count,
            "mig": dict(sorted(self.mig.items())),
            "path": self.path,
        }


@dataclass(frozen=True)
class KaiShare:
    """A pod's KAI / Run:ai GPU sharing, from its annotations (KAI scheduler docs, "GPU
    sharing": ``gpu-fraction``, ``gpu-memory``, ``gpu-fraction-num-devices``,
    ``gpu-fraction-container-name``).

    ``fraction``: the share of each GPU (0 < f < 1), None when only memory is asked or the
    value is not one KAI accepts;
    ``memory_mib``: GPU memory per device (MiB), None when only a fraction is asked; ``devices``:
    how many GPUs the share spans; ``container``: the container that gets it. The dict view
    (:meth:`to_dict`, also the CEL ``gpu.kai`` map) has exactly these fields, same names.
    """

    fraction: float | None = None
    memory_mib: int | None = None
    devices: int = 1
    container: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON / CEL view: the fields above, by name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HamiSplit:
    """The HAMi / Volcano split of a container's GPUs (HAMi docs: ``nvidia.com/gpumem``,
    ``gpumem-percentage``, ``gpucores``, and each vendor's equivalents), per GPU it spans.

    ``gpus``: devices the split spans; ``gpumem_mib``: memory per device (MiB), None when not
    given or the vendor's unit is unknown; ``gpumem_percentage``: memory per device in percent;
    ``gpucores``: the vendor's core units per device (100 = a whole device for HAMi NVIDIA). The
    dict view (:meth:`to_dict`, also the CEL ``gpu.hami`` map) has exactly these fields.
    """

    gpus: int = 1
    gpumem_mib: int | None = None
    gpumem_percentage: int | None = None
    gpucores: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON / CEL view: the fields above, by name."""
        return dataclasses.asdict(self)


class MigSingleStatus(StrEnum):
    """How a pod's ``nvidia.com/gpu`` relates to MIG on a ``mig.strategy=single`` node (NVIDIA
    GPU operator docs, "MIG strategies": there ``nvidia.com/gpu`` is a MIG instance of the node's
    one profile)."""

    PINNED = "pinned"  # a node selector / affinity pins the MIG profile (nvidia.com/mig.config)
    EXCLUDED = "excluded"  # the pod's placement excludes MIG nodes: whole GPUs
    UNKNOWN = "unknown"  # nothing says: whole GPU or MIG instance, unknown from the pod alone


@dataclass(frozen=True)
class MigSingle:
    """What ``nvidia.com/gpu`` means for this pod under the MIG ``single`` strategy:
    ``status`` (:class:`MigSingleStatus`), the pinned ``profile`` and the GPU ``model`` when the
    placement names them. The dict view (:meth:`to_dict`, also CEL ``gpu.migSingle``) has
    exactly these fields, the status as its string."""

    status: MigSingleStatus
    profile: str | None = None
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON / CEL view: the fields above, by name."""
        return {"status": str(self.status), "profile": self.profile, "model": self.model}


@dataclass(frozen=True)
class GPUFacts:
    """The GPU facts of one pod, or (scaled and merged) of a whole workload.

    Counts are devices or instances; ``equivalents_known`` is the Fraction of one GPU asked for by
    the parts whose size is known, and ``gpu_equivalents`` the whole ask (None when some
    part is unknown, with the reasons in ``unknown``); memory is MiB. ``invalid`` is what the API
    server would reject, as text; ``resource_problems`` repeats its entries about containers'
    extended resources as :class:`ResourceProblem` (one each, same order). See
    ``docs/gpu-facts.md``.
    """

    gpus: Mapping[str, int] = field(default_factory=dict)
    mig: Mapping[str, int] = field(default_factory=dict)
    effective_requests: Mapping[str, int] = field(default_factory=dict)
    equivalents_known: Fraction = ZERO
    approximate: bool = False
    unknown: tuple[str, ...] = ()
    shared: bool = False
    gpu_memory_mib: int | None = None
    vendors: tuple[str, ...] = ()
    mig_single: MigSingle | None = None
    kai: KaiShare | None = None
    hami: HamiSplit | None = None
    dra_claims: tuple[DraClaim, ...] = ()
    unrequested_access: tuple[Access, ...] = ()
    privileged: tuple[Access, ...] = ()
    invalid: tuple[str, ...] = ()
    resource_problems: tuple[ResourceProblem, ...] = ()
    warnings: tuple[str, ...] = ()
    unrecognized: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()

    @property
    def gpu_equivalents(self) -> Fraction | None:
        """All GPU-equivalents asked for; None when a part's size is unknown (see ``unknown``)."""
        return None if self.unknown else self.equivalents_known

    @property
    def dra_gpus(self) -> int | None:
        """GPU devices claimed through DRA; None when some claim's count is unknown."""
        counts = [c.count for c in self.dra_claims]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def requested(self) -> bool:
        """Whether the pod asks for any GPU of any kind (devices, MIG, shares, fractions, DRA)."""
        return bool(
            any(self.gpus.values())
            or any(self.mig.values())
            or self.kai
            or self.dra_claims
            or self.equivalents_known > 0
            or self.unknown
        )

    @property
    def input_errors(self) -> tuple[str, ...]:
        """The ``invalid`` entries no policy judges: fields not of their API types or shapes
        (``spec.containers[0].securityContext.privileged: expected a boolean, got the
        string 'true'``, ``spec: expected a map, got the string 'x'``), which ``check`` and
        the audit report as input errors naming the path. Left out, as they are judged rather
        than unreadable: the extended-resource entries (``resource_problems``: the library's
        gpu-requests-equal-limits denies them) and the KAI annotations' (``metadata.annotations
        [gpu-fraction]: '2' is not a fraction``: the API server accepts any string there, KAI
        refuses the pod, GPUQuota counts it as unknown size)."""
        if not self.invalid:
            return ()
        judged = {f"{p.field}: {p.problem}" for p in self.resource_problems}
        return tuple(i for i in self.invalid if i not in judged
                     and ".annotations[" not in i and ".annotations:" not in i)

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape documented in ``docs/gpu-facts.md`` (``FACTS``)."""
        equivalents = self.gpu_equivalents
        return {
            "requested": self.requested,
            "gpus": dict(sorted(self.gpus.items())),
            "mig": dict(sorted(self.mig.items())),
            "effective_requests": dict(sorted(self.effective_requests.items())),
            "gpu_equivalents": None if equivalents is None else round(float(equivalents), 6),
            "gpu_equivalents_approximate": self.approximate,
            "unknown": list(self.unknown),
            "shared": self.shared,
            "gpu_memory_mib": self.gpu_memory_mib,
            "vendors": list(self.vendors),
            "mig_single": self.mig_single.to_dict() if self.mig_single else None,
            "kai": self.kai.to_dict() if self.kai else None,
            "hami": self.hami.to_dict() if self.hami else None,
            "dra": (
                {"claims": [c.to_dict() for c in self.dra_claims], "gpus": self.dra_gpus}
                if self.dra_claims
                else None
            ),
            "unrequested_access": [a.to_dict() for a in self.unrequested_access],
            "privileged": [a.to_dict() for a in self.privileged],
            "invalid": list(self.invalid),
            "resource_problems": [p.to_dict() for p in self.resource_problems],
            "warnings": list(self.warnings),
            "unrecognized": list(self.unrecognized),
            "sources": [s.to_dict() for s in self.sources],
        }

    def scaled(self, replicas: int) -> GPUFacts:
        """The facts of ``replicas`` identical pods (counts, equivalents and memory multiplied)."""
        if replicas == 1:
            return self
        return replace(
            self,
            gpus={k: v * replicas for k, v in self.gpus.items()},
            mig={k: v * replicas for k, v in self.mig.items()},
            effective_requests={k: v * replicas for k, v in self.effective_requests.items()},
            equivalents_known=self.equivalents_known * replicas,
            gpu_memory_mib=None if self.gpu_memory_mib is None else self.gpu_memory_mib * replicas,
            dra_claims=tuple(
                c if c.count is None or c.resource_claim is not None
                else replace(c, count=c.count * replicas)  # a ResourceClaim is one allocation
                for c in self.dra_claims
            ),
        )


def merge(parts: Iterable[GPUFacts]) -> GPUFacts:
    """Add up the facts of several pod groups (already scaled) into workload totals.

    Counts, equivalents and memory are summed; lists are concatenated without
    duplicates; ``kai``, ``hami`` and ``mig_single`` keep the first group's value that has one
    (they describe one pod), except that an ``unknown`` MIG-single status wins.
    """
    gpus: dict[str, int] = {}
    migs: dict[str, int] = {}
    effective: dict[str, int] = {}
    equivalents = ZERO
    memory: int | None = None
    kai = hami = single = None
    approximate = shared = False
    # Lists in first-seen order without repeats (dicts as ordered sets), built once at the end.
    lists: dict[str, dict[Any, None]] = {name: {} for name in _MERGED_LISTS}
    dra_claims: list[DraClaim] = []
    sources: list[Source] = []
    for part in parts:
        for total, values in ((gpus, part.gpus), (migs, part.mig),
                              (effective, part.effective_requests)):
            for key, value in values.items():
                total[key] = total.get(key, 0) + value
        equivalents += part.equivalents_known
        if part.gpu_memory_mib is not None:
            memory = (memory or 0) + part.gpu_memory_mib
        kai = kai or part.kai
        hami = hami or part.hami
        if part.mig_single and (single is None
                                or part.mig_single.status == MigSingleStatus.UNKNOWN):
            single = part.mig_single
        approximate = approximate or part.approximate
        shared = shared or part.shared
        for name, seen in lists.items():
            seen.update(dict.fromkeys(getattr(part, name)))
        dra_claims.extend(part.dra_claims)
        sources.extend(part.sources)
    return GPUFacts(
        gpus=gpus,
        mig=migs,
        effective_requests=effective,
        equivalents_known=equivalents,
        approximate=approximate,
        shared=shared,
        gpu_memory_mib=memory,
        kai=kai,
        hami=hami,
        mig_single=single,
        dra_claims=tuple(dra_claims),
        sources=tuple(sources),
        **{name: tuple(seen) for name, seen in lists.items()},
    )


_MERGED_LISTS: Final = ("unknown", "vendors", "unrequested_access", "privileged", "invalid",
                        "resource_problems", "warnings", "unrecognized")


# --------------------------------------------------------------------------------------------
# Per-container parsing


@dataclass
class _Container:
    """One container's GPU asks, before the pod-level effective-request rules."""

    name: str
    ctype: str  # initContainers / containers / ephemeralContainers
    path: str
    sidecar: bool
    counts: dict[str, int] = field(default_factory=dict)
    equivalents: Fraction | None = ZERO
    memory_mib: int | None = None
    asks_gpu: bool = False
    claims: frozenset[str] = frozenset()
    split: HamiSplit | None = None
    asked: dict[str, int] = field(default_factory=dict)  # every GPU-related resource, as asked


@dataclass
class _Collector:
    """Mutable accumulator used while reading one pod; frozen into GPUFacts at the end."""

    invalid: list[str] = field(default_factory=list)
    resource_problems: list[ResourceProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unrecognized: list[str] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    vendors: list[str] = field(default_factory=list)
    approximate: bool = False
    shared: bool = False

    def resource_problem(
        self, container: _Container, side: str, resource: str, limits: Mapping[str, Any],
        requests: Mapping[str, Any], problem: str,
    ) -> None:
        """Record one rejected extended resource of ``container``, twice: as the ``invalid``
        text ``<path>.resources<side>[<resource>]: <problem>`` (``side`` is ``""``,
        ``".requests"`` or ``".limits"``) and as a :class:`ResourceProblem` with both values as
        written in ``limits`` / ``requests`` (the container's ``resources`` maps)."""
        where = f"{container.path}.resources{side}[{resource}]"
        self.invalid.append(f"{where}: {problem}")
        self.resource_problems.append(ResourceProblem(
            container=container.name,
            container_type=container.ctype,
            path=container.path,
            field=where,
            resource=resource,
            requests=_as_written(requests, resource),
            limits=_as_written(limits, resource),
            problem=problem,
        ))


@dataclass(frozen=True)
class _Placement:
    """What the pod's node selection says about its GPUs (product, MIG single, sharing)."""

    model: str | None = None
    mig_profile: str | None = None
    excluded_mig: bool = False
    shared: bool = False
    replicas: int | None = None
    products: frozenset[str] = frozenset()  # the nvidia.com/gpu.product values it is pinned to


_EMPTY: Mapping[str, Any] = {}


def _map(parent: Mapping[str, Any], key: str, path: str, out: _Collector) -> Mapping[str, Any]:
    """``parent[key]`` when it is a map; absent or null gives ``{}``; any other type is recorded
    in ``invalid`` (the API server would reject it) and read as ``{}``."""
    value = parent.get(key)
    if value is None or type(value) is dict or isinstance(value, Mapping):
        return value or _EMPTY
    out.invalid.append(f"{path}.{key}: expected a map, got {described(value)}")
    return _EMPTY


def _seq(parent: Mapping[str, Any], key: str, path: str, out: _Collector) -> Sequence[Any]:
    """``parent[key]`` when it is a list; like :func:`_map` otherwise."""
    value = parent.get(key)
    if value is None or isinstance(value, list):
        return value or ()
    out.invalid.append(f"{path}.{key}: expected a list, got {described(value)}")
    return ()


def _scalar(parent: Mapping[str, Any], key: str, kind: type, path: str,
            out: _Collector) -> Any:
    """``parent[key]`` when it is of the API type ``kind`` (``bool`` or ``str``), else None;
    absent or null gives None; any other type is recorded in ``invalid`` (the API server's
    decoding refuses it: ``privileged: "true"`` is not a boolean) and read as absent, so the
    object is reported as input that cannot exist, never judged as if the field were unset."""
    value = parent.get(key)
    if value is None or type(value) is kind:
        return value
    expected = "a boolean" if kind is bool else "a string"
    out.invalid.append(f"{path}.{key}: expected {expected}, got {described(value)}")
    return None


def _as_list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _entries(parent: Mapping[str, Any], key: str, path: str,
             out: _Collector) -> list[tuple[int, Mapping[str, Any]]]:
    """``(index, entry)`` of the list ``parent[key]`` whose entries must be maps (env,
    volumeMounts, volumes, resourceClaims, ...); a wrong-typed list or entry is recorded in
    ``invalid`` and skipped, so a malformed entry never hides or fakes a finding silently."""
    found = []
    for index, entry in enumerate(_seq(parent, key, path, out)):
        if type(entry) is dict or isinstance(entry, Mapping):
            found.append((index, entry))
        else:
            out.invalid.append(f"{path}.{key}[{index}]: expected a map, got "
                               f"{described(entry)}")
    return found


_INT64 = 2**63


def _cel_double(value: float) -> str:
    """``value`` as CEL's ``string()`` renders a double: the shortest digits that read back
    exactly, in exponent form below 1e-4 and from 1e6 up (``1e-05``, ``1.2345675e+06``)."""
    if not math.isfinite(value):
        return str(value)  # inf, -inf, nan
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    shortest = Decimal(repr(value)).normalize()  # repr: the shortest round-trip digits
    negative, digits, exponent = shortest.as_tuple()
    sign = "-" if negative else ""
    scientific = len(digits) - 1 + int(exponent)
    if -4 <= scientific < 6:
        return sign + format(abs(shortest), "f")
    text = "".join(map(str, digits))
    return f"{sign}{text[0]}{'.' + text[1:] if len(text) > 1 else ''}e{scientific:+03d}"


def _as_written(table: Mapping[str, Any], resource: str) -> str:
    """The value of ``resource`` in a requests / limits map as CEL's ``string()`` shows it
    (``1``, ``500m``, ``0.5``, ``true``; ints beyond int64 as doubles, as the CEL input
    conversion reads them, and beyond any double shortened like ``invalid`` shows them),
    ``null`` for a null value, JSON for a list or map, and ``not set`` when the key is absent."""
    if resource not in table:
        return "not set"
    value = table[resource]
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        if -_INT64 <= value < _INT64:
            return str(value)
        try:
            return _cel_double(float(value))
        except OverflowError:  # beyond any double: shortened, as invalid shows it
            return format_fraction(Fraction(value))
    if isinstance(value, float):
        return _cel_double(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):  # a map with keys JSON cannot hold
        return str(value)


def _read_quantity(
    resource: str, limits: Mapping[str, Any], requests: Mapping[str, Any],
    container: _Container, out: _Collector,
) -> tuple[int, str] | None:
    """Apply the extended-resource rules to one resource of one container.

    Each rule broken is recorded in ``invalid`` and ``resource_problems``
    (:meth:`_Collector.resource_problem`). Returns the count to use and its field path, or None
    when the resource asks for nothing.
    """

    def problem(side: str, text: str) -> None:
        out.resource_problem(container, side, resource, limits, requests, text)

    values: dict[str, Fraction] = {}
    for where, table in (("limits", limits), ("requests", requests)):
        if resource not in table:
            continue
        try:
            values[where] = parse_quantity(table[resource])
        except QuantityError as exc:
            problem(f".{where}", str(exc))
    if not values:
        return None
    limit, request = values.get("limits"), values.get("requests")
    if limit is None and request is not None:
        # Kubernetes validation: "Limit must be set for non overcommitable resources", even 0.
        problem(".requests", "an extended resource needs a limit; a request without a limit is "
                "rejected by the API server")
    elif limit is not None and request is not None and limit != request:
        problem("", f"requests ({format_fraction(request)}) must equal limits "
                f"({format_fraction(limit)}) for an extended resource")
    value = max(v for v in values.values())
    if value > MAX_COUNT:
        problem("", f"{format_fraction(value)} is out of range (at most {MAX_COUNT})")
        return None
    if value < 0:
        problem("", "negative quantity")
        return None
    if value.denominator != 1:
        problem("", f"{format_fraction(value)} is not a whole number; extended resources take "
                "integers")
    count = math.ceil(value)
    if count == 0:
        return None
    where = "limits" if limit is not None else "requests"
    return count, f"{container.path}.resources.{where}[{resource}]"


def _split_equivalents(
    container: _Container, family: SplitFamily, split: Mapping[ResourceKind, int], devices: int,
    out: _Collector,
) -> Fraction | None:
    """GPU-equivalents of a split ask (HAMi, Volcano, a vendor's sharing): per device its cores
    share, else its memory percentage; memory in units alone (or cores that are not a share of
    the device) depends on the device's size, so unknown."""
    cores = split.get(ResourceKind.SPLIT_CORES)
    if cores is not None and family.cores_per_device:
        return devices * Fraction(cores, family.cores_per_device)
    if ResourceKind.SPLIT_MEMORY_PERCENT in split:
        return devices * Fraction(split[ResourceKind.SPLIT_MEMORY_PERCENT], 100)
    what = "GPU memory" if ResourceKind.SPLIT_MEMORY in split else f"{family.vendor} core groups"
    out.unknown.append(
        f"{container.path}: {what} asked without a share of the device's compute; the share of "
        "the device depends on its size"
    )
    return None


def _mig_equivalents(profile: str, model: str | None, out: _Collector) -> Fraction:
    value, approximate = mig.equivalents(profile, model)
    out.approximate = out.approximate or approximate
    if model is not None and mig.lookup(model, profile) is None:
        out.warnings.append(f"MIG profile {profile} does not exist on {model} (the GPU the pod is "
                            "pinned to): the pod cannot be scheduled there")
    return value


def _container_asks(
    container: _Container, resources: Mapping[str, Any], placement: _Placement,
    settings: GPUSettings, out: _Collector,
) -> None:
    """Fill counts, equivalents and memory of one container from its resources."""
    limits = _map(resources, "limits", f"{container.path}.resources", out)
    requests = _map(resources, "requests", f"{container.path}.resources", out)
    asked: dict[str, tuple[ResourceKind, int]] = {}
    for resource in dict.fromkeys([*limits, *requests]):
        if not isinstance(resource, str):
            continue
        kind = classify(resource, settings)
        if kind is ResourceKind.OTHER:
            continue
        if kind is ResourceKind.QUALIFIER:
            continue  # qualifies the GPU ask (HAMi priority); asks for no device
        if kind is ResourceKind.UNRECOGNIZED:
            out.unrecognized.append(resource)
            side = "limits" if resource in limits else "requests"
            # Listed (name in unrecognized, path here), never valued silently as zero.
            out.warnings.append(
                f"{container.path}.resources.{side}[{resource}]: unrecognized accelerator "
                f"resource; not counted (--gpu-resource {resource} counts it as whole devices)"
            )
            continue
        if kind is ResourceKind.OBSOLETE:
            out.resource_problem(
                container, "", resource, limits, requests,
                f"obsolete resource name ({OBSOLETE_RESOURCES[resource]}); the API server rejects "
                "it",
            )
            continue
        read = _read_quantity(resource, limits, requests, container, out)
        if read is not None:
            asked[resource] = (kind, read[0])
            out.sources.append(
                Source(resource, str(read[0]), container.name, container.ctype, read[1])
            )
            out.vendors.append(vendor_of(resource))
    container.asked = {resource: count for resource, (_, count) in asked.items()}
    families: dict[SplitFamily, dict[ResourceKind, int]] = {}
    for resource, (kind, count) in asked.items():
        family = split_family(resource, settings) if kind in SPLIT_KINDS else None
        if family is not None:
            families.setdefault(family, {})[kind] = count
    spanned = {f.count for f in families if f.count}
    equivalents: Fraction | None = ZERO
    for resource, (kind, count) in asked.items():
        container.asks_gpu = True
        if kind in SPLIT_KINDS and kind is not ResourceKind.SPLIT_COUNT:
            continue
        container.counts[resource] = count
        if resource in spanned:
            continue  # the devices a split spans: valued by the split below, not as whole GPUs
        equivalents = _add(equivalents, _resource_equivalents(
            resource, kind, count, container, placement, settings, out))
    for family, split in families.items():
        devices = container.counts.get(family.count, 1) if family.count else 1
        memory = split.get(ResourceKind.SPLIT_MEMORY)
        memory_mib = (None if memory is None or family.memory_mib_per_unit is None
                      else int(memory * family.memory_mib_per_unit))
        if container.split is None:
            container.split = HamiSplit(
                gpus=devices, gpumem_mib=memory_mib,
                gpumem_percentage=split.get(ResourceKind.SPLIT_MEMORY_PERCENT),
                gpucores=split.get(ResourceKind.SPLIT_CORES))
        # All of a device's cores is the vendor's "exclusive" (HAMi gpucores 100); less shares it.
        out.shared = out.shared or family.cores_per_device is None or \
            split.get(ResourceKind.SPLIT_CORES) != family.cores_per_device
        equivalents = _add(equivalents, _split_equivalents(container, family, split, devices,
                                                           out))
        if memory_mib is not None:
            container.memory_mib = (container.memory_mib or 0) + memory_mib * devices
    container.equivalents = equivalents


def _resource_equivalents(
    resource: str, kind: ResourceKind, count: int, container: _Container,
    placement: _Placement, settings: GPUSettings, out: _Collector,
) -> Fraction | None:
    """GPU-equivalents of ``count`` units of one non-split resource."""
    if kind is ResourceKind.CORES:
        cores = cores_per_device(resource)
        if cores is not None:
            return Fraction(count, cores)
        out.unknown.append(
            f"{container.path}: {resource} counts cores; cores per device depend on the chip"
        )
        return None
    if kind is ResourceKind.VGPU:
        out.shared = True
        part, reason = vgpu.share(resource)
        if part is None:
            out.unknown.append(f"{container.path}: {reason}")
            return None
        return count * part
    if kind is ResourceKind.MIG:
        profile, _ = mig.profile_from_resource(resource) or ("", False)
        return count * _mig_equivalents(profile, placement.model, out)
    if kind is ResourceKind.SHARED:
        out.shared = True
        per_device = Fraction(1)
        parsed = mig.profile_from_resource(resource)
        if parsed is not None:
            per_device = _mig_equivalents(parsed[0], placement.model, out)
        replicas = settings.replicas_for(resource) or placement.replicas \
            or settings.replicas_on(placement.products)
        if replicas is None:
            out.unknown.append(
                f"{container.path}: {resource} is a shared replica and the replica count is "
                "unknown (set --shared-replicas)"
            )
            return None
        return count * per_device / replicas
    if resource == "nvidia.com/gpu":
        if placement.shared:
            out.shared = True
            replicas = placement.replicas or settings.replicas_for(resource) \
                or settings.replicas_on(placement.products)
            if replicas is None:
                out.unknown.append(
                    f"{container.path}: nvidia.com/gpu on a node pinned to GPU sharing is a "
                    "replica, and the replica count is unknown (set --shared-replicas)"
                )
                return None
            return Fraction(count, replicas)
        if placement.mig_profile:
            return count * _mig_equivalents(placement.mig_profile, placement.model, out)
    return Fraction(count)


def _add(total: Fraction | None, value: Fraction | None) -> Fraction:
    """Sum of the known parts: an unknown part (None) adds nothing; it is noted in ``unknown``."""
    if not value:
        return total or ZERO
    return value if not total else total + value


def _effective(values: Sequence[tuple[_Container, _N]]) -> _N:
    """Kubernetes ``PodRequests`` for one resource: max(app + sidecars, init peak).

    Init containers run one by one, each alongside the sidecars started before it; app containers
    run together with every sidecar. Ephemeral containers ask for nothing.
    """
    sidecars: Any = 0
    init_peak: Any = 0
    app: Any = 0
    for container, value in values:
        if container.ctype == "initContainers":
            if container.sidecar:
                sidecars += value
                init_peak = max(init_peak, sidecars)
            else:
                init_peak = max(init_peak, value + sidecars)
        elif container.ctype == "containers":
            app += value
    effective: _N = max(app + sidecars, init_peak)
    return effective


# --------------------------------------------------------------------------------------------
# Pod-level facts: placement, KAI, DRA, access


def _selector_values(spec: Mapping[str, Any], key: str) -> set[str] | None:
    # Shapes were checked by _placement; here wrong types simply do not pin.
    """Values a pod is pinned to for a node label: nodeSelector, or every required affinity term.

    Returns None when the pod does not pin the label.
    """
    selector = as_mapping(spec.get("nodeSelector"))
    if key in selector and isinstance(selector[key], str):
        return {selector[key]}
    affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = _as_list(required.get("nodeSelectorTerms"))
    values: set[str] = set()
    for term in terms:
        term_values = None
        for expression in _as_list(as_mapping(term).get("matchExpressions")):
            expression = as_mapping(expression)
            if expression.get("key") == key and expression.get("operator") == "In":
                term_values = {str(v) for v in _as_list(expression.get("values"))}
        if term_values is None:
            return None  # one term leaves the label open: the pod is not pinned
        values |= term_values
    return values or None


def _placement(spec: Mapping[str, Any], spec_path: str, out: _Collector) -> _Placement:
    """What node selection tells about the GPU: model, MIG single profile, sharing."""
    selector = _map(spec, "nodeSelector", spec_path, out)  # an empty list is a wrong type too
    affinity = _map(spec, "affinity", spec_path, out)
    if not selector and not affinity:
        return _Placement()
    for key, value in selector.items():
        if not isinstance(value, str):
            out.invalid.append(f"{spec_path}.nodeSelector[{key}]: expected a string, got "
                               f"{described(value)}")
    _map(affinity, "nodeAffinity", f"{spec_path}.affinity", out)
    model = mig_profile = None
    excluded = shared = False
    replicas = None
    products = _selector_values(spec, PRODUCT_LABEL)
    if products:
        parsed = {mig.parse_product(p) for p in products}
        models = {p.model for p in parsed}
        profiles = {p.mig_profile for p in parsed}
        if len(models) == 1:
            model = next(iter(models))
        if len(profiles) == 1:
            mig_profile = next(iter(profiles))
            excluded = mig_profile is None
        shared = all(p.shared for p in parsed)
    accelerators = _selector_values(spec, GKE_ACCELERATOR)
    if model is None and accelerators and len(accelerators) == 1:
        model = mig.model_from_gke_accelerator(next(iter(accelerators)))
    partitions = _selector_values(spec, GKE_PARTITION)
    if partitions and len(partitions) == 1:
        mig_profile, excluded = next(iter(partitions)), False
    strategies = _selector_values(spec, SHARING_LABEL) or _selector_values(spec, GKE_SHARING)
    if strategies and strategies <= {"time-slicing", "mps", "time-sharing"}:
        shared = True
    for key in (GKE_MAX_CLIENTS, REPLICAS_LABEL):
        pinned = _selector_values(spec, key)
        value = parse_count(next(iter(pinned))) if pinned and len(pinned) == 1 else None
        if value is not None:
            replicas = value if value > 1 else replicas
    return _Placement(model, mig_profile, excluded, shared, replicas, frozenset(products or ()))


def _kai(
    annotations: Mapping[str, Any], containers: Sequence[_Container], where: str,
    out: _Collector,
) -> tuple[KaiShare | None, Fraction | None]:
    """Read the KAI / Run:ai annotations (``where`` is their metadata path): (details,
    equivalents). The annotated container counts as asking for a GPU.

    Values are read as KAI's admission reads them (KAI-Scheduler ``pkg/common/resources``:
    ``gpu-fraction`` a float above 0 and below 1, ``gpu-memory`` and ``gpu-fraction-num-devices``
    positive base-10 integers, no spaces). A value KAI rejects is in ``invalid``, and the share it
    stood for in ``unknown`` naming the annotation: equivalents None, never 0, so quota's
    ``unknownSize: Deny`` denies and policies see the pod as asking for a GPU of unknown size.
    """
    texts: dict[str, str] = {}
    for key in (KAI_FRACTION, KAI_MEMORY, KAI_DEVICES, KAI_CONTAINER):
        if key in annotations and annotations[key] is not None:
            value = annotations[key]
            if not isinstance(value, str):
                out.invalid.append(f"{where}.annotations[{key}]: annotation values must be "
                                   f"strings, got {described(value)}")
            texts[key] = str(value)
    if KAI_FRACTION not in texts and KAI_MEMORY not in texts:
        return None, Fraction(0)
    share_of: float | None = None
    memory_of: int | None = None
    devices_of = 1
    devices_known = True
    if KAI_DEVICES in texts:
        devices = parse_count(texts[KAI_DEVICES])
        if devices:
            devices_of = devices
        else:
            devices_known = False
            out.invalid.append(f"{where}.annotations[{KAI_DEVICES}]: {texts[KAI_DEVICES]!r} is "
                               "not a positive integer")
            out.unknown.append(f"{where}.annotations[{KAI_DEVICES}]: {texts[KAI_DEVICES]!r} is "
                               "not a number of GPUs, so how many GPUs the share spans is unknown")
    equivalents: Fraction | None = None
    if KAI_FRACTION in texts:
        text = texts[KAI_FRACTION]
        # A plain decimal, as KAI writes it: Fraction('1e-999999999') alone takes minutes.
        fraction = Fraction(text) if _DECIMAL.fullmatch(text) else Fraction(-1)
        # KAI parses a float64: 1e-999 is 0 and 0.99999999999999999 is 1 there, both rejected.
        if 0 < fraction < 1 and 0 < float(fraction) < 1:
            share_of = float(fraction)
            equivalents = fraction * devices_of if devices_known else None
        else:
            out.invalid.append(
                f"{where}.annotations[{KAI_FRACTION}]: {text!r} is not a fraction of a GPU "
                "(KAI accepts a number above 0 and below 1; a whole GPU is asked as "
                "nvidia.com/gpu)"
            )
            out.unknown.append(f"{where}.annotations[{KAI_FRACTION}]: {text!r} is not a valid "
                               "fraction, so the share of a GPU it asks for is unknown")
    if KAI_MEMORY in texts:
        memory = texts[KAI_MEMORY]
        if KAI_FRACTION in texts:
            out.invalid.append(f"{where}.annotations: KAI rejects a pod with both {KAI_FRACTION} "
                               f"and {KAI_MEMORY}")
        if memory_mib := parse_count(memory):
            memory_of = memory_mib
            if KAI_FRACTION not in texts:
                out.unknown.append(
                    f"{where}.annotations[{KAI_MEMORY}]: {memory} MiB of GPU memory; the share "
                    "of a GPU depends on the GPU's memory size"
                )
        else:
            out.invalid.append(f"{where}.annotations[{KAI_MEMORY}]: {memory!r} is not a number "
                               "of MiB (KAI accepts a positive integer)")
            if KAI_FRACTION not in texts:
                out.unknown.append(f"{where}.annotations[{KAI_MEMORY}]: {memory!r} is not a "
                                   "valid amount of GPU memory, so the share of a GPU it asks "
                                   "for is unknown")
    wanted = texts.get(KAI_CONTAINER)
    if wanted is not None:
        target = next(
            (c for c in containers if c.name == wanted and c.ctype != "ephemeralContainers"), None
        )
        if target is None:
            out.invalid.append(f"{where}.annotations[{KAI_CONTAINER}]: no container named "
                               f"{wanted!r}")
    else:
        target = next((c for c in containers if c.ctype == "containers"), None)
    if target is not None:
        target.asks_gpu = True
    out.shared = True
    out.vendors.append("nvidia")
    return KaiShare(share_of, memory_of, devices_of,
                    target.name if target is not None else None), equivalents


def _dra(
    spec: Mapping[str, Any], spec_path: str, namespace: str | None, index: DraIndex,
    containers: Sequence[_Container], out: _Collector, claims_path: str | None = None,
    model: str | None = None,
) -> tuple[tuple[DraClaim, ...], Fraction]:
    """Pod-level ResourceClaims that ask for GPUs, resolved against the DRA objects of the
    input: (claims, their known GPU-equivalents). A claim whose devices are not GPUs (an IMEX
    channel) is left out; one whose count or size is unknown is named in ``unknown``. Its MIG
    slices are valued as the ``nvidia.com/mig-<profile>`` form is (``model``: the GPU the pod
    is pinned to), the rest of its devices as whole GPUs."""
    claims = []
    equivalents = ZERO
    for index_, entry in _entries(spec, "resourceClaims", spec_path, out):
        name = str(entry.get("name", ""))
        template = entry.get("resourceClaimTemplateName")
        source = as_mapping(entry.get("source"))  # pre-1.31 shape
        template = template or source.get("resourceClaimTemplateName")
        claim_name = entry.get("resourceClaimName") or source.get("resourceClaimName")
        path = f"{claims_path or spec_path + '.resourceClaims'}[{index_}]"
        if template:
            what = f"ResourceClaimTemplate {str(template)!r}"
            known = index.template(namespace, str(template))
        elif claim_name:
            what = f"ResourceClaim {str(claim_name)!r}"
            known = index.claim(namespace, str(claim_name))
        else:
            out.invalid.append(f"{path}: names neither resourceClaimName nor "
                               "resourceClaimTemplateName")
            continue
        shared_by = index.users(namespace, str(claim_name)) if claim_name and not template else 1
        device_class: str | None = None
        count: int | None = None
        migs: Mapping[str, int] = {}
        if known is not None:
            if known.gpu is False:
                continue  # a claim for something other than a GPU (a NIC, an IMEX channel)
            device_class, count, migs = known.device_class, known.count, known.mig
            if count is None:
                out.unknown.append(f"{path}: {what} states no usable device count "
                                   "(allocationMode All, an invalid count, or alternatives of "
                                   "different counts)")
            elif known.unknown:
                out.unknown.append(f"{path}: {what}: {known.unknown}; its GPU-equivalents are "
                                   "unknown")
            else:
                slices = sum((_mig_equivalents(p, model, out) * n for p, n in migs.items()), ZERO)
                equivalents += (Fraction(count - sum(migs.values())) + slices) / shared_by
        else:
            out.unknown.append(f"{path}: {what} is not in the input; its device count is unknown")
        if shared_by > 1:
            out.shared = True
        claims.append(DraClaim(name, str(template) if template else None, device_class, count,
                               path, str(claim_name) if claim_name and not template else None,
                               shared_by, dict(migs), known is not None))
        for container in containers:
            if name in container.claims:
                container.asks_gpu = True
        # DeviceClass names end in the driver's domain (gpu.nvidia.com, gpu.amd.com); with the
        # class unknown (template not in the input) the vendor is unknown too.
        if device_class and "." in device_class:
            out.vendors.append(vendor_of(f"{device_class.split('.', 1)[1]}/device"))
    return tuple(claims), equivalents


def _legacy_index(
    claim_templates: Mapping[tuple[str | None, str], tuple[str | None, int | None]],
) -> DraIndex:
    """A :class:`DraIndex` of ``(namespace, name) -> (GPU device class, count)`` pairs (the
    shape :func:`policies.facts.workloads.claim_templates_of` gives): no class means no GPU."""
    templates = {}
    for key, (cls, count) in claim_templates.items():
        is_gpu = device_class_is_gpu(cls) if cls is not None else False
        if cls in MIG_DEVICE_CLASSES:  # the pair has no profile: MIG slices of unknown profile
            templates[key] = ClaimDevices(cls, count, True, f"DeviceClass {cls!r} gives MIG "
                                          "slices of unknown profile",
                                          {UNKNOWN_MIG_PROFILE: count or 1})
            continue
        templates[key] = ClaimDevices(cls, count, False if cls is None else is_gpu,
                                      None if is_gpu else f"DeviceClass {cls!r} may not be a GPU")
    return DraIndex(templates=templates)


def _access(
    container_spec: Mapping[str, Any], container: _Container, volumes: Mapping[str, str],
    out: _Collector,
) -> tuple[list[Access], list[Access]]:
    """(unrequested GPU access, privileged) findings for one container."""
    reach: list[Access] = []
    privileged: list[Access] = []

    def note(target: list[Access], path: str, reason: str, certain: bool = True) -> None:
        target.append(Access(container.name, container.ctype, f"{container.path}.{path}", reason,
                             certain))

    security = _map(container_spec, "securityContext", container.path, out)
    if _scalar(security, "privileged", bool, f"{container.path}.securityContext", out) is True:
        note(privileged, "securityContext.privileged", "privileged container")
    capabilities = f"{container.path}.securityContext.capabilities"
    added: list[str] = []
    for index, capability in enumerate(_seq(_map(
            security, "capabilities", f"{container.path}.securityContext", out), "add",
            capabilities, out)):
        if type(capability) is str:
            added.append(capability.upper().removeprefix("CAP_"))
        else:
            out.invalid.append(f"{capabilities}.add[{index}]: expected a string, got "
                               f"{described(capability)}")
    if _ALL_CAPABILITIES in added:
        note(privileged, "securityContext.capabilities.add",
             f"adds capability ALL (every capability, {', '.join(_PRIVILEGED_CAPABILITIES)} "
             "included)")
    else:
        for capability in _PRIVILEGED_CAPABILITIES:
            if capability in added:
                note(privileged, "securityContext.capabilities.add",
                     f"adds capability {capability}")
    env_list = _entries(container_spec, "env", container.path, out)
    env_from = _entries(container_spec, "envFrom", container.path, out)
    mounts = _entries(container_spec, "volumeMounts", container.path, out)
    if container.asks_gpu:
        return reach, privileged
    reach.extend(
        replace(p, reason=f"{p.reason}: sees every device on the node without requesting a GPU")
        for p in privileged
    )
    for index, env in env_list:
        name = _scalar(env, "name", str, f"{container.path}.env[{index}]", out)
        if name not in _DEVICE_ENV:
            continue
        if "valueFrom" in env:
            note(reach, f"env[{index}]", f"{name} is set from a reference (value unknown) "
                 "without requesting a GPU")
            continue
        value = str(env.get("value") or "").strip()
        if value.lower() not in _NO_DEVICE_VALUES:
            note(reach, f"env[{index}]", f"{name}={value} without requesting a GPU")
    # An env entry of the same name wins over envFrom (Kubernetes API, EnvFromSource), so only
    # the device variables env leaves unset can come from the ConfigMap / Secret.
    set_by_env = {env.get("name") for _, env in env_list} if env_from else ()
    for index, source in env_from:
        names = _env_from_device_names(source, set_by_env)
        if names:
            # A prefix that begins a device variable asks for one; no prefix is every app's
            # envFrom, which sets a device variable only if its ConfigMap / Secret has one.
            note(reach, f"envFrom[{index}]", f"{_env_from_source(source)} may set "
                 f"{', '.join(names)} (value unknown) without requesting a GPU",
                 certain=bool(source.get("prefix")))
    for index, mount in mounts:
        host_path = volumes.get(str(mount.get("name")))
        if host_path is None:
            continue
        exposure = _host_path_exposure(host_path)
        if exposure is not None:
            note(reach, f"volumeMounts[{index}]",
                 f"mounts hostPath {host_path}{exposure} without requesting a GPU")
    return reach, privileged


def _env_from_device_names(source: Mapping[str, Any], set_by_env: Collection[Any]) -> list[str]:
    """The device env variables (``_DEVICE_ENV``) one ``envFrom`` entry could set: the ones its
    ``prefix`` (none: ``""``) begins and ``set_by_env`` (the container's ``env`` names) does not
    override. The ConfigMap / Secret's keys are unknown at admission, so any of them may."""
    prefix = source.get("prefix")
    prefix = "" if prefix is None else str(prefix)
    return [n for n in _DEVICE_ENV if n.startswith(prefix) and n not in set_by_env]


def _env_from_source(source: Mapping[str, Any]) -> str:
    """``envFrom`` entry -> ``"envFrom ConfigMap 'gpu-env'"`` (prefix included when set)."""
    for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        ref = source.get(key)
        if isinstance(ref, Mapping):
            named = f"{kind} {str(ref.get('name'))!r}"
            break
    else:
        named = "an unknown source"
    prefix = source.get("prefix")
    return f"envFrom {named}" + (f" with prefix {str(prefix)!r}" if prefix else "")


def _host_path_exposure(path: str) -> str | None:
    """Whether a hostPath ``path`` exposes GPU device files: None when it does not, else the
    note for the finding (``""`` for a path already written clean).

    The path is cleaned as the kernel resolves it when the kubelet mounts it (repeated ``/`` and
    ``.`` elements dropped; relative read from ``/``, as before); it exposes devices when it is
    ``/dev``, an ancestor of ``/dev`` (``/``: the whole host filesystem) or under a device path
    of ``_DEVICE_PATHS``. A ``..`` element the API server refuses (``validatePathNoBacksteps``),
    so its target is unknown here and it counts as exposing. An empty path (refused: required)
    exposes nothing. Symlinks on the node cannot be seen from the pod spec.
    """
    if path == "":
        return None
    if "." not in path and "//" not in path:  # the usual spelling: only outer slashes to drop
        cleaned = "/" + path.strip("/")
    else:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            return " (a '..' element: the API server refuses it, the target is unknown)"
        cleaned = "/" + "/".join(parts)
    if cleaned == "/":
        return " (the whole host filesystem, /dev included)"
    if cleaned != "/dev" and not cleaned.startswith(_DEVICE_PATHS):
        return None
    return "" if cleaned == path else f" (= {cleaned})"


def _metadata_path(spec_path: str) -> str:
    """``spec.template.spec`` -> ``spec.template.metadata`` (``spec`` -> ``metadata``)."""
    parent = spec_path.rpartition(".")[0]
    return f"{parent}.metadata" if parent else "metadata"


def _host_path_volumes(spec: Mapping[str, Any], spec_path: str, out: _Collector) -> dict[str, str]:
    volumes = {}
    for index, volume in _entries(spec, "volumes", spec_path, out):
        host = _map(volume, "hostPath", f"{spec_path}.volumes[{index}]", out)
        path = _scalar(host, "path", str, f"{spec_path}.volumes[{index}].hostPath", out)
        if path is not None:
            volumes[str(volume.get("name"))] = path
    return volumes


def _extended_resource_classes(
    index: DraIndex, settings: GPUSettings, placement: _Placement
) -> tuple[GPUSettings, _Placement]:
    """Apply the input's DeviceClasses with ``extendedResourceName`` (KEP-5004): a GPU class
    makes its resource count as whole devices; one whose selectors pin a MIG profile makes
    ``nvidia.com/gpu`` that profile, as a ``-MIG-<profile>`` product pin does."""
    mapped = index.extended_resources()
    if not mapped:
        return settings, placement
    whole = tuple(r for r, c in mapped.items()
                  if c.gpu and r not in settings.extra_whole_resources)
    if whole:
        settings = replace(settings, extra_whole_resources=(*settings.extra_whole_resources,
                                                            *whole))
    gpu_class = mapped.get("nvidia.com/gpu")
    if gpu_class is not None and gpu_class.mig_profile and placement.mig_profile is None:
        placement = replace(placement, mig_profile=gpu_class.mig_profile, excluded_mig=False)
    return settings, placement


def pod_facts(
    spec: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None = None,
    *,
    spec_path: str = "spec",
    settings: GPUSettings = DEFAULT_SETTINGS,
    claim_templates: Mapping[tuple[str | None, str], tuple[str | None, int | None]] | None = None,
    namespace: str | None = None,
    dra: DraIndex | None = None,
    claims_path: str | None = None,
) -> GPUFacts:
    """Compute the GPU facts of one pod or pod template.

    Args:
        spec: the PodSpec (``Pod.spec`` or ``template.spec``); None or malformed parts count as
            empty and are reported in ``invalid``.
        metadata: the pod's (or template's) metadata, for KAI annotations.
        spec_path: field path of ``spec`` inside the object, e.g. ``spec.template.spec``; every
            path in the result starts with it.
        settings: the cluster's GPU naming and sharing (see :class:`GPUSettings`).
        claim_templates: ``(namespace, name) -> (device class, device count)`` of
            ResourceClaimTemplates known from the same input (namespace None matches any).
        namespace: the pod's namespace, to look up claim templates.
        dra: the DRA objects of the input (:func:`policies.facts.workloads.dra_index_of`):
            ResourceClaims, templates, DeviceClasses; replaces ``claim_templates`` when given.
            A DeviceClass whose ``extendedResourceName`` a container asks for (KEP-5004) makes
            that resource one device of the class: a GPU, or the MIG profile its selectors pin.
        claims_path: where ``spec.resourceClaims`` was written, when an operator's field stands
            for it (the NIM operator's ``spec.draResources``); paths of claims start with it.

    Returns:
        Frozen :class:`GPUFacts`; never raises for malformed objects.
    """
    out = _Collector()
    if spec is not None and not isinstance(spec, Mapping):
        out.invalid.append(f"{spec_path}: expected a PodSpec map, got {described(spec)}")
    spec = as_mapping(spec)
    metadata = as_mapping(metadata)
    dra_index = dra if dra is not None else _legacy_index(claim_templates or {})
    placement = _placement(spec, spec_path, out)
    settings, placement = _extended_resource_classes(dra_index, settings, placement)
    volumes = _host_path_volumes(spec, spec_path, out)
    containers: list[tuple[_Container, Mapping[str, Any]]] = []
    for ctype in _CONTAINER_TYPES:
        entries = spec.get(ctype)
        if entries is not None and not isinstance(entries, list):
            out.invalid.append(f"{spec_path}.{ctype}: expected a list of containers")
            continue
        for index, raw in enumerate(_as_list(entries)):
            path = f"{spec_path}.{ctype}[{index}]"
            if not isinstance(raw, Mapping):
                out.invalid.append(f"{path}: expected a container object")
                continue
            container = _Container(
                name=str(raw.get("name", "")), ctype=ctype, path=path,
                sidecar=ctype == "initContainers" and raw.get("restartPolicy") == "Always",
            )
            resources = _map(raw, "resources", path, out)
            container.claims = frozenset(
                str(c.get("name")) for _, c in _entries(resources, "claims", f"{path}.resources",
                                                        out)
            )
            if ctype != "ephemeralContainers":
                _container_asks(container, resources, placement, settings, out)
            containers.append((container, raw))
    plain = [c for c, _ in containers]
    annotations = _map(metadata, "annotations", _metadata_path(spec_path), out)
    _map(metadata, "labels", _metadata_path(spec_path), out)  # queue labels: policies read them
    kai, kai_equivalents = _kai(annotations, plain, _metadata_path(spec_path), out)
    claims, dra_equivalents = _dra(spec, spec_path, namespace, dra_index, plain, out,
                                  claims_path, placement.model)

    gpus: dict[str, int] = {}
    for resource in dict.fromkeys(r for c in plain for r in c.counts):
        value = _effective([(c, c.counts.get(resource, 0)) for c in plain])
        if value:
            gpus[resource] = int(value)
    effective_requests = {}
    for resource in dict.fromkeys(r for c in plain for r in c.asked):
        value = _effective([(c, c.asked.get(resource, 0)) for c in plain])
        if value:
            effective_requests[resource] = int(value)
    migs = {}
    for resource in list(gpus):
        parsed = mig.profile_from_resource(resource)
        if parsed is not None and not parsed[1]:
            migs[parsed[0]] = gpus.pop(resource)
    for claim in claims:  # DRA MIG slices: the same facts as nvidia.com/mig-<profile>
        for profile, slices in claim.mig.items():
            migs[profile] = migs.get(profile, 0) + slices
    equivalents = _effective([(c, c.equivalents or ZERO) for c in plain])
    equivalents = _add(equivalents, kai_equivalents)
    equivalents = _add(equivalents, dra_equivalents)
    memory = _effective([(c, c.memory_mib or 0) for c in plain])
    if kai and kai.memory_mib:
        memory = (memory or 0) + kai.memory_mib * kai.devices

    reach: list[Access] = []
    privileged: list[Access] = []
    for container, raw in containers:
        found_reach, found_privileged = _access(raw, container, volumes, out)
        reach += found_reach
        privileged += found_privileged

    single = None
    if "nvidia.com/gpu" in gpus:
        if placement.mig_profile:
            single = MigSingle(MigSingleStatus.PINNED, placement.mig_profile, placement.model)
        elif placement.excluded_mig:
            single = MigSingle(MigSingleStatus.EXCLUDED, None, placement.model)
        else:
            single = MigSingle(MigSingleStatus.UNKNOWN)
    hami = _hami_details(plain)
    return GPUFacts(
        gpus=gpus,
        mig=migs,
        effective_requests=effective_requests,
        equivalents_known=equivalents,
        approximate=out.approximate,
        unknown=tuple(dict.fromkeys(out.unknown)),
        shared=out.shared,
        gpu_memory_mib=int(memory) if memory else None,
        vendors=tuple(sorted(set(out.vendors))),
        mig_single=single,
        kai=kai,
        hami=hami,
        dra_claims=claims,
        unrequested_access=tuple(reach),
        privileged=tuple(privileged),
        invalid=tuple(dict.fromkeys(out.invalid)),
        resource_problems=tuple(dict.fromkeys(out.resource_problems)),
        warnings=tuple(dict.fromkeys(out.warnings)),
        unrecognized=tuple(dict.fromkeys(out.unrecognized)),
        sources=tuple(out.sources),
    )


def claim_object_facts(
    obj: Mapping[str, Any], *, settings: GPUSettings = DEFAULT_SETTINGS,
    dra: DraIndex | None = None,
) -> GPUFacts:
    """The GPU facts of one ResourceClaim or ResourceClaimTemplate object by itself: what a pod
    naming it would be given (its GPUs, MIG slices by profile in ``mig``, GPU-equivalents), read
    by :func:`policies.facts.dra.claim_devices` as for a pod's claim.

    ``dra`` (the input's DRA objects) gives the DeviceClasses and, for this very object, its
    entry read with the input's ResourceSlices; without it (at the webhook, where only the
    object is sent) the classes are known by name only: ``mig.nvidia.com`` and the request's own
    selectors (``type == 'mig'``, a ``profile`` attribute) make MIG slices, and a DeviceClass
    whose own selectors pick MIG slices under another name cannot be seen. Paths name the
    object's ``devices.requests``. Never raises.
    """
    metadata = as_mapping(obj.get("metadata"))
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    # A nameless object (reported by its reader) is still judged: it stands for itself here.
    names = [n for n in (metadata.get("name"), metadata.get("generateName"))
             if isinstance(n, str) and n]
    name = names[0] if names else "(no name)"
    key = (namespace or None, name)
    template = obj.get("kind") == "ResourceClaimTemplate"
    known = None
    if dra is not None:  # the input's own reading of this object (its slices, its allocation)
        known = (dra.templates if template else dra.claims).get(key)
    if known is None:
        known = claim_devices(obj, dra.device_classes if dra is not None else {})
    index = DraIndex(templates={key: known} if template else {},
                     claims={} if template else {key: known},
                     device_classes=dra.device_classes if dra is not None else {})
    entry = {"name": name, "resourceClaimTemplateName" if template else "resourceClaimName": name}
    where = claim_requests_path(obj)
    facts = pod_facts({"resourceClaims": [entry]}, spec_path="spec", settings=settings,
                      namespace=key[0], dra=index, claims_path=where)
    # One entry stands for the whole object: its path is the requests list, not an index in it.
    def placed(text: str) -> str:
        return text.replace(f"{where}[0]", where)
    return replace(facts, unknown=tuple(placed(u) for u in facts.unknown),
                   invalid=tuple(placed(i) for i in facts.invalid),
                   dra_claims=tuple(replace(c, path=placed(c.path)) for c in facts.dra_claims))


def _hami_details(containers: Sequence[_Container]) -> HamiSplit | None:
    """The HAMi / Volcano split of the first container that has one (per GPU it spans)."""
    return next((c.split for c in containers if c.split), None)


# KubeVirt vGPU types are named like GRID_T4-1Q / NVIDIA_A10-4C (a framebuffer share), passthrough
# devices after the chip (GA102GL_A10); see the KubeVirt user guide, "Host devices assignment".
_VGPU_NAME = re.compile(r"grid|vgpu|-\d+[qabc]$", re.I)


def virtual_machine_facts(
    domain: Mapping[str, Any], path: str, claims: Collection[str] = (),
    settings: GPUSettings = DEFAULT_SETTINGS,
) -> GPUFacts:
    """GPU facts of a KubeVirt VM from ``domain.devices.gpus`` and ``hostDevices``.

    Each entry is one device of the resource named by ``deviceName``; passthrough GPUs are whole
    (one GPU-equivalent each). vGPU types (``nvidia.com/GRID_A100-4C``: a framebuffer share of
    one GPU) are shared and valued at that share (:func:`policies.facts.vgpu.share`: 4 GB of a
    40 GB A100 is 1/10); a type whose board is not in the vGPU table is counted as a device, its
    GPU-equivalents left out of ``equivalents_known`` and named in ``unknown`` — never valued as
    zero, nor as a whole GPU, without a word. A ``hostDevices`` entry counts when the resource
    registry (:func:`policies.facts.resource_names.classify`, ``settings`` included) knows its
    name as a GPU (``nvidia.com/GA100_A100_PCIE_40GB``, ``amd.com/MI300X``); one it calls ``OTHER``
    is not a GPU (a NIC, a USB disk, ``intel.com/qat`` QuickAssist crypto) and one that only
    looks like an accelerator (``devices.kubevirt.io/vfio-gpu``) is listed in ``unrecognized``,
    as a Node's would be, not counted. A field of the wrong type (``devices`` not a map,
    ``gpus`` not a list, an entry not a map, a ``deviceName`` not a string) is in ``invalid``.

    A ``gpus`` entry with ``claimName`` (KubeVirt GPUsWithDRA) is a device of that pod-level
    ResourceClaim: counted by the claim (:func:`pod_facts` on the VMI spec), not here; a
    ``claimName`` that no ``spec.resourceClaims`` entry has is in ``invalid``.

    Args:
        domain: the VM's ``domain`` (already a map; its own type is checked by the caller).
        path: its field path (``spec.domain``; ``spec.template.spec.domain`` for a VM).
        claims: the names of the VMI spec's ``resourceClaims``.
    """
    out = _Collector()
    devices = _map(as_mapping(domain), "devices", path, out)
    counts: dict[str, int] = {}
    equivalents = ZERO
    for key in ("gpus", "hostDevices"):
        for index, entry in enumerate(_seq(devices, key, f"{path}.devices", out)):
            where = f"{path}.devices.{key}[{index}]"
            if not isinstance(entry, Mapping):
                out.invalid.append(f"{where}: expected a device map, got {described(entry)}")
                continue
            name = entry.get("deviceName")
            claim = entry.get("claimName")
            if name is None and isinstance(claim, str) and claim:
                if claim not in claims:
                    out.invalid.append(f"{where}.claimName: {claim!r} names no entry of the "
                                       "VM's spec.resourceClaims")
                continue  # a DRA device: the claim counts it
            if not isinstance(name, str) or not name:
                out.invalid.append(f"{where}.deviceName: expected a resource name, got "
                                   f"{shortened(repr(name))}")
                continue
            if key == "hostDevices":
                kind = classify(name, settings)
                if kind is ResourceKind.OTHER:
                    continue  # a NIC, a USB device, a crypto or storage accelerator
                if kind is ResourceKind.UNRECOGNIZED:
                    out.unrecognized.append(name)  # listed, never counted as zero silently
                    continue
            counts[name] = counts.get(name, 0) + 1
            out.sources.append(Source(name, "1", str(entry.get("name", "")), key, where))
            out.vendors.append(vendor_of(name))
            if key == "gpus" and _VGPU_NAME.search(name.split("/", 1)[-1]):
                out.shared = True
                part, reason = vgpu.share(name)
                if part is None:
                    out.unknown.append(f"{where}: {reason}")
                else:
                    equivalents += part
            else:
                equivalents += 1
    return GPUFacts(
        gpus=counts, effective_requests=counts, equivalents_known=equivalents,
        unknown=tuple(out.unknown), shared=out.shared,
        vendors=tuple(sorted(set(out.vendors))), invalid=tuple(out.invalid),
        unrecognized=tuple(dict.fromkeys(out.unrecognized)), sources=tuple(out.sources),
    )


def pinned_product(spec: Mapping[str, Any] | None) -> str | None:
    """The GPU product (``nvidia.com/gpu.product`` value) a PodSpec is pinned to, or None.

    A pod is pinned when its nodeSelector names one product, or when every required node-affinity
    term allows exactly the same single product (:func:`_selector_values`). The MIG-single and
    ``-SHARED`` suffixes are stripped (``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`` →
    ``NVIDIA-A100-SXM4-80GB``), so quota per product counts the physical model. Used by quota.
    """
    values = _selector_values(as_mapping(spec), PRODUCT_LABEL)
    if not values:
        return None
    bases = {mig.parse_product(v).base for v in values}
    return next(iter(bases)) if len(bases) == 1 else None
