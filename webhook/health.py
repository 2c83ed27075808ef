"""Readiness: whether the API server may send requests to this server now.

Owns the ``/readyz`` verdict and its detail. Ready means: a policy set is loaded, TLS is up (the
listener serves a certificate, and the optional certificate check finds nothing wrong — e.g. an
expired certificate), the namespace source has synced, the quota usage source (the pod watch)
has synced when the served set holds ``GPUQuota`` documents, and no shutdown has begun. A rejected
policy update or a failed certificate reload does not make the server unready (the last good set
and certificate keep serving) but is shown in the detail. The ``policies`` check names the set
served: ``generation``, ``hash`` (``sha256:`` of its files) and ``policies`` (how many), plus
``rejectedUpdate`` (the errors) and ``pendingUpdate`` (a change waiting to hold still; for one
that removes content from policies, what it removes).

Must not serve HTTP (the app does) or change any state other than its own flags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.admission import NamespaceSource
from webhook.policy_store import PolicyStore


class Health:
    """The server's readiness flags and checks.

    Args:
        store: the policy store.
        namespaces: the namespace source.
        certificate_check: returns a problem with the served certificate (e.g. expired), or
            None; called on every ``/readyz``.
        quota_status: ``(synced, detail)`` of the quota usage source; checked only while the
            served policy set holds quotas. None: no quota step.
    """

    def __init__(self, store: PolicyStore, namespaces: NamespaceSource,
                 certificate_check: Callable[[], str | None] | None = None,
                 quota_status: Callable[[], tuple[bool, str]] | None = None) -> None:
        self.quota_status = quota_status
        self.store = store
        self.namespaces = namespaces
        self.certificate_check = certificate_check
        self.tls_up = False
        self.tls_reload_error: str | None = None
        self.shutting_down = False

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, detail)``; ``detail`` maps each check to ``{ok, detail}``."""
        checks: dict[str, dict[str, Any]] = {}
        snapshot = self.store.current
        if snapshot is None:
            problem = "; ".join(self.store.last_errors) or "loading"
            checks["policies"] = {"ok": False, "detail": f"no policy set loaded: {problem}"}
        else:
            checks["policies"] = {
                "ok": True, **snapshot.identity,
                "detail": f"{snapshot.engine.policies.counts()} from {self.store.describe()}"}
            if self.store.last_errors:
                checks["policies"]["rejectedUpdate"] = list(self.store.last_errors)
            if self.store.held:
                checks["policies"]["pendingUpdate"] = (
                    "the policy files changed and remove content from policies; served once they "
                    f"read the same for {self.store.removal_quiet_s:g} s: "
                    + "; ".join(self.store.held))
            elif self.store.pending:
                checks["policies"]["pendingUpdate"] = "the policy files changed; loaded once " \
                    "they read the same at two consecutive checks"
        tls: dict[str, Any] = {"ok": self.tls_up,
                               "detail": "serving" if self.tls_up else "not listening yet"}
        served = self.certificate_check() if self.certificate_check and self.tls_up else None
        if served:
            tls = {"ok": False, "detail": served}
        if self.tls_reload_error:
            tls["lastReloadError"] = self.tls_reload_error
        checks["tls"] = tls
        synced, detail = self.namespaces.status()
        checks["namespaces"] = {"ok": synced, "detail": detail}
        if self.quota_status is not None and snapshot is not None and \
                snapshot.engine.policies.quotas:
            synced, detail = self.quota_status()
            checks["quotaUsage"] = {"ok": synced, "detail": detail}
        if self.shutting_down:
            checks["shutdown"] = {"ok": False, "detail": "shutting down"}
        ready = all(check["ok"] for check in checks.values())
        return ready, {"status": "ready" if ready else "not ready", "checks": checks}
