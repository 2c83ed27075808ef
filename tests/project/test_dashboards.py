"""The Grafana dashboard and the PrometheusRule alerts in deploy/components/monitoring/ query only
metrics gpuguard exports, and every controller metric is documented.

Each PromQL expression is tokenized (strings, label matchers, ranges and durations removed;
functions, aggregation and binary-operator keywords set apart): what is left are the series
names. They must all be exported — by the audit controller (:mod:`audit.watch.metrics`) or the
webhook (:mod:`webhook.metrics`), as sample names (a counter's ``_total``, a histogram's
``_bucket`` / ``_sum`` / ``_count``). A dashboard that queries a renamed metric shows nothing
and an alert on it never fires: this is where that is caught. The control-plane tier
(tests/controlplane/test_audit_watch.py) checks the same names in a real scrape.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from audit.watch.metrics import STATE_METRICS, WatchMetrics
from tests.paths import ROOT
from webhook.metrics import Metrics as WebhookMetrics

MONITORING = ROOT / "deploy" / "components" / "monitoring"
DOCS = ROOT / "docs" / "audit-controller.md"

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and",
    "or", "unless", "inf", "nan", "le",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Template variables of Grafana ($datasource) and alert annotations are not in expressions.


def metric_names(expression: str) -> set[str]:
    """The series names a PromQL expression reads."""
    text = _STRING.sub('""', expression)
    text = _RANGE.sub("", text)
    text = _MATCHERS.sub("", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation: sum(, rate(, histogram_quantile(
        if word.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+(\.\d+)?(e[+-]?\d+)?", word) or text[match.start() - 1:
                                                               match.start()].isdigit():
            continue
        names.add(word)
    return names


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return document


def _dashboard_expressions() -> list[str]:
    return [t["expr"] for panel in _dashboard()["panels"] for t in panel.get("targets", [])]


def _alerts() -> list[dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard_metric_names() -> set[str]:
    """Every series name the dashboard and the alerts query."""
    names: set[str] = set()
    for expression in [*_dashboard_expressions(), *(a["expr"] for a in _alerts())]:
        names |= metric_names(expression)
    return names


def _sample_names(registry: Any) -> set[str]:
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


def webhook_metric_names() -> set[str]:
    """The sample names the webhook exports."""
    return _sample_names(WebhookMetrics().registry)


def controller_metric_names() -> set[str]:
    """The sample names the audit controller exports."""
    return _sample_names(WatchMetrics().registry)


def test_the_tokenizer_finds_series_names_only() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, endpoint) (rate('
                        'gpuguard_admission_duration_seconds_bucket{endpoint="validate"}[5m])))'
                        ) == {"gpuguard_admission_duration_seconds_bucket"}
    assert metric_names('time() - max(a_b) > 900 or absent(c_d) and on(team) e') == {
        "a_b", "c_d", "e"}
    assert metric_names('x{decision=~"a|b"} / clamp_min(sum(y), 1e-9) > 0.01') == {"x", "y"}


def test_every_dashboard_and_alert_metric_is_exported() -> None:
    exported = webhook_metric_names() | controller_metric_names()
    wanted = dashboard_metric_names()
    assert len(wanted) >= 15
    assert sorted(wanted - exported) == []


def test_the_dashboard_reads_both_the_controller_and_the_webhook() -> None:
    wanted = dashboard_metric_names()
    assert wanted & controller_metric_names()
    assert wanted & webhook_metric_names()
    panels = _dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["targets"] for p in panels)


def test_the_dashboard_shows_the_cost_of_idle_and_stranded_gpus() -> None:
    """The cost series (``--prices``): each is read by a panel, with its currency label kept
    in the grouping (sums over two currencies would mean nothing)."""
    expressions = _dashboard_expressions()
    for name in ("gpuguard_idle_cost_per_hour", "gpuguard_stranded_cost_per_hour",
                 "gpuguard_unpriced_gpu_equivalents"):
        assert name in STATE_METRICS
        reading = [e for e in expressions if name in metric_names(e)]
        assert reading, f"no dashboard panel reads {name}"
        labels = STATE_METRICS[name][1]
        if "currency" in labels:
            assert all("currency" in e or e.startswith("topk(") for e in reading), reading


def test_the_alerts_the_issue_asks_for_are_there() -> None:
    alerts = {a["alert"]: a for a in _alerts()}
    reads = {name: metric_names(a["expr"]) for name, a in alerts.items()}
    assert "gpuguard_admission_requests_total" in reads["GpuguardWebhookErrors"]
    assert "gpuguard_admission_duration_seconds_bucket" in reads["GpuguardWebhookLatencyHigh"]
    assert "gpuguard_policies_loaded" in reads["GpuguardWebhookNotReady"]
    assert reads["GpuguardTeamIdleGpus"] == {"gpuguard_team_gpu_equivalents_idle"}
    assert reads["GpuguardQuotaNearLimit"] == {"gpuguard_quota_usage_ratio"}
    assert reads["GpuguardStrandedGpus"] == {"gpuguard_node_gpu_equivalents_stranded"}
    assert all(a.get("for") and a["labels"].get("severity") for a in alerts.values())


def test_every_controller_metric_is_documented() -> None:
    text = DOCS.read_text()
    families = {f.name for f in WatchMetrics().registry.collect()}
    assert set(STATE_METRICS) <= families
    for name in families:
        shown = next((n for n in (f"{name}_total", name) if f"`{n}" in text), None)
        assert shown is not None, f"{name} is not in docs/audit-controller.md"
