"""The Kubernetes RBAC authorizer, evaluated locally on RBAC objects (offline ``authorizer``).

Owns :class:`RBACAuthorizer`: given Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
(``rbac.authorization.k8s.io/v1``, e.g. from an audit snapshot or the manifests ``check`` reads),
it answers :class:`~policies.authorization.Attributes` as the API server's RBAC authorizer does
(``plugin/pkg/auth/authorizer/rbac/rbac.go`` and ``pkg/registry/rbac/validation/rule.go``):

* ClusterRoleBindings apply everywhere, RoleBindings only to checks in their namespace; a
  RoleBinding may refer to a Role of its namespace or to a ClusterRole.
* Subjects: ``User`` by name, ``Group`` by the user's groups (``system:authenticated``,
  ``system:serviceaccounts``, ``system:serviceaccounts:<ns>`` are groups like any other: the
  request's ``userInfo`` carries them), ``ServiceAccount`` as the user
  ``system:serviceaccount:<ns>:<name>`` (its namespace defaults to the RoleBinding's).
* A rule allows when its ``verbs``, ``apiGroups``, ``resources`` (``*``, ``<resource>/<sub>``,
  ``*/<sub>``) and ``resourceNames`` (none: any name) match a resource request, or its ``verbs``
  and ``nonResourceURLs`` (``*``, exact, or a ``prefix*``) a non-resource one.
* ClusterRoles with an ``aggregationRule`` get the rules of every ClusterRole its
  ``clusterRoleSelectors`` select (as the clusterrole-aggregation controller writes them),
  nested aggregations included.
* Allowed: reason ``RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "r" to User "u"``;
  otherwise no-opinion (RBAC never denies), the reason naming missing roles as the API server
  does (``RBAC: clusterrole.rbac.authorization.k8s.io "r" not found``).

Not modelled (say so where it matters): the other authorizers of a cluster (Node, Webhook, ABAC)
and the API server's ``system:masters`` short cut (a superuser is allowed without RBAC objects).
Must not do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from policies.authorization import (
    SERVICE_ACCOUNT_PREFIX,
    Attributes,
    Decision,
    Subject,
    Unavailable,
    Verdict,
)
from policies.policy.model import LabelSelector, Requirement

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
RBAC_KINDS: Final = frozenset({"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"})
NO_RBAC_OBJECTS: Final = (
    "no RBAC objects (Role, ClusterRole, RoleBinding, ClusterRoleBinding) were given, so "
    "authorizer checks cannot be decided offline")


def is_rbac_object(obj: object) -> bool:
    """Whether ``obj`` is one of the four RBAC kinds of ``rbac.authorization.k8s.io``."""
    return isinstance(obj, Mapping) and obj.get("kind") in RBAC_KINDS and \
        str(obj.get("apiVersion", "")).startswith(RBAC_GROUP + "/")


@dataclass(frozen=True)
class Rule:
    """One PolicyRule (lists as written; empty lists match nothing, as in Kubernetes)."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    resource_names: tuple[str, ...]
    non_resource_urls: tuple[str, ...]

    def allows(self, attributes: Attributes) -> bool:
        """``RuleAllows`` of rbac.go."""
        if not ("*" in self.verbs or attributes.verb in self.verbs):
            return False
        if not attributes.resource_request:
            path = attributes.path
            return any(url in ("*", path) or (url.endswith("*") and path.startswith(url[:-1]))
                       for url in self.non_resource_urls)
        if not ("*" in self.api_groups or attributes.api_group in self.api_groups):
            return False
        sub = attributes.subresource
        combined = f"{attributes.resource}/{sub}" if sub else attributes.resource
        if not any(r in ("*", combined) or (sub and r == f"*/{sub}")
                   for r in self.resources):
            return False
        return not self.resource_names or attributes.name in self.resource_names


@dataclass(frozen=True)
class _Binding:
    kind: str  # RoleBinding or ClusterRoleBinding
    name: str
    namespace: str
    role_kind: str
    role_name: str
    subjects: tuple[Mapping[str, Any], ...]


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _rules(role: Mapping[str, Any]) -> list[Rule]:
    return [Rule(_strings(r.get("verbs")), _strings(r.get("apiGroups")),
                 _strings(r.get("resources")), _strings(r.get("resourceNames")),
                 _strings(r.get("nonResourceURLs")))
            for r in role.get("rules") or () if isinstance(r, Mapping)]


def _selector(value: Any) -> LabelSelector:
    value = value if isinstance(value, Mapping) else {}
    labels = value.get("matchLabels") if isinstance(value.get("matchLabels"), Mapping) else {}
    return LabelSelector(
        {str(k): str(v) for k, v in labels.items()},
        tuple(Requirement(str(e.get("key")), str(e.get("operator")), _strings(e.get("values")))
              for e in value.get("matchExpressions") or () if isinstance(e, Mapping)))


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _quoted(text: str) -> str:
    """Go's ``%q`` for the names RBAC messages quote."""
    return json.dumps(text, ensure_ascii=False)


