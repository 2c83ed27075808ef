"""Cost of idle and stranded GPUs (``--prices``): the price table, this run's rate per team,
namespace and GPU product, GPU-hours and money over the history window, and the metrics.

The figures are those of the bundled example cluster with its DCGM scrape
(examples/cluster/metrics/dcgm-exporter.prom) and tests/data/audit/prices.yaml (H100-80GB-HBM3
4.00 and A100-SXM4-40GB 2.10 USD per GPU-hour, 1.50 per GPU-equivalent-hour for the rest):

- idle: llm 1 H100 (mistral-7b, 3 % busy) = 4.00/h; research 2 H100-equivalents = 8.00/h; vision
  1 A100-SXM4-80GB (default 1.50) + a 1/7 MIG slice of an A100-PCIE-40GB (1.50 / 7) = 1.7143/h;
- stranded: 10 A100-SXM4-40GB (a tainted node's 4, a CPU-exhausted node's 6) = 21.00/h and 16
  A100-SXM4-80GB (a cordoned and a NotReady node) at the default = 24.00/h.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
from pathlib import Path
from typing import Any

import pytest

from audit.prices import PriceTableError, read_price_table
from audit.report import cost
from audit.report.history import History
from audit.report.tables import tables
from audit.watch.metrics import state_samples
from gpuguard.cli import main
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
PRICES = ROOT / "tests" / "data" / "audit" / "prices.yaml"


def audit(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", "-f", str(EXAMPLE), *args, "-o", "json", "--jobs", "0"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def priced() -> dict[str, Any]:
    return audit("--metrics", str(METRICS), "--prices", str(PRICES))


@pytest.fixture(scope="module")
def llm_busy(tmp_path_factory) -> Path:
    """The same scrape with mistral-7b's H100 busy (90 %): team llm has no idle GPU."""
    text = METRICS.read_text()
    lines = []
    for line in text.splitlines():
        if 'pod="mistral-7b-' in line and line.startswith(("DCGM_FI_DEV_GPU_UTIL",
                                                            "DCGM_FI_PROF_GR_ENGINE_ACTIVE")):
            name, _, _ = line.rpartition(" ")
            line = f"{name} {'90' if line.startswith('DCGM_FI_DEV') else '0.9'}"
        lines.append(line)
    path = tmp_path_factory.mktemp("metrics") / "llm-busy.prom"
    path.write_text("\n".join(lines) + "\n")
    return path


def by(rows: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {row[key]: row for row in rows}


def test_the_table_prices_a_product_its_mig_and_shared_labels_and_the_rest_by_default():
    table = read_price_table(str(PRICES))
    assert table.currency == "USD" and table.name == "example-on-demand"
    for label in ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                  "NVIDIA-A100-SXM4-40GB-SHARED"):
        price = table.price(label)
        assert price is not None
        assert (price.per_gpu_equivalent_hour, price.by) == (2.1, "NVIDIA-A100-SXM4-40GB")
    default = table.price("NVIDIA-L4")
    assert default is not None and (default.per_gpu_equivalent_hour, default.by) == (1.5,
                                                                                     "default")
    unknown = table.price(None)
    assert unknown is not None and unknown.by == "default"


def test_this_runs_idle_and_stranded_gpus_cost_per_team_namespace_and_product(priced):
    rate = priced["cost"]["rate"]
    assert priced["cost"]["currency"] == "USD"
    teams = by(rate["teams"], "team")
    assert {t: (v["idle_gpu_equivalents"], v["idle_cost_per_hour"]) for t, v in teams.items()} \
        == {"llm": (1.0, 4.0), "research": (2.0, 8.0), "vision": (1.142857, 1.7143)}
    namespaces = by(rate["namespaces"], "namespace")
    assert namespaces["team-vision"]["team"] == "vision"
    assert namespaces["team-vision"]["idle_cost_per_hour"] == 1.7143
    # the idle GPU-equivalents are the utilization section's, split the same way
    assert rate["idle"] == {"gpu_equivalents": 4.142857, "cost_per_hour": 13.7143,
                            "unpriced_gpu_equivalents": 0.0}
    assert rate["idle"]["gpu_equivalents"] == \
        priced["summary"]["gpu_equivalents"]["idle_allocated"]
    assert rate["stranded"]["gpu_equivalents"] == priced["summary"]["gpu_equivalents"][
        "stranded"] == 26.0
    assert rate["stranded"]["cost_per_hour"] == 45.0
    products = by(rate["products"], "product")
    assert products["NVIDIA-A100-SXM4-40GB"]["stranded_cost_per_hour"] == 21.0
    assert products["NVIDIA-A100-SXM4-80GB"]["priced_by"] == "default"
    assert products["NVIDIA-A100-SXM4-80GB"]["stranded_cost_per_hour"] == 24.0
    assert products["NVIDIA-A100-SXM4-80GB"]["idle_cost_per_hour"] == 1.5
    assert rate["unpriced"] == []
    assert priced["cost"]["window"] is None  # no --history


