"""``gpuguard test PATH``: run policy test suites (being built)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from policies.resource_names import GPUSettings


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard test``; returns (name, handler)."""
    parser = commands.add_parser("test", help="run policy test suites")
    parser.add_argument("paths", nargs="+", metavar="PATH")
    return "test", lambda args, settings: 2
