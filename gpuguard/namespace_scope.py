"""``gpuguard audit -n/--namespace``: the namespaces a scan is limited to, and the filter.

Owns the rule: ``-n NS`` is repeatable and each value a comma list (``-n team-a,team-b -n
team-c``); the scan then keeps the objects whose ``metadata.namespace`` is one of them and the
Namespace objects of those names — for a snapshot (``-f``) and a live cluster (``--cluster``, where
the filter runs on what was listed: it still needs the cluster-wide list permissions). Every other
object — of another namespace, without one, or cluster-scoped (Nodes) — is skipped and counted;
the note (:meth:`NamespaceScope.note`) says so in the report's warnings, because without the
other namespaces' pods the node figures (allocatable, free, fragmented, stranded GPUs, where a
pending pod would fit) would count GPUs those pods hold as free: they are not computed. Reading
errors pass through (an unreadable document may be one of the named namespaces': never dropped).

Must stay free of heavy imports: ``gpuguard audit --help`` imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gpuguard.exit_codes import EXIT_USAGE

if TYPE_CHECKING:  # the readers are imported when a command runs, not for --help
    from policies.sources import Document, LoadError


def add_namespace_flag(parser: Any) -> None:
    """Add ``-n/--namespace NS[,NS...]`` (repeatable) to ``parser`` (a parser or a group)."""
    parser.add_argument("-n", "--namespace", action="append", metavar="NS[,NS...]",
                        help="audit only these namespaces (repeatable, or a comma list): their "
                        "objects and Namespace objects; cluster-scoped objects such as Nodes are "
                        "left out, so no node figures (free, stranded GPUs) are computed")


def namespace_problem(name: str) -> str | None:
    """Why ``name`` cannot be a Namespace's name, in apimachinery's words (a lowercase RFC 1123
    label, at most 63 characters: ``ValidateNamespaceName``), or None when it can be. The one
    check of every ``-n`` (``audit``, ``diff``, ``check``)."""
    # imported here, not for --help: the CEL format library holds apimachinery's validators
    from policies.cel.library.format import dns1123_label  # noqa: PLC0415

    problems = dns1123_label(name)
    return "; ".join(problems) if problems else None


def namespaces_of(values: Sequence[str] | None) -> tuple[str, ...]:
    """The namespaces ``-n`` names, in the order given, each once (``()``: no limit).

    Raises:
        ValueError: a value with an empty item (``-n ''``, ``-n a,,b``) or an item that is no
            namespace name (:func:`namespace_problem`); the message names it.
    """
    names: list[str] = []
    for value in values or ():
        items = [item.strip() for item in value.split(",")]
        if not all(items):
            raise ValueError(f"-n {value!r}: expected namespace names separated by commas, "
                             "e.g. -n team-a,team-b")
        for item in items:
            problem = namespace_problem(item)
            if problem:
                raise ValueError(f"-n {item!r}: not a namespace name: {problem}")
        names += [item for item in items if item not in names]
    return tuple(names)


class NamespaceScope:
    """The filter of one scan limited to ``namespaces`` (a non-empty tuple).

    Attributes:
        kept: objects passed on.
        skipped: objects left out, per kind (``Node``, ``Pod``, ...).
        seen: the namespaces of the objects read, named or not (for the message when nothing
            of the named ones was found).
    """

    def __init__(self, namespaces: tuple[str, ...]) -> None:
        self.namespaces = namespaces
        self._wanted = frozenset(namespaces)
        self.kept = 0
        self.skipped: dict[str, int] = {}
        self.seen: set[str] = set()

    def _in_scope(self, body: dict[str, Any]) -> bool:
        metadata = body.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        if body.get("kind") == "Namespace" and not metadata.get("namespace"):
            name = metadata.get("name")
            if isinstance(name, str):
                self.seen.add(name)
            return name in self._wanted
        namespace = metadata.get("namespace")
        if isinstance(namespace, str) and namespace:
            self.seen.add(namespace)
        return namespace in self._wanted

    def filtered(self, items: Iterable[Document | LoadError]) -> Iterator[Document | LoadError]:
        """``items`` without the documents out of scope (reading errors all passed on)."""
        for item in items:
            body = getattr(item, "body", None)
            if not isinstance(body, dict):  # a reading error: always passed on
                yield item
                continue
            if self._in_scope(body):
                self.kept += 1
                yield item
            else:
                kind = str(body.get("kind") or "(no kind)")
                self.skipped[kind] = self.skipped.get(kind, 0) + 1

    def note(self) -> str:
        """The report's warning: what the limit left out and which figures it leaves empty."""
        skipped = sum(self.skipped.values())
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(
            self.skipped.items(), key=lambda item: (-item[1], item[0])))
        return (f"limited to namespace(s) {', '.join(self.namespaces)} (-n): {skipped} other "
                f"object(s) left out ({kinds or 'none'}); cluster-scoped objects such as Nodes "
                "are not read, so the node figures (allocatable, free, fragmented and stranded "
                "GPUs, where a pending pod would fit) are not computed")

    def nothing_found(self) -> str | None:
        """The error when no object of the named namespaces was read, else None."""
        if self.kept:
            return None
        others = sorted(self.seen - self._wanted)
        shown = ", ".join(others[:10]) + (f" and {len(others) - 10} more"
                                          if len(others) > 10 else "")
        return (f"error: -n {','.join(self.namespaces)}: no object of these namespaces in the "
                "input" + (f" (it has objects of: {shown})" if others else ""))


def refused_with(args: argparse.Namespace) -> int | None:
    """Exit code 2 after one line when ``-n`` is combined with a flag that works on the whole
    cluster, else None: ``--write-reports`` (the publish deletes gpuguard's PolicyReports of the
    namespaces a report does not cover and writes the ClusterPolicyReport), ``--watch`` (the
    controller keeps every report) and ``--inventory`` (joined per node: the Nodes are not read)."""
    clashing = [flag for flag, given in (("--write-reports", args.write_reports),
                                         ("--watch", args.watch),
                                         ("--inventory", args.inventory is not None)) if given]
    if not args.namespace or not clashing:
        return None
    print(f"gpuguard: error: -n limits the audit to some namespaces, {', '.join(clashing)} "
          "work(s) on the whole cluster (its Nodes, every namespace's PolicyReport): run them "
          "without -n", file=sys.stderr)
    return EXIT_USAGE
