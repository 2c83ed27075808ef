"""The ``-o`` formats the commands share and the versioned documents their JSON / YAML outputs are.

Owns: the choices ``table|json|yaml`` (each command may add its own, e.g. ``audit``'s ``html``), the
``apiVersion`` / ``kind`` that open every machine-readable document (so a consumer can tell a
``gpus`` output from a ``check`` output and notice a change of shape), and YAML written without
anchors (``&id001`` / ``*id001`` are valid YAML but unreadable and refused by some tools). Must
not decide what a document holds: each command builds its body.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import yaml

#: The version of gpuguard's output documents; the audit report's (audit/report/assemble.py)
#: is the same, tests/cli/test_cli_startup.py keeps them equal.
API_VERSION = "gpuguard.io/v1alpha1"

#: The formats every command that prints a document accepts.
DOCUMENT_FORMATS = ("table", "json", "yaml")


def add_output(parser: argparse.ArgumentParser, *, extra: Sequence[str] = (),
               aliases: Mapping[str, str] | None = None) -> None:
    """Add ``-o/--output`` with :data:`DOCUMENT_FORMATS` plus ``extra``; ``aliases`` maps an
    older name to its format (``lint -o text`` is ``table``), accepted but not listed."""
    aliases = dict(aliases or {})
    formats = (*DOCUMENT_FORMATS, *extra)

    def choice(text: str) -> str:
        value = aliases.get(text, text)
        if value not in formats:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(map(repr, formats))})")
        return value

    # choices: what the parser lists (docs/commands/*.md are checked against it); the aliases
    # are turned into a format by ``choice`` before argparse compares.
    parser.add_argument("-o", "--output", type=choice, choices=formats, default="table",
                        metavar="FORMAT",
                        help=f"what to print on stdout: {'|'.join(formats)} (default table; "
                        "json and yaml are the same document)")


def versioned(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` opened by ``apiVersion: gpuguard.io/v1alpha1`` and ``kind``."""
    return {"apiVersion": API_VERSION, "kind": kind, **body}


class _NoAliases(yaml.SafeDumper):
    """A SafeDumper that writes a repeated object out again instead of as an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def yaml_documents(documents: Iterable[Mapping[str, Any]]) -> str:
    """``documents`` as one multi-document YAML text: keys in order, no anchors or aliases (a
    dict repeated across results is written out again: PyYAML's ``&id001`` / ``*id001`` are
    valid YAML but unreadable, and some tools refuse them)."""
    return yaml.dump_all([dict(d) for d in documents], Dumper=_NoAliases, sort_keys=False,
                         allow_unicode=True)


def write(document: Mapping[str, Any], output: str, stream: TextIO) -> None:
    """Write ``document`` as ``output`` (``json``: indented, one write; ``yaml``: block style,
    keys in order, no anchors). Raises ValueError for any other format."""
    if output == "json":
        stream.write(json.dumps(document, indent=2) + "\n")
    elif output == "yaml":
        yaml.dump(dict(document), stream, Dumper=_NoAliases, sort_keys=False,
                  allow_unicode=True)
    else:
        raise ValueError(f"not a document format: {output!r}")
