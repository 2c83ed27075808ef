"""Where the tests' inputs are, for test modules in any subfolder of ``tests/``.

``TESTS`` is the ``tests/`` folder (its ``data/``, ``policies/`` suites and corpus copies live
there); ``ROOT`` is the repository root (``examples/``, ``deploy/``, ``docs/``, the built-in
policy library).
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
