"""The served set from policy files and cluster objects, whole-or-refused per object.

Owns merging a snapshot of the ``--policies`` files with the gpuguard.io objects of the cluster
(:mod:`kube.policy_objects`) into one input of the loader, and deciding, per object, whether it
is served:

- Each object is one in-memory policy file named ``cluster:Kind/name``
  (:meth:`~kube.policy_objects.PolicyObject.source_file`), after the files: the loader's
  errors name their source, so an error of an object is that object's alone, and a name that
  a file already uses is refused on the object (files come first).
- An object with an error is **refused**: left out, and its last accepted version (same uid,
  an earlier generation) is served in its place when there is one, so breaking a policy in
  the cluster keeps its last good version enforced. The set is built again without it, until
  no object has an error (each round drops or replaces at least one object, so at most one
  round per object).
- An error that names no object (a file's, or the set being empty) is the files' (whole or
  refused, as :mod:`webhook.policy_store` does for files): :attr:`Merge.file_errors`.

The digest of the set (:attr:`policies.sources.Snapshot.digest`) covers the files and the
served version of each object, so ``/readyz``, the metrics and the decision log name exactly
what is served. :func:`conditions` turns a merge into each object's ``Accepted`` / ``Ready``
status conditions (``metav1.Condition``).

Must not talk to the API server (the watch and :mod:`kube.policy_status` do) or read the clock:
times are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube.policy_objects import SOURCE_PREFIX, PolicyObject
from policies.sources import Snapshot

ACCEPTED, READY = "Accepted", "Ready"
MAX_MESSAGE = 32768  # metav1.Condition.message maxLength


class Built(Protocol):
    """What the loader returns (:class:`gpuguard.policy_set.Loaded`): ``errors`` whose items
    carry ``source`` and ``path`` (:class:`policies.policy.loader.PolicyError`)."""

    @property
    def errors(self) -> Sequence[Any]:
        """Every problem met."""
        ...


@dataclass(frozen=True)
class Refusal:
    """Why one version of an object is not served.

    Attributes:
        generation: the refused ``metadata.generation``.
        errors: ``(field path, message)`` per problem, the path as the loader names it
            (``spec.validations[0].expression``; "" for the whole object).
    """

    generation: int
    errors: tuple[tuple[str, str], ...]

    def message(self) -> str:
        """One line per error, ``path: message``, cut to a Condition's message limit."""
        text = "\n".join(f"{path}: {message}" if path else message
                         for path, message in self.errors)
        return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


@dataclass(frozen=True)
class Merge:
    """One merge of files and objects.

    Attributes:
        snapshot: what the loader was given last (files, then the served objects).
        built: the loader's result for it.
        served: the version of each object in the set, by key (the current one, or the last
            accepted in place of a refused one).
        refused: why the current version of each refused object is not served, by key.
        file_errors: errors naming no object (the files' or the whole set's), as strings.
    """

    snapshot: Snapshot
    built: Any
    served: Mapping[str, PolicyObject]
    refused: Mapping[str, Refusal]
    file_errors: tuple[str, ...] = ()
    errors_by_key: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def object_errors(self) -> list[str]:
        """Every refusal as one line per error: ``cluster:Kind/name: path: message``."""
        return [line for lines in self.errors_by_key.values() for line in lines]


def combined(files: Snapshot, objects: Sequence[PolicyObject]) -> Snapshot:
    """``files`` followed by each object as an in-memory file (see the module docstring)."""
    return Snapshot(files.paths, (*files.files, *(o.source_file() for o in objects)),
                    files.errors)


def _owner(error: Any, keys: Mapping[str, str]) -> str | None:
    source = str(getattr(error, "source", ""))
    return keys.get(source) if source.startswith(SOURCE_PREFIX) else None


