"""The served set from policy files and the cluster's gpuguard.io objects (--cluster-policies).

Owns :class:`ClusterPolicyStore`, a :class:`~webhook.policy_store.PolicyStore` whose set is the
``--policies`` files merged with the GPUPolicy / GPUQuota / GPUPolicyException objects of a
watch (:class:`kube.policy_objects.PolicyObjectWatch`), with the rules of both sources:

- The files keep theirs (:mod:`webhook.policy_store`): whole or refused, a change loaded once it
  holds still for two checks (for ``removal_quiet_s`` when it removes content from a document),
  a file that loses a document refused. A refused file update leaves
  the files last served in the set; the objects' changes are still applied over them.
- The objects are whole or refused **each** (:func:`kube.served_set.merge`): an object with an
  error is left out (its last accepted version served in its place), the rest are served. A
  change of an object is applied at the next check — at once when the watch wakes the server
  (:class:`webhook.server.Server` ``policy_objects``), so a ``kubectl apply`` is enforced within
  a second or two.

The served set keeps one identity (generation, ``sha256:`` hash of the files and of each served
object, policy count: :attr:`~webhook.policy_store.PolicySnapshot.identity`) for ``/readyz``, the
metrics and the decision log. ``last_errors`` (``rejectedUpdate`` in ``/readyz``) lists a rejected
file update and each refused object. After each check the merge is handed to the status
publisher (:class:`kube.policy_status.StatusPublisher`), which writes the objects' conditions.

Must not talk to the API server itself: the watch and the publisher do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from kube.policy_objects import PolicyObject
from kube.served_set import Merge, merge
from policies.policy.loader import read_policy_files
from policies.sources import Snapshot
from webhook.policy_store import (
    LOADED,
    REJECTED,
    UNCHANGED,
    Loader,
    PolicySnapshot,
    PolicyStore,
    ReloadResult,
    lost_documents,
)

LOG = logging.getLogger("gpuguard.webhook.cluster_store")


class ObjectSource(Protocol):
    """The cluster's policy objects (:class:`kube.policy_objects.PolicyObjectWatch`)."""

    def objects(self) -> list[PolicyObject]:
        """The current objects, sorted by key."""
        ...

    @property
    def synced(self) -> bool:
        """Whether every resource has been listed once."""
        ...

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)``."""
        ...


class Publisher(Protocol):
    """Receives each merge (:class:`kube.policy_status.StatusPublisher`)."""

    def publish(self, objects: Sequence[PolicyObject], result: Merge, serving: bool) -> None:
        """Bring the objects' status in line with ``result`` (``serving``: it is served)."""
        ...


_NO_FILES = Snapshot((), ())


