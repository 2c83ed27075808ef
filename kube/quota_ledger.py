"""Quota reservations that stay consistent across webhook replicas: a ledger per GPUQuota.

Each ``GPUQuota`` has a ledger: the ConfigMap ``gpuguard-quota-<quota name>`` in gpuguard's own
namespace, ``data.reservations`` holding JSON ``{key: {ns, name, usage, created, expires}}``.
Admitting a pod is a compare-and-swap on that object (Kubernetes optimistic concurrency):

1. read the ledger (its ``resourceVersion``); drop reservations that expired (``ttl_s``) or whose
   pod this replica's pod watch already shows and that are older than ``settle_s``;
2. usage = pods in the watch cache in scope, where a pod that still has a reservation is counted
   through the reservation instead (never twice), + every remaining reservation;
3. if the request does not fit, deny (nothing is written);
4. otherwise write the ledger back with the new reservation and the read ``resourceVersion``;
   ``409 Conflict`` means another replica wrote in between: go back to 1 (at most
   ``max_attempts``, with a short random backoff). Exhausted attempts or an unreachable API raise
   :class:`LedgerUnavailable`, which the caller turns into the quota's failurePolicy.

Every admitted reservation was therefore written on top of every reservation admitted before it,
whatever replica made it. See ``docs/quota.md`` for the guarantee and its bound.

:class:`MemoryLedgerStore` is an in-process store with the same version semantics (tests and the
benchmark); :class:`ConfigMapLedgerStore` talks to the API. Only :mod:`kube` imports
``kubernetes``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from policies.facts.dra import DraIndex
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.json_fields import mapping_at
from policies.policy.quota import (
    Charge,
    Quota,
    QuotaStatus,
    Usage,
    applicable,
    check,
    quota_variable,
    request_charge,
)
from policies.vocabulary import FailurePolicy

if TYPE_CHECKING:
    from kubernetes import client as k8s_client

_LOG = logging.getLogger("gpuguard.quota")
LEDGER_PREFIX = "gpuguard-quota-"
DATA_KEY = "reservations"


def ledger_name(quota: Quota) -> str:
    """The ConfigMap name of a quota's ledger (``gpuguard-quota-<name>``)."""
    return f"{LEDGER_PREFIX}{quota.name}"


class Conflict(Exception):
    """The ledger changed since it was read (409), or was created meanwhile."""


class LedgerUnavailable(Exception):
    """The ledger cannot be read or written (API unreachable, forbidden, retries exhausted)."""


@dataclass(frozen=True)
class Reservation:
    """GPU usage held for a pod being admitted, until the pod shows in the watch or it expires.

    ``created`` / ``expires`` are Unix times (seconds).
    """

    namespace: str
    name: str | None
    usage: Usage
    created: float
    expires: float

    def to_json(self) -> dict[str, Any]:
        """The ledger's JSON form."""
        return {"ns": self.namespace, "name": self.name, "usage": self.usage.to_json(),
                "created": self.created, "expires": self.expires}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reservation:
        """Inverse of :meth:`to_json`."""
        return cls(str(data["ns"]), data.get("name"), Usage.from_json(data["usage"]),
                   float(data["created"]), float(data["expires"]))


@dataclass
class LedgerState:
    """A ledger as read: reservations by key and the ``resourceVersion`` (None: not created)."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    resource_version: str | None = None


class LedgerStore(Protocol):
    """Where ledgers live; ``write`` is a compare-and-swap on ``resource_version``."""

    def read(self, name: str) -> LedgerState:
        """The ledger (an empty state with ``resource_version`` None when it does not exist)."""

    def write(self, name: str, reservations: Mapping[str, Reservation],
              resource_version: str | None) -> str:
        """Write (create when ``resource_version`` is None); the new resourceVersion.

        Raises:
            Conflict: the stored version differs (or the object exists / was deleted).
            LedgerUnavailable: the store cannot be reached.
        """


def _encode(reservations: Mapping[str, Reservation]) -> str:
    return json.dumps({k: r.to_json() for k, r in reservations.items()}, separators=(",", ":"),
                      sort_keys=True)


def _decode(text: str | None) -> dict[str, Reservation]:
    out: dict[str, Reservation] = {}
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        _LOG.warning("quota ledger is not JSON; starting it over")
        return out
    for key, value in (raw.items() if isinstance(raw, dict) else ()):
        try:
            out[str(key)] = Reservation.from_json(value)
        except (KeyError, ValueError, TypeError):
            _LOG.warning("dropping a malformed quota reservation", extra={"fields": {"key": key}})
    return out


class MemoryLedgerStore:
    """In-process ledgers with resourceVersion semantics (tests, benchmarks, one replica)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, tuple[str, str]] = {}  # name -> (resourceVersion, encoded)
        self._version = 0

    def read(self, name: str) -> LedgerState:
        """See :class:`LedgerStore`."""
        with self._lock:
            found = self._data.get(name)
        if found is None:
            return LedgerState()
        return LedgerState(_decode(found[1]), found[0])

    def write(self, name: str, reservations: Mapping[str, Reservation],
              resource_version: str | None) -> str:
        """See :class:`LedgerStore`."""
        encoded = _encode(reservations)
        with self._lock:
            current = self._data.get(name)
            if (current[0] if current else None) != resource_version:
                raise Conflict(name)
            self._version += 1
            self._data[name] = (str(self._version), encoded)
            return str(self._version)


