"""Evaluation processes: large AdmissionReviews decoded and evaluated off the serving process.

Owns the pool of worker processes (``ServerSettings.eval_processes``; forkserver) that take the
CPU-heavy part of a large request — JSON decoding and the policy evaluation — so that the
serving process's GIL stays free for its event loop (``/readyz``, reading other requests): in
threads, a 3 MiB review of 60,000 env entries held the GIL for ~100 ms at a time.

A request goes through one slot (one process, its own ``ProcessPoolExecutor`` so that a hung
one can be replaced alone) in two jobs: :func:`decode_job` (the body's bytes in; the envelope's
``uid`` / ``apiVersion``, the fields of the decision log line and the namespace out; the
decoded request stays in the process) and :func:`evaluate_job` (the namespace object, the
RuntimeClass names, the time and the deadline in; the :class:`~webhook.admission.Decision`
out, its failurePolicy fallback included). The policy set travels as its recipe — the loader
and the snapshot of files it was built from (:attr:`PolicySnapshot.source`; a compiled engine
cannot be pickled) — with its generation and content hash: a process builds the engine once per
generation, keeps the last two, and refuses to evaluate when its rebuilt set's hash differs.
A request is answered by the generation served when it arrived (captured by the caller).

Failures never fail open: a process that exits or raises answers an ``InternalError`` denial
(after the envelope was read) or a 500 ``Status`` (before); a job past the request deadline is
answered at the deadline — by the policies' failurePolicy, every policy of the endpoint counted
as matching, since this process never saw the request — and its result discarded; a process
still busy ``grace_s`` after that is killed and replaced.

Must not read HTTP requests or decide which requests come here (:mod:`webhook.app` and
:meth:`webhook.admission.Admitter.offloadable` do).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import gc
import logging
import math
import multiprocessing
import os
import pickle
import time
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any

from policies.authorization import Unavailable
from policies.cel.runtime import checked_json
from policies.engine.evaluation import EvaluationExpired
from webhook import wire
from webhook.admission import (
    CHECKED_MIN_BYTES,
    DEADLINE,
    DENIED,
    EXCEPTION,
    NOT_EVALUATED,
    NOT_EVALUATED_SUBRESOURCES,
    Admitter,
    Decision,
    Endpoint,
    decision_of,
    fallback_decision,
    namespace_of,
    review_of,
)
from webhook.memory import MALLOC_TRIM, fix_mmap_threshold
from webhook.policy_store import PolicySnapshot
from webhook.timer import Timer

LOG = logging.getLogger("gpuguard.webhook.evaluators")
QUIET_S = 5.0
"""Seconds without a request in any process before the idle check (class docstring)."""
RECYCLE_GROWTH = 0.2
"""Growth over its warm resident memory past which an idle process is replaced (0.2: +20 %)."""
_KEPT_ENGINES = 2  # the set served and the one before it (requests that arrived before a reload)


class WorkerFailed(Exception):
    """An evaluation process exited or raised; the message says which (one argument, so that
    it pickles back from a worker)."""


@dataclass(frozen=True)
class Decoded:
    """What :func:`decode_job` returns: the envelope's fields, or the wire error.

    ``request``: only the fields the decision log line reads (see ``webhook.app._identity``),
    never the object. ``error``: ``(status, reason, message)`` of a
    :class:`~webhook.wire.WireError`.
    """

    api_version: str = ""
    uid: str = ""
    size: int = 0
    request: Mapping[str, Any] | None = None
    namespace: str | None = None
    not_evaluated: bool = False
    error: tuple[int, str, str] | None = None


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate_job` needs besides the decoded request it kept."""

    token: int
    generation: int
    digest: str
    recipe: bytes
    endpoint: str
    namespace_object: Mapping[str, Any] | None
    runtime_classes: frozenset[str] | None
    now: datetime.datetime
    deadline_at: float  # time.monotonic() seconds (one clock for every process of the host)
    deadline_ms: int
    authorizer: Unavailable | None = None  # one that asks nobody (Admitter.offloadable)


# In a worker process: the decoded request of the job in hand, and the engines by generation.
_DECODED: dict[int, wire.Envelope] = {}
_ENGINES: dict[tuple[int, str], PolicySnapshot] = {}


def _initialize() -> None:
    fix_mmap_threshold()  # a decoded 3 MiB body goes back to the system when freed
    # Decoding a 3 MiB body makes ~10^5 objects, which would set off full collections over the
    # engine again and again; a request's objects hold no cycles, and each job ends with a
    # young-generation collection (:func:`_after_job`), what a cycle an engine cache makes
    # needs; the engines themselves are frozen once built.
    gc.disable()


