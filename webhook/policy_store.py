"""The policy set being served, and its atomic hot reload.

Owns which files make the policy set (files, directories, a mounted ConfigMap), noticing that
they changed, deciding when a change may be loaded, and swapping the new engine in atomically —
or rejecting an update while the last good set keeps serving.

A policy source is whole or refused:

- **One snapshot.** Each check reads every policy file's bytes once
  (:func:`policies.policy.loader.read_policy_files`); the fingerprint is taken from those bytes and
  the set is built from the same bytes, so what is served is what was fingerprinted.
- **A quiet period.** A change is loaded only once two consecutive checks, at least ``quiet_s``
  apart on the store's clock, read the same bytes: a file being rewritten in place (truncated,
  then written) is seen changing and is never served half-written. A change therefore takes
  effect one check interval later (``--policy-reload-s``, 5 s by default).
- **Nothing dropped silently.** Any loader error rejects the update (an unreadable file, a broken
  document, a file with no policy document — 0 bytes, only comments or ``---``). So does a file
  that still exists but no longer holds a document (a policy, binding, param object, GPUQuota)
  that the set being served took from it, unless that document is now in another file: a
  truncated file and a deliberate deletion look alike, so a policy leaves the set only with its
  file (delete or rename the file) or at a restart. Edits inside a document are accepted when
  they load cleanly; a truncation that cuts a document where the rest is still a valid, smaller
  policy (a validation list losing its last entries at a line break) cannot be told from an edit
  and is caught only by the quiet periods below. A change that would be refused is refused as
  soon as it has held still for ``quiet_s``, even when it also removes content: it is never held
  for the longer period first (the error is said at once, not a minute later as a "removal").
- **A longer quiet period for removals.** A change that keeps a document in the same file but
  removes content from it — a field, a list entry (a validation, a match rule), the end of a
  string (:func:`policies.policy.revisions.lost_content`) — is what a file truncated at a line
  break, or half-written by a writer that stalled, looks like; it is held until the files have
  read the same for ``removal_quiet_s`` (``--policy-removal-quiet-s``, 60 s by default), logged
  as a warning naming what it removes, and shown in ``/readyz`` meanwhile. Edits that only add
  or change content load after the ordinary quiet period. A writer that stalls longer than
  ``removal_quiet_s`` in the middle of a file can still have its partial file served: write
  policy files atomically (a ConfigMap volume's symlink swap, or write then rename).

ConfigMap volumes: the kubelet writes each update into a new hidden ``..<timestamp>`` directory
and swaps the ``..data`` symlink; the visible files are symlinks through ``..data``. Directories
are walked skipping hidden (dot) entries, and changes are detected from the *content* of the
files as reached through their paths (not mtimes), so a swap is seen however the kubelet stamped
the files.

The identity of the served set (generation, ``sha256:`` content hash, policy count) is
:attr:`PolicySnapshot.identity`: ``/readyz``, the metrics and each decision log line show it.

Must not evaluate policies or parse policy files itself: the loader passed in
(:func:`gpuguard.policy_set.load` in the server) does that.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.engine.evaluation import Engine
from policies.policy.loader import read_policy_files
from policies.policy.model import PolicySet
from policies.policy.revisions import lost_content
from policies.sources import Snapshot

LOADED, UNCHANGED, REJECTED, RETRY, HELD = "loaded", "unchanged", "rejected", "retry", "held"


class LoadedPolicies(Protocol):
    """What a loader returns (:class:`gpuguard.policy_set.Loaded`)."""

    @property
    def engine(self) -> Engine:
        """The engine over the policies that loaded (``engine.policies.digest``: its hash)."""
        ...

    @property
    def errors(self) -> Sequence[Any]:
        """Every problem met, each rendering as one line with ``str()``."""
        ...

    @property
    def warnings(self) -> Sequence[str]:
        """Non-fatal findings (e.g. a native policy without a binding)."""
        ...


Loader = Callable[[Snapshot | None], LoadedPolicies]
"""Builds the policy set from a snapshot of the files (None: the built-in library)."""


@dataclass(frozen=True)
class PolicySnapshot:
    """One loaded policy set.

    Attributes:
        engine: evaluates requests against it (immutable, shared by concurrent requests).
        generation: 1 for the first load, +1 per accepted reload.
        files: the policy files read (empty for the built-in library).
        warnings: loader warnings.
        source: the snapshot of files (and cluster objects) the engine was built from, None
            for the built-in library: an evaluation process rebuilds the same engine from it
            (:mod:`webhook.evaluators`).
        loader: what built it from ``source``.
    """

    engine: Engine
    generation: int
    files: tuple[str, ...]
    warnings: tuple[str, ...]
    source: Snapshot | None = None
    loader: Loader | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The policy names, in evaluation order."""
        return self.engine.policies.names()

    @property
    def digest(self) -> str:
        """``sha256:<64 hex>`` of the bytes the set was built from (path and content of each
        file, in order)."""
        return self.engine.policies.digest

    @functools.cached_property
    def identity(self) -> Mapping[str, Any]:
        """``{"generation", "hash", "policies"}`` (policies: how many) — what ``/readyz``,
        the metrics and each decision log line say was served, plus ``skipped`` (``file:
        document N`` of each policy left out under ``--skip-broken``) when there are any.
        Built once; do not modify."""
        identity: dict[str, Any] = {"generation": self.generation, "hash": self.digest,
                                    "policies": len(self.names)}
        if self.engine.policies.skipped:
            identity["skipped"] = list(self.engine.policies.skipped)
        return identity


