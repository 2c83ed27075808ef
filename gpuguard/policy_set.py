"""Loading policy files for the CLI: the built-in library by default, or the given paths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import CelEnvironment
from policies.engine.evaluation import Engine
from policies.facts.resource_names import GPUSettings
from policies.policy.loader import PolicyError, load_snapshot, read_policy_files
from policies.sources import Snapshot, library_path


@dataclass(frozen=True)
class Loaded:
    """An engine over the policies that loaded, plus every error and warning met on the way.

    ``errors`` empty means the source is whole: every file read, every document a policy (or
    binding, param object, GPUQuota) that compiled, and at least one of them. A caller that
    must not act on a partial set (the audit's reports, a reload) checks it before using
    ``engine``; the set's identity is ``engine.policies.digest``.
    """

    engine: Engine
    errors: tuple[PolicyError, ...]
    warnings: tuple[str, ...]


def broken_policy(error: PolicyError) -> bool:
    """Whether ``error`` is a policy document's own (a field or expression of one document that
    parsed), which ``--skip-broken`` may skip; file-level errors (unreadable, unparsable, empty,
    no policy document) never are."""
    return error.index is not None and bool(error.path)


def load(source: Sequence[str] | Snapshot | None, settings: GPUSettings, *,
         skip_broken: bool = False) -> Loaded:
    """Load ``source`` and build the engine.

    Args:
        source: policy paths; a :class:`~policies.sources.Snapshot` already read (the
            webhook's reload reads the files once and builds from those bytes); None: the
            built-in library.
        skip_broken: a policy document that cannot load (:func:`broken_policy`) is left out
            of the set and named in ``PolicySet.skipped`` and the warnings, instead of being an
            error that refuses the whole set (the default).

    Paths that hold no policy and no GPUQuota — an empty directory, an empty or truncated file —
    are an error, never "nothing to check": an empty set would allow everything, and the
    library is what a user gets only by giving no paths at all.
    """
    environment = CelEnvironment(GPU_LIBRARY)
    if isinstance(source, Snapshot):
        snapshot = source
    else:
        snapshot = read_policy_files(list(source) if source is not None else [library_path()])
    policy_set, errors = load_snapshot(snapshot, environment)
    warnings = policy_set.warnings
    if skip_broken and (broken := [e for e in errors if broken_policy(e)]):
        errors = [e for e in errors if not broken_policy(e)]
        skipped = tuple(dict.fromkeys(f"{e.source}: document {e.index}" for e in broken))
        policy_set = replace(policy_set, skipped=skipped)
        warnings = (*warnings, *(f"skipped (--skip-broken): {e}" for e in broken))
    if not errors and policy_set.empty:
        errors.append(PolicyError(", ".join(snapshot.paths) or "--policies", None, None, "",
                                  EMPTY))
    return Loaded(Engine(policy_set, environment, settings), tuple(errors), warnings)


EMPTY = ("no policies found (expected GPUPolicy, ValidatingAdmissionPolicy, "
         "MutatingAdmissionPolicy or GPUQuota documents); an empty set would allow everything")
