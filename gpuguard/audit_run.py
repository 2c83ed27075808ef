"""``gpuguard audit``'s run: compliance and GPU placement efficiency of what already runs (its
flags are :mod:`gpuguard.audit_command`, which imports this module only when the command runs: the
scanner, the renderers and the policy engine cost ~0.3 s of CPU that ``--help`` must not pay).

Reads a snapshot (``-f``: ``kubectl get … -A -o yaml|json`` output, directories, ``.gz``) or a live
cluster (``--cluster``, read-only), evaluates the policy set on every workload and analyses GPU
placement, then prints the report (``-o``), writes every format to ``--out DIR``, PolicyReports to
the cluster (``--write-reports``) and the run to ``--history FILE``.

Exit codes (:mod:`gpuguard.exit_codes`): 0 done; 1 a finding at or above ``--fail-on``; 2 bad input
or usage — and then nothing is reported (no output, no ``--out`` files, nothing written to the
cluster or the history): a broken or empty policy set or ``--quotas`` path, an unusable
``--metrics`` file or ``--prices`` table, an ``--inventory`` path that names no inventory, a ``-f``
path that names no object (missing, empty, or nothing in it readable), an unusable history file or
cluster configuration; 2 also when reports could not be written; 3 the API server cannot be reached
(the scan is incomplete; nothing reported). Within the inputs that name something, each unreadable
file, document or resource is one line on stderr, and the audit runs on the rest (the report counts
them in ``errors``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from audit.inventory.audit import InventoryAudit
from audit.prices import PriceTableError, read_price_table
from audit.render import html as render_html
from audit.render import markdown as render_markdown
from audit.render import terminal as render_terminal
from audit.report import cost as audit_cost
from audit.report import history as audit_history
from audit.report import policy_reports
from audit.report.assemble import assemble
from audit.scan.scanner import Scanner
from audit.scan.utilization import Metrics, MetricsError, read_metrics
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from gpuguard import policy_set
from gpuguard.audit_command import FAIL_LEVELS
from gpuguard.bundled_examples import CLUSTER_SNAPSHOT, shown
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from gpuguard.input_paths import PathCoverage, nothing_auditable
from gpuguard.namespace_scope import NamespaceScope, namespaces_of, refused_with
from gpuguard.output_formats import json_chunks, json_text, yaml_documents
from gpuguard.output_formats import write as write_document
from gpuguard.terminal import table_console
from policies.facts.resource_names import GPUSettings
from policies.policy.loader import GPUPOLICY_API, load_quotas, read_policy_files, unique_quotas
from policies.policy.quota import QUOTA_KIND
from policies.sources import Document, LoadError, Snapshot, printable


def _error(message: str) -> None:
    print(f"gpuguard: {printable(message)}", file=sys.stderr)


def _percent(text: str) -> float:
    value = float(text.rstrip("%"))
    if not 0 <= value <= 100:
        raise ValueError(text)
    return value / 100


def settings_from_args(args: argparse.Namespace, gpu: GPUSettings,
                       now: datetime.datetime) -> AuditSettings:
    """The frozen :class:`AuditSettings` of one run.

    Raises:
        ValueError: ``--idle-below`` or ``--jobs`` is out of range (the message names the flag).
    """
    try:
        idle = _percent(args.idle_below)
    except ValueError:
        raise ValueError(f"--idle-below {args.idle_below!r}: expected a percentage from 0 to "
                         "100, e.g. 5") from None
    # every CPU this process may run on (its affinity: a container's cpuset, a taskset), one
    # policy worker each; the reading process mostly decodes JSON while they evaluate
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    jobs = args.jobs if args.jobs is not None else (cpus if cpus > 1 else 0)
    if jobs < 0:
        raise ValueError(f"--jobs {args.jobs}: expected 0 or more")
    if not args.team_label.strip():
        raise ValueError("--team-label: expected a label key, e.g. gpuguard.io/team")
    return AuditSettings(gpu=gpu, team_label=args.team_label, idle_below=idle, now=now,
                         jobs=jobs)


def _progress_callbacks(stack: ExitStack, live: bool) -> tuple[Callable[[int], None] | None,
                                                                Callable[[str, int], None] | None]:
    """Progress on stderr, only when it is a terminal: objects read, and pages per resource."""
    if not sys.stderr.isatty():
        return None, None
    progress = stack.enter_context(Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True))
    task = progress.add_task("reading objects", total=None)

    def objects(count: int) -> None:
        progress.update(task, description=f"audited {count:,} objects")

    def pages(plural: str, count: int) -> None:
        progress.update(task, description=f"listing {plural}: {count:,}")

    return objects, (pages if live else None)


def connect_cluster(args: argparse.Namespace) -> tuple[Any, int]:
    """``(the cluster's ClusterConfig, EXIT_OK)`` from ``--kubeconfig`` / ``--context`` (else
    the default kubeconfig or in-cluster), or ``(None, EXIT_USAGE)`` after one line saying why
    the configuration is unusable. Shared with ``gpuguard diff``."""
    # The kubernetes client is imported only for live audits: it costs ~0.3 s to load.
    from kube.config import ClusterConfigError  # noqa: PLC0415
    from kube.connect import connect  # noqa: PLC0415

    try:
        return connect(args.kubeconfig, args.context), EXIT_OK
    except ClusterConfigError as exc:
        _error(f"error: {exc}")
        return None, EXIT_USAGE


def _publish(cluster: Any, report: dict[str, Any], failed: list[str]) -> int:
    """Write the report objects of a complete scan and delete gpuguard's reports of namespaces
    it no longer reports on; a partial scan publishes nothing (its missing namespaces would lose
    reports that are still true, and its present ones could be judged without their pods)."""
    from kube.policy_reports import ReportWriter  # noqa: PLC0415 - see connect_cluster

    if failed:
        _error(f"error: --write-reports: {len(failed)} resource(s) could not be listed "
               f"({', '.join(failed)}): the scan is partial, no PolicyReport written or deleted")
        return EXIT_ENVIRONMENT
    writer = ReportWriter(cluster.api_client)
    objects = policy_reports.build(report)
    status = EXIT_OK
    outcomes = writer.write_all(objects)
    if not any(outcome.action == "failed" for outcome in outcomes):
        outcomes += writer.prune(objects, name=policy_reports.REPORT_NAME,
                                 labels=policy_reports.LABELS)
    for outcome in outcomes:
        where = f"{outcome.namespace}/" if outcome.namespace else ""
        if outcome.action == "failed":
            _error(f"error: {outcome.kind} {where}{outcome.name}: {outcome.message}")
            status = EXIT_ENVIRONMENT
        else:
            print(f"gpuguard: {outcome.kind} {where}{outcome.name} {outcome.action}",
                  file=sys.stderr)
    return status


def cluster_items(cluster: Any, scan_state: Any,
                  page_progress: Callable[[str, int], None] | None,
                  notes: list[str]) -> Iterator[Document | LoadError]:
    """The objects of the live cluster; relists, throttling and missing CRDs go to ``notes``,
    the rest of the bookkeeping to ``scan_state`` (an :class:`audit.sources.cluster.ClusterScan`).
    Shared with ``gpuguard diff``.
    """
    from audit.sources.cluster import iter_cluster  # noqa: PLC0415 - see connect_cluster
    from kube.lists import Lister  # noqa: PLC0415 - see connect_cluster

    yield from iter_cluster(Lister(cluster.api_client), scan_state, progress=page_progress)
    notes.extend(scan_state.notes())
    if scan_state.not_served:
        notes.append("not served by this cluster (CRD not installed), skipped: "
                     + ", ".join(scan_state.not_served))


#: Reports listing more workloads than this are written as compact JSON, streamed in chunks
#: (indenting doubles the size; jq reformats either).
INDENT_UP_TO = 2000


def write_json(report: dict[str, Any], stream: TextIO) -> None:
    """The JSON report on ``stream``: indented when small, else compact and streamed
    (:func:`~gpuguard.output_formats.json_text`, :func:`~gpuguard.output_formats.json_chunks`)."""
    if len(report["workloads"]) + len(report["findings"]) <= INDENT_UP_TO:
        stream.write(json_text(report) + "\n")
        return
    for chunk in json_chunks(report):
        stream.write(chunk)
    stream.write("\n")


def _write_outputs(report: dict[str, Any], out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "report.json").open("w", encoding="utf-8") as handle:
        write_json(report, handle)
    files = {
        "report.md": render_markdown.render(report),
        "report.html": render_html.render(report),
        "policyreports.yaml": yaml_documents(policy_reports.build(report)),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [str(out / name) for name in ("report.json", *files)]


def _print(report: dict[str, Any], output: str) -> None:
    if output == "json":
        write_json(report, sys.stdout)
    elif output == "yaml":
        write_document(report, "yaml", sys.stdout)
    elif output == "markdown":
        sys.stdout.write(render_markdown.render(report) + "\n")
    elif output == "html":
        sys.stdout.write(render_html.render(report) + "\n")
    elif output == "policyreport":
        sys.stdout.write(yaml_documents(policy_reports.build(report)))
    elif output == "junit":
        from gpuguard.junit_report import audit_suites, junit_xml  # noqa: PLC0415 - -o junit only

        sys.stdout.write(junit_xml(audit_suites(report), "gpuguard audit"))
    elif output == "sarif":
        from gpuguard.cli import version  # noqa: PLC0415 - only for -o sarif
        from gpuguard.sarif_report import audit_entries, sarif_log  # noqa: PLC0415

        sys.stdout.write(sarif_log(audit_entries(report), version(), report.get("errors") or ()))
    else:
        console = table_console(180)
        render_terminal.render(report, console)


def _refuse(lines: list[str], what: str) -> int:
    """Print ``lines`` and why nothing was audited; the exit code for bad input."""
    for line in lines:
        _error(line)
    _error(f"error: {what}: nothing audited, no report written")
    return EXIT_USAGE


def _policy_problems(args: argparse.Namespace, loaded: policy_set.Loaded,
                     quotas: dict[str, Any]) -> list[str]:
    """Every error of the policy set and the ``--quotas`` paths (adding their quotas to
    ``quotas``); a path holding no GPUQuota is one."""
    problems = [f"policy error: {e}" for e in loaded.errors]
    if args.quotas:
        extra, quota_errors = load_quotas(args.quotas)
        extra = tuple(unique_quotas(extra, quota_errors, tuple(quotas.values())))
        problems += [f"policy error: {e}" for e in quota_errors]
        if not extra and not quota_errors:
            problems.append(f"policy error: --quotas {', '.join(map(printable, args.quotas))}: "
                            f"no {QUOTA_KIND} documents found (expected apiVersion: "
                            f"{GPUPOLICY_API}, kind: {QUOTA_KIND})")
        for quota in extra:
            quotas.setdefault(quota.name, quota)
    return problems


def _cluster_policy_set(args: argparse.Namespace, gpu: GPUSettings,
                        cluster: Any) -> policy_set.Loaded | int:
    """The ``--policies`` files merged with the cluster's GPUPolicy / GPUQuota /
    GPUPolicyException objects, listed once (:func:`kube.served_set.merge`, the rule
    ``gpuguard serve --cluster-policies`` serves by): an object with an error is refused with
    one line per error on stderr, and the audit judges by the rest. Returns the exit code
    instead when the objects cannot be listed (2: a CRD not installed, RBAC; 3: unreachable)."""
    from kube.lists import ListError, NotServed, Unreachable  # noqa: PLC0415 - see connect_cluster
    from kube.policy_objects import list_policy_objects  # noqa: PLC0415
    from kube.served_set import merge  # noqa: PLC0415

    try:
        objects = list_policy_objects(cluster.api_client)
    except Unreachable as exc:
        _error(f"error: --cluster-policies: the API server cannot be reached: {exc}")
        return EXIT_ENVIRONMENT
    except ListError as exc:
        hint = " (the gpuguard.io CRDs are not installed: kubectl apply --server-side -k " \
            "deploy/crds)" if isinstance(exc, NotServed) else ""
        _error(f"error: --cluster-policies: listing the gpuguard.io objects failed: {exc}{hint}")
        return EXIT_USAGE
    files = read_policy_files(args.policies) if args.policies else Snapshot((), ())
    result = merge(files, objects, {}, lambda snapshot: policy_set.load(snapshot, gpu))
    for line in result.object_errors():
        _error(f"policy object refused: {line}")
    built: policy_set.Loaded = result.built
    return built


def _open_history(path: str) -> audit_history.History:
    """The ``--history`` file; raises HistoryError naming the problem."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise audit_history.HistoryError(f"{path}: the directory {parent} does not exist "
                                         "(expected a file in an existing directory; it is "
                                         "created on the first run)")
    return audit_history.History(path)


