"""gpuguard's admission webhook as kube-apiserver calls it: deploy/base/webhooks.yaml, for real.

One ``gpuguard serve`` (built-in library plus ``data/e2e-policies.yaml``, watching the cluster's
namespaces and pods) is registered through the project's own webhook configurations, with the
Service references turned into loopback URLs and the caBundle set by ``gpuguard certs inject
--live``. Requests go through the real API server with the built kubectl and the ``kubernetes``
client; where a verdict is compared, it is compared with ``gpuguard check`` of the same manifest,
so the API server must deliver exactly what the engine decided.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane, wait_until
from tests.controlplane.webhook_process import (
    REPO,
    GpuguardServer,
    deployed_webhooks,
    generate_certs,
    gpuguard,
    register_webhooks,
    unregister_webhooks,
    wait_webhook_active,
)

DATA = Path(__file__).resolve().parent / "data"
E2E_POLICIES = DATA / "e2e-policies.yaml"
POLICY_ARGS = ("--policies", str(REPO / "policies" / "library"), "--policies", str(E2E_POLICIES))
CUDA = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
DENIED_BY = 'admission webhook "pods.validate.gpuguard.io" denied the request: '


def gpu_pod(name: str, namespace: str, gpus: int = 1, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "cuda", "image": CUDA, **container,
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def plain_pod(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}}


ADMIN = ("gpuguard-test-admin", ("system:masters", "system:authenticated"))
MALLORY = ("mallory", ("system:authenticated",))  # what kubectl --as mallory sends


# The cluster's RBAC objects (written by the ``cluster`` fixture): gpu-requesters' authorizer
# checks are SubjectAccessReviews at the webhook and these objects for ``gpuguard check``.
RBAC_SNAPSHOT: list[Path] = []


def checked(manifest: dict[str, Any], user: tuple[str, tuple[str, ...]] = ADMIN
            ) -> dict[str, Any]:
    """``gpuguard check`` of one manifest as ``user`` (name, groups) sends it to the API server,
    with the cluster's RBAC objects as ``--snapshot``."""
    groups = [arg for group in user[1] for arg in ("--group", group)]
    done = gpuguard("check", "-f", "-", *POLICY_ARGS, "--user", user[0], *groups, "-o", "json",
                    "--snapshot", str(RBAC_SNAPSHOT[0]), input=json.dumps(manifest))
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)["results"][0]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
            ) -> ControlPlane:
    """The session control plane with what the webhook's policies expect of a cluster."""
    setup = [
        # the library's mutation sets runtimeClassName nvidia; the RuntimeClass admission plugin
        # refuses a pod whose RuntimeClass does not exist
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
         "handler": "nvidia"},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuguard-system"}},
        # a user RBAC lets do anything with pods and workloads, but not use GPUs
        # (gpus.gpuguard.io, which gpu-requesters checks): cluster-admin would include it
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "e2e-workloads-admin"},
         "rules": [{"apiGroups": ["", "apps", "batch", "kubeflow.org", "ray.io",
                                  "jobset.x-k8s.io", "kubevirt.io", "leaderworkerset.x-k8s.io",
                                  "trainer.kubeflow.org", "serving.kserve.io",
                                  "apps.nvidia.com", "kaito.sh"],
                    "resources": ["*"], "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "e2e-mallory-workloads-admin"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "e2e-workloads-admin"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": "mallory"}]},
    ]
    applied = control_plane.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": setup}))
    assert applied.returncode == 0, applied.stderr
    install_crds(control_plane, DATA / "workload-crds.yaml")
    exported = control_plane.kubectl("get", "clusterroles,clusterrolebindings,roles,rolebindings",
                                     "-A", "-o", "yaml")
    assert exported.returncode == 0, exported.stderr
    snapshot = tmp_path_factory.mktemp("e2e-rbac") / "rbac.yaml"
    snapshot.write_text(exported.stdout, encoding="utf-8")
    RBAC_SNAPSHOT[:] = [snapshot]
    return control_plane


