"""Which extended resources are GPUs, and of what kind: the resource-name registry.

Owns the mapping from a Kubernetes extended-resource name to a :class:`ResourceKind` (whole device,
MIG slice, shared replica, HAMi / Volcano split, obsolete, …) and the vendor behind it, plus the
frozen :class:`GPUSettings` that extend it. Names come from ``shared/reference/gpu-domain.md``
(NVIDIA device plugin, HAMi chart defaults, Volcano vGPU, AMD / Intel / Habana / AWS / Google device
plugins, Kubernetes "Schedule GPUs").

Must not look at pods or nodes: it classifies names only.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from functools import cache

from policies.facts import mig


class ResourceKind(enum.Enum):
    """What one unit of an extended resource is."""

    WHOLE = "whole"  # one physical device
    CORES = "cores"  # a core of a multi-core device (AWS neuroncore)
    MIG = "mig"  # one MIG instance, mixed strategy
    SHARED = "shared"  # one time-slicing / MPS replica (renameByDefault names)
    SPLIT_COUNT = "split-count"  # Volcano vgpu-number: devices a split container spans
    SPLIT_MEMORY = "split-memory"  # MiB of GPU memory per device (HAMi gpumem, Volcano)
    SPLIT_MEMORY_PERCENT = "split-memory-percent"  # % of each device's memory
    SPLIT_CORES = "split-cores"  # % of each device's compute time
    OBSOLETE = "obsolete"  # removed from Kubernetes; the API server rejects it
    UNRECOGNIZED = "unrecognized"  # looks like an accelerator, but gpuguard does not know it
    OTHER = "other"  # not a GPU resource (cpu, memory, NICs, …)


# HAMi / Volcano split dimensions: they describe a slot of a shared GPU, not a device.
SPLIT_KINDS = (ResourceKind.SPLIT_COUNT, ResourceKind.SPLIT_MEMORY,
               ResourceKind.SPLIT_MEMORY_PERCENT, ResourceKind.SPLIT_CORES)

_WHOLE = {
    "nvidia.com/gpu": "nvidia",
    "amd.com/gpu": "amd",
    "gpu.intel.com/i915": "intel",
    "gpu.intel.com/xe": "intel",
    "habana.ai/gaudi": "habana",
    "aws.amazon.com/neuron": "aws",
    "aws.amazon.com/neurondevice": "aws",
    "google.com/tpu": "google",
}
_CORES = {"aws.amazon.com/neuroncore": "aws"}
_VENDOR_DOMAINS = {
    "nvidia.com": "nvidia",
    "volcano.sh": "nvidia",  # Volcano vGPU splits NVIDIA GPUs
    "amd.com": "amd",
    "intel.com": "intel",
    "gpu.intel.com": "intel",
    "habana.ai": "habana",
    "aws.amazon.com": "aws",
    "google.com": "google",
}
OBSOLETE_RESOURCES = {
    "alpha.kubernetes.io/nvidia-gpu": "removed in Kubernetes 1.10; use nvidia.com/gpu",
}
# Words that make an unknown extended resource look like an accelerator worth a warning.
_ACCELERATOR_HINT = re.compile(r"gpu|tpu|npu|accelerator|vgpu|neuron|gaudi|mlu|dcu", re.I)


@dataclass(frozen=True)
class GPUSettings:
    """How this cluster names and shares its GPUs; built once by the CLI and passed down.

    Attributes:
        extra_whole_resources: more extended resources counted as one whole device each
            (e.g. ``gpu-vendor.example/example-gpu``).
        shared_replicas: ``(resource, replicas)`` pairs: how many time-slicing / MPS replicas one
            physical GPU (or MIG instance) advertises for that resource, from the device plugin's
            ``sharing`` config (e.g. ``("nvidia.com/gpu.shared", 4)``). ``nvidia.com/gpu`` applies
            to pods pinned to a sharing node by label.
        hami_memory: HAMi's GPU memory resource (MiB per GPU); the chart's ``resourceMem``.
        hami_memory_percentage: HAMi's memory-percentage resource (``resourceMemPercentage``).
        hami_cores: HAMi's compute-percentage resource (``resourceCores``).
    """

    extra_whole_resources: tuple[str, ...] = ()
    shared_replicas: tuple[tuple[str, int], ...] = ()
    hami_memory: str = "nvidia.com/gpumem"
    hami_memory_percentage: str = "nvidia.com/gpumem-percentage"
    hami_cores: str = "nvidia.com/gpucores"
    _volcano: tuple[tuple[str, ResourceKind], ...] = field(
        default=(
            ("volcano.sh/vgpu-number", ResourceKind.SPLIT_COUNT),
            ("volcano.sh/vgpu-memory", ResourceKind.SPLIT_MEMORY),
            ("volcano.sh/vgpu-memory-percentage", ResourceKind.SPLIT_MEMORY_PERCENT),
            ("volcano.sh/vgpu-cores", ResourceKind.SPLIT_CORES),
        ),
        repr=False,
    )

    def replicas_for(self, resource: str) -> int | None:
        """Time-slicing / MPS replicas per device for ``resource``, or None when not configured."""
        for name, replicas in self.shared_replicas:
            if name == resource:
                return replicas
        return None


DEFAULT_SETTINGS = GPUSettings()


@cache
def classify(resource: str, settings: GPUSettings = DEFAULT_SETTINGS) -> ResourceKind:
    """Classify one extended-resource name.

    Args:
        resource: the key in ``resources.limits`` / ``requests`` or in node capacity.
        settings: the cluster's naming (extra whole-device names, HAMi names).

    Returns:
        The :class:`ResourceKind`; ``OTHER`` for cpu, memory and anything not GPU-like.
    """
    if resource in _WHOLE or resource in settings.extra_whole_resources:
        return ResourceKind.WHOLE
    if resource in _CORES:
        return ResourceKind.CORES
    if resource == "nvidia.com/gpu.shared":
        return ResourceKind.SHARED
    if resource.startswith("nvidia.com/mig-"):
        parsed = mig.profile_from_resource(resource)
        if parsed is None:
            return ResourceKind.UNRECOGNIZED
        return ResourceKind.SHARED if parsed[1] else ResourceKind.MIG
    if resource == settings.hami_memory:
        return ResourceKind.SPLIT_MEMORY
    if resource == settings.hami_memory_percentage:
        return ResourceKind.SPLIT_MEMORY_PERCENT
    if resource == settings.hami_cores:
        return ResourceKind.SPLIT_CORES
    for name, kind in settings._volcano:
        if resource == name:
            return kind
    if resource in OBSOLETE_RESOURCES:
        return ResourceKind.OBSOLETE
    if "/" in resource and _ACCELERATOR_HINT.search(resource.split("/", 1)[1]):
        return ResourceKind.UNRECOGNIZED
    return ResourceKind.OTHER


def vendor_of(resource: str) -> str:
    """The vendor behind a GPU resource: ``nvidia``, ``amd``, ``intel``, … or the name's domain."""
    known = _WHOLE.get(resource) or _CORES.get(resource)
    if known:
        return known
    domain = resource.split("/", 1)[0]
    return _VENDOR_DOMAINS.get(domain, domain)


