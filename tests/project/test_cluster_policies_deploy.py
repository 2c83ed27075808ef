"""deploy/components/cluster-policies: what it adds to an overlay (issue 17 item 4).

Rendered with ``kubectl kustomize`` over deploy/base (skipped when kubectl is not installed, as
tests/project/test_deploy.py does) and validated against the Kubernetes schemas; then the grants:
the Lease only, and the get / update (PUT, kube/lease.py) of it only by name. The webhook's reading of the CRDs and
writing of their status only is deploy/crds/rbac.yaml, checked against a real API server in
tests/controlplane/test_cluster_policies_live.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT
from tests.project.test_deploy import KUBE_VERSION, NAMESPACE, _kustomize, needs_kubectl

DEPLOY = ROOT / "deploy"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = tmp_path_factory.mktemp("overlay")
    base = os.path.relpath(DEPLOY / "base", overlay)
    component = os.path.relpath(DEPLOY / "components" / "cluster-policies", overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{component}]\n")
    return _kustomize(Path(overlay))


@needs_kubectl
def test_the_component_validates_against_kubernetes_schemas(rendered) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in rendered:
        if obj["kind"] in ("Role", "RoleBinding", "Deployment"):
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@needs_kubectl
def test_the_webhook_serves_the_cluster_policies_with_its_pod_name(rendered) -> None:
    (deployment,) = [o for o in rendered if o["kind"] == "Deployment"
                     and o["metadata"]["name"] == "gpuguard-webhook"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"].count("--cluster-policies") == 1
    assert "--policies=/etc/gpuguard/policies" in container["args"]  # the files keep serving
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in \
        container["env"]


@needs_kubectl
def test_the_lease_role_grants_the_status_lease_only(rendered) -> None:
    (role,) = [o for o in rendered if o["kind"] == "Role"
               and o["metadata"]["name"] == "gpuguard-policy-status"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["gpuguard-policy-status"], "verbs": ["get", "update"]}]
    (binding,) = [o for o in rendered if o["kind"] == "RoleBinding"
                  and o["metadata"]["name"] == "gpuguard-policy-status"]
    assert binding["roleRef"]["name"] == "gpuguard-policy-status"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-webhook",
                                    "namespace": NAMESPACE}]
