"""The command reference lists the ``-o`` formats the parsers take (trial: ``check.md`` showed
``-o table|json`` though ``check`` also writes yaml and sarif, ``lint.md`` ``-o text|json``,
``test.md`` no junit, ``audit.md`` no yaml).

The formats are read from the real parsers (``-o``'s ``choices``), so a format added to a command
fails here until its page lists it: in the synopsis (the page's first ``sh`` block) and in the
``-o`` row of its flag table, wherever either names formats.
"""

from __future__ import annotations

import re

import pytest

from gpuguard import cli
from tests.paths import ROOT

REFERENCE = ROOT / "docs" / "commands"

#: ``-o a|b|c`` / ``--output a|b|c`` (a table cell escapes ``|`` as ``\|``).
_LISTED = re.compile(r"(?:-o|--output) ((?:[a-z]+\\?\|)+[a-z]+)")


def _formats(name: str) -> tuple[str, ...] | None:
    """The ``-o`` choices of command ``name``'s parser; None when ``-o`` names a file or
    directory, or the command has no ``-o``."""
    parser, _ = cli.build_parser(name)
    commands = next(a for a in parser._actions if a.dest == "command")
    sub = commands.choices[name]
    output = next((a for a in sub._actions if "-o" in a.option_strings), None)
    return tuple(output.choices) if output is not None and output.choices else None


def _listed(page: str) -> list[tuple[str, list[str]]]:
    """(where, formats) of every place the page's synopsis or ``-o`` row names formats."""
    places: list[tuple[str, str]] = []
    synopsis = re.search(r"```sh\n(.*?)```", page, re.S)
    if synopsis:
        places.append(("synopsis", synopsis[1]))
    places += [("flag table", line) for line in page.splitlines()
               if re.match(r"\| `-o", line)]
    return [(where, match.replace("\\", "").split("|"))
            for where, text in places for match in _LISTED.findall(text)]


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_the_page_lists_exactly_the_output_formats_of_the_parser(name):
    formats = _formats(name)
    listed = _listed((REFERENCE / f"{name}.md").read_text(encoding="utf-8"))
    if formats is None:
        assert listed == [], f"{name}.md lists -o formats the parser does not take"
        return
    assert listed, f"{name}.md names none of -o {'|'.join(formats)}"
    for where, shown in listed:
        assert sorted(shown) == sorted(formats), (name, where, shown, formats)
