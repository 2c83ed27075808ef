"""What a path given on the command line (``-f``, ``--snapshot``) must name: at least one object.

Owns the rule, for every command that reads manifests: a path that names nothing — an empty file
(or one holding only comments or ``---``), a directory without manifest files or whose files hold
no object, empty standard input, a path from which every document failed to parse — is an input
error naming the path and what was expected, never a run over nothing that reports success.
Within a path that names something, an unreadable file or document stays one error line of its
own (the commands decide what that means for them). A path whose objects are all of kinds a
command does not read (``gpuguard audit`` of a directory of AdmissionReviews or ConfigMaps) names
nothing for it either: :func:`nothing_auditable` says what was found instead.

Must not read objects itself; it only counts what the readers of :mod:`policies.sources` and
:mod:`audit.sources.files` yield (and, for the message, looks at the path again).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

from policies.sources import Document, LoadError, iter_paths, printable

#: What a manifest path is expected to hold, for the messages.
EXPECTED = ("expected Kubernetes objects (YAML or JSON manifests, kind: List, kubectl get -o "
            "yaml output)")


class PathCoverage:
    """Counts, for each path given, the objects and the reading errors that came from it.

    Args:
        paths: the paths as given on the command line (files, directories, ``-``).
        flag: the option that named them, for the messages (``-f``, ``--snapshot``).
    """

    def __init__(self, paths: Sequence[str], flag: str = "-f") -> None:
        self.paths = list(paths)
        self.flag = flag
        self.objects = dict.fromkeys(self.paths, 0)
        self.errors = dict.fromkeys(self.paths, 0)
        self._owners: dict[str, tuple[str, ...]] = {}

    def _owners_of(self, source: str) -> tuple[str, ...]:
        """The given paths a file (``Document.source``, ``LoadError.source``) lies under."""
        owners = self._owners.get(source)
        if owners is None:
            owners = tuple(p for p in self.paths if source == p or (
                p != "-" and source.startswith(p.rstrip(os.sep) + os.sep)))
            self._owners[source] = owners
        return owners

    def count(self, item: Document | LoadError) -> None:
        """Take one item a reader yielded."""
        tally = self.objects if isinstance(item, Document) else self.errors
        for path in self._owners_of(item.source):
            tally[path] += 1

    def counted(self, items: Iterable[Document | LoadError]) -> Iterator[Document | LoadError]:
        """``items`` unchanged, each counted on the way."""
        for item in items:
            self.count(item)
            yield item

    def nothing_named(self) -> list[str]:
        """One message for each path that named no object (empty when every path named one)."""
        return [self._message(p) for p in dict.fromkeys(self.paths) if not self.objects[p]]

    def _message(self, path: str) -> str:
        where = "standard input" if path == "-" else printable(path)
        if self.errors[path]:
            return (f"{self.flag} {where}: no object could be read ({self.errors[path]} "
                    "error(s) above); " + EXPECTED)
        if path == "-":
            return f"{self.flag} {where}: no Kubernetes object (empty input); " + EXPECTED
        if not os.path.isdir(path):
            return (f"{self.flag} {where}: no Kubernetes object in the file (it is empty or "
                    "holds only comments or '---'); " + EXPECTED)
        files = sum(1 for entry in iter_paths([path]) if isinstance(entry, str))
        if not files:
            return (f"{self.flag} {where}: no manifest file in the directory (expected files "
                    "named *.yaml, *.yml or *.json, optionally gzipped as .gz)")
        return (f"{self.flag} {where}: its {files} manifest file(s) hold no Kubernetes object; "
                + EXPECTED)


def documents_of(documents: Iterable[Document], errors: Iterable[LoadError],
                 paths: Sequence[str], flag: str = "-f") -> list[str]:
    """:meth:`PathCoverage.nothing_named` for what :func:`policies.sources.read_documents` read."""
    coverage = PathCoverage(paths, flag)
    items: list[Document | LoadError] = [*documents, *errors]
    for item in items:
        coverage.count(item)
    return coverage.nothing_named()


def nothing_auditable(paths: Sequence[str], objects: int, found: Mapping[str, int]) -> str:
    """The message for an audit input of ``objects`` objects, none a Node, a Pod or a workload:
    ``found`` counts what was read by kind (the audit's ``ignored``: ``{"ConfigMap": 3}``); the
    rest were Namespaces or objects refused with an error of their own."""
    where = ", ".join("standard input" if p == "-" else printable(p) for p in paths) or \
        "the cluster"
    kinds = [f"{count} {printable(kind)}" for kind, count in found.items()]
    rest = objects - sum(found.values())
    if rest > 0:
        kinds.append(f"{rest} Namespace or refused object(s)")
    message = (f"-f {where}: {objects} object(s) read, none of them a Node, Pod or workload the "
               f"audit reports on ({', '.join(kinds)})")
    if any(kind.startswith("AdmissionReview") for kind in found):
        message += ("; AdmissionReviews are admission requests, not cluster objects: "
                    "'gpuguard check -f PATH' evaluates them")
    return message + ("; expected Nodes, Pods and workloads (Deployments, Jobs, training jobs, "
                      "...), e.g. kubectl get nodes,pods,deployments,jobs -A -o yaml output")
