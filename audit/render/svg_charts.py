"""Inline SVG charts for the HTML report: plain markup, no script, no external resource.

Owns drawing the report's charts from its figures — allocation per node and per team (stacked
horizontal bars in GPU-equivalents; free GPUs on cordoned/NotReady nodes apart from the really
stranded ones), fragmentation (free whole GPUs per node against the pod sizes that still fit),
findings by policy (stacked by severity) and, apart, the mutations admission would apply (``info``
findings, which would otherwise dwarf the rest); with ``--history``, lines over the recorded runs
(GPU-equivalents allocatable / allocated / idle, findings per severity). Every label goes through
:func:`html.escape`; colours come from CSS classes the page defines (``s-allocated``, ``s-free``,
``s-stranded``, ``s-unavailable``, ``s-pending``, ``s-idle``, ``s-deny``, ``s-warn``, ``s-audit``,
``s-error``, ``s-info``), and each bar segment has a ``<title>`` tooltip. Labels are sized to the
longest one (up to :data:`MAX_LABEL` characters) so that none is cut at the chart's edge.

Must not read the report's files or anything else; returns strings.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from audit.report.tables import IN_SERVICE, UNAVAILABLE, moment, number

Segment = tuple[float, str, str]  # (value, css class, tooltip)
_ROW = 22
_PLOT = 450
_VALUE = 60  # room right of the longest bar for its total
_CHAR = 7.2  # px per character of the 12 px label font, a generous average (digits, a-z, -)
_NOTE_CHAR = 6.4  # same for the 11 px notes and legend
MAX_ROWS = 40
#: Longer labels are shortened with "…" (the full text is the label's tooltip).
MAX_LABEL = 44
_SEVERITIES = ("deny", "warn", "audit", "error")


def _number(value: float) -> str:
    return number(value)


def bar_chart(title: str, rows: Sequence[tuple[str, Sequence[Segment]]], unit: str,
              legend: Sequence[tuple[str, str]], *, note: str = "") -> str:
    """A horizontal stacked bar chart as an ``<svg>`` element.

    Args:
        title: the chart's caption (also its accessible name).
        rows: (label, segments) per bar; segments are stacked left to right.
        unit: what the numbers count (e.g. ``GPU-equivalents``), shown on the axis.
        legend: (css class, text) pairs.
        note: a line under the title (e.g. how many rows were left out).
    """
    shown = list(rows[:MAX_ROWS])
    peak = max((sum(v for v, _, _ in segs) for _, segs in shown), default=0.0) or 1.0
    label_width = 16 + _CHAR * min(MAX_LABEL, max((len(label) for label, _ in shown),
                                                  default=8))
    width = round(max(label_width + _PLOT + _VALUE, _CHAR * len(title),
                      _NOTE_CHAR * len(note)))
    legend_lines = _legend_lines(legend, width - label_width)
    top = 48 if note else 34
    height = top + max(len(shown), 1) * _ROW + 28 + 16 * len(legend_lines)
    parts = [f'<svg class="chart" role="img" aria-label="{html.escape(title)}" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
             f'<text class="c-title" x="0" y="16">{html.escape(title)}</text>']
    if note:
        parts.append(f'<text class="c-note" x="0" y="34">{html.escape(note)}</text>')
    if not shown:
        parts.append(f'<text class="c-note" x="{label_width:.0f}" y="{top + 15}">nothing to '
                     "draw</text>")
    for index, (label, segments) in enumerate(shown):
        y = top + index * _ROW
        short = label if len(label) <= MAX_LABEL else label[:MAX_LABEL - 1] + "…"
        parts.append(f'<text class="c-label" x="{label_width - 8:.0f}" y="{y + 15}" '
                     f'text-anchor="end"><title>{html.escape(label)}</title>'
                     f'{html.escape(short)}</text>')
        x = label_width
        total = 0.0
        for value, css, tip in segments:
            if value <= 0:
                continue
            bar = value / peak * _PLOT
            parts.append(f'<rect class="{css}" x="{x:.1f}" y="{y + 3}" width="{bar:.1f}" '
                         f'height="{_ROW - 6}"><title>{html.escape(tip)}</title></rect>')
            x += bar
            total += value
        parts.append(f'<text class="c-value" x="{x + 6:.1f}" y="{y + 15}">'
                     f'{html.escape(_number(total))}</text>')
    axis_y = top + max(len(shown), 1) * _ROW + 4
    parts.append(f'<line class="c-axis" x1="{label_width:.0f}" y1="{top}" '
                 f'x2="{label_width:.0f}" y2="{axis_y}"/>')
    parts.append(f'<text class="c-note" x="{label_width:.0f}" y="{axis_y + 16}">0 — '
                 f'{html.escape(_number(peak))} {html.escape(unit)}</text>')
    for line, entries in enumerate(legend_lines):
        y = axis_y + 32 + 16 * line
        x = label_width
        for css, text in entries:
            parts.append(f'<rect class="{css}" x="{x:.0f}" y="{y - 9}" width="10" height="10"/>'
                         f'<text class="c-note" x="{x + 14:.0f}" y="{y}">'
                         f'{html.escape(text)}</text>')
            x += _legend_width(text)
    parts.append("</svg>")
    return "".join(parts)


def _legend_width(text: str) -> float:
    return 14 + _NOTE_CHAR * len(text) + 16


def _legend_lines(legend: Sequence[tuple[str, str]],
                  room: float) -> list[list[tuple[str, str]]]:
    """The legend's entries in lines of at most ``room`` px (at least one entry a line)."""
    lines: list[list[tuple[str, str]]] = []
    used = room
    for entry in legend:
        if used + _legend_width(entry[1]) > room:
            lines.append([])
            used = 0.0
        lines[-1].append(entry)
        used += _legend_width(entry[1])
    return lines


