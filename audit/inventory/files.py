"""Reading GPU inventories for the audit: ``--inventory PATH`` files and Node annotations.

Owns turning inputs into ``{node name: InventorySummary}`` for :mod:`audit.inventory.join`.
Accepted, in any mix, in files, directories, ``-`` or ``.gz`` (YAML or JSON, several documents per
file, ``kind: List`` / ``NodeList``, a JSON array, or JSON Lines as ``gpuguard inventory
--interval`` prints them):

- ``GPUInventory`` documents (``gpuguard inventory -o json``), summarised on reading;
- ``GPUInventorySummary`` documents;
- ``Node`` objects (``kubectl get nodes -o yaml``) carrying the ``gpuguard.io/inventory``
  annotation (Nodes without it are skipped silently: they are the usual case).

When several inventories name the same node, the most recently collected one is kept. Each bad
file, document or annotation is one error line naming it; the others are still read.

Must not call NVML or the cluster; the join is :mod:`audit.inventory.join`'s.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit.inventory.model import KIND, InventoryFormatError, inventory_from_dict
from audit.inventory.summary import (
    ANNOTATION,
    SUMMARY_KIND,
    InventorySummary,
    summarize,
    summary_from_dict,
    summary_from_json,
)
from policies.json_fields import mapping_at
from policies.sources import (
    LoadError,
    iter_paths,
    load_json,
    parse_text,
    printable,
    read_text,
)
from policies.value_words import described

__all__ = ["InventoryLoad", "inventories_from_objects", "read_inventories"]


@dataclass(frozen=True)
class InventoryLoad:
    """Inventories by node name, and one line per input that could not be used."""

    inventories: dict[str, InventorySummary]
    errors: tuple[str, ...]


def _keep(found: dict[str, InventorySummary], node: str, summary: InventorySummary) -> None:
    """Add ``summary`` for ``node`` unless a more recent one is already there."""
    current = found.get(node)
    if current is None or summary.collected_at >= current.collected_at:
        found[node] = summary


def _from_value(value: Any, where: str, found: dict[str, InventorySummary],
                errors: list[str]) -> None:
    """Read one parsed document (or array / List of them) into ``found``."""
    if isinstance(value, list):
        for number, item in enumerate(value):
            _from_value(item, f"{where}[{number}]", found, errors)
        return
    if not isinstance(value, Mapping):
        errors.append(f"{where}: expected a GPUInventory, a GPUInventorySummary or a Node, got "
                      f"{described(value)}")
        return
    kind = value.get("kind")
    try:
        if kind == KIND:
            summary = summarize(inventory_from_dict(value))
        elif kind == SUMMARY_KIND:
            summary = summary_from_dict(value)
        elif kind == "Node":
            _from_node(value, where, found, errors)
            return
        elif isinstance(kind, str) and kind.endswith("List") and isinstance(
                value.get("items"), list):
            for number, item in enumerate(value["items"]):
                _from_value(item, f"{where} items[{number}]", found, errors)
            return
        else:
            errors.append(f"{where}: kind {kind!r} is not a GPUInventory, a "
                          "GPUInventorySummary or a Node")
            return
    except InventoryFormatError as exc:
        errors.append(f"{where}: {kind}: {exc}")
        return
    if not summary.node:
        errors.append(f"{where}: {kind} names no node (write it with gpuguard inventory "
                      "--node NAME)")
        return
    _keep(found, summary.node, summary)


def _from_node(node: Mapping[str, Any], where: str, found: dict[str, InventorySummary],
               errors: list[str]) -> None:
    metadata = mapping_at(node, "metadata")
    annotations = mapping_at(metadata, "annotations")
    text = annotations.get(ANNOTATION)
    name = metadata.get("name")
    if text is None or not isinstance(name, str):
        return
    try:
        summary = summary_from_json(str(text))
    except InventoryFormatError as exc:
        errors.append(f"{where}: Node {name}: annotation {ANNOTATION}: {exc}")
        return
    if summary.node and summary.node != name:
        errors.append(f"{where}: Node {name}: annotation {ANNOTATION} describes node "
                      f"{summary.node}; ignored")
        return
    _keep(found, name, InventorySummary(name, summary.collected_at, summary.driver_version,
                                  summary.cuda_version, summary.gpu_count, summary.gpus,
                                  summary.truncated))


def inventories_from_objects(objects: Iterable[Mapping[str, Any]]) -> InventoryLoad:
    """Inventories carried by already-parsed objects (Node annotations, inventory documents)."""
    found: dict[str, InventorySummary] = {}
    errors: list[str] = []
    for number, obj in enumerate(objects):
        if obj.get("kind") in ("Node", KIND, SUMMARY_KIND):
            _from_value(obj, f"object {number}", found, errors)
    return InventoryLoad(found, tuple(errors))


def _documents(source: str, text: str) -> Iterator[tuple[str, Any] | str]:
    """Parsed documents of one file: ``(where, value)``, or an error line."""
    if text.lstrip().startswith("{"):
        try:
            yield f"{source}: document 0", load_json(text)
            return
        except json.JSONDecodeError as exc:
            if exc.msg == "Extra data":  # JSON Lines (one inventory per line)
                for number, line in enumerate(text.splitlines(), start=1):
                    if not line.strip():
                        continue
                    try:
                        yield f"{source}: line {number}", load_json(line)
                    except json.JSONDecodeError as bad:
                        yield f"{printable(source)}: line {number}: invalid JSON: {bad.msg}"
                return
        except RecursionError:
            yield f"{printable(source)}: JSON nested too deeply"
            return
    for parsed in parse_text(source, text):
        if isinstance(parsed, LoadError):
            yield str(parsed)
        else:
            yield f"{source}: document {parsed[0]}", parsed[1]


def read_inventories(paths: Sequence[str]) -> InventoryLoad:
    """Read every inventory under ``paths`` (files, directories, ``-``); see module docstring.

    Returns:
        The inventories by node and the error lines, in file order (never raises for bad input).
    """
    found: dict[str, InventorySummary] = {}
    errors: list[str] = []
    for entry in iter_paths(paths):
        if isinstance(entry, LoadError):
            errors.append(str(entry))
            continue
        try:
            text = read_text(entry)
        except UnicodeDecodeError as exc:
            errors.append(str(LoadError(entry, None, f"not UTF-8 text (byte offset "
                                                     f"{exc.start})")))
            continue
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            errors.append(str(LoadError(entry, None, f"cannot read: {reason}")))
            continue
        for parsed in _documents(entry, text):
            if isinstance(parsed, str):
                errors.append(parsed)
            else:
                _from_value(parsed[1], printable(parsed[0]), found, errors)
    return InventoryLoad(found, tuple(errors))
