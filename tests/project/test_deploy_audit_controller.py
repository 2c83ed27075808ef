"""deploy/components/audit-controller and deploy/components/monitoring: render with the base,
validate, and grant the controller exactly what it uses.

The controller lists and watches what gpuguard/audit_watch.py ``WATCHED`` names — no more, no
less — writes PolicyReports as the CronJob does, and holds one Lease; its pods are restricted
like every gpuguard pod (tests/project/test_deploy.py's checks, reused), and the CronJob it
replaces is suspended so the two never write the same reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuguard.audit_watch import WATCHED
from tests.project.test_deploy import (
    DEPLOY,
    KUBE_VERSION,
    NAMESPACE,
    _assert_restricted,
    _kustomize,
    needs_kubectl,
)

CONTROLLER_RULES = {
    **{(r.group, r.plural): {"list", "watch"} for r in WATCHED},
    ("wgpolicyk8s.io", "policyreports"): {"get", "create", "update", "list", "delete"},
    ("wgpolicyk8s.io", "clusterpolicyreports"): {"get", "create", "update"},
}


def _render(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    base = os.path.relpath(DEPLOY / "base", tmp_path)
    parts = [os.path.relpath(DEPLOY / "components" / c, tmp_path) for c in components]
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{', '.join(parts)}]\n")
    return _kustomize(tmp_path)


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


@needs_kubectl
def test_controller_component_renders_and_validates(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate.utils")
    objects = _render(tmp_path, "audit-controller")
    mine = [o for o in objects if "audit-controller" in o["metadata"]["name"]]
    assert {(o["kind"], o["metadata"]["name"]) for o in mine} == {
        ("ServiceAccount", "gpuguard-audit-controller"),
        ("ClusterRole", "gpuguard-audit-controller"),
        ("ClusterRoleBinding", "gpuguard-audit-controller"),
        ("Role", "gpuguard-audit-controller-lease"),
        ("RoleBinding", "gpuguard-audit-controller-lease"),
        ("Deployment", "gpuguard-audit-controller"), ("Service", "gpuguard-audit-controller"),
        ("NetworkPolicy", "gpuguard-audit-controller")}
    for obj in mine:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE
    assert _one(objects, "CronJob", "gpuguard-audit")["spec"]["suspend"] is True


@needs_kubectl
def test_controller_rbac_is_exactly_what_it_uses(tmp_path: Path) -> None:
    objects = _render(tmp_path, "audit-controller")
    assert _grants(_one(objects, "ClusterRole", "gpuguard-audit-controller")) == CONTROLLER_RULES
    lease = _one(objects, "Role", "gpuguard-audit-controller-lease")
    named = [r for r in lease["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["gpuguard-audit"], "verbs": ["get", "update"]}]
    assert _grants(lease) == {("coordination.k8s.io", "leases"): {"create", "get", "update"}}
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        name = "gpuguard-audit-controller" + ("-lease" if binding == "RoleBinding" else "")
        subjects = _one(objects, binding, name)["subjects"]
        assert subjects == [{"kind": "ServiceAccount", "name": "gpuguard-audit-controller",
                             "namespace": NAMESPACE}]


@needs_kubectl
def test_controller_deployment(tmp_path: Path) -> None:
    objects = _render(tmp_path, "audit-controller")
    deployment = _one(objects, "Deployment", "gpuguard-audit-controller")
    pod = deployment["spec"]["template"]["spec"]
    _assert_restricted(pod, "audit controller")
    assert pod["serviceAccountName"] == "gpuguard-audit-controller"
    assert deployment["spec"]["replicas"] == 2  # one active through the Lease, one standby
    args = pod["containers"][0]["args"]
    assert args[:4] == ["audit", "--cluster", "--watch", "--write-reports"]
    lease = next(a for a in args if a.startswith("--lease="))
    assert lease == f"--lease={NAMESPACE}/gpuguard-audit"
    lease_role = _one(objects, "Role", "gpuguard-audit-controller-lease")
    assert lease_role["rules"][1]["resourceNames"] == [lease.rpartition("/")[2]]
    port = pod["containers"][0]["ports"][0]
    assert "--metrics-listen=0.0.0.0:" + str(port["containerPort"]) in args
    service = _one(objects, "Service", "gpuguard-audit-controller")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    policy = _one(objects, "NetworkPolicy", "gpuguard-audit-controller")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["ingress"] == [{"ports": [{"port": port["containerPort"],
                                                     "protocol": "TCP"}]}]


@needs_kubectl
def test_monitoring_component_renders(tmp_path: Path) -> None:
    objects = _render(tmp_path, "audit-controller", "monitoring")
    monitor = _one(objects, "ServiceMonitor", "gpuguard-audit-controller")
    service = _one(objects, "Service", "gpuguard-audit-controller")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    rule = _one(objects, "PrometheusRule", "gpuguard")
    assert rule["metadata"]["namespace"] == NAMESPACE
    dashboard = _one(objects, "ConfigMap", "gpuguard-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # A component's generated ConfigMap gets no namespace from the base: it names its own.
    assert dashboard["metadata"]["namespace"] == NAMESPACE
    assert json.loads(dashboard["data"]["gpuguard.json"])["uid"] == "gpuguard-gpu-governance"
