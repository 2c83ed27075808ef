"""Writing the gpuguard.io objects' status: one writer, chosen by a Lease, writing only changes.

Owns:

- :class:`LeaseElector`: a ``coordination.k8s.io/v1`` Lease (``gpuguard-policy-status`` in the
  webhook's namespace) naming the one replica that writes status. :meth:`LeaseElector.leading`
  creates the Lease when missing, renews it when held, and takes it over once its holder has
  not renewed it for ``leaseDurationSeconds``; every update carries the read resourceVersion,
  so two replicas racing for it cannot both win (409 Conflict: the loser stays a follower).
- :class:`StatusPublisher`: on the leader, writes each object's ``status`` (``observedGeneration``
  and the ``Accepted`` / ``Ready`` conditions of :func:`kube.served_set.conditions`) through the
  status subresource with a JSON merge patch — only when it differs from what the object holds
  and was not already written for that resourceVersion, so an unchanged verdict writes nothing
  (a status write is a watch event of its own; rewriting it on every check would be a storm).

Why a Lease and not conditions keyed per replica: every replica builds the same verdict from the
same objects (the loader is deterministic), so one writer says it once; per-replica conditions
would multiply writes by the replica count, leave stale entries behind when pods go, and break
the ``READY`` printer column, which reads the one ``Ready`` condition.

Must not build the served set: it is handed the merge.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from kube.policy_objects import GROUP, RESOURCES, VERSION, PolicyObject
from kube.served_set import Merge, conditions, status_differs

_LOG = logging.getLogger("gpuguard.kube.policy_status")
LEASE_NAME = "gpuguard-policy-status"
_PLURALS = {r.kind: r.plural for r in RESOURCES}


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def rfc3339(moment: datetime.datetime) -> str:
    """``2026-12-02T03:00:00Z`` (metav1.Time: seconds, UTC)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LeaseElector:
    """Whether this replica is the status writer (see the module docstring).

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        namespace: where the Lease lives (the webhook's namespace).
        identity: this replica's name (the pod name), the Lease's ``holderIdentity``.
        duration_s: ``leaseDurationSeconds``: how long a holder that stopped renewing keeps it.
        clock: the current UTC time (tests pass a fake one).
    """

    def __init__(self, api_client: k8s_client.ApiClient, namespace: str, identity: str, *,
                 name: str = LEASE_NAME, duration_s: int = 15,
                 clock: Callable[[], datetime.datetime] = _utc_now) -> None:
        self._api = k8s_client.CoordinationV1Api(api_client)
        self.namespace, self.identity, self.name = namespace, identity, name
        self.duration_s = duration_s
        self._clock = clock

    def leading(self) -> bool:
        """Renew or acquire the Lease; True while this replica holds it.

        API errors other than a lost race (409) are logged and answered False: a replica that
        cannot reach the Lease does not write.
        """
        now = self._clock()
        try:
            try:
                lease = self._api.read_namespaced_lease(self.name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                # Created without times (the client writes a whole second without the
                # fraction MicroTime requires), then stamped with the update below.
                lease = self._api.create_namespaced_lease(self.namespace, k8s_client.V1Lease(
                    metadata=k8s_client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=k8s_client.V1LeaseSpec(holder_identity=self.identity,
                                                lease_duration_seconds=self.duration_s,
                                                lease_transitions=0)))
                self._stamp(_version(lease), now, acquired=True, transitions=0)
                return True
            spec = lease.spec or k8s_client.V1LeaseSpec()
            holder = spec.holder_identity
            renewed = spec.renew_time
            duration = spec.lease_duration_seconds or self.duration_s
            expired = renewed is None or \
                now >= renewed + datetime.timedelta(seconds=duration)
            if holder != self.identity and not expired:
                return False
            transitions = spec.lease_transitions or 0
            if holder != self.identity:
                transitions += 1
                _LOG.info("taking over the policy status lease", extra={"fields": {
                    "previous_holder": holder, "identity": self.identity}})
            self._stamp(_version(lease), now, acquired=holder != self.identity,
                        transitions=transitions)
            return True
        except ApiException as exc:
            if exc.status == 409:  # another replica renewed or took it first
                return False
            _LOG.warning("the policy status lease cannot be read or written; not writing "
                         "status", extra={"fields": {"error": f"{exc.status} {exc.reason}",
                                                     "detail": str(exc.body or "")[:500]}})
            return False
        except Exception as exc:  # network errors: not the leader this time
            _LOG.warning("the policy status lease cannot be reached; not writing status",
                         extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
            return False


    def _stamp(self, resource_version: str, now: datetime.datetime, *, acquired: bool,
               transitions: int) -> None:
        """Hold the Lease from ``now``: a merge patch carrying the resourceVersion read, so the
        API server refuses it (409) when another replica wrote the Lease in between."""
        spec: dict[str, Any] = {"holderIdentity": self.identity,
                                "leaseDurationSeconds": self.duration_s,
                                "renewTime": micro_time(now), "leaseTransitions": transitions}
        if acquired:
            spec["acquireTime"] = micro_time(now)
        self._api.patch_namespaced_lease(
            self.name, self.namespace,
            {"metadata": {"resourceVersion": resource_version}, "spec": spec},
            _content_type="application/merge-patch+json", _request_timeout=(10, 30))


def _version(lease: k8s_client.V1Lease) -> str:
    return str(lease.metadata.resource_version or "") if lease.metadata is not None else ""


def micro_time(moment: datetime.datetime) -> str:
    """``2026-12-02T03:00:00.000000Z``: metav1.MicroTime, which requires the fraction."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class StatusPublisher:
    """Writes the objects' status when leading (see the module docstring).

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        leading: whether this replica writes now (:meth:`LeaseElector.leading`).
        clock: the current UTC time, for ``lastTransitionTime``.
        patch: writes one status (``(object, status body)``); default the status subresource.
    """

    def __init__(self, api_client: k8s_client.ApiClient | None, leading: Callable[[], bool], *,
                 clock: Callable[[], datetime.datetime] = _utc_now,
                 patch: Callable[[PolicyObject, Mapping[str, Any]], None] | None = None) -> None:
        self._api = k8s_client.CustomObjectsApi(api_client) if api_client is not None else None
        self._leading = leading
        self._clock = clock
        self._patch = patch or self._patch_status
        self._written: dict[str, tuple[str, int, list[dict[str, Any]]]] = {}
        self.writes = 0  # status writes made (a figure for tests and logs)

    def publish(self, objects: Sequence[PolicyObject], result: Merge, serving: bool) -> None:
        """Write the status of each object of ``objects`` whose status ``result`` changes."""
        if not self._leading():
            self._written.clear()  # a new term starts from what the objects hold
            return
        now = rfc3339(self._clock())
        for obj in objects:
            generation, wanted = conditions(obj, result, serving=serving, now=now)
            if not status_differs(obj, generation, wanted):
                continue
            done = self._written.get(obj.key)
            if done is not None and done[0] == obj.resource_version and done[1] == generation \
                    and _without_times(done[2]) == _without_times(wanted):
                continue  # written already; the watch has not delivered it yet
            try:
                self._patch(obj, {"status": {"observedGeneration": generation,
                                             "conditions": wanted}})
            except ApiException as exc:
                if exc.status != 404:  # 404: deleted meanwhile; nothing to say
                    _LOG.warning("writing a policy object's status failed", extra={"fields": {
                        "object": obj.key, "error": f"{exc.status} {exc.reason}"}})
                continue
            self.writes += 1
            self._written[obj.key] = (obj.resource_version, generation, wanted)
        present = {o.key for o in objects}
        for key in [k for k in self._written if k not in present]:
            del self._written[key]

    def _patch_status(self, obj: PolicyObject, body: Mapping[str, Any]) -> None:
        assert self._api is not None
        plural = _PLURALS[obj.kind]
        if obj.namespace:
            self._api.patch_namespaced_custom_object_status(
                GROUP, VERSION, obj.namespace, plural, obj.name, dict(body),
                _content_type="application/merge-patch+json", _request_timeout=(10, 30))
        else:
            self._api.patch_cluster_custom_object_status(
                GROUP, VERSION, plural, obj.name, dict(body),
                _content_type="application/merge-patch+json", _request_timeout=(10, 30))


def _without_times(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in items]