def install_crds(cluster: ControlPlane, path: Path) -> None:
    """Apply CRDs and wait until the API server serves them (condition Established)."""
    applied = cluster.kubectl("apply", "-f", str(path))
    assert applied.returncode == 0, applied.stderr
    cluster.wait_established(*(d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text())
                               if d))


@pytest.fixture(scope="module")
def legacy_pod(cluster: ControlPlane) -> tuple[str, str]:
    """A privileged GPU pod created before gpuguard was registered (what a cluster has)."""
    namespace = "e2e-legacy"
    created = cluster.kubectl("create", "namespace", namespace)
    assert created.returncode == 0, created.stderr
    pod = gpu_pod("legacy", namespace, securityContext={"privileged": True})
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert created.returncode == 0, created.stderr
    return namespace, "legacy"


@pytest.fixture(scope="module")
def webhook(cluster: ControlPlane, legacy_pod: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuguardServer]:
    work = tmp_path_factory.mktemp("e2e-webhook")
    certs = generate_certs(work / "certs")
    server = GpuguardServer(certs, work / "serve.log", kubeconfig=cluster.kubeconfig,
                            args=[*POLICY_ARGS, "--quota-namespace", "gpuguard-system",
                                  "--tls-reload-s", "0.2"])
    try:
        server.wait_ready()
        register_webhooks(cluster, server, work)
        wait_webhook_active(cluster, server, legacy_pod[0])
        yield server
    finally:
        unregister_webhooks(cluster)
        server.stop()


@pytest.fixture
def core(cluster: ControlPlane) -> Iterator[k8s_client.CoreV1Api]:
    api_client = cluster.api_client()
    try:
        yield k8s_client.CoreV1Api(api_client)
    finally:
        api_client.close()


def status_message(exc: ApiException) -> str:
    return str(json.loads(exc.body)["message"])


def test_gpu_pod_denied_with_the_policy_message(cluster, webhook, make_namespace, core) -> None:
    namespace = make_namespace("deny")
    pod = gpu_pod("privileged-cuda", namespace, securityContext={"privileged": True})
    verdict = checked(pod)
    assert not verdict["allowed"] and verdict["message"].startswith("no-privileged-gpu: ")
    by_kubectl = cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert by_kubectl.returncode == 1
    assert f"{DENIED_BY}{verdict['message']}" in by_kubectl.stderr, by_kubectl.stderr
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_pod(namespace, pod)
    assert denied.value.status == 403
    assert status_message(denied.value) == f"{DENIED_BY}{verdict['message']}"
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("privileged-cuda", namespace)
    assert missing.value.status == 404  # nothing was stored
    # and the decision reached the webhook's log with the policy that denied it
    assert any(d["decision"] == "denied" and d.get("name") == "privileged-cuda"
               and "no-privileged-gpu" in d.get("deniedBy", []) for d in webhook.decisions())


def test_user_whom_rbac_does_not_let_use_gpus_is_denied(cluster, webhook, make_namespace) -> None:
    namespace = make_namespace("requester")
    pod = gpu_pod("cuda", namespace)
    done = cluster.kubectl("--as", "mallory", "create", "-f", "-", input=json.dumps(pod))
    assert done.returncode == 1  # RBAC let mallory in; the webhook, seeing userInfo, did not
    assert f"{DENIED_BY}gpu-requesters: user 'mallory' may not use GPUs not pinned to a product" \
        in done.stderr, done.stderr


