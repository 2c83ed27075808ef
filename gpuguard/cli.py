"""``gpuguard`` command line: parse arguments, build settings once, dispatch, return an exit code.

Exit codes: 0 success; 1 a check found something to report (policy denial, failed test); 2 bad
input or usage (the message names the file, document and field); 3 a required system facility is
missing (e.g. NVML). No command lets a traceback escape for bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuguard import gpus_command
from gpuguard.settings import gpu_settings_from_args

EXIT_OK = 0
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit code 2 without raising SystemExit to callers."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print the usage error and raise the private exit signal handled by :func:`main`."""
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")


class _UsageError(Exception):
    """A command-line usage error (exit code 2)."""


def _add_gpu_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-resource", action="append", default=[], metavar="NAME",
        help="extra extended resource counted as one whole GPU (repeatable), "
        "e.g. gpu-vendor.example/example-gpu",
    )
    parser.add_argument(
        "--shared-replicas", action="append", default=[], metavar="RESOURCE=N",
        help="time-slicing/MPS replicas per GPU for a shared resource (repeatable), "
        "e.g. nvidia.com/gpu.shared=4",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (sub-commands are added as their issues land)."""
    parser = _Parser(
        prog="gpuguard",
        description="Policy-as-code GPU governance for Kubernetes.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    gpus = commands.add_parser(
        "gpus",
        help="print the GPU facts of workloads and nodes in manifest files",
        description="Print what each workload asks for (whole GPUs, MIG, shares, fractions, DRA, "
        "GPU-equivalents) and what each Node offers. See docs/gpu-facts.md.",
    )
    gpus.add_argument(
        "-f", "--filename", action="append", required=True, metavar="PATH",
        help="file, directory or - for stdin; YAML (multi-document) or JSON, kind: List, .gz "
        "(repeatable)",
    )
    gpus.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    gpus.add_argument(
        "--all", action="store_true",
        help="also list workloads that ask for no GPU (table output)",
    )
    _add_gpu_settings(gpus)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gpuguard`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        settings = gpu_settings_from_args(args.gpu_resource, args.shared_replicas)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"gpuguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "gpus":
        return gpus_command.run(args.filename, args.output, settings, show_all=args.all)
    return EXIT_USAGE
