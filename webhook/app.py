"""The aiohttp application: routes, request handling, the decision log line.

Routes: ``POST /validate`` and ``POST /mutate`` (AdmissionReview in, AdmissionReview out),
``GET /healthz`` (the process answers), ``GET /readyz`` (200 or 503 with a JSON detail of each
check), ``GET /metrics`` (Prometheus text format) and, only when
``ServerSettings.benchmark_routes`` is set, ``POST /null-validate`` (the same request reading
and response writing with no evaluation: the benchmark's baseline).

Bad input is answered with a 4xx and a ``Status`` body naming what was wrong: 413 for a body over
``max_body_bytes``, 415 for another content type, 400 for the rest (see :mod:`webhook.wire`).
A request that was understood is always answered 200 with an AdmissionReview, even when the
evaluation fails or runs out of time (then the policies' failurePolicy decides, see
:mod:`webhook.admission`); 503 only while no policy set has loaded, and 500 only for a bug in
gpuguard itself (logged with its traceback; the handler is fuzzed so that no input reaches it).
Each admission logs one JSON line (uid, kind, namespace/name, operation, decision, latency;
object bodies only with ``log_objects``).

Must not evaluate policies or know where policies, namespaces or certificates come from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from webhook import logs, wire
from webhook.admission import ENDPOINTS, Admitter, Decision, Endpoint
from webhook.health import Health
from webhook.metrics import CONTENT_TYPE, Metrics
from webhook.settings import ServerSettings

ADMISSION_LOG = logging.getLogger("gpuguard.webhook.admission")
_JSON = "application/json"


def _json_response(body: Mapping[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=wire.encode(body), status=status, content_type=_JSON)


def _identity(request: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Add who and what a request is about to ``fields`` for the log line (never the object
    body); returns ``fields``.

    The request was decoded from JSON, so its maps are dicts: the cheap ``dict`` test is enough
    (this runs on every request).
    """
    obj = request.get("object")
    if not isinstance(obj, dict):
        obj = request.get("oldObject")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        metadata = {}
    kind = request.get("kind")
    user = request.get("userInfo")
    fields["kind"] = kind.get("kind") if isinstance(kind, dict) else None
    fields["namespace"] = request.get("namespace") or metadata.get("namespace")
    fields["name"] = name = request.get("name") or metadata.get("name")
    fields["operation"] = request.get("operation")
    fields["user"] = user.get("username") if isinstance(user, dict) else None
    if not name and metadata.get("generateName"):
        fields["generateName"] = metadata.get("generateName")
    if request.get("subResource"):
        fields["subresource"] = request.get("subResource")
    if request.get("dryRun") is True:
        fields["dryRun"] = True
    return fields