def test_mutated_pod_is_stored_with_the_patch_applied(cluster, webhook, make_namespace,
                                                      core) -> None:
    namespace = make_namespace("mutate")
    pod = gpu_pod("cuda", namespace)
    patch = checked(pod)["patch"]
    assert [op["path"] for op in patch] == ["/spec/tolerations", "/spec/runtimeClassName"]
    created = core.create_namespaced_pod(namespace, pod)
    assert created.spec.runtime_class_name == "nvidia"
    stored = cluster.kubectl("-n", namespace, "get", "pod", "cuda", "-o", "json")
    spec = json.loads(stored.stdout)["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    # the API server adds its own not-ready/unreachable tolerations after the webhook
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in spec["tolerations"]
    mutations = [d for d in webhook.decisions()
                 if d.get("endpoint") == "mutate" and d.get("name") == "cuda"
                 and d.get("namespace") == namespace]
    assert mutations and mutations[-1].get("patchOperations") == 2


def _dry_run_spec(cluster: ControlPlane, pod: dict[str, Any]) -> dict[str, Any] | None:
    """The spec the API server would store for ``pod`` (server dry run), None when refused."""
    done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                           input=json.dumps(pod))
    return json.loads(done.stdout)["spec"] if done.returncode == 0 else None


def test_no_runtime_class_name_where_the_cluster_lacks_the_runtime_class(cluster, webhook,
                                                                         make_namespace) -> None:
    # GKE has no RuntimeClass nvidia. Before, the library's mutation set runtimeClassName:
    # nvidia on every NVIDIA GPU pod and the RuntimeClass admission plugin refused the pod
    # ('pod rejected: RuntimeClass "nvidia" not found'). The webhook's RuntimeClass watch sees
    # the class go and come back; the waits are for the API server's answer to change.
    pod = gpu_pod("no-rc", make_namespace("runtimeclass"))
    assert _dry_run_spec(cluster, pod)["runtimeClassName"] == "nvidia"  # type: ignore[index]
    deleted = cluster.kubectl("delete", "runtimeclass", "nvidia")
    assert deleted.returncode == 0, deleted.stderr
    try:
        spec = wait_until(lambda: (s := _dry_run_spec(cluster, pod)) is not None
                          and "runtimeClassName" not in s and s,
                          "a GPU pod admitted without runtimeClassName", logs=cluster.logs)
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            spec["tolerations"]  # the other mutation still applies
    finally:
        restored = cluster.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
             "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
        assert restored.returncode == 0, restored.stderr
        wait_until(lambda: ((_dry_run_spec(cluster, pod) or {}).get("runtimeClassName")
                            == "nvidia"), "the mutation back with the RuntimeClass",
                   logs=cluster.logs)


def test_warnings_reach_kubectl_and_the_client(cluster, webhook, make_namespace, core) -> None:
    namespace = make_namespace("warn")
    pod = gpu_pod("two-gpus", namespace, gpus=2)
    warning = "e2e-warn-multi-gpu: a pod asks for 2 GPUs; more than one GPU per pod is reviewed"
    assert checked(pod)["warnings"] == [warning]
    by_kubectl = cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert by_kubectl.returncode == 0, by_kubectl.stderr
    assert f"Warning: {warning}" in by_kubectl.stderr, by_kubectl.stderr
    second = {**pod, "metadata": {**pod["metadata"], "name": "two-gpus-client"}}
    response = core.create_namespaced_pod(namespace, second, _preload_content=False)
    assert response.status == 201
    assert f'299 - "{warning}"' in response.headers.get("Warning", "")


def _ledger(cluster: ControlPlane) -> dict[str, Any]:
    done = cluster.kubectl("-n", "gpuguard-system", "get", "configmap",
                           "gpuguard-quota-e2e-dry-run", "-o", "json", "--ignore-not-found")
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return {}
    return json.loads(json.loads(done.stdout).get("data", {}).get("reservations") or "{}")


