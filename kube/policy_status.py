"""Writing the gpuguard.io objects' status: one writer, chosen by a Lease, writing only changes.

Owns:

- :data:`LEASE_NAME`: the ``coordination.k8s.io/v1`` Lease (``gpuguard-policy-status`` in the
  webhook's namespace) naming the one replica that writes status, held through
  :class:`kube.lease.LeaseElector` (gpuguard's one elector: a holder is judged expired on the
  candidate's own clock, never by its ``renewTime``; every write carries the read
  resourceVersion, so two replicas racing for it cannot both win).
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


class StatusPublisher:
    """Writes the objects' status when leading (see the module docstring).

    Args:
        api_client: an authenticated ``kubernetes.client.ApiClient``.
        leading: whether this replica writes now (:meth:`kube.lease.LeaseElector.leading`).
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
