"""``gpuguard diff``: what a candidate policy set would change, before it is enforced — its
arguments, what ``gpuguard diff --help`` needs (the run is :mod:`gpuguard.diff_run`, imported
only when the command runs).

Reads a snapshot (``-f``, as ``gpuguard audit -f`` reads it: files, directories, ``-``, ``.gz``)
or the live cluster (``--cluster``, read-only, listed as ``gpuguard audit --cluster`` lists it)
once and scans it twice with the audit's scanner — once with the policy set in force
(``--policies``, default the built-in library), once with the candidate (``--candidate``) — then
prints per workload what changes (:mod:`audit.report.policy_diff`): newly denied, newly warned, no
longer denied, new, removed or changed mutations (their RFC 6902 patches), with counts per policy
and per team (``-o table|json|markdown``). A workload's findings are the audit's own, so what
``gpuguard audit --policies`` finds and what ``diff`` says cannot disagree.

Exit codes (:mod:`gpuguard.exit_codes`): 0 the candidate denies nothing the current set admits;
1 it would deny at least one workload the current set admits (or only warns about), for CI on
policy repositories; 2 bad input or usage, and then nothing is printed on stdout: either policy
set broken or empty, a ``-f`` path that names no object, nothing readable, an unusable cluster
configuration; 3 the API server cannot be reached (nothing compared). Within the inputs that name
something, each unreadable file, document or resource is one line on stderr and both scans run on
the rest.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from audit.settings import DEFAULT_TEAM_LABEL
from gpuguard.namespace_scope import add_namespace_flag
from gpuguard.settings import add_gpu_settings
from policies.facts.resource_names import GPUSettings

OUTPUTS = ("table", "json", "yaml", "markdown")


def run(args: argparse.Namespace, gpu: GPUSettings) -> int:
    """Run ``gpuguard diff`` (:func:`gpuguard.diff_run.run`); returns the exit code."""
    from gpuguard import diff_run  # noqa: PLC0415 - the scanner, only when it runs

    return diff_run.run(args, gpu)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard diff``; returns (name, handler)."""
    parser = commands.add_parser(
        "diff",
        help="what a candidate policy set would change on a snapshot or the cluster (what-if)",
        description="Audit a snapshot with the current policy set and with a candidate, and "
        "print per workload what changes: newly denied, newly warned, no longer denied, new or "
        "changed mutations (JSONPatch), with counts per policy and per team. Exit 1 when the "
        "candidate would deny a workload the current set admits. docs/commands/diff.md.")
    parser.set_defaults(idle_below="5")  # the audit's settings; idle GPUs are not compared
    source = parser.add_argument_group("what to compare over")
    source.add_argument("-f", "--filename", action="append", metavar="PATH",
                        help="snapshot: file, directory or - (kubectl get -A -o yaml|json "
                        "output, kind: List, multi-document YAML, .gz); repeatable")
    source.add_argument("--cluster", action="store_true",
                        help="the live cluster (read-only, listed once; kubeconfig or "
                        "in-cluster)")
    source.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (implies --cluster)")
    source.add_argument("--context", metavar="NAME",
                        help="kubeconfig context (implies --cluster)")
    add_namespace_flag(source)
    policy = parser.add_argument_group("the two policy sets")
    policy.add_argument("--policies", action="append", metavar="PATH",
                        help="the current set: policy file or directory (repeatable); default: "
                        "built-in library")
    policy.add_argument("--candidate", action="append", metavar="PATH", required=True,
                        help="the candidate set: policy file or directory (repeatable); a whole "
                        "set, not changes to --policies")
    policy.add_argument("--team-label", default=DEFAULT_TEAM_LABEL, metavar="KEY",
                        help=f"Namespace label naming the team (default {DEFAULT_TEAM_LABEL})")
    policy.add_argument("--jobs", type=int, metavar="N",
                        help="worker processes per policy set evaluating while the snapshot is "
                        "read (0: none; default: one per CPU this process may use; 0 on one CPU)")
    add_gpu_settings(parser)
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                        help="format printed on stdout (default table)")
    return "diff", run