class AdmissionHandlers:
    """The request handlers, bound to their collaborators."""

    def __init__(self, admitter: Admitter, health: Health, metrics: Metrics,
                 settings: ServerSettings) -> None:
        self.admitter = admitter
        self.health = health
        self.metrics = metrics
        self.settings = settings
        self.in_flight = 0

    async def _envelope(self, request: web.Request) -> wire.Envelope:
        """Read and check the body (content type, size, JSON, envelope).

        Raises:
            WireError: 413, 415 or 400.
        """
        wire.check_content_type(request.headers.get("Content-Type"))
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(request.content_length, limit)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _too_large(None, limit) from None
        return wire.parse_envelope(wire.decode_json(body, max_depth=self.settings.max_depth),
                                   len(body))

    async def admission(self, request: web.Request, endpoint: Endpoint) -> web.Response:
        """``POST /validate`` and ``POST /mutate``."""
        start = time.perf_counter()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        envelope: wire.Envelope | None = None
        try:
            envelope = await self._envelope(request)
            decision = await self.admitter.admit(envelope, endpoint)
        except wire.WireError as error:
            seconds = time.perf_counter() - start
            outcome = "unavailable" if error.status == 503 else "bad_request"
            self.metrics.observe(endpoint, outcome, seconds)
            fields: dict[str, Any] = {"endpoint": endpoint,
                                      "uid": envelope.uid if envelope else None}
            if envelope is not None:
                _identity(envelope.request, fields)
            fields.update(status=error.status, error=error.message,
                          latency_ms=round(seconds * 1000, 3))
            logs.log_fields(ADMISSION_LOG, logging.WARNING, "admission request rejected", fields)
            return _json_response(wire.error_body(error), error.status)
        except Exception:  # a bug in gpuguard, not bad input: say so, never crash
            ADMISSION_LOG.exception("admission handler failed", extra={"fields": {
                "endpoint": endpoint, "uid": envelope.uid if envelope else None}})
            self.metrics.observe(endpoint, "internal_error", time.perf_counter() - start)
            failure = wire.WireError(500, "InternalError", "gpuguard failed to handle the "
                                     "request; see its log")
            return _json_response(wire.error_body(failure), failure.status)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
        body = wire.response(envelope, allowed=decision.allowed, message=decision.message,
                             reason=decision.reason, warnings=decision.warnings,
                             audit_annotations=decision.audit_annotations,
                             patch=decision.patch)
        answer = _json_response(body)
        seconds = time.perf_counter() - start
        self.metrics.observe(endpoint, decision.decision, seconds)
        if decision.policy_outcomes:
            self.metrics.policy_outcomes(endpoint, decision.policy_outcomes)
        self._log(envelope, endpoint, decision, seconds)
        return answer

    def _log(self, envelope: wire.Envelope, endpoint: str, decision: Decision,
             seconds: float) -> None:
        if not ADMISSION_LOG.isEnabledFor(logging.INFO):
            return
        fields = _identity(envelope.request, {"endpoint": endpoint, "uid": envelope.uid})
        fields["decision"] = decision.decision
        fields["allowed"] = decision.allowed
        fields["latency_ms"] = round(seconds * 1000, 3)
        if decision.policy_set is not None:  # which set decided: generation, hash, count
            fields["policySet"] = decision.policy_set.identity
        if decision.denied_by:
            fields["deniedBy"] = list(decision.denied_by)
        failed = [policy for policy, outcome in decision.policy_outcomes if outcome == "error"]
        if failed:  # failurePolicy Ignore allowed them: this line is where that is reported
            fields["evaluationErrors"] = failed
        if decision.warnings:
            fields["warnings"] = len(decision.warnings)
        if decision.patch:
            fields["patchOperations"] = len(decision.patch)
        if decision.fallback:
            fields["fallback"] = decision.fallback
            fields["message"] = decision.message or decision.warnings[0]
        if self.settings.log_objects:
            fields["object"] = envelope.request.get("object")
            fields["oldObject"] = envelope.request.get("oldObject")
        logs.log_fields(ADMISSION_LOG, logging.INFO, "admission", fields)

    async def null_validate(self, request: web.Request) -> web.Response:
        """``POST /null-validate``: read and answer an AdmissionReview without evaluating it."""
        try:
            envelope = await self._envelope(request)
        except wire.WireError as error:
            return _json_response(wire.error_body(error), error.status)
        return _json_response(wire.response(envelope, allowed=True))

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: the process and its event loop answer."""
        return _json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """``GET /readyz``: 200 when ready, else 503; the body details each check."""
        ready, detail = self.health.readiness()
        return _json_response(detail, 200 if ready else 503)

    async def metrics_page(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text exposition."""
        return web.Response(body=self.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE})


def _too_large(size: int | None, limit: int) -> wire.WireError:
    shown = f"{size} bytes" if size is not None else "the request body"
    return wire.WireError(413, "RequestEntityTooLarge",
                          f"{shown} is over the {limit}-byte limit of an AdmissionReview")


def _endpoint(handlers: AdmissionHandlers,
              endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        return await handlers.admission(request, endpoint)
    return handle


HANDLERS_KEY = web.AppKey("handlers", AdmissionHandlers)


def build_app(admitter: Admitter, health: Health, metrics: Metrics,
              settings: ServerSettings) -> web.Application:
    """The application (see module docstring); ``app[HANDLERS_KEY]`` holds the handlers."""
    # Bodies up to the limit are read; the limit check answers 413 past it.
    app = web.Application(client_max_size=settings.max_body_bytes)
    handlers = AdmissionHandlers(admitter, health, metrics, settings)
    app[HANDLERS_KEY] = handlers
    for endpoint in ENDPOINTS:
        app.router.add_post(f"/{endpoint}", _endpoint(handlers, endpoint))
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_page)
    if settings.benchmark_routes:
        app.router.add_post("/null-validate", handlers.null_validate)
    return app
