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
    """Load ``paths`` (None: the built-in library) and build the engine.

    Paths that hold no policy and no GPUQuota — an empty directory, an empty or truncated file —
    are an error, never "nothing to check": an empty set would allow everything, and the
    library is what a user gets only by giving no paths at all.
    """
    environment = CelEnvironment(GPU_LIBRARY)
    policy_set, errors = load_policies(list(paths) if paths is not None else [library_path()],
                                       environment)
    if paths is not None and not errors and not policy_set.policies and not policy_set.quotas:
        errors.append(PolicyError(", ".join(paths) or "--policies", None, None, "", EMPTY))
    return Loaded(Engine(policy_set, environment, settings), tuple(errors),
                  policy_set.warnings)


EMPTY = ("no policies found (expected GPUPolicy, ValidatingAdmissionPolicy, "
         "MutatingAdmissionPolicy or GPUQuota documents); an empty set would allow everything")
