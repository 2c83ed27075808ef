"""The control plane fixture itself: what the other tests of the tier rely on.

Each test checks one thing the fixture promises, through the real API server: the version and
the admission APIs it serves, that RBAC and the service-account key pair work, that the native
admission plugins run (a ValidatingAdmissionPolicy denies, a MutatingAdmissionPolicy mutates), and
that teardown leaves no process and no directory behind.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.controlplane.cluster import ControlPlane, wait_until


def test_serves_kubernetes_1_37_with_native_admission_policy_apis(control_plane: ControlPlane
                                                                   ) -> None:
    version = control_plane.kubectl("version", "-o", "json")
    assert version.returncode == 0, version.stderr
    server = json.loads(version.stdout)["serverVersion"]
    assert server["gitVersion"].startswith("v1.37."), server
    resources = control_plane.kubectl("api-resources", "--api-group=admissionregistration.k8s.io",
                                      "-o", "name")
    assert resources.returncode == 0, resources.stderr
    served = set(resources.stdout.split())
    assert {"validatingadmissionpolicies.admissionregistration.k8s.io",
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "mutatingadmissionpolicies.admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings.admissionregistration.k8s.io",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            "mutatingwebhookconfigurations.admissionregistration.k8s.io"} <= served
    # MutatingAdmissionPolicy at admissionregistration.k8s.io/v1 (GA in 1.36), not only a beta
    status, body = control_plane.get_raw("/apis/admissionregistration.k8s.io/v1")
    assert status == 200, body
    names = {r["name"] for r in json.loads(body)["resources"]}
    assert {"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} <= names


def test_rbac_denies_a_service_account_its_signed_token_authenticates(
        control_plane: ControlPlane, make_namespace, tmp_path: Path) -> None:
    namespace = make_namespace("rbac")
    created = control_plane.kubectl("-n", namespace, "create", "serviceaccount", "reader")
    assert created.returncode == 0, created.stderr
    token = control_plane.kubectl("-n", namespace, "create", "token", "reader")
    assert token.returncode == 0, token.stderr  # signed with --service-account-signing-key-file
    kubeconfig = tmp_path / "reader.kubeconfig"  # the token only: no admin client certificate
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "reader",
        "clusters": [{"name": "c", "cluster": {
            "server": control_plane.server,
            "certificate-authority": str(control_plane.pki.ca_cert)}}],
        "users": [{"name": "reader", "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "reader", "context": {"cluster": "c", "user": "reader"}}]}))
    as_reader = ("--kubeconfig", str(kubeconfig))  # the last --kubeconfig wins
    who = control_plane.kubectl(*as_reader, "auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr  # ... and verified with --service-account-key-file
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == \
        f"system:serviceaccount:{namespace}:reader"
    denied = control_plane.kubectl(*as_reader, "-n", namespace, "get", "pods")
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    # a Role of its own: the aggregated ClusterRoles (view, edit) get their rules from
    # kube-controller-manager, which does not run here
    role = control_plane.kubectl("-n", namespace, "create", "role", "pod-reader",
                                 "--verb=get,list", "--resource=pods")
    assert role.returncode == 0, role.stderr
    granted = control_plane.kubectl("-n", namespace, "create", "rolebinding", "reader",
                                    "--role=pod-reader", f"--serviceaccount={namespace}:reader")
    assert granted.returncode == 0, granted.stderr
    wait_until(lambda: control_plane.kubectl(*as_reader, "-n", namespace, "get", "pods")
               .returncode == 0, "RBAC to allow the bound service account",
               logs=control_plane.logs)


def test_native_validating_and_mutating_admission_policies_run(control_plane: ControlPlane,
                                                                make_namespace) -> None:
    namespace = make_namespace("native", labels={"native-policy-test": "on"})
    policies = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "fixture-deny-unlabelled"},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": ["configmaps"]}]},
                  "validations": [{"expression": "'owner' in object.metadata.?labels"
                                                 ".orValue({})",
                                   "message": "configmaps need an owner label"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": "fixture-deny-unlabelled"},
         "spec": {"policyName": "fixture-deny-unlabelled", "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {
                      "matchLabels": {"native-policy-test": "on"}}}}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": "fixture-stamp"},
         "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": ["configmaps"]}]},
                  "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                      "expression": "Object{data: {'stamped': 'by-map'}}"}}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": "fixture-stamp"},
         "spec": {"policyName": "fixture-stamp", "matchResources": {"namespaceSelector": {
             "matchLabels": {"native-policy-test": "on"}}}}},
    ]
    applied = control_plane.kubectl("apply", "-f", "-",
                                    input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                      "items": policies}))
    assert applied.returncode == 0, applied.stderr
    try:
        # the policies reach the admission plugins through informers: wait for the denial
        def denied() -> str:
            done = control_plane.kubectl("-n", namespace, "create", "configmap", "probe",
                                         "--dry-run=server")
            return done.stderr if done.returncode != 0 else ""
        message = wait_until(denied, "the ValidatingAdmissionPolicy to deny",
                             logs=control_plane.logs)
        assert "configmaps need an owner label" in message
        assert "fixture-deny-unlabelled" in message
        manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "owned", "namespace": namespace,
                                 "labels": {"owner": "me"}}, "data": {"a": "1"}}

        def stamped() -> dict | None:
            done = control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                         input=json.dumps(manifest))
            data = json.loads(done.stdout)["data"] if done.returncode == 0 else {}
            return data if data.get("stamped") == "by-map" else None
        assert wait_until(stamped, "the MutatingAdmissionPolicy to mutate",
                          logs=control_plane.logs) == {"a": "1", "stamped": "by-map"}
    finally:
        control_plane.kubectl("delete", "-f", "-", "--ignore-not-found",
                              input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                "items": policies}))


def test_teardown_kills_the_processes_and_removes_the_directory(control_plane_bin: Path) -> None:
    cluster = ControlPlane(control_plane_bin)
    with cluster:
        status, _ = cluster.get_raw("/readyz")
        assert status == 200
        pids = [p.popen.pid for p in (cluster._etcd, cluster._apiserver) if p is not None]
        workdir = cluster.workdir
        assert len(pids) == 2 and workdir.is_dir()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    assert not workdir.exists()
    assert cluster.get_raw("/readyz")[0] == 0  # nothing answers on the port any more


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_children_get_no_proxy(monkeypatch) -> None:
    # kube-apiserver honours HTTPS_PROXY for webhook calls: a proxy would break loopback URLs
    from tests.controlplane.cluster import child_environment

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    environ = child_environment()
    assert "HTTPS_PROXY" not in environ and environ["NO_PROXY"] == "127.0.0.1,localhost"
