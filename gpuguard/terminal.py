"""The rich console the commands print their tables on.

Owns two conventions of table output: a pipe or file gets a fixed width (so names and paths stay
on one line instead of the 80 columns rich assumes), and a reader that goes away (``| head``)
is not an exit code of its own: the rest of the table goes to /dev/null and the command ends
with the code it decided (0, or 1 for a denial or a finding at ``--fail-on``). rich's default
turns a closed pipe into ``SystemExit(1)``, which CI reads as "findings" whatever was found.
Must not format reports itself.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console


class _FilterConsole(Console):
    """A console that, when its reader goes away, writes the rest to /dev/null and lets the
    command finish (and return its own exit code) instead of rich's ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        """Point stdout at /dev/null and carry on (rich calls this on BrokenPipeError)."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def table_console(piped_width: int = 160) -> Console:
    """A console on stdout: the terminal's width, or ``piped_width`` columns for a pipe or
    file; a closed pipe ends nothing (see the module docstring)."""
    console = _FilterConsole()
    return console if console.is_terminal else _FilterConsole(width=piped_width)
