"""The audit report as Markdown (GitHub-flavoured tables), e.g. for a CI job summary or a wiki.

Owns escaping cells for Markdown tables (``|``, newlines, backticks, HTML) and laying out the
sections of :mod:`audit.report.tables`. Must not compute figures.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from audit.report.tables import TextTable, tables


def _cell(text: str) -> str:
    text = html.escape(str(text), quote=False).replace("|", "\\|").replace("`", "\\`")
    return " ".join(text.split()) or " "


def _section(table: TextTable) -> list[str]:
    lines = [f"## {table.title}", ""]
    if table.note:
        lines += [_cell(table.note), ""]
    if not table.rows:
        return [*lines, "_none_", ""]
    if table.key == "summary":
        lines += ["| | |", "|---|---|"]
    else:
        lines += ["| " + " | ".join(_cell(c) for c in table.columns) + " |",
                  "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    if table.more:
        lines.append(f"\n_{table.more} more rows in the JSON report._")
    return [*lines, ""]


def render(report: Mapping[str, Any], *, limit: int | None = 200) -> str:
    """The whole report as one Markdown document."""
    source = report["source"]
    where = ", ".join(source.get("paths") or []) or source.get("cluster") or "?"
    lines = ["# gpuguard audit", "",
             f"Generated {_cell(report['generated'])} from {_cell(where)}.", ""]
    for table in tables(report, limit):
        lines += _section(table)
    return "\n".join(lines)
