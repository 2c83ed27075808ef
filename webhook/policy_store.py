"""The policy set being served, and its atomic hot reload.

Owns which files make the policy set (files, directories, a mounted ConfigMap), noticing that
they changed, loading them off the event loop, and swapping the new engine in atomically — or
rejecting a broken update (any policy error) while the last good set keeps serving.

ConfigMap volumes: the kubelet writes each update into a new hidden ``..<timestamp>`` directory
and swaps the ``..data`` symlink; the visible files are symlinks through ``..data``. Directories are
therefore walked skipping hidden (dot) entries, and changes are detected from the *content* of
the files as reached through their paths (not mtimes), so a swap is seen however the kubelet
stamped the files. A swap that lands while a load is reading is detected (the fingerprint taken
before and after differ) and the load is retried on the next check instead of serving a mix.

Must not evaluate policies or parse policy files itself: the loader passed in
(:func:`gpuguard.policy_set.load` in the server) does that.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from policies.engine import Engine

POLICY_SUFFIXES = (".yaml", ".yml", ".json", ".yaml.gz", ".yml.gz", ".json.gz")
LOADED, UNCHANGED, REJECTED, RETRY = "loaded", "unchanged", "rejected", "retry"


class LoadedPolicies(Protocol):
    """What a loader returns (:class:`gpuguard.policy_set.Loaded`)."""

    @property
    def engine(self) -> Engine:
        """The engine over the policies that loaded."""
        ...

    @property
    def errors(self) -> Sequence[Any]:
        """Every problem met, each rendering as one line with ``str()``."""
        ...

    @property
    def warnings(self) -> Sequence[str]:
        """Non-fatal findings (e.g. a native policy without a binding)."""
        ...


Loader = Callable[[Sequence[str] | None], LoadedPolicies]


@dataclass(frozen=True)
class PolicySnapshot:
    """One loaded policy set.

    Attributes:
        engine: evaluates requests against it (immutable, shared by concurrent requests).
        generation: 1 for the first load, +1 per accepted reload.
        files: the policy files read (empty for the built-in library).
        warnings: loader warnings.
    """

    engine: Engine
    generation: int
    files: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The policy names, in evaluation order."""
        return self.engine.policies.names()


@dataclass(frozen=True)
class ReloadResult:
    """What a :meth:`PolicyStore.check` did.

    ``outcome`` is ``loaded`` (a new set is being served), ``unchanged`` (nothing to do, or the
    same broken content as last time), ``rejected`` (``errors`` say why; the previous set keeps
    serving) or ``retry`` (the files changed while being read; checked again next time).
    """

    outcome: str
    errors: tuple[str, ...] = ()
    snapshot: PolicySnapshot | None = None


def expand(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """The policy files under ``paths``, sorted per path, and an error per missing path.

    Directories are walked recursively, skipping hidden entries (``..data``, ``..2024_…``)
    so that a ConfigMap mount yields each key once; files ending in ``.yaml``, ``.yml``,
    ``.json`` (or those plus ``.gz``) are kept. A path given explicitly is read whatever its
    name.
    """
    files: list[str] = []
    errors: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            files.append(raw)
        elif path.is_dir():
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found.extend(os.path.join(root, n) for n in names
                             if not n.startswith(".") and n.endswith(POLICY_SUFFIXES))
            files.extend(sorted(found))
        else:
            errors.append(f"{raw}: no such file or directory")
    return files, errors


def fingerprint(paths: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``(file, sha256 of its content)`` for every policy file (missing paths included)."""
    files, errors = expand(paths)
    result = [(e, "missing") for e in errors]
    for file in files:
        try:
            digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()
        except OSError as exc:
            digest = f"unreadable: {exc.strerror}"
        result.append((file, digest))
    return tuple(result)


class PolicyStore:
    """Holds the :class:`PolicySnapshot` being served; loads and reloads it.

    ``check`` / ``load`` block (file reads, CEL compilation): call them from a worker thread.
    ``current`` is read from any thread; a swap is a single reference assignment, so a request
    sees the old or the new set, never a mix.

    Args:
        paths: policy files / directories, or None for the built-in library (never reloaded).
        loader: builds an engine from files (None: the built-in library).
    """

    def __init__(self, paths: Sequence[str] | None, loader: Loader) -> None:
        self.paths = tuple(paths) if paths else None
        self._loader = loader
        self._lock = threading.Lock()
        self._current: PolicySnapshot | None = None
        self._served: tuple[tuple[str, str], ...] | None = None
        self._rejected: tuple[tuple[str, str], ...] | None = None
        self.last_errors: tuple[str, ...] = ()

    @property
    def current(self) -> PolicySnapshot | None:
        """The set being served; None until the first successful load."""
        return self._current

    @property
    def reloadable(self) -> bool:
        """Whether policies come from files that can change (not the built-in library)."""
        return self.paths is not None

    def describe(self) -> str:
        """Where policies come from, for logs."""
        return ", ".join(self.paths) if self.paths else "the built-in library"

    def load(self) -> ReloadResult:
        """Load now, whatever the files' state (the first load)."""
        with self._lock:
            return self._load(force=True)

    def check(self) -> ReloadResult:
        """Load again if the files changed since the set being served (or last rejected)."""
        with self._lock:
            return self._load(force=False)

    def _load(self, *, force: bool) -> ReloadResult:
        before = fingerprint(self.paths) if self.paths is not None else ()
        if not force and self._current is not None and before == self._served:
            self._rejected, self.last_errors = None, ()  # a broken update was reverted
            return ReloadResult(UNCHANGED)
        if not force and before == self._rejected:
            return ReloadResult(UNCHANGED)
        files: list[str] = []
        errors: list[str] = []
        if self.paths is not None:
            files, errors = expand(self.paths)
        loaded: LoadedPolicies | None = None
        if not errors:
            try:
                loaded = self._loader(files if self.paths is not None else None)
            except Exception as exc:  # a loader bug must not take the server down
                errors.append(f"loading failed: {type(exc).__name__}: {exc}")
            else:
                errors.extend(str(e) for e in loaded.errors)
        after = fingerprint(self.paths) if self.paths is not None else ()
        if after != before:
            return ReloadResult(RETRY)
        if errors or loaded is None:
            self._rejected = before
            self.last_errors = tuple(errors)
            return ReloadResult(REJECTED, tuple(errors))
        generation = self._current.generation + 1 if self._current else 1
        snapshot = PolicySnapshot(loaded.engine, generation, tuple(files),
                                  tuple(loaded.warnings))
        self._current = snapshot
        self._served = before
        self._rejected = None
        self.last_errors = ()
        return ReloadResult(LOADED, snapshot=snapshot)
