"""One admission decision: an AdmissionReview envelope in, a :class:`Decision` out.

Owns what the webhook adds around the engine: the namespace object from the namespace source,
which engine passes each endpoint runs (``/mutate``: mutations only — its patch goes back to the
API server; ``/validate``: validations and audit annotations on the object as mutated by then —
so warnings are never given twice), running the evaluation under the request deadline, and the
failurePolicy fallback when the evaluation cannot finish (deadline) or raises (a bug): if any
matching, non-exempt policy has ``failurePolicy: Fail`` the request is denied with a message
saying so, otherwise it is allowed with a warning. ``pods/status`` (any ``status`` subresource)
is allowed without evaluation. For dryRun requests nothing is recorded (the :class:`Recorder` is
not called).

Where the evaluation runs: a request whose body is at most ``ServerSettings.inline_max_bytes``
(64 KiB by default; nearly every pod is a few KiB) is first evaluated on the event loop itself for
at most ``ServerSettings.inline_slice_ms`` (10 ms; a library evaluation takes well under 1 ms),
with the engine's cooperative deadline (``expired``, checked before each policy and each rule
evaluated on its own). An evaluation still running at the end of its slice is abandoned (nothing
was recorded) and done again in the thread pool. After three such overruns within 30 s
(``INLINE_OVERRUNS`` in ``INLINE_PAUSE_S``: one alone may be a one-off — the first request of a new
set of matching policies compiles their combined program, a busy machine preempts the process)
every evaluation goes to the pool for 30 s (logged once): a policy set that slow stays slow, and
one CEL evaluation cannot be interrupted — its iterations are bounded by the budget, not their cost
(``contains`` over a 30 KB annotation, say) — so the loop, which answers health probes and reads
other requests, must not run them. A larger body goes to the thread pool directly. Policy sets
that use ``authorizer`` are evaluated on the loop too when the authorizer can answer without
blocking (:class:`~policies.authorization.CachingAuthorizer`: the SubjectAccessReview cache, an
offline RBAC snapshot): an evaluation in which a check finds no cached answer is thrown away and
done again in the pool, where the review may block (the hop to the pool and back cost about 270 k
instructions, a tenth of a library evaluation). The pool is awaited under the deadline, which
abandons an evaluation that does not come back (and the same ``expired`` stops it at its next
policy or rule); past the deadline the engine raises
:class:`~policies.engine.evaluation.EvaluationExpired` and the fallback answers, so an answer
overruns the deadline by at most one CEL evaluation. Why inline first: handing each request to a
thread and back (submit, ``call_soon_threadsafe``, a loop wake-up, the GIL passed back and forth)
cost more than the whole webhook around an empty policy set, and buys no parallelism (the engine
holds the GIL).

A body of ``CHECKED_MIN_BYTES`` or more that the wire decoder checked for CEL
(``Envelope.checked``: orjson decoded it, the depth is within the runtime's limit) has its
``object`` / ``oldObject`` passed to the engine unwalked
(:func:`policies.cel.runtime.checked_json`): walking a 3 MiB pod again for the CEL runtime cost
more than decoding it.

Quota (``/validate`` only, and only when the served policy set holds ``GPUQuota`` documents —
otherwise the step costs nothing): before the engine, the request is checked and, unless dryRun,
reserved against every quota it counts against (:class:`webhook.quota.QuotaGate`, off the event
loop under the same deadline). Over quota: denied with the quota's message, the engine is not run.
Otherwise the quota figures reach CEL as ``quota`` and the quota's warnings join the engine's; a
request the policies then deny gives its reservations back before it is answered (within the
deadline). A quota step that cannot finish (the
ledger unreachable, the deadline) follows each quota's failurePolicy; a step that missed the
deadline and still reserves gives the reservation back when it finishes.

Must not evaluate policy logic itself (that is :mod:`policies.engine.evaluation`) or know about
HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from kube.quota_ledger import QuotaDecision
from policies.authorization import Attributes, Authorizer, Unavailable
from policies.authorization import Decision as AuthorizerDecision
from policies.authorization import Verdict as AuthorizerVerdict
from policies.cel.runtime import checked_json
from policies.engine.evaluation import EvaluationExpired, RuleOutcome, Verdict
from policies.facts.review import (
    RequestShape,
    ReviewError,
    ReviewInput,
    from_request,
    request_shape,
)
from policies.policy.matching import applicability
from policies.policy.model import Policy
from policies.policy.quota import Quota
from policies.records import maker
from policies.vocabulary import FailurePolicy
from webhook.metrics import Metrics
from webhook.policy_store import PolicySnapshot, PolicyStore
from webhook.quota import QuotaGate
from webhook.settings import ServerSettings
from webhook.timer import MonotonicTimer, Timer
from webhook.wire import Envelope, WireError, bad_request


class Endpoint(StrEnum):
    """The webhook's two admission paths (``POST /validate``, ``POST /mutate``); the value is
    the path segment and the ``endpoint`` label of the metrics and log lines."""

    VALIDATE = "validate"
    MUTATE = "mutate"


ENDPOINTS = tuple(Endpoint)
NOT_EVALUATED_SUBRESOURCES = frozenset({"status"})
ALLOWED, DENIED, NOT_EVALUATED = "allowed", "denied", "not_evaluated"
DEADLINE, EXCEPTION = "deadline", "exception"
LOG = logging.getLogger("gpuguard.webhook.evaluation")
INLINE_PAUSE_S = 30.0
"""After ``INLINE_OVERRUNS`` evaluations overran their slice on the event loop within this many
seconds, how long every evaluation goes to the thread pool instead: policies that slow stay slow,
and the loop must keep answering health probes and reading other requests."""
INLINE_OVERRUNS = 3
CHECKED_MIN_BYTES = 16 * 1024
"""Smallest checked body whose objects go to the engine unwalked: below it, naming them
(:func:`policies.cel.runtime.checked_json`) costs about what the walk it saves does (a 2 KiB pod
walks in a few microseconds), and requests no policy applies to would pay it for nothing."""


Abandoned = Callable[["concurrent.futures.Future[Any]"], None]
"""Told of an evaluation left running in its thread past the deadline (:meth:`Admitter.admit`)."""


class NamespaceSource(Protocol):
    """Namespace objects by name (:mod:`kube.namespaces`)."""

    def get(self, name: str) -> Mapping[str, Any]:
        """The Namespace object (a stub with the name label when unknown)."""
        ...

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)`` for readiness."""
        ...


