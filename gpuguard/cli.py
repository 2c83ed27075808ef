"""Entry point (being built)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the gpuguard command line; returns the exit code."""
    return 0
