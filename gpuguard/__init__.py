"""The ``gpuguard`` command: the composition root.

Owns argument parsing, building the frozen settings once, wiring the layers together and mapping
outcomes to exit codes (``main(argv) -> int``). Must not hold business logic: GPU facts and policy
decisions live in :mod:`policies`, serving in :mod:`webhook`, scanning in :mod:`audit`.
"""
