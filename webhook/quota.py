"""The quota step of ``/validate``: the loaded ``GPUQuota`` documents checked (and reserved).

Owns turning the policy snapshot's quotas (``PolicySet.quotas``: they load from the same
``--policies`` paths as the policies and reload with them) into a
:class:`kube.quota_ledger.QuotaAdmission` over one long-lived ledger and pod usage source, rebuilt
only when a reload brings a different set of quotas. The ledger (ConfigMaps in a cluster, memory
in standalone mode) and the pod usage (the pod watch) are built by
:mod:`gpuguard.serve_command`; see ``docs/quota.md`` for the protocol.

Must not know about HTTP or evaluate policies.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kube.quota_ledger import (
    LedgerUnavailable,
    QuotaAdmission,
    QuotaDecision,
    QuotaLedger,
    reservation_key,
)
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings
from policies.policy.quota import Quota, applicable
from policies.vocabulary import FailurePolicy


class QuotaGate:
    """Quota admission for whichever quotas the served policy set holds.

    Args:
        ledger: the reservation ledger (its store and usage source live as long as the server).
        namespace_labels: namespace name → its labels (the namespace source), for team scopes.
        settings: GPU naming, for the GPU facts.
        source: where usage comes from, for logs and readiness (``cluster pod watch``, …).
        usage_status: ``(synced, detail)`` of the usage source (the pod watch); until it has
            synced, usage would count no pods, so quota requests follow their failurePolicy and
            readiness waits. None: always synced (standalone).
    """

    def __init__(self, ledger: QuotaLedger,
                 namespace_labels: Callable[[str], Mapping[str, Any]],
                 settings: GPUSettings = DEFAULT_SETTINGS, *, source: str = "",
                 usage_status: Callable[[], tuple[bool, str]] | None = None) -> None:
        self.usage_status = usage_status
        self.ledger = ledger
        self.namespace_labels = namespace_labels
        self.settings = settings
        self.source = source
        self._lock = threading.Lock()
        self._quotas: Sequence[Quota] | None = None
        self._admission: QuotaAdmission | None = None

    def admission(self, quotas: Sequence[Quota]) -> QuotaAdmission:
        """The :class:`QuotaAdmission` of ``quotas`` (built once per distinct set)."""
        with self._lock:
            if self._admission is None or self._quotas is not quotas:
                self._admission = QuotaAdmission(quotas, self.ledger, self.namespace_labels,
                                                 self.settings)
                self._quotas = quotas
            return self._admission

    def status(self) -> tuple[bool, str]:
        """``(synced, detail)`` of the usage source, for readiness."""
        if self.usage_status is None:
            return True, self.source
        synced, detail = self.usage_status()
        return synced, f"{self.source}: {detail}"

    def admit(self, quotas: Sequence[Quota], request: Mapping[str, Any]) -> QuotaDecision:
        """Check (and unless dryRun reserve) ``request`` against ``quotas``; blocking.

        Before the usage source has synced, the quotas' failurePolicy decides (counting no
        pods would admit past every limit).
        """
        synced, detail = self.status()
        if not synced:
            return self.unavailable(quotas, request, detail)
        return self.admission(quotas).admit(request)

    def release(self, quotas: Sequence[Quota], names: Sequence[str],
                request: Mapping[str, Any]) -> None:
        """Drop the reservations ``request`` made (a policy denied it after quota admitted it).

        Best effort: a reservation that cannot be released expires by its TTL.
        """
        admission = self.admission(quotas)
        release_reservations(admission, names, request)

    def unavailable(self, quotas: Sequence[Quota], request: Mapping[str, Any],
                    what: str) -> QuotaDecision:
        """The decision when the quota step could not finish (``what``: why): each quota the
        request counts against follows its failurePolicy, as when the API is unreachable."""
        namespace = str(request.get("namespace") or "")
        scoped = applicable(quotas, namespace, self.namespace_labels(namespace))
        failing = [q.name for q in scoped if q.failure_policy == FailurePolicy.FAIL]
        if failing:
            return QuotaDecision(False, tuple(
                f"GPUQuota {name}: usage could not be checked ({what}); failurePolicy Fail"
                for name in failing), denied_by=tuple(failing))
        return QuotaDecision(True, warnings=tuple(
            f"GPUQuota {q.name}: usage could not be checked ({what}); admitted "
            "(failurePolicy Ignore)" for q in scoped))


def release_reservations(admission: QuotaAdmission, names: Sequence[str],
                         request: Mapping[str, Any]) -> None:
    """Release the reservations of ``request`` in the quotas named ``names`` (best effort)."""
    key = reservation_key(request)[0]
    by_name = {q.name: q for q in admission.quotas}
    for name in names:
        quota = by_name.get(name)
        if quota is None:
            continue
        with contextlib.suppress(LedgerUnavailable):  # else it expires by its TTL
            admission.ledger.release(quota, key)
