"""Joining NVML inventories with what Kubernetes says: what the hardware shows and the API does not.

Owns the findings that need both sides, per node: the inventory summaries
(:class:`audit.inventory.summary.InventorySummary`, from ``gpuguard inventory`` files or the
``gpuguard.io/inventory`` Node annotation), the Node's GPU facts
(:func:`policies.facts.nodes.node_facts`) and the GPU facts of the pods bound to it
(:func:`policies.facts.workloads.workload_facts`). Kinds:

- ``gpu-lost``: NVML answers GPU_IS_LOST for a GPU (fallen off the bus, needs a reset);
- ``gpus-not-advertised`` / ``gpus-over-advertised``: healthy GPUs without MIG that NVML sees vs
  the node's ``nvidia.com/gpu`` (divided by the time-slicing replicas);
- ``mig-advertised-mismatch``: MIG devices per profile vs the node's MIG resources (mixed
  strategy) or ``nvidia.com/gpu`` (single strategy);
- ``mig-config-mismatch``: the MIG layout NVML shows vs ``nvidia.com/mig.config`` (``all-disabled``,
  ``all-enabled``, ``all-balanced``, ``all-<profile>``; reference section 1.5);
  ``mig-mode-pending``: a MIG mode change waiting for a GPU reset;
- ``allocated-idle`` / ``allocated-idle-mig``: GPUs (utilization at or below the threshold) or MIG
  devices (no process) that must be among those allocated to the node's pods — a lower bound,
  since Kubernetes does not say which device a pod got;
- ``unallocated-busy``: more GPUs or MIG devices running processes than the pods can hold (GPU
  access without a request, or processes outside Kubernetes);
- ``memory-over-request``: processes use more GPU memory than the node's pods may (whole GPUs in
  full, HAMi / KAI fractions as requested: ``gpu_memory_mib``, or fraction x GPU memory);
- ``inventory-missing``, ``inventory-unknown-node``, ``inventory-stale``: coverage of the inputs.

Every count rule is stated as a bound that holds whatever device each pod got, so a finding is
never an artefact of the missing pod-to-device mapping. NVML utilization is one sample; DCGM
metrics (:mod:`audit.scan.utilization`) give windows.

Must not read files, the cluster or NVML: inputs are passed in (``join_objects`` takes already
parsed objects).
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from audit.inventory.summary import GpuSummary, InventorySummary
from policies.facts import mig
from policies.facts.gpu import GPUFacts, HamiSplit, KaiShare
from policies.facts.nodes import NodeFacts, node_facts
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.facts.workloads import workload_facts
from policies.json_fields import mapping_at

__all__ = [
    "IDLE_PERCENT",
    "KINDS",
    "InventoryFinding",
    "PodGpus",
    "join_inventories",
    "join_objects",
]

#: A GPU at or below this utilization (percent) is idle.
IDLE_PERCENT = 5.0
#: An inventory older than this (seconds) is stale, when ``now`` is given.
MAX_AGE_S = 3600.0

#: Finding kinds in report order.
KINDS = (
    "inventory-unknown-node", "inventory-missing", "inventory-stale", "gpu-lost",
    "gpus-not-advertised", "gpus-over-advertised", "mig-advertised-mismatch",
    "mig-config-mismatch", "mig-mode-pending", "allocated-idle", "allocated-idle-mig",
    "unallocated-busy", "memory-over-request",
)
_FINISHED = ("Succeeded", "Failed")


class PodGpus(NamedTuple):
    """One bound pod and what it holds: ``("namespace/name", node name, GPUFacts)``."""

    pod: str
    node: str
    facts: GPUFacts


@dataclass(frozen=True)
class InventoryFinding:
    """One thing the inventory shows that Kubernetes' view does not match.

    Attributes:
        kind: one of :data:`KINDS`.
        severity: ``warn`` (act on it) or ``info`` (coverage, changes in progress).
        node: the node name.
        message: one line with the numbers behind it.
        gpus: the GPUs concerned, ``<index> (<uuid prefix>)``.
        pods: the pods concerned (``namespace/name``).
    """

    kind: str
    severity: str
    node: str
    message: str
    gpus: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{kind, severity, node, message, gpus, pods}``."""
        return {"kind": self.kind, "severity": self.severity, "node": self.node,
                "message": self.message, "gpus": list(self.gpus), "pods": list(self.pods)}


