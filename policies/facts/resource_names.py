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
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from policies.facts import mig


class ResourceKind(enum.Enum):
    """What one unit of an extended resource is."""

    WHOLE = "whole"  # one physical device
    CORES = "cores"  # a core of a multi-core device (AWS neuroncore)
    MIG = "mig"  # one MIG instance, mixed strategy
    SHARED = "shared"  # one time-slicing / MPS replica (renameByDefault names)
    VGPU = "vgpu"  # one NVIDIA vGPU (KubeVirt mediated device): a framebuffer share of one GPU
    SPLIT_COUNT = "split-count"  # devices a split container spans (Volcano vgpu-number, HAMi)
    SPLIT_MEMORY = "split-memory"  # GPU memory per device (HAMi gpumem, Volcano), vendor units
    SPLIT_MEMORY_PERCENT = "split-memory-percent"  # % of each device's memory
    SPLIT_CORES = "split-cores"  # share of each device's compute (%, or per mille for Intel)
    QUALIFIER = "qualifier"  # qualifies a GPU ask, asks for no device (HAMi nvidia.com/priority)
    OBSOLETE = "obsolete"  # removed from Kubernetes; the API server rejects it
    UNRECOGNIZED = "unrecognized"  # looks like an accelerator, but gpuguard does not know it
    OTHER = "other"  # not a GPU resource (cpu, memory, NICs, …)


# HAMi / Volcano split dimensions: they describe a slot of a shared GPU, not a device.
SPLIT_KINDS = (ResourceKind.SPLIT_COUNT, ResourceKind.SPLIT_MEMORY,
               ResourceKind.SPLIT_MEMORY_PERCENT, ResourceKind.SPLIT_CORES)


@dataclass(frozen=True)
class SplitFamily:
    """The resources one vendor's sharing layer (HAMi, Volcano, a device plugin) splits with.

    Attributes:
        vendor: the vendor of the split devices.
        count: the resource giving the number of devices a split container spans (``None``: one).
        memory: memory per device; ``memory_mib_per_unit`` MiB per unit (None: the vendor's unit
            is not documented, so no MiB figure is given).
        memory_percent: percent of each device's memory.
        cores: share of each device's compute; ``cores_per_device`` units make the whole device
            (100 for a percentage, 1000 for Intel millicores; None: not a share of the device,
            e.g. Moore Threads core groups).
        cores_aliases: other names of ``cores`` (HAMi's ``nvidia.com/cores``, the
            ``resourceCores`` default its docs/config.md still gives for ``nvidia.com/gpucores``).
    Sources: HAMi ``charts/hami/values.yaml`` and docs (``nvidia``, ``mlu``, ``dcu``,
    ``iluvatar``, ``metax``, ``mthreads``, ``enflame``, ``kunlun``, ``amd``, ``vnpus``), Volcano
    vGPU, Intel GPU plugin (``gpu.intel.com/millicores``: 1000 per GPU).
    """

    vendor: str
    count: str | None
    memory: str | None = None
    memory_mib_per_unit: Fraction | None = None
    memory_percent: str | None = None
    cores: str | None = None
    cores_per_device: int | None = 100
    cores_aliases: tuple[str, ...] = ()

    def kind_of(self, resource: str) -> ResourceKind | None:
        """The split dimension ``resource`` is in this family, or None."""
        if resource == self.memory:
            return ResourceKind.SPLIT_MEMORY
        if resource == self.memory_percent:
            return ResourceKind.SPLIT_MEMORY_PERCENT
        if resource == self.cores or resource in self.cores_aliases:
            return ResourceKind.SPLIT_CORES
        return None


