"""The audit report as one self-contained HTML page: inline CSS and SVG charts, no script.

Owns the page layout: a summary (with ``--prices``, what idle and stranded GPUs cost per hour),
the charts of :mod:`audit.render.svg_charts` (allocation per node
and per team, fragmentation, findings by policy, mutations apart) and the tables of
:mod:`audit.report.tables`; sections with nothing to show are named in one line instead of standing
empty. The page reads at 700 px (charts scale, wide tables scroll inside their own box, long words
wrap) and has a print stylesheet (no shadows or scrolling boxes, charts and rows not split across
pages). It loads nothing — no stylesheet, font, script or image from anywhere — so it opens
offline and can be mailed or attached to a CI run; tests/audit/test_report_html.py renders it in
headless Chromium. All input-derived text is HTML-escaped. Must not compute figures.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from audit.render import svg_charts
from audit.report.tables import IN_SERVICE, UNAVAILABLE, TextTable, moment, money, number, tables

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1200px;padding:0 16px;color:#1d2430;background:#fff;overflow-wrap:break-word}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea}
.meta{color:#5b6675;margin-bottom:16px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#5b6675;font-size:12px}
.card.bad b{color:#c9302c}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;width:100%;margin:6px 0 4px;font-size:13px}
th,td{border:1px solid #e3e8ee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f6f9}tr:nth-child(even) td{background:#fafbfc}
.note{color:#5b6675;font-size:12px;margin:2px 0 8px}
.charts{display:flex;flex-wrap:wrap;gap:18px}
.chart{max-width:100%;height:auto;border:1px solid #eef1f4;border-radius:6px;padding:6px}
.c-title{font-weight:600;font-size:14px;fill:#1d2430}.c-note{font-size:11px;fill:#5b6675}
.c-label{font-size:12px;fill:#1d2430}.c-value{font-size:11px;fill:#1d2430}
.c-axis{stroke:#9aa5b1;stroke-width:1}
.s-allocated{fill:#3b6fd8}.s-free{fill:#4caf7d}.s-stranded{fill:#d9534f}.s-pending{fill:#f0ad4e}
.s-unavailable{fill:#9aa5b1}
.s-idle{fill:#9db7ea}.s-deny{fill:#c9302c}.s-warn{fill:#ec971f}.s-audit{fill:#5bc0de}
.s-error{fill:#7d3c98}.s-info{fill:#b8c2cc}
.chart polyline.line{fill:none;stroke-width:2}.chart polyline.s-allocated{stroke:#3b6fd8}
.chart polyline.s-free{stroke:#4caf7d}.chart polyline.s-idle{stroke:#9db7ea}
.chart polyline.s-stranded{stroke:#d9534f}
.chart polyline.s-deny{stroke:#c9302c}.chart polyline.s-warn{stroke:#ec971f}
.chart polyline.s-audit{stroke:#5bc0de}.chart polyline.s-error{stroke:#7d3c98}
.sev-deny{color:#c9302c;font-weight:600}.sev-warn{color:#b36b00;font-weight:600}
@page{margin:12mm}
@media print{
body{margin:0;max-width:none;padding:0;font-size:11px}
h2{break-after:avoid}.chart{border:none;break-inside:avoid}
.card{break-inside:avoid}.scroll{overflow:visible}
table{font-size:10px}tr{break-inside:avoid}
tr:nth-child(even) td,th{background:none}
}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _table(section: TextTable) -> str:
    parts = [f'<section id="{_e(section.key)}"><h2>{_e(section.title)}</h2>']
    if section.note:
        parts.append(f'<p class="note">{_e(section.note)}</p>')
    parts.append('<div class="scroll"><table>')
    if section.key != "summary":
        parts.append("<tr>" + "".join(f"<th>{_e(c)}</th>" for c in section.columns) + "</tr>")
    for row in section.rows:
        cells = []
        for index, cell in enumerate(row):
            css = f' class="sev-{_e(cell)}"' if section.key == "findings" and index == 0 else ""
            tag = "th" if section.key == "summary" and index == 0 else "td"
            cells.append(f"<{tag}{css}>{_e(cell)}</{tag}>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table></div>")
    if section.more:
        parts.append(f'<p class="note">{section.more} more rows in the JSON report.</p>')
    parts.append("</section>")
    return "".join(parts)


def _cards(report: Mapping[str, Any]) -> str:
    s = report["summary"]
    eq = s["gpu_equivalents"]
    causes = s["stranded_by_cause"]
    stranded = causes["in_service"]
    unavailable = causes["node_unavailable"]
    findings = s["findings"]
    # (figure, label, shown in red): red only for what needs fixing.
    cards = [
        (number(eq["allocatable"]), "GPU-equivalents allocatable", False),
        (number(eq["allocated"]), "allocated"
         + (f" ({eq['allocated_share']:.0%})" if eq["allocated_share"] is not None else ""),
         False),
        (number(eq["free"]), "free on usable nodes", False),
        (number(stranded["gpu_equivalents"]),
         f"stranded on {IN_SERVICE} ({stranded['nodes']})", bool(stranded["nodes"])),
        (number(unavailable["gpu_equivalents"]),
         f"free on {UNAVAILABLE} ({unavailable['nodes']})", False),
        (number(eq["pending"]), f"pending ({s['gpu_pods']['pending']} pods)", False),
        ("-" if eq["idle_allocated"] is None else number(eq["idle_allocated"]),
         "allocated but idle", False),
        *((str(findings[level]), f"{level} findings", level == "deny" and findings[level] > 0)
          for level in ("deny", "warn", "audit", "error")),
        (str(findings["info"]), "mutations admission would apply (info)", False),
    ]
    cost = report.get("cost")
    if cost:
        rate, currency = cost["rate"], cost["currency"]
        cards += [
            ("-" if rate["idle"] is None else money(rate["idle"]["cost_per_hour"], currency),
             "idle GPUs cost per hour", False),
            (money(rate["stranded"]["cost_per_hour"], currency), "stranded GPUs cost per hour",
             False)]
    return '<div class="cards">' + "".join(
        f'<div class="card{" bad" if bad else ""}"><b>{_e(v)}</b><span>{_e(label)}</span></div>'
        for v, label, bad in cards) + "</div>"


def render(report: Mapping[str, Any], *, limit: int | None = 500) -> str:
    """The whole report as one HTML document (UTF-8 text)."""
    source = report["source"]
    where = ", ".join(source.get("paths") or []) or source.get("cluster") or "?"
    charts = [svg_charts.node_allocation(report), svg_charts.team_allocation(report),
              svg_charts.fragmentation(report), svg_charts.findings_by_policy(report),
              svg_charts.mutations_by_policy(report), *svg_charts.trends(report)]
    sections = tables(report, limit)
    empty = [section.title for section in sections if not section.rows]
    body = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>gpuguard audit</title>", f"<style>{_STYLE}</style></head><body>",
        "<h1>gpuguard audit</h1>",
        f'<p class="meta">Generated <time datetime="{_e(report["generated"])}">'
        f'{_e(moment(report["generated"]))}</time> from {_e(where)}.</p>',
        _cards(report),
        '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>",
    ]
    body += [_table(section) for section in sections if section.rows]
    if empty:
        body.append('<section id="empty"><h2>Nothing to report</h2><p class="note">'
                    + _e("; ".join(empty)) + ".</p></section>")
    body.append("</body></html>")
    return "\n".join(body)