class Recorder(Protocol):
    """Side effects of an admitted request (never called for dryRun requests)."""

    def record(self, review: ReviewInput, verdict: Verdict, endpoint: Endpoint) -> None:
        """Record an allowed, non-dryRun request."""
        ...


@dataclass(frozen=True)
class Decision:
    """What the webhook answers, and what the log line and metrics say about it.

    Attributes:
        allowed: the answer. ``message`` / ``reason``: the denial's status message and reason.
        warnings / audit_annotations / patch: as the engine gave them (``patch`` only on
            ``/mutate``).
        decision: ``allowed``, ``denied`` or ``not_evaluated``.
        denied_by: names of the policies that denied.
        policy_outcomes: ``(policy, deny|warn|audit|mutate|error|exempt)`` pairs.
        fallback: ``deadline`` or ``exception`` when failurePolicy decided; else None.
        review: the parsed request (None when not evaluated, or when no policy is written
            for requests of its shape: see :meth:`Admitter.admit`).
        policy_set: the policy set that decided (its ``identity`` goes into the decision log
            line); None only when no set was loaded.
    """

    allowed: bool
    decision: str
    message: str = ""
    reason: str = "Forbidden"
    warnings: tuple[str, ...] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)
    patch: tuple[dict[str, Any], ...] = ()
    denied_by: tuple[str, ...] = ()
    policy_outcomes: tuple[tuple[str, str], ...] = ()
    fallback: str | None = None
    review: ReviewInput | None = None
    policy_set: PolicySnapshot | None = None


