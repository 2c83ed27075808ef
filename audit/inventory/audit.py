"""The audit's use of GPU inventories (``gpuguard audit --inventory [PATH]``).

Owns the glue between the streamed scan and :mod:`audit.inventory.join`: it reads the
``--inventory`` files up front (:func:`audit.inventory.files.read_inventories`), watches the
objects the scanner is fed for Nodes (their GPU facts, and the ``gpuguard.io/inventory``
annotation) and bound, unfinished GPU pods (their GPU facts only, so a 100k-pod snapshot does not
stay in memory), and builds the report's ``inventory`` section. Inventories from files win over
the annotations of the same node when they are newer (latest ``collected_at``).

Must not read the cluster, NVML or anything but the ``--inventory`` paths; it never changes what
the scanner counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from audit.inventory.files import inventories_from_objects, read_inventories
from audit.inventory.join import PodGpus, join_inventories, pods_on_nodes
from audit.inventory.summary import ANNOTATION, InventorySummary
from audit.settings import AuditSettings
from policies.facts.nodes import NodeFacts, node_facts
from policies.sources import Document, LoadError, printable

__all__ = ["EXPECTED", "InventoryAudit"]

#: What an ``--inventory`` path is expected to hold, for the messages.
EXPECTED = (f"expected GPUInventory documents (gpuguard inventory -o json) or Nodes with the "
            f"{ANNOTATION} annotation")


class InventoryAudit:
    """Collects what the join needs during the scan; :meth:`section` gives the report part.

    Args:
        paths: the ``--inventory`` values; an empty string stands for "only the annotations of
            the audited Nodes" (``--inventory`` without a path).
        settings: the audit's settings (GPU naming, ``idle_below``, ``now``).
    """

    def __init__(self, paths: Sequence[str], settings: AuditSettings) -> None:
        self.settings = settings
        self.from_files: dict[str, InventorySummary] = {}
        #: One line per unusable input, prefixed ``--inventory``; the caller reports them.
        self.errors: list[str] = []
        #: One line per path that gave no inventory at all (missing, empty, nothing readable):
        #: the caller refuses to audit, as for a ``-f`` path that names nothing.
        self.unusable: list[str] = []
        for path in (p for p in paths if p):
            load = read_inventories([path])
            self.errors += [f"--inventory {e}" for e in load.errors]
            if not load.inventories:
                self.unusable.append(f"--inventory {printable(path)}: " + (
                    f"no inventory could be read ({len(load.errors)} error(s) above)"
                    if load.errors else "no GPU inventory in it") + f"; {EXPECTED}")
            for node, summary in load.inventories.items():  # the newest wins, as in the join
                current = self.from_files.get(node)
                if current is None or summary.collected_at >= current.collected_at:
                    self.from_files[node] = summary
        self.from_annotations: dict[str, InventorySummary] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: list[PodGpus] = []

    def feed(self, item: Document | LoadError) -> None:
        """Look at one object of the scan (Nodes and Pods; everything else is ignored)."""
        if isinstance(item, LoadError):
            return
        body = item.body
        kind = body.get("kind")
        if kind == "Node":
            facts = node_facts(body, self.settings.gpu)
            self.nodes[facts.name] = facts
            found = inventories_from_objects([body])
            self.from_annotations.update(found.inventories)
            self.errors += [f"--inventory {item.location}: {e.split(': ', 1)[-1]}"
                            for e in found.errors]
        elif kind == "Pod":
            self.pods += pods_on_nodes([body], self.settings.gpu)

    def inventories(self) -> dict[str, InventorySummary]:
        """The inventory of each node: the most recent of files and annotations."""
        merged = dict(self.from_annotations)
        for node, summary in self.from_files.items():
            current = merged.get(node)
            if current is None or summary.collected_at >= current.collected_at:
                merged[node] = summary
        return merged

    def warnings(self) -> list[str]:
        """The report's warnings about the inventories (call after the scan): none found at all,
        which would leave the section empty without a word."""
        if self.from_files or self.from_annotations:
            return []
        return [f"--inventory: no audited Node carries the {ANNOTATION} annotation (and no "
                "inventory file was given): nothing to join (is the gpuguard inventory "
                "DaemonSet running?)"]

    def section(self) -> dict[str, Any]:
        """The report's ``inventory`` section (docs/inventory.md, "In the audit report")."""
        inventories = self.inventories()
        findings = join_inventories(
            inventories, self.nodes, self.pods, idle_percent=self.settings.idle_below * 100,
            now=self.settings.now if self.settings.now.year > 1970 else None)
        by_kind: Counter[str] = Counter(f.kind for f in findings)
        return {
            "nodes": sorted(inventories),
            "sources": {"files": len(self.from_files),
                        "annotations": len(self.from_annotations)},
            "gpus": _gpu_counts(inventories),
            "findings": [f.to_dict() for f in findings],
            "counts": dict(sorted(by_kind.items())),
        }


def _gpu_counts(inventories: Mapping[str, InventorySummary]) -> dict[str, int]:
    """GPUs in the inventories, by status (``ok``, ``lost``, ``unavailable``)."""
    counts: Counter[str] = Counter()
    for summary in inventories.values():
        counts.update(g.status for g in summary.gpus)
    return dict(sorted(counts.items()))
