"""``gpuguard diff``'s run: the two scans and the comparison. What the command does, its flags
and exit codes are :mod:`gpuguard.diff_command`'s docstring; that module imports this one only
when the command runs (the scanner and the policy engine cost ~0.3 s of CPU that ``--help``
must not pay).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from collections.abc import Callable
from typing import Any

from audit.render.policy_diff import render_markdown, render_table
from audit.report.policy_diff import compare
from audit.scan.scanner import Scanner
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from gpuguard import policy_set
from gpuguard.audit_run import cluster_items, connect_cluster, settings_from_args
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from gpuguard.input_paths import PathCoverage
from gpuguard.namespace_scope import NamespaceScope, namespaces_of
from gpuguard.output_formats import json_text, write
from gpuguard.terminal import table_console
from policies.facts.resource_names import GPUSettings
from policies.sources import printable


def _error(message: str) -> None:
    print(f"gpuguard: {printable(message)}", file=sys.stderr)


def _refuse(lines: list[str], what: str) -> int:
    for line in lines:
        _error(line)
    _error(f"error: {what}: nothing compared")
    return EXIT_USAGE


def _policy_problems(flag: str, loaded: policy_set.Loaded) -> list[str]:
    return [f"policy error ({flag}): {e}" for e in loaded.errors]


def run(args: argparse.Namespace, gpu: GPUSettings,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        ) -> int:
    """Compare the two policy sets over the snapshot or cluster; see the module docstring for
    the exit codes.

    ``now`` is read once: both scans judge at the same time (exception expiry), so an exception
    expiring between two scans cannot show as a change.
    """
    live = bool(args.cluster or args.kubeconfig or args.context)
    if live and args.filename:
        _error("error: give either -f PATH (a snapshot) or --cluster, not both")
        return EXIT_USAGE
    if not live and not args.filename:
        _error("error: nothing to compare over: give -f PATH (e.g. -f examples/cluster, the "
               "bundled snapshot) or --cluster")
        return EXIT_USAGE
    try:
        namespaces = namespaces_of(args.namespace)
        settings = settings_from_args(args, gpu, now())
    except ValueError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    settings = dataclasses.replace(settings, mutation_patches=True)
    # Both sets must be whole: a candidate that lost a policy to a typo would read as "no longer
    # denied" everywhere, a broken current set as "newly denied".
    current = policy_set.load(args.policies, gpu)
    candidate = policy_set.load(args.candidate, gpu)
    problems = [*_policy_problems("--policies", current),
                *_policy_problems("--candidate", candidate)]
    if problems:
        return _refuse(problems, "a policy set is broken or empty (gpuguard lint PATH lists "
                       "every error)")
    cluster = None
    if live:
        cluster, code = connect_cluster(args)
        if cluster is None:
            return code
    return _compare(args, settings, current, candidate, cluster,
                    NamespaceScope(namespaces) if namespaces else None)


def _compare(args: argparse.Namespace, settings: AuditSettings, current: policy_set.Loaded,
             candidate: policy_set.Loaded, cluster: Any, scope: NamespaceScope | None) -> int:
    coverage = PathCoverage(args.filename or [])
    notes: list[str] = []
    scan_state: Any = None
    if cluster is not None:
        from audit.sources.cluster import ClusterScan  # noqa: PLC0415 - see connect_cluster

        scan_state = ClusterScan()
        source: dict[str, Any] = {"kind": "cluster", "cluster": cluster.source, "paths": []}
        items = cluster_items(cluster, scan_state, None, notes)
    else:
        source = {"kind": "files", "paths": list(args.filename)}
        items = coverage.counted(iter_snapshot(args.filename))
    if scope is not None:  # the audit's -n, the same rule
        source["namespaces"] = list(scope.namespaces)
        items = scope.filtered(items)
    scans = (Scanner(settings, current.engine), Scanner(settings, candidate.engine))
    try:
        for item in items:
            for scanner in scans:
                scanner.feed(item)
    except BaseException:
        for scanner in scans:
            scanner.close()
        raise
    empty = coverage.nothing_named()
    unscoped = scope.nothing_found() if scope is not None and not empty else None
    if unscoped is not None and (scan_state is None or scan_state.unreachable is None):
        for scanner in scans:
            scanner.close()
        return _refuse([*scans[0].errors, unscoped], "-n names no namespace of the input")
    if scope is not None:
        notes.append(scope.note())
    unreachable = scan_state.unreachable if scan_state is not None else None
    if unreachable is not None or empty or scans[0].objects == 0:
        for scanner in scans:
            scanner.close()
        if unreachable is not None:
            _error(f"error: {unreachable}")
            _error("error: the API server cannot be reached: the scan is incomplete, nothing "
                   "compared")
            return EXIT_ENVIRONMENT
        why = "a path names no object" if empty else \
            "nothing could be read" if scans[0].errors else "the cluster listed no object"
        return _refuse([*scans[0].errors, *empty], why)
    before = scans[0].finish({**source,
                              "policies": list(args.policies or []) or "built-in library"})
    after = scans[1].finish({**source, "policies": list(args.candidate)})
    for line in (*before.errors, *notes):  # read once: both scans hold the same errors
        _error(line)
    diff = compare(before, after)
    diff["errors"] = list(before.errors)
    _print(diff, args.output)
    if before.errors:
        # Part of the input could not be read: what it held may be just what the candidate
        # would deny, so an incomplete comparison passes no gate (as audit's --fail-on).
        _error(f"error: {len(before.errors)} input error(s): the comparison is incomplete and "
               "cannot pass a gate")
        return EXIT_ENVIRONMENT if scan_state is not None and scan_state.failed else EXIT_USAGE
    return EXIT_FINDINGS if diff["summary"]["workloads_newly_denied"] else EXIT_OK


def _print(diff: dict[str, Any], output: str) -> None:
    if output == "json":
        sys.stdout.write(json_text(diff) + "\n")
    elif output == "yaml":
        write(diff, "yaml", sys.stdout)
    elif output == "markdown":
        sys.stdout.write(render_markdown(diff) + "\n")
    else:
        console = table_console(180)
        render_table(diff, console)