_make_decision = maker(Decision)  # one per evaluated request (see policies.records)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def policy_outcomes(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """``(policy, decision)`` pairs of one verdict, each once, in result order."""
    seen: dict[tuple[str, str], None] = {}
    for result in verdict.results:
        if result.outcome == RuleOutcome.FAIL:
            for action in result.actions:
                seen[(result.policy, action.lower())] = None
        elif result.outcome in (RuleOutcome.ERROR, RuleOutcome.MUTATE, RuleOutcome.EXEMPT):
            seen[(result.policy, result.outcome)] = None
    return tuple(seen)


def shape_of(request: Mapping[str, Any]) -> RequestShape:
    """The request's :class:`~policies.facts.review.RequestShape`, after every check the
    engine's view of it needs (:func:`policies.facts.review.request_shape`).

    Raises:
        WireError: 400 when the AdmissionRequest cannot be evaluated (bad ``operation``,
            ``object`` not an object, ...); the message names the field.
    """
    try:
        return request_shape(request)
    except ReviewError as exc:
        raise bad_request(str(exc)) from None


def review_of(request: Mapping[str, Any], namespace_object: Mapping[str, Any] | None,
              now: datetime.datetime, runtime_classes: frozenset[str] | None,
              shape: RequestShape | None = None) -> ReviewInput:
    """The engine's view of ``request`` with its namespace object and the cluster's
    RuntimeClass names (None: not known); the same in this process and an evaluation process.
    ``shape``: :func:`shape_of` this request, when the caller has it.

    Raises:
        WireError: 400 when the AdmissionRequest cannot be evaluated (bad ``operation``,
            ``object`` not an object, ...); the message names the field.
    """
    try:
        review = from_request(request, namespace_object=namespace_object, now=now, shape=shape)
    except ReviewError as exc:
        raise bad_request(str(exc)) from None
    if review.kind[2] == "Namespace" and namespace_object is not None:
        # A Namespace is cluster-scoped: namespaceSelector uses its own labels.
        review = dataclasses.replace(review, namespace_object=None)
    if runtime_classes is not None:  # a setRuntimeClassName naming a missing class is not applied
        review = dataclasses.replace(review, runtime_classes=runtime_classes)
    return review


def namespace_of(request: Mapping[str, Any]) -> str | None:
    """The request's namespace as :func:`policies.facts.review.from_request` reads it."""
    namespace = request.get("namespace")
    if not namespace:
        obj = request.get("object")
        if not isinstance(obj, Mapping):
            obj = request.get("oldObject")
        metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
        namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return str(namespace) if namespace else None


def _relevant(policy: Policy, endpoint: Endpoint) -> bool:
    if endpoint == Endpoint.MUTATE:
        return bool(policy.mutations)
    return bool(policy.validations or policy.audit_annotations or policy.param_missing)


def fail_closed_policies(snapshot: PolicySnapshot, review: ReviewInput,
                         endpoint: Endpoint) -> tuple[list[str], int]:
    """Names of the matching policies with ``failurePolicy: Fail``, and how many matched.

    Only policies this endpoint would run, that match the request and that no exception
    exempts count. A policy whose match cannot be decided counts as matching.
    """
    failing: list[str] = []
    matched = 0
    for policy in snapshot.engine.policies.policies:
        if not _relevant(policy, endpoint):
            continue
        try:
            applies = applicability(policy, review) is None
        except Exception:  # a matching bug must not hide a Fail policy
            applies = True
        if applies:
            matched += 1
            if policy.failure_policy == FailurePolicy.FAIL:
                failing.append(policy.name)
    return failing, matched


