"""The audit's hand-over: the scan returns one typed ScanResult and the report is built from it
alone (issue 12 item 7: no reaching into the scanner, no side channels)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import pickle

import pytest

from audit.report.assemble import assemble
from audit.scan.result import ScanResult
from audit.scan.scanner import scan
from audit.scan.utilization import read_metrics
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from gpuguard import policy_set
from gpuguard.cli import main
from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.policy.loader import load_quotas

EXAMPLE = "examples/cluster"
METRICS = "examples/cluster/metrics/dcgm-exporter.prom"
QUOTAS = "tests/data/quota/example-cluster-quotas.yaml"
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def result() -> ScanResult:
    """The bundled example with metrics and quotas, scanned as ``gpuguard audit`` does."""
    quotas, errors = load_quotas([QUOTAS])
    assert not errors
    source = {"kind": "files", "paths": [EXAMPLE], "metrics": METRICS,
              "policies": "built-in library", "quotas": [QUOTAS]}
    return scan(iter_snapshot([EXAMPLE]), AuditSettings(now=NOW),
                policy_set.load(None, DEFAULT_SETTINGS).engine, metrics=read_metrics(METRICS),
                source=source, quotas=quotas)


def test_the_cli_report_is_the_assembled_scan_result(result: ScanResult) -> None:
    """Everything the CLI reports (warnings, errors, their counts, inventory) comes through the
    scan result: nothing is patched into the report after it is assembled."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["audit", "-f", EXAMPLE, "--metrics", METRICS, "--quotas", QUOTAS,
                     "-o", "json", "--jobs", "0"])
    assert code == 0
    cli = json.loads(out.getvalue())
    generated = datetime.datetime.fromisoformat(cli["generated"])  # the CLI's own clock
    expected = assemble(dataclasses.replace(result, generated=generated))
    assert cli == json.loads(json.dumps(expected))
    # the figures a reader looks at first, so that the equality above is not of two empties
    assert cli["summary"]["gpu_pods"]["running"] > 0
    assert cli["summary"]["quotas"]["over"] == ["vision"]
    assert cli["utilization"]["idle_allocated_gpu_equivalents"] is not None


def test_warnings_and_errors_from_outside_the_scan_are_counted_with_the_scans() -> None:
    """``--inventory``'s warning comes after the scan's own (a pod on a node missing from the
    snapshot) and the summary counts both, as it counts the scan's input errors."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["audit", "-f", "tests/data/edge", "--inventory", "-o", "json", "--jobs", "0"])
    report = json.loads(out.getvalue())
    # (tests/data/edge holds two edge-case files that each define a Node n1: named, not silent)
    assert [w.split(" ", 4)[:4] for w in report["warnings"]] == [
        ["1", "GPU", "pod(s)", "run"], ["1", "Node(s)", "appeared", "more"],
        ["--inventory:", "no", "audited", "Node"]]
    assert report["summary"]["warnings"] == 3
    assert report["summary"]["errors"] == len(report["errors"]) > 0
    assert report["inventory"] == {"nodes": [], "sources": {"files": 0, "annotations": 0},
                                   "gpus": {}, "findings": [], "counts": {}}


def test_the_report_needs_nothing_but_the_scan_result(result: ScanResult) -> None:
    """A stored (pickled) scan result gives the same report: it holds values, no live scanner,
    no callables, no state that assembling consumes."""
    report = assemble(result)
    assert assemble(pickle.loads(pickle.dumps(result))) == report
    assert assemble(result) == report
    assert report["generated"] == NOW.isoformat()
    assert report["inventory"] is None  # no --inventory: the section is there, empty
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.objects = 0  # type: ignore[misc]


def test_placement_totals_are_the_sum_of_the_node_entries(result: ScanResult) -> None:
    """The cluster and fragmentation figures are computed from what each node entry reports
    (the values placement used to pass through its ``_figures`` side channel)."""
    placement = result.placement
    nodes = placement.nodes
    totals = placement.cluster["gpu_equivalents"]
    known = [n for n in nodes if n["gpu_equivalents"]["allocatable"] is not None]
    assert totals["allocatable"] == pytest.approx(
        sum(n["gpu_equivalents"]["allocatable"] for n in known), abs=1e-5)
    assert totals["allocated"] == pytest.approx(
        sum(n["gpu_equivalents"]["allocated"] for n in nodes), abs=1e-5)
    assert totals["free"] + totals["stranded"] == pytest.approx(
        sum(n["gpu_equivalents"]["free"] for n in known), abs=1e-5)
    assert totals["nodes_unknown"] == [n["name"] for n in nodes if n not in known]
    usable_free = [n["gpu_equivalents"]["free"] for n in known if n["usable"]]
    assert placement.fragmentation["gpu_equivalents"]["largest_free_on_one_node"] == \
        pytest.approx(max(usable_free, default=0.0), abs=1e-6)
