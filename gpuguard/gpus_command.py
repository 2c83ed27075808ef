"""``gpuguard gpus``: read manifests, compute GPU facts, print them as a table, JSON or YAML.

The Nodes of the input value the shared requests of its pods: a pod pinned to a time-sliced
product (``NVIDIA-A10-SHARED``) gets the replica count of the Nodes labelled with it.

Errors in the input (unparseable documents, objects without kind, a workload or Node whose
``kind`` or name fields are not strings — :mod:`policies.facts.identity`, the rule ``check`` and
the audit apply; it gets no row) are listed in ``errors`` and on stderr, one line each naming the
file and document; the other documents are still reported and the exit code is 2. A path that
names no object at all (an empty file or directory, see :mod:`gpuguard.input_paths`) is such an
error too: no facts is not "no GPUs".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rich.markup import escape
from rich.table import Table

from gpuguard.exit_codes import EXIT_OK, EXIT_USAGE
from gpuguard.input_paths import documents_of
from gpuguard.output_formats import add_output, versioned, write
from gpuguard.settings import add_gpu_settings
from gpuguard.terminal import table_console
from policies.facts.dra import DraIndex, is_claim_object
from policies.facts.identity import identity_problems
from policies.facts.nodes import node_facts, node_replicas
from policies.facts.resource_names import GPUSettings
from policies.facts.workloads import dra_index_of, workload_facts
from policies.sources import Document, printable, read_documents


def collect(paths: Sequence[str], settings: GPUSettings) -> dict[str, Any]:
    """The ``gpuguard gpus -o json`` document for ``paths`` (see docs/gpu-facts.md)."""
    documents, errors = read_documents(paths)
    settings = with_input_nodes(settings, documents)
    claims = dra_index_of(d.body for d in documents)
    objects: list[dict[str, Any]] = []
    ignored: list[str] = []
    refused: list[str] = []
    for document in documents:
        entry = _describe(document, settings, claims)
        if entry is None:
            meta = document.body.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            ignored.append(f"{document.body.get('kind')}/{name}")
            continue
        problems = identity_problems(document.body)
        if problems:  # no row: it could not be told apart, and the API server refuses it
            refused.append(f"{document.location}: {printable(str(entry['kind']))}: "
                           + "; ".join(problems)
                           + "; not reported: these fields say which object it is")
            continue
        objects.append(entry)
    return {"objects": objects, "ignored": ignored,
            "errors": [*(str(e) for e in errors), *refused,
                       *documents_of(documents, errors, paths)]}


def with_input_nodes(settings: GPUSettings, documents: Sequence[Document]) -> GPUSettings:
    """``settings`` with the replica counts of the time-slicing / MPS Nodes among ``documents``
    (:func:`policies.facts.nodes.node_replicas`), so a shared request pinned to their product is
    valued as those nodes share their GPUs; ``--shared-replicas`` still wins."""
    nodes = [node_facts(d.body, settings) for d in documents if d.body.get("kind") == "Node"]
    learnt = node_replicas(nodes)
    return replace(settings, node_replicas=learnt) if learnt else settings


def _describe(
    document: Document, settings: GPUSettings, claims: DraIndex,
) -> dict[str, Any] | None:
    body = document.body
    if body.get("kind") == "Node":
        facts = node_facts(body, settings)
        return {"kind": "Node", "apiVersion": body.get("apiVersion"), "namespace": None,
                "name": facts.name, "source": document.location, "node": facts.to_dict()}
    if is_claim_object(body):  # makes no pods: its GPUs are counted in the pods that name it
        return None
    workload = workload_facts(body, settings=settings, dra=claims)
    if workload is None:
        return None
    return {**workload.to_dict(), "source": document.location}


def _add_row(table: Table, *cells: object) -> None:
    """Add a row of input-derived text: never read as markup, control characters escaped."""
    table.add_row(*(escape(printable(str(cell))) for cell in cells))


def _table(result: dict[str, Any], show_all: bool) -> tuple[Table, list[str]]:
    """The summary table and the detailed notes printed below it."""
    table = Table(title="GPU facts")
    for column in ("object", "pods", "GPUs", "MIG", "GPU-eq", "shared", "notes"):
        table.add_column(column, overflow="fold")

    notes: list[str] = []
    for obj in result["objects"]:
        namespace = f"{obj['namespace']}/" if obj.get("namespace") else ""
        # a nameless object is told apart by where it was read
        name = f"{obj['kind']}/{namespace}{obj['name'] or '(no name, ' + obj['source'] + ')'}"
        if obj["kind"] == "Node":
            node = obj["node"]
            alloc = node["allocatable"]
            eq = node["gpu_equivalents_allocatable"]
            flags = [f"{len(node['warnings'])} warning(s)"] if node["warnings"] else []
            notes += [f"{name}: {w}" for w in node["warnings"]]
            notes += [f"{name}: unrecognized resource {r} (add --gpu-resource {r} to count it)"
                      for r in node["unrecognized"]]
            _add_row(table,
                name, "-", _counts(alloc["gpus"] | alloc["shared"]), _counts(alloc["mig"]),
                "?" if eq is None else f"{eq:g}", "yes" if alloc["shared"] else "",
                ", ".join(flags),
            )
            continue
        total = obj["total"]
        if not (show_all or total["requested"] or total["unrequested_access"]
                or total["invalid"] or total["unrecognized"] or total["warnings"]):
            continue
        flags = []
        for key, label in (("invalid", "invalid"), ("unrequested_access", "GPU access"),
                           ("unknown", "unknown"), ("unrecognized", "unrecognized"),
                           ("warnings", "warning(s)")):
            if total[key]:
                flags.append(f"{len(total[key])} {label}")
        if obj.get("not_modelled"):
            flags.append("kind not modelled")
            notes.append(f"{name}: {obj['not_modelled']}")
        notes += [f"{name}: invalid: {m}" for m in total["invalid"]]
        notes += [f"{name}: {a['path']}: {a['reason']}" for a in total["unrequested_access"]]
        notes += [f"{name}: unknown: {m}" for m in total["unknown"]]
        notes += [f"{name}: unrecognized resource {r} (add --gpu-resource {r} to count it)"
                  for r in total["unrecognized"]]
        # A pod's unrecognized resource is a warning too: the line above already says it.
        notes += [f"{name}: {w}" for w in total["warnings"]
                  if "unrecognized accelerator resource" not in w]
        eq = total["gpu_equivalents"]
        _add_row(table,
            name, "per node" if obj["replicas"] is None else str(obj["replicas"]),
            _counts(total["gpus"]), _counts(total["mig"]),
            "?" if eq is None else f"{eq:g}{'~' if total['gpu_equivalents_approximate'] else ''}",
            "yes" if total["shared"] else "", ", ".join(flags),
        )
    return table, notes


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "-"


def run(paths: Sequence[str], output: str, settings: GPUSettings, *, show_all: bool) -> int:
    """Print the GPU facts of everything under ``paths``; 2 when any input had errors, else 0."""
    result = collect(paths, settings)
    for error in result["errors"]:
        print(f"gpuguard: {error}", file=sys.stderr)
    if output != "table":
        # One write for JSON: json.dump's many small writes dominate on large snapshots.
        write(versioned("GPUFacts", result), output, sys.stdout)
    else:
        console = table_console(160)
        table, notes = _table(result, show_all)
        console.print(table)
        for note in notes:
            console.print(f"- {printable(note)}", markup=False, highlight=False)
    return EXIT_USAGE if result["errors"] else EXIT_OK


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard gpus`` to the sub-command parsers; returns (name, handler)."""
    parser = commands.add_parser(
        "gpus",
        help="print the GPU facts of workloads and nodes in manifest files",
        description="Print what each workload asks for (whole GPUs, MIG, shares, fractions, DRA, "
        "GPU-equivalents) and what each Node offers. See docs/gpu-facts.md.",
    )
    parser.add_argument(
        "-f", "--filename", action="append", required=True, metavar="PATH",
        help="file, directory or - for stdin; YAML (multi-document) or JSON, kind: List, .gz "
        "(repeatable)",
    )
    add_output(parser)
    parser.add_argument(
        "--all", action="store_true",
        help="also list workloads that ask for no GPU (table output)",
    )
    add_gpu_settings(parser)
    return "gpus", lambda args, settings: run(args.filename, args.output, settings,
                                              show_all=args.all)
