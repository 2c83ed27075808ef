"""DRA objects of one input, as the scheduler sees them: what each claim gives a pod.

Owns the reading of ``resource.k8s.io`` DeviceClasses, ResourceClaims and ResourceClaimTemplates
(v1beta1 ``devices.requests[].deviceClassName/count``; v1 ``requests[].exactly`` and
``firstAvailable``), of NVIDIA ComputeDomains (which create a ResourceClaimTemplate for IMEX
channels), and the :class:`DraIndex` that :func:`policies.facts.gpu.pod_facts` resolves a pod's
``spec.resourceClaims`` with. Sources: Kubernetes "Dynamic Resource Allocation" (KEP-4381 structured
parameters, KEP-4816 prioritized alternatives, KEP-5004 extended resources backed by DRA), the
NVIDIA DRA driver's DeviceClasses and ComputeDomain CRD.

Must not look at pods (that is :mod:`policies.facts.gpu`) nor find workloads
(:mod:`policies.facts.workloads` counts a ResourceClaim's users).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.facts import mig
from policies.facts.quantity import MAX_COUNT
from policies.facts.resource_names import device_class_is_gpu
from policies.json_fields import as_mapping

_DRIVER = re.compile(r"device\.driver\s*==\s*['\"]([^'\"]+)['\"]")
_MIG_PROFILE = re.compile(
    r"(?:\.profile|\[['\"]profile['\"]\])\s*==\s*['\"]([^'\"]+)['\"]")
_MIG_TYPE = re.compile(r"\.type\s*==\s*['\"]mig['\"]")
_ONLY_DRIVER = re.compile(r"\s*device\.driver\s*==\s*['\"][^'\"]+['\"]\s*")
# Any test of a MIG profile attribute (``profile in [...]``, ``profile != ...``): the devices
# are MIG slices even where the profile cannot be read from the expression.
_PROFILE_ATTRIBUTE = re.compile(r"(?:\.profile\b|\[['\"]profile['\"]\])")
_TYPE_OTHER = re.compile(r"\.type\s*==\s*['\"](?!mig['\"])[^'\"]*['\"]")
# NVIDIA DRA driver (k8s-dra-driver-gpu): one driver, gpu.nvidia.com, whose devices carry a
# ``type`` attribute (gpu, mig, vfio, vgpu) and, for MIG slices, ``profile`` (1g.10gb); its
# DeviceClass mig.nvidia.com selects ``device.attributes['gpu.nvidia.com'].type == 'mig'``.
MIG_DEVICE_CLASSES = ("mig.nvidia.com",)
UNKNOWN_MIG_PROFILE = "unknown"
"""The ``mig`` key of MIG devices whose profile the claim does not pin (a selector that names
none or several, alternatives of different profiles): never a whole GPU, never 0."""
# Drivers whose devices are GPUs (NVIDIA, AMD, Intel, the dra-example-driver's fake GPUs).
_GPU_DRIVERS = ("gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com", "gpu.example.com")


@dataclass(frozen=True)
class DeviceClassFacts:
    """One DeviceClass: whether its devices are GPUs, and the MIG profile its selectors pin.

    ``gpu`` is True / False, or None when neither the selectors' driver nor the name tells;
    ``extended_resource`` is its ``spec.extendedResourceName`` (KEP-5004), or None; ``driver``
    the one driver its selectors name, ``driver_only`` whether they test nothing else (then
    every device of that driver matches); ``mig`` whether its devices are MIG slices (NVIDIA's
    ``mig.nvidia.com``, or selectors testing ``type == 'mig'`` or a ``profile`` attribute), with
    ``mig_profile`` the one profile they pin, if any.
    """

    name: str
    gpu: bool | None
    mig_profile: str | None = None
    extended_resource: str | None = None
    driver: str | None = None
    driver_only: bool = False  # its selectors test the driver and nothing else
    mig: bool = False


@dataclass(frozen=True)
class ClaimDevices:
    """What one ResourceClaim (or each claim of a template) allocates.

    Attributes:
        device_class: the first request's class (``firstAvailable``: its preferred entry).
        count: GPU devices (MIG slices included); None when unknown (``allocationMode: All``,
            an unusable count, alternatives of different counts).
        gpu: True when every counted request is for GPUs, False when none is (an IMEX channel,
            a NIC: the claim is not counted), None when a class's kind is unknown.
        unknown: why the GPU-equivalents of the claim are unknown although its count is known
            (alternatives of different classes; a class that may not be a GPU; MIG slices of
            unknown profile), or None.
        mig: MIG slices among ``count``, by profile (canonical, ``1g.10gb``);
            :data:`UNKNOWN_MIG_PROFILE` counts slices whose profile is not pinned (at least 1
            when their count is unknown).
    """

    device_class: str | None
    count: int | None
    gpu: bool | None
    unknown: str | None = None
    mig: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DraIndex:
    """The DRA objects of one input, by ``(namespace, name)`` (namespace None matches any).

    ``claim_users`` is how many pods of the input name each ResourceClaim: a shared claim is one
    allocation, each pod's share is ``1 / users``.
    """

    templates: Mapping[tuple[str | None, str], ClaimDevices] = field(default_factory=dict)
    claims: Mapping[tuple[str | None, str], ClaimDevices] = field(default_factory=dict)
    claim_users: Mapping[tuple[str | None, str], int] = field(default_factory=dict)
    device_classes: Mapping[str, DeviceClassFacts] = field(default_factory=dict)

    def template(self, namespace: str | None, name: str) -> ClaimDevices | None:
        """The ResourceClaimTemplate ``name`` in ``namespace`` (or of no namespace), or None."""
        return self.templates.get((namespace, name)) or self.templates.get((None, name))

    def claim(self, namespace: str | None, name: str) -> ClaimDevices | None:
        """The ResourceClaim ``name`` in ``namespace`` (or of no namespace), or None."""
        return self.claims.get((namespace, name)) or self.claims.get((None, name))

    def users(self, namespace: str | None, name: str) -> int:
        """Pods of the input that name ResourceClaim ``name`` (at least 1)."""
        return max(self.claim_users.get((namespace, name), 0),
                   self.claim_users.get((None, name), 0), 1)

    def extended_resources(self) -> dict[str, DeviceClassFacts]:
        """``extendedResourceName -> DeviceClass`` for the classes that name one."""
        return {c.extended_resource: c for c in self.device_classes.values()
                if c.extended_resource}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _key(obj: Mapping[str, Any]) -> tuple[str | None, str] | None:
    metadata = as_mapping(obj.get("metadata"))
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(name, str) or not name:
        return None  # no pod can name it; a claim naming it is reported as not found
    return (namespace if isinstance(namespace, str) and namespace else None, name)


def device_class_facts(obj: Mapping[str, Any]) -> DeviceClassFacts:
    """Read one DeviceClass: its selectors' driver and MIG profile, its extended resource."""
    spec = as_mapping(obj.get("spec"))
    name = str(as_mapping(obj.get("metadata")).get("name") or "")
    expressions = _expressions(spec.get("selectors"))
    drivers = set(_DRIVER.findall(expressions))
    gpu: bool | None
    if drivers:
        gpu = True if all(d in _GPU_DRIVERS or device_class_is_gpu(d) for d in drivers) else \
            device_class_is_gpu(name)
    else:
        gpu = device_class_is_gpu(name)
    is_mig = _is_mig(name, expressions)
    mig_profile = _pinned_profile(expressions) if is_mig else None
    if is_mig:
        gpu = True
    extended = spec.get("extendedResourceName")
    selectors = _list(spec.get("selectors"))
    driver_only = bool(selectors) and all(
        _ONLY_DRIVER.fullmatch(str(as_mapping(as_mapping(s).get("cel")).get("expression", "")))
        for s in selectors)
    return DeviceClassFacts(name, gpu, mig_profile,
                            extended if isinstance(extended, str) and extended else None,
                            next(iter(drivers)) if len(drivers) == 1 else None, driver_only,
                            is_mig)


