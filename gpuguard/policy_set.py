"""Loading policy files for the CLI: the built-in library by default, or the given paths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.cel import CelEnvironment
from policies.cel_gpu import GPU_LIBRARY
from policies.engine import Engine
from policies.loader import PolicyError, load_policies
from policies.resource_names import GPUSettings
from policies.sources import library_path


@dataclass(frozen=True)
class Loaded:
    """An engine over the policies that loaded, plus every error and warning met on the way."""

    engine: Engine
    errors: tuple[PolicyError, ...]
    warnings: tuple[str, ...]


def load(paths: Sequence[str] | None, settings: GPUSettings) -> Loaded:
    """Load ``paths`` (the built-in library when None or empty) and build the engine."""
    environment = CelEnvironment(GPU_LIBRARY)
    policy_set, errors = load_policies(list(paths) if paths else [library_path()], environment)
    return Loaded(Engine(policy_set, environment, settings), tuple(errors),
                  policy_set.warnings)