def merge(files: Snapshot, objects: Sequence[PolicyObject],
          accepted: Mapping[str, PolicyObject], build: Callable[[Snapshot], Built]) -> Merge:
    """Build the set of ``files`` and ``objects``, refusing objects with errors.

    Args:
        files: the policy files read (or an empty snapshot).
        objects: the current version of each object (any order; served sorted by key).
        accepted: the last version of each object that was served, by key: put in place of a
            refused current version when it is the same object (uid) at another generation.
        build: the loader.

    Returns:
        The merge; a loader exception propagates (the store reports it).
    """
    chosen = {o.key: o for o in sorted(objects, key=lambda o: o.key)}
    current = dict(chosen)
    refused: dict[str, Refusal] = {}
    lines: dict[str, tuple[str, ...]] = {}
    while True:
        snapshot = combined(files, list(chosen.values()))
        built = build(snapshot)
        keys = {o.source: key for key, o in chosen.items()}
        by_key: dict[str, list[Any]] = {}
        for error in built.errors:
            owner = _owner(error, keys)
            if owner is not None:
                by_key.setdefault(owner, []).append(error)
        if not by_key:
            break
        for key, errors in by_key.items():
            version = chosen[key]
            if version is current.get(key):  # the current version: refused, say why
                refused[key] = Refusal(version.generation, tuple(
                    (str(getattr(e, "path", "")), str(getattr(e, "message", e)))
                    for e in errors))
                lines[key] = tuple(str(e) for e in errors)
                previous = accepted.get(key)
                if previous is not None and previous.uid == version.uid and \
                        previous.data != version.data:
                    chosen[key] = previous
                    continue
            del chosen[key]  # no earlier version, or the earlier one fails now too
    file_errors = tuple(str(e) for e in built.errors if _owner(e, keys) is None)
    return Merge(snapshot, built, dict(chosen), refused, file_errors, lines)


def _condition(kind: str, status: bool, reason: str, message: str, generation: int,
               previous: Sequence[Mapping[str, Any]], now: str) -> dict[str, Any]:
    """A metav1.Condition; ``lastTransitionTime`` kept from ``previous`` while the status
    stays the same (so rewriting the same verdict writes the same bytes)."""
    before = next((c for c in previous if c.get("type") == kind), None)
    status_text = "True" if status else "False"
    since = str(before.get("lastTransitionTime")) if before is not None and \
        before.get("status") == status_text and before.get("lastTransitionTime") else now
    return {"type": kind, "status": status_text, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


def conditions(obj: PolicyObject, result: Merge, *, serving: bool, now: str,
               ) -> tuple[int, list[dict[str, Any]]]:
    """``(observedGeneration, conditions)`` of ``obj`` after ``result``.

    ``Accepted``: whether the current generation compiled (False: the errors, ``path:
    message`` per line). ``Ready``: whether a version of the object is served — True with
    reason ``Served`` for the current generation, ``ServingPreviousGeneration`` while a refused
    update leaves the last accepted one enforced (its ``observedGeneration`` that one's).
    ``serving`` False (the set the merge built is not served: the files' update was rejected)
    keeps ``Ready`` at what it said before.

    Args:
        now: RFC 3339 time (``2026-12-02T03:00:00Z``) for a condition whose status changes.
    """
    previous = obj.conditions
    refusal = result.refused.get(obj.key)
    if refusal is None:
        accepted = _condition(ACCEPTED, True, "Compiled", "the policy compiled and is in the "
                              "served set", obj.generation, previous, now)
    else:
        accepted = _condition(ACCEPTED, False, "Invalid", refusal.message(), obj.generation,
                              previous, now)
    served = result.served.get(obj.key)
    if not serving:
        ready = next((dict(c) for c in previous if c.get("type") == READY), None) or \
            _condition(READY, False, "Pending", "the served set has not been updated yet",
                       obj.generation, previous, now)
    elif served is None:
        ready = _condition(READY, False, "NotServed", "no version of this object is served "
                           "(see Accepted)", obj.generation, previous, now)
    elif served.generation == obj.generation and served.data == obj.data:
        ready = _condition(READY, True, "Served", "served by gpuguard", obj.generation,
                           previous, now)
    else:
        ready = _condition(READY, True, "ServingPreviousGeneration",
                           f"generation {served.generation} is served; generation "
                           f"{obj.generation} was refused (see Accepted)",
                           served.generation, previous, now)
    return obj.generation, [accepted, ready]


def status_differs(obj: PolicyObject, generation: int,
                   wanted: Sequence[Mapping[str, Any]]) -> bool:
    """Whether writing ``(generation, wanted)`` would change the object's status: a writer
    writes only then (no write storms: a status write is a MODIFIED event of its own)."""
    if obj.status_generation != generation:
        return True
    held = {str(c.get("type")): dict(c) for c in obj.conditions}
    return any(held.get(str(c["type"])) != dict(c) for c in wanted)
