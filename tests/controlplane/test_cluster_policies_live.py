"""``gpuguard serve --cluster-policies`` on a real kube-apiserver (issue 17 items 2, 4 and 5).

One ``gpuguard serve`` (a policy file that passes everything, plus the cluster's gpuguard.io
objects) is registered through ``deploy/base/webhooks.yaml`` like the other end-to-end tests.
GPUPolicy and GPUPolicyException objects are applied with kubectl; each step waits, with a
deadline, for what a user sees — the API server's answer to a server-side dry-run of a GPU pod,
the object's status conditions — never for a time.

Policies of other tests may be in the cluster too (test_crds_live applies the library as
objects): every assertion names this module's own policy message, not "allowed".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.controlplane.cluster import ControlPlane, wait_until
from tests.controlplane.webhook_process import (
    REPO,
    GpuguardServer,
    generate_certs,
    register_webhooks,
    unregister_webhooks,
    wait_webhook_active,
)

LEASE_RBAC = REPO / "deploy" / "components" / "cluster-policies" / "lease-rbac.yaml"
WEBHOOK_SA = "system:serviceaccount:gpuguard-system:gpuguard-webhook"
PASS_FILE = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: e2e-files-pass
spec:
  validations:
  - expression: "true"
"""


def no_gpus(name: str, namespaces: list[str], expression: str = "gpu.count <= 0",
            **spec: Any) -> dict[str, Any]:
    """A GPUPolicy denying GPU pods in ``namespaces``, with a message naming ``name``."""
    return {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
            "metadata": {"name": name},
            "spec": {"match": {"namespaces": namespaces}, "validationActions": ["Deny"],
                     "validations": [{"expression": expression,
                                      "message": f"{name}: no GPUs here"}], **spec}}


def gpu_pod(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}}


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with deploy/crds and the component's Lease RBAC applied."""
    control_plane.kubectl("create", "namespace", "gpuguard-system")  # may exist already
    # Library objects another module applied may mutate runtimeClassName: nvidia, which the
    # RuntimeClass admission plugin refuses unless it exists (test_admission_e2e makes it too).
    applied = control_plane.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
         "handler": "nvidia"}))
    assert applied.returncode == 0, applied.stderr
    control_plane.apply_gpuguard_crds()
    applied = control_plane.kubectl("apply", "-f", str(LEASE_RBAC))
    assert applied.returncode == 0, applied.stderr
    return control_plane


@pytest.fixture(scope="module")
def webhook(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[GpuguardServer]:
    work = tmp_path_factory.mktemp("cluster-policies")
    (work / "policies.yaml").write_text(PASS_FILE)
    # A long file check interval: a change of an object must be applied by the watch's wake-up.
    server = GpuguardServer(generate_certs(work / "certs"), work / "serve.log",
                            kubeconfig=cluster.kubeconfig,
                            args=("--policies", str(work / "policies.yaml"),
                                  "--cluster-policies", "--policy-reload-s", "600",
                                  "--status-lease-namespace", "gpuguard-system"))
    try:
        server.wait_ready()
        register_webhooks(cluster, server, work)
        yield server
    finally:
        unregister_webhooks(cluster)
        server.stop()


def apply(cluster: ControlPlane, document: dict[str, Any]) -> None:
    done = cluster.kubectl("apply", "-f", "-", input=json.dumps(document))
    assert done.returncode == 0, done.stderr


def denial(cluster: ControlPlane, namespace: str, pod: str = "probe") -> str:
    """The API server's answer to a dry-run of a GPU pod: "" when admitted, else the error."""
    done = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                           input=json.dumps(gpu_pod(pod, namespace)))
    return "" if done.returncode == 0 else done.stderr


def status_of(cluster: ControlPlane, *target: str) -> dict[str, Any]:
    done = cluster.kubectl("get", *target, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == kind), {})


def with_condition(cluster: ControlPlane, kind: str, status: str, *target: str,
                   ) -> dict[str, Any] | None:
    """The object ``target`` names when its condition ``kind`` has ``status``, else None."""
    obj = status_of(cluster, *target)
    return obj if condition(obj, kind).get("status") == status else None