def _is_mig(device_class: str | None, expressions: str) -> bool:
    """Whether a class (by name) or CEL selectors pick MIG slices: ``mig.nvidia.com``,
    ``type == 'mig'``, or any test of a ``profile`` attribute (unless they pick another type)."""
    if device_class in MIG_DEVICE_CLASSES or _MIG_TYPE.search(expressions):
        return True
    return bool(_PROFILE_ATTRIBUTE.search(expressions)) and not _TYPE_OTHER.search(expressions)


def _pinned_profile(expressions: str) -> str | None:
    """The one MIG profile ``profile == '<p>'`` tests pin (canonical), else None."""
    found = {mig.parse_profile(p) for p in _MIG_PROFILE.findall(expressions)}
    if len(found) != 1 or None in found:
        return None
    parsed = found.pop()
    return parsed.canonical if parsed is not None else None


def _expressions(selectors: Any) -> str:
    return " ".join(str(as_mapping(as_mapping(s).get("cel")).get("expression", ""))
                    for s in _list(selectors))


def _count(request: Mapping[str, Any]) -> int | None:
    if request.get("allocationMode") == "All":
        return None
    count = request.get("count", 1)
    valid = isinstance(count, int) and not isinstance(count, bool) and 0 < count <= MAX_COUNT
    return count if valid else None  # an unusable count: unknown, not 1


