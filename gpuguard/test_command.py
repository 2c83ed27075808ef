"""``gpuguard test PATH...``: run ``GPUPolicyTest`` suites and print a pass/fail table.

Each PATH is a suite file or a directory searched for them (see :mod:`policies.suites` and
``policies/library/README.md`` for the format). Prints one row per case (suite, case, result and,
for a failure, each expectation with what was expected and what the engine gave), then a
summary; ``-o json|yaml`` the TestReport document, ``-o junit`` JUnit XML
(:mod:`gpuguard.junit_report`), ``-o sarif`` a SARIF log (:mod:`gpuguard.sarif_report`). Exit
codes: 0 every case passed, 1 some case failed, 2 a suite could not be read or its
policies did not load (the message names the file, line and field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuguard.input_arguments import with_paths
from gpuguard.output_formats import add_output, versioned, write
from gpuguard.settings import add_gpu_settings
from policies.facts.resource_names import GPUSettings

# The suite runner (the policy engine, the CEL runtime, JSON Schema) and rich are imported when
# the suites run, not for ``gpuguard test --help`` (0.25 s -> ~0.06 s of CPU).
if TYPE_CHECKING:
    from policies.suites import SuiteResult


def _summary(results: Sequence[SuiteResult]) -> dict[str, int]:
    """Counts of suites and of cases per status (``pass``, ``fail``, ``error``, ``skip``)."""
    from policies.suites import ERRORED, FAILED, PASSED, SKIPPED  # noqa: PLC0415 - see above

    counts = {status: sum(s.count(status) for s in results)
              for status in (PASSED, FAILED, ERRORED, SKIPPED)}
    return {"suites": len(results), "cases": sum(len(s.cases) for s in results),
            "suite_errors": sum(len(s.errors) for s in results), **counts}


def _print_table(results: Sequence[SuiteResult]) -> None:
    from rich.table import Table  # noqa: PLC0415 - see the imports above
    from rich.text import Text  # noqa: PLC0415

    from gpuguard.terminal import table_console  # noqa: PLC0415
    from policies.suites import ERRORED, FAILED, PASSED, SKIPPED  # noqa: PLC0415

    styles = {PASSED: "green", FAILED: "red", ERRORED: "red bold", SKIPPED: "yellow"}
    console = table_console(160)
    table = Table(show_header=True, box=None, padding=(0, 2))
    for column in ("suite", "case", "result", "details"):
        table.add_column(column, overflow="fold")
    for suite in results:
        for error in suite.errors:  # Text(): messages are never read as console markup
            table.add_row(Text(suite.name), Text("-"), Text("ERROR", style=styles[ERRORED]),
                          Text(error))
        for case in suite.cases:
            label = {PASSED: "pass", FAILED: "FAIL", ERRORED: "ERROR", SKIPPED: "skip"}
            table.add_row(Text(suite.name), Text(case.case),
                          Text(label[case.status], style=styles[case.status]),
                          Text("\n".join(case.differences) if case.status != PASSED else ""))
    console.print(table)
    counts = _summary(results)
    console.print(Text(
        f"{counts['suites']} suite(s), {counts['cases']} case(s): {counts[PASSED]} passed, "
        f"{counts[FAILED]} failed, {counts[ERRORED]} error(s), {counts[SKIPPED]} skipped"
        + (f"; {counts['suite_errors']} suite error(s)" if counts["suite_errors"] else "")))


def run(paths: Sequence[str], output: str, settings: GPUSettings) -> int:
    """Run the suites under ``paths``, print the results; returns the exit code (0, 1 or 2)."""
    from policies.suites import ERRORED, exit_code, run_paths  # noqa: PLC0415 - see above

    results = run_paths(paths, settings)
    if output == "junit":
        from gpuguard.junit_report import junit_xml  # noqa: PLC0415 - only for -o junit

        sys.stdout.write(junit_xml(results))
    elif output == "sarif":
        from gpuguard.cli import version  # noqa: PLC0415 - only for -o sarif
        from gpuguard.sarif_report import sarif_log, test_entries  # noqa: PLC0415

        entries, errors = test_entries(results)
        sys.stdout.write(sarif_log(entries, version(), errors, rule_kind="GPUPolicyTest case"))
    elif output != "table":
        write(versioned("TestReport", {
            "suites": [{"source": s.source, "name": s.name, "errors": list(s.errors),
                        "cases": [c.to_dict() for c in s.cases]} for s in results],
            "summary": _summary(results),
        }), output, sys.stdout)
    else:
        _print_table(results)
    for suite in results:  # unreadable input, also on stderr, one line each
        problems = [*suite.errors, *(d for c in suite.cases if c.status == ERRORED
                                     for d in c.differences)]
        for problem in problems:
            print(f"gpuguard: test error: {problem}", file=sys.stderr)
    return exit_code(results)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard test``; returns (name, handler)."""
    parser = commands.add_parser(
        "test", help="run policy test suites (GPUPolicyTest)",
        description="Run GPUPolicyTest suites: evaluate each case's object or AdmissionReview "
        "with the suite's policies and compare the verdict, results, messages, warnings and "
        "patch with what the case expects. Exit 1 when a case fails, 2 when a suite cannot be "
        "read or its policies do not load.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="suite file, directory of suite files or - (standard input; its "
                        "relative paths are from the current directory)")
    parser.add_argument("-f", "--filename", action="append", default=[], metavar="PATH",
                        help="the same as PATH (repeatable), as in the other commands")
    add_output(parser, extra=("junit", "sarif"))
    add_gpu_settings(parser)
    return "test", lambda args, settings: with_paths("test", args, lambda paths: run(
        paths, args.output, settings))
