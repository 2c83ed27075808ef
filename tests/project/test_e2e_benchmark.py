"""benchmarks/e2e.py's own arithmetic, without a control plane: gpuguard's handling time per
endpoint read from its decision log, and the percentiles of the table.

The benchmark itself needs etcd and kube-apiserver and runs for minutes (docs/benchmarks.md);
what is checked here is that the figures it prints from a run are read right: only the run's
own decision lines (from the offset the warm-up ended at), grouped by endpoint, other lines
(start-up, warnings, a torn last line) skipped.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.benchmark_scripts import load
from webhook.logs import JsonFormatter


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    return load("e2e")


def _decision(formatter: JsonFormatter, endpoint: str, latency_ms: float) -> str:
    # The fields webhook/app.py's decision line carries (AdmissionHandlers._log).
    return formatter.line(1_764_800_000.0, "info", "gpuguard.webhook.admission", "admission", {
        "endpoint": endpoint, "uid": "u", "decision": "allowed", "allowed": True,
        "latency_ms": latency_ms}) + "\n"


def test_handling_times_are_the_runs_own_decisions_by_endpoint(e2e, tmp_path):
    formatter = JsonFormatter()
    log = tmp_path / "serve.log"
    warm_up = [_decision(formatter, "validate", 99.0), _decision(formatter, "mutate", 98.0)]
    log.write_text(formatter.line(1_764_800_000.0, "info", "gpuguard", "serving", {}) + "\n"
                   + "".join(warm_up), encoding="utf-8")
    offset = log.stat().st_size
    run = [_decision(formatter, "validate", v) for v in (4.0, 5.0, 6.0, 30.0)] + \
        [_decision(formatter, "mutate", v) for v in (2.0, 3.0)]
    with log.open("a", encoding="utf-8") as handle:
        handle.write("".join(run))
        handle.write("not json\n")
        handle.write(formatter.line(1_764_800_001.0, "warning", "gpuguard", "slow", {}) + "\n")
        handle.write('{"endpoint": "validate", "latency_ms"')  # the last line, torn
    handled = e2e.handling_ms(log, offset)
    assert handled == {"validate": [4.0, 5.0, 6.0, 30.0], "mutate": [2.0, 3.0]}
    assert e2e.percentile(handled["validate"], 50) == 6.0  # nearest rank, as the table
    assert e2e.percentile(handled["validate"], 99) == 30.0
    assert e2e.percentile([], 50) == 0.0


def test_a_run_reports_throughput_and_latency_percentiles(e2e):
    run = e2e.Run(seconds=2.0, latencies=[5.0, 1.0, 3.0, 2.0], errors={})
    assert run.throughput == 2.0
    assert (run.percentile(50), run.percentile(99)) == (3.0, 5.0)
    assert run.handled == {}
