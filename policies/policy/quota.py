"""GPU quota arithmetic: ``GPUQuota`` documents, the usage of pods, a request's charge, the check.

Pure: no I/O, no clock. The numbers come from the same GPU facts as the policies and the auditor
(:func:`policies.facts.workloads.workload_facts`), so admission, ``gpuguard check --snapshot`` and
the audit report agree. Units: GPU-equivalents (a Fraction of one GPU: a whole GPU is 1, a MIG
``3g.40gb`` slice of an A100-80GB is 3/7, a KAI 0.5 fraction is 1/2), whole devices per vendor
resource, GPU memory in MiB internally and GiB in documents and messages, MIG instances per
profile, GPU-equivalents per pinned GPU product.

What is counted (see ``docs/quota.md``):

- **Pods only.** A Deployment, Job, … is not charged when it is created: its pods are, one by one,
  when the controller creates them. Counting both would charge every GPU twice.
- **CREATE** charges the pod's usage; **UPDATE** charges only the increase (new minus old, per
  dimension, never below 0); DELETE and CONNECT charge nothing.
- Pods that are finished (``Succeeded`` / ``Failed``) hold nothing; pending and running pods do.

The cluster side (watch cache of pods, the reservation ledger that keeps replicas consistent)
lives in :mod:`kube.pod_cache` and :mod:`kube.quota_ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from policies.facts import mig
from policies.facts.dra import UNKNOWN_MIG_PROFILE, DraIndex
from policies.facts.gpu import DraClaim, pinned_product
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.facts.workloads import workload_facts
from policies.json_fields import mapping_at
from policies.vocabulary import FailurePolicy, parsed

QUOTA_KIND = "GPUQuota"
MIB_PER_GIB = 1024
FINISHED_PHASES = ("Succeeded", "Failed")
_ZERO = Fraction(0)


# --------------------------------------------------------------------------------------------
# Usage


def _add_maps(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(first)
    for key, value in second.items():
        out[key] = out.get(key, 0) + value
    return out


def _increase(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in new.items():
        grown = value - old.get(key, 0)
        if grown > 0:
            out[key] = grown
    return out


@dataclass(frozen=True)
class Usage:
    """GPU usage of a set of pods (or the charge of one request).

    Attributes:
        gpu_equivalents: GPU-equivalents (Fraction); the known part when some pod's size is
            unknown (``unknown`` counts those pods).
        gpus: whole devices per vendor resource (``nvidia.com/gpu``: 2); MIG is in ``mig``.
        gpu_memory_mib: GPU memory asked for explicitly (HAMi ``gpumem``, KAI ``gpu-memory``), MiB.
        mig: MIG instances per profile (``1g.10gb``: 3).
        products: GPU-equivalents per pinned GPU product (``NVIDIA-A100-SXM4-80GB``).
        pods: pods counted.
        unknown: pods whose GPU-equivalents are not fully known.
    """

    gpu_equivalents: Fraction = _ZERO
    gpus: Mapping[str, int] = field(default_factory=dict)
    gpu_memory_mib: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    products: Mapping[str, Fraction] = field(default_factory=dict)
    pods: int = 0
    unknown: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.gpu_equivalents + other.gpu_equivalents, _add_maps(self.gpus, other.gpus),
            self.gpu_memory_mib + other.gpu_memory_mib, _add_maps(self.mig, other.mig),
            _add_maps(self.products, other.products), self.pods + other.pods,
            self.unknown + other.unknown,
        )

    def __sub__(self, other: Usage) -> Usage:
        """Exact difference (may be negative): used to take a pod out of a total."""
        def sub(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(a)
            for key, value in b.items():
                out[key] = out.get(key, 0) - value
                if not out[key]:
                    del out[key]
            return out
        return Usage(
            self.gpu_equivalents - other.gpu_equivalents, sub(self.gpus, other.gpus),
            self.gpu_memory_mib - other.gpu_memory_mib, sub(self.mig, other.mig),
            sub(self.products, other.products), self.pods - other.pods,
            self.unknown - other.unknown,
        )

    def increase_over(self, old: Usage) -> Usage:
        """What this usage adds to ``old``, per dimension, never below 0 (an UPDATE's charge)."""
        return Usage(
            max(self.gpu_equivalents - old.gpu_equivalents, _ZERO), _increase(self.gpus, old.gpus),
            max(self.gpu_memory_mib - old.gpu_memory_mib, 0), _increase(self.mig, old.mig),
            _increase(self.products, old.products), 0, self.unknown,
        )

    @property
    def empty(self) -> bool:
        """True when nothing GPU-related is counted."""
        return not (self.gpu_equivalents or any(self.gpus.values()) or self.gpu_memory_mib
                    or any(self.mig.values()) or any(self.products.values()) or self.unknown)

    def to_json(self) -> dict[str, Any]:
        """Lossless JSON (Fractions as ``"n/d"`` strings), for the reservation ledger."""
        out: dict[str, Any] = {"eq": str(self.gpu_equivalents)}
        if self.gpus:
            out["gpus"] = dict(self.gpus)
        if self.gpu_memory_mib:
            out["memMiB"] = self.gpu_memory_mib
        if self.mig:
            out["mig"] = dict(self.mig)
        if self.products:
            out["products"] = {k: str(v) for k, v in self.products.items()}
        if self.unknown:
            out["unknown"] = self.unknown
        out["pods"] = self.pods
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """Inverse of :meth:`to_json`; raises ValueError / TypeError on malformed data."""
        return cls(
            Fraction(str(data.get("eq", "0"))),
            {str(k): int(v) for k, v in (data.get("gpus") or {}).items()},
            int(data.get("memMiB", 0)),
            {str(k): int(v) for k, v in (data.get("mig") or {}).items()},
            {str(k): Fraction(str(v)) for k, v in (data.get("products") or {}).items()},
            int(data.get("pods", 0)), int(data.get("unknown", 0)),
        )

    def to_cel(self) -> dict[str, Any]:
        """The CEL / JSON view: ``gpuEquivalents`` (double), ``gpus``, ``gpuMemoryGiB`` (double),
        ``mig``, ``products`` (GPU-equivalents, double), ``pods``, ``unknownPods``."""
        return {
            "gpuEquivalents": float(self.gpu_equivalents), "gpus": dict(self.gpus),
            "gpuMemoryGiB": self.gpu_memory_mib / MIB_PER_GIB, "mig": dict(self.mig),
            "products": {k: float(v) for k, v in self.products.items()},
            "pods": self.pods, "unknownPods": self.unknown,
        }


ZERO = Usage()


@dataclass(frozen=True)
class Charge:
    """What one pod (or one request) adds: its usage and why its size may be unknown;
    ``mig_unknown`` why its MIG slices by profile may be unknown (DRA slices of unknown profile,
    a DRA claim whose devices are not known), so ``mig`` limits cannot be checked."""

    usage: Usage
    unknown_reasons: tuple[str, ...] = ()
    mig_unknown: tuple[str, ...] = ()


def _mig_unknown(claims: Iterable[DraClaim]) -> tuple[str, ...]:
    """Why a pod's MIG slices are not all known: a DRA claim with slices of unknown profile, or
    one whose ResourceClaim / template is not known (its devices may be MIG slices)."""
    reasons = []
    for claim in claims:
        if UNKNOWN_MIG_PROFILE in claim.mig:
            reasons.append(f"{claim.path}: {claim.mig[UNKNOWN_MIG_PROFILE]} MIG slice(s) of "
                           "unknown profile")
        elif claim.mig and claim.count is None:  # allocationMode All, or an unusable count
            reasons.append(f"{claim.path}: the number of its MIG slices is not known "
                           "(allocationMode All takes every matching device of the node)")
        elif not claim.found:
            reasons.append(f"{claim.path}: the devices of {claim.template or claim.resource_claim}"
                           " are not known (they may be MIG slices)")
    return tuple(reasons)


def pod_charge(pod: Mapping[str, Any], settings: GPUSettings = DEFAULT_SETTINGS,
               dra: DraIndex | None = None) -> Charge:
    """The usage one Pod object counts for (its effective requests, init containers included).

    ``dra``: the DRA objects its claims are resolved against (None: none known). Returns zero
    usage for finished pods (``status.phase`` Succeeded/Failed) and objects that are not Pods.
    """
    if not isinstance(pod, Mapping) or pod.get("kind", "Pod") != "Pod":
        return Charge(ZERO)
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return Charge(ZERO)
    facts = workload_facts({**pod, "kind": "Pod"}, settings=settings, dra=dra)
    if facts is None or not facts.total.requested:
        return Charge(Usage(pods=1))
    total = facts.total
    spec = pod.get("spec")
    product = pinned_product(spec if isinstance(spec, Mapping) else None)
    equivalents = total.equivalents_known
    return Charge(
        Usage(
            gpu_equivalents=equivalents,
            gpus={k: v for k, v in total.gpus.items() if v},
            gpu_memory_mib=total.gpu_memory_mib or 0,
            mig={k: v for k, v in total.mig.items() if v and k != UNKNOWN_MIG_PROFILE},
            products={product: equivalents} if product and equivalents else {},
            pods=1,
            unknown=1 if total.unknown else 0,
        ),
        tuple(total.unknown),
        _mig_unknown(total.dra_claims),
    )


def request_charge(operation: str, obj: Mapping[str, Any] | None,
                   old_object: Mapping[str, Any] | None = None, *,
                   settings: GPUSettings = DEFAULT_SETTINGS,
                   dra: DraIndex | None = None) -> Charge | None:
    """The charge of one admission request, or None when quota does not apply to it.

    Only Pods are charged (a workload's pods are charged when they are created, not the workload
    itself). CREATE charges the pod; UPDATE charges the increase over ``old_object`` only;
    DELETE / CONNECT and other kinds charge nothing (None). ``dra`` resolves DRA claims.
    """
    if not isinstance(obj, Mapping) or obj.get("kind") != "Pod":
        return None
    if operation == "CREATE":
        return pod_charge(obj, settings, dra)
    if operation == "UPDATE":
        new = pod_charge(obj, settings, dra)
        old = pod_charge(old_object, settings, dra) if isinstance(old_object, Mapping) \
            else Charge(ZERO)
        return Charge(new.usage.increase_over(old.usage), new.unknown_reasons, new.mig_unknown)
    return None


# --------------------------------------------------------------------------------------------
# Quota documents


@dataclass(frozen=True)
class Scope:
    """Where a quota counts: one namespace, a team (namespaces whose label ``label`` has value
    ``value``) or the whole cluster."""

    kind: str  # Namespace | Team | Cluster
    namespace: str | None = None
    label: str | None = None
    value: str | None = None

    def applies(self, namespace: str | None, labels: Mapping[str, Any] | None) -> bool:
        """Whether a pod in ``namespace`` (with the Namespace's ``labels``) counts here."""
        if self.kind == "Cluster":
            return True
        if self.kind == "Namespace":
            return namespace == self.namespace
        labels = labels or {}
        return self.label is not None and self.label in labels and \
            str(labels[self.label]) == self.value

    def describe(self) -> str:
        """``team team-a``, ``namespace ml``, ``the cluster``: the subject of messages."""
        if self.kind == "Cluster":
            return "the cluster"
        if self.kind == "Namespace":
            return f"namespace {self.namespace}"
        return f"team {self.value}"

    def to_cel(self) -> dict[str, Any]:
        """``{kind, namespace, label, value}`` for CEL."""
        return {"kind": self.kind, "namespace": self.namespace, "label": self.label,
                "value": self.value}


@dataclass(frozen=True)
class Limits:
    """The limits of one quota; None / absent keys mean no limit on that dimension.

    ``gpu_memory_gib`` is GiB; ``products`` maps a normalised GPU product to GPU-equivalents;
    ``per_pod_gpu_equivalents`` bounds any one pod.
    """

    gpu_equivalents: Fraction | None = None
    gpus: Mapping[str, int] = field(default_factory=dict)
    gpu_memory_gib: Fraction | None = None
    mig: Mapping[str, int] = field(default_factory=dict)
    products: Mapping[str, Fraction] = field(default_factory=dict)
    per_pod_gpu_equivalents: Fraction | None = None

    def to_cel(self) -> dict[str, Any]:
        """The limits as CEL data (doubles; absent dimensions are absent keys)."""
        out: dict[str, Any] = {"gpus": dict(self.gpus), "mig": dict(self.mig),
                               "products": {k: float(v) for k, v in self.products.items()}}
        if self.gpu_equivalents is not None:
            out["gpuEquivalents"] = float(self.gpu_equivalents)
        if self.gpu_memory_gib is not None:
            out["gpuMemoryGiB"] = float(self.gpu_memory_gib)
        if self.per_pod_gpu_equivalents is not None:
            out["perPodGpuEquivalents"] = float(self.per_pod_gpu_equivalents)
        return out


@dataclass(frozen=True)
class Quota:
    """One ``GPUQuota`` document.

    Attributes:
        name: ``metadata.name`` (also names the reservation ledger, ``gpuguard-quota-<name>``).
        failure_policy: ``Fail`` (deny when usage cannot be known or reserved: the API is
            unreachable) or ``Ignore`` (admit without reserving).
        unknown_size: ``Deny`` or ``Allow`` a pod whose GPU-equivalents are unknown when a
            GPU-equivalents, product or per-pod limit applies, or whose MIG slices are unknown
            (:attr:`Charge.mig_unknown`) when a ``mig`` limit applies (Allow counts the known
            part).
        source: ``file: document N`` it came from.
    """

    name: str
    scope: Scope
    limits: Limits
    failure_policy: FailurePolicy = FailurePolicy.FAIL
    unknown_size: str = "Deny"
    source: str = ""


def _fraction(value: Any) -> Fraction:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    return Fraction(str(value)) if isinstance(value, float | str) else Fraction(value)


def product_key(product: str) -> str:
    """Normalise a product name the way pods' pinned products are (``-MIG-…``/``-SHARED``
    suffixes off): so a limit on ``NVIDIA-A100-SXM4-80GB`` counts MIG-single pods on it."""
    return mig.parse_product(product).base


def parse_quota(body: Mapping[str, Any], source: str = "",
                ) -> tuple[Quota | None, list[tuple[str, str]]]:
    """Build a :class:`Quota` from a document already checked against the JSON Schema.

    Returns:
        ``(quota or None, [(field path, message), ...])``: the semantic problems the schema
        cannot see (a number that is not a valid amount).
    """
    errors: list[tuple[str, str]] = []
    spec = mapping_at(body, "spec")
    name = str((body.get("metadata") or {}).get("name") or "")
    raw_scope = mapping_at(spec, "scope")
    if "namespace" in raw_scope:
        scope = Scope("Namespace", namespace=str(raw_scope["namespace"]))
    elif "team" in raw_scope:
        team = raw_scope["team"] if isinstance(raw_scope["team"], Mapping) else {}
        scope = Scope("Team", label=str(team.get("label", "")), value=str(team.get("value", "")))
    else:
        scope = Scope("Cluster")
    raw = mapping_at(spec, "limits")

    def amount(value: Any, path: str) -> Fraction | None:
        if value is None:
            return None
        try:
            result = _fraction(value)
        except (ValueError, TypeError, ZeroDivisionError):
            errors.append((path, f"{value!r} is not a number"))
            return None
        if result < 0:
            errors.append((path, f"{value!r} is negative"))
            return None
        return result

    def counts(values: Any, path: str) -> dict[str, int]:
        out = {}
        for key, value in (values or {}).items():
            number = amount(value, f"{path}[{key}]")
            if number is not None:
                if number.denominator != 1:
                    errors.append((f"{path}[{key}]", f"{value!r} is not a whole number"))
                out[str(key)] = int(number)
        return out

    products: dict[str, Fraction] = {}
    for key, value in (raw.get("products") or {}).items():
        number = amount(value, f"spec.limits.products[{key}]")
        if number is not None:
            products[product_key(str(key))] = number
    per_pod = mapping_at(raw, "perPod")
    limits = Limits(
        gpu_equivalents=amount(raw.get("gpuEquivalents"), "spec.limits.gpuEquivalents"),
        gpus=counts(raw.get("gpus"), "spec.limits.gpus"),
        gpu_memory_gib=amount(raw.get("gpuMemoryGiB"), "spec.limits.gpuMemoryGiB"),
        mig=counts(raw.get("mig"), "spec.limits.mig"),
        products=products,
        per_pod_gpu_equivalents=amount(per_pod.get("gpuEquivalents"),
                                       "spec.limits.perPod.gpuEquivalents"),
    )
    failure_policy = parsed(FailurePolicy, spec.get("failurePolicy"), FailurePolicy.FAIL)
    quota = Quota(name, scope, limits, failure_policy, str(spec.get("unknownSize", "Deny")),
                  source)
    return (None if errors else quota), errors


def applicable(quotas: Iterable[Quota], namespace: str | None,
               labels: Mapping[str, Any] | None) -> list[Quota]:
    """The quotas a pod in ``namespace`` (with the Namespace's labels) counts against."""
    return [q for q in quotas if q.scope.applies(namespace, labels)]


# --------------------------------------------------------------------------------------------
# The check


def fmt(value: Fraction | int | float) -> str:
    """A number for messages: integers plain, others to at most 3 decimals (``7.5``, ``0.429``)."""
    number = Fraction(value) if not isinstance(value, float) else Fraction(str(value))
    if number.denominator == 1:
        return str(number.numerator)
    return f"{float(number):.3f}".rstrip("0").rstrip(".")


def _message(who: str, used: Fraction, limit: Fraction, need: Fraction, unit: str) -> str:
    headroom = max(limit - used, _ZERO)
    return (f"{who} uses {fmt(used)} of {fmt(limit)} {unit}; this pod needs {fmt(need)} "
            f"(headroom {fmt(headroom)} {unit})")


def check(quota: Quota, used: Usage, charge: Charge) -> list[str]:
    """The limits ``charge`` would exceed on top of ``used``; one message per dimension.

    Each message gives the limit, the current usage and the headroom in the same unit, e.g.
    ``team team-a uses 7.5 of 8 GPU-equivalents; this pod needs 1 (headroom 0.5
    GPU-equivalents)``. An empty list means the request fits.
    """
    limits, need = quota.limits, charge.usage
    who = f"{quota.scope.describe()} (GPUQuota {quota.name})"
    problems = []
    sized = limits.gpu_equivalents is not None or limits.products \
        or limits.per_pod_gpu_equivalents is not None
    if charge.unknown_reasons and sized and quota.unknown_size != "Allow":
        problems.append(f"GPUQuota {quota.name}: the GPU-equivalents of this pod are unknown "
                        f"({'; '.join(charge.unknown_reasons[:2])}), so the quota cannot be "
                        "checked (unknownSize: Deny)")
    if limits.per_pod_gpu_equivalents is not None \
            and need.gpu_equivalents > limits.per_pod_gpu_equivalents:
        problems.append(f"{who}: this pod needs {fmt(need.gpu_equivalents)} GPU-equivalents; "
                        f"at most {fmt(limits.per_pod_gpu_equivalents)} per pod")
    if limits.gpu_equivalents is not None and need.gpu_equivalents \
            and used.gpu_equivalents + need.gpu_equivalents > limits.gpu_equivalents:
        problems.append(_message(who, used.gpu_equivalents, limits.gpu_equivalents,
                                 need.gpu_equivalents, "GPU-equivalents"))
    for resource, limit in limits.gpus.items():
        asked = need.gpus.get(resource, 0)
        if asked and used.gpus.get(resource, 0) + asked > limit:
            problems.append(_message(who, Fraction(used.gpus.get(resource, 0)), Fraction(limit),
                                     Fraction(asked), f"{resource}"))
    if limits.gpu_memory_gib is not None and need.gpu_memory_mib:
        used_gib = Fraction(used.gpu_memory_mib, MIB_PER_GIB)
        need_gib = Fraction(need.gpu_memory_mib, MIB_PER_GIB)
        if used_gib + need_gib > limits.gpu_memory_gib:
            problems.append(_message(who, used_gib, limits.gpu_memory_gib, need_gib,
                                     "GiB of GPU memory"))
    if limits.mig and charge.mig_unknown and quota.unknown_size != "Allow":
        problems.append(f"GPUQuota {quota.name}: the MIG slices of this pod are unknown "
                        f"({'; '.join(charge.mig_unknown[:2])}), so its mig limits cannot be "
                        "checked (unknownSize: Deny)")
    for profile, limit in limits.mig.items():
        asked = need.mig.get(profile, 0)
        if asked and used.mig.get(profile, 0) + asked > limit:
            problems.append(_message(who, Fraction(used.mig.get(profile, 0)), Fraction(limit),
                                     Fraction(asked), f"MIG {profile} instances"))
    for product, share in limits.products.items():
        wanted = need.products.get(product, _ZERO)
        if wanted and used.products.get(product, _ZERO) + wanted > share:
            problems.append(_message(who, used.products.get(product, _ZERO), share, wanted,
                                     f"GPU-equivalents of {product}"))
    return problems


@dataclass(frozen=True)
class QuotaStatus:
    """Usage against limits of one quota (for reports and CEL)."""

    quota: Quota
    used: Usage

    def ratios(self) -> dict[str, float]:
        """Usage divided by limit per limited dimension (``gpuEquivalents``, ``mig[p]``, …)."""
        limits, used = self.quota.limits, self.used
        out: dict[str, float] = {}

        def put(key: str, value: Fraction | int, limit: Fraction | int | None) -> None:
            if limit is not None:
                out[key] = float(Fraction(value) / limit) if limit else (
                    float("inf") if value else 0.0)
        put("gpuEquivalents", used.gpu_equivalents, limits.gpu_equivalents)
        for resource, limit in limits.gpus.items():
            put(f"gpus[{resource}]", used.gpus.get(resource, 0), limit)
        put("gpuMemoryGiB", Fraction(used.gpu_memory_mib, MIB_PER_GIB), limits.gpu_memory_gib)
        for profile, limit in limits.mig.items():
            put(f"mig[{profile}]", used.mig.get(profile, 0), limit)
        for product, share in limits.products.items():
            put(f"products[{product}]", used.products.get(product, _ZERO), share)
        return out

    def state(self, near: float = 0.9) -> str:
        """``over`` (some dimension above its limit), ``near`` (≥ ``near`` of one) or ``ok``."""
        ratios = self.ratios().values()
        if any(r > 1 for r in ratios):
            return "over"
        return "near" if any(r >= near for r in ratios) else "ok"

    def to_cel(self) -> dict[str, Any]:
        """``{scope, used, limits, headroom}`` (headroom in GPU-equivalents, when limited)."""
        out: dict[str, Any] = {"scope": self.quota.scope.to_cel(), "used": self.used.to_cel(),
                               "limits": self.quota.limits.to_cel()}
        if self.quota.limits.gpu_equivalents is not None:
            out["headroomGpuEquivalents"] = float(
                max(self.quota.limits.gpu_equivalents - self.used.gpu_equivalents, _ZERO))
        return out


def usage_of(pods: Iterable[Mapping[str, Any]], quota: Quota,
             namespace_labels: Mapping[str, Mapping[str, Any]],
             settings: GPUSettings = DEFAULT_SETTINGS) -> Usage:
    """Usage of the pods in ``quota``'s scope (``namespace_labels``: namespace → its labels)."""
    total = ZERO
    for pod in pods:
        metadata = mapping_at(pod, "metadata")
        namespace = metadata.get("namespace")
        if quota.scope.applies(namespace, namespace_labels.get(str(namespace)) or {}):
            total = total + pod_charge(pod, settings).usage
    return total


def quota_variable(statuses: Sequence[QuotaStatus],
                   charge: Charge | None = None) -> dict[str, Any]:
    """The CEL ``quota`` variable: ``{quotas: {name: status}, request: usage}``.

    ``quota.quotas['team-a'].used.gpuEquivalents`` is the current usage (GPU-equivalents) of the
    quotas the request counts against; ``quota.request`` what this request adds.
    """
    out: dict[str, Any] = {"quotas": {s.quota.name: s.to_cel() for s in statuses}}
    if charge is not None:
        out["request"] = charge.usage.to_cel()
    return out