class RBACAuthorizer:
    """The RBAC authorizer over a fixed set of RBAC objects; build once, thread-safe.

    Args:
        objects: Kubernetes objects; those that are not RBAC objects are ignored.

    Attributes:
        counts: how many of each RBAC kind were given (``{"Role": 2, ...}``).
    """

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._roles: dict[tuple[str, str], list[Rule]] = {}
        cluster_roles: dict[str, Mapping[str, Any]] = {}
        self._bindings: list[_Binding] = []
        self.counts: dict[str, int] = {}
        for obj in objects:
            if not is_rbac_object(obj):
                continue
            kind, meta = str(obj["kind"]), _meta(obj)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            name, namespace = str(meta.get("name", "")), str(meta.get("namespace") or "")
            if kind == "Role":
                self._roles[(namespace, name)] = _rules(obj)
            elif kind == "ClusterRole":
                cluster_roles[name] = obj
            else:
                found = obj.get("roleRef")
                ref: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
                subjects = tuple(s for s in obj.get("subjects") or () if isinstance(s, Mapping))
                self._bindings.append(_Binding(
                    kind, name, namespace if kind == "RoleBinding" else "",
                    str(ref.get("kind", "")), str(ref.get("name", "")), subjects))
        self._cluster_roles = {name: self._aggregated(name, cluster_roles, frozenset())
                               for name in cluster_roles}

    @staticmethod
    def _aggregated(name: str, roles: Mapping[str, Mapping[str, Any]],
                    seen: frozenset[str]) -> list[Rule]:
        """A ClusterRole's rules, with those its aggregationRule selects (transitively)."""
        role = roles[name]
        rules = _rules(role)
        aggregation = role.get("aggregationRule")
        if not isinstance(aggregation, Mapping):
            return rules
        selectors = [_selector(s) for s in aggregation.get("clusterRoleSelectors") or ()]
        for other in sorted(roles):
            if other == name or other in seen:
                continue
            labels = _meta(roles[other]).get("labels")
            labels = labels if isinstance(labels, Mapping) else {}
            if any(s.matches(labels) for s in selectors):
                for rule in RBACAuthorizer._aggregated(other, roles, seen | {name}):
                    if rule not in rules:
                        rules.append(rule)
        return rules

    def authorize(self, attributes: Attributes) -> Decision:
        """The RBAC decision: allow with the granting binding as reason, else no-opinion."""
        errors: list[str] = []
        for binding in self._bindings:
            if binding.kind == "RoleBinding" and binding.namespace != attributes.namespace:
                continue
            subject = _applies_to(attributes.subject, binding)
            if subject is None:
                continue
            rules = self._role_rules(binding, errors)
            if any(rule.allows(attributes) for rule in rules):
                return Decision(Verdict.ALLOW, f"RBAC: allowed by {_describe(binding, subject)}")
        if not errors:
            return Decision(Verdict.NO_OPINION, "")
        unique = list(dict.fromkeys(errors))
        text = unique[0] if len(unique) == 1 else f"[{', '.join(unique)}]"
        return Decision(Verdict.NO_OPINION, f"RBAC: {text}")

    def cached(self, attributes: Attributes) -> Decision:
        """:meth:`authorize`: it reads the RBAC objects it was given and never blocks (the
        webhook may then evaluate on its event loop, see ``webhook/admission.py``)."""
        return self.authorize(attributes)

    def _role_rules(self, binding: _Binding, errors: list[str]) -> Sequence[Rule]:
        if binding.role_kind == "ClusterRole":
            rules = self._cluster_roles.get(binding.role_name)
            if rules is None:
                errors.append(f"clusterrole.{RBAC_GROUP} {_quoted(binding.role_name)} not found")
            return rules or ()
        if binding.role_kind == "Role" and binding.kind == "RoleBinding":
            found = self._roles.get((binding.namespace, binding.role_name))
            if found is None:
                errors.append(f"role.{RBAC_GROUP} {_quoted(binding.role_name)} not found")
            return found or ()
        errors.append(f"{binding.kind} {_quoted(binding.name)} refers to a {binding.role_kind!r}")
        return ()


def _applies_to(user: Subject, binding: _Binding) -> Mapping[str, Any] | None:
    """The first subject of ``binding`` that is ``user`` (``appliesToUser`` of rule.go)."""
    for subject in binding.subjects:
        kind, name = subject.get("kind"), str(subject.get("name", ""))
        if kind == "User" and user.username == name:
            return subject
        if kind == "Group" and name in user.groups:
            return subject
        if kind == "ServiceAccount":
            namespace = str(subject.get("namespace") or binding.namespace)
            if namespace and user.username == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}":
                return subject
    return None


def _describe(binding: _Binding, subject: Mapping[str, Any]) -> str:
    """rule.go's describers: ``RoleBinding "b/ns" of Role "r" to ServiceAccount "sa/ns"``."""
    kind, name = str(subject.get("kind")), str(subject.get("name", ""))
    if kind == "ServiceAccount":
        name = f"{name}/{subject.get('namespace') or binding.namespace}"
    where = f"{binding.name}/{binding.namespace}" if binding.kind == "RoleBinding" \
        else binding.name
    return (f"{binding.kind} {_quoted(where)} of {binding.role_kind} "
            f"{_quoted(binding.role_name)} to {kind} {_quoted(name)}")


def offline_authorizer(objects: Iterable[Mapping[str, Any]]) -> RBACAuthorizer | Unavailable:
    """The authorizer for offline evaluation: RBAC over ``objects``' RBAC objects, or, when
    there are none, :class:`~policies.authorization.Unavailable` (every check errored, saying
    :data:`NO_RBAC_OBJECTS`), so that no check silently allows or denies."""
    authorizer = RBACAuthorizer(objects)
    return authorizer if authorizer.counts else Unavailable(NO_RBAC_OBJECTS)
