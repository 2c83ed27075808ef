"""``gpuguard audit --cluster --watch``: the audit controller's process.

Joins the parts (the composition root of the continuous audit): a Lease so that one replica is
active (:class:`kube.lease.LeaseElector`; the others wait as standbys), one list + watch per
resource the batch audit reads (:data:`kube.lists.AUDIT_RESOURCES`, DRA objects included;
:class:`kube.resource_watch.ResourceWatch`, worker threads whose events reach this loop through
a queue), the controller (:class:`audit.watch.controller.WatchController`), the policy files
reloaded as ``gpuguard serve`` reloads them (:class:`webhook.policy_store.PolicyStore`: one
snapshot, refused whole when broken, the last good set kept) and ``/metrics``
(:class:`audit.watch.metrics.WatchMetrics`, prometheus-client's HTTP server).

Exit codes: 0 stopped by SIGTERM / SIGINT; 3 the Lease was lost (another replica may be writing:
stop at once, the Deployment restarts this one as a standby) or the metrics port cannot be
bound. Must not evaluate or build reports itself.
"""

from __future__ import annotations

import datetime
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from audit.scan.utilization import Metrics
from audit.settings import AuditSettings
from audit.watch.controller import (
    PolicySource,
    PolicyUpdate,
    WatchController,
    WatchSettings,
)
from audit.watch.metrics import WatchMetrics
from gpuguard import policy_set
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_OK
from kube.lease import LeaseElector
from kube.lists import AUDIT_RESOURCES, Resource
from kube.policy_reports import ReportWriter
from kube.resource_watch import ResourceWatch
from policies.facts.resource_names import GPUSettings
from webhook.policy_store import HELD, LOADED, REJECTED, PolicyStore

LOG = logging.getLogger("gpuguard.audit.watch")

#: What the controller watches: what the batch audit lists (DRA's DeviceClasses, ResourceSlices,
#: ResourceClaimTemplates and ResourceClaims included, where served), so the two read one input.
WATCHED: tuple[Resource, ...] = AUDIT_RESOURCES


@dataclass(frozen=True)
class WatchConfig:
    """The controller's process settings (``gpuguard audit --watch`` flags).

    Attributes:
        metrics_host / metrics_port: where ``/metrics`` listens (``--metrics-listen``).
        lease: ``(namespace, name)`` of the Lease, or None to run without election (one
            process only).
        identity: this replica's name in the Lease (the pod name).
        lease_duration_s: seconds a Lease not renewed stays its holder's.
        policy_reload_s: seconds between checks of the policy files.
        write_reports: write PolicyReports (``--write-reports``); else metrics only.
        pacing: report write pacing.
    """

    metrics_host: str
    metrics_port: int
    lease: tuple[str, str] | None
    identity: str
    lease_duration_s: int = 15
    policy_reload_s: float = 5.0
    write_reports: bool = True
    pacing: WatchSettings = field(default_factory=WatchSettings)


@dataclass(frozen=True)
class _Skipped:
    action: str = "skipped"
    message: str = ""


class MetricsOnly:
    """The sink without ``--write-reports``: reports are computed (for the metrics), never
    written."""

    def write(self, report: Mapping[str, Any]) -> _Skipped:
        """Write nothing."""
        return _Skipped()

    def delete(self, kind: str, namespace: str | None, name: str) -> _Skipped:
        """Delete nothing."""
        return _Skipped()

    def prune(self, written: Iterable[Mapping[str, Any]], *, name: str,
              labels: Mapping[str, str]) -> list[Any]:
        """Prune nothing."""
        return []


class FilePolicySource(PolicySource):
    """The ``--policies`` files, reloaded as ``gpuguard serve`` reloads them
    (:class:`webhook.policy_store.PolicyStore`); a rejected update is logged and counted, and the
    last good set stays."""

    def __init__(self, paths: list[str] | None, gpu: GPUSettings, metrics: WatchMetrics,
                 extra_quotas: tuple[Any, ...] = (), *, removal_quiet_s: float = 0.0) -> None:
        self.store = PolicyStore(paths, lambda snapshot: policy_set.load(snapshot, gpu),
                                 removal_quiet_s=removal_quiet_s)
        self.metrics = metrics
        self._extra_quotas = extra_quotas
        first = self.store.load()
        if first.snapshot is None:
            raise ValueError("; ".join(first.errors) or "the policy set did not load")

    def _update(self) -> PolicyUpdate:
        snapshot = self.store.current
        assert snapshot is not None
        engine = snapshot.engine
        return PolicyUpdate(engine, (*engine.policies.quotas, *self._extra_quotas),
                            snapshot.digest)

    def first(self) -> PolicyUpdate:
        """The set loaded at start."""
        return self._update()

    def poll(self) -> PolicyUpdate | None:
        """See :meth:`audit.watch.controller.PolicySource.poll`."""
        result = self.store.check()
        if result.outcome == LOADED:
            self.metrics.policy_reloads.labels("success").inc()
            LOG.info("policy set reloaded", extra={"fields": {
                "generation": result.snapshot.generation if result.snapshot else None}})
            return self._update()
        if result.outcome == REJECTED:
            self.metrics.policy_reloads.labels("rejected").inc()
            LOG.error("policy update rejected; the previous set stays",
                      extra={"fields": {"errors": list(result.errors)}})
        if result.outcome == HELD and result.first:
            self.metrics.policy_reloads.labels("held").inc()
            LOG.warning("policy update removes content from policies; used once the files read "
                        f"the same for {self.store.removal_quiet_s:g} s", extra={"fields": {
                            "removes": list(result.errors)}})
        return None