@dataclass(frozen=True)
class ReloadResult:
    """What a :meth:`PolicyStore.check` did.

    ``outcome`` is ``loaded`` (a new set is being served), ``unchanged`` (nothing to do, or the
    same rejected content as last time), ``rejected`` (``errors`` say why; the previous set keeps
    serving), ``retry`` (the files changed since the last check, or have not stayed the same
    for the quiet period yet: loaded at a later check once they hold still) or ``held`` (the
    change removes content, ``errors`` say what; loaded ``held_s`` seconds from now if the files
    still read the same; ``first`` is True at the first check that held this content).
    """

    outcome: str
    errors: tuple[str, ...] = ()
    snapshot: PolicySnapshot | None = None
    held_s: float = 0.0
    first: bool = False


def lost_documents(before: PolicySet, generation: int, after: PolicySet,
                   present: Sequence[str]) -> list[str]:
    """Why ``after`` may not replace ``before``: one message per file that is still there
    (in ``present``) but no longer holds documents ``before`` took from it, naming them.

    A document now in another file of ``after`` has moved, not gone. A file missing from
    ``present`` was removed: its documents leave with it.
    """
    now = {source: set(ids) for source, ids in after.contents}
    everywhere = set().union(*now.values()) if now else set()
    files = set(present)
    problems = []
    for source, ids in before.contents:
        if source not in files:
            continue
        missing = [i for i in ids if i not in now.get(source, ()) and i not in everywhere]
        if missing:
            problems.append(
                f"{source}: no longer holds {', '.join(missing)} (loaded from it in generation "
                f"{generation}); a file that loses a policy is refused, as a truncated or "
                "half-written file looks the same: to remove a policy delete or rename its "
                "file, or restart gpuguard")
    return problems


