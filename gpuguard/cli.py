"""``gpuguard`` command line: parse arguments, build settings once, dispatch, return an exit code.

Exit codes (:mod:`gpuguard.exit_codes`; the table of ``docs/commands/README.md``): 0 success;
1 a check found something to report (policy denial, finding at ``--fail-on``, failed test, lint
error); 2 bad input or usage (the message names the file, document and field); 3 the environment
lacks something (no NVML, the API server cannot be reached, standard output cannot be written:
:mod:`gpuguard.terminal`); 70 an internal error. No command lets
a traceback escape: an unexpected exception is one line on stderr naming the command, the error and
where it was raised — the traceback only with ``--debug`` or ``GPUGUARD_DEBUG=1`` — and exit code
70, never 1, which CI reads as findings.

Start-up: each command's module is imported only when that command runs or shows its help
(:data:`COMMANDS`); ``gpuguard --help`` and ``--version`` import none of them (all of them together
cost ~2 s of CPU: the kubernetes client, aiohttp, the CEL runtime).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence

from gpuguard.exit_codes import (
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOFTWARE,
    EXIT_USAGE,
)

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


#: Every command, in the order ``gpuguard --help`` lists them: the module whose
#: ``register(subparsers) -> (name, handler)`` adds it (``handler(args, settings) -> exit code``)
#: and the line the top-level help shows — the ``help`` the module registers, which
#: tests/cli/test_cli_startup.py keeps equal, so the list needs no import.
COMMANDS: dict[str, tuple[str, str]] = {
    "audit": ("gpuguard.audit_command",
              "audit running workloads: policy compliance and GPU placement efficiency"),
    "gpus": ("gpuguard.gpus_command",
             "print the GPU facts of workloads and nodes in manifest files"),
    "lint": ("gpuguard.lint_command", "check policy files (schema and CEL) and list every error"),
    "check": ("gpuguard.check_command",
              "evaluate policies offline on manifests or AdmissionReviews"),
    "test": ("gpuguard.test_command", "run policy test suites (GPUPolicyTest)"),
    "certs": ("gpuguard.certs_command",
              "create, renew and publish the webhook's TLS certificates"),
    "serve": ("gpuguard.serve_command", "run the validating + mutating admission webhook (HTTPS)"),
    "inventory": ("gpuguard.inventory_command",
                  "read this machine's GPUs through NVML (devices, MIG, processes)"),
    "match-conditions": ("gpuguard.match_conditions_command",
                         "write the webhooks' matchConditions (send only GPU objects)"),
    "diff": ("gpuguard.diff_command",
             "what a candidate policy set would change on a snapshot or the cluster (what-if)"),
    "crds": ("gpuguard.crds_command",
             "write the CRDs of GPUPolicy, GPUQuota and GPUPolicyException"),
}

_ALL = object()


def build_parser(command: object = _ALL) -> tuple[argparse.ArgumentParser,
                                                  dict[str, Callable[..., int]]]:
    """The argument parser and the handlers of the sub-commands it can run.

    ``command`` (default: every one) names the one command whose module is imported and
    registered in full; the others are listed by name and help line only, and ``None`` imports
    none (for ``--help``, ``--version`` or an unknown command).
    """
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
    for name, (module, summary) in COMMANDS.items():
        if command is _ALL or command == name:
            registered, handler = importlib.import_module(module).register(commands)
            handlers[registered] = handler
        else:
            commands.add_parser(name, help=summary)
    return parser, handlers


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level options
    take no value), if it is one of :data:`COMMANDS`."""
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    return word if word in COMMANDS else None


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
    words = list(sys.argv[1:] if argv is None else argv)
    parser, handlers = build_parser(_command_in(words))
    try:
        args = parser.parse_args(words)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        # Imported here, not for --help: the GPU facts load the MIG catalog and YAML.
        from gpuguard.settings import gpu_settings_from_args  # noqa: PLC0415

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
    # Imported here, not for --help: it loads rich.
    from gpuguard.terminal import StandardOutputError, guarded_standard_output  # noqa: PLC0415

    try:
        with guarded_standard_output():
            return handlers[args.command](args, settings)
    except StandardOutputError as exc:  # a full disk, > /dev/full: the environment, not a bug
        print(f"{_command_name(args)}: error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except BrokenPipeError:
        # A write that bypassed the guard (the reader, | head, went away): not worth a traceback.
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
    from policies.sources import printable  # noqa: PLC0415 - only on an internal error

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
