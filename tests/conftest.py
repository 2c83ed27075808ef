"""What every test shares: the hypothesis profile, and loggers left as each test found them.

Hypothesis profiles (registered here only; property-based tests pick them up, none registers its
own):

- ``deterministic``, the default: the same examples on every run (``derandomize``), no example
  database (nothing replayed from an earlier run), no per-example ``deadline`` and no
  ``too_slow`` health check — both are wall-clock measurements that a loaded machine fails.
- ``explore``: fresh random examples on each run, more of them where a test does not set its
  own count; opt in with ``GPUGUARD_HYPOTHESIS_PROFILE=explore``. A failure prints the blob that
  reproduces it (``@reproduce_failure``).

``closed_port``: a loopback port no server can answer on for the test's length (bound by the
test, never listening), for "API server unreachable" cases, instead of a well-known port that
something on the machine might serve.

A test that configures logging (``webhook.logs.configure``, a CLI command run in-process) changes
process-wide loggers; every logger but the root (pytest's capture lives there) gets its level,
handlers and propagation back after each test, so that no test depends on which ran before it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "deterministic", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "explore", settings.get_profile("deterministic"), derandomize=False, max_examples=2000)
settings.load_profile(os.environ.get("GPUGUARD_HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(autouse=True)
def _loggers_restored() -> Iterator[None]:
    loggers = [logger for logger in logging.Logger.manager.loggerDict.values()
               if isinstance(logger, logging.Logger)]
    saved = [(logger, logger.level, list(logger.handlers), logger.propagate, logger.disabled)
             for logger in loggers]
    yield
    for logger, level, handlers, propagate, disabled in saved:
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.disabled = disabled


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        yield sock.getsockname()[1]