def _after_job() -> None:
    gc.collect(1)
    if MALLOC_TRIM is not None:
        MALLOC_TRIM()  # the decoded body's pages back to the system between bursts


def _log_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``request`` that the decision log line reads, without the object."""
    obj = request.get("object")
    if not isinstance(obj, dict):
        obj = request.get("oldObject")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    kept = {key: request[key] for key in ("kind", "namespace", "name", "operation",
                                           "subResource", "dryRun") if key in request}
    user = request.get("userInfo")
    if isinstance(user, dict):
        kept["userInfo"] = {"username": user.get("username")}
    if isinstance(metadata, dict):
        kept["object"] = {"metadata": {key: metadata[key] for key in
                                       ("namespace", "name", "generateName") if key in metadata}}
    return kept


def decode_job(token: int, body: bytes, coding: str | None, max_bytes: int,
               max_depth: int) -> Decoded:
    """In a worker: decode ``body`` (:func:`webhook.wire.decode_body`) and keep the request
    under ``token`` for :func:`evaluate_job` (only the latest one is kept)."""
    _DECODED.clear()
    try:
        envelope = wire.decode_body(body, coding, max_bytes=max_bytes, max_depth=max_depth)
    except wire.WireError as error:
        return Decoded(error=(error.status, error.reason, error.message))
    request = envelope.request
    subresource = request.get("subResource")
    skipped = isinstance(subresource, str) and subresource in NOT_EVALUATED_SUBRESOURCES
    if not skipped:
        _DECODED[token] = envelope
    return Decoded(envelope.api_version, envelope.uid, envelope.size, _log_request(request),
                   namespace_of(request), skipped)


def _engine(job: Evaluation) -> PolicySnapshot:
    """The policy set of ``job``'s generation, built here from its recipe once.

    Raises:
        WorkerFailed: the recipe does not build the set it names (its hash differs, or it has
            errors): never evaluate with another set than the one served.
    """
    key = (job.generation, job.digest)
    snapshot = _ENGINES.get(key)
    if snapshot is None:
        loader, source = pickle.loads(job.recipe)
        loaded = loader(source)
        if loaded.errors or loaded.engine.policies.digest != job.digest:
            raise WorkerFailed(f"the policy set rebuilt in the evaluation process is not "
                               f"generation {job.generation} ({job.digest})")
        snapshot = PolicySnapshot(loaded.engine, job.generation, (), ())
        while len(_ENGINES) >= _KEPT_ENGINES:
            del _ENGINES[next(iter(_ENGINES))]
        _ENGINES[key] = snapshot
        gc.collect()
        gc.freeze()  # out of every later collection's scan (as the server does at start)
    return snapshot


def rss_job() -> int:
    """In a worker: its resident memory in KiB (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0


def warm_job(job: Evaluation) -> int:
    """In a worker: build ``job``'s policy set ahead of its requests; returns the resident KiB
    after (the process's baseline, see :class:`EvaluationProcesses`)."""
    _engine(job)
    _after_job()
    return rss_job()


def evaluate_job(job: Evaluation) -> Decision | Decoded:
    """In a worker: decide the request kept under ``job.token`` with ``job``'s policy set.

    The Decision has no ``review`` and no ``policy_set`` (the caller puts its own snapshot in).
    A request that cannot be evaluated (as ``Admitter.review_input`` says: 400) comes back as
    a :class:`Decoded` with its ``error`` (a WireError does not pickle back).

    Raises:
        WorkerFailed: the request is no longer here, or the policy set cannot be rebuilt.
    """
    envelope = _DECODED.pop(job.token, None)
    if envelope is None:
        raise WorkerFailed("the evaluation process no longer holds the decoded request")
    try:
        snapshot = _engine(job)
        request = envelope.request
        try:
            review = review_of(request, job.namespace_object, job.now, job.runtime_classes)
        except wire.WireError as error:
            return Decoded(error=(error.status, error.reason, error.message))
        endpoint = Endpoint(job.endpoint)
        mutate = endpoint == Endpoint.MUTATE
        checked = checked_json(request.get("object"), request.get("oldObject")) \
            if envelope.checked and envelope.size >= CHECKED_MIN_BYTES else None
        with checked if checked is not None else contextlib.nullcontext():
            try:
                verdict = snapshot.engine.evaluate(
                    review, mutate=mutate, validate=not mutate,
                    expired=lambda: time.monotonic() >= job.deadline_at,
                    authorizer=job.authorizer)
            except EvaluationExpired:
                decision = fallback_decision(snapshot, review, endpoint, DEADLINE,
                                             f"the evaluation did not finish within the "
                                             f"{job.deadline_ms} ms deadline")
            except Exception as exc:  # an engine bug: the policies' failurePolicy decides
                decision = fallback_decision(snapshot, review, endpoint, EXCEPTION,
                                             f"the evaluation failed ({type(exc).__name__}: "
                                             f"{exc})")
            else:
                decision = decision_of(verdict, review, snapshot, mutate)
        return replace(decision, review=None, policy_set=None)
    finally:
        del envelope
        _after_job()


class _Slot:
    """One evaluation process: its own executor of one worker; its resident KiB once warm
    (``baseline``, 0 until known; raised to what it holds at its first idle check after
    requests, ``settled``) and whether it ran a request since the last idle check."""

    __slots__ = ("baseline", "executor", "settled", "used")

    def __init__(self, executor: concurrent.futures.ProcessPoolExecutor) -> None:
        self.executor = executor
        self.baseline = 0
        self.settled = False
        self.used = False


class EvaluationProcesses:
    """The pool (see module docstring).

    Args:
        count: processes (``--eval-processes``).
        timer: the clock of request deadlines (:mod:`webhook.timer`; tests inject one).
        grace_s: how long a job may run past its deadline before its process is replaced.
        worker_deadline: also stop an evaluation in its process at the deadline (on the
            host's monotonic clock, the one ``timer`` is in a server), so that its fallback can
            name the policies that match; False for tests whose ``timer`` moves by hand (this
            process still answers at its deadline).
        context: the multiprocessing start method (forkserver: a clean interpreter, no copy of
            the server's threads or sockets).
        decode / evaluate: the worker functions (module-level, picklable); tests pass others
            to make a worker crash or hang.

    ``turns`` (a semaphore of ``count``) bounds the large requests being read and decided;
    :meth:`decide` gives the turn back when its slot is free again.

    Memory after a burst: a process that decoded many large bodies keeps part of their memory
    (Python's arenas and malloc's, fragmented by what the engine caches between them). Once no
    request has been in a process for ``quiet_s`` and every process is free, each one that ran
    requests and holds more than ``1 + recycle_growth`` times its settled resident memory — what
    it held at its first such check, its working set — is replaced by a fresh one, which builds
    the served set at once, off any request's path (a request arriving meanwhile waits for it).
    """

    def __init__(self, count: int, timer: Timer, *, grace_s: float,
                 quiet_s: float = QUIET_S, recycle_growth: float = RECYCLE_GROWTH,
                 worker_deadline: bool = True, context: str = "forkserver",
                 decode: Callable[..., Decoded] = decode_job,
                 evaluate: Callable[[Evaluation], Decision | Decoded] = evaluate_job,
                 ) -> None:
        self._context = multiprocessing.get_context(context)
        self.timer = timer
        self.grace_s = grace_s
        self._decode = decode
        self._evaluate = evaluate
        self._slots = [_Slot(self._executor()) for _ in range(count)]
        self._free = list(self._slots)
        self.turns = asyncio.Semaphore(count)
        self._recipes: dict[tuple[int, str], bytes] = {}
        self._token = 0
        self._holding: set[asyncio.Task[None]] = set()
        self._warm: Evaluation | None = None  # the last warm-up job (for replaced processes)
        self.replaced = 0
        self.worker_deadline = worker_deadline
        self.quiet_s = quiet_s
        self.recycle_growth = recycle_growth
        self._last_used = 0.0
        self._idle_check: asyncio.Task[None] | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(1, mp_context=self._context,
                                                      initializer=_initialize)

    def recipe(self, snapshot: PolicySnapshot) -> bytes:
        """The pickled ``(loader, source)`` of ``snapshot`` (once per generation)."""
        key = (snapshot.generation, snapshot.digest)
        data = self._recipes.get(key)
        if data is None:
            if snapshot.loader is None:
                raise WorkerFailed("the policy set has no loader to rebuild it with")
            data = pickle.dumps((snapshot.loader, snapshot.source))
            self._recipes = {k: v for k, v in self._recipes.items()
                             if k[0] >= snapshot.generation - 1}
            self._recipes[key] = data
        return data

    def _job(self, snapshot: PolicySnapshot, token: int, endpoint: str,
             namespace_object: Mapping[str, Any] | None, classes: frozenset[str] | None,
             now: datetime.datetime, left_s: float, deadline_ms: int,
             authorizer: Unavailable | None = None) -> Evaluation:
        return Evaluation(token, snapshot.generation, snapshot.digest, self.recipe(snapshot),
                          endpoint, namespace_object, classes, now,
                          time.monotonic() + left_s if self.worker_deadline else math.inf,
                          deadline_ms, authorizer)

    def warm(self, snapshot: PolicySnapshot) -> list[concurrent.futures.Future[int]]:
        """Have every process build ``snapshot``'s engine now (after a load), not at its first
        request; returns the jobs (the server waits for the first load's before it listens); a
        failure shows at the first request."""
        job = self._warm = self._job(snapshot, 0, Endpoint.VALIDATE, None, None,
                                     datetime.datetime.now(datetime.UTC), 0.0, 0)
        return [future for slot in self._slots
                if (future := self._warm_slot(slot, job)) is not None]

    def _warm_slot(self, slot: _Slot,
                   job: Evaluation) -> concurrent.futures.Future[int] | None:
        def baseline(future: concurrent.futures.Future[int]) -> None:  # in a pool thread
            if not future.cancelled() and future.exception() is None and \
                    slot.executor is executor:
                slot.baseline = future.result()

        executor = slot.executor
        try:
            future = executor.submit(warm_job, job)
        except (RuntimeError, BrokenProcessPool):
            return None
        future.add_done_callback(baseline)
        return future

    def _replace(self, slot: _Slot, why: str) -> None:
        """Kill ``slot``'s process and start another."""
        old = slot.executor
        # ProcessPoolExecutor has no public way to stop a busy worker before Python 3.14
        # (terminate_workers): kill its processes, then let it shut down.
        for process in list(getattr(old, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        old.shutdown(wait=False, cancel_futures=True)
        slot.executor = self._executor()
        slot.baseline, slot.used, slot.settled = 0, False, False
        if self._warm is not None:  # the new process builds the set served now, not at a request
            self._warm_slot(slot, self._warm)
        self.replaced += 1
        LOG.warning("evaluation process replaced", extra={"fields": {"why": why}})

    def _give(self, slot: _Slot) -> None:
        slot.used = True
        self._free.append(slot)
        self.turns.release()
        self._last_used = self.timer.now()
        if self._idle_check is None or self._idle_check.done():
            self._idle_check = asyncio.get_running_loop().create_task(self._recycle_when_idle())

    async def _recycle_when_idle(self) -> None:
        """Replace the processes that kept memory of a burst, once the pool is quiet (see the
        class docstring)."""
        while True:
            await self.timer.sleep(max(0.0, self._last_used + self.quiet_s - self.timer.now()))
            if self.timer.now() >= self._last_used + self.quiet_s and \
                    len(self._free) == len(self._slots):
                break
            if self.timer.now() >= self._last_used + self.quiet_s:
                self._last_used = self.timer.now()  # busy: look again a quiet period later
        for slot in list(self._free):
            if not slot.used or not slot.baseline:
                continue
            slot.used = False
            try:
                rss = await asyncio.wrap_future(slot.executor.submit(rss_job))
            except Exception:  # a broken process is replaced by the next request
                continue
            if not slot.settled:  # its first requests' working set (caches, arenas): the base
                slot.baseline, slot.settled = max(slot.baseline, rss), True
                continue
            # No await since the check: a request cannot have taken the slot in between.
            if slot in self._free and not slot.used and \
                    rss > slot.baseline * (1 + self.recycle_growth):
                self._replace(slot, f"it held {rss // 1024} MiB after a burst, "
                              f"{slot.baseline // 1024} MiB once warm")

    async def _run(self, slot: _Slot, deadline_at: float, function: Callable[..., Any],
                   *args: Any) -> Any:
        """Run ``function(*args)`` in ``slot``'s process under the deadline.

        Raises:
            TimeoutError: the deadline came first (the slot is now held until the job ends,
                or replaced after ``grace_s``; the caller must not give it back).
            WorkerFailed: the process exited (replaced) or the job raised ``WorkerFailed``.
            wire.WireError: the job's own.
        """
        try:
            future = slot.executor.submit(function, *args)
        except (BrokenProcessPool, RuntimeError) as exc:
            self._replace(slot, f"it could not take a job: {exc}")
            raise WorkerFailed("the evaluation process could not take the request") from None
        try:
            async with self.timer.timeout_at(deadline_at):
                return await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            task = asyncio.get_running_loop().create_task(self._hold(slot, future))
            self._holding.add(task)
            task.add_done_callback(self._holding.discard)
            raise
        except BrokenProcessPool:
            self._replace(slot, "its process exited")
            raise WorkerFailed("the evaluation process exited") from None

    async def _hold(self, slot: _Slot, future: concurrent.futures.Future[Any]) -> None:
        """Give ``slot`` back when its abandoned job ends; replace its process when that takes
        longer than ``grace_s`` (a hung evaluation)."""
        try:
            async with self.timer.timeout_at(self.timer.now() + self.grace_s):
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(future)
        except TimeoutError:
            self._replace(slot, f"a job ran {self.grace_s:g} s past its deadline")
        finally:
            self._give(slot)

    async def decide(self, admitter: Admitter, snapshot: PolicySnapshot, body: bytes,
                     coding: str | None, endpoint: Endpoint,
                     waited_s: float) -> tuple[wire.Envelope, Decision]:
        """Decode and decide one large request in a process; the caller holds a turn, which
        this gives back (now or once the slot is free).

        ``snapshot``: the set served when the request arrived. ``waited_s``: seconds already
        spent (the wait for a turn, the read), taken off the deadline.

        Raises:
            wire.WireError: 400 / 413 for the body (as :func:`webhook.wire.decode_body`); 500
                (``InternalError``) when the process fails before the envelope is known; 429
                when the deadline passes first.
        """
        slot = self._free.pop()
        timer = admitter.timer
        deadline_at = timer.now() - waited_s + admitter.settings.deadline_s
        settings = admitter.settings
        self._token += 1
        token = self._token
        try:
            decoded: Decoded = await self._run(slot, deadline_at, self._decode, token, body,
                                               coding, settings.max_body_bytes,
                                               settings.max_depth)
        except TimeoutError:
            raise wire.WireError(429, "TooManyRequests", f"this request was not decoded "
                                 f"within its {settings.deadline_ms} ms deadline; try "
                                 "again") from None
        except WorkerFailed as exc:
            self._give(slot)
            raise wire.WireError(500, "InternalError", f"gpuguard could not read the request: "
                                 f"{exc}; see its log") from None
        except BaseException:
            self._give(slot)
            raise
        del body
        if decoded.error is not None:
            self._give(slot)
            raise wire.WireError(*decoded.error)
        envelope = wire.Envelope(decoded.api_version, decoded.uid, decoded.request or {},
                                 decoded.size)
        if decoded.not_evaluated:
            self._give(slot)
            return envelope, Decision(allowed=True, decision=NOT_EVALUATED, policy_set=snapshot)
        namespace = admitter.namespaces.get(decoded.namespace) if decoded.namespace else None
        job = self._job(snapshot, token, endpoint, dict(namespace) if namespace else None,
                        admitter.runtime_classes_now(), admitter.clock(),
                        deadline_at - timer.now(), settings.deadline_ms,
                        admitter.local_authorizer()[1])
        try:
            decision: Decision | Decoded = await self._run(slot, deadline_at, self._evaluate,
                                                           job)
        except TimeoutError:
            return envelope, self._fallback(admitter, snapshot, endpoint, DEADLINE,
                                            f"the evaluation did not finish within the "
                                            f"{settings.deadline_ms} ms deadline")
        except (wire.WireError, asyncio.CancelledError):
            self._give(slot)
            raise
        except Exception as exc:  # the process exited or failed: deny, never allow unchecked
            self._give(slot)
            admitter.metrics.fallbacks.labels(endpoint, EXCEPTION).inc()
            LOG.error("evaluation process failed", extra={"fields": {
                "uid": envelope.uid, "error": f"{type(exc).__name__}: {exc}"}})
            message = f"gpuguard: the evaluation failed ({type(exc).__name__}: {exc}); denied"
            return envelope, Decision(allowed=False, decision=DENIED, message=message,
                                      reason="InternalError", fallback=EXCEPTION,
                                      policy_set=snapshot)
        self._give(slot)
        if isinstance(decision, Decoded):
            raise wire.WireError(*decision.error or (500, "InternalError", "no answer"))
        if decision.fallback is not None:
            admitter.metrics.fallbacks.labels(endpoint, decision.fallback).inc()
        return envelope, replace(decision, policy_set=snapshot)

    @staticmethod
    def _fallback(admitter: Admitter, snapshot: PolicySnapshot, endpoint: Endpoint, cause: str,
                  what: str) -> Decision:
        admitter.metrics.fallbacks.labels(endpoint, cause).inc()
        return fallback_decision(snapshot, None, endpoint, cause, what)

    def shutdown(self) -> None:
        """Stop every process (jobs in flight are dropped)."""
        if self._idle_check is not None:
            self._idle_check.cancel()
        for slot in self._slots:
            slot.executor.shutdown(wait=False, cancel_futures=True)
