"""A ``PolicyDiff`` (:mod:`audit.report.policy_diff`) as a terminal table or as Markdown.

Owns the layout: one row per changed finding (workload, team, verdict current -> candidate, the
change, policy / rule, message), one per changed patch, then the counts per policy and per team.
Must not compute anything the diff does not hold.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from audit.report.history import workload_text
from audit.report.policy_diff import CHANGES

_CHANGE_COLUMNS = ("workload", "team", "verdict", "change", "policy / rule", "detail")
_COUNT_COLUMNS = ("denied", "no_longer_denied", "warned", "no_longer_warned", "mutated",
                  "no_longer_mutated", "message_changed", "exempted")


def _change_rows(diff: Mapping[str, Any]) -> Iterator[tuple[str, ...]]:
    for entry in diff["workloads"]:
        name = workload_text(entry["workload"])
        team = entry["team"] or "-"
        verdict = f"{entry['verdict']['current']} → {entry['verdict']['candidate']}"
        for change in entry["changes"]:
            detail = change["message"]
            if "message_before" in change:
                detail = f"was: {change['message_before']} | now: {detail}"
            yield (name, team, verdict, change["change"],
                   f"{change['policy']} / {change['rule']}", detail)
        patch = entry["patch"]
        if patch is not None:
            ops = "; ".join(f"+ {json.dumps(op)}" for op in patch["added"])
            ops += ("; " if ops and patch["removed"] else "") + \
                "; ".join(f"- {json.dumps(op)}" for op in patch["removed"])
            yield (name, team, verdict, "patch_changed", "(JSONPatch)", ops or
                   "same operations in another order")


def _count_columns(diff: Mapping[str, Any]) -> tuple[str, ...]:
    """The count columns worth showing: the usual ones and any other that is not zero."""
    rows = [*diff["policies"], *diff["teams"]]
    return tuple(c for c in CHANGES if c in _COUNT_COLUMNS or any(r.get(c) for r in rows))


def _policy_rows(diff: Mapping[str, Any], columns: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for row in diff["policies"]:
        yield (row["policy"], *(str(row[c]) for c in columns), str(row["workloads_newly_denied"]))


def _team_rows(diff: Mapping[str, Any], columns: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for row in diff["teams"]:
        yield (row["team"] or "(no team)", *(str(row[c]) for c in columns),
               str(row["workloads_changed"]), str(row["workloads_newly_denied"]))


def headline(diff: Mapping[str, Any]) -> str:
    """One sentence: how many workloads change and how many the candidate newly denies."""
    summary = diff["summary"]
    return (f"{summary['workloads_changed']} of {summary['workloads_evaluated']} workloads "
            f"change: {summary['workloads_newly_denied']} newly denied, "
            f"{summary['workloads_no_longer_denied']} no longer denied, "
            f"{summary['workloads_newly_warned']} newly warned, "
            f"{summary['workloads_patch_changed']} with another patch.")


def render_table(diff: Mapping[str, Any], console: Console) -> None:
    """The diff as rich tables on ``console``."""
    console.print(escape(headline(diff)))
    if diff["workloads"]:
        table = Table(title="Changes per workload", title_justify="left")
        for column in _CHANGE_COLUMNS:
            table.add_column(column, overflow="fold")
        for row in _change_rows(diff):
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
    columns = _count_columns(diff)
    for title, first, rows, last in (
            ("Changes per policy", "policy", _policy_rows(diff, columns),
             ("workloads_newly_denied",)),
            ("Changes per team", "team", _team_rows(diff, columns),
             ("workloads_changed", "workloads_newly_denied"))):
        table = Table(title=title, title_justify="left")
        for column in (first, *columns, *last):
            table.add_column(column, justify="left" if column == first else "right")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        if table.row_count:
            console.print(table)


def _cell(text: str) -> str:
    text = html.escape(str(text), quote=False).replace("|", "\\|").replace("`", "\\`")
    return " ".join(text.split()) or " "


def _markdown_table(columns: tuple[str, ...], rows: Iterator[tuple[str, ...]]) -> list[str]:
    body = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    if not body:
        return ["_none_", ""]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *body, ""]


def render_markdown(diff: Mapping[str, Any]) -> str:
    """The diff as one Markdown document (GitHub-flavoured tables), e.g. for a pull request."""
    columns = _count_columns(diff)
    lines = ["# gpuguard diff", "", _cell(headline(diff)), "",
             "## Changes per workload", "",
             *_markdown_table(_CHANGE_COLUMNS, _change_rows(diff)),
             "## Changes per policy", "",
             *_markdown_table(("policy", *columns, "workloads_newly_denied"),
                              _policy_rows(diff, columns)),
             "## Changes per team", "",
             *_markdown_table(("team", *columns, "workloads_changed", "workloads_newly_denied"),
                              _team_rows(diff, columns))]
    return "\n".join(lines)
