"""``gpuguard`` command line: parse arguments, build settings once, dispatch, return an exit code.

Exit codes (:mod:`gpuguard.exit_codes`, the README's "Exit codes" table): 0 success; 1 a check
found something to report (policy denial, finding at ``--fail-on``, failed test, lint error); 2 bad
input or usage (the message names the file, document and field); 3 the environment lacks something
(no NVML, the API server cannot be reached); 70 an internal error. No command lets a traceback
escape: an unexpected exception is one line on stderr naming the command, the error and where it
was raised — the traceback only with ``--debug`` or ``GPUGUARD_DEBUG=1`` — and exit code 70, never
1, which CI reads as findings.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence

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
from gpuguard.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_SOFTWARE, EXIT_USAGE
from gpuguard.settings import gpu_settings_from_args
from policies.sources import printable

#: Environment variable that, set to a non-empty value other than 0, prints the traceback of an
#: internal error (like ``--debug``).
DEBUG_VARIABLE = "GPUGUARD_DEBUG"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit code 2 without raising SystemExit to callers."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print the usage error and raise the private exit signal handled by :func:`main`."""
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")


class _UsageError(Exception):
    """A command-line usage error (exit code 2)."""


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for (package metadata is read
    from disk), then the parser exits 0 like argparse's own version action."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"gpuguard {version()}")
        parser.exit()


# Each command module has register(subparsers) -> handler(args, settings) -> exit code.
_COMMANDS = (audit_command, gpus_command, lint_command, check_command, test_command, certs_command,
             serve_command, inventory_command, match_conditions_command)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[..., int]]]:
    """The full argument parser and the handler of each sub-command."""
    parser = _Parser(
        prog="gpuguard",
        description="Policy-as-code GPU governance for Kubernetes.",
        epilog="Exit codes: 0 ok, 1 findings (denied, --fail-on, failed test, lint error), "
        "2 bad input or usage, 3 environment (no NVML, API server unreachable), "
        "70 internal error.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print gpuguard's version and exit")
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of an internal error (or {DEBUG_VARIABLE}=1)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    handlers = {}
    for module in _COMMANDS:
        name, handler = module.register(commands)
        handlers[name] = handler
    return parser, handlers


def version() -> str:
    """The installed distribution's version (``0.1.0``: pyproject.toml's, through the package
    metadata), or ``unknown (not installed)`` when the sources run without being installed."""
    from importlib.metadata import PackageNotFoundError  # noqa: PLC0415 - only for --version
    from importlib.metadata import version as distribution_version  # noqa: PLC0415

    try:
        return distribution_version("gpuguard")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run ``gpuguard`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    ``environ`` (default ``os.environ``) is read for :data:`DEBUG_VARIABLE` only.
    """
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
    except KeyboardInterrupt:
        print(f"{_command_name(args)}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the last line of defence: a bug, never bad input
        environ = os.environ if environ is None else environ
        debug = args.debug or environ.get(DEBUG_VARIABLE, "") not in ("", "0")
        print(internal_error_line(_command_name(args), exc, debug=debug), file=sys.stderr)
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        return EXIT_SOFTWARE


def _command_name(args: argparse.Namespace) -> str:
    """``gpuguard audit`` (``gpuguard certs renew`` for a command with sub-commands)."""
    words = ["gpuguard", str(args.command)]
    sub = getattr(args, f"{args.command}_command", None)
    if isinstance(sub, str):
        words.append(sub)
    return " ".join(words)


def internal_error_line(command: str, exc: BaseException, *, debug: bool) -> str:
    """The one line an unexpected exception is reported as.

    ``gpuguard audit: internal error: TypeError: ... (at audit/scan/compliance.py:287 in _collect;
    a bug in gpuguard: ...)``: the command, the exception's type and message (control characters
    escaped, so it stays one line) and the innermost frame that raised it.
    """
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    # The innermost frame in gpuguard's own files (not the standard library's, not the code a
    # dataclass generates), else the innermost one.
    own = [f for f in frames if _relative(f.filename) != f.filename] or frames
    if own:
        frame = own[-1]
        where = f"at {_relative(frame.filename)}:{frame.lineno} in {frame.name}; "
    advice = "the traceback follows" if debug else \
        f"run again with --debug or {DEBUG_VARIABLE}=1 for the traceback"
    return printable(f"{command}: internal error: {type(exc).__name__}: {exc} ({where}a bug in "
                     f"gpuguard, please report it; {advice})")


#: The top-level packages of gpuguard (pyproject.toml), whose frames an internal error names.
_PACKAGES = frozenset({"gpuguard", "audit", "certs", "kube", "policies", "webhook"})


def _relative(filename: str) -> str:
    """A source file of gpuguard's packages relative to their root (``audit/scan/compliance.py``);
    any other file (the standard library, a dependency) unchanged."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        relative = os.path.relpath(filename, root)
    except ValueError:  # another drive (Windows)
        return filename
    package = relative.split(os.sep, 1)[0]
    return relative if os.path.isabs(filename) and package in _PACKAGES else filename
