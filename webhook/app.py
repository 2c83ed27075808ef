"""The aiohttp application: routes, request handling, the decision log line.

Routes: ``POST /validate`` and ``POST /mutate`` (AdmissionReview in, AdmissionReview out),
``GET /healthz`` (the process answers), ``GET /readyz`` (200 or 503 with a JSON detail of each
check), ``GET /metrics`` (Prometheus text format) and, only when
``ServerSettings.benchmark_routes`` is set, ``POST /null-validate`` (the same request reading
and response writing with no evaluation: the benchmark's baseline).

Every error answer is a Kubernetes ``Status`` body (``kind: Status``, ``code``, ``reason``,
``message``), aiohttp's own included (404, 405: a middleware turns them into one). Bad input is a
4xx naming what was wrong: 413 for a body over ``max_body_bytes`` (before or after inflating
it), 415 for another content type or content coding, 408 for a body that does not arrive within
``body_timeout_s``, 401 for a missing client certificate when ``client_auth`` is on, 400 for the
rest (see :mod:`webhook.wire`). A request that was understood is always answered 200 with an
AdmissionReview, even when the evaluation fails or runs out of time (then the policies'
failurePolicy decides, see :mod:`webhook.admission`); 503 only while no policy set has loaded,
and 500 only for a bug in gpuguard itself (logged with its traceback; the handler is fuzzed so
that no input reaches it). A client that goes away before its body has arrived is not an error:
one info line, counted as ``disconnected``.

Where a body is decoded: one of at most ``inline_max_bytes``, not compressed, on the event loop
(as its evaluation, see :mod:`webhook.admission`); a larger or compressed one — inflating, JSON,
the envelope — in the decode threads, so that one 3 MiB review (tens of milliseconds of JSON) or
a compressed bomb never holds the loop that answers ``/readyz`` and reads other requests. With
evaluation processes (``--eval-processes``), a large request whose policy set needs nothing of
this process (no quota ledger, no SubjectAccessReview) is decoded and evaluated in one of them
instead (:mod:`webhook.evaluators`): JSON decoding and CEL hold the GIL, so in threads they still
slowed the loop.

Each admission logs one JSON line (uid, kind, namespace/name, operation, decision, latency;
object bodies only with ``log_objects``).

Must not evaluate policies or know where policies, namespaces or certificates come from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from webhook import logs, wire
from webhook.admission import ENDPOINTS, Admitter, Decision, Endpoint
from webhook.evaluators import EvaluationProcesses
from webhook.health import Health
from webhook.memory import MemoryReturn
from webhook.metrics import CONTENT_TYPE, Metrics
from webhook.policy_store import PolicySnapshot
from webhook.settings import ServerSettings

ADMISSION_LOG = logging.getLogger("gpuguard.webhook.admission")
LOG = logging.getLogger("gpuguard.webhook.app")
_JSON = "application/json"
ROUTES = ("POST /validate", "POST /mutate", "GET /healthz", "GET /readyz", "GET /metrics")
DISCONNECTED = "disconnected"
# The requests_total decision of a 4xx / 503 answer, by status.
_OUTCOMES = {503: "unavailable", 401: "unauthorized", 429: "throttled"}


TURN_READ_S = 1.0
"""How long a large body may take to arrive while its request holds a turn (see
:class:`AdmissionHandlers`); kube-apiserver sends 3 MiB in milliseconds."""


class ClientDisconnected(Exception):
    """The client closed the connection before its request body had arrived."""


class _Body:
    """A request body as it is read: its chunks, their size, when reading began."""

    __slots__ = ("chunks", "size", "started_at")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.started_at: float | None = None

    def data(self) -> bytes:
        """The bytes read (one copy at most); the chunks are released."""
        chunks, self.chunks = self.chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _json_response(body: Mapping[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=wire.encode(body), status=status, content_type=_JSON)


def _error_response(error: wire.WireError) -> web.Response:
    response = _json_response(wire.error_body(error), error.status)
    if error.status in (401, 408, 413) or error.unread:  # the body may be partly unread
        response.force_close()
    if error.status == 429:
        response.headers["Retry-After"] = "1"
    return response


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
    """The request handlers, bound to their collaborators.

    A large request (see :meth:`large`) is read, decoded and evaluated in a turn: at most
    ``max_large_requests`` hold one at a time. Until its turn its body stays unread — aiohttp
    and asyncio stop reading a connection whose buffers are full — so a waiting body costs the
    event loop nothing and is held by TCP, not in memory. Reading in the turn, while no other
    large request is being decoded or evaluated, is what keeps the loop quick: every socket
    read makes the loop take the GIL back, and from a thread that is decoding or evaluating
    that takes up to the switch interval each time (measured: a 3 MiB body read next to an
    evaluation took ~150 ms instead of ~10 ms). A body that has not arrived within
    ``TURN_READ_S`` of its turn gives the turn up (a slow client must not hold it), is read to
    its end outside it, and waits for a turn again. A request whose deadline passes while it
    waits is answered 429 then, without being read or decoded (its connection is closed: the
    body is left unread), so the answer reaches the API server within the deadline however long
    the queue. A request answered by failurePolicy at its deadline while its
    evaluation still runs in a thread keeps its turn until that evaluation stops (at its next
    policy or rule; one more deadline at most), so that no more than ``max_large_requests``
    large evaluations hold memory and the GIL at once.

    Args:
        decode_executor: where large bodies are decoded; None: the event loop's default
            executor.
        memory: told when large requests begin and end (it trims the heap after a burst);
            None: nothing is trimmed.
        clock: monotonic seconds for the deadline's accounting (a request's arrival, its wait
            for a turn); None: the admitter's timer (the host's monotonic clock in the server).
            Tests inject one, or a ManualTimer into the admitter, so that "past the deadline"
            does not depend on how busy the machine is.
        processes: the evaluation processes (``--eval-processes``): a large request that
            :meth:`~webhook.admission.Admitter.offloadable` allows is read in one of their
            turns and decoded and decided there (:mod:`webhook.evaluators`); None: in this
            process's threads.
    """

    def __init__(self, admitter: Admitter, health: Health, metrics: Metrics,
                 settings: ServerSettings, *,
                 decode_executor: concurrent.futures.Executor | None = None,
                 memory: MemoryReturn | None = None,
                 clock: Callable[[], float] | None = None,
                 processes: EvaluationProcesses | None = None) -> None:
        self._clock = clock
        self.processes = processes
        self.admitter = admitter
        self.health = health
        self.metrics = metrics
        self.settings = settings
        self.decode_executor = decode_executor
        self.memory = memory
        self.in_flight = 0
        self.large_in_flight = 0
        self._turns = asyncio.Semaphore(settings.max_large_requests)
        self._holding: set[asyncio.Task[None]] = set()  # turns held for abandoned evaluations

    def large(self, request: web.Request) -> bool:
        """Whether ``request`` takes the large path: a body over ``inline_max_bytes``, or of
        unknown length (chunked), or compressed (any ``Content-Encoding``)."""
        length = request.content_length
        return length is None or length > self.settings.inline_max_bytes or \
            "Content-Encoding" in request.headers

    async def _read_body(self, request: web.Request, limit: int,
                         body: _Body | None = None, budget_s: float | None = None) -> bool:
        """Read the body into ``body`` (a fresh one by default; a partly read one goes on),
        at most ``limit`` bytes, within ``body_timeout_s`` of its start. Returns whether it is
        complete: False when ``budget_s`` (seconds of this call) ran out first.

        Raises:
            WireError: 413 past ``limit``; 408 when it does not arrive in time; 400 for broken
                framing (chunked encoding, a body shorter than its Content-Length).
            ClientDisconnected: the connection closed first.
        """
        body = body if body is not None else _Body()
        loop = asyncio.get_running_loop()
        if body.started_at is None:
            body.started_at = loop.time()
        body_deadline = body.started_at + self.settings.body_timeout_s
        until = body_deadline if budget_s is None else min(body_deadline, loop.time() + budget_s)
        content = request.content
        try:
            async with asyncio.timeout_at(until):
                while chunk := await content.readany():
                    body.size += len(chunk)
                    if body.size > limit:
                        raise _too_large(None, limit)
                    body.chunks.append(chunk)
        except TimeoutError:
            if loop.time() < body_deadline:
                return False  # the budget, not the body timeout, ran out
            raise wire.WireError(408, "Timeout", f"the request body did not arrive within "
                                 f"{self.settings.body_timeout_s:g} s ({body.size} bytes "
                                 "received)") from None
        except ConnectionError:
            raise ClientDisconnected from None
        except (web.RequestPayloadError, HttpProcessingError) as exc:
            raise wire.bad_request(f"the request body is malformed: {exc}") from None
        return True

    def _headers(self, request: web.Request) -> str | None:
        """Check what the headers say about the body; returns its content coding.

        Raises:
            WireError: 415 (content type or coding), 413 (Content-Length over the limit).
        """
        wire.check_content_type(request.headers.get("Content-Type"))
        coding = wire.content_coding(request.headers.get("Content-Encoding"))
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(request.content_length, limit)
        return coding

    async def _envelope(self, request: web.Request) -> wire.Envelope:
        """Read and check a small body on the event loop.

        Raises:
            WireError: 413, 415, 408 or 400.
            ClientDisconnected: the client went away while sending the body.
        """
        self._headers(request)
        body = _Body()
        await self._read_body(request, self.settings.max_body_bytes, body)
        return wire.decode_envelope(body.data(), max_depth=self.settings.max_depth)

    def _now(self) -> float:
        # The admitter's timer by default (the host's monotonic clock in the server): the
        # deadline of a request is one clock's, from its arrival to its evaluation's end.
        return self._clock() if self._clock is not None else self.admitter.timer.now()

    def _check_deadline(self, started_at: float, body: _Body) -> None:
        """Raise the 429 of a large request whose deadline passed while it waited for a turn
        (dropping what was read of its body first).

        Raises:
            WireError: 429.
        """
        waited = self._now() - started_at
        if waited < self.settings.deadline_s:
            return
        body.chunks.clear()  # the error's traceback holds the caller's frame, and so the body
        # (Raised here, not returned for the caller to raise: a frame holding the error in a
        # local is a reference cycle, which lives until the garbage collector's next full pass.)
        raise wire.WireError(
            429, "TooManyRequests",
            f"this request waited {round(waited * 1000)} ms for its turn behind other large "
            f"requests (--max-large-requests {self.settings.max_large_requests}), past its "
            f"{self.settings.deadline_ms} ms deadline; try again")

    async def _large_envelope(self, request: web.Request, started_at: float,
                              turn: list[bool]) -> wire.Envelope:
        """Take a turn, read a large body and decode it in a thread (see the class docstring);
        ``turn[0]`` says whether a turn is held (the caller gives it back with
        :meth:`_end_large`).

        Raises:
            WireError: 429 (the deadline passed while waiting), 413, 415, 408 or 400.
            ClientDisconnected: the client went away while sending the body.
        """
        coding = self._headers(request)
        data = await self._large_body(request, started_at, turn, self._turns)
        decode = functools.partial(wire.decode_body, data, coding,
                                   max_bytes=self.settings.max_body_bytes,
                                   max_depth=self.settings.max_depth)
        del data  # the thread holds the bytes until they are decoded
        return await asyncio.get_running_loop().run_in_executor(self.decode_executor, decode)

    async def _offloaded(self, request: web.Request, endpoint: Endpoint, started_at: float,
                         turn: list[bool], snapshot: PolicySnapshot,
                         ) -> tuple[wire.Envelope, Decision]:
        """A large request decided in an evaluation process (:mod:`webhook.evaluators`) with
        ``snapshot``, the set served when it arrived: its body read in one of the processes'
        turns, then handed over with the turn.

        Raises:
            WireError: as :meth:`_large_envelope` and
                :meth:`~webhook.evaluators.EvaluationProcesses.decide` say.
            ClientDisconnected: the client went away while sending the body.
        """
        assert self.processes is not None
        coding = self._headers(request)
        try:
            data = await self._large_body(request, started_at, turn, self.processes.turns)
        except BaseException:
            if turn[0]:  # a turn of the processes, not of _end_large's in-process turns
                turn[0] = False
                self.processes.turns.release()
            raise
        turn[0] = False  # decide() gives it back, once its process is free
        return await self.processes.decide(self.admitter, snapshot, data, coding, endpoint,
                                           self._now() - started_at)

    async def _large_body(self, request: web.Request, started_at: float, turn: list[bool],
                          turns: asyncio.Semaphore) -> bytes:
        """Take one of ``turns`` and read a large body in it (see the class docstring).

        Raises:
            WireError: 429 (the deadline passed while waiting), 413, 408 or 400.
            ClientDisconnected: the client went away while sending the body.
        """
        limit = self.settings.max_body_bytes
        body = _Body()
        await self._wait_for_turn(turns, started_at, None)
        turn[0] = True
        if self._now() - started_at >= self.settings.deadline_s:
            # Read it all the same (in turn, to keep the loop quick): the connection stays
            # usable.
            await self._read_body(request, limit, body)
            self._check_deadline(started_at, body)
        if not await self._read_body(request, limit, body, TURN_READ_S):
            turn[0] = False  # a slow body: let the others go first
            turns.release()
            await self._read_body(request, limit, body)
            await self._wait_for_turn(turns, started_at, body)
            turn[0] = True
            self._check_deadline(started_at, body)
        return body.data()

    async def _wait_for_turn(self, turns: asyncio.Semaphore, started_at: float,
                             body: _Body | None) -> None:
        """Take one of ``turns``, waiting no longer than the request's deadline (on the
        admitter's timer: tests move it by hand); ``body``: what was read of it already (the
        whole body, or None when none of it was read).

        Raises:
            WireError: 429 once the deadline passes first — answered then, with an unread body
                left unread (the connection is closed), not after the turn comes and the body
                is read: on a loaded machine that took several seconds past a 2.5 s deadline,
                beyond the webhook's timeoutSeconds, so the API server timed out instead of
                reading the 429.
        """
        timer = self.admitter.timer
        spent = self._now() - started_at
        waiting_from = timer.now()
        try:
            async with timer.timeout_at(waiting_from + self.settings.deadline_s - spent):
                await turns.acquire()
        except TimeoutError:
            waited = spent + timer.now() - waiting_from
            if body is not None:
                body.chunks.clear()  # the traceback holds the caller's frame (_check_deadline)
            raise wire.WireError(
                429, "TooManyRequests",
                f"this request waited {round(waited * 1000)} ms for its turn behind other large "
                f"requests (--max-large-requests {self.settings.max_large_requests}), reaching "
                f"its {self.settings.deadline_ms} ms deadline; try again",
                unread=body is None) from None

    def _begin_large(self) -> None:
        self.large_in_flight += 1
        if self.memory is not None:
            self.memory.begin()

    def _end_large(self, turn: list[bool],
                   running: Sequence[concurrent.futures.Future[Any]] = ()) -> None:
        """A large request was answered: give its turn back — once the evaluations it left
        running past its deadline (``running``) have stopped, so that the turns bound the large
        evaluations in memory and on the GIL at once, not just the requests."""
        self.large_in_flight -= 1
        still = [future for future in running if not future.done()]
        if not still:
            self._release_large(turn[0])
            return
        task = asyncio.get_running_loop().create_task(self._hold_turn(turn[0], still))
        self._holding.add(task)
        task.add_done_callback(self._holding.discard)

    async def _hold_turn(self, held: bool,
                         running: Sequence[concurrent.futures.Future[Any]]) -> None:
        """Release the turn when ``running`` have ended, or after one more deadline at most
        (an evaluation stops at its next policy or rule: one that does not must not hold the
        turn for good)."""
        timer = self.admitter.timer
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        pending = set(running)

        def one_ended(future: concurrent.futures.Future[Any]) -> None:  # on the loop
            pending.discard(future)
            if not pending and not ended.done():
                ended.set_result(None)

        def in_thread(future: concurrent.futures.Future[Any]) -> None:
            # Not asyncio.wrap_future: its copy of the evaluation's exception (EvaluationExpired)
            # would be logged as never retrieved.
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(one_ended, future)

        for future in running:
            future.add_done_callback(in_thread)
        try:
            async with timer.timeout_at(timer.now() + self.settings.deadline_s):
                await ended
        except TimeoutError:
            LOG.warning("an evaluation abandoned at its deadline is still running; its large-"
                        "request turn is given back", extra={"fields": {
                            "after_ms": self.settings.deadline_ms}})
        finally:
            self._release_large(held)

    def _release_large(self, held: bool) -> None:
        if held:
            self._turns.release()  # only the in-process path's turns are left held here
        if self.memory is not None:
            self.memory.end()

    def _authorized(self, request: web.Request) -> bool:
        """Whether the client presented a certificate (verified by the TLS context against
        ``--client-ca`` during the handshake), when ``client_auth`` requires one."""
        if not self.settings.client_auth:
            return True
        transport = request.transport
        return bool(transport is not None and transport.get_extra_info("peercert"))

    async def admission(self, request: web.Request, endpoint: Endpoint) -> web.Response:
        """``POST /validate`` and ``POST /mutate``."""
        start = time.perf_counter()
        started_at = self._now()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        envelope: wire.Envelope | None = None
        large: list[bool] | None = None  # [holds a decode turn] on the large path
        running: list[concurrent.futures.Future[Any]] = []  # evaluations left past the deadline
        try:
            if not self._authorized(request):
                raise wire.WireError(401, "Unauthorized", f"/{endpoint} requires a client "
                                     "certificate signed by the CA given to --client-ca")
            snapshot = self.admitter.store.current  # the set this request is answered by
            if self.large(request) and self.processes is not None and \
                    self.admitter.offloadable(snapshot, Endpoint(endpoint)):
                assert snapshot is not None
                large = [False]
                self._begin_large()
                envelope, decision = await self._offloaded(request, Endpoint(endpoint),
                                                           started_at, large, snapshot)
            else:
                if self.large(request):
                    large = [False]
                    self._begin_large()
                    envelope = await self._large_envelope(request, started_at, large)
                else:
                    envelope = await self._envelope(request)
                # A large request's deadline counts its wait for a decode turn and its read; a
                # small one's read is bounded by the body timeout and not counted, so the
                # deadline is the admitter's own clock alone (tests move it by hand).
                waited_s = self._now() - started_at if large is not None else 0.0
                decision = await self.admitter.admit(envelope, Endpoint(endpoint),
                                                     waited_s=waited_s,
                                                     abandoned=running.append)
        except wire.WireError as error:
            seconds = time.perf_counter() - start
            self.metrics.observe(endpoint, _OUTCOMES.get(error.status, "bad_request"), seconds)
            fields: dict[str, Any] = {"endpoint": endpoint,
                                      "uid": envelope.uid if envelope else None}
            if envelope is not None:
                _identity(envelope.request, fields)
            fields.update(status=error.status, error=error.message,
                          latency_ms=round(seconds * 1000, 3))
            logs.log_fields(ADMISSION_LOG, logging.WARNING, "admission request rejected", fields)
            return _error_response(error)
        except ClientDisconnected:
            seconds = time.perf_counter() - start
            self.metrics.observe(endpoint, DISCONNECTED, seconds)
            logs.log_fields(ADMISSION_LOG, logging.INFO, "client disconnected before sending "
                            "the whole request body", {"endpoint": endpoint,
                                                       "latency_ms": round(seconds * 1000, 3)})
            return _error_response(wire.bad_request("the connection closed before the request "
                                                    "body arrived"))  # nobody reads it
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
            if large is not None:
                self._end_large(large, running)
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
        """``POST /null-validate``: read and answer an AdmissionReview without evaluating it
        (the same reading and decoding paths as the admission endpoints)."""
        large: list[bool] | None = None
        try:
            if self.large(request):
                large = [False]
                self._begin_large()
                envelope = await self._large_envelope(request, self._now(), large)
            else:
                envelope = await self._envelope(request)
        except wire.WireError as error:
            return _error_response(error)
        except ClientDisconnected:
            return _error_response(wire.bad_request("the connection closed early"))
        finally:
            if large is not None:
                self._end_large(large)
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


def _http_error_message(request: web.Request, error: web.HTTPException) -> str:
    target = wire.clean_warning(f"{request.method} {request.path}")[:200]
    if error.status == 404:
        return f"{target}: no such endpoint; gpuguard serves {', '.join(ROUTES)}"
    if error.status == 405:
        allowed = error.headers.get("Allow", "")
        return f"{target}: method not allowed; use {allowed or 'another method'}"
    return f"{target}: {error.reason}"


@web.middleware
async def status_errors(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
    """Answer every error as a Kubernetes ``Status`` (aiohttp's 404, 405, 413 ... included);
    an exception that escaped a handler (a bug) is logged with its traceback and answered 500.
    """
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = _json_response(wire.status_body(
            error.status, wire.status_reason(error.status),
            _http_error_message(request, error)), error.status)
        if "Allow" in error.headers:
            response.headers["Allow"] = error.headers["Allow"]
        return response
    except asyncio.CancelledError:
        raise
    except Exception:
        LOG.exception("request handler failed", extra={"fields": {
            "method": request.method, "path": request.path[:200]}})
        return _json_response(wire.status_body(500, "InternalError", "gpuguard failed to "
                                               "handle the request; see its log"), 500)


HANDLERS_KEY = web.AppKey("handlers", AdmissionHandlers)


def build_app(admitter: Admitter, health: Health, metrics: Metrics,
              settings: ServerSettings, *,
              decode_executor: concurrent.futures.Executor | None = None,
              memory: MemoryReturn | None = None,
              middlewares: tuple[Any, ...] = (),
              clock: Callable[[], float] | None = None,
              processes: EvaluationProcesses | None = None) -> web.Application:
    """The application (see module docstring); ``app[HANDLERS_KEY]`` holds the handlers.

    ``decode_executor`` / ``memory`` / ``clock`` / ``processes``: see :class:`AdmissionHandlers`;
    ``middlewares`` run outside the ``Status`` one (the connection guard's). Serve it with
    aiohttp's body decompression off (:func:`webhook.connections.handler_args`): this app
    inflates bodies itself, under the limit and off the loop.
    """
    # Bodies are read by the handlers (under the limit); this bounds any other reader.
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[*middlewares, status_errors])
    handlers = AdmissionHandlers(admitter, health, metrics, settings,
                                 decode_executor=decode_executor, memory=memory, clock=clock,
                                 processes=processes)
    app[HANDLERS_KEY] = handlers
    for endpoint in ENDPOINTS:
        app.router.add_post(f"/{endpoint}", _endpoint(handlers, endpoint))
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_page)
    if settings.benchmark_routes:
        app.router.add_post("/null-validate", handlers.null_validate)
    return app
