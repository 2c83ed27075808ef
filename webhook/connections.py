"""The admission server's connections: the bounds aiohttp's own HTTP server does not set.

Owns :class:`ConnectionGuard`, the request handler protocol it hands out
(:class:`GuardedRequestHandler`), its middleware and the listening site (:class:`GuardedSite`):

- **Header-read timeout.** A connection must complete its TLS handshake and the header block of a
  request within ``header_timeout_s`` of being accepted, or of the first byte of its next request
  on a keep-alive connection; one that does not (slowloris) is closed. aiohttp only knows the
  keep-alive timeout (120 s), which a client dripping a header byte at a time never reaches.
  Checked by :meth:`ConnectionGuard.sweep` once a second, so a request costs one attribute store
  and no timer. Idle keep-alive connections are left to the keep-alive timeout; a request's body
  has its own timeout (``body_timeout_s``, in :mod:`webhook.app`).
- **Idle cap.** At most ``max_idle`` connections are kept idle between requests; the sweep closes
  the longest-idle ones beyond that, once they have been idle ``IDLE_GRACE_S`` — those a Go client
  (kube-apiserver) would reuse last, as its idle pool hands out the most recently used connection
  first, and a client under load does not leave idle that long — so the buffers of a burst's
  connections are given back once it is over.
- **Connection cap.** At most ``max_connections`` are open. A new one at the cap evicts the
  connection stuck longest before its request header, else the longest idle one, else it is closed
  itself: a client holding many connections open cannot lock kube-apiserver out, and memory stays
  bounded (an idle TLS connection holds ~130 KiB, 134 KB measured: the read buffer that
  :func:`limit_tls_reads` lowers to 64 KiB, and OpenSSL's state).
- **TLS read size.** asyncio reads a TLS connection in pieces of up to
  ``SSLProtocol.max_size`` (256 KiB) into a buffer of that size allocated — and zeroed — per
  connection. :func:`limit_tls_reads` lowers it to 64 KiB for the process: an idle connection
  holds 192 KiB less, and one turn of the event loop over many sending connections decrypts
  64 KiB per connection instead of 256 KiB (a burst of large reviews held ``/readyz`` behind
  those reads).
- **Malformed HTTP** (a bad request line, a header over 8 KiB, bad chunked framing) is answered
  400 with a Kubernetes ``Status`` body and the connection closed, logged as one JSON line without
  a traceback — aiohttp answers plain text and logs a traceback.

Closed connections are counted in ``gpuguard_http_connections_closed_total{reason}``.

Must not read request bodies, route requests or know about admission (:mod:`webhook.app` does).
Relies on aiohttp's :class:`~aiohttp.web_protocol.RequestHandler` (subclassed for the three hooks:
connection made / lost, data received, error answer) and its ``web.Server`` as the connection
manager; the pinned aiohttp range (``>=3.9,<4``) keeps those.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from webhook import wire
from webhook.metrics import CLOSE_REASONS, Metrics

LOG = logging.getLogger("gpuguard.webhook.connections")
HEADER_TIMEOUT, IDLE_LIMIT, CONNECTION_LIMIT, MALFORMED = CLOSE_REASONS
SWEEP_INTERVAL_S = 1.0
IDLE_GRACE_S = 5.0
TLS_READ_BYTES = 64 * 1024
# After answering a request whose body was not read (413, 408, 401), how long the rest of the
# body is read and dropped before the connection closes (aiohttp's lingering close; its default
# is 10 s, which a slow client would hold).
LINGERING_S = 2.0


class ConnectionGuard:
    """The open connections of one server, their header-read timeout and their cap.

    Args:
        header_timeout_s: seconds a connection may take to send a complete request header
            (see module docstring).
        max_connections: the most connections kept open.
        metrics: where opened / closed connections are counted.
        max_idle: the most connections kept idle (see module docstring); default no cap.
        clock: monotonic seconds (injected by tests).
        on_sweep_closed: called after a sweep that closed connections (e.g. to trim the heap).
    """

    def __init__(self, header_timeout_s: float, max_connections: int, metrics: Metrics, *,
                 max_idle: int | None = None, clock: Callable[[], float] = time.monotonic,
                 on_sweep_closed: Callable[[], None] | None = None) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.metrics = metrics
        self.clock = clock
        self.on_sweep_closed = on_sweep_closed
        self._open: dict[GuardedRequestHandler, None] = {}  # insertion order: oldest first

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._open)

    def opened(self, connection: GuardedRequestHandler) -> None:
        """Count a new connection; at the cap, evict one (see module docstring) or close it."""
        self._open[connection] = None
        self.metrics.connections_open.inc()
        if len(self._open) <= self.max_connections:
            return
        victim = self._eviction_candidate(connection)
        if victim is None:
            self.close(connection, CONNECTION_LIMIT, "no connection is idle to make room")
        else:
            self.close(victim, CONNECTION_LIMIT, "evicted to make room for a new connection")

    def lost(self, connection: GuardedRequestHandler) -> None:
        """Forget a closed connection (again: no effect)."""
        if connection in self._open:
            del self._open[connection]
            self.metrics.connections_open.dec()

    def _eviction_candidate(self, new: GuardedRequestHandler) -> GuardedRequestHandler | None:
        pending: tuple[float, GuardedRequestHandler] | None = None  # stuck longest first
        idle: tuple[float, GuardedRequestHandler] | None = None  # idle longest first
        for connection in self._open:
            if connection is new or connection.busy:
                continue
            since = connection.header_since
            if since is not None:
                if pending is None or since < pending[0]:
                    pending = (since, connection)
            elif idle is None or connection.last_active < idle[0]:
                idle = (connection.last_active, connection)
        chosen = pending or idle
        return chosen[1] if chosen is not None else None

    def close(self, connection: GuardedRequestHandler, reason: str, detail: str) -> None:
        """Abort ``connection`` now (no TLS close_notify wait), count and log it."""
        self.metrics.connections_closed.labels(reason).inc()
        LOG.warning("connection closed", extra={"fields": {
            "reason": reason, "detail": detail, "peer": _peer(connection),
            "open": len(self._open)}})
        transport = connection.transport
        if transport is not None:
            transport.abort()
        self.lost(connection)

    def sweep(self) -> int:
        """Close the connections whose request header is overdue, and the longest-idle ones
        beyond ``max_idle`` that have been idle ``IDLE_GRACE_S``; returns how many were
        closed."""
        now = self.clock()
        overdue = [c for c in self._open if not c.busy and c.header_since is not None
                   and now - c.header_since >= self.header_timeout_s]
        for connection in overdue:
            self.close(connection, HEADER_TIMEOUT,
                       f"no complete request header within {self.header_timeout_s:g} s")
        closed = len(overdue)
        if self.max_idle is not None:
            idle = [c for c in self._open if not c.busy and c.header_since is None]
            if len(idle) > self.max_idle:
                idle.sort(key=lambda c: c.last_active)
                for connection in idle[:len(idle) - self.max_idle]:
                    if now - connection.last_active < IDLE_GRACE_S:
                        break  # the rest are idle for less time still
                    self._close_idle(connection)
                    closed += 1
        if closed and self.on_sweep_closed is not None:
            self.on_sweep_closed()
        return closed

    def _close_idle(self, connection: GuardedRequestHandler) -> None:
        """Close an idle connection beyond the idle cap: counted, logged at debug only (after
        a burst there are many, and nothing is wrong)."""
        self.metrics.connections_closed.labels(IDLE_LIMIT).inc()
        LOG.debug("idle connection closed", extra={"fields": {
            "reason": IDLE_LIMIT, "peer": _peer(connection), "max_idle": self.max_idle}})
        transport = connection.transport
        if transport is not None:
            transport.close()  # idle: no request is cut; a TLS close_notify is sent
        self.lost(connection)

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Sweep every ``interval_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.sweep()

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        """Mark the connection busy while its request is handled (its header is complete)."""
        protocol = request.protocol
        if not isinstance(protocol, GuardedRequestHandler):
            return await handler(request)
        protocol.header_since = None
        protocol.busy = True
        try:
            return await handler(request)
        finally:
            protocol.busy = False
            protocol.last_active = self.clock()


def _peer(connection: RequestHandler) -> str | None:
    transport = connection.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return None


class GuardedRequestHandler(RequestHandler):
    """aiohttp's HTTP/1.1 protocol with the guard's hooks (see module docstring).

    Attributes:
        header_since: monotonic time since which a request header is owed (the connection was
            made, or the first byte of its next request arrived); None while none is.
        busy: a request of this connection is being handled.
        last_active: monotonic time of the last request's end (or of the connection's start).
    """

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.header_since: float | None = None
        self.busy = False
        self.last_active = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start owing a request header; count the connection (which may close it)."""
        super().connection_made(transport)
        now = self.guard.clock()
        self.header_since = self.last_active = now
        self.guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        """Forget the connection."""
        self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """The first byte of a request starts the header-read timeout."""
        if self.header_since is None and not self.busy:
            self.header_since = self.guard.clock()
        super().data_received(data)

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Answer a request aiohttp could not handle with a ``Status`` body, and close.

        400 (malformed HTTP, from the parser) is logged as one warning line; anything else
        (a 500: an exception that escaped every handler, a bug) with its traceback.
        """
        if request.writer.output_size > 0:  # a response has begun: nothing can be added
            raise ConnectionError("the response is already being sent")
        reason = wire.status_reason(status)
        if status < 500:
            self.guard.metrics.connections_closed.labels(MALFORMED).inc()
            text = f"malformed HTTP request: {message or exc or 'unreadable'}"
            LOG.warning("malformed HTTP request", extra={"fields": {
                "status": status, "error": str(message or exc), "peer": _peer(self)}})
        else:
            text = "gpuguard failed to handle the request; see its log"
            LOG.error("request failed outside the handlers", exc_info=exc,
                      extra={"fields": {"status": status, "peer": _peer(self)}})
        response = web.Response(body=wire.encode(wire.status_body(status, reason, text)),
                                status=status, content_type="application/json")
        response.force_close()
        return response


class GuardedSite(web.BaseSite):
    """A TCP (optionally TLS) listener whose connections are :class:`GuardedRequestHandler`.

    As aiohttp's ``TCPSite``, plus the guard and asyncio's TLS handshake and shutdown timeouts
    (``header_timeout_s``: a handshake is part of what a connection owes before its header).

    Args:
        runner: the set-up runner (its ``server`` manages the connections).
        guard: the connection guard.
        handler_args: the request handler's settings (as given to ``web.AppRunner``).
        host / port: the address (port 0: any free port).
        ssl_context: the server TLS context, or None for plain HTTP (tests).
        reuse_port: ``SO_REUSEPORT`` (several workers on one port).
    """

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard,
                 handler_args: dict[str, Any], host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None = None, reuse_port: bool | None = None,
                 backlog: int = 128) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._guard = guard
        self._handler_args = handler_args
        self._host = host
        self._port = port
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        """``https://host:port`` (or ``http://``)."""
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen.

        Raises:
            OSError: the address cannot be bound.
        """
        await super().start()
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None, "the runner is set up before its sites start"
        guard, args = self._guard, self._handler_args

        def protocol() -> GuardedRequestHandler:
            return GuardedRequestHandler(manager, guard, loop=loop, **args)

        # None (asyncio's defaults) without TLS: asyncio refuses TLS timeouts for plain TCP.
        tls_timeout = guard.header_timeout_s if self._ssl_context is not None else None
        self._server = await loop.create_server(
            protocol, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_port=self._reuse_port, ssl_handshake_timeout=tls_timeout,
            ssl_shutdown_timeout=tls_timeout)


def limit_tls_reads(size: int = TLS_READ_BYTES) -> bool:
    """Make asyncio read TLS connections in pieces of at most ``size`` bytes (see module
    docstring), for connections accepted from now on in this process.

    Returns whether it was set: False when asyncio's SSL protocol has no ``max_size`` class
    attribute (another Python), which leaves asyncio's default.
    """
    current = getattr(sslproto.SSLProtocol, "max_size", None)
    if not isinstance(current, int):
        return False
    sslproto.SSLProtocol.max_size = size
    return True


def handler_args(*, keepalive_s: float) -> dict[str, Any]:
    """The request handler settings of the admission server (``web.AppRunner`` keywords).

    Bodies are not decompressed by aiohttp (``auto_decompress=False``): :mod:`webhook.app`
    inflates them under the body limit off the event loop. No access log: each admission has
    its decision line.
    """
    return {"keepalive_timeout": keepalive_s, "access_log": None, "auto_decompress": False,
            "lingering_time": LINGERING_S}