_MIB = Fraction(1)
_SPLIT_FAMILIES: tuple[SplitFamily, ...] = (
    SplitFamily("nvidia", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", _MIB,
                "volcano.sh/vgpu-memory-percentage", "volcano.sh/vgpu-cores"),
    SplitFamily("amd", "amd.com/gpu", "amd.com/gpumem", _MIB, None, "amd.com/gpucores"),
    SplitFamily("hygon", "hygon.com/dcunum", "hygon.com/dcumem", _MIB, None, "hygon.com/dcucores"),
    SplitFamily("cambricon", "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", None, None,
                "cambricon.com/mlu.smlu.vcore"),
    SplitFamily("cambricon", "cambricon.com/mlunum", "cambricon.com/mlumem", None),
    SplitFamily("iluvatar", "iluvatar.ai/vgpu", "iluvatar.ai/vcuda-memory", Fraction(256), None,
                "iluvatar.ai/vcuda-core"),
    SplitFamily("metax", "metax-tech.com/sgpu", "metax-tech.com/vmemory", None, None,
                "metax-tech.com/vcore"),
    SplitFamily("mthreads", "mthreads.com/vgpu", "mthreads.com/sgpu-memory", Fraction(512), None,
                "mthreads.com/sgpu-core", None),
    SplitFamily("enflame", "enflame.com/vgcu", None, None, None, "enflame.com/vgcu-percentage"),
    SplitFamily("kunlunxin", "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory", _MIB),
    SplitFamily("intel", "gpu.intel.com/i915", None, None, None, "gpu.intel.com/millicores", 1000),
)
# Cambricon writes the model into the smlu names (cambricon.com/mlu370.smlu.vcore); HAMi's Ascend
# vNPU pairs huawei.com/Ascend<model> with huawei.com/Ascend<model>-memory (MiB).
_CAMBRICON_SMLU = re.compile(r"cambricon\.com/(mlu\d*)\.smlu\.(?:vmemory|vcore)")
_ASCEND = re.compile(r"huawei\.com/(Ascend\d+[A-Za-z0-9]*)(-memory)?")

_WHOLE = {
    "nvidia.com/gpu": "nvidia",
    "amd.com/gpu": "amd",
    "gpu.intel.com/i915": "intel",
    "gpu.intel.com/xe": "intel",
    "npu.intel.com/accel": "intel",  # Intel NPU device plugin
    "habana.ai/gaudi": "habana",
    "aws.amazon.com/neuron": "aws",
    "aws.amazon.com/neurondevice": "aws",
    "google.com/tpu": "google",
    "huawei.com/npu": "huawei",
    "cambricon.com/mlu": "cambricon",
    "metax-tech.com/gpu": "metax",
    "iluvatar.ai/gpu": "iluvatar",
    "iluvatar.com/gpu": "iluvatar",
    "mthreads.com/gpu": "mthreads",
    "enflame.com/gcu": "enflame",
    "kunlunxin.com/xpu": "kunlunxin",
}
_CORES = {"aws.amazon.com/neuroncore": "aws"}
# GKE's legacy Cloud TPU names (TPU Node architecture, before google.com/tpu): one unit is one
# TensorCore, ``cloud-tpus.google.com/v2: 8`` a v2-8 device (Cloud TPU docs, "Run Cloud TPU
# applications on GKE" (legacy) and "System architecture": a v2 or v3 chip has 2 TensorCores).
# ``preemptible-`` names ask for the same cores on preemptible TPUs.
_TPU_LEGACY_CORES_PER_CHIP = {"v2": 2, "v3": 2}
_CORES.update({f"cloud-tpus.google.com/{tier}{version}": "google"
               for version in _TPU_LEGACY_CORES_PER_CHIP for tier in ("", "preemptible-")})