class _CacheOnly:
    """The request's authorizer on the event loop: answers only what it can without blocking
    (:meth:`~policies.authorization.CachingAuthorizer.cached`) and notes a miss, whose
    evaluation is then thrown away and done again in the thread pool with the authorizer
    itself — so the verdict never rests on the placeholder answer given for the miss."""

    def __init__(self, authorizer: Any) -> None:
        self._cached = authorizer.cached
        self.missed = False

    def authorize(self, attributes: Attributes) -> AuthorizerDecision:
        found = self._cached(attributes)
        if found is not None:
            return found
        self.missed = True
        return AuthorizerDecision(AuthorizerVerdict.NO_OPINION, "",
                                  "not cached: decided again off the event loop")


class Admitter:
    """Decides admission requests with the store's current policy set.

    Args:
        store: the policy set being served.
        namespaces: Namespace objects for namespaceSelector / ``namespaceObject``.
        settings: deadline and friends.
        metrics: where per-policy outcomes are counted.
        executor: threads evaluating the policies of bodies over
            ``settings.inline_max_bytes`` (the deadline abandons a stuck one).
        clock: the time requests are evaluated at (exception expiry); default UTC now.
        timer: the monotonic clock deadlines and inline slices are measured on (see
            :mod:`webhook.timer`); default the process's.
        recorder: side effects of admitted non-dryRun requests; default none.
        quota: the quota step (see module docstring); None: GPUQuota documents are not
            enforced.
        quota_executor: threads running the quota step (blocking API calls); default
            ``executor``.
        authorizer: what CEL ``authorizer`` checks ask (SubjectAccessReviews, see
            ``kube/subject_access_reviews.py``); None: every check is an errored decision.
            Policy sets that use ``authorizer`` are evaluated in the thread pool (a review
            blocks), unless it is a :class:`~policies.authorization.CachingAuthorizer`: then
            on the event loop as any other set, with its cached answers, and in the pool only
            when a check finds none.
        runtime_classes: the cluster's RuntimeClass names, None while not known
            (:class:`kube.runtime_classes.RuntimeClassWatch.names`); default: never known.
    """

    def __init__(
        self,
        store: PolicyStore,
        namespaces: NamespaceSource,
        settings: ServerSettings,
        metrics: Metrics,
        executor: concurrent.futures.Executor,
        *,
        clock: Callable[[], datetime.datetime] = _utcnow,
        timer: Timer | None = None,
        recorder: Recorder | None = None,
        quota: QuotaGate | None = None,
        quota_executor: concurrent.futures.Executor | None = None,
        authorizer: Authorizer | None = None,
        runtime_classes: Callable[[], frozenset[str] | None] | None = None,
    ) -> None:
        self.authorizer = authorizer
        self.runtime_classes = runtime_classes
        self.quota = quota
        self.quota_executor = quota_executor or executor
        self.store = store
        self.namespaces = namespaces
        self.settings = settings
        self.metrics = metrics
        self.executor = executor
        self.clock = clock
        self.timer: Timer = timer if timer is not None else MonotonicTimer()
        self.recorder = recorder
        # Timer time until which every evaluation goes to the thread pool: set when one overran
        # its slice on the loop (see module docstring).
        self._inline_paused_until = 0.0
        self._overruns: collections.deque[float] = collections.deque(maxlen=INLINE_OVERRUNS)
        # Policy sets that use ``authorizer`` may be evaluated on the loop: the authorizer can
        # answer without blocking (a cache miss then sends the evaluation to the pool), or
        # there is none (every check an errored decision).
        self._inline_authorizer = authorizer is None or callable(
            getattr(authorizer, "cached", None))
        # The answer to a request no policy of the current set is written for (see admit).
        self._unwritten: Decision | None = None

    def review_input(self, envelope: Envelope, shape: RequestShape | None = None) -> ReviewInput:
        """The engine's view of the request, with its namespace object (``shape``: its
        :func:`shape_of`, when known).

        Raises:
            WireError: 400 when the AdmissionRequest cannot be evaluated (bad ``operation``,
                ``object`` not an object, ...); the message names the field.
        """
        request = envelope.request
        namespace = namespace_of(request)
        return review_of(request, self.namespaces.get(namespace) if namespace else None,
                         self.clock(), self.runtime_classes_now(), shape)

    def runtime_classes_now(self) -> frozenset[str] | None:
        """The cluster's RuntimeClass names now, None while not known."""
        return self.runtime_classes() if self.runtime_classes is not None else None

    def local_authorizer(self) -> tuple[bool, Unavailable | None]:
        """``(True, authorizer)`` when the authorizer needs no cluster (None or
        :class:`Unavailable`, which pickle); ``(False, None)`` otherwise."""
        if self.authorizer is None or isinstance(self.authorizer, Unavailable):
            return True, self.authorizer
        return False, None

    def offloadable(self, snapshot: PolicySnapshot | None, endpoint: Endpoint) -> bool:
        """Whether a request under ``snapshot`` may be decided in an evaluation process
        (:mod:`webhook.evaluators`): not when it needs this process's cluster clients — the
        quota ledger (GPUQuota documents, ``/validate``) or the authorizer's
        SubjectAccessReviews — nor a recorder or the objects in the log line, which need the
        request here. An authorizer that asks nobody (none, or :class:`~policies.authorization.
        Unavailable`: standalone, every check an errored decision) goes with the request."""
        if snapshot is None or self.recorder is not None or self.settings.log_objects or \
                (snapshot.engine.uses_authorizer and not self.local_authorizer()[0]):
            return False
        return not (self.quota is not None and endpoint == Endpoint.VALIDATE
                    and snapshot.engine.policies.quotas)

    async def admit(self, envelope: Envelope, endpoint: Endpoint, *,
                    waited_s: float = 0.0, abandoned: Abandoned | None = None) -> Decision:
        """Decide one request for ``endpoint`` (``validate`` or ``mutate``).

        A request of a shape (resource, subresource, operation, kind) no policy of the set is
        written for — known from an earlier request of that shape — is allowed as the engine
        would allow it, after the request's checks, without building its review (unless a
        GPUQuota step or a recorder needs it).

        ``waited_s``: seconds the request already spent before this call (a large body's wait
        for a decode turn, its read and decode), taken off its deadline. ``abandoned``: called,
        on the event loop, with each thread-pool evaluation still running when the deadline
        decided the answer (it stops at its next policy or rule; the caller may wait for it).

        Raises:
            WireError: 400 for an AdmissionRequest that cannot be evaluated; 503 when no
                policy set has loaded yet.
        """
        subresource = envelope.request.get("subResource")
        if isinstance(subresource, str) and subresource in NOT_EVALUATED_SUBRESOURCES:
            return Decision(allowed=True, decision=NOT_EVALUATED, policy_set=self.store.current)
        shape = shape_of(envelope.request)
        snapshot = self.store.current
        if snapshot is None:
            detail = "; ".join(self.store.last_errors) or "still loading"
            raise WireError(503, "ServiceUnavailable", f"no policy set is loaded: {detail}")
        mutate = endpoint == Endpoint.MUTATE
        if snapshot.engine.written_for_none(shape) and self.recorder is None and \
                (mutate or self.quota is None or not snapshot.engine.policies.quotas):
            # What the engine answers a request no policy is written for (allowed, untouched,
            # no result), without the review it would not read; one frozen answer per set.
            unwritten = self._unwritten
            if unwritten is None or unwritten.policy_set is not snapshot:
                unwritten = self._unwritten = _make_decision(
                    allowed=True, decision=ALLOWED, policy_set=snapshot)
            return unwritten
        review = self.review_input(envelope, shape)
        # The decoder checked the body's JSON for CEL: the engine need not walk the objects
        # again (see policies.cel.runtime.checked_json; the objects are never edited). Entered
        # by hand rather than a ``with`` over a helper coroutine: this runs on every request.
        checked = checked_json(envelope.request.get("object"), envelope.request.get(
            "oldObject")) if envelope.checked and envelope.size >= CHECKED_MIN_BYTES else None
        if checked is not None:
            checked.__enter__()
        try:
            now = self.timer.now()
            deadline_at = now - waited_s + self.settings.deadline_s
            limit = self.settings.inline_max_bytes
            # 0: every request in the thread pool; so too for a while after one was too slow here.
            inline = limit > 0 and envelope.size <= limit and now >= self._inline_paused_until \
                and (self._inline_authorizer or not snapshot.engine.uses_authorizer)
            quotas = snapshot.engine.policies.quotas if self.quota is not None and not mutate \
                else ()
            if not quotas:
                return await self._evaluate(snapshot, review, endpoint, deadline_at, inline,
                                            abandoned)
            request = envelope.request
            quota = await self._quota_step(quotas, request, deadline_at)
            if not quota.allowed:
                names = tuple(dict.fromkeys(quota.denied_by))
                return Decision(allowed=False, decision=DENIED, message="; ".join(quota.denials),
                                reason="Forbidden", warnings=quota.warnings,
                                denied_by=tuple(f"GPUQuota/{n}" for n in names),
                                policy_outcomes=tuple((f"GPUQuota/{n}", "deny") for n in names),
                                review=review, policy_set=snapshot)
            decision = await self._evaluate(snapshot, review, endpoint, deadline_at, inline,
                                            abandoned, quota=quota.cel)
            if not decision.allowed and quota.reserved:
                await self._give_back(quotas, quota.reserved, request, deadline_at)
            if quota.warnings:
                decision = dataclasses.replace(decision,
                                               warnings=(*quota.warnings, *decision.warnings))
            return decision
        finally:
            if checked is not None:
                checked.__exit__(None, None, None)

    async def _quota_step(self, quotas: Sequence[Quota], request: Mapping[str, Any],
                          deadline_at: float) -> QuotaDecision:
        """The quota decision, off the event loop; failurePolicy when it cannot finish."""
        assert self.quota is not None
        future = self.quota_executor.submit(self.quota.admit, quotas, request)
        try:
            async with self.timer.timeout_at(deadline_at):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if not future.cancel():  # running: what it reserves is for a pod now refused
                future.add_done_callback(lambda done: self._release_late(done, quotas, request))
            return self.quota.unavailable(quotas, request, f"the quota check did not finish "
                                          f"within the {self.settings.deadline_ms} ms deadline")
        except Exception as exc:  # a bug in the quota step: the quotas' failurePolicy decides
            return self.quota.unavailable(quotas, request, f"the quota check failed "
                                          f"({type(exc).__name__}: {exc})")

    async def _give_back(self, quotas: Sequence[Quota], reserved: Sequence[str],
                         request: Mapping[str, Any], deadline_at: float) -> None:
        """Release the reservations of a request the policies denied before it is answered.

        Awaited, not fired and forgotten: a client that sends its next pod after this answer
        must not find the refused pod still counted (a stop-25 test run saw a sequential pod
        denied over quota by the reservation of the pod refused just before it). Bounded by
        the request's deadline (``deadline_at``, on :attr:`timer`): past it the answer goes out
        and the release goes on in its thread; one that cannot finish expires by its TTL.
        """
        assert self.quota is not None
        try:
            future = self.quota_executor.submit(self.quota.release, quotas, reserved, request)
        except RuntimeError:  # executor shut down: the TTL applies
            return
        released = asyncio.wrap_future(future)
        # Said by the callback, before or after the deadline: a failure that comes after it
        # would otherwise be asyncio's unlogged "exception was never retrieved".
        released.add_done_callback(lambda done: _say_release_failed(done, reserved))
        # shielded: a deadline ends the wait, never the release itself; its own error (a
        # ledger bug) must not turn the denial into a 5xx — the callback logged it
        with contextlib.suppress(Exception):
            async with self.timer.timeout_at(deadline_at):
                await asyncio.shield(released)

    def _release_late(self, done: concurrent.futures.Future[QuotaDecision],
                      quotas: Sequence[Quota], request: Mapping[str, Any]) -> None:
        """Give back what a quota step that missed the deadline reserved after all (it was
        answered as refused), on the quota executor; without it the reservation of a pod that
        will not exist would count until its TTL.
        """
        if done.cancelled() or done.exception() is not None or self.quota is None:
            return
        reserved = done.result().reserved
        if reserved:
            with contextlib.suppress(RuntimeError):  # executor shut down: the TTL applies
                self.quota_executor.submit(self.quota.release, quotas, reserved, request)

    async def _evaluate(self, snapshot: PolicySnapshot, review: ReviewInput, endpoint: Endpoint,
                        deadline_at: float, inline: bool, abandoned: Abandoned | None = None,
                        **quota: Any) -> Decision:
        """The engine's decision under the deadline (``quota``: the CEL ``quota`` variable).

        ``inline``: evaluate on the event loop (small bodies, see module docstring), else in
        the thread pool.
        """
        mutate = endpoint == Endpoint.MUTATE
        now = self.timer.now  # any thread may read it

        def expired() -> bool:
            return now() >= deadline_at

        try:
            verdict = None
            if inline:
                slice_end = min(deadline_at, now() + self.settings.inline_slice_s)
                cache_only = _CacheOnly(self.authorizer) if self.authorizer is not None and \
                    snapshot.engine.uses_authorizer else None
                try:
                    verdict = snapshot.engine.evaluate(
                        review, mutate=mutate, validate=not mutate,
                        expired=lambda: now() >= slice_end,
                        authorizer=cache_only or self.authorizer, **quota)
                    if cache_only is not None and cache_only.missed:
                        verdict = None  # a check needs a SubjectAccessReview: the pool's
                except EvaluationExpired:
                    self._pause_inline(now() - slice_end + self.settings.inline_slice_s)
                    if expired():
                        raise
                    self.metrics.inline_handoffs.inc()  # too slow for the loop: the pool's
                else:
                    if now() > slice_end:  # finished, but held the loop too long
                        self._pause_inline(now() - slice_end + self.settings.inline_slice_s)
            if verdict is None:
                future = self.executor.submit(snapshot.engine.evaluate, review, mutate=mutate,
                                              validate=not mutate, expired=expired,
                                              authorizer=self.authorizer, **quota)
                try:
                    async with self.timer.timeout_at(deadline_at):
                        verdict = await asyncio.wrap_future(future)
                except TimeoutError:
                    # Drops it if still queued; a running one stops at its next policy.
                    if not future.cancel() and abandoned is not None:
                        abandoned(future)
                    raise EvaluationExpired from None
        except EvaluationExpired:
            return self._fallback(snapshot, review, endpoint, DEADLINE,
                                  f"the evaluation did not finish within the "
                                  f"{self.settings.deadline_ms} ms deadline")
        except Exception as exc:  # an engine bug: the policies' failurePolicy decides
            return self._fallback(snapshot, review, endpoint, EXCEPTION,
                                  f"the evaluation failed ({type(exc).__name__}: {exc})")
        if verdict.allowed and not review.dry_run and self.recorder is not None:
            self.recorder.record(review, verdict, endpoint)
        return decision_of(verdict, review, snapshot, mutate)

    def _pause_inline(self, seconds: float) -> None:
        """Note an evaluation that held the event loop for ``seconds``, past its slice; at the
        ``INLINE_OVERRUNS``-th within ``INLINE_PAUSE_S``, send evaluations to the thread pool for
        ``INLINE_PAUSE_S`` (one CEL evaluation cannot be interrupted, and its iterations are
        bounded but not their cost: ``contains`` over a 30 KB string, say)."""
        loop_time = self.timer.now()
        self._overruns.append(loop_time)
        if len(self._overruns) < INLINE_OVERRUNS or \
                loop_time - self._overruns[0] > INLINE_PAUSE_S:
            return
        self._overruns.clear()
        if loop_time >= self._inline_paused_until:
            LOG.warning("evaluations move off the event loop", extra={"fields": {
                "held_ms": round(seconds * 1000, 1), "for_s": INLINE_PAUSE_S,
                "why": "an evaluation outlasted --inline-slice-ms on the event loop"}})
        self._inline_paused_until = loop_time + INLINE_PAUSE_S

    def _fallback(self, snapshot: PolicySnapshot, review: ReviewInput, endpoint: Endpoint,
                  cause: str, what: str) -> Decision:
        """The failurePolicy answer when the evaluation cannot be used (see module docstring)."""
        self.metrics.fallbacks.labels(endpoint, cause).inc()
        return fallback_decision(snapshot, review, endpoint, cause, what)


