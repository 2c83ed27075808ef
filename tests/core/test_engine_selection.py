"""The engine's per-request-shape selection of policies decides exactly what matching decides.

:class:`policies.engine.evaluation.Engine` works out once per (group, version, resource,
subresource, operation) which policies' resource rules can select a request
(``Engine._selection``, issue 20). These tests walk a grid of requests — kinds, subresources,
operations, names, namespaces with and without labels, users — over policies that use every part of
a match (resource wildcards, subresources, operations, ``resourceNames``, exclusions, namespace and
object selectors, namespace lists, subjects, exceptions) and compare the verdict's results, request
after request on one engine (so the cache is warm and shared), with those of the uncached path
(``explain=True`` walks every policy through ``applicability`` and adds a ``skip`` result for each
one the match leaves out).
"""

from __future__ import annotations

import itertools

import yaml

from policies.engine.evaluation import Engine
from policies.facts.review import from_request
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.core.test_engine import engine_for, gpu_policy

VALIDATION = {"validations": [{"expression": "gpu.count <= 1", "message": "at most 1 GPU"}]}


def _native(name: str, constraints: dict) -> str:
    policy = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail", "matchConstraints": constraints,
                       "validations": [{"expression": "object.metadata.name != 'blocked'"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": f"{name}-b"},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return yaml.safe_dump_all([policy, binding])


POLICIES = "---\n".join([
    gpu_policy("defaults", VALIDATION),
    gpu_policy("pods-only", {"match": {"resources": ["pods"]}, **VALIDATION}),
    gpu_policy("every-subresource", {"match": {"resources": ["pods/*"]}, **VALIDATION}),
    gpu_policy("scale", {"match": {"resources": ["deployments/scale"],
                                   "operations": ["UPDATE"]}, **VALIDATION}),
    gpu_policy("deletes", {"match": {"resources": ["*"], "operations": ["DELETE"]},
                           **VALIDATION}),
    gpu_policy("team-selector", {"match": {"namespaceSelector": {
        "matchLabels": {"team": "a"}}}, **VALIDATION}),
    gpu_policy("object-selector", {"match": {"objectSelector": {
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod"]}]}},
        **VALIDATION}),
    gpu_policy("listed", {"match": {"namespaces": ["ml"], "excludeNamespaces": ["kube-system"]},
                          **VALIDATION}),
    gpu_policy("subjects", {"match": {"subjects": {
        "include": [{"kind": "Group", "name": "researchers"}],
        "exclude": [{"kind": "User", "name": "admin"}]}}, **VALIDATION}),
    gpu_policy("excepted", {"exceptions": [{"namespaces": ["ml"], "reason": "campaign"}],
                            **VALIDATION}),
    _native("named", {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                         "resources": ["pods"], "operations": ["*"],
                                         "resourceNames": ["special", "blocked"]}]}),
    _native("excluded-names", {
        "resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
                           "operations": ["CREATE", "UPDATE"]}],
        "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                                  "resources": ["pods"], "operations": ["*"],
                                  "resourceNames": ["special"]}]}),
    _native("apps", {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                        "resources": ["deployments", "deployments/scale"],
                                        "operations": ["*"]}]}),
])

SHAPES = [  # (group, version, resource, kind, subresource)
    ("", "v1", "pods", "Pod", ""),
    ("", "v1", "pods", "Pod", "ephemeralcontainers"),
    ("", "v1", "pods", "Pod", "status"),
    ("apps", "v1", "deployments", "Deployment", ""),
    ("apps", "v1", "deployments", "Deployment", "scale"),
    ("batch", "v1", "jobs", "Job", ""),
]
OPERATIONS = ["CREATE", "UPDATE", "DELETE"]
NAMES = ["special", "blocked", "plain"]
NAMESPACES = [("ml", {}), ("team-a", {"team": "a"}), ("kube-system", {})]
USERS = [("alice", ["researchers"]), ("admin", ["researchers"]), ("bob", [])]