def node_allocation(report: Mapping[str, Any]) -> str:
    """Allocated / free / stranded GPU-equivalents per GPU node (largest nodes first); free GPUs
    on cordoned or NotReady nodes (``stranded.node_unavailable``) in their own colour."""
    rows = []
    for node in sorted(report["nodes"], key=lambda n: (-(n["gpu_equivalents"]["allocatable"]
                                                          or 0), n["name"])):
        eq = node["gpu_equivalents"]
        allocated = eq["allocated"] or 0.0
        free = eq["free"] or 0.0
        stranded = node["stranded"]
        css, what = ("s-free", "free") if stranded is None else \
            ("s-unavailable", f"free on a {UNAVAILABLE.removesuffix('s')}") \
            if stranded["node_unavailable"] else ("s-stranded", "stranded")
        rows.append((node["name"], [
            (allocated, "s-allocated", f"{node['name']}: {_number(allocated)} allocated"),
            (free, css, f"{node['name']}: {_number(free)} {what}"
             + (f" ({'; '.join(stranded['reasons'])})" if stranded else "")),
        ]))
    note = f"{len(rows) - MAX_ROWS} more nodes in the tables" if len(rows) > MAX_ROWS else ""
    return bar_chart("GPU allocation per node", rows, "GPU-equivalents",
                     [("s-allocated", "allocated"), ("s-free", "free"),
                      ("s-stranded", f"stranded on {IN_SERVICE}"),
                      ("s-unavailable", f"free on {UNAVAILABLE}")], note=note)


def team_allocation(report: Mapping[str, Any]) -> str:
    """Allocated (idle part marked) and pending GPU-equivalents per team."""
    rows = []
    for team in report["teams"]:
        name = team["team"] or "(no team)"
        eq = team["gpu_equivalents"]
        allocated = eq["allocated"] or 0.0
        idle = min(eq["idle_allocated"] or 0.0, allocated)
        rows.append((name, [
            (allocated - idle, "s-allocated", f"{name}: {_number(allocated)} allocated"),
            (idle, "s-idle", f"{name}: {_number(idle)} allocated but idle"),
            (eq["pending"] or 0.0, "s-pending", f"{name}: {_number(eq['pending'] or 0)} "
             "pending"),
        ]))
    return bar_chart("GPU allocation per team", rows, "GPU-equivalents",
                     [("s-allocated", "allocated"), ("s-idle", "idle"),
                      ("s-pending", "pending")])


def fragmentation(report: Mapping[str, Any]) -> str:
    """Free whole GPUs per usable node, and how many nodes fit a pod of 1, 2, 4, 8 GPUs."""
    entries = report["fragmentation"]["whole_gpus"]
    rows = []
    for entry in entries:
        for size, nodes in entry["fits"].items():
            label = f"{entry['resource']} x {size}"
            rows.append((label, [(float(nodes), "s-free" if nodes else "s-stranded",
                                  f"{nodes} node(s) can host a pod asking {size} "
                                  f"{entry['resource']}")]))
    note = " · ".join(e["message"] for e in entries) or "no whole GPUs on usable nodes"
    return bar_chart("Fragmentation: nodes that can host an N-GPU pod", rows, "nodes",
                     [("s-free", "nodes that fit")], note=note)


def findings_by_policy(report: Mapping[str, Any]) -> str:
    """Findings per policy, stacked by severity (deny, warn, audit, error; ``info`` apart in
    :func:`mutations_by_policy`)."""
    rows = []
    for entry in sorted(report["policies"], key=lambda p: (-sum(p[s] for s in _SEVERITIES),
                                                           p["policy"])):
        segments = [(float(entry[s]), f"s-{s}", f"{entry['policy']}: {entry[s]} {s}")
                    for s in _SEVERITIES]
        if sum(v for v, _, _ in segments):
            rows.append((entry["policy"], segments))
    return bar_chart("Findings by policy", rows, "findings",
                     [(f"s-{s}", s) for s in _SEVERITIES])


