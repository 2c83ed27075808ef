"""The local RBAC authorizer (policies/rbac.py) against the rules of the Kubernetes RBAC docs
(https://kubernetes.io/docs/reference/access-authn-authz/rbac/): each case is an example of the
docs' Role / ClusterRole / binding sections and the decision the API server's RBAC authorizer
gives for it."""

from __future__ import annotations

from typing import Any

import pytest

from policies.authorization import Attributes, Subject, Unavailable, Verdict
from policies.rbac import NO_RBAC_OBJECTS, RBACAuthorizer, offline_authorizer

V1 = "rbac.authorization.k8s.io/v1"


def role(name: str, namespace: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "Role", "metadata": {"name": name, "namespace": namespace},
            "rules": list(rules)}


def cluster_role(name: str, *rules: dict[str, Any], labels: dict[str, str] | None = None,
                 aggregate: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": V1, "kind": "ClusterRole",
                           "metadata": {"name": name, "labels": labels or {}},
                           "rules": list(rules)}
    if aggregate is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": aggregate}
    return obj


def binding(name: str, namespace: str | None, role_kind: str, role_name: str,
            *subjects: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": V1, "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": meta, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                          "kind": role_kind, "name": role_name},
            "subjects": list(subjects)}


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def sa(name: str, namespace: str = "") -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": name, **({"namespace": namespace} if namespace
                                                         else {})}


POD_READER = role("pod-reader", "default",
                  {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]})
SECRET_READER = cluster_role("secret-reader", {"apiGroups": [""], "resources": ["secrets"],
                                               "verbs": ["get", "watch", "list"]})
LOG_READER = role("pod-and-pod-logs-reader", "default",
                  {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]})
CONFIGMAP_UPDATER = role("configmap-updater", "default",
                         {"apiGroups": [""], "resources": ["configmaps"],
                          "resourceNames": ["my-configmap"], "verbs": ["update", "get"]})
HEALTHZ = cluster_role("healthz", {"nonResourceURLs": ["/healthz", "/healthz/*"],
                                   "verbs": ["get", "post"]})
SCALER = cluster_role("scaler", {"apiGroups": ["*"], "resources": ["*/scale"],
                                 "verbs": ["update"]})
GPU_USER = cluster_role("gpu-h100-user", {"apiGroups": ["gpuguard.io"], "resources": ["gpus"],
                                          "resourceNames": ["NVIDIA-H100-80GB-HBM3"],
                                          "verbs": ["use"]})
MONITORING = cluster_role("monitoring", aggregate=[{"matchLabels": {
    "rbac.example.com/aggregate-to-monitoring": "true"}}])
MONITORING_ENDPOINTS = cluster_role(
    "monitoring-endpoints", {"apiGroups": [""], "resources": ["services", "endpointslices",
                                                              "pods"], "verbs": ["get", "list"]},
    labels={"rbac.example.com/aggregate-to-monitoring": "true"})
ALL = cluster_role("everything", {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})

OBJECTS = [
    POD_READER, SECRET_READER, LOG_READER, CONFIGMAP_UPDATER, HEALTHZ, SCALER, GPU_USER,
    MONITORING, MONITORING_ENDPOINTS, ALL,
    binding("read-pods", "default", "Role", "pod-reader", user("jane")),
    binding("read-secrets", "development", "ClusterRole", "secret-reader", user("dave")),
    binding("read-secrets-global", None, "ClusterRole", "secret-reader", group("manager")),
    binding("logs", "default", "Role", "pod-and-pod-logs-reader", sa("log-shipper")),
    binding("cm", "default", "Role", "configmap-updater", group("system:serviceaccounts:qa")),
    binding("healthz", None, "ClusterRole", "healthz", group("system:authenticated")),
    binding("scaler", None, "ClusterRole", "scaler", sa("hpa", "kube-system")),
    binding("h100", None, "ClusterRole", "gpu-h100-user", group("gpu-h100")),
    binding("monitoring", None, "ClusterRole", "monitoring", user("prometheus")),
    binding("all-sa", "ci", "ClusterRole", "everything", group("system:serviceaccounts")),
    binding("dangling", "default", "Role", "no-such-role", user("eve")),
]
AUTHORIZER = RBACAuthorizer(OBJECTS)


def res(subject: Subject, verb: str, resource: str, *, group_: str = "", namespace: str = "",
        name: str = "", subresource: str = "") -> Attributes:
    return Attributes(subject, verb, resource_request=True, api_group=group_,
                      resource=resource, subresource=subresource, namespace=namespace,
                      name=name)


JANE, DAVE = Subject("jane"), Subject("dave")
MANAGER = Subject("mia", groups=("manager", "system:authenticated"))
SHIPPER = Subject.service_account("default", "log-shipper")
QA = Subject.service_account("qa", "tester")
HPA = Subject.service_account("kube-system", "hpa")
ALICE = Subject("alice", groups=("gpu-h100", "system:authenticated"))