def _request(shape, operation, name, namespace, labels, user):
    group, version, resource, kind, subresource = shape
    obj = {"apiVersion": f"{group}/{version}" if group else version, "kind": kind,
           "metadata": {"name": name, "namespace": namespace,
                        "labels": {"tier": "prod"} if name == "plain" else {}},
           "spec": {"containers": [{"name": "c", "image": "cuda",
                                    "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    request = {
        "uid": "u", "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "subResource": subresource, "name": name, "namespace": namespace,
        "operation": operation, "userInfo": {"username": user[0], "groups": user[1]},
        "object": None if operation == "DELETE" else obj,
        "oldObject": obj if operation != "CREATE" else None,
    }
    namespace_object = {"metadata": {"name": namespace, "labels": labels}}
    return from_request(request, namespace_object=namespace_object, now=NOW)


def _outcomes(engine: Engine, review, *, explain: bool) -> list[tuple[str, str, str]]:
    results = engine.evaluate(review, explain=explain).results
    return [(r.policy, r.rule, str(r.outcome)) for r in results
            if not (explain and r.rule == "match")]


def test_the_cached_selection_gives_the_results_of_matching_every_policy():
    engine = engine_for(POLICIES)
    compared = 0
    for shape, operation, name, (namespace, labels), user in itertools.product(
            SHAPES, OPERATIONS, NAMES, NAMESPACES, USERS):
        review = _request(shape, operation, name, namespace, labels, user)
        assert _outcomes(engine, review, explain=False) == \
            _outcomes(engine, review, explain=True), (shape, operation, name, namespace, user)
        compared += 1
    assert compared == len(SHAPES) * 3 * 3 * 3 * 3
    # The grid did reach every policy (each applied to some request; a native one is named
    # policy/binding).
    reached = {policy.split("/")[0] for shape in SHAPES for operation in OPERATIONS for name in NAMES
               for policy, _, _ in _outcomes(engine, _request(
                   shape, operation, name, "ml", {}, USERS[0]), explain=False)}
    assert {"defaults", "pods-only", "every-subresource", "scale", "deletes", "object-selector",
            "listed", "subjects", "excepted", "named", "excluded-names", "apps"} <= reached


def test_resource_names_are_decided_per_request_not_per_shape():
    """Two requests of one shape that differ only by name: a ``resourceNames`` rule selects one."""
    engine = engine_for(POLICIES)
    special = _request(SHAPES[0], "CREATE", "special", "ml", {}, USERS[2])
    plain = _request(SHAPES[0], "CREATE", "plain", "ml", {}, USERS[2])
    special_policies = {p.split("/")[0] for p, _, _ in _outcomes(engine, special, explain=False)}
    plain_policies = {p.split("/")[0] for p, _, _ in _outcomes(engine, plain, explain=False)}
    assert "named" in special_policies and "named" not in plain_policies
    assert "excluded-names" in plain_policies and "excluded-names" not in special_policies


def test_every_part_of_a_match_beyond_its_rules_keeps_the_selection_from_deciding_alone():
    """A field added to :class:`Match` that :func:`matches` reads must also stop
    :func:`selects_by_rules_alone` (else the cached selection would skip it): every field but
    the three rule lists, set to a non-default value, makes it False."""
    import dataclasses

    from policies.policy.matching import selects_by_rules_alone
    from policies.policy.model import LabelSelector, Match, ResourceRule, Subject

    rules = (ResourceRule(),)
    assert selects_by_rules_alone(Match(rules))
    examples = {
        "namespace_selector": LabelSelector(match_labels={"team": "a"}),
        "object_selector": LabelSelector(match_labels={"tier": "prod"}),
        "namespaces": ("ml",), "exclude_namespaces": ("kube-system",),
        "subjects": (Subject("User", "alice"),), "exclude_subjects": (Subject("User", "bob"),),
        "namespaced": True,
    }
    others = {f.name for f in dataclasses.fields(Match)} - {
        "rules", "narrowing_rules", "exclude_rules"}
    assert others == set(examples), "a new Match field: add it to selects_by_rules_alone"
    for name, value in examples.items():
        assert not selects_by_rules_alone(Match(rules, **{name: value})), name


def test_a_request_no_policy_is_written_for_is_allowed_untouched_without_gpu_facts():
    # Only pods and workloads, and DELETE of anything: a ConfigMap create is selected by none,
    # and answered before any run state, GPU facts or authorizer session is built.
    engine = engine_for("---\n".join([
        gpu_policy("pods-only", {"match": {"resources": ["pods"]}, **VALIDATION}),
        gpu_policy("who", {"match": {"resources": ["pods"]}, "validations": [{
            "expression": "authorizer.group('').resource('pods').check('create').allowed()"}]}),
    ]))
    assert engine.uses_authorizer
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "c", "namespace": "ml"}, "data": {"k": "v"}}
    review = from_request({
        "uid": "u", "operation": "CREATE", "namespace": "ml", "object": config_map,
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "resource": {"group": "", "version": "v1", "resource": "configmaps"}}, now=NOW)
    verdict = engine.evaluate(review)
    assert (verdict.allowed, verdict.results, verdict.denials, verdict.warnings, verdict.patch,
            verdict.audit_annotations, verdict.facts) == (True, (), (), (), (), {}, None)
    assert verdict.final_object is config_map
    # The policies left out are the ones explain names, each as a skip of its match.
    explained = engine.evaluate(review, explain=True)
    assert {(r.policy, r.outcome) for r in explained.results} == {
        ("pods-only", "skip"), ("who", "skip")}


def test_a_kind_the_registry_does_not_model_is_matched_by_its_object_not_by_its_shape():
    """A GPUPolicy that leaves ``match.resources`` out judges custom kinds whose object holds a
    pod template: the first Trainer of a shape has none (no policy applies), the next one of the
    same shape does, and must be judged — the cached selection once left it out, allowing a
    GPU Trainer unseen once a template-less one had been seen first (admission and audit)."""
    from policies.vocabulary import EvaluationPoint

    engine = engine_for(gpu_policy("defaults", VALIDATION))

    def trainer(name: str, spec: dict) -> dict:
        return {"uid": name, "operation": "CREATE", "namespace": "ml", "name": name,
                "kind": {"group": "example.com", "version": "v1", "kind": "Trainer"},
                "resource": {"group": "example.com", "version": "v1", "resource": "trainers"},
                "object": {"apiVersion": "example.com/v1", "kind": "Trainer",
                           "metadata": {"name": name, "namespace": "ml"}, "spec": spec}}

    plain = from_request(trainer("plain", {"replicas": 1}), now=NOW)
    gpus = from_request(trainer("gpus", {"template": {"spec": {"containers": [
        {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}}),
        now=NOW)
    for point in (EvaluationPoint.ADMISSION, EvaluationPoint.AUDIT):
        assert engine.evaluate(plain, point=point).results == ()
        failed = [(r.policy, r.message) for r in engine.evaluate(gpus, point=point).results
                  if r.outcome == "fail"]
        assert failed == [("defaults", "at most 1 GPU")], point
        assert engine.evaluate(plain, point=point).results == ()