class ConfigMapLedgerStore:
    """Ledgers as ConfigMaps in ``namespace`` (gpuguard's own), through the API server.

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (see :mod:`kube.config`).
        namespace: where the ledgers live.
        timeout_s: connect and read timeout of each call (seconds).
    """

    def __init__(self, api_client: k8s_client.ApiClient, namespace: str, *,
                 timeout_s: float = 2.0) -> None:
        from kubernetes import client as k8s_client  # noqa: PLC0415 - see kube.list_watch

        self._api = k8s_client.CoreV1Api(api_client)
        self.namespace = namespace
        self._timeout = (timeout_s, timeout_s)

    def read(self, name: str) -> LedgerState:
        """See :class:`LedgerStore`."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        try:
            response = self._api.read_namespaced_config_map(
                name, self.namespace, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return LedgerState()
            raise LedgerUnavailable(f"reading ConfigMap {self.namespace}/{name}: "
                                    f"{exc.status} {exc.reason}") from None
        except Exception as exc:  # network errors of every kind
            raise LedgerUnavailable(f"reading ConfigMap {self.namespace}/{name}: "
                                    f"{type(exc).__name__}: {exc}") from None
        # _preload_content=False gives the raw urllib3 response; the client's types say not.
        body = json.loads(response.data)  # type: ignore[arg-type]
        return LedgerState(_decode((body.get("data") or {}).get(DATA_KEY)),
                           str(body["metadata"]["resourceVersion"]))

    def write(self, name: str, reservations: Mapping[str, Reservation],
              resource_version: str | None) -> str:
        """See :class:`LedgerStore`."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace,
                                    "labels": {"app.kubernetes.io/managed-by": "gpuguard",
                                               "gpuguard.io/ledger": "quota"}}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        # A plain dict body: the client serialises it as given (its types name V1ConfigMap only).
        body: Any = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                     "data": {DATA_KEY: _encode(reservations)}}
        try:
            if resource_version is None:
                response = self._api.create_namespaced_config_map(
                    self.namespace, body, _preload_content=False,
                    _request_timeout=self._timeout)
            else:
                response = self._api.replace_namespaced_config_map(
                    name, self.namespace, body, _preload_content=False,
                    _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status in (404, 409):  # stale version, created or deleted meanwhile
                raise Conflict(name) from None
            raise LedgerUnavailable(f"writing ConfigMap {self.namespace}/{name}: "
                                    f"{exc.status} {exc.reason}") from None
        except Exception as exc:
            raise LedgerUnavailable(f"writing ConfigMap {self.namespace}/{name}: "
                                    f"{type(exc).__name__}: {exc}") from None
        # _preload_content=False gives the raw urllib3 response; the client's types say not.
        return str(json.loads(response.data)["metadata"]["resourceVersion"])  # type: ignore[arg-type]


class UsageSource(Protocol):
    """Current usage from pods (the watch cache, :class:`kube.pod_cache.PodUsageIndex`)."""

    def usage(self, quota: Quota) -> Usage:
        """Usage of the known pods in the quota's scope."""

    def pod_usage(self, namespace: str, name: str) -> Usage | None:
        """The usage of one known pod; None when the cache does not have it."""

    def usage_apart_from(self, quota: Quota, pods: Iterable[tuple[str, str]]) -> Usage:
        """Usage of the quota's scope less the listed ``(namespace, name)`` pods it holds,
        read as one snapshot (an event applied half-way would count a pod zero times)."""


@dataclass(frozen=True)
class ReserveResult:
    """The outcome for one quota: ``problems`` empty when it fits; ``used`` before this pod."""

    quota: Quota
    problems: tuple[str, ...]
    used: Usage
    attempts: int = 1


class QuotaLedger:
    """The ledger protocol (module docstring) over a :class:`LedgerStore`.

    Args:
        store: where ledgers live.
        source: current usage from the pod watch.
        ttl_s: a reservation's lifetime (seconds): longer than the API server's admission chain
            plus the watch delay; the bound on how long a pod that was never created is counted.
        settle_s: how long a reservation stays after this replica's watch shows its pod
            (seconds): covers other replicas whose watch lags behind.
        max_attempts: compare-and-swap attempts before :class:`LedgerUnavailable`.
        clock: Unix time (seconds); injectable for tests.
    """

    def __init__(self, store: LedgerStore, source: UsageSource, *, ttl_s: float = 60.0,
                 settle_s: float = 5.0, max_attempts: int = 50,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.source = source
        self.ttl_s = ttl_s
        self.settle_s = settle_s
        self.max_attempts = max_attempts
        self.clock = clock
        self.sleep = sleep
        self.conflicts = 0  # 409s seen (for metrics and the benchmark)

    def _live(self, state: LedgerState, now: float) -> dict[str, Reservation]:
        live = {}
        for key, reservation in state.reservations.items():
            if reservation.expires <= now:
                continue
            if reservation.name and now - reservation.created >= self.settle_s and \
                    self.source.pod_usage(reservation.namespace, reservation.name) is not None:
                continue  # the watch shows the pod: the cache counts it now
            live[key] = reservation
        return live

    def used(self, quota: Quota, live: Mapping[str, Reservation]) -> Usage:
        """Usage of the quota's scope: cached pods, each reserved pod counted once."""
        total = self.source.usage_apart_from(
            quota, [(r.namespace, r.name) for r in live.values() if r.name])
        for reservation in live.values():
            total = total + reservation.usage
        return total

    def status(self, quota: Quota) -> QuotaStatus:
        """Current usage against limits (reads the ledger)."""
        state = self.store.read(ledger_name(quota))
        return QuotaStatus(quota, self.used(quota, self._live(state, self.clock())))

    def reserve(self, quota: Quota, key: str, namespace: str, name: str | None,
                charge: Charge, *, dry_run: bool = False) -> ReserveResult:
        """Check ``charge`` against ``quota`` and, when it fits, reserve it under ``key``.

        A ``dry_run`` request is checked but never reserved. The same ``key`` again (the API
        server retrying a webhook call) is admitted without a second reservation.

        Raises:
            LedgerUnavailable: the ledger cannot be read or written, or ``max_attempts``
                conflicts in a row.
        """
        name_of = ledger_name(quota)
        for attempt in range(1, self.max_attempts + 1):
            state = self.store.read(name_of)
            now = self.clock()
            live = self._live(state, now)
            if key in live:
                return ReserveResult(quota, (), self.used(quota, live), attempt)
            used = self.used(quota, live)
            problems = tuple(check(quota, used, charge))
            if problems or dry_run:
                return ReserveResult(quota, problems, used, attempt)
            live[key] = Reservation(namespace, name, charge.usage, now, now + self.ttl_s)
            try:
                self.store.write(name_of, live, state.resource_version)
            except Conflict:
                self.conflicts += 1
                self.sleep(random.uniform(0, 0.002 * min(attempt, 10)))
                continue
            return ReserveResult(quota, (), used, attempt)
        raise LedgerUnavailable(f"ledger {name_of}: {self.max_attempts} conflicting writes in a "
                                "row")

    def release(self, quota: Quota, key: str) -> None:
        """Drop a reservation (the pod was denied by a later quota); best effort, then TTL."""
        self._rewrite(quota, lambda live: live.pop(key, None) is not None)

    def prune(self, quota: Quota) -> int:
        """Drop expired and settled reservations now; returns how many remain."""
        remaining = [0]

        def change(live: dict[str, Reservation]) -> bool:
            remaining[0] = len(live)
            return True
        self._rewrite(quota, change, always=True)
        return remaining[0]

    def reservations(self, quota: Quota) -> dict[str, Reservation]:
        """The ledger's reservations as stored (expired ones included)."""
        return self.store.read(ledger_name(quota)).reservations

    def _rewrite(self, quota: Quota, change: Callable[[dict[str, Reservation]], bool], *,
                 always: bool = False) -> None:
        name_of = ledger_name(quota)
        for attempt in range(1, self.max_attempts + 1):
            state = self.store.read(name_of)
            live = self._live(state, self.clock())
            changed = change(live)
            if state.resource_version is None or not (
                    changed or (always and len(live) != len(state.reservations))):
                return
            try:
                self.store.write(name_of, live, state.resource_version)
                return
            except Conflict:
                self.conflicts += 1
                self.sleep(random.uniform(0, 0.002 * min(attempt, 10)))
        raise LedgerUnavailable(f"ledger {name_of}: {self.max_attempts} conflicting writes")


@dataclass(frozen=True)
class QuotaDecision:
    """What quota says about one AdmissionRequest.

    ``denials`` and ``warnings`` are the messages users read, each naming its GPUQuota;
    ``denied_by`` the names of the quotas that denied, in order (what the decision log and
    metrics count: never recovered from the messages); ``cel`` is the ``quota`` variable for
    custom policies (``Engine.evaluate(review, quota=decision.cel)``).
    """

    allowed: bool = True
    denials: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    cel: Mapping[str, Any] = field(default_factory=dict)
    reserved: tuple[str, ...] = ()  # quota names a reservation was written to
    denied_by: tuple[str, ...] = ()


def reservation_key(request: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """``(key, namespace, pod name or None)`` of an AdmissionRequest.

    The key is ``namespace/name/request uid`` (``namespace/generateName*/uid`` when the name is
    generated: such a reservation is only dropped by its TTL, since the watch cannot match it).
    """
    obj = mapping_at(request, "object")
    metadata = mapping_at(obj, "metadata")
    namespace = str(request.get("namespace") or metadata.get("namespace") or "")
    name = request.get("name") or metadata.get("name") or None
    shown = name or f"{metadata.get('generateName') or ''}*"
    return f"{namespace}/{shown}/{request.get('uid') or ''}", namespace, name


class QuotaAdmission:
    """The quota check of the admission path: request in, :class:`QuotaDecision` out.

    Args:
        quotas: the loaded ``GPUQuota`` documents (``PolicySet.quotas``).
        ledger: the reservation ledger.
        namespace_labels: namespace name → its labels (the namespace watch), for team scopes.
        settings: GPU naming, for the GPU facts.
        dra: the DRA objects pods' claims are resolved against (``check``: those of its
            input); None: none known (a claim's devices are unknown).
    """

    def __init__(self, quotas: Iterable[Quota], ledger: QuotaLedger,
                 namespace_labels: Callable[[str], Mapping[str, Any]] = lambda name: {},
                 settings: GPUSettings = DEFAULT_SETTINGS, dra: DraIndex | None = None) -> None:
        self.quotas = tuple(sorted(quotas, key=lambda q: q.name))  # one order on every replica
        self.ledger = ledger
        self.namespace_labels = namespace_labels
        self.settings = settings
        self.dra = dra

    def admit(self, request: Mapping[str, Any]) -> QuotaDecision:
        """Check (and, unless dryRun, reserve) one AdmissionRequest against every quota.

        Only Pod CREATE/UPDATE are charged; a denial by one quota releases the reservations the
        others made for this request. A ledger that cannot be reached follows each quota's
        failurePolicy (Fail: deny; Ignore: admit with a warning).
        """
        if not self.quotas or request.get("subResource"):
            return QuotaDecision()
        charge = request_charge(str(request.get("operation") or ""), request.get("object"),
                                request.get("oldObject"), settings=self.settings,
                                dra=self.dra)
        if charge is None or charge.usage.empty:
            return QuotaDecision()
        key, namespace, name = reservation_key(request)
        scoped = applicable(self.quotas, namespace, self.namespace_labels(namespace))
        if not scoped:
            return QuotaDecision()
        dry_run = bool(request.get("dryRun"))
        denials: list[str] = []
        denied_by: list[str] = []
        warnings: list[str] = []
        statuses: list[QuotaStatus] = []
        reserved: list[Quota] = []
        for quota in scoped:
            try:
                result = self.ledger.reserve(quota, key, namespace, name, charge,
                                             dry_run=dry_run)
            except LedgerUnavailable as exc:
                text = f"GPUQuota {quota.name}: usage could not be checked ({exc})"
                if quota.failure_policy == FailurePolicy.FAIL:
                    denials.append(f"{text}; failurePolicy Fail")
                    denied_by.append(quota.name)
                    break
                warnings.append(f"{text}; admitted (failurePolicy Ignore)")
                continue
            statuses.append(QuotaStatus(quota, result.used))
            if result.problems:
                denials.extend(result.problems)
                denied_by.append(quota.name)
                break
            if not dry_run:
                reserved.append(quota)
        if denials:
            for quota in reserved:
                try:
                    self.ledger.release(quota, key)
                except LedgerUnavailable:
                    _LOG.warning("quota reservation not released; it expires by TTL",
                                 extra={"fields": {"quota": quota.name, "key": key}})
            reserved = []
        return QuotaDecision(not denials, tuple(denials), tuple(warnings),
                             quota_variable(statuses, charge), tuple(q.name for q in reserved),
                             tuple(denied_by))
