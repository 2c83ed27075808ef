"""Every corpus AdmissionReview and every admission bug case through the HTTP app.

Bug cases are answered with the small policies each case describes (exact patches and
decisions from their ``expected`` sections), and again with the built-in library (the outcomes
the bug files state for a default GPU policy).
"""

import copy
import json
from pathlib import Path

import jsonpatch
import pytest
import pytest_asyncio
import yaml

from tests.fakes.webhook_harness import (
    DATA,
    JSON,
    Harness,
    bug_expected,
    bug_review,
    check_review_response,
    check_status_body,
    envelope,
    gpu_policy,
    patch_of,
    review_file,
    write_policies,
)

REVIEWS = sorted(p.name for p in (DATA / "admissionreviews").glob("*.json"))


async def post(client, endpoint, body):
    response = await client.post(f"/{endpoint}", data=json.dumps(body), headers=JSON)
    return response.status, await response.json()


@pytest_asyncio.fixture
async def library_client(aiohttp_client):
    harness = Harness(None)
    assert harness.result.outcome == "loaded", harness.result.errors
    yield await aiohttp_client(harness.app)
    harness.close()


@pytest.fixture
def policy_client(aiohttp_client, tmp_path):
    harnesses = []

    async def make(*documents, **kwargs):
        path = write_policies(tmp_path / f"set{len(harnesses)}", *documents)
        harness = Harness([path], **kwargs)
        assert harness.result.outcome == "loaded", harness.result.errors
        harnesses.append(harness)
        return await aiohttp_client(harness.app)

    yield make
    for harness in harnesses:
        harness.close()


# --- the AdmissionReview corpus (tests/data/admissionreviews) --------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
@pytest.mark.parametrize("name", REVIEWS)
async def test_corpus_review_is_answered_in_kind(library_client, name, endpoint):
    body = review_file(name)
    status, answer = await post(library_client, endpoint, body)
    if name.startswith("k8s-api-testdata"):
        # The API round-trip fixture's operation is the placeholder "operationValue".
        assert status == 400
        check_status_body(answer, 400)
        assert answer["message"].startswith("request.operation: expected one of CREATE")
        return
    assert status == 200, answer
    check_review_response(answer, body, endpoint)
    response = answer["response"]
    if name.startswith("sighup"):
        assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    if endpoint == "mutate" or name.startswith(("k8sdocs", "sighup")):
        # No GPU anywhere: the scale subresource, a CONNECT to pods/exec, a plain pod.
        assert response["allowed"] is True
        assert "patch" not in response
    if endpoint == "validate" and name.startswith("kubewarden__privileged"):
        # A privileged container sees every GPU of the node without requesting one.
        assert response["allowed"] is False
        where = "initContainers[0]" if "init" in name else "ephemeralContainers[0]"
        assert f"spec.{where}.securityContext.privileged" in response["status"]["message"]


@pytest.mark.asyncio
async def test_all_fields_review_with_a_real_operation_is_evaluated(library_client):
    body = review_file("k8s-api-testdata__admissionreview-v1-all-fields.json")
    body["request"]["operation"] = "CREATE"
    status, answer = await post(library_client, "validate", body)
    assert status == 200
    check_review_response(answer, body, "validate")
    assert answer["response"] == {"uid": "uidValue", "allowed": True}


@pytest.mark.asyncio
async def test_bare_admission_request_without_envelope_is_a_400(library_client):
    raw = json.loads((DATA / "admissionreviews" /
                      "kubewarden__privileged-init-container.request.json").read_text())
    status, answer = await post(library_client, "validate", raw)
    assert status == 400
    check_status_body(answer, 400)
    assert answer["message"].startswith("apiVersion: expected one of admission.k8s.io/v1")


# --- bug cases with the policies they describe -----------------------------------------------

ANNOTATE_POLICY = gpu_policy("annotate", {
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "mutations": [{"setAnnotation": {"key": "gpu-governance.example.com/policy",
                                     "value": "default"}}]})