@dataclass(frozen=True)
class NamePatterns:
    """The names :func:`classify` does not call ``OTHER``, as tests a matcher outside Python runs.

    A name is a GPU (or GPU-like) resource when it is in ``names``, starts with one of
    ``prefixes``, or contains ``/`` and the text after the first ``/`` has a match of ``hint``
    (case-insensitive). ``hint`` is written in the syntax both Python's ``re`` and RE2 (the
    regex engine of CEL's ``matches``) read. Used by :mod:`policies.facts.prefilter` to generate the
    webhooks' matchConditions; ``tests/core/test_prefilter.py`` checks it against :func:`classify`.
    """

    names: tuple[str, ...]
    prefixes: tuple[str, ...]
    hint: str


def name_patterns(settings: GPUSettings = DEFAULT_SETTINGS) -> NamePatterns:
    """The patterns behind :func:`classify` for ``settings`` (sorted, without repeats).

    Must list every branch of :func:`classify` that does not return ``OTHER``; the exact names
    also hold those the hint would catch anyway, so a changed hint never drops one.
    """
    names = {
        *_WHOLE, *settings.extra_whole_resources, *_CORES, "nvidia.com/gpu.shared",
        settings.hami_memory, settings.hami_memory_percentage, settings.hami_cores,
        *(name for name, _ in settings._volcano), *OBSOLETE_RESOURCES,
    }
    return NamePatterns(tuple(sorted(names)), ("nvidia.com/mig-",), _ACCELERATOR_HINT.pattern)
