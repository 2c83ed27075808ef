"""``gpuguard crds``: write the CRDs of GPUPolicy, GPUQuota and GPUPolicyException.

The CRDs are generated from the JSON Schemas ``gpuguard lint`` checks files against
(:mod:`policies.policy.crd`), so the two cannot drift: ``gpuguard crds -o deploy/crds`` writes one
file per CRD (``<plural>.gpuguard.io.yaml``), ``--check`` compares instead of writing (CI, and
``tests/core/test_crds.py``, run it on the shipped files). Without ``-o`` the CRDs are printed as
one multi-document YAML stream.

Exit codes (:mod:`gpuguard.exit_codes`): 0 written, printed or up to date; 1 ``--check`` found a
file missing or different; 2 bad usage, a directory that cannot be read or written, or a schema
construct with no structural form (a bug in the packaged schemas; the message names the field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from policies.facts.resource_names import GPUSettings
from policies.policy.crd import GROUP, RESOURCES, SchemaError, definitions
from policies.sources import printable

_HEADER = (
    "GENERATED: do not edit. Regenerate with",
    "  gpuguard crds -o deploy/crds",
    "(with --check it fails while this file differs from what it writes), from",
    "policies/data/{schema}: the schema `gpuguard lint` checks files against.",
)


def _error(message: str) -> None:
    print(f"gpuguard crds: {printable(message)}", file=sys.stderr)


def file_name(plural: str) -> str:
    """The file a CRD is written to: ``gpupolicies.gpuguard.io.yaml``."""
    return f"{plural}.{GROUP}.yaml"


def rendered() -> dict[str, str]:
    """File name -> the text written there, for every CRD.

    Raises:
        SchemaError: a packaged schema has a construct with no structural form.
    """
    texts = {}
    for resource, crd in zip(RESOURCES, definitions(), strict=True):
        header = "".join(f"# {line.format(schema=resource.schema)}\n" for line in _HEADER)
        texts[file_name(resource.plural)] = header + yaml.safe_dump(crd, sort_keys=False,
                                                                    width=100)
    return texts


def run(output: str | None, check: bool) -> int:
    """Write, print or check the CRDs; see the module docstring for the exit codes."""
    try:
        texts = rendered()
    except SchemaError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    if output is None:
        sys.stdout.write("---\n".join(texts.values()))
        return EXIT_OK
    directory = Path(output)
    if check:
        return _check(directory, texts)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (directory / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        _error(f"error: {output}: cannot write: {exc.strerror or exc}")
        return EXIT_USAGE
    print(f"gpuguard crds: wrote {', '.join(str(directory / n) for n in texts)}",
          file=sys.stderr)
    return EXIT_OK


def _check(directory: Path, texts: dict[str, str]) -> int:
    if not directory.is_dir():
        _error(f"error: {directory}: not a directory (expected the folder the CRDs are "
               "written to, e.g. deploy/crds)")
        return EXIT_USAGE
    stale = []
    for name, text in texts.items():
        try:
            current = (directory / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        except OSError as exc:
            _error(f"error: {directory / name}: cannot read: {exc.strerror or exc}")
            return EXIT_USAGE
        if current != text:
            stale.append(f"{directory / name} is {'missing' if current is None else 'out of date'}")
    for line in stale:
        _error(line)
    if stale:
        _error(f"run `gpuguard crds -o {directory}`")
        return EXIT_FINDINGS
    return EXIT_OK


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard crds``; returns (name, handler)."""
    parser = commands.add_parser(
        "crds", help="write the CRDs of GPUPolicy, GPUQuota and GPUPolicyException",
        description="Generate the CustomResourceDefinitions (gpuguard.io/v1alpha1) from the "
        "JSON Schemas gpuguard lint checks files against: structural schemas, printer columns, "
        "a status subresource. Exit 1 with --check when a file is missing or out of date, 2 "
        "for bad usage.")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="write one file per CRD into DIR (e.g. deploy/crds); default: "
                        "print them")
    parser.add_argument("--check", action="store_true",
                        help="compare the files in --output with what would be written")

    def handler(args: argparse.Namespace, settings: GPUSettings) -> int:
        del settings  # the CRDs do not depend on GPU naming
        if args.check and not args.output:
            _error("error: --check needs -o DIR")
            return EXIT_USAGE
        return run(args.output, args.check)

    return "crds", handler