def decision_of(verdict: Verdict, review: ReviewInput, snapshot: PolicySnapshot,
                mutate: bool) -> Decision:
    """The :class:`Decision` of an engine verdict (``mutate``: the ``/mutate`` endpoint's)."""
    return _make_decision(
        allowed=verdict.allowed, decision=ALLOWED if verdict.allowed else DENIED,
        message=verdict.message, reason=verdict.reason, warnings=verdict.warning_texts,
        audit_annotations=verdict.audit_annotations,
        patch=verdict.patch if mutate else (), denied_by=verdict.denied_by,
        policy_outcomes=policy_outcomes(verdict) if verdict.results else (), fallback=None,
        review=review, policy_set=snapshot,
    )


def fallback_decision(snapshot: PolicySnapshot, review: ReviewInput | None, endpoint: Endpoint,
                      cause: str, what: str) -> Decision:
    """The failurePolicy answer when the evaluation cannot be used (see module docstring).

    ``review`` None: the request was never decoded here (an evaluation process did not answer
    in time): every policy of the endpoint counts as matching, as one whose match cannot be
    decided does, so any ``failurePolicy: Fail`` policy denies.
    """
    if review is None:
        failing = [p.name for p in snapshot.engine.policies.policies
                   if _relevant(p, endpoint) and p.failure_policy == FailurePolicy.FAIL]
        matched = len([p for p in snapshot.engine.policies.policies if _relevant(p, endpoint)])
    else:
        failing, matched = fail_closed_policies(snapshot, review, endpoint)
    if failing:
        message = (f"gpuguard: {what}; denied because these matching policies have "
                   f"failurePolicy Fail: {', '.join(failing)}")
        return Decision(allowed=False, decision=DENIED, message=message,
                        reason="Forbidden", denied_by=tuple(failing),
                        policy_outcomes=tuple((name, RuleOutcome.ERROR) for name in failing),
                        fallback=cause, review=review, policy_set=snapshot)
    scope = "the matching policies have failurePolicy Ignore" if matched else \
        "no policy with failurePolicy Fail matches it"
    return Decision(allowed=True, decision=ALLOWED,
                    warnings=(f"gpuguard: {what}; allowed without policy checks because "
                              f"{scope}",),
                    fallback=cause, review=review, policy_set=snapshot)


def _say_release_failed(done: asyncio.Future[None], reserved: Sequence[str]) -> None:
    """Log (as JSON, once) the error of a release of denied reservations; what it did not
    release expires by its TTL."""
    if not done.cancelled() and (exc := done.exception()) is not None:
        LOG.warning("releasing the quota reservations of a denied request failed; they "
                    "expire by their TTL", extra={"fields": {
                        "error": f"{type(exc).__name__}: {exc}", "quotas": list(reserved)}})