def all_mode_count(
    device_class: str, classes: Mapping[str, DeviceClassFacts],
    slices: Mapping[str, Mapping[str, int]],
) -> int | None:
    """Devices ``allocationMode: All`` allocates for ``device_class``: the devices per node of
    its driver in the input's ResourceSlices, when its selectors test only the driver and every
    node publishes the same number; else None (the count depends on the node)."""
    known = classes.get(device_class)
    if known is None or known.driver is None or not known.driver_only:
        return None
    per_node = set(slices.get(known.driver, {}).values())
    return per_node.pop() if len(per_node) == 1 else None


def claim_devices(
    obj: Mapping[str, Any], classes: Mapping[str, DeviceClassFacts] | None = None,
    slices: Mapping[str, Mapping[str, int]] | None = None,
    slice_devices: Mapping[tuple[str, str, str], str | None] | None = None,
) -> ClaimDevices:
    """What a ResourceClaim or ResourceClaimTemplate allocates, GPUs counted.

    ``firstAvailable`` (KEP-4816) allocates exactly one of its alternatives: its count when all
    alternatives ask the same count, and GPU-equivalents unknown unless all name the same class.
    A request for a class that is not a GPU is not counted; one whose kind is unknown is
    counted, with its GPU-equivalents unknown. A request for MIG slices (a MIG class, or
    selectors testing ``type == 'mig'`` / a ``profile`` attribute) counts its slices in ``mig``
    by the profile its selectors or class pin, else as :data:`UNKNOWN_MIG_PROFILE` with the
    reason in ``unknown``; an allocated claim's ``status.allocation.devices.results`` name the
    slices given, and their profiles from ``slice_devices`` (``(driver, pool, device) ->
    profile`` of the input's ResourceSlices) replace the requests'. ``classes`` are the
    DeviceClasses of the input, ``slices`` its ResourceSlices' devices per driver and node (for
    ``allocationMode: All``).
    """
    classes = classes or {}
    slices = slices or {}
    spec = as_mapping(obj.get("spec"))
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = as_mapping(spec.get("spec"))
    first_class: str | None = None
    total: int | None = 0
    kinds: list[bool | None] = []
    unknown: list[str] = []
    migs: dict[str, int] = {}

    def kind_of(name: str) -> bool | None:
        known = classes.get(name)
        return known.gpu if known is not None else device_class_is_gpu(name)

    for request in _list(as_mapping(spec.get("devices")).get("requests")):
        request = as_mapping(request)
        alternatives = [as_mapping(a) for a in _list(request.get("firstAvailable"))]
        options = alternatives or [as_mapping(request.get("exactly")) or request]
        named = [o for o in options if isinstance(o.get("deviceClassName"), str)]
        names = [str(o.get("deviceClassName")) for o in named]
        if not names:
            continue
        profiles = [_option_profile(o, classes) for o in named]
        option_kinds = [True if p is not None else kind_of(n)
                        for n, p in zip(names, profiles, strict=True)]
        if all(k is False for k in option_kinds):
            continue  # not a GPU whichever is allocated (an IMEX channel, a NIC)
        counts = {_count(o) if o.get("allocationMode") != "All" or o.get("selectors")
                  else all_mode_count(str(o.get("deviceClassName")), classes, slices)
                  for o in options}
        count = counts.pop() if len(counts) == 1 else None
        first_class = first_class or names[0]
        kind: bool | None = True if all(k is True for k in option_kinds) else None
        kinds.append(kind)
        if any(p is not None for p in profiles):
            _mig_request(str(request.get("name") or names[0]), profiles, count, migs, unknown)
        elif kind is None:
            unknown.append(f"DeviceClass {', '.join(repr(n) for n in names)} may not be a GPU")
        elif len(set(names)) > 1:
            unknown.append(f"firstAvailable allocates one of {', '.join(names)}, of different "
                           "sizes")
        total = None if total is None or count is None else total + count
    if not kinds:
        return ClaimDevices(None, 0, False)
    allocated = _allocated_profiles(obj, slice_devices or {})
    if allocated is not None and (migs or allocated):
        migs, unknown = allocated, [u for u in unknown if not u.startswith(_MIG_REASON)]
    gpu = True if all(k is True for k in kinds) else None
    return ClaimDevices(first_class, total, gpu, "; ".join(unknown) or None, migs)