_QUALIFIERS = ("nvidia.com/priority",)  # HAMi task priority: 0 high, 1 low; no device
_VENDOR_DOMAINS = {
    "nvidia.com": "nvidia",
    "volcano.sh": "nvidia",  # Volcano vGPU splits NVIDIA GPUs
    "amd.com": "amd",
    "intel.com": "intel",
    "gpu.intel.com": "intel",
    "npu.intel.com": "intel",
    "habana.ai": "habana",
    "aws.amazon.com": "aws",
    "google.com": "google",
    "cloud-tpus.google.com": "google",
    "huawei.com": "huawei",
    "cambricon.com": "cambricon",
    "hygon.com": "hygon",
    "metax-tech.com": "metax",
    "iluvatar.ai": "iluvatar",
    "iluvatar.com": "iluvatar",
    "mthreads.com": "mthreads",
    "enflame.com": "enflame",
    "kunlunxin.com": "kunlunxin",
}
# Domains whose extended resources are all accelerators (nothing else is published under them):
# any name there that gpuguard does not know is unrecognized, whatever its words. Not nvidia.com:
# NVIDIA's network operator publishes NICs there (nvidia.com/mlnxnics, rdma_shared_device_a).
# Also the AI-accelerator makers whose Kubernetes device plugins publish names without a hint
# word: Qualcomm Cloud AI 100 (qualcomm.com/qaic), Tenstorrent (tenstorrent.com/n300, n150, p150),
# FuriosaAI (furiosa.ai/rngd, warboy), Rebellions (rebellions.ai/ATOM, REBEL), Graphcore
# (graphcore.ai/ipu), Sophgo (sophgo.com/tpu) — each project's device-plugin README. gpuguard does
# not value them (what a device is worth against a GPU is not published): listed, never zero.
_ACCELERATOR_DOMAINS = ("huawei.com/", "cambricon.com/", "hygon.com/",
                        "metax-tech.com/", "iluvatar.ai/", "iluvatar.com/", "mthreads.com/",
                        "enflame.com/", "kunlunxin.com/", "habana.ai/", "npu.intel.com/",
                        "gpu.intel.com/", "qualcomm.com/", "tenstorrent.com/", "furiosa.ai/",
                        "rebellions.ai/", "graphcore.ai/", "sophgo.com/",
                        "cloud-tpus.google.com/")
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
"""KEP-5004: any DeviceClass can be asked for as ``deviceclass.resource.kubernetes.io/<class>``."""
OBSOLETE_RESOURCES = {
    "alpha.kubernetes.io/nvidia-gpu": "removed in Kubernetes 1.10; use nvidia.com/gpu",
}
# Words that make an unknown extended resource look like an accelerator worth a warning, searched
# in the whole name, domain included (cloud-tpus.google.com/v4 says "tpu" only before the '/').
_ACCELERATOR_HINT = re.compile(
    r"gpu|tpu|npu|xpu|gcu|dcu|mlu|accel|neuron|gaudi|ascend|cuda|fpga", re.I)
# KubeVirt permittedHostDevices under nvidia.com: vGPU types (GRID_T4-1Q, NVIDIA_A10-4C: a
# framebuffer share) and passthrough chips (GP102GL_Tesla_P40, GA102GL_A10: a whole GPU).
# Both start with one of _NVIDIA_DEVICE_PREFIXES (vGPU type families; chip families Kepler to
# Blackwell), under which any other name is unrecognized.
_NVIDIA_VGPU = re.compile(r"nvidia\.com/(?:GRID_|NVIDIA_).*-\d+[QABC]")
_NVIDIA_PASSTHROUGH = re.compile(r"nvidia\.com/(?:GK|GM|GP|GV|TU|GA|GH|AD|GB)\d{3}[A-Z0-9]*_\w+")
_NVIDIA_DEVICE_PREFIXES = tuple(f"nvidia.com/{p}" for p in (
    "GRID_", "NVIDIA_", "GK", "GM", "GP", "GV", "TU", "GA", "GH", "AD", "GB"))
# KubeVirt passthrough of AMD GPUs: permittedHostDevices resource names are "vendor.com/product"
# (KubeVirt API, PciHostDevice.resourceName), for AMD the Instinct / Radeon product (MI300X,
# MI210, Instinct_MI250X, Radeon_Pro_V620): one whole GPU each.
_AMD_PASSTHROUGH = re.compile(r"amd\.com/(?:MI\d{2,3}|Instinct|Radeon)\w*")
_AMD_DEVICE_PREFIXES = ("amd.com/MI", "amd.com/Instinct", "amd.com/Radeon")
# DRA DeviceClass names that are GPUs (the driver's domain: gpu.nvidia.com, mig.nvidia.com,
# gpu.amd.com, gpu.intel.com, gpu.example.com) and those of NVIDIA's driver that are not
# (IMEX channels of a ComputeDomain).
# Huawei's Ascend DRA driver names its class npu.huawei.com (Ascend/mind-cluster,
# component/ascend-dynamic-resource-allocation): one device is one NPU, as huawei.com/npu is.
GPU_DEVICE_CLASS_HINTS = ("gpu", "mig", "npu")
NON_GPU_DEVICE_CLASSES = ("compute-domain-daemon.nvidia.com",
                          "compute-domain-default-channel.nvidia.com")