# ---------------------------------------------------------------------------------------------
# What the pods of one node hold


class _MemoryAsk(NamedTuple):
    """GPU memory a shared pod may use: ``mib`` (MiB) when limited, else ``devices`` whole GPUs."""

    pod: str
    mib: float | None
    why: str
    devices: int = 1


@dataclass
class _Allocation:
    """GPUs the pods of one node hold, in the units the bounds need."""

    pods: list[str] = field(default_factory=list)
    gpu_pods: list[str] = field(default_factory=list)  # pods on GPUs without MIG
    whole: int = 0  # exclusive physical GPUs
    shared: Fraction = Fraction(0)  # GPU-equivalents of shared / fractional pods
    shared_pods: list[str] = field(default_factory=list)
    shared_devices: int = 0  # most GPUs the shared pods can touch
    mig: dict[str, Fraction] = field(default_factory=dict)  # profile -> instances held
    mig_most: Counter[str] = field(default_factory=Counter)  # profile -> most instances touched
    mig_pods: dict[str, list[str]] = field(default_factory=dict)
    memory: list[_MemoryAsk] = field(default_factory=list)  # what shared pods may use

    def add_mig(self, profile: str, held: Fraction, most: int, pod: str) -> None:
        self.mig[profile] = self.mig.get(profile, Fraction(0)) + held
        self.mig_most[profile] += most
        self.mig_pods.setdefault(profile, []).append(pod)

    @property
    def least_gpus(self) -> int:
        """Fewest distinct GPUs the pods can be using (whole GPUs + rounded-up shares)."""
        shared = math.ceil(self.shared)
        if self.shared_pods and shared == 0:
            shared = 1
        return self.whole + shared

    @property
    def most_gpus(self) -> int:
        """Most distinct GPUs the pods can be using."""
        return self.whole + self.shared_devices


def _allocate(node: NodeFacts | None, pods: Sequence[PodGpus], gpu_mib: int | None) -> _Allocation:
    """Sum what ``pods`` hold on ``node``; ``gpu_mib`` is the memory of one GPU (for fractions)."""
    held = _Allocation()
    replicas = node.replicas if node and node.replicas and node.replicas > 1 else 1
    single = node.mig_single_profile if node and node.mig_strategy == "single" else None
    for pod, _, facts in pods:
        held.pods.append(pod)
        for profile, count in facts.mig.items():
            held.add_mig(profile, Fraction(count), count, pod)
        for resource, count in facts.gpus.items():
            parsed = mig.profile_from_resource(resource)
            if parsed is not None and parsed[1]:  # nvidia.com/mig-<p>.shared: time-sliced MIG
                held.add_mig(parsed[0], Fraction(count, replicas), count, pod)
        devices = facts.gpus.get("nvidia.com/gpu", 0)
        shared_replicas = facts.gpus.get("nvidia.com/gpu.shared", 0)
        if single and devices:
            held.add_mig(single, Fraction(devices, replicas), devices, pod)
            devices = 0
        if facts.kai:
            _kai(held, pod, facts.kai, gpu_mib)
        elif facts.hami:
            _hami(held, pod, facts.hami, devices, gpu_mib)
        elif devices and (replicas > 1 or facts.shared):
            held.shared += Fraction(devices, replicas)
            held.shared_devices += devices
            held.shared_pods.append(pod)
            held.memory.append(_MemoryAsk(pod, None, "time-sliced: no memory limit", devices))
        else:
            held.whole += devices
            if devices:
                held.gpu_pods.append(pod)
        if shared_replicas:
            held.shared += Fraction(shared_replicas, replicas)
            held.shared_devices += shared_replicas
            held.shared_pods.append(pod)
            held.memory.append(_MemoryAsk(pod, None, "shared replicas: no memory limit",
                                          shared_replicas))
    return held


