"""What an authorization check asks and answers, and the :class:`Authorizer` protocol.

Owns :class:`Subject`, :class:`Attributes` and :class:`Decision`, shaped as Kubernetes'
``k8s.io/apiserver/pkg/authorization/authorizer`` ``Attributes`` / ``Decision`` (and so as a
SubjectAccessReview's spec and status), and :class:`Authorizer`, the one method the CEL
``authorizer`` library (:mod:`policies.cel.library.authz`) calls. The webhook injects one that
issues SubjectAccessReviews (``kube/subject_access_reviews.py``); ``check``, ``audit`` and ``test``
inject :class:`policies.rbac.RBACAuthorizer` (the snapshot's RBAC objects) or
:class:`Unavailable`. Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
"""User-name prefix of service accounts (``k8s.io/apiserver/pkg/authentication/serviceaccount``)."""
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
"""Group of every service account; ``system:serviceaccounts:<namespace>`` those of a namespace."""


class Verdict(StrEnum):
    """An authorizer's decision (Kubernetes ``authorizer.Decision``)."""

    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


@dataclass(frozen=True)
class Subject:
    """Who is checked: the request's ``userInfo`` or a service account (``serviceAccount()``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Subject:
        """The user of a service account as Kubernetes' ``ServiceAccountInfo.UserInfo()``
        builds it: ``system:serviceaccount:<ns>:<name>``, groups ``system:serviceaccounts`` and
        ``system:serviceaccounts:<ns>`` (no ``system:authenticated``: the authenticator adds
        that, not the service-account info)."""
        return cls(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
                   groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}"))

    def key(self) -> tuple[object, ...]:
        """A hashable identity (cache keys)."""
        return (self.username, self.uid, tuple(self.groups),
                tuple(sorted((k, tuple(v)) for k, v in self.extra.items())))


@dataclass(frozen=True)
class Attributes:
    """One check: a resource request (``resource_request``) or a non-resource ``path``.

    ``api_version`` is ``*`` for CEL checks (authz.go sets it so); ``namespace`` ``""`` is the
    cluster scope; ``name`` / ``subresource`` ``""`` are unset; selectors are raw strings, ``""``
    unset.
    """

    subject: Subject
    verb: str
    resource_request: bool
    api_group: str = ""
    api_version: str = "*"
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    field_selector: str = ""
    label_selector: str = ""

    def key(self) -> tuple[object, ...]:
        """A hashable identity of the whole check, subject included (cache keys)."""
        return (self.subject.key(), self.verb, self.resource_request, self.api_group,
                self.api_version, self.resource, self.subresource, self.namespace, self.name,
                self.path, self.field_selector, self.label_selector)

    def describe(self) -> str:
        """``create nvidia.com/gpus "h100" in namespace "ml"`` / ``get path "/healthz"``."""
        if not self.resource_request:
            return f"{self.verb} path {self.path!r}"
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        what = f"{what}.{self.api_group}" if self.api_group else what
        name = f" {self.name!r}" if self.name else ""
        where = f" in namespace {self.namespace!r}" if self.namespace else ""
        return f"{self.verb} {what}{name}{where}"


@dataclass(frozen=True)
class Decision:
    """An authorizer's answer: ``allowed()`` is ``verdict == ALLOW``; ``error`` non-empty makes it
    ``errored()`` (Kubernetes ``decisionVal``: an authorizer that failed answers no-opinion
    with its error)."""

    verdict: Verdict
    reason: str = ""
    error: str = ""

    @property
    def allowed(self) -> bool:
        """``allowed()``: the verdict is allow."""
        return self.verdict == Verdict.ALLOW

    @property
    def errored(self) -> bool:
        """``errored()``: the check failed."""
        return self.error != ""


class Authorizer(Protocol):
    """What the CEL ``authorizer`` calls for each ``check(verb)``."""

    def authorize(self, attributes: Attributes) -> Decision:
        """The decision for ``attributes``. Must not raise: a failure is an errored
        :class:`Decision` (``Verdict.NO_OPINION`` with ``error``)."""
        ...


class CachingAuthorizer(Authorizer, Protocol):
    """An :class:`Authorizer` that can say, without blocking, what it would answer.

    The webhook evaluates policy sets that use ``authorizer`` on its event loop with
    :meth:`cached` answering, and only when one check misses goes to the thread pool, where
    :meth:`~Authorizer.authorize` may block (``webhook/admission.py``).
    """

    def cached(self, attributes: Attributes) -> Decision | None:
        """The decision for ``attributes`` when it can be given without blocking (a cached
        answer, or an authorizer that never blocks); None when it would need a review."""
        ...


@dataclass(frozen=True)
class Unavailable:
    """An authorizer that cannot decide anything, saying why (``error``): every check is an
    errored no-opinion, so a policy relying on ``authorizer`` never silently allows where no
    decision can be made (offline without RBAC objects, a webhook without API access)."""

    error: str

    def authorize(self, attributes: Attributes) -> Decision:
        """An errored no-opinion naming :attr:`error` and the check."""
        return Decision(Verdict.NO_OPINION, "", f"{self.error} (check: {attributes.describe()})")

    def cached(self, attributes: Attributes) -> Decision:
        """:meth:`authorize`: it never blocks."""
        return self.authorize(attributes)