def test_gpus_of_a_model_the_table_does_not_price_are_unpriced_not_free(tmp_path):
    table = tmp_path / "h100-only.yaml"
    table.write_text("apiVersion: gpuguard.io/v1alpha1\nkind: GPUPriceTable\nspec:\n"
                     "  currency: EUR\n  models:\n  - {product: NVIDIA-H100-80GB-HBM3, "
                     "perGpuHour: 3.5}\n")
    report = audit("--metrics", str(METRICS), "--prices", str(table))
    rate = report["cost"]["rate"]
    teams = by(rate["teams"], "team")
    assert teams["llm"]["idle_cost_per_hour"] == 3.5
    # vision's idle GPUs are all A100s: no price, so no money (not 0) and all unpriced
    assert teams["vision"]["idle_cost_per_hour"] is None
    assert teams["vision"]["unpriced_gpu_equivalents"] == 1.142857
    assert rate["stranded"]["cost_per_hour"] is None
    assert rate["stranded"]["unpriced_gpu_equivalents"] == 26.0
    assert by(rate["unpriced"], "product") == {
        "A100-PCIE-40GB": {"product": "A100-PCIE-40GB", "idle_gpu_equivalents": 0.142857,
                           "stranded_gpu_equivalents": 0.0},
        "NVIDIA-A100-SXM4-40GB": {"product": "NVIDIA-A100-SXM4-40GB",
                                  "idle_gpu_equivalents": 0.0,
                                  "stranded_gpu_equivalents": 10.0},
        "NVIDIA-A100-SXM4-80GB": {"product": "NVIDIA-A100-SXM4-80GB",
                                  "idle_gpu_equivalents": 1.0,
                                  "stranded_gpu_equivalents": 16.0}}
    samples = state_samples(report, 0.0)
    idle = dict(samples["gpuguard_idle_cost_per_hour"])
    assert idle == {("llm", "team-llm", "EUR"): 3.5, ("research", "team-research", "EUR"): 7.0}
    unpriced = dict(samples["gpuguard_unpriced_gpu_equivalents"])
    assert unpriced[("stranded", "NVIDIA-A100-SXM4-80GB")] == 16.0
    assert unpriced[("idle", "A100-PCIE-40GB")] == 0.142857
    assert "gpuguard_stranded_cost_per_hour" not in samples
    (cost_table,) = [t for t in tables(report) if t.key == "cost"]
    assert ("idle", "vision", "team-vision", "1.14", "unpriced") in cost_table.rows
    assert "Not in the table: A100-PCIE-40GB (0.14 GPU-eq)" in cost_table.note