def _kai(held: _Allocation, pod: str, kai: KaiShare, gpu_mib: int | None) -> None:
    """A KAI / Run:ai pod: ``gpu-fraction`` of ``devices`` GPUs, or ``gpu-memory`` MiB on each."""
    devices = kai.devices
    fraction, memory = kai.fraction, kai.memory_mib
    held.shared_pods.append(pod)
    held.shared_devices += devices
    if memory:
        held.memory.append(_MemoryAsk(pod, float(memory) * devices,
                                      f"KAI gpu-memory {memory} MiB x {devices}"))
        if gpu_mib:
            held.shared += Fraction(min(int(memory), gpu_mib), gpu_mib) * devices
    elif fraction:
        share = Fraction(str(fraction)) * devices
        held.shared += share
        asked = float(fraction) * gpu_mib * devices if gpu_mib else None
        held.memory.append(_MemoryAsk(pod, asked, f"KAI gpu-fraction {fraction:g} x {gpu_mib} "
                                      "MiB" + (f" x {devices}" if devices > 1 else ""), devices))


def _hami(held: _Allocation, pod: str, hami: HamiSplit, devices: int,
          gpu_mib: int | None) -> None:
    """A HAMi pod: ``gpucores`` percent and ``gpumem`` MiB (or percent) on each of its GPUs."""
    count = hami.gpus or devices or 1
    cores, memory, percent = hami.gpucores, hami.gpumem_mib, hami.gpumem_percentage
    held.shared_pods.append(pod)
    held.shared_devices += count
    share = Fraction(int(cores), 100) if cores else Fraction(0)  # unknown share: no lower bound
    held.shared += share * count
    if memory:
        held.memory.append(_MemoryAsk(pod, float(memory) * count,
                                      f"HAMi gpumem {memory} MiB x {count}", count))
    elif percent and gpu_mib:
        held.memory.append(_MemoryAsk(pod, percent / 100 * gpu_mib * count,
                                      f"HAMi gpumem-percentage {percent} % x {gpu_mib} MiB x "
                                      f"{count}", count))
    else:
        held.memory.append(_MemoryAsk(pod, None, "HAMi without a memory limit", count))


# ---------------------------------------------------------------------------------------------
# Helpers on the NVML side


def _label(gpu: GpuSummary) -> str:
    return f"{gpu.index} ({gpu.uuid})" if gpu.uuid else str(gpu.index)


def _whole_gpus(summary: InventorySummary) -> list[GpuSummary]:
    """Healthy GPUs without MIG enabled (those the device plugin offers as nvidia.com/gpu)."""
    return [g for g in summary.gpus if g.status == "ok" and g.mig != "enabled"]


def _mig_gpus(summary: InventorySummary) -> list[GpuSummary]:
    return [g for g in summary.gpus if g.status == "ok" and g.mig == "enabled"]


