"""A live cluster as a stream of objects: the resources the audit needs, listed page by page.

Owns the order and bookkeeping of a live scan through :class:`kube.lists.Lister`: namespaces and
nodes first, then workload controllers, then pods (so policies see the namespace and placement the
nodes as soon as possible); a resource the cluster does not serve (a CRD that is not installed) is
skipped and noted; a resource that cannot be listed (RBAC, repeated throttling) becomes one error
line, and the scan goes on with the others; an API server that cannot be reached ends the scan
(recorded in ``ClusterScan.unreachable``: every other resource would fail the same way). Objects
are yielded as :class:`~policies.sources.Document` with ``source`` ``cluster:/api/v1/pods`` and
the page number as the document index.

Must not interpret objects; read-only (GET requests only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kube.lists import (
    AUDIT_RESOURCES,
    Lister,
    ListError,
    ListStats,
    NotServed,
    Resource,
    Unreachable,
)
from policies.sources import Document, LoadError


@dataclass
class ClusterScan:
    """What a live scan read: per resource path, its :class:`~kube.lists.ListStats`; the
    resources not served; the resources that could not be listed (``failed``: the scan is
    partial, so nothing may be published from it); and why the API server could not be reached,
    when it could not (the scan stopped there)."""

    stats: dict[str, ListStats] = field(default_factory=dict)
    not_served: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unreachable: str | None = None

    def notes(self) -> list[str]:
        """Relists, throttling and retries, one line each (for the report's warnings)."""
        lines = []
        for path, stats in self.stats.items():
            lines += stats.notes
            if stats.throttled:
                lines.append(f"{path}: throttled {stats.throttled} time(s) (429); waited "
                             f"{stats.waited_s:.1f}s as Retry-After asked")
            if stats.retries:
                lines.append(f"{path}: {stats.retries} server error(s) retried")
        return lines


def iter_cluster(lister: Lister, scan: ClusterScan,
                 resources: Sequence[Resource] = AUDIT_RESOURCES,
                 progress: Callable[[str, int], None] | None = None,
                 ) -> Iterator[Document | LoadError]:
    """Every object of ``resources``, listed through ``lister`` (see module docstring).

    Args:
        progress: called with (resource plural, objects listed so far) after each page.
    """
    for resource in resources:
        stats = scan.stats.setdefault(resource.path, ListStats())
        source = f"cluster:{resource.path}"
        try:
            for page, items in enumerate(lister.iter_pages(resource, stats)):
                for number, item in enumerate(items):
                    yield Document(source, page, number, item)
                if progress is not None:
                    progress(resource.plural, stats.objects)
        except NotServed:
            scan.not_served.append(resource.path)
            scan.stats.pop(resource.path, None)
        except Unreachable as exc:
            scan.unreachable = str(exc)
            yield LoadError("cluster", None, f"cannot list {exc}")
            return
        except ListError as exc:
            scan.failed.append(resource.path)
            yield LoadError("cluster", None, f"cannot list {exc}")
