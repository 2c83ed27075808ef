"""Structured logs: one JSON object per line.

Owns the log line format — ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``msg``, ``pid``,
then the record's ``fields`` (passed as ``extra={"fields": {...}}``) and, for errors, ``error``
with the traceback — and :func:`configure`, which installs it on the ``gpuguard`` logger tree.

Must not decide what is logged: callers pass the fields (the admission log line never holds
object bodies unless the server was started with ``--log-objects``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import Any, TextIO

ROOT_LOGGER = "gpuguard"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = json.JSONEncoder(default=str, separators=(",", ":"))
        self._second = -1
        self._stamp = ""

    def _time(self, created: float) -> str:
        """``2026-11-29T12:00:00.123Z``; the part up to the second is reused within a second."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%S")
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        """The JSON line of ``record``; values JSON cannot hold are written with ``str()``."""
        entry: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": os.getpid(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return self._encoder.encode(entry)


def configure(level: str = "info", stream: TextIO | None = None) -> logging.Logger:
    """Send the ``gpuguard`` loggers to ``stream`` (default stderr) as JSON lines at ``level``.

    Raises:
        ValueError: ``level`` is not debug, info, warning or error.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r}: expected debug, info, warning or error")
    # The lines carry none of these: skip collecting them for every record (the logging
    # HOWTO's "Optimization" section). Each admission logs a line, so this is the hot path.
    logging._srcfile = None  # type: ignore[attr-defined]  # caller file / line lookup
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(numeric)
    logger.propagate = False
    return logger
