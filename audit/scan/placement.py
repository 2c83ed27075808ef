"""GPU placement efficiency: allocation per node, team and cluster; free, fragmented, stranded, MIG
and pending GPUs.

Owns aggregating pods onto nodes while the snapshot streams (no pod is kept, except pending GPU
pods for the pending analysis), then the figures of the report:

- **allocated**: what bound pods (``spec.nodeName`` set; finished pods excluded) take, per extended
  resource (slots, as the scheduler counts) and in GPU-equivalents, each slot valued with its
  node's unit (:mod:`audit.scan.node_capacity`: a ``nvidia.com/gpu`` slot is 1/7 GPU on a
  single-strategy ``1g.5gb`` node, 1/replicas on a time-sliced one). HAMi pods count their own
  share (``gpucores``); KAI / Run:ai fractions their fraction (they take no extended resource; on
  their node they occupy ceil(sum of fractions) whole GPUs, since a fraction needs a GPU of its
  own to share). Pods in KAI's reservation namespace are not counted: the fractions stand for them;
- **free** = allocatable - allocated, per resource and in GPU-equivalents, on usable nodes;
- **stranded**: free GPUs on nodes nothing can use — not Ready, cordoned, ``-MIG-INVALID``, behind
  a taint that no GPU workload in the snapshot tolerates, or with CPU / memory so exhausted that
  the smallest GPU pod of the snapshot no longer fits. Each stranded node says whether the node
  is out of service (:func:`node_unavailable`: NotReady or cordoned, the scheduler skips it for
  every pod — an operator's or a failure's doing, not a placement problem) or in service with
  GPUs nothing can use (the rest), and the cluster totals split the two;
- **fragmentation** of whole GPUs: total free vs the largest request one node can still host
  ("12 GPUs free, but no node can host a 4-GPU pod");
- **MIG**: instances configured vs used per profile; pending demand for profiles no node offers;
- **pending** GPU pods with the reason the scheduler's filters give (node unavailable, untolerated
  taint, node selector / affinity, insufficient resource), in the scheduler's order.

Units: GPU-equivalents are exact Fractions per node and pod, summed over pods as floats (rounded to
9 places before comparing), and rounded to 6 places in the report;
CPU in millicores, memory in MiB. Must not read files or evaluate policies.
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from audit.scan.node_capacity import NodeCapacity, is_split
from audit.scan.ownership import ObjectKey, namespace_order
from audit.scan.pods import FINISHED, PENDING, RUNNING, PodUsage, TemplateUsage, Toleration
from audit.scan.scheduling import format_taint, selects, untolerated
from audit.settings import KAI_RESERVATION_NAMESPACE, AuditSettings

#: Requests a GPU pod may make when none in the snapshot asks for CPU / memory: the floor below
#: which a node's free CPU or memory strands its GPUs.
DEFAULT_MIN_CPU_MILLICORES = 1000
DEFAULT_MIN_MEMORY_BYTES = 1 << 30
FIT_SIZES = (1, 2, 4, 8)
FITS_ON_LISTED = 20
"""How many of the nodes a pending pod would fit on now its report entry names (``fits_on``, in
node name order; ``nodes.fit`` counts them all): every one of them in every pending pod's entry
made the report grow with pending pods x nodes (at 100k pods / 5k nodes, 879 pending pods listed
236,152 node names: 8.3 MB of the report's 26 MB of JSON)."""
_CONDITION_TAINTS = "node.kubernetes.io/"


def node_unavailable(node: NodeCapacity) -> bool:
    """Whether the kube-scheduler filters ``node`` out for every pod: its Ready condition is
    False, or it is cordoned (``spec.unschedulable``). A node with no conditions counts as Ready
    (:mod:`audit.scan.node_capacity`). The one place this rule is decided, for stranded GPUs and
    for the pending pods' ``node-unavailable`` reason."""
    return node.ready is False or node.unschedulable


def as_float(value: Fraction | float | None) -> float | None:
    """A GPU-equivalent figure as it appears in reports (6 decimal places)."""
    return None if value is None else round(float(value), 6)


@dataclass
class OwnerUsage:
    """What the running pods of one owner (a controller, or a bare pod) take, valued on their
    nodes: GPU-equivalents, pods whose value is unknown, slots per resource."""

    equivalents: float = 0.0
    unknown_pods: int = 0
    resources: Counter[str] = field(default_factory=Counter)


@dataclass
class OwnerTally:
    """Pod counts of one owner (a controller, or a bare pod), by state; pending demand."""

    running: int = 0
    pending: int = 0
    finished: int = 0
    gpu_running: int = 0
    gpu_pending: int = 0
    pending_eq: Fraction = Fraction(0)
    pending_unknown: int = 0
    gpu_requested: bool = False


@dataclass(frozen=True)
class NodeFigures:
    """The GPU-equivalents of one node as the cluster totals and fragmentation sum them.

    Attributes:
        allocatable: the node's GPU-equivalents (exact), None when its units are unknown.
        allocated: what its running pods take (rounded to 9 places: float sums).
        free: allocatable - allocated, at least 0 (rounded to 9 places), None when allocatable is.
    """

    allocatable: Fraction | None
    allocated: float
    free: float | None


@dataclass(frozen=True)
class PlacementFigures:
    """Everything the report takes from placement, computed once by :meth:`Placement.figures`.

    The report sections are JSON-ready (shapes in docs/audit-report.md); the per-owner values are
    keyed by owner (a controller, or a bare pod) and are not changed after the scan.

    Attributes:
        nodes: the ``nodes`` section (GPU nodes, by name).
        other_nodes: how many nodes offer no GPU.
        pods_on_missing_nodes: node name -> running GPU pods bound to a node absent from the
            snapshot.
        cluster, fragmentation, stranded, mig, pending, thresholds: those report sections.
        tallies: pod counts per owner.
        owner_usage: allocation per owner, valued on the nodes.
        node_count: Nodes in the snapshot (GPU or not).
        pods_seen: pods counted (each once), finished ones included.
        finished_pods: pods in a finished phase.
        skipped_reservation: pods of KAI's reservation namespace, not counted.
    """

    nodes: Sequence[Mapping[str, Any]]
    other_nodes: int
    pods_on_missing_nodes: Mapping[str, int]
    cluster: Mapping[str, Any]
    fragmentation: Mapping[str, Any]
    stranded: Sequence[Mapping[str, Any]]
    mig: Mapping[str, Any]
    pending: Sequence[Mapping[str, Any]]
    thresholds: Mapping[str, Any]
    tallies: Mapping[ObjectKey, OwnerTally]
    owner_usage: Mapping[ObjectKey, OwnerUsage]
    node_count: int
    pods_seen: int
    finished_pods: int
    skipped_reservation: int


@dataclass
class NodeUsage:
    """Allocation on one node, valued (see :meth:`Placement.node_usage`)."""

    used: Counter[str]
    equivalents: float
    unknown_pods: int
    kai_whole: int
    cpu_millicores: int
    memory_bytes: int
    pods: int
    gpu_pods: int


class Placement:
    """Collects nodes and pods while the snapshot streams; :meth:`figures` computes the figures."""

    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.nodes: dict[str, NodeCapacity] = {}
        self.tallies: dict[ObjectKey, OwnerTally] = defaultdict(OwnerTally)
        # Running GPU pods, counted twice, never one entry per pod (a million pods spread over
        # 20,000 nodes would make nearly one (node, owner) pair each): per node, by
        # (node name, id of their TemplateUsage) — valued once all nodes are known, with the
        # last copy of each node; per owner, by (owner, template id, node units), the units
        # being those of the node as known when the pod was read (a tuple of (resource, unit)
        # pairs, one object per distinct kind of node), or the node's name when it was not
        # known yet (valued at the end, as the per-node count is).
        self._bound: Counter[tuple[str, int]] = Counter()
        self._owner_bound: Counter[tuple[ObjectKey, int, tuple[Any, ...] | str]] = Counter()
        self._units: dict[str, tuple[tuple[str, Fraction | None], ...]] = {}
        self._unit_kinds: dict[tuple[tuple[str, Fraction | None], ...],
                               tuple[tuple[str, Fraction | None], ...]] = {}
        self._templates: dict[int, TemplateUsage] = {}
        self._owners: dict[ObjectKey, ObjectKey] = {}  # one key object per owner (memory)
        self._valued: tuple[dict[str, NodeUsage], dict[ObjectKey, OwnerUsage]] | None = None
        self._cpu: Counter[str] = Counter()
        self._memory: Counter[str] = Counter()
        self._pods_on: Counter[str] = Counter()
        self._gpu_pods_on: Counter[str] = Counter()
        self.pending: list[PodUsage] = []
        self.tolerations: set[tuple[Toleration, ...]] = set()
        self._min_cpu: int | None = None
        self._min_memory: int | None = None
        self.pods_seen = 0
        self.finished = 0
        self.skipped_reservation = 0

    # --- streaming ---------------------------------------------------------------------------

    def add_node(self, node: NodeCapacity) -> None:
        """A Node of the snapshot (a later object of the same name replaces it: in the
        per-node figures; pods read before the later copy count in their owner's
        GPU-equivalents with the units of the copy known then)."""
        self.nodes[node.name] = node
        units = tuple(sorted(node.units.items()))
        self._units[sys.intern(node.name)] = self._unit_kinds.setdefault(units, units)

    def add_template(self, template: TemplateUsage) -> None:
        """A GPU pod template of a workload object: its tolerations and requests count for the
        stranded-GPU analysis even when no pod of it runs."""
        if not template.gpu_requested:
            return
        self.tolerations.add(template.tolerations)
        if template.cpu_millicores:
            self._min_cpu = min(self._min_cpu or template.cpu_millicores,
                                template.cpu_millicores)
        if template.memory_bytes:
            self._min_memory = min(self._min_memory or template.memory_bytes,
                                   template.memory_bytes)

    def add_pod(self, pod: PodUsage) -> ObjectKey:
        """Count one pod; returns the key it is tallied under (its owner, or itself)."""
        self.pods_seen += 1
        owner = pod.owner or pod.key
        owner = self._owners.setdefault(owner, owner)
        tally = self.tallies[owner]
        template = pod.template
        tally.gpu_requested = tally.gpu_requested or template.gpu_requested
        if pod.state == FINISHED:
            tally.finished += 1
            self.finished += 1
            return owner
        if pod.key.namespace == KAI_RESERVATION_NAMESPACE:
            self.skipped_reservation += 1
            return owner
        self.add_template(template)
        if pod.state == PENDING:
            tally.pending += 1
            if template.gpu_requested:
                tally.gpu_pending += 1
                if template.equivalents is None:
                    tally.pending_unknown += 1
                else:
                    tally.pending_eq += template.equivalents
                self.pending.append(pod)
            return owner
        assert pod.state == RUNNING and pod.node is not None
        tally.running += 1
        node = sys.intern(pod.node)
        self._pods_on[node] += 1
        self._cpu[node] += template.cpu_millicores
        self._memory[node] += template.memory_bytes
        if not template.gpu_requested:
            return owner
        tally.gpu_running += 1
        self._gpu_pods_on[node] += 1
        template_id = id(template)
        self._templates.setdefault(template_id, template)
        self._bound[(node, template_id)] += 1
        units = self._units.get(node)
        self._owner_bound[(owner, template_id, node if units is None else units)] += 1
        self._valued = None
        return owner

    # --- valuation -----------------------------------------------------------------------------

    @staticmethod
    def _value(units: Mapping[str, Fraction | None] | None,
               template: TemplateUsage) -> tuple[Fraction, bool]:
        """(GPU-equivalents, unknown) of one pod of ``template`` on a node of ``units`` (its
        :attr:`NodeCapacity.units`; None: a node missing from the snapshot).

        Devices are valued with the node's units; a HAMi pod with a known share counts that
        share; a KAI fraction adds its fraction; a pod whose GPUs are DRA claims only counts its
        claims (unknown for a shared ResourceClaim). A node missing from the snapshot: the pod
        alone.
        """
        if units is None:
            value = template.equivalents
            return (Fraction(0), True) if value is None else (value, False)
        if template.hami and template.equivalents is not None:
            return template.equivalents, False
        if template.dra and not template.requests:
            # DRA devices are not in node allocatable: the claims alone value the pod; a shared
            # ResourceClaim or a claim of unknown size is unknown, never 0 without a word
            value = template.equivalents
            if value is None or template.dra_shared:
                return Fraction(0), True
            return value, False
        total = template.kai_share or Fraction(0)
        for resource, count in template.requests.items():
            if resource not in units:
                if is_split(resource):
                    continue  # gpumem / gpucores describe a slot, they are not one
                value = template.equivalents  # not offered here any more: the pod alone
                return (Fraction(0), True) if value is None else (value, False)
            unit = units[resource]
            if unit is None:
                return total, True
            total += count * unit
        return total, False

    def _valuate(self) -> tuple[dict[str, NodeUsage], dict[ObjectKey, OwnerUsage]]:
        """Value every running GPU pod on its node, once: per node and per owner."""
        if self._valued is not None:
            return self._valued
        nodes: dict[str, NodeUsage] = {}
        owners: dict[ObjectKey, OwnerUsage] = {}
        kai: dict[str, Fraction] = defaultdict(Fraction)
        values: dict[tuple[int, Any], tuple[Fraction, bool]] = {}

        def value_of(template_id: int, kind: tuple[Any, ...] | str) -> tuple[Fraction, bool]:
            """The value of one pod of a template on a node of one kind (units, or a name)."""
            key = (template_id, kind)
            found = values.get(key)
            if found is None:
                if isinstance(kind, str):
                    capacity = self.nodes.get(kind)
                    units = None if capacity is None else capacity.units
                else:
                    units = dict(kind)
                found = values[key] = self._value(units, self._templates[template_id])
            return found

        for (node_name, template_id), count in self._bound.items():
            template = self._templates[template_id]
            equivalents, unknown = value_of(template_id, node_name)
            use = nodes.get(node_name)
            if use is None:
                use = nodes[node_name] = NodeUsage(Counter(), 0.0, 0, 0, 0, 0, 0, 0)
            for resource, slots in template.requests.items():
                use.used[resource] += slots * count
            # floats from here: 100k-pod sums in Fractions cost seconds; reports round to 6
            # decimals, far above float error
            use.equivalents += float(equivalents) * count
            if unknown:
                use.unknown_pods += count
            if template.kai_share is not None and not template.requests:
                kai[node_name] += template.kai_share * count
        for (owner, template_id, kind), count in self._owner_bound.items():
            template = self._templates[template_id]
            equivalents, unknown = value_of(template_id, kind)
            mine = owners.get(owner)
            if mine is None:
                mine = owners[owner] = OwnerUsage()
            for resource, slots in template.requests.items():
                mine.resources[resource] += slots * count
            mine.equivalents += float(equivalents) * count
            if unknown:
                mine.unknown_pods += count
        for name in {*self._pods_on, *nodes}:
            use = nodes.get(name)
            if use is None:
                use = nodes[name] = NodeUsage(Counter(), 0.0, 0, 0, 0, 0, 0, 0)
            use.cpu_millicores = self._cpu[name]
            use.memory_bytes = self._memory[name]
            use.pods = self._pods_on[name]
            use.gpu_pods = self._gpu_pods_on[name]
            use.kai_whole = math.ceil(kai.get(name, Fraction(0)))
        self._valued = (nodes, owners)
        return self._valued

    def node_usage(self) -> dict[str, NodeUsage]:
        """Allocation per node name (including names of nodes absent from the snapshot)."""
        return self._valuate()[0]

    def owner_usage(self) -> dict[ObjectKey, OwnerUsage]:
        """Allocation per owner key (controllers and bare pods), valued on the nodes."""
        return self._valuate()[1]

    # --- the figures ---------------------------------------------------------------------------

    def min_requests(self) -> tuple[int, int]:
        """(millicores, bytes) the smallest GPU pod of the snapshot asks for (floors apply)."""
        return (self._min_cpu or DEFAULT_MIN_CPU_MILLICORES,
                self._min_memory or DEFAULT_MIN_MEMORY_BYTES)

    def figures(self, team_of: Callable[[ObjectKey], str | None],
                workload_of: Callable[[ObjectKey], ObjectKey]) -> PlacementFigures:
        """The placement figures of the audit (sections documented in docs/audit-report.md).

        Args:
            team_of: the team of an owner key (from its namespace's team label).
            workload_of: the workload (root owner) of an owner key.
        """
        usage = self.node_usage()
        min_cpu, min_memory = self.min_requests()
        entries = [self._node_entry(node, usage.get(node.name), min_cpu, min_memory)
                   for node in sorted(self.nodes.values(), key=lambda n: n.name)]
        gpu_nodes = [entry for entry, _ in entries if entry["gpu_node"]]
        # GPU-equivalents by node name, as computed for the node entries (not re-read from them:
        # the entries hold the rounded values)
        equivalents = {entry["name"]: figures for entry, figures in entries}
        orphans = sorted(name for name in usage if name not in self.nodes
                         and usage[name].gpu_pods)
        return PlacementFigures(
            nodes=gpu_nodes,
            other_nodes=len(entries) - len(gpu_nodes),
            pods_on_missing_nodes={name: usage[name].gpu_pods for name in orphans},
            cluster=self._cluster(gpu_nodes, equivalents, [usage[name] for name in orphans]),
            fragmentation=self._fragmentation(gpu_nodes, equivalents),
            stranded=[{"node": n["name"], "reasons": n["stranded"]["reasons"],
                       "node_unavailable": n["stranded"]["node_unavailable"],
                       "gpu_equivalents": n["stranded"]["gpu_equivalents"],
                       "whole_gpus": n["stranded"]["whole_gpus"],
                       "resources": n["stranded"]["resources"]}
                      for n in gpu_nodes if n["stranded"]],
            mig=self._mig(gpu_nodes),
            pending=self._pending(team_of, workload_of, usage),
            thresholds={"min_gpu_pod_cpu_millicores": min_cpu,
                        "min_gpu_pod_memory_mib": round(min_memory / 2**20, 1)},
            tallies=dict(self.tallies),
            owner_usage=self.owner_usage(),
            node_count=len(self.nodes),
            pods_seen=self.pods_seen,
            finished_pods=self.finished,
            skipped_reservation=self.skipped_reservation,
        )

    def _stranded_reasons(self, node: NodeCapacity, free_cpu: int | None,
                          free_memory: int | None, min_cpu: int, min_memory: int) -> list[str]:
        reasons = []
        if node.ready is False:
            reasons.append(f"not-ready ({node.not_ready})")
        if node.unschedulable:
            reasons.append("cordoned")
        if node.facts.mig_invalid:
            reasons.append("mig-invalid")
        # Taints Kubernetes derives from node conditions are the not-ready / cordoned cases.
        taints = [t for t in node.taints if not t[0].startswith(_CONDITION_TAINTS)]
        if taints and all(untolerated(t, taints) for t in self.tolerations or {()}):
            reasons.append("untolerated-taint (" + ", ".join(format_taint(t)
                                                             for t in taints) + ")")
        if free_cpu is not None and free_cpu < min_cpu:
            reasons.append(f"cpu-exhausted ({free_cpu}m free < {min_cpu}m)")
        if free_memory is not None and free_memory < min_memory:
            reasons.append(f"memory-exhausted ({free_memory / 2**20:.0f}Mi free < "
                           f"{min_memory / 2**20:.0f}Mi)")
        return reasons

    def _node_entry(self, node: NodeCapacity, use: NodeUsage | None, min_cpu: int,
                    min_memory: int) -> tuple[dict[str, Any], NodeFigures]:
        """The ``nodes`` entry of ``node`` and its unrounded GPU-equivalents."""
        use = use or NodeUsage(Counter(), 0.0, 0, 0, 0, 0, 0, 0)
        resources = {}
        free_whole = 0
        allocatable_whole = 0
        used_whole = 0
        over: list[str] = []
        for resource in sorted({*node.allocatable, *node.capacity, *use.used}):
            allocatable = node.allocatable.get(resource, 0)
            used = use.used.get(resource, 0)
            unit = node.units.get(resource)
            if resource == "nvidia.com/gpu" and resource in node.whole:
                used += use.kai_whole  # KAI fractions occupy whole GPUs they share
            if used > allocatable and not is_split(resource):  # splits: HAMi, not slots
                over.append(f"{resource}: {used} allocated to its running pods, {allocatable} "
                            "allocatable")
            free = max(0, allocatable - used)
            resources[resource] = {
                "capacity": node.capacity.get(resource, 0), "allocatable": allocatable,
                "allocated": used, "free": free,
                "unit_gpu_equivalents": as_float(unit) if resource in node.units else None,
            }
            if resource in node.whole:
                free_whole += free
                allocatable_whole += allocatable
                used_whole += used
        allocatable_eq = node.gpu_equivalents
        used_eq = round(use.equivalents, 9)
        free_eq = None if allocatable_eq is None else max(
            0.0, round(float(allocatable_eq) - used_eq, 9))
        free_cpu = None if node.cpu_millicores is None else node.cpu_millicores - \
            use.cpu_millicores
        free_memory = None if node.memory_bytes is None else node.memory_bytes - \
            use.memory_bytes
        reasons = self._stranded_reasons(node, free_cpu, free_memory, min_cpu, min_memory)
        stranded = None
        if reasons and (free_eq is None or free_eq > 0 or node.facts.mig_invalid):
            stranded = {
                "reasons": reasons,
                "node_unavailable": node_unavailable(node),
                "gpu_equivalents": as_float(free_eq),
                "whole_gpus": free_whole,
                "resources": {r: v["free"] for r, v in resources.items() if v["free"]},
            }
        facts = node.facts
        return {
            "name": node.name,
            "gpu_node": node.has_gpus,
            "product": facts.product,
            "model": facts.model,
            "mig_strategy": facts.mig_strategy,
            "mig_single_profile": facts.mig_single_profile,
            "sharing_strategy": facts.sharing_strategy,
            "replicas": facts.replicas,
            "hami": bool(facts.hami_devices),
            "physical_gpus": facts.physical_gpus,
            "ready": node.ready,
            "unschedulable": node.unschedulable,
            "taints": [format_taint(t) for t in node.taints],
            "resources": resources,
            "gpu_equivalents": {
                "allocatable": as_float(allocatable_eq),
                "allocated": as_float(use.equivalents),
                "free": as_float(free_eq),
                "approximate": facts.approximate,
                "unknown_pods": use.unknown_pods,
            },
            "whole_gpus": {"allocatable": allocatable_whole, "allocated": used_whole,
                           "free": free_whole},
            "cpu": {"allocatable_millicores": node.cpu_millicores,
                    "requested_millicores": use.cpu_millicores,
                    "free_millicores": free_cpu},
            "memory": {"allocatable_mib": _mib(node.memory_bytes),
                       "requested_mib": _mib(use.memory_bytes),
                       "free_mib": _mib(free_memory)},
            "pods": use.pods,
            "gpu_pods": use.gpu_pods,
            "stranded": stranded,
            "usable": not reasons,
            "warnings": [*facts.warnings, *([
                "its running pods are allocated more than it offers (" + "; ".join(over)
                + "): the scheduler never binds beyond allocatable, so the pods or the node are "
                "stale or altered in the snapshot; free is counted as 0"] if over else [])],
        }, NodeFigures(allocatable_eq, used_eq, free_eq)

    def _cluster(self, nodes: list[dict[str, Any]], equivalents: Mapping[str, NodeFigures],
                 missing: Sequence[NodeUsage] = ()) -> dict[str, Any]:
        """The ``cluster`` section. ``missing``: the usage on nodes pods are bound to that are
        absent from the snapshot — counted apart (``on_missing_nodes``), as their allocatable is
        unknown, so ``allocated`` never exceeds what the snapshot's nodes offer."""
        resources: dict[str, dict[str, int]] = {}
        # Fractions until a node's float figure is added (Fraction + float is a float).
        totals: dict[str, Fraction | float] = {
            "allocatable": Fraction(0), "allocated": Fraction(0), "free": Fraction(0),
                  "stranded": Fraction(0)}
        # Stranded GPUs split by cause: on nodes out of service (NotReady / cordoned) or in service.
        by_cause: dict[str, dict[str, Any]] = {
            cause: {"nodes": 0, "gpu_equivalents": Fraction(0), "whole_gpus": 0}
                    for cause in ("node_unavailable", "in_service")}
        unknown_nodes = []
        physical = 0
        physical_unknown = 0
        for node in nodes:
            for resource, values in node["resources"].items():
                entry = resources.setdefault(resource, {"capacity": 0, "allocatable": 0,
                                                        "allocated": 0, "free": 0,
                                                        "stranded": 0})
                for key in ("capacity", "allocatable", "allocated"):
                    entry[key] += values[key]
                entry["stranded" if node["stranded"] else "free"] += values["free"]
            figures = equivalents[node["name"]]
            if figures.allocatable is None:
                unknown_nodes.append(node["name"])
            else:
                totals["allocatable"] += figures.allocatable
            totals["allocated"] += figures.allocated
            if figures.free is not None:
                totals["stranded" if node["stranded"] else "free"] += figures.free
            if node["stranded"]:
                cause = by_cause["node_unavailable" if node["stranded"]["node_unavailable"]
                                 else "in_service"]
                cause["nodes"] += 1
                cause["whole_gpus"] += node["whole_gpus"]["free"]
                cause["gpu_equivalents"] += figures.free or 0
            if node["physical_gpus"] is None:
                physical_unknown += 1
            else:
                physical += node["physical_gpus"]
        whole = {"allocatable": 0, "allocated": 0, "free": 0, "stranded": 0}
        for node in nodes:
            whole["allocatable"] += node["whole_gpus"]["allocatable"]
            whole["allocated"] += node["whole_gpus"]["allocated"]
            whole["stranded" if node["stranded"] else "free"] += node["whole_gpus"]["free"]
        on_missing = {"nodes": len(missing), "pods": sum(use.gpu_pods for use in missing),
                      "gpu_equivalents": as_float(round(sum(use.equivalents for use in missing),
                                                        9)),
                      "unknown_pods": sum(use.unknown_pods for use in missing)}
        return {
            "gpu_nodes": len(nodes),
            "on_missing_nodes": on_missing,
            "physical_gpus": {"known": physical, "nodes_unknown": physical_unknown},
            "gpu_equivalents": {k: as_float(v) for k, v in totals.items()}
            | {"nodes_unknown": unknown_nodes},
            "whole_gpus": whole,
            "stranded_by_cause": {name: {**cause, "gpu_equivalents": as_float(
                cause["gpu_equivalents"])} for name, cause in by_cause.items()},
            "resources": dict(sorted(resources.items())),
        }

    def _fragmentation(self, nodes: list[dict[str, Any]],
                       equivalents: Mapping[str, NodeFigures]) -> dict[str, Any]:
        usable = [n for n in nodes if n["usable"]]
        by_resource: dict[str, list[int]] = defaultdict(list)
        for node in usable:
            for resource, values in node["resources"].items():
                if values["unit_gpu_equivalents"] == 1.0 and values["allocatable"]:
                    by_resource[resource].append(values["free"])
        entries = []
        for resource, frees in sorted(by_resource.items()):
            total = sum(frees)
            largest = max(frees, default=0)
            fits = {str(size): sum(1 for f in frees if f >= size) for size in FIT_SIZES}
            blocked = [size for size in FIT_SIZES if size <= total and fits[str(size)] == 0]
            message = f"{total} {resource} free on {sum(1 for f in frees if f)} node(s); the " \
                      f"largest pod that fits on one node asks for {largest}"
            if blocked:
                message = f"{total} {resource} free, but no node can host a " \
                          f"{blocked[0]}-GPU pod (largest free on one node: {largest})"
            entries.append({
                "resource": resource, "free": total, "largest_free_on_one_node": largest,
                "nodes_with_free": sum(1 for f in frees if f), "fits": fits,
                "index": round(1 - largest / total, 4) if total else 0.0,
                "message": message,
            })
        eq_free = [free for n in usable
                   if (free := equivalents[n["name"]].free) is not None]
        total_eq = sum(eq_free, Fraction(0))
        largest_eq = max(eq_free, default=Fraction(0))
        return {
            "whole_gpus": entries,
            "gpu_equivalents": {
                "free": as_float(total_eq), "largest_free_on_one_node": as_float(largest_eq),
                "index": round(float(1 - largest_eq / total_eq), 4) if total_eq else 0.0,
            },
        }

    def _mig(self, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        profiles: dict[str, dict[str, Any]] = {}
        for node in nodes:
            capacity = self.nodes[node["name"]]
            for resource, profile in capacity.mig_profiles.items():
                values = node["resources"].get(resource)
                if values is None:
                    continue
                entry = profiles.setdefault(profile, {
                    "profile": profile, "configured": 0, "used": 0, "free": 0,
                    "configured_gpu_equivalents": Fraction(0), "used_gpu_equivalents": Fraction(0),
                    "nodes": [], "pending_instances": 0, "pending_pods": 0})
                unit = capacity.units.get(resource) or Fraction(0)
                entry["configured"] += values["allocatable"]
                entry["used"] += values["allocated"]
                entry["free"] += values["free"]
                entry["configured_gpu_equivalents"] += values["allocatable"] * unit
                entry["used_gpu_equivalents"] += values["allocated"] * unit
                if values["allocatable"] or values["capacity"]:
                    entry["nodes"].append(node["name"])
        demand: Counter[str] = Counter()
        demand_pods: Counter[str] = Counter()
        for pod in self.pending:
            for profile, count in pod.template.mig.items():
                demand[profile] += count
                demand_pods[profile] += 1
        unmet = []
        for profile, count in sorted(demand.items()):
            offered = profiles.get(profile)
            if offered is not None:
                offered["pending_instances"] += count
                offered["pending_pods"] += demand_pods[profile]
            if offered is None or not offered["nodes"]:
                unmet.append({"profile": profile, "pending_pods": demand_pods[profile],
                              "pending_instances": count})
        listed = []
        for entry in sorted(profiles.values(), key=lambda e: e["profile"]):
            listed.append({**entry,
                           "configured_gpu_equivalents": as_float(
                               entry["configured_gpu_equivalents"]),
                           "used_gpu_equivalents": as_float(entry["used_gpu_equivalents"])})
        return {"profiles": listed, "unmet_profiles": unmet}

    def _pending(self, team_of: Callable[[ObjectKey], str | None],
                 workload_of: Callable[[ObjectKey], ObjectKey],
                 usage: Mapping[str, NodeUsage]) -> list[dict[str, Any]]:
        nodes = [self.nodes[name] for name in sorted(self.nodes)]
        free: dict[str, dict[str, int]] = {}
        free_cpu: dict[str, int | None] = {}
        free_memory: dict[str, int | None] = {}
        for node in nodes:
            use = usage.get(node.name) or NodeUsage(Counter(), 0.0, 0, 0, 0, 0, 0, 0)
            free[node.name] = {r: node.allocatable.get(r, 0) - use.used.get(r, 0)
                               for r in node.allocatable}
            free_cpu[node.name] = None if node.cpu_millicores is None else \
                node.cpu_millicores - use.cpu_millicores
            free_memory[node.name] = None if node.memory_bytes is None else \
                node.memory_bytes - use.memory_bytes
        explained: dict[int, dict[str, Any]] = {}
        entries = []
        for pod in self.pending:
            template = pod.template
            analysis = explained.get(id(template))
            if analysis is None:
                analysis = explained[id(template)] = _explain(
                    template, nodes, free, free_cpu, free_memory)
            owner = pod.owner or pod.key
            workload = workload_of(owner)
            entries.append({
                "namespace": pod.key.namespace, "pod": pod.key.name,
                "workload": _ref(workload), "team": team_of(owner),
                "resources": dict(template.requests),
                "gpu_equivalents": as_float(template.equivalents),
                **analysis,
                "scheduler_message": pod.scheduler_message,
            })
        entries.sort(key=lambda e: (namespace_order(e["namespace"]), e["pod"]))
        return entries


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def _ref(key: ObjectKey) -> dict[str, Any]:
    return {"kind": key.kind, "group": key.group, "namespace": key.namespace, "name": key.name}


def _explain(template: TemplateUsage, nodes: list[NodeCapacity],
             free: Mapping[str, Mapping[str, int]], free_cpu: Mapping[str, int | None],
             free_memory: Mapping[str, int | None]) -> dict[str, Any]:
    """Why a pending pod fits no node.

    ``detail`` counts, per node, the first filter that rejects it, in the kube-scheduler's order
    (node unavailable, untolerated taint, node affinity / selector, resources), as the
    scheduler's own "0/N nodes are available" message does. ``reason`` is decided on the nodes
    the pod's selector admits: none → ``selector``; all of them not Ready or cordoned →
    ``node-unavailable``; all the available ones tainted → ``taint``; none with room →
    ``insufficient-resource``; a resource no node offers at all → ``no-node-offers-resource``;
    room somewhere → ``fits-now`` (pending for a reason outside node resources).
    """
    counts: Counter[str] = Counter()
    short_by: Counter[str] = Counter()
    matching = available = tolerated = 0
    fits: list[str] = []
    offered = {r for node in nodes for r, n in node.allocatable.items() if n}
    for node in nodes:
        unavailable = None if not node_unavailable(node) else \
            "node(s) were not ready" if node.ready is False else "node(s) were unschedulable"
        bad = untolerated(template.tolerations, node.taints)
        selected = selects(template.node_selector, template.affinity, node.labels, node.name)
        short = [r for r, n in sorted(template.requests.items())
                 if free[node.name].get(r, 0) < n]
        cpu, memory = free_cpu[node.name], free_memory[node.name]
        if cpu is not None and cpu < template.cpu_millicores:
            short.append("cpu")
        if memory is not None and memory < template.memory_bytes:
            short.append("memory")
        if template.kai_share is not None and not template.requests and \
                free[node.name].get("nvidia.com/gpu", 0) <= 0:
            short.append("nvidia.com/gpu")
        if unavailable:
            counts[unavailable] += 1
        elif bad:
            counts[f"node(s) had untolerated taint {{{format_taint(bad[0])}}}"] += 1
        elif not selected:
            counts["node(s) didn't match Pod's node affinity/selector"] += 1
        elif short:
            for resource in short:
                counts[f"Insufficient {resource}"] += 1
        if not selected:
            continue
        matching += 1
        if unavailable:
            continue
        available += 1
        if bad:
            continue
        tolerated += 1
        if short:
            short_by.update(short)
            continue
        fits.append(node.name)
    message = f"0/{len(nodes)} nodes are available: " + ", ".join(
        f"{n} {text}" for text, n in sorted(counts.items(), key=lambda c: (-c[1], c[0]))) + "."
    unoffered = sorted(r for r in template.requests if r not in offered)
    if not nodes:
        reason, message = "no-nodes", "no nodes in the snapshot"
    elif unoffered:
        reason = "no-node-offers-resource"
        message = f"no node offers {', '.join(unoffered)}; " + message
    elif fits:
        reason = "fits-now"
        message = (f"fits on {len(fits)} of {len(nodes)} node(s) now ({', '.join(fits[:5])}"
                   f"{', …' if len(fits) > 5 else ''}); pending for a reason outside node "
                   "resources (gang or queue admission, pod affinity, topology spread, quota), "
                   "or the scheduler has not retried yet")
    elif not matching:
        reason = "selector"
    elif not available:
        reason = "node-unavailable"
    elif not tolerated:
        reason = "taint"
    else:
        reason = "insufficient-resource"
    return {"reason": reason, "detail": message,
            "nodes": {"selected": matching, "available": available, "tolerated": tolerated,
                      "fit": len(fits)},
            "short_of": dict(sorted(short_by.items())), "fits_on": fits[:FITS_ON_LISTED]}