def test_server_dry_run_gets_the_same_verdict_and_stores_and_reserves_nothing(
        cluster, webhook, make_namespace, tmp_path) -> None:
    namespace = make_namespace("dry-run", labels={"gpuguard.io/e2e-quota": "dry-run"})
    denied = gpu_pod("privileged-cuda", namespace, securityContext={"privileged": True})
    manifest = tmp_path / "denied.yaml"
    manifest.write_text(yaml.safe_dump(denied))
    verdict = checked(denied)
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", str(manifest))
    assert applied.returncode == 1
    assert f"{DENIED_BY}{verdict['message']}" in applied.stderr, applied.stderr

    fits = gpu_pod("fits", namespace, gpus=2)  # exactly the quota's 2 GPU-equivalents
    manifest.write_text(yaml.safe_dump(fits))
    for _ in range(2):  # twice: a reservation by the first would make the second not fit
        applied = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", str(manifest))
        assert applied.returncode == 0, applied.stderr
        assert json.loads(applied.stdout)["spec"]["runtimeClassName"] == "nvidia"  # mutated
    assert cluster.kubectl("-n", namespace, "get", "pod", "fits").returncode == 1  # not stored
    assert not [k for k in _ledger(cluster) if k.startswith(f"{namespace}/")]  # not reserved

    too_big = gpu_pod("too-big", namespace, gpus=3)
    manifest.write_text(yaml.safe_dump(too_big))
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", str(manifest))
    assert applied.returncode == 1
    assert "GPUQuota e2e-dry-run" in applied.stderr and "2 GPU-equivalents" in applied.stderr
    # the real create reserves: the dry runs above were on the same quota path
    created = cluster.kubectl("apply", "-f", "-", input=json.dumps(fits))
    assert created.returncode == 0, created.stderr
    assert [k for k in _ledger(cluster) if k.startswith(f"{namespace}/fits/")]


def test_kubectl_debug_ephemeral_containers_are_evaluated(cluster, webhook, make_namespace
                                                          ) -> None:
    namespace = make_namespace("debug")
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(plain_pod("app", namespace)))
    assert created.returncode == 0, created.stderr
    peek = cluster.kubectl("-n", namespace, "debug", "app", "--image=busybox:1.36",
                           "--container=gpu-peek", "--env=NVIDIA_VISIBLE_DEVICES=all")
    assert peek.returncode != 0
    assert "no-unrequested-gpu-access: " in peek.stderr and "NVIDIA_VISIBLE_DEVICES" in \
        peek.stderr, peek.stderr
    shell = cluster.kubectl("-n", namespace, "debug", "app", "--image=busybox:1.36",
                            "--container=shell")
    assert shell.returncode == 0, shell.stderr
    stored = json.loads(cluster.kubectl("-n", namespace, "get", "pod", "app", "-o",
                                        "json").stdout)
    assert [c["name"] for c in stored["spec"]["ephemeralContainers"]] == ["shell"]
    subresource = [d for d in webhook.decisions() if d.get("name") == "app"
                   and d.get("namespace") == namespace and d.get("endpoint") == "validate"]
    # the GPU peek reached gpuguard and was denied; the plain shell never reached it: the
    # shipped matchConditions leave out an ephemeral container that can touch no GPU
    assert [d["decision"] for d in subresource] == ["denied"]


def test_pod_status_writes_are_never_blocked(cluster, webhook, legacy_pod) -> None:
    namespace, name = legacy_pod
    # the pod predates gpuguard and breaks no-privileged-gpu: its updates are denied ...
    labelled = cluster.kubectl("-n", namespace, "label", "pod", name, "touched=yes")
    assert labelled.returncode == 1 and "no-privileged-gpu: " in labelled.stderr
    before = len(webhook.decisions())
    # ... but the kubelet's status writes go through (no kubelet here: the same PATCH)
    status = {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}
    patched = cluster.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status",
                              "--type=merge", "-p", json.dumps(status))
    assert patched.returncode == 0, patched.stderr
    stored = json.loads(cluster.kubectl("-n", namespace, "get", "pod", name, "-o",
                                        "json").stdout)
    assert stored["status"]["phase"] == "Running"
    assert len(webhook.decisions()) == before  # never even sent to gpuguard


