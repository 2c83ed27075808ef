"""Does a policy apply to this request? Resource rules, selectors, namespaces, subjects, exceptions.

Owns the matching semantics of ``matchConstraints`` / ``matchResources`` as the Kubernetes API
reference defines them for admission policies (``*`` wildcards; ``*`` covers resources but not
subresources, ``pods/*`` every subresource of pods, ``*/*`` everything; the object selector is
tried on the new and the old object; namespaceSelector uses the Namespace's labels, or the
object's own labels when the object is a Namespace, and never excludes cluster-scoped objects),
plus GPUPolicy's ``namespaces`` / ``excludeNamespaces`` and ``subjects``.

:func:`applicability` is the one decision "match, then exceptions" that the engine, the
webhook's fail-closed fallback and the policy test-suite runner all use; matchConditions, the
third step, are CEL and belong to the engine, which reports them as ``skip`` results.

Must not evaluate CEL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.facts.review import ReviewInput
from policies.facts.workload_kinds import by_resource
from policies.facts.workloads import find_workload
from policies.json_fields import mapping_at
from policies.policy.model import Exception_, Match, Policy, ResourceRule, Subject
from policies.vocabulary import EvaluationPoint

AUDIT_OPERATION = "CREATE"  # at the audit point, existing objects are judged as if created


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        return {}
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _resource_matches(patterns: tuple[str, ...], resource: str, subresource: str) -> bool:
    if "*/*" in patterns:
        return True
    if not subresource:
        return resource in patterns or "*" in patterns
    return (f"{resource}/{subresource}" in patterns or f"{resource}/*" in patterns
            or f"*/{subresource}" in patterns)


def rule_matches(rule: ResourceRule, review: ReviewInput, operation: str) -> bool:
    """Whether one resource rule covers the request's group, version, resource and operation."""
    resource = review.resource
    if "*" not in rule.api_groups and resource.group not in rule.api_groups:
        return False
    if "*" not in rule.api_versions and resource.version not in rule.api_versions \
            and not rule.any_version:
        return False
    if "*" not in rule.operations and operation not in rule.operations:
        return False
    if rule.resource_names and review.name not in rule.resource_names:
        return False
    if _resource_matches(rule.resources, resource.resource, review.subresource):
        return True
    return rule.unmodelled_workloads and _unmodelled_workload(review)


def unmodelled_kind(review: ReviewInput) -> bool:
    """Whether the request is for a kind the workload registry does not model (no
    subresource, not a kind that carries resource lists without making pods): then a rule with
    ``unmodelled_workloads`` decides by the object (:func:`_unmodelled_workload`), not by the
    request's shape. Depends on the group, resource, subresource and kind alone."""
    resource = review.resource
    return not review.subresource and by_resource(resource.group, resource.resource) is None \
        and review.kind[2] not in _NOT_WORKLOADS


def _unmodelled_workload(review: ReviewInput) -> bool:
    """Whether the request is for a resource the workload registry does not model, whose object
    holds pod templates, PodSpecs or resource blocks (a GPUPolicy that leaves
    ``match.resources`` out judges it, so its GPUs pass no policy unseen) — found by a
    structural search, or where the reader of a built-in kind of the same name looks: a custom
    resource of kind ``Deployment`` or ``Pod`` in its own group and plural is read as one, and
    judged (it escaped every policy when only the search's finds counted)."""
    if not unmodelled_kind(review) or not isinstance(review.subject, Mapping):
        return False
    return find_workload(review.subject) is not None


# Kinds that carry resource lists without making pods: never judged as workloads.
_NOT_WORKLOADS = frozenset({"Namespace", "Node", "ResourceQuota", "LimitRange", "GPUQuota",
                            "GPUPolicy", "ResourceClaim", "ResourceClaimTemplate",
                            "DeviceClass", "ResourceSlice"})


def subject_matches(subject: Subject, review: ReviewInput) -> bool:
    """Whether the requesting user is this User, in this Group, or is this ServiceAccount."""
    user = review.user
    if subject.kind == "User":
        return subject.name in ("*", user.username)
    if subject.kind == "Group":
        return subject.name == "*" or subject.name in user.groups
    prefix = "system:serviceaccount:"
    if not user.username.startswith(prefix):
        return False
    namespace, _, name = user.username.removeprefix(prefix).partition(":")
    return subject.name in ("*", name) and subject.namespace in ("", "*", namespace)


def effective_operation(review: ReviewInput, point: EvaluationPoint) -> str:
    """The operation the resource rules are matched against: the request's, or CREATE at the
    audit point (existing objects are judged as if created)."""
    return AUDIT_OPERATION if point == EvaluationPoint.AUDIT else review.operation