def wait_for(what: str, check: Callable[[], Any], server: GpuguardServer,
             cluster: ControlPlane) -> Any:
    return wait_until(check, what, deadline_s=30, interval_s=0.1,
                      logs=lambda: f"{server.logs()}\n{cluster.logs()}")


def test_apply_break_and_delete_a_gpupolicy(webhook: GpuguardServer, cluster: ControlPlane,
                                           make_namespace: Callable[..., str]) -> None:
    namespace = make_namespace("crd-policy")
    wait_webhook_active(cluster, webhook, namespace)
    message = "e2e-crd-no-gpus: no GPUs here"
    assert message not in denial(cluster, namespace)
    generation_before = webhook.get("/readyz")
    apply(cluster, no_gpus("e2e-crd-no-gpus", [namespace]))
    wait_for("the applied GPUPolicy to be enforced",
             lambda: message in denial(cluster, namespace), webhook, cluster)
    served = wait_for("Ready=True in its status", lambda: with_condition(
        cluster, "Ready", "True", "gpupolicy", "e2e-crd-no-gpus"), webhook, cluster)
    assert served["status"]["observedGeneration"] == 1
    assert condition(served, "Accepted")["status"] == "True"
    listed = cluster.kubectl("get", "gpupolicy", "e2e-crd-no-gpus")
    assert listed.stdout.splitlines()[1].split()[3] == "True", listed.stdout  # READY column
    readyz = json.loads(webhook.get("/readyz")[1])["checks"]["policies"]
    assert readyz["generation"] > json.loads(generation_before[1])["checks"]["policies"][
        "generation"]
    lease = status_of(cluster, "-n", "gpuguard-system", "lease", "gpuguard-policy-status")
    assert lease["spec"]["holderIdentity"].endswith(f"/{webhook.process.popen.pid}"), lease

    # Broken: the CRD's schema accepts it (a string), lint refuses it (CEL does not compile).
    apply(cluster, no_gpus("e2e-crd-no-gpus", [namespace], expression="gpu.count <="))
    refused = wait_for("Accepted=False for generation 2", lambda: with_condition(
        cluster, "Accepted", "False", "gpupolicy", "e2e-crd-no-gpus"), webhook, cluster)
    accepted = condition(refused, "Accepted")
    assert accepted["observedGeneration"] == 2 and refused["status"]["observedGeneration"] == 2
    assert accepted["message"].startswith("spec.validations[0].expression: "), accepted
    ready = condition(refused, "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == \
        ("True", "ServingPreviousGeneration", 1)
    assert message in denial(cluster, namespace)  # the last good version is still enforced
    readyz = json.loads(webhook.get("/readyz")[1])["checks"]["policies"]
    assert any("cluster:GPUPolicy/e2e-crd-no-gpus" in line and
               "spec.validations[0].expression" in line for line in readyz["rejectedUpdate"])

    deleted = cluster.kubectl("delete", "gpupolicy", "e2e-crd-no-gpus")
    assert deleted.returncode == 0, deleted.stderr
    wait_for("the deleted GPUPolicy to be gone",
             lambda: message not in denial(cluster, namespace), webhook, cluster)


def test_status_is_written_once_not_at_every_check(webhook: GpuguardServer,
                                                   cluster: ControlPlane,
                                                   make_namespace: Callable[..., str]) -> None:
    namespace = make_namespace("crd-storm")
    apply(cluster, no_gpus("e2e-crd-steady", [namespace]))
    steady = wait_for("Ready=True", lambda: with_condition(
        cluster, "Ready", "True", "gpupolicy", "e2e-crd-steady"), webhook, cluster)
    # Three more changes of other objects: each wakes a check, and each check publishes.
    for index in range(3):
        name = f"e2e-crd-other-{index}"
        apply(cluster, no_gpus(name, [namespace]))
        wait_for(f"{name} Ready", lambda n=name: condition(status_of(
            cluster, "gpupolicy", n), "Ready").get("status") == "True", webhook, cluster)
    again = status_of(cluster, "gpupolicy", "e2e-crd-steady")
    assert again["metadata"]["resourceVersion"] == steady["metadata"]["resourceVersion"]
    for index in range(3):
        cluster.kubectl("delete", "gpupolicy", f"e2e-crd-other-{index}")
    cluster.kubectl("delete", "gpupolicy", "e2e-crd-steady")


def test_an_exception_exempts_its_own_namespace_only(webhook: GpuguardServer,
                                                     cluster: ControlPlane,
                                                     make_namespace: Callable[..., str]) -> None:
    team_a, team_b = make_namespace("crd-team-a"), make_namespace("crd-team-b")
    wait_webhook_active(cluster, webhook, team_a)
    message = "e2e-crd-teams: no GPUs here"
    apply(cluster, no_gpus("e2e-crd-teams", [team_a, team_b]))
    wait_for("the GPUPolicy enforced in both namespaces",
             lambda: message in denial(cluster, team_a) and message in denial(cluster, team_b),
             webhook, cluster)
    # Team a's owners may request exceptions in team a only (deploy/crds/rbac.yaml).
    bound = cluster.kubectl("-n", team_a, "create", "rolebinding", "exceptions",
                            "--clusterrole=gpuguard-exception-requester", "--user=alice")
    assert bound.returncode == 0, bound.stderr
    exception = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicyException",
                 "metadata": {"name": "validation"},
                 "spec": {"policies": ["e2e-crd-teams"], "reason": "validation pods"}}
    elsewhere = cluster.kubectl("--as", "alice", "-n", team_b, "create", "-f", "-",
                                input=json.dumps(exception))
    assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr.lower()
    created = cluster.kubectl("--as", "alice", "-n", team_a, "create", "-f", "-",
                              input=json.dumps(exception))
    assert created.returncode == 0, created.stderr
    wait_for("the exception to exempt team a",
             lambda: message not in denial(cluster, team_a), webhook, cluster)
    assert message in denial(cluster, team_b)  # the same served set: team b is not exempted
    exempted = wait_for("the exception's Ready=True", lambda: with_condition(
        cluster, "Ready", "True", "-n", team_a, "gpupolicyexception", "validation"),
        webhook, cluster)
    assert condition(exempted, "Accepted")["status"] == "True"
    cluster.kubectl("-n", team_a, "delete", "gpupolicyexception", "validation")
    cluster.kubectl("delete", "gpupolicy", "e2e-crd-teams")


