"""``gpuguard audit``: its arguments — what ``gpuguard audit --help`` needs, and nothing heavier.

Owns the flags of ``gpuguard audit`` (what it reads, how it judges, what it produces, the watch
controller's pacing); the run is :mod:`gpuguard.audit_run`, imported only when the command runs
(the scanner, the renderers, the policy engine and the CEL runtime: ~0.3 s of start-up that
``--help`` must not pay; ``tests/cli/test_cli_startup.py`` pins the import set). Exit codes: see
:mod:`gpuguard.audit_run`. Must not import the scanner, the policy engine, rich or the kubernetes
client.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from audit.settings import DEFAULT_TEAM_LABEL
from gpuguard.namespace_scope import add_namespace_flag
from gpuguard.settings import add_gpu_settings
from policies.facts.resource_names import GPUSettings

OUTPUTS = ("table", "json", "yaml", "markdown", "html", "policyreport", "junit", "sarif")
#: ``--fail-on LEVEL`` -> the finding severities that fail the run (exit 1).
FAIL_LEVELS = {"deny": ("deny",), "warn": ("deny", "warn")}


def run(args: argparse.Namespace, gpu: GPUSettings) -> int:
    """Run ``gpuguard audit`` (:func:`gpuguard.audit_run.run`); returns the exit code."""
    from gpuguard import audit_run  # noqa: PLC0415 - the scanner, only when it runs

    return audit_run.run(args, gpu)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard audit``; returns (name, handler)."""
    parser = commands.add_parser(
        "audit", help="audit running workloads: policy compliance and GPU placement efficiency",
        description="Evaluate the policies on every workload of a snapshot or a live cluster "
        "and analyse GPU placement: allocation per node and team, free, fragmented and "
        "stranded GPUs, MIG use, pending GPU pods and, with DCGM metrics, idle GPUs. The JSON "
        "report is documented in docs/audit-report.md.")
    source = parser.add_argument_group("what to audit")
    source.add_argument("-f", "--filename", action="append", metavar="PATH",
                        help="snapshot: file, directory or - (kubectl get -A -o yaml|json "
                        "output, kind: List, multi-document YAML, .gz); repeatable")
    source.add_argument("--cluster", action="store_true",
                        help="audit the live cluster (read-only; kubeconfig or in-cluster)")
    source.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (implies --cluster)")
    source.add_argument("--context", metavar="NAME",
                        help="kubeconfig context (implies --cluster)")
    add_namespace_flag(source)
    source.add_argument("--metrics", metavar="FILE",
                        help="DCGM exporter metrics (Prometheus text) or a Prometheus query "
                        "result (JSON), for idle GPUs")
    source.add_argument("--inventory", action="append", nargs="?", const="", metavar="PATH",
                        help="GPU inventories from 'gpuguard inventory' (files, or Node objects "
                        "with the gpuguard.io/inventory annotation); without PATH, the "
                        "annotations of the audited Nodes. Joined with the allocations: "
                        "docs/inventory.md; repeatable")
    policy = parser.add_argument_group("how to judge")
    policy.add_argument("--policies", action="append", metavar="PATH",
                        help="policy file or directory (repeatable); default: built-in library")
    policy.add_argument("--cluster-policies", action="store_true",
                        help="with --cluster: also judge by the cluster's GPUPolicy, GPUQuota "
                        "and GPUPolicyException objects (merged with --policies, which then has "
                        "no built-in default; an object with an error is refused, as gpuguard "
                        "serve --cluster-policies does)")
    policy.add_argument("--quotas", action="append", metavar="PATH",
                        help="GPUQuota documents (file or directory, repeatable) to report usage "
                        "against; those in the --policies files are reported too")
    policy.add_argument("--team-label", default=DEFAULT_TEAM_LABEL, metavar="KEY",
                        help=f"Namespace label naming the team (default {DEFAULT_TEAM_LABEL})")
    policy.add_argument("--idle-below", default="5", metavar="PERCENT",
                        help="an allocated GPU with a lower mean utilization is idle "
                        "(default 5)")
    policy.add_argument("--prices", metavar="FILE",
                        help="GPUPriceTable (YAML): price idle and stranded GPUs per hour, and "
                        "with --history over the recorded runs (docs/audit-report.md); also "
                        "with --watch, for the cost metrics")
    policy.add_argument("--jobs", type=int, metavar="N",
                        help="worker processes evaluating policies while the snapshot is read "
                        "(0: none; default: one per CPU this process may use; 0 on one CPU)")
    add_gpu_settings(parser)
    output = parser.add_argument_group("what to produce")
    output.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                        help="format printed on stdout (default table; junit and sarif: the "
                        "findings for CI systems, as test -o junit and check -o sarif)")
    output.add_argument("--out", metavar="DIR",
                        help="also write report.json, report.md, report.html and "
                        "policyreports.yaml into DIR")
    output.add_argument("--write-reports", action="store_true",
                        help="create or update one PolicyReport per namespace and a "
                        "ClusterPolicyReport in the cluster")
    output.add_argument("--fail-on", choices=tuple(FAIL_LEVELS),
                        help="exit 1 when a finding is at least this severe (for CI)")
    output.add_argument("--history", metavar="FILE",
                        help="SQLite file: append this run and report changes since the last")
    watch = parser.add_argument_group(
        "continuous audit (--watch; docs/audit-controller.md)")
    watch.add_argument("--watch", action="store_true",
                       help="keep running: list once, then follow watches and keep the "
                       "PolicyReports (with --write-reports) and /metrics current")
    watch.add_argument("--metrics-listen", default="127.0.0.1:9464", metavar="HOST:PORT",
                       help="where /metrics listens (default 127.0.0.1:9464)")
    watch.add_argument("--lease", metavar="NAMESPACE/NAME",
                       help="coordination.k8s.io Lease: only its holder writes (one active "
                       "replica); default: no election")
    watch.add_argument("--lease-identity", metavar="NAME",
                       help="this replica's name in the Lease (default: the host name)")
    watch.add_argument("--lease-duration-s", type=int, default=15, metavar="S",
                       help="seconds a Lease not renewed stays its holder's (default 15)")
    watch.add_argument("--report-interval-s", type=float, default=5.0, metavar="S",
                       help="shortest time between two writes of one report (default 5)")
    watch.add_argument("--full-every-s", type=float, default=60.0, metavar="S",
                       help="shortest time between two full evaluations: cluster figures, "
                       "metrics, ClusterPolicyReport (default 60)")
    watch.add_argument("--writes-per-s", type=float, default=20.0, metavar="N",
                       help="report writes per second for all reports (default 20)")
    watch.add_argument("--policy-reload-s", type=float, default=5.0, metavar="S",
                       help="seconds between checks of the --policies files (default 5)")
    watch.add_argument("--policy-removal-quiet-s", type=float,
                       default=60.0, metavar="S",  # serve's default (a test keeps them equal)
                       help="seconds a change that removes content from a policy must hold "
                       "still before it is used, as in serve (default %(default)s)")
    return "audit", run
