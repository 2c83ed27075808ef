"""Structured logs: one JSON object per line.

Owns the log line format — ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``msg``, ``pid``,
then the record's ``fields`` (passed as ``extra={"fields": {...}}``) and, for errors, ``error``
with the traceback — and :func:`configure`, which installs it on the ``gpuguard`` logger tree and
on the root logger, so that every line the process writes is JSON: aiohttp's loggers
(``aiohttp.server``, ``aiohttp.web``, ``aiohttp.access``), ``asyncio`` (its exception handler),
the Kubernetes client, Python warnings (``py.warnings``) and uncaught exceptions of any thread
(``sys.excepthook`` / ``threading.excepthook``) included. Third-party loggers write warnings
and above (``THIRD_PARTY_LEVEL``); :func:`unconfigure` undoes it all (tests).

Lines are written by orjson (the admission line is on every request's path) when the result is
ASCII, else by the standard library (which escapes non-ASCII text), so a line is the same JSON
either way.

:func:`log_fields` logs a line of fields, written straight to the stream when it would go only
to the handler :func:`configure` installed (the admission line, on every request's path).

Must not decide what is logged: callers pass the fields (the admission log line never holds
object bodies unless the server was started with ``--log-objects``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

import orjson

ROOT_LOGGER = "gpuguard"
THIRD_PARTY_LEVEL = logging.WARNING
"""The least level written for loggers outside ``gpuguard`` (aiohttp, asyncio, kubernetes)."""
# Types orjson would write itself but the standard library writes with str(): hand them to str().
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_PID = [os.getpid()]  # read once (a system call per line otherwise); renewed in a forked child
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = json.JSONEncoder(default=str, separators=(",", ":"))
        self._stamp = (-1, "")  # (second, its text): one tuple, so threads never mix the two

    def _time(self, created: float) -> str:
        """``2026-11-29T12:00:00.123Z``; the part up to the second is reused within a second."""
        second = int(created)
        cached, stamp = self._stamp
        if second != cached:
            stamp = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%S")
            self._stamp = (second, stamp)
        return f"{stamp}.{int((created - second) * 1000):03d}Z"

    def line(self, created: float, level: str, logger: str, msg: str,
             fields: dict[str, Any] | None = None, error: str | None = None) -> str:
        """The JSON line of one entry (``created``: seconds since the epoch; ``level`` in lower
        case); values JSON cannot hold are written with ``str()``."""
        entry: dict[str, Any] = {"time": self._time(created), "level": level, "logger": logger,
                                 "msg": msg, "pid": _PID[0]}
        if fields:
            entry.update(fields)
        if error:
            entry["error"] = error
        try:
            text = orjson.dumps(entry, default=str, option=_ORJSON_OPTIONS).decode()
        except orjson.JSONEncodeError:  # integers past 64 bits, keys that are not strings, ...
            return self._encoder.encode(entry)
        return text if text.isascii() else self._encoder.encode(entry)

    def format(self, record: logging.LogRecord) -> str:
        """The JSON line of ``record`` (see :meth:`line`)."""
        fields = getattr(record, "fields", None)
        return self.line(record.created, record.levelname.lower(), record.name,
                         record.getMessage(), fields if isinstance(fields, dict) else None,
                         self.formatException(record.exc_info) if record.exc_info else None)


# The handler configure() installed: log_fields writes to it directly when it is the only one.
_installed: list[logging.StreamHandler[TextIO]] = []


def _direct_handler(logger: logging.Logger, level: int) -> logging.StreamHandler[TextIO] | None:
    """The handler :func:`configure` installed, when a record of ``level`` from ``logger`` would
    reach it and nothing else: no filter on the way, no other handler, no propagation past it."""
    if not _installed or logger.disabled:
        return None
    handler = _installed[0]
    if handler.filters or level < handler.level or \
            not isinstance(handler.formatter, JsonFormatter):
        return None
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters:
            return None
        if node.handlers:
            return handler if node.handlers == [handler] and not node.propagate else None
        if not node.propagate:
            return None
        node = node.parent
    return None


def log_fields(logger: logging.Logger, level: int, msg: str, fields: dict[str, Any]) -> None:
    """``logger.log(level, msg, extra={"fields": fields})``, written straight to the stream when
    the line would go only to the handler :func:`configure` installed.

    The line is the same; what is skipped is building a ``LogRecord`` and dispatching it through
    the logging machinery, which costs more than the rest of a request's log line (the admission
    line is written for every request). Any other set-up (another handler, a filter, a test's
    log capture) gets the record as usual.
    """
    if not logger.isEnabledFor(level):
        return
    handler = _direct_handler(logger, level)
    if handler is not None:
        formatter = handler.formatter
        assert isinstance(formatter, JsonFormatter)  # checked by _direct_handler
        try:
            text = formatter.line(time.time(), logging.getLevelName(level).lower(), logger.name,
                                  msg, fields)
            handler.acquire()
            try:
                handler.stream.write(text + handler.terminator)
                handler.stream.flush()
            finally:
                handler.release()
            return
        except RecursionError:  # as logging.StreamHandler.emit
            raise
        except Exception:  # logging's own path reports it (handleError) or writes it
            pass
    logger.log(level, msg, extra={"fields": fields})


# What configure() changed, to be put back by unconfigure().
_saved: dict[str, Any] = {}


def _log_uncaught(kind: type[BaseException], error: BaseException,
                  traceback: TracebackType | None) -> None:
    """``sys.excepthook``: an uncaught exception as one JSON line (Ctrl-C stays quiet)."""
    if issubclass(kind, KeyboardInterrupt):
        return
    logging.getLogger(ROOT_LOGGER).critical("uncaught exception: the process stops",
                                            exc_info=(kind, error, traceback))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: an exception that ended a thread, as one JSON line."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    thread = args.thread.name if args.thread is not None else None
    logging.getLogger(ROOT_LOGGER).error(
        "uncaught exception in a thread", extra={"fields": {"thread": thread}},
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def configure(level: str = "info", stream: TextIO | None = None) -> logging.Logger:
    """Send every logger of the process to ``stream`` (default stderr) as JSON lines: the
    ``gpuguard`` loggers at ``level``, others at ``THIRD_PARTY_LEVEL`` or ``level`` if higher
    (see module docstring). A second call replaces the first.

    Raises:
        ValueError: ``level`` is not debug, info, warning or error.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r}: expected debug, info, warning or error")
    unconfigure()
    # The lines carry none of these: skip collecting them for every record (the logging
    # HOWTO's "Optimization" section). Each admission logs a line, so this is the hot path.
    logging._srcfile = None  # caller file / line lookup
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    _installed[:] = [handler]
    logger.setLevel(numeric)
    logger.propagate = False
    root = logging.getLogger()
    _saved.update(root_level=root.level, excepthook=sys.excepthook,
                  thread_excepthook=threading.excepthook, handler=handler)
    root.addHandler(handler)
    root.setLevel(max(numeric, THIRD_PARTY_LEVEL))
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_exception
    return logger


def unconfigure() -> None:
    """Undo :func:`configure`: its handler removed, the root level, Python warnings and the
    exception hooks as they were, the ``gpuguard`` loggers propagating again."""
    if not _saved:
        return
    handler = _saved.pop("handler")
    root = logging.getLogger()
    root.removeHandler(handler)
    root.setLevel(_saved.pop("root_level"))
    logger = logging.getLogger(ROOT_LOGGER)
    logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
    logging.captureWarnings(False)
    sys.excepthook = _saved.pop("excepthook")
    threading.excepthook = _saved.pop("thread_excepthook")
    _installed.clear()