class PolicyStore:
    """Holds the :class:`PolicySnapshot` being served; loads and reloads it.

    ``check`` / ``load`` block (file reads, CEL compilation): call them from a worker thread.
    ``current`` is read from any thread; a swap is a single reference assignment, so a request
    sees the old or the new set, never a mix.

    Args:
        paths: policy files / directories, or None for the built-in library (never reloaded).
        loader: builds an engine from a snapshot of the files (None: the built-in library).
        clock: seconds on a monotonic clock (default :func:`time.monotonic`); tests pass a
            fake one.
        quiet_s: how long the files must read the same before a change is loaded, measured
            between checks (0: two consecutive checks suffice; see the module docstring).
        removal_quiet_s: how long they must read the same before a change that removes
            content from a document is loaded (seconds on ``clock``; 0: as ``quiet_s``).
    """

    def __init__(self, paths: Sequence[str] | None, loader: Loader, *,
                 clock: Callable[[], float] = time.monotonic, quiet_s: float = 0.0,
                 removal_quiet_s: float = 0.0) -> None:
        self.paths = tuple(paths) if paths else None
        self._loader = loader
        self._clock = clock
        self.quiet_s = quiet_s
        self.removal_quiet_s = removal_quiet_s
        self.held: tuple[str, ...] = ()  # what the change held for removal_quiet_s removes
        self._held_digest: str | None = None  # the pending content _losses was computed for
        self._losses: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._current: PolicySnapshot | None = None
        self._served: str | None = None  # digest of the files the current set was built from
        self._rejected: str | None = None  # digest of the last rejected content
        self._pending: tuple[str, float] | None = None  # (digest, first seen) of a change
        self.last_errors: tuple[str, ...] = ()

    @property
    def current(self) -> PolicySnapshot | None:
        """The set being served; None until the first successful load."""
        return self._current

    @property
    def reloadable(self) -> bool:
        """Whether policies come from files that can change (not the built-in library)."""
        return self.paths is not None

    @property
    def pending(self) -> bool:
        """Whether a change has been seen and waits for the files to hold still."""
        return self._pending is not None

    def describe(self) -> str:
        """Where policies come from, for logs."""
        return ", ".join(self.paths) if self.paths else "the built-in library"

    def load(self) -> ReloadResult:
        """Load now, from one read of the files, without waiting for a quiet period (the first
        load: there is nothing to serve meanwhile)."""
        with self._lock:
            snapshot = read_policy_files(self.paths) if self.paths is not None else None
            return self._build(snapshot)

    def check(self) -> ReloadResult:
        """Read the files once; load them if they changed and have held still since the
        previous check (see the module docstring)."""
        with self._lock:
            if self.paths is None:
                return ReloadResult(UNCHANGED)
            snapshot = read_policy_files(self.paths)
            digest = snapshot.digest
            if self._current is not None and digest == self._served:
                # Back to what is served (a broken or half-written update was reverted).
                self._rejected, self.last_errors = None, ()
                self._clear_pending()
                return ReloadResult(UNCHANGED)
            if digest == self._rejected:
                self._clear_pending()
                return ReloadResult(UNCHANGED)
            waiting = self._wait(snapshot, self._current.source if self._current else None)
            return waiting if waiting is not None else self._build(snapshot)

    def _wait(self, files: Snapshot, served: Snapshot | None) -> ReloadResult | None:
        """Whether changed ``files`` must wait (the quiet periods of the module docstring,
        against ``served``, the files of the set being served): the ``retry`` or ``held``
        result, or None when they may be loaded now. Call under the lock."""
        now, digest = self._clock(), files.digest
        if self._pending is None or self._pending[0] != digest:
            self._clear_pending()
            self._pending = (digest, now)
            return ReloadResult(RETRY)
        still = now - self._pending[1]
        if still < self.quiet_s:
            return ReloadResult(RETRY)
        if served is not None and still < self.removal_quiet_s:
            first = self._held_digest != digest
            if first:  # parsed once per pending content, not at every check of the hold
                try:
                    self._losses = tuple(lost_content(served, files))
                except Exception as exc:  # a comparison bug holds the change, never serves it
                    self._losses = (f"the change could not be compared with the set served "
                                    f"({type(exc).__name__}: {exc})",)
                self._held_digest = digest
                if self._losses and self._refused(files):
                    self._clear_pending()
                    return None  # broken as well: the build refuses it now, not after a hold
            if self._losses:
                self.held = self._losses
                return ReloadResult(HELD, self._losses, held_s=self.removal_quiet_s - still,
                                    first=first)
        self._clear_pending()
        return None

    def _refused(self, files: Snapshot) -> bool:
        """Whether building the set from ``files`` would be refused (a loader error, a document
        lost from a file that is still there; see :meth:`_build`). Asked once per pending
        change, before a hold: a change that is broken as well as shorter is refused at
        once, naming its error, instead of being held for ``removal_quiet_s`` first. A loader
        that raises counts as refused (the build then says why). Call under the lock."""
        try:
            loaded = self._loader(files)
        except Exception:
            return True
        if loaded.errors:
            return True
        current = self._current
        return current is not None and bool(lost_documents(
            current.engine.policies, current.generation, loaded.engine.policies,
            [f.path for f in files.files]))

    def _clear_pending(self) -> None:
        self._pending, self.held, self._held_digest, self._losses = None, (), None, ()

    def _build(self, snapshot: Snapshot | None) -> ReloadResult:
        errors: list[str] = []
        loaded: LoadedPolicies | None = None
        try:
            loaded = self._loader(snapshot)
        except Exception as exc:  # a loader bug must not take the server down
            errors.append(f"loading failed: {type(exc).__name__}: {exc}")
        else:
            errors.extend(str(e) for e in loaded.errors)
            if self._current is not None and snapshot is not None:
                errors.extend(lost_documents(
                    self._current.engine.policies, self._current.generation,
                    loaded.engine.policies, [f.path for f in snapshot.files]))
        digest = snapshot.digest if snapshot is not None else \
            (loaded.engine.policies.digest if loaded is not None else "")
        if errors or loaded is None:
            self._rejected = digest
            self.last_errors = tuple(errors)
            return ReloadResult(REJECTED, tuple(errors))
        generation = self._current.generation + 1 if self._current else 1
        served = PolicySnapshot(loaded.engine, generation,
                                tuple(f.path for f in snapshot.files) if snapshot else (),
                                tuple(loaded.warnings), snapshot, self._loader)
        self._current = served
        self._served = digest
        self._rejected = None
        self.last_errors = ()
        return ReloadResult(LOADED, snapshot=served)
