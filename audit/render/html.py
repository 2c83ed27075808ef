"""The audit report as one self-contained HTML page: inline CSS and SVG charts, no script.

Owns the page layout: a summary, the charts of :mod:`audit.render.svg_charts` (allocation per node
and per team, fragmentation, findings by policy) and the tables of :mod:`audit.report.tables`. The
page loads nothing — no stylesheet, font, script or image from anywhere — so it opens offline and
can be mailed or attached to a CI run. All input-derived text is HTML-escaped. Must not compute
figures.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from audit.render import svg_charts
from audit.report.tables import TextTable, tables

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1200px;padding:0 16px;color:#1d2430;background:#fff}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea}
.meta{color:#5b6675;margin-bottom:16px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#5b6675;font-size:12px}
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
.s-idle{fill:#9db7ea}.s-deny{fill:#c9302c}.s-warn{fill:#ec971f}.s-audit{fill:#5bc0de}
.s-error{fill:#7d3c98}.s-info{fill:#b8c2cc}
.sev-deny{color:#c9302c;font-weight:600}.sev-warn{color:#b36b00;font-weight:600}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _table(section: TextTable) -> str:
    parts = [f'<section id="{_e(section.key)}"><h2>{_e(section.title)}</h2>']
    if section.note:
        parts.append(f'<p class="note">{_e(section.note)}</p>')
    if not section.rows:
        parts.append('<p class="note">None.</p></section>')
        return "".join(parts)
    parts.append("<table>")
    if section.key != "summary":
        parts.append("<tr>" + "".join(f"<th>{_e(c)}</th>" for c in section.columns) + "</tr>")
    for row in section.rows:
        cells = []
        for index, cell in enumerate(row):
            css = f' class="sev-{_e(cell)}"' if section.key == "findings" and index == 0 else ""
            tag = "th" if section.key == "summary" and index == 0 else "td"
            cells.append(f"<{tag}{css}>{_e(cell)}</{tag}>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    if section.more:
        parts.append(f'<p class="note">{section.more} more rows in the JSON report.</p>')
    parts.append("</section>")
    return "".join(parts)


def _cards(report: Mapping[str, Any]) -> str:
    s = report["summary"]
    eq = s["gpu_equivalents"]

    def figure(value: float | None) -> str:
        return "?" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")

    cards = [
        (figure(eq["allocatable"]), "GPU-equivalents allocatable"),
        (figure(eq["allocated"]), "allocated"
         + (f" ({eq['allocated_share']:.0%})" if eq["allocated_share"] is not None else "")),
        (figure(eq["free"]), "free on usable nodes"),
        (figure(eq["stranded"]), "stranded"),
        (figure(eq["pending"]), f"pending ({s['gpu_pods']['pending']} pods)"),
        ("-" if eq["idle_allocated"] is None else figure(eq["idle_allocated"]),
         "allocated but idle"),
        (str(s["findings"]["deny"]), "deny findings"),
        (str(s["findings"]["warn"]), "warn findings"),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{_e(v)}</b><span>{_e(label)}</span></div>'
        for v, label in cards) + "</div>"


def render(report: Mapping[str, Any], *, limit: int | None = 500) -> str:
    """The whole report as one HTML document (UTF-8 text)."""
    source = report["source"]
    where = ", ".join(source.get("paths") or []) or source.get("cluster") or "?"
    charts = [svg_charts.node_allocation(report), svg_charts.team_allocation(report),
              svg_charts.fragmentation(report), svg_charts.findings_by_policy(report)]
    body = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>gpuguard audit</title>", f"<style>{_STYLE}</style></head><body>",
        "<h1>gpuguard audit</h1>",
        f'<p class="meta">Generated {_e(report["generated"])} from {_e(where)}.</p>',
        _cards(report),
        '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>",
    ]
    body += [_table(section) for section in tables(report, limit)]
    body.append("</body></html>")
    return "\n".join(body)