def run(args: argparse.Namespace, gpu: GPUSettings) -> int:
    """Run one audit; see the module docstring for the exit codes."""
    live = bool(args.cluster or args.kubeconfig or args.context)
    if live and args.filename:
        _error("error: give either -f PATH (a snapshot) or --cluster, not both")
        return EXIT_USAGE
    if not live and not args.filename:
        _error(f"error: nothing to audit: give -f PATH (e.g. -f {shown(CLUSTER_SNAPSHOT)}, the "
               "bundled snapshot) or --cluster")
        return EXIT_USAGE
    if args.write_reports and not live:
        _error("error: --write-reports writes to the cluster: use it with --cluster")
        return EXIT_USAGE
    refused = refused_with(args)
    if refused is not None:
        return refused
    try:
        scope = NamespaceScope(namespaces) if (namespaces := namespaces_of(args.namespace)) \
            else None
    except ValueError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    if args.watch:
        unsupported = [flag for flag, given in (
            ("-o", args.output != "table"), ("--out", args.out), ("--history", args.history),
            ("--fail-on", args.fail_on), ("--inventory", args.inventory is not None))
            if given]
        if not live or unsupported:
            _error("error: --watch runs the audit controller on a live cluster: use it with "
                   "--cluster" + (f", without {', '.join(unsupported)}" if unsupported else ""))
            return EXIT_USAGE
    try:
        settings = settings_from_args(args, gpu, datetime.datetime.now(datetime.UTC))
    except ValueError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE

    if args.cluster_policies and not live:
        _error("error: --cluster-policies reads the cluster's policy objects: use it with "
               "--cluster")
        return EXIT_USAGE

    # Every input named on the command line is checked before anything is read or written: a
    # report from a broken or empty policy set would say "compliant" about everything.
    cluster = None
    if args.cluster_policies:
        cluster, code = connect_cluster(args)
        if cluster is None:
            return code
        found = _cluster_policy_set(args, gpu, cluster)
        if isinstance(found, int):
            return found
        loaded = found
    else:
        loaded = policy_set.load(args.policies, gpu)
    quotas = {q.name: q for q in loaded.engine.policies.quotas}
    problems = _policy_problems(args, loaded, quotas)
    if problems:
        return _refuse(problems, "the policy set is broken or empty (gpuguard lint PATH lists "
                       "every error)")
    if args.prices:
        try:
            settings = dataclasses.replace(settings, prices=read_price_table(args.prices))
        except PriceTableError as exc:
            return _refuse([f"error: --prices {exc}"], "the price table cannot be used")
    metrics: Metrics | None = None
    if args.metrics:
        try:
            metrics = read_metrics(args.metrics)
        except MetricsError as exc:
            return _refuse([f"error: --metrics {exc}"], "the metrics cannot be used")
    inventory = InventoryAudit(args.inventory, settings) if args.inventory is not None else None
    if inventory is not None and inventory.unusable:
        return _refuse([*inventory.errors, *inventory.unusable], "an --inventory path names "
                       "no inventory")

    if live and cluster is None:
        cluster, code = connect_cluster(args)
        if cluster is None:
            return code
    if args.watch:
        return _watch(args, settings, loaded, quotas, cluster, gpu)
    history = None
    if args.history:
        try:
            history = _open_history(args.history)
        except audit_history.HistoryError as exc:
            _error(f"error: --history {exc}")
            return EXIT_USAGE
    try:
        return _audit(args, settings, loaded, quotas, metrics, inventory, cluster, history, scope)
    finally:
        if history is not None:
            history.close()