def device_class_is_gpu(device_class: str) -> bool | None:
    """Whether a DRA DeviceClass gives GPUs: True, False, or None when its name cannot tell.

    Sources: NVIDIA DRA driver DeviceClasses (``gpu.nvidia.com``, ``mig.nvidia.com``,
    ``vfio.gpu.nvidia.com``; ``compute-domain-*.nvidia.com`` are IMEX channels), AMD / Intel
    ``gpu.<vendor>.com``, dra-example-driver ``gpu.example.com``, Huawei Ascend ``npu.huawei.com``
    (an NPU counts as one device, as ``huawei.com/npu`` does).
    """
    if device_class in NON_GPU_DEVICE_CLASSES:
        return False
    if any(hint in device_class for hint in GPU_DEVICE_CLASS_HINTS):
        return True
    return None


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
        node_replicas: ``(nvidia.com/gpu.product, replicas)`` pairs learnt from the Nodes of the
            same input (their ``nvidia.com/gpu.replicas`` label, :func:`policies.facts.nodes.
            node_replicas`): the replica count of a shared request pinned to that product when
            neither the pod nor ``shared_replicas`` gives one.
    """

    extra_whole_resources: tuple[str, ...] = ()
    shared_replicas: tuple[tuple[str, int], ...] = ()
    hami_memory: str = "nvidia.com/gpumem"
    hami_memory_percentage: str = "nvidia.com/gpumem-percentage"
    hami_cores: str = "nvidia.com/gpucores"
    node_replicas: tuple[tuple[str, int], ...] = ()

    def replicas_for(self, resource: str) -> int | None:
        """Time-slicing / MPS replicas per device for ``resource``, or None when not configured."""
        for name, replicas in self.shared_replicas:
            if name == resource:
                return replicas
        return None

    def replicas_on(self, products: Iterable[str]) -> int | None:
        """The replicas per device of the Nodes labelled with ``products`` (``node_replicas``),
        when every one of them is known and they agree; else None."""
        known = dict(self.node_replicas)
        values = {known.get(product) for product in products}
        return next(iter(values)) if len(values) == 1 and None not in values else None


DEFAULT_SETTINGS = GPUSettings()
# HAMi's older name of the SM-percentage resource (docs/config.md "resourceCores", default
# nvidia.com/cores; the chart's values.yaml now says nvidia.com/gpucores): a share of each GPU.
_HAMI_CORES_ALIASES = ("nvidia.com/cores",)


def split_families(settings: GPUSettings = DEFAULT_SETTINGS) -> tuple[SplitFamily, ...]:
    """Every split family: HAMi's NVIDIA names as ``settings`` configures them, then the rest."""
    aliases = tuple(a for a in _HAMI_CORES_ALIASES if a != settings.hami_cores)
    return (SplitFamily("nvidia", "nvidia.com/gpu", settings.hami_memory, _MIB,
                        settings.hami_memory_percentage, settings.hami_cores,
                        cores_aliases=aliases),
            *_SPLIT_FAMILIES)


@cache
def split_family(resource: str, settings: GPUSettings = DEFAULT_SETTINGS) -> SplitFamily | None:
    """The split family whose memory / memory-percent / cores dimension ``resource`` is."""
    for family in split_families(settings):
        if family.kind_of(resource) is not None:
            return family
    smlu = _CAMBRICON_SMLU.fullmatch(resource)
    if smlu:  # one family per model: its vmemory and vcore split the same MLU
        model = smlu.group(1)
        return SplitFamily("cambricon", "cambricon.com/vmlu", f"cambricon.com/{model}.smlu.vmemory",
                           None, None, f"cambricon.com/{model}.smlu.vcore")
    ascend = _ASCEND.fullmatch(resource)
    if ascend and ascend.group(2):
        return SplitFamily("huawei", f"huawei.com/{ascend.group(1)}", resource, _MIB)
    return None


