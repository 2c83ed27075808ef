"""The library's gpu-requesters through CEL ``authorizer`` at the webhook, for real: kube-apiserver
(``--authorization-mode=RBAC``) calls ``gpuguard serve``, whose authorizer checks are real
SubjectAccessReviews answered by that API server's RBAC. A user bound to the H100 role in namespace
ml may create an H100 pod there; another may not, with the policy's message. The same RBAC
objects read back from the cluster answer ``gpuguard check --snapshot`` alike, so "who may
request H100s" is known before enforcing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.webhook_process import (
    REPO,
    GpuguardServer,
    generate_certs,
    gpuguard,
    register_webhooks,
    unregister_webhooks,
    wait_webhook_active,
)

POLICY = REPO / "policies" / "library" / "gpu-requesters.yaml"
ROLES = REPO / "tests" / "data" / "rbac" / "gpu-roles.yaml"
POD = REPO / "tests" / "data" / "rbac" / "h100-pod.yaml"
DENIED_BY = 'admission webhook "pods.validate.gpuguard.io" denied the request: '
ERIN = ("--as", "erin", "--as-group", "ml-researchers", "--as-group", "system:authenticated")
MALLORY = ("--as", "mallory", "--as-group", "system:authenticated")
# RBAC lets every authenticated user create pods in ml: only gpu-requesters tells them apart.
POD_CREATORS = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
     "metadata": {"name": "pod-creator", "namespace": "ml"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "pod-creators", "namespace": "ml"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                 "name": "pod-creator"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                   "name": "system:authenticated"}]},
]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    """Namespace ml, the GPU roles of tests/data/rbac and the pod creators."""
    if control_plane.kubectl("get", "namespace", "ml").returncode != 0:
        created = control_plane.kubectl("create", "namespace", "ml")
        assert created.returncode == 0, created.stderr
    for args in (("-f", str(ROLES)), ("-f", "-")):
        applied = control_plane.kubectl("apply", *args, input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": POD_CREATORS}))
        assert applied.returncode == 0, applied.stderr
    return control_plane


@pytest.fixture(scope="module")
def webhook(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GpuguardServer]:
    work = tmp_path_factory.mktemp("authorizer-webhook")
    server = GpuguardServer(generate_certs(work / "certs"), work / "serve.log",
                            kubeconfig=cluster.kubeconfig,
                            args=["--policies", str(POLICY), "--quota-namespace", "ml"])
    try:
        server.wait_ready()
        register_webhooks(cluster, server, work)
        wait_webhook_active(cluster, server, "ml")
        yield server
    finally:
        unregister_webhooks(cluster)
        server.stop()


def _pod(name: str) -> str:
    pod = yaml.safe_load(POD.read_text())
    pod["metadata"]["name"] = name
    return json.dumps(pod)


def test_a_user_bound_to_the_h100_role_may_create_an_h100_pod(cluster, webhook) -> None:
    created = cluster.kubectl(*ERIN, "create", "-f", "-", input=_pod("erin-train"))
    assert created.returncode == 0, created.stderr + webhook.logs()
    assert any(d.get("name") == "erin-train" and d["decision"] == "allowed"
               for d in webhook.decisions())


def test_another_user_may_not(cluster, webhook) -> None:
    denied = cluster.kubectl(*MALLORY, "create", "-f", "-", input=_pod("mallory-train"))
    assert denied.returncode == 1
    assert (f"{DENIED_BY}gpu-requesters: user 'mallory' may not use GPU product "
            "NVIDIA-H100-80GB-HBM3 in namespace 'ml': RBAC allows no 'use' of gpus.gpuguard.io "
            "'NVIDIA-H100-80GB-HBM3' there.") in denied.stderr, denied.stderr + webhook.logs()
    assert cluster.kubectl("get", "pod", "-n", "ml", "mallory-train").returncode == 1


def test_check_on_the_clusters_rbac_gives_the_same_answers(cluster, tmp_path: Path) -> None:
    exported = cluster.kubectl("get", "clusterroles,clusterrolebindings,roles,rolebindings",
                               "-A", "-o", "yaml")
    assert exported.returncode == 0, exported.stderr
    snapshot = tmp_path / "rbac.yaml"
    snapshot.write_text(exported.stdout)
    verdicts = {}
    for user, groups in (("erin", ["ml-researchers", "system:authenticated"]),
                         ("mallory", ["system:authenticated"])):
        done = gpuguard("check", "-f", str(POD), "--policies", str(POLICY), "--user", user,
                        *(a for g in groups for a in ("--group", g)), "--snapshot",
                        str(snapshot), "-o", "json")
        assert done.returncode in (0, 1), done.stderr
        verdicts[user] = json.loads(done.stdout)["results"][0]["allowed"]
    assert verdicts == {"erin": True, "mallory": False}
