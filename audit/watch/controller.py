"""The audit controller: keeps gpuguard's PolicyReports current as the cluster changes.

Owns deciding *what* to evaluate again and *when* to write, for ``gpuguard audit --watch``:

- **Input.** Lists (:meth:`WatchController.listed`), watch events (:meth:`WatchController.event`)
  and policy set changes (:meth:`WatchController.policies`) go into an
  :class:`audit.watch.store.ObjectStore`; each marks the namespaces it touches dirty. Nothing
  is published before every watched resource has been listed once (or found not served): a
  partial view would delete reports that are still true, as ``--write-reports`` refuses to.
- **Namespace evaluation.** A dirty namespace is scanned again from the store with the batch
  audit's own code (:class:`audit.scan.scanner.Scanner`, :func:`audit.report.assemble.assemble`,
  :func:`audit.report.policy_reports.namespace_reports`), through an
  :class:`audit.scan.compliance.EvaluationMemo`: the policy engine runs only for the objects that
  changed (a pod, its owner's template); the rest of the namespace is a lookup. A new policy set
  starts a new memo and marks every namespace dirty.
- **Full evaluation.** The cluster-wide figures (nodes, stranded GPUs, MIG, quotas, teams: the
  ClusterPolicyReport and the metrics) are computed by a scan of the whole store, with the memo
  (no policy is evaluated again for an unchanged object): at the first publish, after a policy
  set change, and then, while anything changed, no sooner than ``full_every_s`` — nor than
  three times the last one's duration — after the last one ended.
- **Writes.** A report is written only when its content (timestamps aside) differs from what
  was last written — one write per changed report, never one object per finding — and at most
  once per ``report_interval_s`` per report, within ``writes_per_s`` for all of them (a token
  bucket on the injected clock); changes within the interval are folded into one write. A
  namespace with nothing left to report has its report deleted. A failed write stays pending
  and is tried again after the interval. After the first complete publish, gpuguard's reports
  of namespaces the cluster no longer has are pruned (:meth:`kube.policy_reports.ReportWriter
  .prune`).

Time comes from the caller (``clock``: monotonic seconds; ``wall``: the audit's date for
exceptions and report timestamps): the controller never sleeps or reads the clock itself, so
tests drive it event by event. Single-threaded: the watch threads hand their events to the
loop that calls it (``gpuguard.audit_watch``).

Must not talk to the cluster itself (the ``sink`` writes), start threads or serve HTTP.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from audit.report import policy_reports
from audit.report.assemble import assemble
from audit.scan.compliance import EvaluationMemo
from audit.scan.scanner import Scanner
from audit.scan.utilization import Metrics
from audit.settings import AuditSettings
from audit.watch.store import Change, ObjectStore
from policies.engine.evaluation import Engine
from policies.policy.quota import Quota

_LOG = logging.getLogger("gpuguard.audit.watch")

ReportKey = tuple[str, str | None, str]  # kind, namespace, name


class Outcome(Protocol):
    """What a sink answers for one write or delete (:class:`kube.policy_reports.WriteResult`)."""

    @property
    def action(self) -> str:
        """``created``, ``replaced``, ``deleted`` or ``failed``."""
        ...

    @property
    def message(self) -> str:
        """Why it failed (empty otherwise)."""
        ...


class ReportSink(Protocol):
    """Where reports go (:class:`kube.policy_reports.ReportWriter`)."""

    def write(self, report: Mapping[str, Any]) -> Outcome:
        """Create or replace one report object."""
        ...

    def delete(self, kind: str, namespace: str | None, name: str) -> Outcome:
        """Delete one report object."""
        ...

    def prune(self, written: Iterable[Mapping[str, Any]], *, name: str,
              labels: Mapping[str, str]) -> list[Any]:
        """Delete gpuguard's PolicyReports of namespaces ``written`` has none for."""
        ...


@dataclass(frozen=True)
class PolicyUpdate:
    """A policy set to audit by from now on: its engine, its GPUQuotas and its identity
    (``sha256:`` digest, for logs and the metrics)."""

    engine: Engine
    quotas: tuple[Quota, ...]
    digest: str