def _watch(args: argparse.Namespace, settings: AuditSettings, loaded: policy_set.Loaded,
           quotas: dict[str, Any], cluster: Any, gpu: GPUSettings) -> int:
    """``--watch``: run the audit controller (:mod:`gpuguard.audit_watch`) until stopped."""
    from audit.watch.controller import WatchSettings  # noqa: PLC0415 - see connect_cluster
    from audit.watch.metrics import WatchMetrics  # noqa: PLC0415
    from gpuguard import audit_watch  # noqa: PLC0415
    from webhook import logs  # noqa: PLC0415

    try:
        host, _, port = args.metrics_listen.rpartition(":")
        lease = None
        if args.lease:
            namespace, _, name = args.lease.partition("/")
            if not namespace or not name:
                raise ValueError(f"--lease {args.lease!r}: expected NAMESPACE/NAME")
            lease = (namespace, name)
        pacing = WatchSettings(report_interval_s=args.report_interval_s,
                               full_every_s=args.full_every_s, writes_per_s=args.writes_per_s)
        if min(pacing.report_interval_s, pacing.full_every_s) < 0 or pacing.writes_per_s <= 0:
            raise ValueError("--report-interval-s, --full-every-s: expected 0 or more; "
                             "--writes-per-s: expected more than 0")
        config = audit_watch.WatchConfig(
            metrics_host=host.strip("[]") or "127.0.0.1", metrics_port=int(port), lease=lease,
            identity=args.lease_identity or audit_watch.default_identity(),
            lease_duration_s=args.lease_duration_s, policy_reload_s=args.policy_reload_s,
            write_reports=args.write_reports, pacing=pacing)
    except ValueError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    logs.configure("info")
    metrics = WatchMetrics()
    # GPUQuotas given with --quotas stay as given; those in the policy files reload with them.
    from_files = {q.name for q in loaded.engine.policies.quotas}
    extra = tuple(q for name, q in quotas.items() if name not in from_files)
    try:
        source = audit_watch.FilePolicySource(args.policies, gpu, metrics, extra,
                                              removal_quiet_s=args.policy_removal_quiet_s)
    except ValueError as exc:
        _error(f"error: the policy set did not load: {exc}")
        return EXIT_USAGE
    return audit_watch.run(config, settings, source, cluster.api_client,
                           utilization=_utilization_reader(args.metrics))