WORKLOADS = [
    DATA / "workloads" / "pytorchjob-deepspeed.yaml",
    DATA / "workloads" / "rayjob-kai.yaml",
    REPO / "tests" / "data" / "manifests" / "lws__vllm-gpu-leaderworkerset.yaml",
    DATA / "workloads" / "jobset-jax-tpu.yaml",
    DATA / "workloads" / "vm-gpu.yaml",
    # a resource block (TrainJob resourcesPerNode) and a bare PodSpec (InferenceService)
    DATA / "workloads" / "trainjob-flux-gpus.yaml",
    DATA / "workloads" / "inferenceservice-gpu.yaml",
    DATA / "workloads" / "vmi-gpu.yaml",
    # operator kinds whose GPUs are a resource block (NIMService spec.resources) or a MIG request
    # by profile (KAITO Workspace spec.resource.mig): judged, nothing for the mutation to write
    DATA / "workloads" / "nimservice-basic.yaml",
    DATA / "workloads" / "kaito-workspace-mig.yaml",
]


def _pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    kind = obj["kind"]
    if kind == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "RayJob":
        ray = spec["rayClusterSpec"]
        return [ray["headGroupSpec"]["template"]] + [g["template"]
                                                     for g in ray["workerGroupSpecs"]]
    if kind == "LeaderWorkerSet":
        lws = spec["leaderWorkerTemplate"]
        return [lws["leaderTemplate"], lws["workerTemplate"]]
    if kind in ("Deployment", "Job"):
        return [spec["template"]]
    if kind == "InferenceService":  # the predictor is a PodSpec: mutated in place
        return [{"spec": spec["predictor"]}]
    return []  # TrainJob: resourcesPerNode has no pod spec to mutate


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_crd_workloads_are_judged_by_their_templates(cluster, webhook, make_namespace,
                                                     path: Path) -> None:
    namespace = make_namespace(path.stem[:20])
    manifest = yaml.safe_load(path.read_text())
    manifest["metadata"]["namespace"] = namespace
    verdict = checked(manifest, MALLORY)
    assert not verdict["allowed"] and verdict["message"].startswith("gpu-requesters: ")
    denied = cluster.kubectl("--as", "mallory", "create", "-f", "-", input=json.dumps(manifest))
    assert denied.returncode == 1
    assert 'admission webhook "workloads.validate.gpuguard.io" denied the request: ' \
        f"{verdict['message']}" in denied.stderr, denied.stderr
    created = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(manifest))
    assert created.returncode == 0, created.stderr
    stored = json.loads(created.stdout)
    templates = _pod_templates(stored)
    expected = checked(manifest)["patch"]
    assert len(templates) == len([op for op in expected if op["path"].endswith("/tolerations")])
    for template in templates:  # each GPU pod template mutated, the others left alone
        assert template["spec"]["runtimeClassName"] == "nvidia"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            template["spec"]["tolerations"]


def test_deployments_and_jobs_are_judged_by_their_templates(cluster, webhook, make_namespace
                                                            ) -> None:
    namespace = make_namespace("controllers")
    template = {"metadata": {"labels": {"app": "train"}},
                "spec": gpu_pod("x", namespace, securityContext={"privileged": True})["spec"]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "train", "namespace": namespace},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "train"}},
                           "template": template}}
    verdict = checked(deployment)
    assert "spec.template.spec.containers[0]" in verdict["message"]
    denied = cluster.kubectl("create", "-f", "-", input=json.dumps(deployment))
    assert denied.returncode == 1
    assert 'admission webhook "workloads.validate.gpuguard.io" denied the request: ' \
        f"{verdict['message']}" in denied.stderr, denied.stderr
    job_template = copy.deepcopy(template)
    job_template["spec"]["containers"][0].pop("securityContext")
    job_template["spec"]["restartPolicy"] = "Never"
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train", "namespace": namespace},
           "spec": {"template": job_template}}
    created = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(job))
    assert created.returncode == 0, created.stderr
    stored = json.loads(created.stdout)["spec"]["template"]["spec"]
    assert stored["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        stored["tolerations"]


def test_match_conditions_of_the_deploy_file_are_evaluated_by_the_api_server(
        cluster, webhook, make_namespace) -> None:
    configured = [w for d in deployed_webhooks(cluster)
                  for w in d.get("webhooks") or [] if w["name"] == "pods.validate.gpuguard.io"]
    assert len(configured) == 1
    conditions = configured[0].get("matchConditions") or []
    live = json.loads(cluster.kubectl("get", "validatingwebhookconfiguration",
                                      "gpuguard-validating", "-o", "json").stdout)
    served = next(w for w in live["webhooks"] if w["name"] == "pods.validate.gpuguard.io")
    assert served.get("matchConditions", []) == conditions  # the API server compiled them
    namespace = make_namespace("prefilter")
    before = len(webhook.decisions())
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(plain_pod("plain",
                                                                               namespace)))
    assert created.returncode == 0, created.stderr
    gpu = cluster.kubectl("create", "-f", "-", input=json.dumps(gpu_pod("gpu", namespace)))
    assert gpu.returncode == 0, gpu.stderr
    sent = {(d["endpoint"], d.get("name")) for d in webhook.decisions()[before:]
            if d.get("namespace") == namespace}
    assert ("validate", "gpu") in sent and ("mutate", "gpu") in sent
    # deploy/ ships matchConditions (deploy/base/match-conditions.yaml): a pod that mentions
    # no GPU never reaches gpuguard, so an outage cannot block it
    assert conditions, "deploy/base renders the pods webhook without matchConditions"
    assert ("validate", "plain") not in sent and ("mutate", "plain") not in sent, sent


