"""``gpuguard`` command line: parse arguments, build settings once, dispatch, return an exit code.

Exit codes: 0 success; 1 a check found something to report (policy denial, failed test); 2 bad
input or usage (the message names the file, document and field); 3 a required system facility is
missing (e.g. NVML). No command lets a traceback escape for bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gpuguard import (
    audit_command,
    certs_command,
    check_command,
    gpus_command,
    inventory_command,
    lint_command,
    match_conditions_command,
    serve_command,
    test_command,
)
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


# Each command module has register(subparsers) -> handler(args, settings) -> exit code.
_COMMANDS = (audit_command, gpus_command, lint_command, check_command, test_command, certs_command,
             serve_command, inventory_command, match_conditions_command)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[..., int]]]:
    """The full argument parser and the handler of each sub-command."""
    parser = _Parser(
        prog="gpuguard",
        description="Policy-as-code GPU governance for Kubernetes.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    handlers = {}
    for module in _COMMANDS:
        name, handler = module.register(commands)
        handlers[name] = handler
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gpuguard`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser, handlers = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        settings = gpu_settings_from_args(getattr(args, "gpu_resource", []),
                                          getattr(args, "shared_replicas", []))
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"gpuguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handlers[args.command](args, settings)
    except BrokenPipeError:
        # The reader (| head) went away: not an error worth a traceback.
        sys.stderr.close()
        return EXIT_OK