def test_three_runs_give_exact_gpu_hours_and_cost_over_the_window(priced, llm_busy, tmp_path):
    """Runs at 10:00 (llm idle), 11:00 (llm busy) and 13:00 (llm idle again): between two runs
    the figures move linearly (trapezoid). llm: (1 + 0) / 2 * 1 h + (0 + 1) / 2 * 2 h = 1.5
    GPU-hours at 4.00 = 6.00; research 2 * 3 h = 6 GPU-hours = 24.00; vision 1.142857 * 3 h =
    3.428571 GPU-hours = 3 * 1.714286 = 5.1429; stranded 26 * 3 h = 78 GPU-hours = 135.00."""
    busy = audit("--metrics", str(llm_busy), "--prices", str(PRICES))
    assert by(busy["cost"]["rate"]["teams"], "team").keys() == {"research", "vision"}
    history = History(str(tmp_path / "history.sqlite"))
    for report, at in ((priced, "2026-12-01T10:00:00+00:00"), (busy, "2026-12-01T11:00:00+00:00"),
                       (priced, "2026-12-01T13:00:00+00:00")):
        history.record({**report, "generated": at})
    table = read_price_table(str(PRICES))
    window = cost.window(table, history.waste_series())
    history.close()
    assert window is not None
    assert (window["start"], window["end"], window["runs"], window["hours"]) == (
        "2026-12-01T10:00:00+00:00", "2026-12-01T13:00:00+00:00", 3, 3.0)
    teams = by(window["teams"], "team")
    assert {t: (v["idle_gpu_hours"], v["idle_cost"]) for t, v in teams.items()} == {
        "llm": (1.5, 6.0), "research": (6.0, 24.0), "vision": (3.428571, 5.1429)}
    assert by(window["namespaces"], "namespace")["team-llm"]["idle_gpu_hours"] == 1.5
    assert window["idle"] == {"hours_covered": 3.0, "gpu_hours": 10.928571, "cost": 35.1429,
                              "unpriced_gpu_hours": 0.0}
    assert window["stranded"] == {"hours_covered": 3.0, "gpu_hours": 78.0, "cost": 135.0,
                                  "unpriced_gpu_hours": 0.0}
    products = by(window["products"], "product")
    assert products["NVIDIA-H100-80GB-HBM3"]["idle_gpu_hours"] == 7.5  # llm 1.5 + research 6
    assert products["NVIDIA-H100-80GB-HBM3"]["idle_cost"] == 30.0
    assert [p["idle_cost_per_hour"] for p in window["series"]] == [13.7143, 9.7143, 13.7143]
    assert [p["stranded_cost_per_hour"] for p in window["series"]] == [45.0, 45.0, 45.0]


def test_a_run_without_metrics_leaves_its_intervals_out_of_the_idle_figures(priced, tmp_path):
    unmetered = audit("--prices", str(PRICES))
    assert unmetered["cost"]["rate"]["idle"] is None  # unknown, not 0
    history = History(str(tmp_path / "history.sqlite"))
    for report, at in ((priced, "2026-12-01T10:00:00+00:00"),
                       (unmetered, "2026-12-01T11:00:00+00:00"),
                       (priced, "2026-12-01T12:00:00+00:00"),
                       (priced, "2026-12-01T14:00:00+00:00")):
        history.record({**report, "generated": at})
    window = cost.window(read_price_table(str(PRICES)), history.waste_series())
    history.close()
    assert window is not None and window["hours"] == 4.0
    # idle known only from 12:00 to 14:00: 4.142857 GPU-eq * 2 h
    assert window["idle"]["hours_covered"] == 2.0
    assert window["idle"]["gpu_hours"] == 8.285714
    assert window["stranded"]["hours_covered"] == 4.0  # stranded GPUs need no metrics
    assert window["stranded"]["gpu_hours"] == 104.0
    assert window["series"][1]["idle_cost_per_hour"] is None


def test_audit_with_history_and_prices_reports_the_window_in_every_format(tmp_path):
    history = str(tmp_path / "history.sqlite")
    first = audit("--metrics", str(METRICS), "--prices", str(PRICES), "--history", history)
    window = first["cost"]["window"]
    assert (window["runs"], window["hours"], window["idle"]["gpu_hours"]) == (1, 0.0, 0.0)
    second = audit("--metrics", str(METRICS), "--prices", str(PRICES), "--history", history)
    window = second["cost"]["window"]
    assert window["runs"] == 2 and window["start"] == first["generated"]
    # the same figures at both ends: GPU-hours are the figure times the hours between the runs
    hours = (datetime.datetime.fromisoformat(second["generated"])
             - datetime.datetime.fromisoformat(first["generated"])).total_seconds() / 3600
    assert window["idle"]["gpu_hours"] == pytest.approx(4.142857 * hours, abs=1e-6)
    assert window["stranded"]["gpu_hours"] == pytest.approx(26 * hours, abs=1e-6)
    keys = [t.key for t in tables(second)]
    assert keys[keys.index("cost"):keys.index("cost") + 2] == ["cost", "cost-window"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", "-f", str(EXAMPLE), "--metrics", str(METRICS), "--prices",
                     str(PRICES), "--jobs", "0", "-o", "markdown"]) == 0
    markdown = out.getvalue()
    assert "## Idle and stranded GPUs: cost per hour" in markdown
    assert "| idle | research | team-research | 2 | USD 8.00 |" in markdown
    assert "| stranded | - | NVIDIA-A100-SXM4-40GB | 10 | USD 21.00 |" in markdown