# The trial's pods that reach GPUs without requesting one (tests/data/access): the shipped
# matchConditions must send each to gpuguard, which denies it as `gpuguard check` does.
ACCESS = REPO / "tests" / "data" / "access"
ACCESS_DENIED = (("cap-all.yaml", "cap-all"), ("cap-all.yaml", "cap-all-nogpu"),
                 ("hostpaths.yaml", "hp0"), ("hostpaths.yaml", "hp2"), ("hostpaths.yaml", "hp3"),
                 ("hostpaths.yaml", "hp4"), ("hostpath-dotdev.yaml", "hp"),
                 ("envfrom.yaml", "envfrom-prefix"))


def _access_pod(name: str, pod: str, namespace: str) -> dict[str, Any]:
    [found] = [d for d in yaml.safe_load_all((ACCESS / name).read_text(encoding="utf-8"))
               if d and d["metadata"]["name"] == pod]
    found["metadata"]["namespace"] = namespace
    return found


def test_gpu_access_without_a_request_is_sent_and_denied(cluster, webhook, make_namespace
                                                         ) -> None:
    namespace = make_namespace("access")
    for name, pod_name in ACCESS_DENIED:
        pod = _access_pod(name, pod_name, namespace)
        verdict = checked(pod)
        assert not verdict["allowed"], pod_name
        assert verdict["message"].startswith(("no-privileged-gpu: ",
                                              "no-unrequested-gpu-access: ")), verdict
        done = cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        assert done.returncode == 1, pod_name
        assert f"{DENIED_BY}{verdict['message']}" in done.stderr, done.stderr
    # a '..' element the API server refuses itself (after the mutating webhook, which sends it)
    done = cluster.kubectl("create", "-f", "-",
                           input=json.dumps(_access_pod("hostpaths.yaml", "hp6", namespace)))
    assert done.returncode == 1 and "must not contain '..'" in done.stderr, done.stderr
    before = len(webhook.decisions())
    for name, pod_name in (("hostpaths.yaml", "hp9"), ("envfrom.yaml", "env-lower"),
                          ("envfrom.yaml", "envfrom")):
        done = cluster.kubectl("create", "-f", "-",
                               input=json.dumps(_access_pod(name, pod_name, namespace)))
        assert done.returncode == 0, done.stderr  # /dev/shm, CUDA_VISIBLE_DEVICES, envFrom
    assert not [d for d in webhook.decisions()[before:] if d.get("namespace") == namespace]


