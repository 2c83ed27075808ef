"""``gpuguard lint PATH...``: load policy files and list every error; exit 1 on any."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK
from gpuguard.input_arguments import with_paths
from gpuguard.output_formats import add_output, versioned, write

if TYPE_CHECKING:
    from policies.facts.resource_names import GPUSettings


def run(paths: list[str], output: str, settings: GPUSettings) -> int:
    """Lint ``paths``; print errors (one line each) and warnings; 0 clean, 1 any error."""
    # Here, not at the top: `gpuguard lint --help` needs no CEL runtime or JSON Schema validator.
    from gpuguard import policy_set  # noqa: PLC0415
    loaded = policy_set.load(paths, settings)
    names = loaded.engine.policies.names()
    quotas = loaded.engine.policies.quotas
    if output != "table":
        write(versioned("LintResult", {
            "policies": list(names), "quotas": [q.name for q in quotas],
            "errors": [str(e) for e in loaded.errors], "warnings": list(loaded.warnings)}),
            output, sys.stdout)
    else:
        for error in loaded.errors:
            print(f"error: {error}")
        for warning in loaded.warnings:
            print(f"warning: {warning}")
        print(f"{loaded.engine.policies.counts()} loaded, "
              f"{len(loaded.errors)} error(s), {len(loaded.warnings)} warning(s)")
    return EXIT_FINDINGS if loaded.errors else EXIT_OK


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard lint``; returns (name, handler)."""
    parser = commands.add_parser(
        "lint", help="check policy files (schema and CEL) and list every error",
        description="Load GPUPolicy and native ValidatingAdmissionPolicy / "
        "MutatingAdmissionPolicy files; print every schema and CEL error with file, line, "
        "document and field path. Exit 1 when there is any error.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="policy file, directory or - (standard input)")
    parser.add_argument("-f", "--filename", action="append", default=[], metavar="PATH",
                        help="the same as PATH (repeatable), as in the other commands")
    add_output(parser, aliases={"text": "table"})
    return "lint", lambda args, settings: with_paths("lint", args, lambda paths: run(
        paths, args.output, settings))