_HEAD = "apiVersion: gpuguard.io/v1alpha1\nkind: GPUPriceTable\n"


@pytest.mark.parametrize(("text", "problem"), [
    ("apiVersion: gpuguard.io/v1\nkind: GPUPriceTable\nspec: {currency: USD}\n",
     "apiVersion: expected gpuguard.io/v1alpha1, got the string 'gpuguard.io/v1'"),
    ("apiVersion: gpuguard.io/v1alpha1\nkind: GPUQuota\nspec: {}\n",
     "kind: expected GPUPriceTable, got the string 'GPUQuota'"),
    (_HEAD + "spec: {currency: usd, perGpuEquivalentHour: 1}\n",
     "spec.currency: expected an ISO 4217 code such as USD or EUR, got the string "
     "'usd'"),
    (_HEAD + "spec: {currency: USD, perGpuEquivalentHour: -1}\n",
     "spec.perGpuEquivalentHour: expected a number ≥ 0 and below 1,000,000 (USD per "
     "GPU-equivalent-hour), got the number -1"),
    (_HEAD + "spec: {currency: USD, perGpuEquivalentHour: '2.5'}\n",
     "spec.perGpuEquivalentHour: expected a number ≥ 0 and below 1,000,000 (USD per "
     "GPU-equivalent-hour), got the string '2.5'"),
    (_HEAD + "spec: {currency: USD, perGpuEquivalentHour: true}\n",
     "spec.perGpuEquivalentHour: expected a number"),
    (_HEAD + "spec: {currency: USD, perGpuHour: 2}\n",
     "spec.perGpuHour: unknown field (expected currency, models, perGpuEquivalentHour)"),
    (_HEAD + "spec:\n  currency: USD\n  models:\n  - {product: NVIDIA-L4, perGPUHour: 1}\n",
     "spec.models[0].perGPUHour: unknown field (expected perGpuHour, product)"),
    (_HEAD + "spec:\n  currency: USD\n  models:\n  - {product: NVIDIA-L4}\n",
     "spec.models[0].perGpuHour: missing"),
    (_HEAD + "spec:\n  currency: USD\n  models:\n  - {product: '', perGpuHour: 1}\n",
     "spec.models[0].product: expected an nvidia.com/gpu.product value"),
    (_HEAD + "spec:\n  currency: USD\n  models:\n  - {product: NVIDIA-H100-80GB-HBM3, "
     "perGpuHour: 4}\n  - {product: NVIDIA-H100-80GB-HBM3-SHARED, perGpuHour: 1}\n",
     "spec.models[1].product: 'NVIDIA-H100-80GB-HBM3-SHARED' is priced twice (also "
     "spec.models[0])"),
    (_HEAD + "spec:\n  currency: USD\n  models: {NVIDIA-L4: 1}\n",
     "spec.models: expected a list, got a map"),
    (_HEAD + "spec: {currency: USD}\n", "spec: prices nothing"),
    (_HEAD + "spec: [currency]\n", "spec: expected a mapping, got a list"),
    (_HEAD + "spec: {currency: USD\n", "line 3: "),
    (_HEAD + "spec: {currency: USD, currency: EUR}\n", "currency"),
    # A fresh-context trial's finds: the first line was "line 0", a negative zero was a price,
    # and a null one was "got NoneType".
    ("apiVersion: gpuguard.io/v1alpha1\napiVersion: gpuguard.io/v1alpha1\n",
     "line 2: duplicate key 'apiVersion' (first at line 1)"),
    (_HEAD + "spec:\n  currency: USD\n  perGpuEquivalentHour: 2\n  perGpuEquivalentHour: 3\n",
     "line 6: duplicate key 'perGpuEquivalentHour' (first at line 5)"),
    (_HEAD + "spec: {currency: USD, perGpuEquivalentHour: -0.0}\n",
     "spec.perGpuEquivalentHour: expected a number ≥ 0 and below 1,000,000 (USD per "
     "GPU-equivalent-hour), got the number -0.0"),
    (_HEAD + "spec: {currency: EUR, perGpuEquivalentHour: null}\n",
     "spec.perGpuEquivalentHour: expected a number ≥ 0 and below 1,000,000 (EUR per "
     "GPU-equivalent-hour), got null"),
    (_HEAD + "spec:\n  currency: USD\n  models:\n  - {product: NVIDIA-L4, perGpuHour: null}\n",
     "spec.models[0].perGpuHour: expected a number ≥ 0 and below 1,000,000 (USD per GPU-hour), "
     "got null"),
    (_HEAD + "spec: null\n", "spec: expected a mapping, got null"),
    ("", "empty (expected apiVersion: gpuguard.io/v1alpha1, kind: GPUPriceTable)"),
])
def test_a_bad_price_table_is_refused_naming_the_file_and_field(tmp_path, capsys, text,
                                                                problem):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceTableError) as raised:
        read_price_table(str(path))
    assert str(raised.value).startswith(f"{path}: ")
    assert problem in str(raised.value)
    code = main(["audit", "-f", str(EXAMPLE), "--prices", str(path), "--jobs", "0", "-o",
                 "json"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""  # nothing reported
    assert f"--prices {path}: " in captured.err and "Traceback" not in captured.err
    assert "the price table cannot be used: nothing audited" in captured.err


def test_a_missing_price_table_is_bad_input(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["audit", "-f", str(EXAMPLE), "--prices", str(missing), "--jobs", "0"]) == 2
    assert f"--prices {missing}: cannot be read: No such file or directory" in \
        capsys.readouterr().err


def test_the_watch_controller_prices_its_full_evaluation_like_the_batch_audit(priced):
    """The example cluster fed as lists to the controller with the price table in its
    settings: the cost section and the cost metrics are the batch audit's."""
    from audit.scan.utilization import read_metrics
    from audit.settings import AuditSettings
    from audit.sources.files import iter_snapshot
    from audit.watch.controller import PolicyUpdate, WatchController
    from gpuguard import policy_set
    from policies.facts.resource_names import DEFAULT_SETTINGS
    from policies.sources import Document
    from tests.audit.test_audit_watch import Clock, RecordingSink

    loaded = policy_set.load(None, DEFAULT_SETTINGS)
    update = PolicyUpdate(loaded.engine, tuple(loaded.engine.policies.quotas),
                          loaded.engine.policies.digest)
    by_kind: dict[tuple[str, str], list[Any]] = {}
    for document in iter_snapshot([str(EXAMPLE)]):
        if isinstance(document, Document):
            obj = document.body
            by_kind.setdefault((str(obj.get("apiVersion", "")).rpartition("/")[0],
                                obj["kind"]), []).append(obj)
    wall = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
    seen: list[Any] = []
    settings = AuditSettings(now=wall, prices=read_price_table(str(PRICES)))
    ctl = WatchController(settings, update, RecordingSink(), list(by_kind), clock=Clock(),
                          wall=lambda: wall, on_full=seen.append,
                          utilization=lambda: read_metrics(str(METRICS)))
    for (group, kind), items in by_kind.items():
        ctl.listed(group, kind, items)
    ctl.step()
    assert seen[0]["cost"]["rate"] == priced["cost"]["rate"]
    samples = state_samples(seen[0], 1.0)
    assert dict(samples["gpuguard_idle_cost_per_hour"]) == {
        ("llm", "team-llm", "USD"): 4.0, ("research", "team-research", "USD"): 8.0,
        ("vision", "team-vision", "USD"): 1.7143}
    assert dict(samples["gpuguard_stranded_cost_per_hour"]) == {
        ("NVIDIA-A100-SXM4-40GB", "USD"): 21.0, ("NVIDIA-A100-SXM4-80GB", "USD"): 24.0}


def test_the_watch_controller_refuses_a_bad_price_table_before_it_connects(tmp_path, capsys):
    bad = tmp_path / "prices.yaml"
    bad.write_text(_HEAD + "spec: {currency: USD, perGpuEquivalentHour: 1.5, model: []}\n")
    assert main(["audit", "--cluster", "--watch", "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--prices {bad}: spec.model: unknown field" in err