class PolicySource(Protocol):
    """Where the controller's policy set comes from; polled by the loop.

    The files of ``--policies`` (reloaded as ``gpuguard serve`` does:
    :class:`gpuguard.audit_watch.FilePolicySource`) are one; a source of policies read from the
    cluster's CRDs plugs in the same way. "The policy set changed" is all the controller needs:
    it then evaluates every object again.
    """

    def poll(self) -> PolicyUpdate | None:
        """The new policy set when it changed since the last call (and loaded cleanly), else
        None. Must not raise: a broken update is logged by the source and the last good set
        stays."""
        ...


@dataclass(frozen=True)
class WatchSettings:
    """How the controller paces itself (``gpuguard audit --watch`` flags).

    Attributes:
        report_interval_s: the shortest time between two writes of one report (seconds).
        full_every_s: the shortest time between two full evaluations (seconds).
        writes_per_s: report writes per second for all reports together (token bucket; its
            burst is the same number).
    """

    report_interval_s: float = 5.0
    full_every_s: float = 60.0
    writes_per_s: float = 20.0


@dataclass
class _Pending:
    """A report to write (``body``) or delete (None), and since when (monotonic s) the change
    it carries waits."""

    body: dict[str, Any] | None
    since: float


@dataclass
class Counts:
    """What the controller did, for the metrics and tests."""

    events: dict[str, int] = field(default_factory=dict)  # kind -> events that changed
    lists: dict[str, int] = field(default_factory=dict)  # kind -> lists applied
    namespace_evaluations: int = 0
    full_evaluations: int = 0
    writes: dict[str, int] = field(default_factory=dict)  # action -> count
    latencies: list[float] = field(default_factory=list)  # seconds, change -> write, per write


def canonical(report: Mapping[str, Any]) -> str:
    """The content of a report object that a write would change: everything but the results'
    timestamps (each evaluation stamps its own time) and server-set metadata."""
    metadata = {k: v for k, v in (report.get("metadata") or {}).items()
                if k not in ("resourceVersion", "uid", "creationTimestamp", "generation",
                             "managedFields")}
    results = [{k: v for k, v in r.items() if k != "timestamp"}
               for r in report.get("results") or []]
    return json.dumps({**report, "metadata": metadata, "results": results}, sort_keys=True)


def _key(report: Mapping[str, Any]) -> ReportKey:
    metadata = report.get("metadata") or {}
    return (str(report.get("kind")), metadata.get("namespace"), str(metadata.get("name")))