def test_certificate_rotation_while_the_api_server_keeps_calling(cluster, webhook,
                                                                 make_namespace) -> None:
    namespace = make_namespace("rotation")
    pod = gpu_pod("rotating", namespace, securityContext={"privileged": True})
    before = webhook.metric("gpuguard_tls_reloads_total", outcome="success")
    served_before = webhook.served_certificate()
    failures: list[str] = []
    answers = [0]
    stop = threading.Event()

    def call() -> None:  # server-side dry runs, back to back, each one a webhook call
        while not stop.is_set():
            done = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                                   input=json.dumps(pod))
            if "no-privileged-gpu: " in done.stderr:
                answers[0] += 1
            else:
                failures.append(done.stderr)
    caller = threading.Thread(target=call)
    caller.start()
    try:
        wait_until(lambda: answers[0] >= 2, "the first webhook answers", logs=webhook.logs)
        renewed = gpuguard("certs", "renew", "--out", str(webhook.certs))
        assert renewed.returncode == 0, renewed.stderr
        wait_until(lambda: webhook.served_certificate() != served_before,
                   "gpuguard serve to pick the renewed certificate up", logs=webhook.logs)
        at_switch = answers[0]
        wait_until(lambda: answers[0] >= at_switch + 3, "answers with the new certificate",
                   logs=lambda: f"{webhook.logs()}\n{cluster.logs()}")
    finally:
        stop.set()
        caller.join(60)
    assert failures == []  # every call in between got gpuguard's verdict, none an error
    assert webhook.metric("gpuguard_tls_reloads_total", outcome="success") > before


# DRA MIG claims (trial finding 2): a Pod reaches the webhook without the claim it names, so
# mig-profile-allowed judges the ResourceClaimTemplate itself, which the API server sends
# (pods.validate's resource.k8s.io rule, its generated matchConditions) before any pod uses it.
MIG_ONLY = REPO / "tests" / "data" / "trial" / "dra" / "mig-only.yaml"


def _trial_template(name: str, namespace: str) -> dict[str, Any]:
    found = next(d for d in yaml.safe_load_all(MIG_ONLY.read_text(encoding="utf-8"))
                 if d["kind"] == "ResourceClaimTemplate" and d["metadata"]["name"] == name)
    found["metadata"]["namespace"] = namespace
    return dict(found)


def test_a_mig_claim_template_of_a_profile_the_team_may_not_use_is_denied(
        cluster, webhook, make_namespace) -> None:
    vision = make_namespace("dra-vision", labels={"gpuguard.io/team": "vision"})
    template = _trial_template("mig-only", vision)
    denied = cluster.kubectl("create", "-f", "-", input=json.dumps(template))
    assert denied.returncode == 1
    assert (f'admission webhook "pods.validate.gpuguard.io" denied the request: '
            f"mig-profile-allowed: MIG profile 1g.10gb is not allowed for team 'vision' "
            f"(namespace '{vision}', label gpuguard.io/team=vision); this team may not use MIG. "
            "Ask the platform team to add 1g.10gb to params.allowedProfiles.vision of policy "
            "mig-profile-allowed.") in denied.stderr, denied.stderr
    assert cluster.kubectl("-n", vision, "get", "resourceclaimtemplate",
                           "mig-only").returncode == 1  # nothing was stored
    inference = make_namespace("dra-inference", labels={"gpuguard.io/team": "inference"})
    before = len(webhook.decisions())
    allowed = cluster.kubectl("create", "-f", "-",
                              input=json.dumps(_trial_template("mig-only", inference)))
    assert allowed.returncode == 0, allowed.stderr  # 1g.10gb is the inference team's
    channel = cluster.kubectl("create", "-f", "-",
                              input=json.dumps(_trial_template("compute-domain", inference)))
    assert channel.returncode == 0, channel.stderr
    sent = {d.get("name") for d in webhook.decisions()[before:]
            if d.get("namespace") == inference}
    # the MIG template reached gpuguard; the IMEX channel's (no GPU) was filtered out by the
    # matchConditions, so an outage of gpuguard cannot block it
    assert "mig-only" in sent and "compute-domain" not in sent, sent
