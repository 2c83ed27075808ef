"""One server process: start, keep policies and certificate fresh, shut down gracefully.

Owns the lifecycle of a worker: the first policy load (off the loop; the server listens even when
it fails, answering ``/readyz`` 503 with the errors and retrying on every policy check), starting
the namespace source, listening over HTTPS (``SO_REUSEPORT`` when several workers share the
port) through the connection guard (:mod:`webhook.connections`: header-read timeout, connection
and idle caps), the watch of the cluster's policy objects (``--cluster-policies``: each change
wakes a policy check at once), the threads that decode large bodies, the evaluation processes
(:mod:`webhook.evaluators`), the heap trim after bursts
(:mod:`webhook.memory`), the process-wide settings of a server (GIL switch interval, malloc's
mmap threshold, asyncio's TLS read size), the periodic policy check (:meth:`PolicyStore.check`,
hot reload) and certificate check (``reload_if_changed`` on the TLS object: new handshakes get
the new certificate, open connections are kept), and the graceful shutdown on SIGTERM / SIGINT:
report not ready, keep answering for ``shutdown_delay_s`` so endpoints drop this pod, close the
listener, let requests in flight finish (up to ``drain_timeout_s``), stop, exit 0.

Must not build its collaborators from the command line or import :mod:`certs`: the TLS object
(anything with ``.context`` and ``.reload_if_changed()``) is passed in by
:mod:`gpuguard.serve_command`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from policies.authorization import Authorizer
from webhook.admission import Admitter, NamespaceSource, Recorder
from webhook.app import HANDLERS_KEY, build_app
from webhook.connections import ConnectionGuard, GuardedSite, handler_args, limit_tls_reads
from webhook.evaluators import EvaluationProcesses
from webhook.health import Health
from webhook.memory import MemoryReturn, fix_mmap_threshold
from webhook.metrics import Metrics
from webhook.policy_store import HELD, LOADED, REJECTED, RETRY, PolicyStore, ReloadResult
from webhook.quota import QuotaGate
from webhook.settings import ServerSettings
from webhook.timer import MonotonicTimer, Timer

LOG = logging.getLogger("gpuguard.webhook.server")
SWITCH_INTERVAL_S = 0.001
"""The GIL switch interval of a server process (Python's default: 5 ms). The event loop gives the
GIL up at every socket read and write and must take it back from a thread that decodes or
evaluates a large review; at 5 ms per take, a 3 MiB body read in 64 KiB pieces cost the loop a
quarter of a second. 1 ms keeps ``/readyz`` answered within tens of milliseconds through a burst
of large reviews, for a few per cent of the threads' throughput."""

WARM_TIMEOUT_S = 60.0
"""The longest start-up waits for the evaluation processes to build the first policy set before
listening (a cold process imports and compiles in seconds); past it, the first large requests
wait for them instead."""


class TLSSource(Protocol):
    """A server TLS context that can re-read its certificate files (``certs.tls.ReloadingTLS``)."""

    @property
    def context(self) -> ssl.SSLContext:
        """The server context (the same object across reloads)."""
        ...

    def reload_if_changed(self) -> bool:
        """Reload the certificate chain into ``context`` if the files changed.

        Returns whether it reloaded; raises (keeping the old certificate) on bad material.
        """
        ...


class NamespaceLifecycle(NamespaceSource, Protocol):
    """A namespace source that runs in the background (:mod:`kube.namespaces`)."""

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin keeping namespaces current, applying changes on ``loop``."""
        ...

    def stop(self) -> None:
        """Stop the background work."""
        ...


class PolicyObjects(Protocol):
    """The policy objects feeding the store (:class:`kube.policy_objects.PolicyObjectWatch`)."""

    def start(self, on_change: Callable[[], None] | None = None) -> None:
        """Begin watching; ``on_change`` is called from a worker thread after each change."""
        ...

    def stop(self) -> None:
        """Stop watching."""
        ...


class Server:
    """One worker's server.

    Args:
        settings: address, deadline, intervals.
        store: the policy store (loaded by :meth:`start`).
        namespaces: the namespace source (started by :meth:`start`).
        tls: the TLS object; None serves plain HTTP (tests only).
        certificate_check: a readiness check of the served certificate (see :class:`Health`).
        recorder: side effects of admitted requests (see :class:`~webhook.admission.Recorder`).
        quota: the GPUQuota step of ``/validate`` (see :mod:`webhook.quota`); None: not enforced.
        authorizer: what CEL ``authorizer`` checks ask (see :class:`~webhook.admission.Admitter`).
        timer: the clock of request deadlines and the shutdown delay (:mod:`webhook.timer`);
            default the monotonic clock.
        policy_objects: the cluster's policy objects the store merges (``--cluster-policies``):
            started before the first load; each change wakes a policy check at once.
        runtime_classes: the cluster's RuntimeClass names (see :class:`~webhook.admission.
            Admitter`); None: never known.
        on_listening: called with the bound port once the server listens (never when it
            cannot start).
    """

    def __init__(self, settings: ServerSettings, store: PolicyStore,
                 namespaces: NamespaceLifecycle, tls: TLSSource | None, *,
                 certificate_check: Callable[[], str | None] | None = None,
                 recorder: Recorder | None = None, quota: QuotaGate | None = None,
                 timer: Timer | None = None, authorizer: Authorizer | None = None,
                 policy_objects: PolicyObjects | None = None,
                 runtime_classes: Callable[[], frozenset[str] | None] | None = None,
                 on_listening: Callable[[int], None] | None = None) -> None:
        self.settings = settings
        self.on_listening = on_listening
        self.policy_objects = policy_objects
        self._wake: asyncio.Event | None = None
        self.store = store
        self.namespaces = namespaces
        self.tls = tls
        self.metrics = Metrics()
        self.timer: Timer = timer if timer is not None else MonotonicTimer()
        self.health = Health(store, namespaces, certificate_check,
                             quota_status=quota.status if quota is not None else None)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            settings.eval_threads, thread_name_prefix="gpuguard-evaluate")
        self.quota_executor = concurrent.futures.ThreadPoolExecutor(
            max(settings.eval_threads, 4), thread_name_prefix="gpuguard-quota") \
            if quota is not None else None
        self.decode_executor = concurrent.futures.ThreadPoolExecutor(
            settings.decode_threads, thread_name_prefix="gpuguard-decode")
        self.admitter = Admitter(store, namespaces, settings, self.metrics, self.executor,
                                 recorder=recorder, quota=quota,
                                 quota_executor=self.quota_executor, timer=self.timer,
                                 authorizer=authorizer, runtime_classes=runtime_classes)
        self.memory = MemoryReturn(on_trim=self.metrics.memory_trims.inc)
        self.guard = ConnectionGuard(settings.header_timeout_s, settings.max_connections,
                                     self.metrics, max_idle=settings.max_idle_connections,
                                     on_sweep_closed=self.memory.request)
        # A process can stop at the deadline itself only on the host's clock, not a test's.
        self.processes = EvaluationProcesses(
            settings.eval_processes, self.timer, grace_s=settings.deadline_s,
            worker_deadline=isinstance(self.timer, MonotonicTimer)) \
            if settings.eval_processes else None
        self.app = build_app(self.admitter, self.health, self.metrics, settings,
                             decode_executor=self.decode_executor, memory=self.memory,
                             middlewares=(self.guard.middleware,), processes=self.processes)
        self._warming: list[concurrent.futures.Future[int]] = []
        self.runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._port = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 before :meth:`start`."""
        return self._port

    @property
    def in_flight(self) -> int:
        """Admission requests being handled now."""
        return self.app[HANDLERS_KEY].in_flight

    def _record_reload(self, result: ReloadResult) -> None:
        if result.outcome == LOADED and result.snapshot is not None:
            snapshot = result.snapshot
            if self.processes is not None:  # built there before its first large request
                self._warming = self.processes.warm(snapshot)
            self.metrics.policy_reloads.labels("success").inc()
            self.metrics.policy_set_served(snapshot.identity)
            LOG.info("policy set loaded", extra={"fields": {
                "generation": snapshot.generation, "hash": snapshot.digest,
                "policies": list(snapshot.names),
                "quotas": [q.name for q in snapshot.engine.policies.quotas],
                "source": self.store.describe(), "warnings": list(snapshot.warnings)}})
            if snapshot.engine.policies.empty:  # a quota-only set still enforces its quotas
                LOG.warning("the policy set is empty: every request is allowed",
                            extra={"fields": {"source": self.store.describe()}})
        elif result.outcome == REJECTED:
            self.metrics.policy_reloads.labels("rejected").inc()
            serving = self.store.current
            LOG.error("policy update rejected; " + (
                f"still serving generation {serving.generation}" if serving
                else "no policy set is loaded"), extra={"fields": {
                    "errors": list(result.errors), "source": self.store.describe()}})
        elif result.outcome == HELD and result.first:
            self.metrics.policy_reloads.labels("held").inc()
            LOG.warning("policy update removes content from policies; serving it once the files "
                        f"read the same for {self.store.removal_quiet_s:g} s "
                        "(--policy-removal-quiet-s), as a truncated or half-written file looks "
                        "the same", extra={"fields": {
                            "removes": list(result.errors), "loads_in_s": round(result.held_s, 1),
                            "source": self.store.describe()}})
        elif result.outcome == RETRY:
            LOG.info("policy files changed; loading them once they read the same at two "
                     "consecutive checks")

    async def load_policies(self, *, force: bool = False) -> ReloadResult:
        """Load (``force``) or check-and-reload the policy set off the event loop."""
        result = await asyncio.to_thread(self.store.load if force else self.store.check)
        self._record_reload(result)
        return result

    async def reload_tls(self) -> bool:
        """Check the certificate files once; returns whether the certificate was reloaded."""
        if self.tls is None:
            return False
        try:
            # On the loop thread, which performs the handshakes: the context is never updated
            # while a handshake reads it. An unchanged check is two small file reads.
            changed = self.tls.reload_if_changed()
        except Exception as exc:  # bad new material: keep serving the old certificate
            self.metrics.tls_reloads.labels("failure").inc()
            self.health.tls_reload_error = str(exc)
            LOG.error("serving certificate reload failed; keeping the previous certificate",
                      extra={"fields": {"error": str(exc)}})
            return False
        if changed:
            self.metrics.tls_reloads.labels("success").inc()
            self.health.tls_reload_error = None
            LOG.info("serving certificate reloaded")
        return changed

    async def _every(self, seconds: float, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                LOG.exception("periodic check failed")

    async def _check_on_wake(self, wake: asyncio.Event) -> None:
        """Check the policies each time the policy objects changed (changes while a check runs
        are taken by the next one)."""
        while True:
            await wake.wait()
            wake.clear()
            try:
                await self.load_policies()
            except Exception:
                LOG.exception("policy check failed")

    async def start(self) -> None:
        """Load policies, start the namespace source, listen, start the periodic checks.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        # Process-wide settings for a server process (see SWITCH_INTERVAL_S, webhook.memory,
        # webhook.connections).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        fix_mmap_threshold()
        limit_tls_reads()
        if self.policy_objects is not None:
            wake = self._wake = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._check_on_wake(wake)))

            def changed() -> None:  # from the watch's threads
                with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
                    loop.call_soon_threadsafe(wake.set)
            self.policy_objects.start(changed)
        await self.load_policies(force=True)
        if self._warming:  # ready only once the evaluation processes hold the set (bounded)
            await asyncio.wait([asyncio.wrap_future(f) for f in self._warming],
                               timeout=WARM_TIMEOUT_S)
            self._warming = []
        self.namespaces.start(loop)
        args = handler_args(keepalive_s=self.settings.keepalive_s)
        self.runner = web.AppRunner(self.app, handle_signals=False,
                                    shutdown_timeout=self.settings.drain_timeout_s, **args)
        await self.runner.setup()
        site = GuardedSite(self.runner, self.guard, args, self.settings.host, self.settings.port,
                           ssl_context=self.tls.context if self.tls else None,
                           reuse_port=self.settings.workers > 1 or None)
        await site.start()
        self._tasks.append(asyncio.create_task(self.guard.run()))
        self._port = int(self.runner.addresses[0][1])
        # What start-up built (modules, the compiled policy set) lives as long as the process:
        # keep it out of the garbage collector's full collections, which otherwise scan it
        # again and again while requests wait (a p99 latency cost).
        gc.freeze()
        self.health.tls_up = True
        LOG.info("listening", extra={"fields": {
            "address": f"{self.settings.host}:{self.port}",
            "scheme": "https" if self.tls else "http",
            "deadline_ms": self.settings.deadline_ms, "policies": self.store.describe(),
            "namespaces": getattr(self.namespaces, "source", "?")}})
        if self.on_listening is not None:  # e.g. serve --dev's curl commands: only once serving
            self.on_listening(self.port)
        if self.store.reloadable:
            self._tasks.append(asyncio.create_task(
                self._every(self.settings.policy_reload_s, self.load_policies)))
        if self.tls is not None:
            self._tasks.append(asyncio.create_task(
                self._every(self.settings.tls_reload_s, self.reload_tls)))

    async def shutdown(self, *, delay: bool = True) -> None:
        """Graceful stop: not ready, answer during the delay, close, drain, release.

        ``delay=False`` skips the not-ready delay (a server that failed to start).
        """
        self.health.shutting_down = True
        LOG.info("shutting down: reporting not ready", extra={"fields": {
            "delay_s": self.settings.shutdown_delay_s, "in_flight": self.in_flight}})
        if delay and self.settings.shutdown_delay_s and self.runner is not None:
            await self.timer.sleep(self.settings.shutdown_delay_s)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        in_flight = self.in_flight
        if self.runner is not None:
            # Closes the listener, then waits for the handlers in flight (drain_timeout_s).
            await self.runner.cleanup()
        await asyncio.to_thread(self.namespaces.stop)
        if self.policy_objects is not None:
            await asyncio.to_thread(self.policy_objects.stop)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.decode_executor.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            self.processes.shutdown()
        if self.quota_executor is not None:
            self.quota_executor.shutdown(wait=False, cancel_futures=True)
        LOG.info("stopped", extra={"fields": {"drained": in_flight}})


async def serve(server: Server, stop: asyncio.Event) -> None:
    """Start ``server``, wait for ``stop``, shut down gracefully."""
    try:
        await server.start()
    except BaseException:
        await server.shutdown(delay=False)
        raise
    await stop.wait()
    await server.shutdown()


def run(server: Server) -> bool:
    """Run ``server`` until SIGTERM or SIGINT; True after a clean stop.

    False when the server cannot start (e.g. the port is taken, an address that is not this
    machine's), after logging why: the environment's fault, which the CLI maps to its exit code.
    """

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(server, stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        LOG.error("cannot start the server", extra={"fields": {"error": str(exc)}})
        return False
    return True