def test_the_webhook_account_reads_the_objects_and_writes_only_their_status(
        cluster: ControlPlane) -> None:
    def can(verb: str, resource: str, *extra: str) -> bool:
        done = cluster.kubectl("auth", "can-i", verb, resource, "--as", WEBHOOK_SA, *extra)
        return done.stdout.strip() == "yes"

    assert can("watch", "gpupolicies.gpuguard.io") and can("list", "gpuquotas.gpuguard.io")
    assert can("list", "gpupolicyexceptions.gpuguard.io", "--all-namespaces")
    assert can("patch", "gpupolicies.gpuguard.io", "--subresource=status")
    assert not can("patch", "gpupolicies.gpuguard.io")
    assert not can("create", "gpupolicyexceptions.gpuguard.io", "-n", "default")
    # kube/lease.py renews with PUT (RBAC's update) and never PATCHes the Lease
    assert can("update", "leases/gpuguard-policy-status", "-n", "gpuguard-system")
    assert not can("patch", "leases/gpuguard-policy-status", "-n", "gpuguard-system")
    assert not can("update", "leases/other", "-n", "gpuguard-system")
    assert not can("update", "leases/gpuguard-policy-status", "-n", "default")


def test_audit_judges_by_the_cluster_policies_and_names_a_refused_one(
        cluster: ControlPlane, make_namespace: Callable[..., str], tmp_path) -> None:
    from tests.controlplane.webhook_process import gpuguard

    namespace = make_namespace("crd-audit")
    # Created before the policy exists: what already runs when a policy is applied.
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(gpu_pod("running",
                                                                            namespace)))
    assert created.returncode == 0, created.stderr
    apply(cluster, no_gpus("e2e-crd-audit", [namespace]))
    apply(cluster, no_gpus("e2e-crd-audit-broken", [namespace], expression="gpu.count <="))
    (tmp_path / "pass.yaml").write_text(PASS_FILE)
    try:
        done = gpuguard("audit", "--cluster", "--kubeconfig", str(cluster.kubeconfig),
                        "--cluster-policies", "--policies", str(tmp_path / "pass.yaml"),
                        "-o", "json")
        assert done.returncode in (0, 1), done.stderr
        report = json.loads(done.stdout)
        assert "e2e-crd-audit" in report["policy_set"]["policies"]
        assert "e2e-crd-audit-broken" not in report["policy_set"]["policies"]
        assert any(f["policy"] == "e2e-crd-audit" and f["outcome"] == "fail" and
                   namespace in json.dumps(f) for f in report["findings"]), report["findings"]
        assert "policy object refused: cluster:GPUPolicy/e2e-crd-audit-broken" in done.stderr
        assert "spec.validations[0].expression" in done.stderr
        alone = gpuguard("audit", "-f", str(tmp_path / "pass.yaml"), "--cluster-policies")
        assert alone.returncode == 2 and "use it with --cluster" in alone.stderr
    finally:
        cluster.kubectl("delete", "gpupolicy", "e2e-crd-audit", "e2e-crd-audit-broken")