def _mig_counts(gpus: Iterable[GpuSummary]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for gpu in gpus:
        counts.update(gpu.mig_profiles)
    return counts


def _counts_text(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{v} x {k}" for k, v in sorted(counts.items()) if v) or "none"


def _number(value: float) -> str:
    return f"{value:,.0f}"


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


# ---------------------------------------------------------------------------------------------
# The checks


class _Node:
    """The checks of one node; findings accumulate in :attr:`found`."""

    def __init__(self, name: str, summary: InventorySummary, node: NodeFacts,
                 pods: Sequence[PodGpus], idle_percent: float) -> None:
        self.name = name
        self.summary = summary
        self.node = node
        self.idle_percent = idle_percent
        whole = _whole_gpus(summary)
        sizes = [g.memory_total_mib for g in whole if g.memory_total_mib]
        self.gpu_mib = max(sizes) if sizes else None
        self.held = _allocate(node, pods, self.gpu_mib)
        self.found: list[InventoryFinding] = []

    def add(self, kind: str, message: str, *, severity: str = "warn",
            gpus: Iterable[GpuSummary] = (), pods: Iterable[str] = ()) -> None:
        self.found.append(InventoryFinding(kind, severity, self.name, message,
                                           tuple(_label(g) for g in gpus), tuple(pods)))

    def run(self) -> list[InventoryFinding]:
        self.lost()
        if not self.summary.truncated:
            self.whole_advertised()
            self.mig_advertised()
        self.mig_config()
        self.idle()
        self.idle_mig()
        self.unallocated()
        self.memory()
        return self.found

    # -- hardware vs advertisement ---------------------------------------------------------

    def _advertised(self) -> int | None:
        offer = self.node.allocatable
        return offer.gpus.get("nvidia.com/gpu")

    def lost(self) -> None:
        advertised = self._advertised()
        for gpu in self.summary.gpus:
            if gpu.status == "lost":
                tail = (f"; the node still advertises {advertised} nvidia.com/gpu"
                        if advertised else "")
                self.add("gpu-lost", f"GPU {_label(gpu)} is lost (NVML GPU_IS_LOST: fallen off "
                         f"the bus or needs a reset){tail}", gpus=[gpu])

    def whole_advertised(self) -> None:
        node = self.node
        if node.hami_devices or node.mig_strategy == "single" or node.mig_invalid:
            return  # HAMi slots and single-strategy slots are not physical GPUs
        replicas = node.replicas if node.replicas and node.replicas > 1 else 1
        slots = node.allocatable.gpus.get("nvidia.com/gpu")
        shared = node.allocatable.shared.get("nvidia.com/gpu.shared")
        healthy = _whole_gpus(self.summary)
        not_ok = [g for g in self.summary.gpus if g.status != "ok"]
        if slots is None and shared is None:
            if healthy:
                self.add("gpus-not-advertised",
                         f"NVML sees {len(healthy)} GPU(s) without MIG, but the node advertises "
                         "no nvidia.com/gpu (device plugin not running, or the GPUs are handed "
                         "out through DRA)", gpus=healthy)
            return
        total = (slots or 0) + (shared or 0)
        if total % replicas:
            return
        physical = total // replicas
        unit = f" ({total} slots / {replicas} replicas)" if replicas > 1 else ""
        if len(healthy) > physical:
            self.add("gpus-not-advertised",
                     f"NVML sees {len(healthy)} healthy GPU(s) without MIG; the node advertises "
                     f"{physical}{unit}: the device plugin marked some unhealthy or is stale",
                     gpus=healthy)
        elif len(healthy) < physical:
            lost = f", {len(not_ok)} lost or unreadable" if not_ok else ""
            self.add("gpus-over-advertised",
                     f"the node advertises {physical} GPU(s){unit}, NVML sees {len(healthy)} "
                     f"healthy GPU(s) without MIG{lost}: pods can be scheduled onto GPUs that "
                     "are not there", gpus=not_ok)

    def mig_advertised(self) -> None:
        node = self.node
        gpus = _mig_gpus(self.summary)
        seen = _mig_counts(gpus)
        if node.mig_strategy == "single":
            replicas = node.replicas if node.replicas and node.replicas > 1 else 1
            slots = node.allocatable.gpus.get("nvidia.com/gpu")
            problems = []
            if slots is not None and slots != sum(seen.values()) * replicas:
                problems.append(f"the node advertises {slots} nvidia.com/gpu, NVML shows "
                                f"{sum(seen.values())} MIG device(s) ({_counts_text(seen)})")
            other = sorted(p for p in seen if p != node.mig_single_profile)
            if node.mig_single_profile and other:
                problems.append(f"single strategy for {node.mig_single_profile}, but NVML also "
                                f"shows {', '.join(other)}")
            plain = _whole_gpus(self.summary)
            if plain:
                problems.append(f"{len(plain)} GPU(s) have MIG disabled under the single "
                                "strategy (GFD reports MIG-INVALID)")
            if problems:
                self.add("mig-advertised-mismatch", "; ".join(problems), gpus=gpus + plain)
            return
        advertised = dict(node.allocatable.mig)
        if not advertised and node.mig_strategy != "mixed":
            if seen:
                self.add("mig-advertised-mismatch",
                         f"NVML shows {sum(seen.values())} MIG device(s) "
                         f"({_counts_text(seen)}), but the node advertises no MIG resource "
                         "(no MIG strategy: the device plugin runs with strategy none)",
                         gpus=gpus)
            return
        differ = sorted(p for p in set(advertised) | set(seen)
                        if advertised.get(p, 0) != seen.get(p, 0))
        if differ:
            parts = [f"nvidia.com/mig-{p} {advertised.get(p, 0)} advertised vs "
                     f"{seen.get(p, 0)} in NVML" for p in differ]
            self.add("mig-advertised-mismatch", "MIG devices and MIG resources differ: "
                     + "; ".join(parts), gpus=gpus)

    # -- MIG layout vs labels --------------------------------------------------------------

    def mig_config(self) -> None:
        config, state = self.node.mig_config, self.node.mig_config_state
        in_progress = state in ("pending", "rebooting")
        for gpu in self.summary.gpus:
            if gpu.status == "ok" and gpu.mig and gpu.mig_pending:
                self.add("mig-mode-pending",
                         f"GPU {_label(gpu)}: MIG {gpu.mig} now, {gpu.mig_pending} after the "
                         "next GPU reset or reboot", severity="info", gpus=[gpu])
        if not config:
            return
        problems: list[str] = []
        concerned: list[GpuSummary] = []
        for gpu in self.summary.gpus:
            if gpu.status != "ok" or gpu.mig is None:
                continue  # lost, or not MIG-capable: mig-parted leaves it alone
            problem = _layout_problem(config, gpu)
            if problem:
                problems.append(f"GPU {gpu.index}: {problem}")
                concerned.append(gpu)
        if problems:
            where = f" (nvidia.com/mig.config.state={state})" if state else ""
            self.add("mig-config-mismatch",
                     f"nvidia.com/mig.config={config}{where}, but " + "; ".join(problems),
                     severity="info" if in_progress else "warn", gpus=concerned)

    # -- allocation vs activity ------------------------------------------------------------

    def idle(self) -> None:
        gpus = _whole_gpus(self.summary)
        least = min(self.held.least_gpus, len(gpus))
        if not least:
            return
        idle = [g for g in gpus if g.utilization_percent is not None
                and g.utilization_percent <= self.idle_percent]
        active = len(gpus) - len(idle)
        surely_idle = least - active
        if surely_idle <= 0:
            return
        detail = "; ".join(f"GPU {g.index}: {g.utilization_percent} %, "
                           f"{_plural(g.process_count, 'process', 'processes')}" for g in idle)
        self.add("allocated-idle",
                 f"at least {surely_idle} of the {least} GPU(s) held by pods on this node are "
                 f"idle: {len(idle)} of {len(gpus)} GPU(s) at or below {self.idle_percent:g} % "
                 f"utilization in one NVML sample ({detail})",
                 gpus=idle, pods=list(dict.fromkeys(self.held.gpu_pods + self.held.shared_pods)))

    def idle_mig(self) -> None:
        gpus = _mig_gpus(self.summary)
        if not gpus or any(g.mig_busy is None for g in gpus):
            return
        present = _mig_counts(gpus)
        busy: Counter[str] = Counter()
        for gpu in gpus:
            busy.update(gpu.mig_busy or {})
        for profile, amount in sorted(self.held.mig.items()):
            least = min(math.ceil(amount), present.get(profile, 0))
            surely_idle = least - busy.get(profile, 0)
            if surely_idle > 0:
                self.add("allocated-idle-mig",
                         f"at least {surely_idle} of the {least} {profile} MIG device(s) held "
                         f"by pods run no process ({busy.get(profile, 0)} of "
                         f"{present.get(profile, 0)} {profile} device(s) on the node run one)",
                         gpus=[g for g in gpus if profile in g.mig_profiles],
                         pods=self.held.mig_pods.get(profile, []))

    def unallocated(self) -> None:
        gpus = _whole_gpus(self.summary)
        in_use = [g for g in gpus if (g.process_count or 0) > 0
                  or (g.utilization_percent or 0) > self.idle_percent]
        most = self.held.most_gpus
        if len(in_use) > most:
            self.add("unallocated-busy",
                     f"{len(in_use)} GPU(s) run processes or work, but the pods on this node "
                     f"can use at most {most}: GPU access without a request (e.g. "
                     "NVIDIA_VISIBLE_DEVICES=all, privileged containers) or processes outside "
                     "Kubernetes", gpus=in_use, pods=self.held.pods)
        mig_gpus = _mig_gpus(self.summary)
        if not mig_gpus or any(g.mig_busy is None for g in mig_gpus):
            return
        busy: Counter[str] = Counter()
        for gpu in mig_gpus:
            busy.update(gpu.mig_busy or {})
        for profile, count in sorted(busy.items()):
            if count > self.held.mig_most.get(profile, 0):
                self.add("unallocated-busy",
                         f"{count} {profile} MIG device(s) run processes, but pods on this node "
                         f"hold {self.held.mig_most.get(profile, 0)}: GPU access without a "
                         "request or processes outside Kubernetes",
                         gpus=[g for g in mig_gpus if (g.mig_busy or {}).get(profile)],
                         pods=self.held.mig_pods.get(profile, []))

    def memory(self) -> None:
        if not any(ask.mib is not None for ask in self.held.memory):
            return  # no memory limit anywhere: every pod may use whole GPUs
        gpus = _whole_gpus(self.summary)
        if not gpus or any(g.process_memory_mib is None for g in gpus) or not self.gpu_mib:
            return
        used = sum(g.process_memory_mib or 0 for g in gpus)
        entitled = self.held.whole * self.gpu_mib + sum(
            ask.mib if ask.mib is not None else ask.devices * self.gpu_mib
            for ask in self.held.memory)
        if used <= entitled:
            return
        asks = "; ".join(f"{a.pod}: {_number(a.mib)} MiB ({a.why})" if a.mib is not None
                         else f"{a.pod}: {a.devices} whole GPU(s) ({a.why})"
                         for a in self.held.memory)
        whole = (f"; {self.held.whole} whole GPU(s) x {_number(self.gpu_mib)} MiB"
                 if self.held.whole else "")
        self.add("memory-over-request",
                 f"processes use {_number(used)} MiB of GPU memory, the pods on this node may use "
                 f"at most {_number(entitled)} MiB ({asks}{whole}): a memory limit is not "
                 "enforced (KAI fractions without HAMi or MPS limits, HAMi without hami-core) "
                 "or processes run outside the requests",
                 gpus=[g for g in gpus if g.process_memory_mib],
                 pods=[ask.pod for ask in self.held.memory])


def _plural(count: int | None, one: str, many: str) -> str:
    if count is None:
        return f"? {many}"
    return f"{count} {one if count == 1 else many}"


def _config_profile(config: str) -> str | None:
    """The profile of an ``all-<profile>`` config name (``+`` written as ``.``)."""
    if not config.startswith("all-"):
        return None
    parsed = mig.profile_from_resource(f"nvidia.com/mig-{config[len('all-'):]}")
    return parsed[0] if parsed and not parsed[1] else None


def _balanced(model: str | None) -> dict[str, int] | None:
    """``all-balanced`` for a model, by mig-parted's generator rule (reference section 1.5):
    2 x 1g + 1 x 2g + 1 x 3g (7-slice GPUs) or 2 x 1g + 1 x 2g (4-slice), base profiles only,
    each the variant with the highest max count."""
    entry = mig.gpu_model(model) if model else None
    if entry is None:
        return None
    wanted = {1: 2, 2: 1, 3: 1} if entry.compute_slices == 7 else {1: 2, 2: 1}
    layout = {}
    for slices, count in wanted.items():
        candidates = [p for p in mig.profiles_for(entry.key)
                      if p.compute_slices == slices and "+" not in p.name and "-" not in p.name]
        if not candidates:
            return None
        best = max(candidates, key=lambda p: (p.max_instances, -p.memory_slices))
        layout[best.name] = count
    return layout


def _layout_problem(config: str, gpu: GpuSummary) -> str | None:
    """Why the MIG state of ``gpu`` is not what ``nvidia.com/mig.config=config`` asks (or None)."""
    present = dict(gpu.mig_profiles)
    actual = f"MIG {gpu.mig}" + (f" with {_counts_text(present)}" if gpu.mig == "enabled" else "")
    if config == "all-disabled":
        return None if gpu.mig == "disabled" else f"{actual}, expected MIG disabled"
    if gpu.mig != "enabled":
        return f"{actual}, expected MIG enabled"
    model = mig.model_from_name(gpu.name) if gpu.name else None
    if config == "all-enabled":
        return None
    if config == "all-balanced":
        expected = _balanced(model)
        if expected is None or present == expected:
            return None
        return f"{actual}, expected {_counts_text(expected)}"
    profile = _config_profile(config)
    if profile is None:
        return None  # a custom config: its content is in the mig-parted file, not here
    found = mig.lookup(model, profile) if model else None
    if model and found is None:
        return f"{gpu.name} has no MIG profile {profile}"
    if found is not None:
        expected = {found.name: found.max_instances}
        return None if present == expected else f"{actual}, expected {_counts_text(expected)}"
    if not present or set(present) != {profile}:
        return f"{actual}, expected only {profile}"
    return None


# ---------------------------------------------------------------------------------------------
# Entry points


def _offers_nvidia(node: NodeFacts) -> bool:
    offer = node.allocatable
    return bool(offer.mig) or any(r.startswith("nvidia.com/") for r in (*offer.gpus, *offer.shared,
                                                                         *offer.split))


def join_inventories(
    inventories: Mapping[str, InventorySummary],
    nodes: Mapping[str, NodeFacts],
    pods: Iterable[PodGpus | tuple[str, str, GPUFacts]],
    *,
    idle_percent: float = IDLE_PERCENT,
    now: datetime.datetime | None = None,
    max_age_s: float = MAX_AGE_S,
) -> list[InventoryFinding]:
    """Findings for every node that has an inventory (see the module docstring for the kinds).

    Args:
        inventories: node name -> its inventory summary.
        nodes: node name -> :func:`policies.facts.nodes.node_facts` of the Node.
        pods: bound, unfinished pods asking for GPUs: ``(namespace/name, node, facts)`` where
            ``facts`` is ``workload_facts(pod).total``.
        idle_percent: a GPU at or below this utilization (percent, 0-100) is idle.
        now: the current time, to report inventories older than ``max_age_s``; None skips it.

    Returns:
        Findings sorted by node, then kind (:data:`KINDS` order).
    """
    by_node: dict[str, list[PodGpus]] = {}
    for entry in pods:
        pod = PodGpus(*entry)
        by_node.setdefault(pod.node, []).append(pod)
    found: list[InventoryFinding] = []
    for name in sorted(inventories):
        summary = inventories[name]
        node = nodes.get(name)
        if node is None:
            found.append(InventoryFinding(
                "inventory-unknown-node", "info", name,
                f"an inventory names node {name}, which is not in the cluster snapshot"))
            continue
        if now is not None:
            collected = _parse_time(summary.collected_at)
            if collected is not None and (now - collected).total_seconds() > max_age_s:
                found.append(InventoryFinding(
                    "inventory-stale", "info", name,
                    f"the inventory was collected at {summary.collected_at}, more than "
                    f"{max_age_s / 60:g} minutes before this audit (is the inventory DaemonSet "
                    "running on the node?)"))
        found += _Node(name, summary, node, by_node.get(name, []), idle_percent).run()
    if inventories:
        for name in sorted(set(nodes) - set(inventories)):
            if _offers_nvidia(nodes[name]):
                found.append(InventoryFinding(
                    "inventory-missing", "info", name,
                    "the node offers NVIDIA GPUs but no inventory was given for it"))
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found, key=lambda f: (f.node, order.get(f.kind, len(order))))


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = mapping_at(obj, "metadata")
    return str(metadata.get("namespace") or "default"), str(metadata.get("name") or "")


def pods_on_nodes(objects: Iterable[Mapping[str, Any]],
                  settings: GPUSettings = DEFAULT_SETTINGS) -> list[PodGpus]:
    """Bound, unfinished Pods among ``objects`` that ask for GPUs, with their GPU facts."""
    found = []
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        spec = mapping_at(obj, "spec")
        status = mapping_at(obj, "status")
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node or status.get("phase") in _FINISHED:
            continue
        facts = workload_facts(obj, settings=settings)
        if facts is not None and facts.total.requested:
            namespace, name = _name(obj)
            found.append(PodGpus(f"{namespace}/{name}", node, facts.total))
    return found


def join_objects(
    inventories: Mapping[str, InventorySummary],
    objects: Iterable[Mapping[str, Any]],
    *,
    settings: GPUSettings = DEFAULT_SETTINGS,
    idle_percent: float = IDLE_PERCENT,
    now: datetime.datetime | None = None,
) -> list[InventoryFinding]:
    """:func:`join_inventories` from parsed Kubernetes objects (Nodes and Pods; others ignored)."""
    objects = list(objects)
    nodes = {}
    for obj in objects:
        if obj.get("kind") == "Node":
            facts = node_facts(obj, settings)
            nodes[facts.name] = facts
    return join_inventories(inventories, nodes, pods_on_nodes(objects, settings),
                            idle_percent=idle_percent, now=now)