class _Counted:
    """Turns the controller's running counts into Prometheus counter increments."""

    def __init__(self, metrics: WatchMetrics) -> None:
        self._metrics = metrics
        self._seen: dict[tuple[str, str], int] = {}

    def _delta(self, family: str, label: str, total: int) -> int:
        before = self._seen.get((family, label), 0)
        self._seen[(family, label)] = total
        return total - before

    def update(self, controller: WatchController) -> None:
        counts = self._metrics
        c = controller.counts
        for kind, n in c.events.items():
            counts.events.labels(kind).inc(self._delta("events", kind, n))
        for kind, n in c.lists.items():
            counts.lists.labels(kind).inc(self._delta("lists", kind, n))
        for action, n in c.writes.items():
            counts.report_writes.labels(action).inc(self._delta("writes", action, n))
        counts.evaluations.labels("namespace").inc(
            self._delta("eval", "namespace", c.namespace_evaluations))
        counts.evaluations.labels("full").inc(self._delta("eval", "full", c.full_evaluations))
        for seconds in c.latencies:
            counts.report_latency.observe(seconds)
        c.latencies.clear()
        counts.objects.set(len(controller.store))
        counts.pending.set(controller.pending)
        counts.synced.set(1 if controller.synced else 0)


def run(config: WatchConfig, settings: AuditSettings, source: FilePolicySource,
        api_client: Any, *, clock: Callable[[], float] = time.monotonic,
        utilization: Callable[[], Metrics | None] | None = None) -> int:
    """Run the controller until stopped; see the module docstring for the exit codes."""
    metrics = source.metrics
    try:
        server, _ = _serve_metrics(config, metrics)
    except OSError as exc:
        LOG.error("cannot serve /metrics", extra={"fields": {
            "listen": f"{config.metrics_host}:{config.metrics_port}", "error": str(exc)}})
        return EXIT_ENVIRONMENT
    stop = threading.Event()
    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGTERM, signal.SIGINT)}
    elector = None
    if config.lease is not None:
        elector = LeaseElector(api_client, *config.lease, config.identity,
                               lease_duration_s=config.lease_duration_s, clock=clock)
    try:
        if elector is not None and not _wait_for_lease(elector, stop, config):
            return EXIT_OK
        metrics.leader.set(1)
        return _lead(config, settings, source, api_client, metrics, elector, stop, clock,
                     utilization)
    finally:
        metrics.leader.set(0)
        if elector is not None:
            elector.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()


def _serve_metrics(config: WatchConfig, metrics: WatchMetrics) -> tuple[Any, Any]:
    from prometheus_client import start_http_server  # noqa: PLC0415 - only in watch mode

    return start_http_server(config.metrics_port, config.metrics_host,
                             registry=metrics.registry)


def _wait_for_lease(elector: LeaseElector, stop: threading.Event,
                    config: WatchConfig) -> bool:
    """Block until this replica holds the Lease (True) or is stopped (False)."""
    retry = max(config.lease_duration_s / 3, 1.0)
    logged = False
    while not stop.is_set():
        if elector.try_acquire_or_renew():
            LOG.info("holding the Lease: this replica writes the reports", extra={"fields": {
                "lease": f"{elector.namespace}/{elector.name}", "identity": elector.identity}})
            return True
        if not logged:
            LOG.info("standby: another replica holds the Lease", extra={"fields": {
                "lease": f"{elector.namespace}/{elector.name}", "error": elector.last_error}})
            logged = True
        stop.wait(retry)
    return False


def _watch(api_client: Any, resource: Resource,
           events: queue.Queue[tuple[str, Resource, Any, float]]) -> ResourceWatch:
    """A watch of ``resource`` whose lists and events go to ``events``."""
    def listed(items: list[dict[str, Any]]) -> None:
        events.put(("list", resource, items, time.monotonic()))

    def event(kind: str, obj: dict[str, Any]) -> None:
        events.put((kind, resource, obj, time.monotonic()))

    def not_served() -> None:
        events.put(("not_served", resource, None, time.monotonic()))

    def failed(message: str) -> None:
        LOG.warning("watch failed; retrying", extra={"fields": {
            "resource": resource.plural, "error": message}})

    return ResourceWatch(api_client, resource, on_list=listed, on_event=event,
                         on_not_served=not_served, on_error=failed)


