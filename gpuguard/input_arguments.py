"""Input arguments shared by the commands that read files given as PATH... or ``-f PATH``.

Owns the one rule: ``lint`` and ``test`` take their inputs both as positional PATHs (as before)
and as ``-f/--filename`` (as every other command does), ``-`` meaning standard input. Must stay
free of heavy imports: the commands' ``--help`` imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gpuguard.exit_codes import EXIT_USAGE


def with_paths(command: str, args: argparse.Namespace, run_on: Callable[[list[str]], int]) -> int:
    """Run ``run_on`` with the PATH arguments followed by the ``-f`` ones; exit 2 with one line
    when there are none (argparse cannot require "one of a positional and an option")."""
    paths = [*args.paths, *args.filename]
    if not paths:
        print(f"gpuguard {command}: error: no input: give PATH... or -f PATH (- for standard "
              "input)", file=sys.stderr)
        return EXIT_USAGE
    return run_on(paths)
