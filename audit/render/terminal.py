"""The audit report on a terminal: rich tables, cut to what a screen can hold.

Owns the terminal layout of the sections of :mod:`audit.report.tables` (long tables show their
first rows and say how many more the JSON / HTML reports have). Input-derived text is never read
as rich markup and has control characters escaped. Must not compute figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from audit.report.tables import tables
from policies.sources import printable

TERMINAL_ROWS = 25


def _text(value: str) -> str:
    return escape(printable(str(value)))


def render(report: Mapping[str, Any], console: Console, *, limit: int = TERMINAL_ROWS) -> None:
    """Print the report to ``console``."""
    for section in tables(report, limit):
        if not section.rows:
            if section.key == "findings":
                console.print("No findings.\n")
            continue
        table = Table(title=_text(section.title), title_justify="left",
                      show_header=section.key != "summary", header_style="bold",
                      expand=False)
        for column in section.columns:
            table.add_column(_text(column), overflow="fold")
        for row in section.rows:
            table.add_row(*(_text(cell) for cell in row))
        console.print(table)
        if section.note:
            console.print(f"  {_text(section.note)}")
        if section.more:
            console.print(f"  … {section.more} more (see -o json or --out DIR)")
        console.print()