_MIG_REASON = "MIG slices of request"


def _option_profile(option: Mapping[str, Any], classes: Mapping[str, DeviceClassFacts],
                    ) -> str | None:
    """The MIG profile one request (or alternative) asks for: its selectors' pin, else its
    class's, else :data:`UNKNOWN_MIG_PROFILE`; None when it is not a MIG request."""
    name = option.get("deviceClassName")
    known = classes.get(name) if isinstance(name, str) else None
    expressions = _expressions(option.get("selectors"))
    class_mig = known.mig if known is not None else name in MIG_DEVICE_CLASSES
    if not class_mig and not _is_mig(None, expressions):
        return None
    return (_pinned_profile(expressions) or (known.mig_profile if known is not None else None)
            or UNKNOWN_MIG_PROFILE)


def _mig_request(name: str, profiles: list[str | None], count: int | None,
                 migs: dict[str, int], unknown: list[str]) -> None:
    """Count one MIG request's slices by profile; a profile not pinned (or alternatives of
    different profiles, or a MIG alternative beside a whole GPU) is unknown, never a GPU."""
    pinned = set(profiles)
    one = pinned.pop() if len(pinned) == 1 else None
    profile = one if one is not None else UNKNOWN_MIG_PROFILE
    slices = count if count is not None else 1  # at least one slice
    migs[profile] = migs.get(profile, 0) + slices
    if profile == UNKNOWN_MIG_PROFILE:
        why = ("its alternatives are of different MIG profiles or kinds" if len(set(profiles)) > 1
               else "its selectors and DeviceClass pin no one MIG profile")
        unknown.append(f"{_MIG_REASON} {name!r} are of unknown profile ({why})")


def _allocated_profiles(
    obj: Mapping[str, Any], slice_devices: Mapping[tuple[str, str, str], str | None],
) -> dict[str, int] | None:
    """MIG slices by profile of an allocated ResourceClaim (``status.allocation.devices
    .results[]`` ``{driver, pool, device}`` looked up in the input's ResourceSlices); None
    when it is not allocated or some MIG device of it is not found."""
    results = _list(as_mapping(as_mapping(as_mapping(obj.get("status")).get("allocation"))
                               .get("devices")).get("results"))
    if obj.get("kind") != "ResourceClaim" or not results:
        return None
    found: dict[str, int] = {}
    for result in results:
        result = as_mapping(result)
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        if key not in slice_devices:
            return None  # its device is not in the input: the requests decide
        profile = slice_devices[key]
        if profile is not None:
            found[profile] = found.get(profile, 0) + 1
    return found


def slice_mig_profiles(spec: Mapping[str, Any]) -> dict[tuple[str, str, str], str | None]:
    """``(driver, pool, device) -> MIG profile`` (None: not a MIG slice) of one ResourceSlice:
    the NVIDIA driver's ``type: mig`` devices with their ``profile`` attribute (v1 ``devices[]
    .attributes``; v1beta1 under ``devices[].basic``)."""
    driver = str(spec.get("driver"))
    pool = str(as_mapping(spec.get("pool")).get("name"))
    out: dict[tuple[str, str, str], str | None] = {}
    for device in _list(spec.get("devices")):
        device = as_mapping(device)
        attributes = as_mapping(device.get("attributes")) or as_mapping(
            as_mapping(device.get("basic")).get("attributes"))

        def value(name: str, attributes: Mapping[str, Any] = attributes) -> Any:
            raw = as_mapping(attributes.get(name)) or as_mapping(
                attributes.get(f"{driver}/{name}"))
            return raw.get("string")

        profile = None
        if value("type") == "mig":
            parsed = mig.parse_profile(str(value("profile")))
            profile = parsed.canonical if parsed is not None else UNKNOWN_MIG_PROFILE
        out[(driver, pool, str(device.get("name")))] = profile
    return out


