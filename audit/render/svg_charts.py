"""Inline SVG charts for the HTML report: plain markup, no script, no external resource.

Owns drawing the report's charts from its figures — allocation per node and per team (stacked
horizontal bars in GPU-equivalents), fragmentation (free whole GPUs per node against the pod sizes
that still fit) and findings by policy (stacked by severity). Every label goes through
:func:`html.escape`; colours come from CSS classes the page defines (``s-allocated``, ``s-free``,
``s-stranded``, ``s-pending``, ``s-idle``, ``s-deny``, ``s-warn``, ``s-audit``, ``s-error``,
``s-info``), and each bar segment has a ``<title>`` tooltip.

Must not read the report's files or anything else; returns strings.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

Segment = tuple[float, str, str]  # (value, css class, tooltip)
_ROW = 22
_LABEL = 220
_WIDTH = 760
_PLOT = _WIDTH - _LABEL - 90
MAX_ROWS = 40


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


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
    top = 48 if note else 34
    height = top + len(shown) * _ROW + 40
    parts = [f'<svg class="chart" role="img" aria-label="{html.escape(title)}" '
             f'viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}">',
             f'<text class="c-title" x="0" y="16">{html.escape(title)}</text>']
    if note:
        parts.append(f'<text class="c-note" x="0" y="34">{html.escape(note)}</text>')
    for index, (label, segments) in enumerate(shown):
        y = top + index * _ROW
        short = label if len(label) <= 32 else label[:31] + "…"
        parts.append(f'<text class="c-label" x="{_LABEL - 8}" y="{y + 15}" '
                     f'text-anchor="end"><title>{html.escape(label)}</title>'
                     f'{html.escape(short)}</text>')
        x = float(_LABEL)
        total = 0.0
        for value, css, tip in segments:
            if value <= 0:
                continue
            width = value / peak * _PLOT
            parts.append(f'<rect class="{css}" x="{x:.1f}" y="{y + 3}" width="{width:.1f}" '
                         f'height="{_ROW - 6}"><title>{html.escape(tip)}</title></rect>')
            x += width
            total += value
        parts.append(f'<text class="c-value" x="{x + 6:.1f}" y="{y + 15}">'
                     f'{html.escape(_number(total))}</text>')
    axis_y = top + len(shown) * _ROW + 4
    parts.append(f'<line class="c-axis" x1="{_LABEL}" y1="{top}" x2="{_LABEL}" y2="{axis_y}"/>')
    parts.append(f'<text class="c-note" x="{_LABEL}" y="{axis_y + 16}">0 — '
                 f'{html.escape(_number(peak))} {html.escape(unit)}</text>')
    x = float(_LABEL + 180)
    for css, text in legend:
        parts.append(f'<rect class="{css}" x="{x:.0f}" y="{axis_y + 7}" width="10" height="10"/>'
                     f'<text class="c-note" x="{x + 14:.0f}" y="{axis_y + 16}">'
                     f'{html.escape(text)}</text>')
        x += 14 + 7 * len(text) + 16
    parts.append("</svg>")
    return "".join(parts)


def node_allocation(report: Mapping[str, Any]) -> str:
    """Allocated / free / stranded GPU-equivalents per GPU node (largest nodes first)."""
    rows = []
    for node in sorted(report["nodes"], key=lambda n: (-(n["gpu_equivalents"]["allocatable"]
                                                          or 0), n["name"])):
        eq = node["gpu_equivalents"]
        allocated = eq["allocated"] or 0.0
        free = eq["free"] or 0.0
        stranded = node["stranded"] is not None
        rows.append((node["name"], [
            (allocated, "s-allocated", f"{node['name']}: {_number(allocated)} allocated"),
            (free, "s-stranded" if stranded else "s-free",
             f"{node['name']}: {_number(free)} {'stranded' if stranded else 'free'}"
             + (f" ({'; '.join(node['stranded']['reasons'])})" if stranded else "")),
        ]))
    note = f"{len(rows) - MAX_ROWS} more nodes in the tables" if len(rows) > MAX_ROWS else ""
    return bar_chart("GPU allocation per node", rows, "GPU-equivalents",
                     [("s-allocated", "allocated"), ("s-free", "free"),
                      ("s-stranded", "stranded")], note=note)


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
    """Findings per policy, stacked by severity."""
    rows = []
    for entry in sorted(report["policies"], key=lambda p: -sum(
            p[s] for s in ("deny", "warn", "audit", "error", "info"))):
        segments = [(float(entry[s]), f"s-{s}", f"{entry['policy']}: {entry[s]} {s}")
                    for s in ("deny", "warn", "audit", "error", "info")]
        if sum(v for v, _, _ in segments):
            rows.append((entry["policy"], segments))
    return bar_chart("Findings by policy", rows, "findings",
                     [("s-deny", "deny"), ("s-warn", "warn"), ("s-audit", "audit"),
                      ("s-error", "error"), ("s-info", "info")])
