"""Leader election through a ``coordination.k8s.io/v1`` Lease: gpuguard's one elector.

Used by the audit controller (``gpuguard audit --cluster --watch``: one active replica) and by
the webhook's status writer (``gpuguard serve --cluster-policies``: one replica writes the
gpuguard.io objects' status, :mod:`kube.policy_status`).

Owns the protocol client-go's ``leaderelection`` package follows with a Lease lock: a candidate
creates the Lease when there is none (``holderIdentity`` itself), renews it while it holds it
(``renewTime``), and takes it over only when the holder has not renewed it for
``leaseDurationSeconds`` *as observed on the candidate's own clock* (the time it last saw the
Lease's resourceVersion change — never the remote ``renewTime``, so skewed clocks cannot make
two leaders). Every write is a replace with the resourceVersion just read: of two candidates
racing for an expired Lease, the API server accepts one (the other gets ``409 Conflict`` and
stays a candidate). :meth:`LeaseElector.release` clears the holder on shutdown so a standby
takes over at once.

The HTTP calls are GET, POST (create) and PUT (renew, take over, release): RBAC names a PUT
``update`` and a PATCH ``patch``, so the Role needs ``create``, and ``get`` + ``update`` on the
Lease's name — ``patch`` is not used (tests/controlplane checks the Roles of deploy/ against a
real API server).

The clock is injected (monotonic seconds) and :meth:`LeaseElector.try_acquire_or_renew` is one
attempt: callers pace the attempts (:meth:`LeaseElector.leading` is the same attempt, logging
each change of state). Must not know what the leader does; only :mod:`kube` imports
``kubernetes``.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

_LOG = logging.getLogger("gpuguard.kube.lease")


def _micro_time(when: datetime.datetime) -> str:
    """A ``MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Holds or waits for one Lease (see module docstring).

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        namespace: the Lease's namespace.
        name: the Lease's name.
        identity: this candidate (the pod name, unique per replica).
        lease_duration_s: how long a Lease not renewed stays the holder's (seconds).
        clock: monotonic seconds.
        wall: the current time (written as ``renewTime`` / ``acquireTime``; informational).
    """

    def __init__(self, api_client: k8s_client.ApiClient, namespace: str, name: str,
                 identity: str, *, lease_duration_s: int = 15,
                 clock: Callable[[], float],
                 wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                     datetime.UTC)) -> None:
        self._api = api_client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self._clock = clock
        self._wall = wall
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self.leader = False
        self.last_error: str | None = None
        self._logged: tuple[bool, str | None] | None = None  # what leading() last logged

    def _path(self, named: bool = True) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        return f"{base}/{self.name}" if named else base

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = self._api.param_serialize(
            method, path, header_params={"Accept": "application/json",
                                         "Content-Type": "application/json"},
            body=body, auth_settings=["BearerToken"])
        response = self._api.call_api(*request, _request_timeout=(5, 10))
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=data.decode(
                "utf-8", "replace") if isinstance(data, bytes) else data, data=None)
        return json.loads(data) if data else None

    def _spec(self, transitions: int, acquired: str | None) -> dict[str, Any]:
        now = _micro_time(self._wall())
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration_s,
                "acquireTime": acquired or now, "renewTime": now,
                "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease afterwards. Never raises (an
        API failure is False, with ``last_error`` saying why)."""
        try:
            self.leader = self._attempt()
            self.last_error = None
        except ApiException as exc:
            self.leader = False
            self.last_error = f"Lease {self.namespace}/{self.name}: {exc.status} {exc.reason}"
        except Exception as exc:  # network failures: not the leader until renewed
            self.leader = False
            self.last_error = f"Lease {self.namespace}/{self.name}: {type(exc).__name__}: {exc}"
        return self.leader

    def leading(self) -> bool:
        """:meth:`try_acquire_or_renew`, logging when this candidate starts or stops holding
        the Lease and each new error (an API failure is logged as a warning and answered False:
        a candidate that cannot reach the Lease does not lead). Never raises."""
        held = self.try_acquire_or_renew()
        state = (held, self.last_error)
        if state != self._logged:
            fields = {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}
            if self.last_error is not None:
                _LOG.warning("the Lease cannot be read or written; not leading",
                             extra={"fields": {**fields, "error": self.last_error}})
            elif self._logged is None or held != self._logged[0]:
                _LOG.info("holding the Lease" if held else "another candidate holds the Lease",
                          extra={"fields": fields})
            self._logged = state
        return held

    def _attempt(self) -> bool:
        now = self._clock()
        try:
            lease = self._call("GET", self._path())
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(0, None)}
            try:
                created = self._call("POST", self._path(named=False), body)
            except ApiException as conflict:
                if conflict.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(created, now)
            return True
        metadata = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        version = str(metadata.get("resourceVersion") or "")
        if version != self._observed_version:
            self._observe(lease, now)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        ours = holder == self.identity
        expired = not holder or now - self._observed_at >= duration
        if not ours and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        body = {**lease, "spec": self._spec(transitions, spec.get("acquireTime") if ours
                                            else None)}
        try:
            replaced = self._call("PUT", self._path(), body)
        except ApiException as exc:
            if exc.status == 409:  # someone else renewed or took it meanwhile
                return False
            raise
        self._observe(replaced, now)
        return True

    def _observe(self, lease: Any, now: float) -> None:
        self._observed_version = str(((lease or {}).get("metadata") or {})
                                     .get("resourceVersion") or "")
        self._observed_at = now

    def release(self) -> None:
        """Give the Lease up (holder cleared) if this candidate holds it; errors are ignored
        (the Lease then expires by itself)."""
        if not self.leader:
            return
        try:
            lease = self._call("GET", self._path())
            spec = (lease or {}).get("spec") or {}
            if spec.get("holderIdentity") == self.identity:
                self._call("PUT", self._path(), {**lease, "spec": {
                    **spec, "holderIdentity": None, "leaseDurationSeconds": 1}})
        except Exception:  # best effort: the Lease expires by itself
            self.last_error = "releasing the Lease failed; it expires by itself"
        self.leader = False
