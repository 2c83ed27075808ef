"""Standard output of the commands: the rich console of their tables and the guard of every write.

Owns the conventions of output: a pipe or file gets a fixed width (so names and paths stay
on one line instead of the 80 columns rich assumes); a reader that goes away (``| head``)
is not an exit code of its own: the rest of the output goes to /dev/null and the command ends
with the code it decided (0, or 1 for a denial or a finding at ``--fail-on``) — rich's default
turns a closed pipe into ``SystemExit(1)``, which CI reads as "findings" whatever was found;
and a write that fails otherwise (a full disk, ``> /dev/full``, an I/O error) is
:class:`StandardOutputError`, the environment's fault (exit 3), never an internal error.
Must not format reports itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console


def discard_standard_output() -> None:
    """Point file descriptor 1 at /dev/null: what is still written (or still buffered, and
    flushed at exit) goes nowhere instead of failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class StandardOutputError(Exception):
    """Standard output could not be written for a reason other than a closed pipe.

    ``strerror``: the operating system's words (``No space left on device``). The CLI reports
    it as one line and exit 3 (:data:`gpuguard.exit_codes.EXIT_ENVIRONMENT`). Not an
    ``OSError``, so a command's own ``except OSError`` for the files it reads does not take it
    for one of them.
    """

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.strerror = error.strerror or str(error)

    def __str__(self) -> str:
        return f"cannot write standard output: {self.strerror}"


class _GuardedStream:
    """``sys.stdout`` while a command runs: the same stream, whose ``write`` and ``flush``
    apply the module's rules (a closed pipe discards the rest; any other failure is
    :class:`StandardOutputError`, after which the rest is discarded too, so the flush at exit
    does not fail a second time). Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text``; see the class docstring for what a failure becomes."""
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            discard_standard_output()
            return len(text)
        except OSError as exc:
            discard_standard_output()
            raise StandardOutputError(exc) from None

    def flush(self) -> None:
        """Flush the wrapped stream; failures as for :meth:`write`."""
        try:
            self._stream.flush()
        except BrokenPipeError:
            discard_standard_output()
        except OSError as exc:
            discard_standard_output()
            raise StandardOutputError(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded_standard_output() -> Iterator[None]:
    """Run the body with ``sys.stdout`` guarded (see :class:`_GuardedStream`), flushing it at
    the end so a failure is raised here, not at interpreter exit; the stream is restored after.

    Raises :class:`StandardOutputError` when standard output cannot be written.
    """
    stream = sys.stdout
    sys.stdout = _GuardedStream(stream)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = stream


class _FilterConsole(Console):
    """A console that, when its reader goes away, writes the rest to /dev/null and lets the
    command finish (and return its own exit code) instead of rich's ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        """Point stdout at /dev/null and carry on (rich calls this on BrokenPipeError)."""
        discard_standard_output()


def table_console(piped_width: int = 160) -> Console:
    """A console on stdout: the terminal's width, or ``piped_width`` columns for a pipe or
    file; a closed pipe ends nothing (see the module docstring)."""
    console = _FilterConsole()
    return console if console.is_terminal else _FilterConsole(width=piped_width)