TOLERATE = gpu_policy("tolerate", {
    "match": {"operations": ["CREATE"]},
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "mutations": [{"addToleration": {"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}}]})
ISOLATION = gpu_policy("isolation", {"validations": [{
    "expression": "gpu.unrequestedAccess.size() == 0",
    "messageExpression": "gpu.unrequestedAccess.map(a, a.path + ': ' + a.reason).join('; ')"}]})
VALID_REQUESTS = gpu_policy("valid-requests", {"validations": [{
    "expression": "gpu.invalid.size() == 0",
    "messageExpression": "gpu.invalid.join('; ')", "reason": "Invalid"}]})
TEAM_LIMIT = gpu_policy("team-limit", {"validations": [
    {"expression": "gpu.count <= 2", "message": "at most 2 GPUs per workload"}]})


@pytest.mark.asyncio
async def test_annotation_key_with_slash_is_escaped_kyverno_532(policy_client):
    client = await policy_client(ANNOTATE_POLICY)
    body = bug_review("kyverno-kyverno-532.yaml")
    expected = bug_expected("kyverno-kyverno-532.yaml")
    status, answer = await post(client, "mutate", body)
    assert status == 200
    check_review_response(answer, body, "mutate")
    patch = patch_of(answer)
    assert patch == expected["patch"]
    after = jsonpatch.apply_patch(body["request"]["object"], patch)
    assert after["metadata"]["annotations"] == expected["result_after_apply"]


@pytest.mark.asyncio
async def test_missing_annotations_map_is_added_whole_k8s_90623(policy_client):
    client = await policy_client(gpu_policy("decision", {"mutations": [{"setAnnotation": {
        "key": "gpu-governance.example.com/decision", "value": "allowed"}}]}))
    body = bug_review("kubernetes-kubernetes-90623.yaml")
    expected = bug_expected("kubernetes-kubernetes-90623.yaml")
    status, answer = await post(client, "mutate", body)
    assert status == 200
    patch = patch_of(answer)
    assert patch == expected["patch"]
    for forbidden in expected["must_not"]:
        assert all(op["path"] != forbidden["path"] or op.get("value") != forbidden.get("value")
                   for op in patch if "value" in forbidden) or forbidden not in patch
    assert jsonpatch.apply_patch(body["request"]["object"], patch)["metadata"]["annotations"] \
        == {"gpu-governance.example.com/decision": "allowed"}
    # /validate never carries a patch, even when a policy mutates.
    status, answer = await post(client, "validate", body)
    assert status == 200 and patch_of(answer) is None


@pytest.mark.asyncio
async def test_safe_to_evict_annotation_round_trips_kopf_866(policy_client):
    client = await policy_client(gpu_policy("evict", {"mutations": [{"expression": (
        "[{'op': 'add', 'path': '/metadata/annotations/' + "
        "jsonpatch.escapeKey('cluster-autoscaler.kubernetes.io/safe-to-evict'), "
        "'value': 'true'}]")}]}))
    body = bug_review("nolar-kopf-866.yaml")
    status, answer = await post(client, "mutate", body)
    assert status == 200
    patch = patch_of(answer)
    assert patch == bug_expected("nolar-kopf-866.yaml")["patch"]
    before = body["request"]["object"]
    after = jsonpatch.apply_patch(copy.deepcopy(before), patch)
    after["metadata"]["annotations"].pop("cluster-autoscaler.kubernetes.io/safe-to-evict")
    assert after == before  # only the intended key changed


@pytest.mark.asyncio
async def test_tolerations_kyverno_1340(policy_client):
    client = await policy_client(TOLERATE)
    expected = bug_expected("kyverno-kyverno-1340.yaml")
    deployment = bug_review("kyverno-kyverno-1340.yaml", "deployment_without_tolerations")
    status, answer = await post(client, "mutate", deployment)
    assert status == 200
    assert patch_of(answer) == expected["deployment_without_tolerations"]["patch"]
    already = bug_review("kyverno-kyverno-1340.yaml", "pod_with_gpu_toleration_already")
    status, answer = await post(client, "mutate", already)
    assert status == 200 and answer["response"]["allowed"] and patch_of(answer) is None
    # on_update: never add tolerations to an existing object on UPDATE.
    update = copy.deepcopy(deployment)
    update["request"]["operation"] = "UPDATE"
    update["request"]["oldObject"] = copy.deepcopy(update["request"]["object"])
    status, answer = await post(client, "mutate", update)
    assert status == 200 and patch_of(answer) is None


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_delete_with_null_object_is_allowed_kyverno_4374(policy_client, endpoint):
    client = await policy_client(TEAM_LIMIT, TOLERATE)
    body = bug_review("kyverno-kyverno-4374.yaml")
    assert body["request"]["object"] is None
    status, answer = await post(client, endpoint, body)
    assert status == 200
    check_review_response(answer, body, endpoint)
    expected = bug_expected("kyverno-kyverno-4374.yaml")
    assert answer["response"]["allowed"] is expected["allowed"]
    assert patch_of(answer) is expected["patch"]


@pytest.mark.asyncio
async def test_invalid_request_limit_pair_is_denied_device_plugin_154(policy_client):
    client = await policy_client(VALID_REQUESTS)
    body = bug_review("NVIDIA-k8s-device-plugin-154.yaml")
    status, answer = await post(client, "validate", body)
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422 and response["status"]["reason"] == "Invalid"
    assert response["status"]["message"] == (
        "valid-requests: spec.template.spec.containers[0].resources[nvidia.com/gpu]: requests "
        "(1) must equal limits (3) for an extended resource")
    # must_not: silently rewrite the request.
    status, answer = await post(client, "mutate", body)
    assert patch_of(answer) is None


@pytest.mark.asyncio
async def test_env_gpu_access_without_request_device_plugin_61(policy_client):
    void_env = gpu_policy("hide-gpus", {
        "matchConditions": [{"name": "no-gpu", "expression": "!gpu.requested"}],
        "mutations": [{"expression": (
            "!has(object.spec.containers[0].env) ? [{'op': 'add', 'path': "
            "'/spec/containers/0/env', 'value': [{'name': 'NVIDIA_VISIBLE_DEVICES', "
            "'value': 'void'}]}] : [{'op': 'add', 'path': '/spec/containers/0/env/-', "
            "'value': {'name': 'NVIDIA_VISIBLE_DEVICES', 'value': 'void'}}]")}]})
    client = await policy_client(ISOLATION, void_env)
    expected = bug_expected("NVIDIA-k8s-device-plugin-61.yaml")
    explicit = bug_review("NVIDIA-k8s-device-plugin-61.yaml", "explicit_env")
    status, answer = await post(client, "validate", explicit)
    assert status == 200
    assert answer["response"]["allowed"] is expected["explicit_env"]["allowed"]
    assert "NVIDIA_VISIBLE_DEVICES" in answer["response"]["status"]["message"]
    zero = bug_review("NVIDIA-k8s-device-plugin-61.yaml", "zero_gpu")
    status, answer = await post(client, "validate", zero)
    assert answer["response"]["allowed"] is expected["zero_gpu"]["allowed"]
    status, answer = await post(client, "mutate", zero)
    assert patch_of(answer) == expected["zero_gpu"]["optional_patch"]
    # note: with env already set, the variable is appended, never the list replaced.
    with_env = copy.deepcopy(zero)
    with_env["request"]["object"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "b"}]
    status, answer = await post(client, "mutate", with_env)
    assert patch_of(answer) == [{"op": "add", "path": "/spec/containers/0/env/1",
                                 "value": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}}]


@pytest.mark.asyncio
async def test_ephemeral_container_subresource_is_evaluated_deckhouse_22398(policy_client):
    client = await policy_client(ISOLATION)
    body = bug_review("deckhouse-deckhouse-22398.yaml")
    assert body["request"]["subResource"] == "ephemeralcontainers"
    expected = bug_expected("deckhouse-deckhouse-22398.yaml")
    status, answer = await post(client, "validate", body)
    assert status == 200
    assert answer["response"]["allowed"] is expected["allowed"]
    for text in expected["message_mentions"]:
        assert text in answer["response"]["status"]["message"]
    status, answer = await post(client, "mutate", body)
    assert patch_of(answer) is expected["patch"]


@pytest.mark.asyncio
async def test_gpu_in_init_container_only_is_a_gpu_pod_hami_2167(policy_client):
    scheduler = gpu_policy("hami-scheduler", {
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "mutations": [{"setSchedulerName": "hami-scheduler"}]})
    quota = gpu_policy("team-a-quota", {
        "validationActions": ["Deny", "Audit"],
        "validations": [{"expression": "gpu.effectiveRequests[?'nvidia.com/gpu'].orValue(0) == 0",
                         "message": "team-a has no GPU quota left"}],
        "auditAnnotations": [{"key": "effective-requests",
                              "valueExpression": "gpu.effectiveRequests.map(r, r + '=' + "
                                                 "string(gpu.effectiveRequests[r])).join(',')"}]})
    client = await policy_client(scheduler, quota)
    body = bug_review("Project-HAMi-HAMi-2167.yaml")
    status, answer = await post(client, "mutate", body)
    assert status == 200
    assert patch_of(answer) == [{"op": "replace", "path": "/spec/schedulerName",
                                 "value": "hami-scheduler"}]
    status, answer = await post(client, "validate", body)
    response = answer["response"]
    assert response["allowed"] is False  # counted against the quota like a main container
    assert response["status"]["message"] == "team-a-quota: team-a has no GPU quota left"
    effective = bug_expected("Project-HAMi-HAMi-2167.yaml")["effective_gpu_request"]
    annotation = response["auditAnnotations"]["team-a-quota.effective-requests"]
    assert dict(item.split("=") for item in annotation.split(",")) == {
        "nvidia.com/gpu": str(effective["nvidia.com/gpu"]),
        "nvidia.com/gpumem": str(effective["nvidia.com/gpumem"])}


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_non_gpu_objects_pass_untouched_hami_160_and_kueue_5244(policy_client, endpoint):
    client = await policy_client(TOLERATE, VALID_REQUESTS, ANNOTATE_POLICY)
    for body in (bug_review("Project-HAMi-HAMi-160.yaml", "non_gpu_system_pod"),
                 bug_review("kubernetes-sigs-kueue-5244.yaml")):
        status, answer = await post(client, endpoint, body)
        assert status == 200
        check_review_response(answer, body, endpoint)
        assert answer["response"] == {"uid": body["request"]["uid"], "allowed": True}
    assert bug_expected("kubernetes-sigs-kueue-5244.yaml")["if_called"] == {
        "allowed": True, "patch": None}


# --- bug cases with the built-in library -----------------------------------------------------


@pytest.mark.asyncio
async def test_library_denies_request_limit_mismatch_device_plugin_154(library_client):
    body = bug_review("NVIDIA-k8s-device-plugin-154.yaml")
    body["request"]["userInfo"]["groups"].append("gpu-users")  # a user allowed to use GPUs
    status, answer = await post(library_client, "validate", body)
    response = answer["response"]
    assert status == 200 and response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith("gpu-requests-equal-limits: ")
    assert "(spec.template.spec.containers[0]): nvidia.com/gpu requests 1, limits 3" in message


@pytest.mark.asyncio
async def test_library_isolation_cases(library_client):
    for name, key in (("NVIDIA-k8s-device-plugin-61.yaml", "explicit_env"),
                      ("deckhouse-deckhouse-22398.yaml", None)):
        body = bug_review(name, key)
        status, answer = await post(library_client, "validate", body)
        response = answer["response"]
        assert status == 200 and response["allowed"] is False, name
        assert response["status"]["message"].startswith("no-unrequested-gpu-access: ")
        assert "NVIDIA_VISIBLE_DEVICES" in response["status"]["message"]
        status, answer = await post(library_client, "mutate", body)
        assert patch_of(answer) is None
    zero = bug_review("NVIDIA-k8s-device-plugin-61.yaml", "zero_gpu")
    status, answer = await post(library_client, "validate", zero)
    assert answer["response"]["allowed"] is True


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
@pytest.mark.parametrize(("name", "key"), [
    ("kyverno-kyverno-4374.yaml", None),
    ("kubernetes-sigs-kueue-5244.yaml", None),
    ("Project-HAMi-HAMi-160.yaml", "non_gpu_system_pod"),
])
async def test_library_allows_deletes_and_non_gpu_objects_untouched(library_client, name, key,
                                                                   endpoint):
    body = bug_review(name, key)
    status, answer = await post(library_client, endpoint, body)
    assert status == 200
    check_review_response(answer, body, endpoint)
    assert answer["response"]["allowed"] is True
    assert patch_of(answer) is None


@pytest.mark.asyncio
async def test_library_tolerates_gpu_templates_once_kyverno_1340(library_client):
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    deployment = bug_review("kyverno-kyverno-1340.yaml", "deployment_without_tolerations")
    _, answer = await post(library_client, "mutate", deployment)
    assert {"op": "add", "path": "/spec/template/spec/tolerations",
            "value": [toleration]} in patch_of(answer)
    already = bug_review("kyverno-kyverno-1340.yaml", "pod_with_gpu_toleration_already")
    _status, answer = await post(library_client, "mutate", already)
    assert all("tolerations" not in op["path"] for op in patch_of(answer) or [])


@pytest.mark.asyncio
async def test_library_warns_and_audits_an_unrecognized_accelerator(library_client, caplog):
    # A pod asking for example.org/fancy-gpu was {"allowed": true} with no warning and nothing in
    # the decision log: no GPU policy counts the resource, so the GPU rules passed it unseen. The
    # library's unrecognized-accelerator policy (Warn + Audit) says so, naming the resource and
    # the flag that declares it.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fancy", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                                    "resources": {"limits": {"example.org/fancy-gpu": "1"}}}]}}
    body = envelope({"uid": "u-fancy", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                     "namespace": "ml", "operation": "CREATE", "object": pod,
                     "userInfo": {"username": "alice"}})
    with caplog.at_level("INFO", logger="gpuguard.webhook.admission"):
        status, answer = await post(library_client, "validate", body)
    response = answer["response"]
    assert status == 200 and response["allowed"] is True
    [warning] = response["warnings"]
    assert warning.startswith("unrecognized-accelerator: Pod 'fancy' asks for "
                              "example.org/fancy-gpu, which looks like an accelerator resource "
                              "that gpuguard does not know")
    assert "--gpu-resource example.org/fancy-gpu" in warning
    annotation = json.loads(
        response["auditAnnotations"]["unrecognized-accelerator.validation-failure"])
    assert [a["rule"] for a in annotation] == ["accelerators-recognized"]
    [line] = [r.fields for r in caplog.records if r.msg == "admission"]
    assert (line["uid"], line["allowed"], line["warnings"]) == ("u-fancy", True, 1)


def test_every_admission_bug_case_is_covered():
    # Each bug file with an AdmissionReview input is exercised above or in test_webhook_server
    # (HAMi-160 deadline/failurePolicy, HAMi-1572 certificate rotation, kueue-5244).
    covered = {"kyverno-kyverno-532.yaml", "kubernetes-kubernetes-90623.yaml",
               "nolar-kopf-866.yaml", "kyverno-kyverno-1340.yaml", "kyverno-kyverno-4374.yaml",
               "NVIDIA-k8s-device-plugin-154.yaml", "NVIDIA-k8s-device-plugin-61.yaml",
               "deckhouse-deckhouse-22398.yaml", "Project-HAMi-HAMi-2167.yaml",
               "Project-HAMi-HAMi-160.yaml", "kubernetes-sigs-kueue-5244.yaml",
               "Project-HAMi-HAMi-1572.yaml"}
    assert {p.name for p in Path(DATA / "bugs").glob("*.yaml")} == covered


def test_envelope_helper_wraps_requests():
    assert envelope({"uid": "x"})["request"] == {"uid": "x"}


def test_documented_webhook_match_condition_selects_gpu_objects_only():
    # The registration docs/commands/match-conditions.md describes ("Registering the webhook": the
    # snippet, completed by `gpuguard match-conditions`, whose output for deploy/ is
    # deploy/base/match-conditions.yaml),
    # evaluated with the same CEL runtime family the API server uses for matchConditions.
    import re

    import yaml

    from policies.cel.gpu import GPU_LIBRARY
    from policies.cel.runtime import CelEnvironment

    root = DATA.parent.parent
    page = (root / "docs" / "commands" / "match-conditions.md").read_text()
    section = page.split("## Registering the webhook", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)[1]
    (webhook,) = yaml.safe_load(block)["webhooks"]
    assert webhook["timeoutSeconds"] * 1000 > 2500  # above the default deadline
    assert "gpuguard match-conditions" in section and "deploy/base/match-conditions.yaml" in section
    generated = [hook for doc in yaml.safe_load_all(
        (root / "deploy" / "base" / "match-conditions.yaml").read_text()) if doc
        for hook in doc["webhooks"] if hook["name"] == webhook["name"]]
    (conditions,) = [hook["matchConditions"] for hook in generated]
    environment = CelEnvironment(GPU_LIBRARY)
    expressions = [environment.compile(c["expression"], field_path=f"matchConditions[{i}]")
                   for i, c in enumerate(conditions)]

    def selected(body):
        request = body["request"]
        activation = environment.activation(
            {"object": request["object"], "oldObject": request.get("oldObject"),
             "request": {"operation": request["operation"],
                         "subResource": request.get("subResource", "")}}, [])
        return all(activation.evaluate(e) is True for e in expressions)

    assert selected(bug_review("Project-HAMi-HAMi-160.yaml", "gpu_pod")) is True
    assert selected(bug_review("Project-HAMi-HAMi-2167.yaml")) is True  # init container only
    assert selected(bug_review("deckhouse-deckhouse-22398.yaml")) is True  # kubectl debug
    assert selected(bug_review("kyverno-kyverno-4374.yaml")) is True  # DELETE
    assert selected(bug_review("Project-HAMi-HAMi-160.yaml", "non_gpu_system_pod")) is False
    assert selected(bug_review("NVIDIA-k8s-device-plugin-61.yaml", "zero_gpu")) is True


# --- GPU access without a request (tests/data/access, a trial's finds) -------------------------

# file -> pod -> the library policy that denies it and a piece of its message (None: allowed)
ACCESS_DENIALS = {
    "cap-all.yaml": {
        "cap-all": ("no-privileged-gpu", "adds capability ALL (every capability, SYS_ADMIN "
                    "included), in a pod that requests GPUs"),
        "cap-all-nogpu": ("no-unrequested-gpu-access", "adds capability ALL (every capability, "
                          "SYS_ADMIN included): sees every device on the node")},
    "hostpaths.yaml": {
        "hp0": ("no-unrequested-gpu-access", "mounts hostPath / (the whole host filesystem, "
                "/dev included)"),
        "hp3": ("no-unrequested-gpu-access", "mounts hostPath /./dev (= /dev)"),
        "hp4": ("no-unrequested-gpu-access", "mounts hostPath /dev/./nvidia0 (= /dev/nvidia0)"),
        "hp6": ("no-unrequested-gpu-access", "mounts hostPath /var/../dev (a '..' element"),
        "hp9": None,  # /dev/shm
    },
    "envfrom.yaml": {
        "envfrom": None,  # no prefix: listed, not denied (includeUncertain: false)
        "envfrom-prefix": ("no-unrequested-gpu-access", "envFrom ConfigMap 'gpu-env' with prefix "
                           "'NVIDIA_' may set NVIDIA_VISIBLE_DEVICES"),
        "env-lower": None},
}


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(ACCESS_DENIALS))
async def test_library_denies_gpu_access_without_a_request(library_client, name):
    pods = {d["metadata"]["name"]: d for d in yaml.safe_load_all(
        (DATA / "access" / name).read_text(encoding="utf-8")) if d}
    for pod_name, expected in ACCESS_DENIALS[name].items():
        pod = pods[pod_name]
        body = envelope({"uid": f"u-{pod_name}", "kind": {"group": "", "version": "v1",
                                                          "kind": "Pod"},
                         "resource": {"group": "", "version": "v1", "resource": "pods"},
                         "namespace": "team-llm", "operation": "CREATE", "object": pod,
                         "userInfo": {"username": "system:admin", "groups": ["system:masters"]}})
        status, answer = await post(library_client, "validate", body)
        assert status == 200
        check_review_response(answer, body, "validate")
        response = answer["response"]
        if expected is None:
            assert response["allowed"] is True, (pod_name, response)
            continue
        policy, piece = expected
        assert response["allowed"] is False, pod_name
        message = response["status"]["message"]
        assert f"{policy}: " in message and piece in message, (pod_name, message)