CASES = [
    # Role: namespaced, only in its own namespace
    ("role in its namespace", res(JANE, "get", "pods", namespace="default"), True),
    ("role: other verb", res(JANE, "delete", "pods", namespace="default"), False),
    ("role: other namespace", res(JANE, "get", "pods", namespace="kube-system"), False),
    ("role: cluster scope", res(JANE, "list", "pods"), False),
    ("role: other group", res(JANE, "get", "pods", group_="metrics.k8s.io",
                              namespace="default"), False),
    # RoleBinding to a ClusterRole grants it in the binding's namespace only
    ("rolebinding of clusterrole", res(DAVE, "get", "secrets", namespace="development"), True),
    ("rolebinding of clusterrole elsewhere", res(DAVE, "get", "secrets", namespace="default"),
     False),
    # ClusterRoleBinding: every namespace and the cluster scope
    ("clusterrolebinding by group", res(MANAGER, "list", "secrets", namespace="any"), True),
    ("clusterrolebinding cluster scope", res(MANAGER, "list", "secrets"), True),
    # subresources: pods/log is named; pods does not cover it
    ("subresource named", res(SHIPPER, "get", "pods", namespace="default", subresource="log"),
     True),
    ("subresource not named", res(JANE, "get", "pods", namespace="default", subresource="log"),
     False),
    ("*/scale matches any resource's scale", res(HPA, "update", "deployments", group_="apps",
                                                 namespace="x", subresource="scale"), True),
    ("*/scale is not the resource", res(HPA, "update", "deployments", group_="apps",
                                        namespace="x"), False),
    # resourceNames
    ("resourceName listed", res(QA, "update", "configmaps", namespace="default",
                                name="my-configmap"), True),
    ("resourceName other", res(QA, "update", "configmaps", namespace="default", name="other"),
     False),
    ("resourceName with no name (list)", res(QA, "get", "configmaps", namespace="default"),
     False),
    ("virtual resource with product name", res(ALICE, "use", "gpus", group_="gpuguard.io",
                                               namespace="ml", name="NVIDIA-H100-80GB-HBM3"),
     True),
    ("virtual resource other product", res(ALICE, "use", "gpus", group_="gpuguard.io",
                                           namespace="ml", name="NVIDIA-A100-SXM4-80GB"), False),
    ("group not held", res(JANE, "use", "gpus", group_="gpuguard.io",
                           name="NVIDIA-H100-80GB-HBM3"), False),
    # service-account subjects: namespace defaults to the RoleBinding's
    ("sa subject defaults to binding namespace", res(
        Subject.service_account("other", "log-shipper"), "get", "pods", namespace="default"),
     False),
    ("sa group system:serviceaccounts", res(Subject.service_account("ci", "builder"), "create",
                                            "pods", namespace="ci"), True),
    ("system:serviceaccounts group, other namespace", res(
        Subject.service_account("ci", "builder"), "create", "pods", namespace="prod"), False),
    # aggregated ClusterRole
    ("aggregated rules", res(Subject("prometheus"), "list", "endpointslices", namespace="a"),
     True),
    ("aggregated: only what is aggregated", res(Subject("prometheus"), "delete", "pods",
                                                namespace="a"), False),
]


@pytest.mark.parametrize(("name", "attributes", "allowed"), CASES, ids=[c[0] for c in CASES])
def test_rbac_decision(name: str, attributes: Attributes, allowed: bool) -> None:
    decision = AUTHORIZER.authorize(attributes)
    assert decision.allowed is allowed
    assert decision.verdict == (Verdict.ALLOW if allowed else Verdict.NO_OPINION)
    assert not decision.errored


@pytest.mark.parametrize(("path", "verb", "allowed"), [
    ("/healthz", "get", True), ("/healthz/etcd", "get", True), ("/healthzz", "get", False),
    ("/metrics", "get", False), ("/healthz", "delete", False)])
def test_non_resource_urls(path: str, verb: str, allowed: bool) -> None:
    attributes = Attributes(MANAGER, verb, resource_request=False, path=path)
    assert AUTHORIZER.authorize(attributes).allowed is allowed


def test_allowed_reason_names_the_binding_as_the_api_server() -> None:
    assert AUTHORIZER.authorize(res(JANE, "get", "pods", namespace="default")).reason == (
        'RBAC: allowed by RoleBinding "read-pods/default" of Role "pod-reader" to User "jane"')
    assert AUTHORIZER.authorize(res(HPA, "update", "deployments", group_="apps",
                                    subresource="scale")).reason == (
        'RBAC: allowed by ClusterRoleBinding "scaler" of ClusterRole "scaler" to '
        'ServiceAccount "hpa/kube-system"')


def test_missing_role_is_in_the_reason_not_an_error() -> None:
    decision = AUTHORIZER.authorize(res(Subject("eve"), "get", "pods", namespace="default"))
    assert (decision.verdict, decision.errored) == (Verdict.NO_OPINION, False)
    assert decision.reason == 'RBAC: role.rbac.authorization.k8s.io "no-such-role" not found'


def test_nested_aggregation() -> None:
    objects = [
        cluster_role("top", aggregate=[{"matchLabels": {"to-top": "true"}}]),
        cluster_role("middle", aggregate=[{"matchExpressions": [
            {"key": "to-middle", "operator": "Exists"}]}], labels={"to-top": "true"}),
        cluster_role("leaf", {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                     labels={"to-middle": "x"}),
        binding("b", None, "ClusterRole", "top", user("u")),
    ]
    assert RBACAuthorizer(objects).authorize(res(Subject("u"), "get", "nodes")).allowed


def test_no_rbac_objects_is_said_and_never_allows() -> None:
    authorizer = offline_authorizer([{"apiVersion": "v1", "kind": "Pod", "metadata": {}}])
    assert isinstance(authorizer, Unavailable)
    decision = authorizer.authorize(res(ALICE, "use", "gpus", group_="gpuguard.io"))
    assert not decision.allowed and decision.errored
    assert decision.error.startswith(NO_RBAC_OBJECTS)
    assert "use gpus.gpuguard.io" in decision.error