def _utilization_reader(path: str | None) -> Callable[[], Metrics | None] | None:
    """``--metrics`` in watch mode: the file read again at each full evaluation (an exporter
    scrape kept current by a sidecar or a CronJob); an unreadable one is logged, and idle GPUs
    are then unknown (absent from the metrics), never 0."""
    if path is None:
        return None

    def read() -> Metrics | None:
        try:
            return read_metrics(path)
        except MetricsError as exc:
            logging.getLogger("gpuguard.audit.watch").warning(
                "--metrics unusable; idle GPUs unknown this evaluation",
                extra={"fields": {"error": str(exc)}})
            return None

    return read


def _audit(args: argparse.Namespace, settings: AuditSettings, loaded: policy_set.Loaded,
           quotas: dict[str, Any], metrics: Metrics | None, inventory: InventoryAudit | None,
           cluster: Any, history: audit_history.History | None,
           scope: NamespaceScope | None = None) -> int:
    """Scan, then report — unless what was read is no ground for a report (``scope``: the
    namespaces ``-n`` limits it to)."""
    notes: list[str] = []
    scan_state: Any = None
    coverage = PathCoverage(args.filename or [])
    if cluster is not None:
        from audit.sources.cluster import ClusterScan  # noqa: PLC0415 - see connect_cluster

        scan_state = ClusterScan()
        source: dict[str, Any] = {"kind": "cluster", "cluster": cluster.source, "paths": []}
    else:
        source = {"kind": "files", "paths": list(args.filename)}
    source["metrics"] = args.metrics
    source["policies"] = list(args.policies or []) or "built-in library"
    if args.cluster_policies:
        source["policies"] = [*(args.policies or []), "the cluster's gpuguard.io objects"]
    if args.quotas:
        source["quotas"] = list(args.quotas)
    if scope is not None:
        source["namespaces"] = list(scope.namespaces)
    # The policy workers fork here, before the progress bar starts its thread.
    scanner = Scanner(settings, loaded.engine, metrics, quotas=quotas.values())
    try:
        with ExitStack() as stack:
            object_progress, page_progress = _progress_callbacks(stack, cluster is not None)
            scanner.progress = object_progress
            items = cluster_items(cluster, scan_state, page_progress, notes) \
                if cluster is not None else coverage.counted(iter_snapshot(args.filename))
            if scope is not None:
                items = scope.filtered(items)
            for item in items:
                scanner.feed(item)
                if inventory is not None:
                    inventory.feed(item)
    except BaseException:
        scanner.close()
        raise
    if scan_state is not None and scan_state.unreachable is not None:
        scanner.close()
        _error(f"error: {scan_state.unreachable}")
        _error("error: the API server cannot be reached: the scan is incomplete, no report "
               "written")
        return EXIT_ENVIRONMENT
    empty = coverage.nothing_named()
    unscoped = scope.nothing_found() if scope is not None and not empty else None
    if unscoped is not None:
        scanner.close()
        return _refuse([*scanner.errors, unscoped], "-n names no namespace of the input")
    if empty or scanner.objects == 0:
        scanner.close()
        why = "a path names no object" if empty else \
            "nothing could be read" if scanner.errors else "the cluster listed no object"
        return _refuse([*scanner.errors, *empty], why)
    result = scanner.finish(
        source, inventory.errors if inventory else [],
        inventory=inventory.section() if inventory is not None else None,
        warnings=[*(inventory.warnings() if inventory else []), *notes,
                  *([scope.note()] if scope is not None else [])])
    objects = scanner.objects
    # The scan result and then the report are each the whole hand-over: what the scanner kept
    # beyond its result (the per-pod table, owner links, per-node sums) is freed before the
    # report is built, and the result before the report is written (docs/benchmarks.md).
    del scanner
    report = assemble(result)
    del result
    counts = report["summary"]
    if not (counts["nodes"] or counts["pods"] or counts["finished_pods"] or counts["workloads"]
            or report["errors"]):
        # Objects were read, none of them one the audit reports on, and no error says why: a
        # report would be empty and look clean. (With input errors, the report carries them.)
        return _refuse([nothing_auditable(args.filename or [], objects,
                                          report["ignored"])],
                       "nothing in the input is auditable")
    for line in report["errors"]:
        _error(line)

    if history is not None:
        report["changes"] = audit_history.changes(report, history.latest())
        history.record(report)
        report["history"] = history.series()
        if settings.prices is not None and report["cost"] is not None:
            report["cost"]["window"] = audit_cost.window(settings.prices,
                                                         history.waste_series())

    _print(report, args.output)
    status = EXIT_OK
    if args.out:
        try:
            written = _write_outputs(report, Path(args.out))
            print("gpuguard: wrote " + ", ".join(written), file=sys.stderr)
        except OSError as exc:
            _error(f"error: --out {args.out}: {exc.strerror or exc}")
            status = EXIT_USAGE
    if args.write_reports and cluster is not None:
        status = max(status, _publish(cluster, report, scan_state.failed))

    summary = report["summary"]
    if summary["errors"] or summary["warnings"]:
        print(f"gpuguard: {summary['errors']} input error(s), {summary['warnings']} "
              "warning(s) (listed in the report)", file=sys.stderr)
    if status != EXIT_OK:
        return status
    if summary["errors"]:
        # Part of the input could not be read: the report (printed, listing each error) is
        # incomplete, so it can neither pass nor fail a gate as if it were whole.
        if scan_state is not None and scan_state.failed:
            return EXIT_ENVIRONMENT  # resources the cluster would not list (RBAC, the API)
        return EXIT_USAGE
    if args.fail_on and any(summary["findings"][level] for level in FAIL_LEVELS[args.fail_on]):
        return EXIT_FINDINGS
    return EXIT_OK
