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
import re
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


#: The options of ``gpuguard`` itself, written before the command (``gpuguard --debug audit``);
#: a command given one of them is told where it goes.
ROOT_OPTIONS = ("--version", "--debug")
_NEGATIVE_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit code 2 without raising SystemExit to callers.

    A command's parser (``gpuguard gpus``) refuses an option it does not have itself, with its
    own usage and name, before any other problem (a missing required option would otherwise be
    reported instead, and an unknown one fall through to the top-level parser's usage): the
    same ``gpuguard <command>: error: unrecognized arguments: --flag`` for every command.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print the usage error and raise the private exit signal handled by :func:`main`."""
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, but a command's parser errors on the options it does not know."""
        words = list(sys.argv[1:] if args is None else args)
        is_command = " " in self.prog  # "gpuguard gpus", not the top-level "gpuguard"
        unknown = self._unknown_options(words) if is_command else []
        if unknown:
            self.error(_unrecognized(unknown))
        found, extras = super().parse_known_args(words, namespace)
        if is_command and extras:
            self.error(_unrecognized(extras))
        return found, extras

    def _unknown_options(self, words: list[str]) -> list[str]:
        """The words of ``words`` that are options this parser has not (up to ``--``; a value
        attached with ``=`` or to a short option, and a negative number, are not options). The
        words after a sub-command's name are its parser's to judge."""
        known = self._option_string_actions
        unknown: list[str] = []
        for word in words:
            if word == "--":
                break
            if self._subparsers is not None and word in self._sub_commands():
                break
            if not word.startswith("-") or word == "-" or _NEGATIVE_NUMBER.match(word):
                continue
            name = word.split("=", 1)[0]
            if name in known or (not word.startswith("--") and word[:2] in known):
                continue
            if word.startswith("--") and any(o.startswith(name) for o in known):
                continue  # an abbreviation (argparse's allow_abbrev) it resolves itself
            unknown.append(word)
        return unknown

    def _sub_commands(self) -> set[str]:
        names: set[str] = set()
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                names.update(action.choices)
        return names


def _unrecognized(words: Sequence[str]) -> str:
    """``unrecognized arguments: --version`` (argparse's words), with where an option of
    ``gpuguard`` itself goes."""
    message = f"unrecognized arguments: {' '.join(words)}"
    root = [w for w in words if w.split("=", 1)[0] in ROOT_OPTIONS]
    if root:
        message += (f" ({root[0]} is an option of gpuguard itself and goes before the "
                    f"command: gpuguard {root[0]} ...)")
    return message


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
    version_option, debug_option = ROOT_OPTIONS
    parser.add_argument(version_option, action=_VersionAction, nargs=0,
                        help="print gpuguard's version and exit")
    parser.add_argument(debug_option, action="store_true",
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