def rules_select(match: Match, review: ReviewInput, operation: str) -> bool:
    """Whether the resource rules of ``match`` select the request: one of ``rules`` (and of
    ``narrowing_rules``, when given) covers it and none of ``exclude_rules`` does. With
    :func:`rules_name_free`, the answer depends on the request's group, version, resource,
    subresource and ``operation`` alone (what :class:`policies.engine.evaluation.Engine` caches)."""
    if not any(rule_matches(r, review, operation) for r in match.rules):
        return False
    if match.narrowing_rules and not any(
        rule_matches(r, review, operation) for r in match.narrowing_rules
    ):
        return False
    return not any(rule_matches(r, review, operation) for r in match.exclude_rules)


def rules_name_free(match: Match) -> bool:
    """Whether no resource rule of ``match`` names objects (``resourceNames``), so that
    :func:`rules_select` does not depend on the request's object name."""
    return not any(rule.resource_names for rule in
                   (*match.rules, *match.narrowing_rules, *match.exclude_rules))


def judges_unmodelled(match: Match) -> bool:
    """Whether a resource rule of ``match`` also covers workloads of kinds the registry does
    not model (a GPUPolicy that leaves ``match.resources`` out): for such a kind
    (:func:`unmodelled_kind`) :func:`rules_select` depends on the object, not on the request's
    shape."""
    return any(rule.unmodelled_workloads for rule in
               (*match.rules, *match.narrowing_rules, *match.exclude_rules))


def selects_by_rules_alone(match: Match) -> bool:
    """Whether ``match`` is its resource rules and nothing else (no scope, selector, namespace
    list or subjects), so that :func:`matches` is :func:`rules_select`. Every part
    :func:`matches` reads beyond the rules must be named here."""
    return not (match.namespaced is not None
                or match.namespace_selector.match_labels or match.namespace_selector.requirements
                or match.object_selector.match_labels or match.object_selector.requirements
                or match.namespaces or match.exclude_namespaces or match.subjects
                or match.exclude_subjects)


def matches(match: Match, review: ReviewInput, *,
            point: EvaluationPoint = EvaluationPoint.ADMISSION) -> bool:
    """Whether ``match`` selects this request (every given part must hold)."""
    if not rules_select(match, review, effective_operation(review, point)):
        return False
    namespace = review.namespace
    if match.namespaced is not None and bool(namespace) != match.namespaced:
        return False
    selector = match.namespace_selector
    if selector.match_labels or selector.requirements:  # the empty selector selects all
        if review.kind[2] == "Namespace":
            if not selector.matches(_labels(review.subject)):
                return False
        elif namespace and not selector.matches(_labels(review.namespace_object)):
            return False
    if namespace:
        if match.namespaces and namespace not in match.namespaces:
            return False
        if namespace in match.exclude_namespaces:
            return False
    selector = match.object_selector
    if selector.match_labels or selector.requirements:
        objects = [o for o in (review.object, review.old_object) if isinstance(o, Mapping)]
        if not any(selector.matches(_labels(o)) for o in objects):
            # (CONNECT-style requests carry no labels an objectSelector could match)
            return False
    if match.subjects and not any(subject_matches(s, review) for s in match.subjects):
        return False
    return not any(subject_matches(s, review) for s in match.exclude_subjects)


@dataclass(frozen=True)
class NotApplicable:
    """Why a policy does not apply to a request.

    Attributes:
        rule / path: ``match`` / ``spec.match`` when the match leaves the request out;
            ``exceptions`` / ``spec.exceptions`` when an exception exempts it.
        message: for people (the exception's reason and expiry, or what left it out).
        exemption: the exception that applies, when that is the reason.
    """

    rule: str
    path: str
    message: str
    exemption: Exception_ | None = None


OUT_OF_MATCH = NotApplicable("match", "spec.match", "the match leaves this request out")


def applicability(policy: Policy, review: ReviewInput, *,
                  point: EvaluationPoint = EvaluationPoint.ADMISSION) -> NotApplicable | None:
    """None when ``policy`` applies to ``review`` before its matchConditions: its match
    selects the request and no exception exempts it (an expired exception exempts nothing;
    expiry is read against ``review.now``, in UTC); else why not."""
    if not matches(policy.match, review, point=point):
        return OUT_OF_MATCH
    if not policy.exceptions:
        return None
    subject = review.subject if isinstance(review.subject, Mapping) else {}
    metadata = mapping_at(subject, "metadata")
    labels = mapping_at(metadata, "labels")
    name = review.name or str(metadata.get("name") or metadata.get("generateName") or "")
    today = review.now.date()
    for exemption in policy.exceptions:
        if exemption.applies(review.namespace, name, labels, today):
            until = f" (until {exemption.expires})" if exemption.expires else ""
            return NotApplicable("exceptions", "spec.exceptions",
                                 f"{exemption.reason}{until}", exemption)
    return None