def mutations_by_policy(report: Mapping[str, Any]) -> str:
    """``info`` findings per policy: the changes admission's mutating policies would make to
    running workloads (not violations)."""
    rows = [(entry["policy"], [(float(entry["info"]), "s-info",
                                f"{entry['policy']}: {entry['info']} mutation(s)")])
            for entry in sorted(report["policies"], key=lambda p: (-p["info"], p["policy"]))
            if entry["info"]]
    return bar_chart("Mutations admission would apply (info)", rows, "workloads",
                     [("s-info", "info: a change, not a violation")])


def line_chart(title: str, times: Sequence[str], series: Sequence[tuple[str, str,
                                                                        Sequence[float | None]]],
               unit: str) -> str:
    """A line chart as an ``<svg>`` element: one ``<polyline>`` per series over the same
    points (``times``, ISO 8601, oldest first; the first and last are shown as
    :func:`audit.report.tables.moment` writes them).

    Args:
        series: (css class, legend text, values) — a None value breaks the line there.
    """
    plot_w, plot_h, left, top = 520, 160, 56, 34
    values = [v for _, _, vs in series for v in vs if v is not None]
    peak = max(values, default=0.0) or 1.0
    count = max(len(times), 2)
    width, height = left + plot_w + 20, top + plot_h + 40 + 16
    parts = [f'<svg class="chart" role="img" aria-label="{html.escape(title)}" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
             f'<text class="c-title" x="0" y="16">{html.escape(title)}</text>',
             f'<line class="c-axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
             f'<line class="c-axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
             f'y2="{top + plot_h}"/>',
             f'<text class="c-note" x="{left - 6}" y="{top + 8}" text-anchor="end">'
             f'{html.escape(_number(peak))}</text>',
             f'<text class="c-note" x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>']
    for css, text, vs in series:
        runs: list[list[str]] = [[]]
        for index, value in enumerate(vs):
            if value is None:
                runs.append([])
                continue
            x = left + plot_w * index / (count - 1)
            y = top + plot_h - plot_h * value / peak
            runs[-1].append(f"{x:.1f},{y:.1f}")
        for points in runs:
            if points:
                parts.append(f'<polyline class="line {css}" points="{" ".join(points)}">'
                             f'<title>{html.escape(text)}</title></polyline>')
    if times:
        parts.append(f'<text class="c-note" x="{left}" y="{top + plot_h + 16}">'
                     f'{html.escape(moment(times[0]))}</text>')
        parts.append(f'<text class="c-note" x="{left + plot_w}" y="{top + plot_h + 16}" '
                     f'text-anchor="end">{html.escape(moment(times[-1]))}</text>')
    x = left
    for css, text, _ in series:
        parts.append(f'<rect class="{css}" x="{x}" y="{top + plot_h + 27}" width="10" '
                     f'height="10"/><text class="c-note" x="{x + 14}" y="{top + plot_h + 36}">'
                     f'{html.escape(text)}</text>')
        x += round(_legend_width(text))
    parts.append(f'<text class="c-note" x="{left + plot_w}" y="{top - 6}" text-anchor="end">'
                 f'{html.escape(unit)}, {len(times)} runs</text></svg>')
    return "".join(parts)


def trends(report: Mapping[str, Any]) -> list[str]:
    """The trend charts of ``report["history"]`` (``--history``: the recorded runs, oldest
    first) and, with ``--prices``, of ``cost.window.series`` (money per hour); none with fewer
    than two runs."""
    points = report.get("history") or []
    if len(points) < 2:
        return []
    times = [str(p["at"]) for p in points]
    allocation = line_chart("GPU-equivalents over time", times, [
        ("s-free", "allocatable", [p["allocatable"] for p in points]),
        ("s-allocated", "allocated", [p["allocated"] for p in points]),
        ("s-idle", "idle", [p["idle"] for p in points])], "GPU-equivalents")
    findings = line_chart("Findings over time", times, [
        (f"s-{s}", s, [float(p["findings"].get(s, 0)) for p in points]) for s in _SEVERITIES],
        "findings")
    charts = [allocation, findings]
    cost = report.get("cost") or {}
    series = (cost.get("window") or {}).get("series") or []
    if len(series) >= 2:
        money = [("s-idle", "idle", [p["idle_cost_per_hour"] for p in series]),
                 ("s-stranded", "stranded", [p["stranded_cost_per_hour"] for p in series])]
        charts.append(line_chart("Cost of idle and stranded GPUs over time",
                                 [str(p["at"]) for p in series], money,
                                 f"{cost['currency']} per hour"))
    return charts