@cache
def classify(resource: str, settings: GPUSettings = DEFAULT_SETTINGS) -> ResourceKind:
    """Classify one extended-resource name.

    Args:
        resource: the key in ``resources.limits`` / ``requests`` or in node capacity.
        settings: the cluster's naming (extra whole-device names, HAMi names).

    Returns:
        The :class:`ResourceKind`; ``OTHER`` for cpu, memory and anything not GPU-like;
        ``UNRECOGNIZED`` for a name that looks like an accelerator (a word of the accelerator
        hint anywhere in a name with a ``/``, an accelerator vendor's domain, a DRA DeviceClass
        name) but is not in the registry.
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
    family = split_family(resource, settings)
    if family is not None:
        kind = family.kind_of(resource)
        assert kind is not None  # split_family found it by kind_of
        return kind
    if any(resource == f.count for f in _SPLIT_FAMILIES):
        return ResourceKind.SPLIT_COUNT
    if _ASCEND.fullmatch(resource) or re.fullmatch(r"cambricon\.com/mlu\d+", resource):
        return ResourceKind.WHOLE  # one NPU / MLU of the model in the name
    if resource in _QUALIFIERS:
        return ResourceKind.QUALIFIER
    if _NVIDIA_VGPU.fullmatch(resource):
        return ResourceKind.VGPU
    if _NVIDIA_PASSTHROUGH.fullmatch(resource) or _AMD_PASSTHROUGH.fullmatch(resource):
        return ResourceKind.WHOLE
    if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        # KEP-5004: one device of the class; a GPU when the class name says so.
        is_gpu = device_class_is_gpu(resource.removeprefix(DEVICE_CLASS_RESOURCE_PREFIX))
        return ResourceKind.WHOLE if is_gpu else ResourceKind.UNRECOGNIZED
    if resource in OBSOLETE_RESOURCES:
        return ResourceKind.OBSOLETE
    if resource.startswith(_ACCELERATOR_DOMAINS) or resource.startswith(_NVIDIA_DEVICE_PREFIXES) \
            or resource.startswith(_AMD_DEVICE_PREFIXES):
        return ResourceKind.UNRECOGNIZED
    if "/" in resource and _ACCELERATOR_HINT.search(resource):
        return ResourceKind.UNRECOGNIZED
    return ResourceKind.OTHER


def cores_per_device(resource: str) -> int | None:
    """How many units of a ``CORES`` resource make one device (a GPU-equivalent), or None when
    the chip decides (AWS ``neuroncore``: 2 per Inferentia2 / Trainium chip, 4 per Inferentia1).

    Source: Cloud TPU "System architecture" (v2 and v3 chips have 2 TensorCores each), for the
    legacy ``cloud-tpus.google.com/v2`` / ``v3`` names whose unit is one TensorCore.
    """
    if resource.startswith("cloud-tpus.google.com/"):
        version = resource.removeprefix("cloud-tpus.google.com/").removeprefix("preemptible-")
        return _TPU_LEGACY_CORES_PER_CHIP.get(version)
    return None


def vendor_of(resource: str) -> str:
    """The vendor behind a GPU resource: ``nvidia``, ``amd``, ``intel``, … or the name's domain.

    A DRA implicit name (``deviceclass.resource.kubernetes.io/gpu.nvidia.com``) is the vendor of
    its class's driver domain.
    """
    known = _WHOLE.get(resource) or _CORES.get(resource)
    if known:
        return known
    if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        device_class = resource.removeprefix(DEVICE_CLASS_RESOURCE_PREFIX)
        resource = f"{device_class.split('.', 1)[-1]}/device"
    domain = resource.split("/", 1)[0]
    return _VENDOR_DOMAINS.get(domain, domain)


@dataclass(frozen=True)
class NamePatterns:
    """The names :func:`classify` does not call ``OTHER``, as tests a matcher outside Python runs.

    A name is a GPU (or GPU-like) resource when it is in ``names``, starts with one of
    ``prefixes``, or contains ``/`` and has a match of ``hint`` anywhere, domain included
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
    families = split_families(settings)
    names = {
        *_WHOLE, *settings.extra_whole_resources, *_CORES, "nvidia.com/gpu.shared", *_QUALIFIERS,
        *(name for f in families for name in (f.count, f.memory, f.memory_percent, f.cores,
                                              *f.cores_aliases) if name is not None),
        *OBSOLETE_RESOURCES,
    }
    # The regex branches of classify (Ascend, Cambricon, KubeVirt names) all lie under these
    # prefixes or the hint, so they need no test of their own.
    prefixes = ("nvidia.com/mig-", *_NVIDIA_DEVICE_PREFIXES, *_AMD_DEVICE_PREFIXES,
                *_ACCELERATOR_DOMAINS,
                DEVICE_CLASS_RESOURCE_PREFIX)
    return NamePatterns(tuple(sorted(names)), prefixes, _ACCELERATOR_HINT.pattern)