def compute_domain_channel(obj: Mapping[str, Any]) -> tuple[str, ClaimDevices] | None:
    """The ResourceClaimTemplate an NVIDIA ComputeDomain creates for its IMEX channel:
    ``(name, devices)``; an IMEX channel is not a GPU. None when no template name is given."""
    channel = as_mapping(as_mapping(obj.get("spec")).get("channel"))
    name = as_mapping(channel.get("resourceClaimTemplate")).get("name")
    if not isinstance(name, str) or not name:
        return None
    return name, ClaimDevices("compute-domain-default-channel.nvidia.com", 1, False)


def dra_objects(objects: Iterable[Mapping[str, Any]]) -> DraIndex:
    """Index the DeviceClasses, ResourceClaims, ResourceClaimTemplates and ComputeDomains among
    ``objects``, with ResourceSlices giving the count of ``allocationMode: All``
    (``claim_users`` is left empty: :mod:`policies.facts.workloads` counts them)."""
    found = [o for o in objects if isinstance(o, Mapping)]
    classes: dict[str, DeviceClassFacts] = {}
    slices: dict[str, dict[str, int]] = {}  # driver -> node (or pool) -> devices
    devices: dict[tuple[str, str, str], str | None] = {}  # (driver, pool, device) -> profile
    for obj in found:
        if obj.get("kind") == "DeviceClass" and _is_resource_api(obj):
            facts = device_class_facts(obj)
            if facts.name:
                classes[facts.name] = facts
        elif obj.get("kind") == "ResourceSlice" and _is_resource_api(obj):
            spec = as_mapping(obj.get("spec"))
            driver = spec.get("driver")
            where = spec.get("nodeName") or as_mapping(spec.get("pool")).get("name")
            if isinstance(driver, str) and isinstance(where, str):
                per_node = slices.setdefault(driver, {})
                per_node[where] = per_node.get(where, 0) + len(_list(spec.get("devices")))
            devices.update(slice_mig_profiles(spec))
    templates: dict[tuple[str | None, str], ClaimDevices] = {}
    claims: dict[tuple[str | None, str], ClaimDevices] = {}
    for obj in found:
        kind = obj.get("kind")
        key = _key(obj)
        if key is None:
            continue
        if kind == "ResourceClaimTemplate" and _is_resource_api(obj):
            templates[key] = claim_devices(obj, classes, slices)
        elif kind == "ResourceClaim" and _is_resource_api(obj):
            claims[key] = claim_devices(obj, classes, slices, devices)
        elif kind == "ComputeDomain" and str(obj.get("apiVersion", "")).startswith(
                "resource.nvidia.com/"):
            channel = compute_domain_channel(obj)
            if channel is not None:
                templates[(key[0], channel[0])] = channel[1]
    return DraIndex(templates, claims, {}, classes)


def _is_resource_api(obj: Mapping[str, Any]) -> bool:
    return str(obj.get("apiVersion", "")).startswith("resource.k8s.io/")


DRA_RESOURCES: tuple[tuple[str, str], ...] = (
    ("deviceclasses", "DeviceClass"), ("resourceslices", "ResourceSlice"),
    ("resourceclaimtemplates", "ResourceClaimTemplate"), ("resourceclaims", "ResourceClaim"))
"""The ``resource.k8s.io`` resources a :class:`DraIndex` is built from, ``(plural, kind)``, in
the order a streaming reader (the audit) must see them: DeviceClasses and ResourceSlices (what a
claim's devices and MIG profiles are resolved with) before the claims, and all of them before
the workloads and pods that name the claims. Whoever lists or counts DRA objects takes them from
here, so a ResourceClaim is never left out where a ResourceClaimTemplate is read."""
DRA_KINDS: tuple[str, ...] = tuple(kind for _, kind in DRA_RESOURCES)
"""The kinds of :data:`DRA_RESOURCES`."""

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
"""The ``resource.k8s.io`` kinds that ask for devices: judged themselves at admission (a Pod
arrives without the claim its ``spec.resourceClaims`` names)."""


def is_claim_object(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a ``resource.k8s.io`` ResourceClaim or ResourceClaimTemplate."""
    return obj.get("kind") in CLAIM_KINDS and _is_resource_api(obj)


def claim_requests_path(obj: Mapping[str, Any]) -> str:
    """Where a claim object lists its device requests: ``spec.devices.requests`` of a
    ResourceClaim, ``spec.spec.devices.requests`` of a ResourceClaimTemplate."""
    spec = "spec.spec" if obj.get("kind") == "ResourceClaimTemplate" else "spec"
    return f"{spec}.devices.requests"