class LeaseKeeper:
    """Renews the Lease in a thread of its own, every third of its duration — a full
    evaluation of a large cluster takes longer than the Lease lasts, and must not let it lapse
    — and sets :attr:`lost` when another replica holds it or it could not be renewed for a
    whole duration (measured on ``clock``)."""

    def __init__(self, elector: LeaseElector, duration_s: float, clock: Callable[[], float],
                 stop: threading.Event) -> None:
        self._elector = elector
        self._duration_s = duration_s
        self._clock = clock
        self._stop = stop
        self.lost = threading.Event()
        self._renewed = clock()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def renew(self) -> bool:
        """One renewal; False (and :attr:`lost` set) once the Lease is lost: another replica
        holds it, or no renewal succeeded for a whole duration (API errors until then are
        retried)."""
        if self._elector.try_acquire_or_renew():
            self._renewed = self._clock()
            return True
        if self._elector.last_error is None or \
                self._clock() - self._renewed >= self._duration_s:
            LOG.error("lost the Lease; stopping", extra={"fields": {
                "error": self._elector.last_error}})
            self.lost.set()
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(max(self._duration_s / 3, 1.0)):
            if not self.renew():
                return


class LeaseGuard:
    """A sink that writes only while the Lease is held: a write that would follow a lost Lease
    (another replica may be writing) fails instead."""

    def __init__(self, sink: Any, lost: threading.Event) -> None:
        self._sink = sink
        self._lost = lost

    def write(self, report: Mapping[str, Any]) -> Any:
        """Write, unless the Lease is lost."""
        return _LOST if self._lost.is_set() else self._sink.write(report)

    def delete(self, kind: str, namespace: str | None, name: str) -> Any:
        """Delete, unless the Lease is lost."""
        return _LOST if self._lost.is_set() else self._sink.delete(kind, namespace, name)

    def prune(self, written: Iterable[Mapping[str, Any]], *, name: str,
              labels: Mapping[str, str]) -> list[Any]:
        """Prune, unless the Lease is lost."""
        if self._lost.is_set():
            return [_LOST]
        result: list[Any] = self._sink.prune(written, name=name, labels=labels)
        return result


_LOST = _Skipped("failed", "the Lease is lost: another replica may be writing")


def _lead(config: WatchConfig, settings: AuditSettings, source: FilePolicySource,
          api_client: Any, metrics: WatchMetrics, elector: LeaseElector | None,
          stop: threading.Event, clock: Callable[[], float],
          utilization: Callable[[], Metrics | None] | None) -> int:
    # (type, resource, payload, arrival on time.monotonic: the change latency counts from it)
    events: queue.Queue[tuple[str, Resource, Any, float]] = queue.Queue()
    sink: Any = ReportWriter(api_client) if config.write_reports else MetricsOnly()
    keeper = None
    if elector is not None:
        keeper = LeaseKeeper(elector, config.lease_duration_s, clock, stop)
        keeper.start()
        sink = LeaseGuard(sink, keeper.lost)

    def on_full(report: Mapping[str, Any]) -> None:
        metrics.state.update(report, time.time())
        LOG.info("full evaluation", extra={"fields": {
            "objects": report["summary"]["objects"], "findings": report["summary"]["findings"],
            "namespaces": len(report["namespaces"])}})

    controller = WatchController(
        settings, source.first(), sink, [(r.group, r.kind) for r in WATCHED], clock=clock,
        wall=lambda: datetime.datetime.now(datetime.UTC), watch=config.pacing, on_full=on_full,
        utilization=utilization)
    watches = [_watch(api_client, resource, events) for resource in WATCHED]
    for watch in watches:
        watch.start()
    counted = _Counted(metrics)
    next_reload = clock() + config.policy_reload_s
    try:
        while not stop.is_set():
            if keeper is not None and keeper.lost.is_set():
                # stop at once; the Deployment restarts this replica as a standby
                return EXIT_ENVIRONMENT
            now = clock()
            due = [next_reload]
            work = controller.next_due()
            if work is not None:
                due.append(work)
            timeout = min(max(min(due) - now, 0.0), 1.0)
            try:
                item = events.get(timeout=timeout)
            except queue.Empty:
                item = None
            batch = [item] if item is not None else []
            while len(batch) < 10_000:
                try:
                    batch.append(events.get_nowait())
                except queue.Empty:
                    break
            try:
                for kind, resource, payload, at in batch:
                    if kind == "list":
                        controller.listed(resource.group, resource.kind, payload, at)
                    elif kind == "not_served":
                        controller.not_served(resource.group, resource.kind)
                    else:
                        controller.event(kind, payload, at)
                controller.step()
            except Exception as exc:  # a bug must not end the controller with a traceback
                LOG.exception("evaluation failed; continuing with the next changes",
                              extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
            counted.update(controller)
            now = clock()
            if now >= next_reload:
                update = source.poll()
                if update is not None:
                    controller.policies(update)
                next_reload = now + config.policy_reload_s
        return EXIT_OK
    finally:
        for watch in watches:
            watch.stop(timeout=0.0)  # signal every worker first: daemon threads, not joined


def default_identity() -> str:
    """The Lease identity of this replica: the host name (the pod name in Kubernetes)."""
    return socket.gethostname()