def test_the_gitops_example_applies(cluster: ControlPlane) -> None:
    cluster.kubectl("create", "namespace", "team-a")  # the exception's namespace; may exist
    applied = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-k",
                              str(REPO / "examples" / "gitops"))
    assert applied.returncode == 0, applied.stderr
    assert sorted(applied.stdout.split("\n")[:-1]) == sorted([
        "gpupolicy.gpuguard.io/gpu-requests-equal-limits serverside-applied (server dry run)",
        "gpupolicy.gpuguard.io/no-privileged-gpu serverside-applied (server dry run)",
        "gpupolicy.gpuguard.io/team-a-max-gpus serverside-applied (server dry run)",
        "gpuquota.gpuguard.io/team-a serverside-applied (server dry run)",
        "gpupolicyexception.gpuguard.io/benchmark-pods serverside-applied (server dry run)"])


def test_a_stopped_webhook_gives_the_status_lease_up(
        cluster: ControlPlane, make_namespace: Callable[..., str],
        tmp_path: Any) -> None:
    """A replica that shuts down clears the status Lease's holder, so a standby writes the
    policy status at its next check instead of a lease duration (≥ 15 s) later."""
    namespace = make_namespace("lease-release")  # a Lease of its own: the module's server
    (tmp_path / "policies.yaml").write_text(PASS_FILE)  # holds gpuguard-system's
    server = GpuguardServer(generate_certs(tmp_path / "certs"), tmp_path / "serve.log",
                            kubeconfig=cluster.kubeconfig,
                            args=("--policies", str(tmp_path / "policies.yaml"),
                                  "--cluster-policies", "--status-lease-namespace", namespace))
    try:
        server.wait_ready()
        pid = server.process.popen.pid
        held = wait_for("the new replica to hold its status Lease", lambda: (
            status_of(cluster, "-n", namespace, "lease", "gpuguard-policy-status")
            if cluster.kubectl("get", "-n", namespace, "lease", "gpuguard-policy-status")
            .returncode == 0 else None), server, cluster)
        assert held["spec"]["holderIdentity"].endswith(f"/{pid}"), held
    finally:
        server.stop()
    assert server.process.popen.returncode == 0, server.logs()
    lease = status_of(cluster, "-n", namespace, "lease", "gpuguard-policy-status")
    assert not lease["spec"].get("holderIdentity"), lease  # released on the way out