class WatchController:
    """Keeps PolicyReports current from list / watch events (see module docstring).

    Args:
        settings: the audit settings (``now`` is replaced by ``wall()`` at each evaluation;
            ``jobs`` is ignored: evaluations run in this process, through the memo).
        update: the first policy set.
        sink: where reports are written.
        expected: the ``(group, kind)`` of every watched resource: nothing is published before
            each was listed once or found not served.
        clock: monotonic seconds (pacing).
        wall: the current time (exception expiry, report timestamps).
        watch: pacing settings.
        on_full: called with the whole report after each full evaluation (the metrics).
        utilization: DCGM metrics for each full evaluation (read again each time: idle GPUs),
            or None without them.
    """

    def __init__(self, settings: AuditSettings, update: PolicyUpdate, sink: ReportSink,
                 expected: Iterable[tuple[str, str]], *, clock: Callable[[], float],
                 wall: Callable[[], datetime.datetime],
                 watch: WatchSettings | None = None,
                 on_full: Callable[[Mapping[str, Any]], None] | None = None,
                 utilization: Callable[[], Metrics | None] | None = None) -> None:
        self.settings = dataclasses.replace(settings, jobs=0)
        self.store = ObjectStore()
        self.counts = Counts()
        self._sink = sink
        self._clock = clock
        self._wall = wall
        watch = watch if watch is not None else WatchSettings()
        self._watch = watch
        self._on_full = on_full
        self._utilization = utilization
        self._expected = set(expected)
        self._listed: set[tuple[str, str]] = set()
        self._update = update
        self._memo = EvaluationMemo()
        self._dirty: dict[str, float] = {}  # namespace -> when it became dirty
        self._cluster_dirty_since: float | None = None
        self._full_needed = True
        self._last_full: float | None = None
        self._full_gap = watch.full_every_s
        self._published = False  # a complete publish happened (prune may run)
        self._pruned = False
        self._pending: dict[ReportKey, _Pending] = {}
        self._written: dict[ReportKey, str] = {}  # last written content (canonical)
        self._last_write: dict[ReportKey, float] = {}
        self._tokens = watch.writes_per_s
        self._tokens_at = clock()
        self.last_report: Mapping[str, Any] | None = None

    # --- input ---------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Every expected resource was listed (or found not served) at least once."""
        return self._expected <= self._listed

    def _mark(self, change: Change, at: float | None = None) -> None:
        now = self._clock() if at is None else at
        for namespace in change.namespaces:
            self._dirty.setdefault(namespace, now)
        if change.cluster and self._cluster_dirty_since is None:
            self._cluster_dirty_since = now

    def listed(self, group: str, kind: str, items: Iterable[Mapping[str, Any]],
               at: float | None = None) -> None:
        """A complete list of one resource (at start, after a 410 Gone, after a reconnect);
        ``at``: when it arrived (on ``clock``; default now), what the latency counts from."""
        change = self.store.replace(group, kind, items)
        self.counts.lists[kind] = self.counts.lists.get(kind, 0) + 1
        self._listed.add((group, kind))
        self._mark(change, at)

    def not_served(self, group: str, kind: str) -> None:
        """The resource is not served (its CRD is not installed): it holds no object."""
        self.listed(group, kind, ())

    def event(self, event: str, obj: Mapping[str, Any], at: float | None = None) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``); ``at`` as for
        :meth:`listed`."""
        change = self.store.apply(event, obj)
        if not change.empty:
            kind = str(obj.get("kind"))
            self.counts.events[kind] = self.counts.events.get(kind, 0) + 1
        self._mark(change, at)

    def policies(self, update: PolicyUpdate) -> None:
        """A new policy set: every object is evaluated again (a new memo), at once."""
        self._update = update
        self._memo = EvaluationMemo()
        self._full_needed = True
        now = self._clock()
        for namespace in self.store.namespaces():
            self._dirty.setdefault(namespace, now)

    # --- work ----------------------------------------------------------------------------------

    def _settings_now(self) -> AuditSettings:
        return dataclasses.replace(self.settings, now=self._wall())

    def _scan(self, documents: Iterable[Any], quotas: tuple[Quota, ...],
              metrics: Metrics | None = None) -> dict[str, Any]:
        scanner = Scanner(self._settings_now(), self._update.engine, metrics, quotas=quotas,
                          memo=self._memo)
        try:
            for document in documents:
                scanner.feed(document)
        except BaseException:
            scanner.close()
            raise
        result = scanner.finish({"kind": "cluster", "watch": True,
                                 "policies": self._update.digest})
        return assemble(result)

    def _want(self, body: dict[str, Any] | None, key: ReportKey, since: float) -> None:
        """Queue ``body`` for ``key`` (None: delete) unless it is what was last written."""
        if body is None:
            if key not in self._written and key not in self._pending:
                return
        elif self._written.get(key) == canonical(body):
            self._pending.pop(key, None)
            return
        previous = self._pending.get(key)
        self._pending[key] = _Pending(body, min(since, previous.since) if previous else since)

    def evaluate_namespace(self, namespace: str) -> dict[str, Any] | None:
        """The PolicyReport ``namespace`` should have now (None: nothing to report)."""
        report = self._scan(self.store.documents(namespace), ())
        self.counts.namespace_evaluations += 1
        for body in policy_reports.namespace_reports(report):
            if body["metadata"]["namespace"] == namespace:
                return body
        return None

    def evaluate_all(self) -> dict[str, Any]:
        """The whole report of the stored cluster (the memo swept: entries for objects gone
        are dropped)."""
        self._memo.begin_sweep()
        metrics = self._utilization() if self._utilization is not None else None
        report = self._scan(self.store.documents(everything=True), self._update.quotas, metrics)
        self._memo.end_sweep()
        self.counts.full_evaluations += 1
        return report

    def _full(self, now: float) -> None:
        report = self.evaluate_all()
        self.last_report = report
        wanted = {_key(body): body for body in policy_reports.build(report)}
        since = min([*self._dirty.values(), *([self._cluster_dirty_since]
                                              if self._cluster_dirty_since is not None else [])],
                    default=now)
        for key, body in wanted.items():
            self._want(body, key, self._dirty.get(str(key[1]), since))
        for key in [k for k in (*self._written, *self._pending) if k not in wanted]:
            self._want(None, key, self._dirty.get(str(key[1]), since))
        self._dirty.clear()
        self._cluster_dirty_since = None
        self._full_needed = False
        # The next one no sooner than full_every_s after this one ended, nor sooner than 3x
        # what it took: on a large cluster the full evaluation must not crowd out the
        # namespaces' updates, which wait while it runs.
        ended = self._clock()
        self._last_full = ended
        self._full_gap = max(self._watch.full_every_s, 3 * (ended - now))
        self._published = True
        if self._on_full is not None:
            self._on_full(report)

    def step(self) -> None:
        """Evaluate what is due and write what may be written now. Call after each batch of
        events and whenever :meth:`next_due` comes."""
        if not self.synced:
            return
        now = self._clock()
        full_due = self._full_needed or (
            self._cluster_dirty_since is not None and self._last_full is not None
            and now - self._last_full >= self._full_gap)
        if full_due:
            self._full(now)
        else:
            # Oldest change first, each namespace's report written as soon as it is evaluated:
            # a turn over many dirty namespaces does not hold back the first ones.
            for namespace, since in sorted(self._dirty.items(), key=lambda e: (e[1], e[0])):
                key: ReportKey = ("PolicyReport", namespace, policy_reports.REPORT_NAME)
                self._want(self.evaluate_namespace(namespace), key, since)
                self._flush(self._clock())
            self._dirty.clear()
        self._flush(self._clock())

    def _refill(self, now: float) -> None:
        rate = self._watch.writes_per_s
        self._tokens = min(rate, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now

    def _flush(self, now: float) -> None:
        self._refill(now)
        for key in sorted(self._pending, key=lambda k: (k[0], k[1] or "", k[2])):
            last = self._last_write.get(key)
            if last is not None and now - last < self._watch.report_interval_s:
                continue
            if self._tokens < 1:
                break
            self._tokens -= 1
            pending = self._pending[key]
            kind, namespace, name = key
            if pending.body is None:
                outcome = self._sink.delete(kind, namespace, name)
            else:
                outcome = self._sink.write(pending.body)
            self._last_write[key] = now
            self.counts.writes[outcome.action] = self.counts.writes.get(outcome.action, 0) + 1
            if outcome.action == "failed":
                _LOG.warning("writing %s %s/%s failed; trying again in %.0f s", kind,
                             namespace or "", name, self._watch.report_interval_s,
                             extra={"fields": {"error": outcome.message}})
                continue
            del self._pending[key]
            # measured at the write, not the step's start: evaluations before it took time
            self.counts.latencies.append(self._clock() - pending.since)
            if pending.body is None:
                self._written.pop(key, None)
            else:
                self._written[key] = canonical(pending.body)
        if self._published and not self._pruned and not self._pending:
            outcomes = self._sink.prune(
                [{"kind": k[0], "metadata": {"namespace": k[1], "name": k[2]}}
                 for k in self._written],
                name=policy_reports.REPORT_NAME, labels=policy_reports.LABELS)
            if not any(getattr(o, "action", "") == "failed" for o in outcomes):
                self._pruned = True
            for outcome in outcomes:
                action = getattr(outcome, "action", "failed")
                self.counts.writes[action] = self.counts.writes.get(action, 0) + 1

    def next_due(self) -> float | None:
        """When (on ``clock``) :meth:`step` has work that is waiting for time to pass: a
        rate-limited write, a full evaluation; None when only a new event would make work."""
        if not self.synced:
            return None
        times = []
        if self._dirty or self._full_needed:
            times.append(self._clock())
        if self._cluster_dirty_since is not None and self._last_full is not None:
            times.append(self._last_full + self._full_gap)
        for key in self._pending:
            last = self._last_write.get(key)
            times.append(self._clock() if last is None else last + self._watch.report_interval_s)
        if self._pending and self._tokens < 1:
            times.append(self._tokens_at + (1 - self._tokens) / self._watch.writes_per_s)
        return min(times) if times else None

    @property
    def pending(self) -> int:
        """Report writes or deletes waiting."""
        return len(self._pending)