class ClusterPolicyStore(PolicyStore):
    """The files of ``paths`` (none: no files, not the built-in library) merged with ``objects``.

    Args:
        paths: policy files / directories, or None for none.
        loader: as for :class:`~webhook.policy_store.PolicyStore` (a snapshot in, never None).
        objects: the cluster's objects; nothing is loaded before it has synced (an unsynced
            watch would serve a set without the cluster's policies).
        publisher: gets each merge (status conditions); None: no status is written.
        clock / quiet_s / removal_quiet_s: as for :class:`~webhook.policy_store.PolicyStore`
            (the files' quiet periods; objects need none: the API server writes them whole).
    """

    def __init__(self, paths: Sequence[str] | None, loader: Loader, objects: ObjectSource, *,
                 publisher: Publisher | None = None,
                 clock: Callable[[], float] = time.monotonic, quiet_s: float = 0.0,
                 removal_quiet_s: float = 0.0) -> None:
        super().__init__(paths, loader, clock=clock, quiet_s=quiet_s,
                         removal_quiet_s=removal_quiet_s)
        self.objects = objects
        self.publisher = publisher
        self._files: Snapshot | None = None  # the files in the set being served
        self._accepted: dict[str, PolicyObject] = {}  # the version of each object served
        self._input: tuple[str, tuple[tuple[str, bytes], ...]] | None = None  # last merged
        self._file_errors: tuple[str, ...] = ()  # of the last rejected file update
        self.last_merge: Merge | None = None
        self._status: tuple[Sequence[PolicyObject], Merge, bool] | None = None  # to publish
        self._status_lock = threading.Lock()

    @property
    def reloadable(self) -> bool:
        """Always: objects change."""
        return True

    def describe(self) -> str:
        """Where policies come from, with the watch's state (for logs and ``/readyz``)."""
        files = ", ".join(self.paths) if self.paths else "no files"
        return f"{files} and the cluster's gpuguard.io objects ({self.objects.status()[1]})"

    def _read_files(self) -> Snapshot:
        return read_policy_files(self.paths) if self.paths is not None else _NO_FILES

    def load(self) -> ReloadResult:
        """Load now (the first load), once the objects have synced."""
        with self._lock:
            result = self._merge(self._read_files(), new_files=True)
        self._write_status()
        return result

    def check(self) -> ReloadResult:
        """Read the files and the objects; load what changed (see the module docstring); then
        hand the merge to the publisher (after the new set is served: status writes never delay
        enforcement)."""
        with self._lock:
            result = self._check()
        self._write_status()
        return result

    def _check(self) -> ReloadResult:
        """The check itself (under the lock)."""
        files = self._read_files()
        served = self._files
        if served is None:
            return self._merge(files, new_files=True)
        digest = files.digest
        waiting: ReloadResult | None = None
        if digest == served.digest:
            self._rejected, self._file_errors = None, ()
            self._clear_pending()
            chosen = served
        elif digest == self._rejected:
            self._clear_pending()
            chosen = served
        else:
            waiting = self._wait(files, served)
            chosen = served if waiting is not None else files
        result = self._merge(chosen, new_files=chosen is not served)
        if result.outcome == UNCHANGED and waiting is not None:
            return waiting
        if waiting is not None and waiting.first:
            self._held_digest = None  # an object change was loaded: announce the hold next time
        return result

    def _refused(self, files: Snapshot) -> bool:
        """Whether the files' change would be refused, merged with the objects as
        :meth:`_merge` would (a file error, a document lost from a file that is still there):
        the files alone are not the set, as a binding or param may live in the cluster."""
        if not self.objects.synced:
            return False  # nothing can be merged yet: the hold stands
        try:
            result = merge(files, self.objects.objects(), self._accepted, self._loader)
        except Exception:
            return True  # the merge then says why
        if result.file_errors:
            return True
        current = self._current
        return current is not None and bool(lost_documents(
            current.engine.policies, current.generation, result.built.engine.policies,
            [f.path for f in files.files]))

    def _merge(self, files: Snapshot, *, new_files: bool) -> ReloadResult:
        if not self.objects.synced:
            _, detail = self.objects.status()
            self.last_errors = (f"the cluster's policy objects: {detail}",)
            return ReloadResult(REJECTED, self.last_errors) if self._current is None \
                else ReloadResult(UNCHANGED)
        objects = self.objects.objects()
        key = (files.digest, tuple(o.served_content for o in objects))
        if key == self._input:  # the same input as the last merge: its verdict stands
            if self._current is None:
                return ReloadResult(UNCHANGED)
            if self.last_merge is not None:
                self.last_errors = (*self._file_errors, *self.last_merge.object_errors())
            self._publish(objects, serving=True)
            return ReloadResult(UNCHANGED)
        try:
            result = merge(files, objects, self._accepted, self._loader)
        except Exception as exc:  # a loader bug must not take the server down
            self.last_errors = (f"loading failed: {type(exc).__name__}: {exc}",)
            return ReloadResult(REJECTED, self.last_errors)
        before = self.last_merge.errors_by_key if self.last_merge is not None else {}
        for refused, lines in result.errors_by_key.items():
            if before.get(refused) != lines:  # once per refused version, not at every check
                LOG.error("policy object refused", extra={"fields": {
                    "object": refused, "errors": list(lines),
                    "served_instead": "its last accepted version" if refused in result.served
                    else "nothing"}})
        errors = list(result.file_errors)
        current = self._current
        if current is not None and new_files and not errors:
            errors.extend(lost_documents(current.engine.policies, current.generation,
                                         result.built.engine.policies,
                                         [f.path for f in files.files]))
        if errors:
            if new_files and self._files is not None:  # keep the files last served
                self._rejected, self._file_errors = files.digest, tuple(errors)
                inner = self._merge(self._files, new_files=False)
                return inner if inner.outcome == LOADED else ReloadResult(REJECTED, tuple(errors))
            self._input = key
            self.last_merge = result
            self.last_errors = (*errors, *result.object_errors())
            self._publish(objects, serving=False)
            return ReloadResult(REJECTED, tuple(errors))
        self._input = key
        self.last_merge = result
        self.last_errors = (*self._file_errors, *result.object_errors())
        self._files = files
        self._accepted = dict(result.served)
        engine = result.built.engine
        if current is not None and engine.policies.digest == current.digest:
            self._publish(objects, serving=True)  # e.g. a broken object refused again
            return ReloadResult(UNCHANGED)
        snapshot = PolicySnapshot(engine, current.generation + 1 if current else 1,
                                  (*(f.path for f in files.files),
                                   *(o.source for o in result.served.values())),
                                  tuple(result.built.warnings), result.snapshot,
                                  self._loader)
        self._current = snapshot
        self._served = files.digest
        self._publish(objects, serving=True)
        return ReloadResult(LOADED, snapshot=snapshot)

    def _publish(self, objects: Sequence[PolicyObject], *, serving: bool) -> None:
        if self.last_merge is not None:
            self._status = (objects, self.last_merge, serving)

    def _write_status(self) -> None:
        with self._status_lock:  # one publisher call at a time, the latest merge
            status, self._status = self._status, None
            if self.publisher is None or status is None:
                return
            try:
                self.publisher.publish(*status)
            except Exception:  # a status write must never stop serving
                LOG.exception("writing the policy objects' status failed")
