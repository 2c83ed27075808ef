"""The wire contract of /validate and /mutate: bad input gets a clear 4xx, good input a
well-formed AdmissionReview (uid, apiVersion, status, warnings, auditAnnotations, patch), and the
request kinds admission sees: DELETE, CONNECT, UPDATE with oldObject, subresources, generateName,
dryRun."""

import copy
import json
import re

import pytest
import pytest_asyncio

from tests.fakes.webhook_harness import (
    JSON,
    Harness,
    bug_review,
    check_review_response,
    check_status_body,
    gpu_policy,
    patch_of,
    review_file,
    write_policies,
)
from tests.paths import ROOT
from webhook import wire
from webhook.settings import MiB, ServerSettings

DENY_GPUS = gpu_policy("no-gpus-here", {
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "validations": [{"expression": "false", "message": "GPUs are not allowed here"}]})
WARN_SHARED = gpu_policy("shared-warning", {
    "validationActions": ["Warn"],
    "validations": [{"expression": "!gpu.requested",
                     "message": "this pod asks for a GPU\nplease check"}]})
AUDIT_COUNT = gpu_policy("count-gpus", {
    "validationActions": ["Audit"],
    "auditAnnotations": [{"key": "gpus", "valueExpression": "string(gpu.count)"},
                         {"key": "shared", "valueExpression": "string(gpu.shared)"}]})
TOLERATE = gpu_policy("tolerate", {
    "match": {"operations": ["CREATE"]},
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "mutations": [{"addToleration": {"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}}]})


class Recorder:
    def __init__(self):
        self.calls = []

    def record(self, review, verdict, endpoint):
        self.calls.append((review.request["uid"], endpoint))


@pytest.fixture
def recorder():
    return Recorder()


@pytest_asyncio.fixture
async def client(aiohttp_client, tmp_path, recorder):
    path = write_policies(tmp_path, DENY_GPUS, WARN_SHARED, AUDIT_COUNT, TOLERATE)
    harness = Harness([path], recorder=recorder,
                      namespaces={"team-a": {"metadata": {"name": "team-a"}}})
    assert harness.result.outcome == "loaded", harness.result.errors
    client = await aiohttp_client(harness.app)
    client.harness = harness
    yield client
    harness.close()


def gpu_pod_review(uid="u-1", api_version="admission.k8s.io/v1"):
    review = bug_review("kyverno-kyverno-532.yaml")
    review["apiVersion"] = api_version
    review["request"]["uid"] = uid
    return review


def cpu_pod_review(uid="u-cpu"):
    review = bug_review("Project-HAMi-HAMi-160.yaml", "non_gpu_system_pod")
    review["request"]["uid"] = uid
    return review


async def post_raw(client, endpoint, data, headers=JSON):
    response = await client.post(f"/{endpoint}", data=data, headers=headers)
    return response.status, await response.json()


async def post(client, endpoint, body):
    return await post_raw(client, endpoint, json.dumps(body).encode())


# --- bad input: a 4xx naming the problem -----------------------------------------------------

BAD_BODIES = [
    (b"{not json", 400, "the request body is not valid JSON: Expecting property name"),
    (b"", 400, "the request body is empty"),
    (b"[]", 400, "expected an AdmissionReview object, got a JSON array"),
    (b'"x"', 400, "expected an AdmissionReview object, got a JSON string"),
    (b'{"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {}}', 400,
     'apiVersion: expected one of admission.k8s.io/v1, admission.k8s.io/v1beta1, got '
     '"admission.k8s.io/v2"'),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {}}', 400,
     'kind: expected AdmissionReview, got "Pod"'),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 400,
     "request: missing"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": [1]}', 400,
     "request: expected an object, got a JSON array"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}', 400,
     "request.uid: expected a non-empty string, got nothing"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}',
     400, "request.uid: expected a non-empty string, got 7"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "CREATE", "object": "pod"}}', 400,
     "request.object: expected an object or null, got the string 'pod'"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "CREATE", "object": null}}', 400,
     "request.object: a CREATE carries the object, got null"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "CREATE", "namespace": ["a"], "object": {}}}', 400,
     "request.namespace: expected a string, got a list"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "PATCH", "object": {}}}', 400,
     "request.operation: expected one of CREATE, UPDATE, DELETE, CONNECT, got 'PATCH'"),
    (b'{"a": NaN}', 400, "the request body is not valid JSON: NaN is not valid JSON"),
    (b"\xff\xfe{\x00}\x00", 400, "the request body is not UTF-8: invalid byte at offset 0"),
    ('{"apiVersion": "é"}'.encode("latin-1"), 400, "the request body is not UTF-8"),
    (b"[" * 101 + b"]" * 101, 400, "the request body nests JSON deeper than 100 levels"),
    (b"[" * 200_000 + b"]" * 200_000, 400, "the request body nests JSON deeper than 100 levels"),
    (b'{"a":' * 150 + b"1" + b"}" * 150, 400, "nests JSON deeper than 100 levels"),
    (b"1" * 5000, 400, "the request body is not valid JSON: an integer has more than 4300 "
     "digits"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "CREATE", "userInfo": "bob", "object": {}}}', 400,
     "request.userInfo: expected an object, got the string 'bob'"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
     b'{"uid": "a", "operation": "CREATE", "userInfo": {"groups": "g"}, "object": {}}}', 400,
     "request.userInfo.groups: expected a list, got the string 'g'"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("data", "status", "message"), BAD_BODIES,
                         ids=[f"bad-{i}" for i in range(len(BAD_BODIES))])
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_bad_bodies_get_a_4xx_with_a_clear_message(client, endpoint, data, status,
                                                         message):
    got, body = await post_raw(client, endpoint, data)
    assert got == status
    check_status_body(body, status)
    assert body["message"].startswith(message) or message in body["message"], body["message"]


@pytest.mark.asyncio
async def test_nesting_at_the_limit_is_accepted_as_json(client):
    review = cpu_pod_review()
    nested = "x"
    for _ in range(90):
        nested = [nested]
    review["request"]["object"]["metadata"]["annotations"] = {"deep": "ok"}
    review["request"]["object"]["spec"]["deep"] = nested
    status, body = await post(client, "validate", review)
    assert status == 200, body


@pytest.mark.asyncio
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/yaml",
                                          "application/x-www-form-urlencoded"])
async def test_wrong_content_type_is_415(client, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = await client.post("/validate", data=json.dumps(gpu_pod_review()).encode(),
                                 headers=headers)
    assert response.status == 415
    body = await response.json()
    check_status_body(body, 415)
    # (aiohttp's test client sends application/octet-stream when no type is given)
    assert body["message"].endswith(": send an AdmissionReview as application/json")


@pytest.mark.asyncio
async def test_content_type_parameters_are_accepted(client):
    status, _body = await post_raw(client, "validate", json.dumps(gpu_pod_review()).encode(),
                                  {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200


@pytest.mark.asyncio
async def test_body_over_3_mib_is_413(client):
    review = cpu_pod_review()
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (3 * MiB)}
    data = json.dumps(review).encode()
    status, body = await post_raw(client, "validate", data)
    assert status == 413
    check_status_body(body, 413)
    assert body["message"] == (f"{len(data)} bytes is over the {3 * MiB}-byte limit of an "
                               "AdmissionReview")

    async def chunks():  # no Content-Length: the limit applies while reading
        for start in range(0, len(data), 65536):
            yield data[start:start + 65536]

    response = await client.post("/validate", data=chunks(), headers=JSON)
    assert response.status == 413
    check_status_body(await response.json(), 413)


@pytest.mark.asyncio
async def test_a_body_just_under_the_limit_is_read(client):
    review = cpu_pod_review()
    filler = 3 * MiB - len(json.dumps(review)) - 100
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * filler}
    status, body = await post(client, "validate", review)
    assert status == 200 and body["response"]["allowed"] is True


@pytest.mark.asyncio
async def test_wrong_method_and_path_are_4xx(client):
    assert (await client.get("/validate")).status == 405
    assert (await client.post("/nope", data=b"{}", headers=JSON)).status == 404


# --- the response contract -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_denial_has_status_403_with_each_failed_rule_and_its_policy(client):
    review = gpu_pod_review()
    status, body = await post(client, "validate", review)
    assert status == 200
    check_review_response(body, review, "validate")
    response = body["response"]
    assert response["allowed"] is False
    assert response["status"] == {"metadata": {}, "status": "Failure", "code": 403,
                                  "reason": "Forbidden",
                                  "message": "no-gpus-here: GPUs are not allowed here"}
    # Warn -> warnings (one line each); Audit -> auditAnnotations with valid keys.
    assert response["warnings"] == ["shared-warning: this pod asks for a GPU please check"]
    assert response["auditAnnotations"] == {"count-gpus.gpus": "1", "count-gpus.shared": "false"}


@pytest.mark.asyncio
async def test_v1beta1_is_answered_in_kind(client):
    review = gpu_pod_review(api_version="admission.k8s.io/v1beta1")
    status, body = await post(client, "mutate", review)
    assert status == 200
    assert body["apiVersion"] == "admission.k8s.io/v1beta1"
    check_review_response(body, review, "mutate")
    sighup = review_file("sighup__v1beta1-pod-create-resources-empty.json")
    status, body = await post(client, "validate", sighup)
    assert body["apiVersion"] == "admission.k8s.io/v1beta1"
    assert body["response"]["uid"] == sighup["request"]["uid"]
    assert body["response"]["allowed"] is True


@pytest.mark.asyncio
async def test_patch_only_on_mutate_and_only_when_something_changes(client):
    review = gpu_pod_review()
    status, body = await post(client, "mutate", review)
    assert status == 200 and body["response"]["allowed"] is True
    assert patch_of(body) == [{"op": "add", "path": "/spec/tolerations", "value": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}]
    # /mutate runs mutations only: the validating policies do not deny or warn twice.
    assert set(body["response"]) == {"uid", "allowed", "patchType", "patch"}
    status, body = await post(client, "validate", review)
    assert patch_of(body) is None
    status, body = await post(client, "mutate", cpu_pod_review())
    assert body["response"] == {"uid": "u-cpu", "allowed": True}


@pytest.mark.asyncio
async def test_generate_name_objects_are_evaluated_and_logged(client, caplog):
    review = bug_review("nolar-kopf-866.yaml")
    assert review["request"]["name"] == ""
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    status, body = await post(client, "validate", review)
    assert status == 200 and body["response"]["allowed"] is False
    record = next(r for r in caplog.records if r.msg == "admission")
    assert record.fields["generateName"] == "web-5d8f7-"
    assert record.fields["name"] is None
    assert record.fields["decision"] == "denied"
    assert record.fields["deniedBy"] == ["no-gpus-here"]
    assert "object" not in record.fields  # bodies only with --log-objects


@pytest.mark.asyncio
async def test_policies_that_failed_to_evaluate_are_named_in_the_log_line(aiohttp_client,
                                                                          tmp_path, caplog):
    """Under failurePolicy Ignore the request is allowed; the log line still names the policy
    that failed (its answer carries no sign of it)."""
    ignored = gpu_policy("ignored", {"failurePolicy": "Ignore",
                                     "validations": [{"expression": "gpu.count < 100"}]})
    harness = Harness([write_policies(tmp_path, ignored)])
    client = await aiohttp_client(harness.app)
    review = gpu_pod_review()
    review["request"]["object"]["metadata"]["annotations"] = {"a": "\ud800"}
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    status, body = await post(client, "validate", review)
    assert status == 200 and body["response"] == {"uid": review["request"]["uid"],
                                                  "allowed": True}
    record = next(r for r in caplog.records if r.msg == "admission")
    assert record.fields["evaluationErrors"] == ["ignored"]
    harness.close()


@pytest.mark.asyncio
async def test_pods_status_is_allowed_without_evaluation(aiohttp_client, tmp_path):
    deny_all = gpu_policy("deny-all", {"match": {"resources": ["pods", "pods/status"],
                                                 "operations": ["*"]},
                                       "validations": [{"expression": "false"}]})
    harness = Harness([write_policies(tmp_path, deny_all)])
    client = await aiohttp_client(harness.app)
    review = cpu_pod_review()
    review["request"]["operation"] = "UPDATE"
    review["request"]["oldObject"] = copy.deepcopy(review["request"]["object"])
    _, body = await post(client, "validate", review)
    assert body["response"]["allowed"] is False  # the policy does apply to pods
    review["request"]["subResource"] = "status"
    _status, body = await post(client, "validate", review)
    assert body["response"] == {"uid": "u-cpu", "allowed": True}
    text = harness.metrics.exposition().decode()
    assert 'gpuguard_admission_requests_total{decision="not_evaluated",endpoint="validate"} 1.0' \
        in text
    harness.close()


@pytest.mark.asyncio
async def test_connect_and_update_with_old_object_are_evaluated(aiohttp_client, tmp_path):
    no_exec = gpu_policy("no-exec-into-gpu-team", {
        "match": {"resources": ["pods/exec"], "operations": ["CONNECT"],
                  "namespaceSelector": {"matchLabels": {"gpuguard.io/team": "a"}}},
        "validations": [{"expression": "request.operation != 'CONNECT'",
                         "message": "no exec into team-a pods"}]})
    scale = gpu_policy("scale-step", {
        "match": {"resources": ["deployments/scale"], "operations": ["UPDATE"]},
        "validations": [{"expression": "object.spec.replicas <= 2 * oldObject.spec.replicas",
                         "messageExpression": "'scaling from ' + string(oldObject.spec.replicas)"
                                              " + ' to ' + string(object.spec.replicas) + "
                                              "' replicas at once'"}]})
    harness = Harness([write_policies(tmp_path, no_exec, scale)],
                      namespaces={"team-a": {"metadata": {"name": "team-a", "labels": {
                          "gpuguard.io/team": "a"}}}})
    client = await aiohttp_client(harness.app)
    connect = review_file("k8sdocs-derived__pod-exec-connect.json")
    _, body = await post(client, "validate", connect)
    assert body["response"]["status"]["message"] == \
        "no-exec-into-gpu-team: no exec into team-a pods"
    update = review_file("k8sdocs__deployment-scale-subresource-update.json")
    _, body = await post(client, "validate", update)
    assert body["response"]["status"]["message"] == \
        "scale-step: scaling from 1 to 10 replicas at once"
    harness.close()


PROTECT = gpu_policy("protect", {
    "match": {"resources": ["pods"], "operations": ["DELETE"]},
    "validations": [{"expression": "!('protected' in oldObject.metadata.?labels.orValue({}))",
                     "message": "protected pod"}]})


@pytest.mark.asyncio
async def test_delete_is_evaluated_on_the_old_object(aiohttp_client, tmp_path):
    harness = Harness([write_policies(tmp_path, PROTECT)])
    client = await aiohttp_client(harness.app)
    delete = bug_review("kyverno-kyverno-4374.yaml")
    _, body = await post(client, "validate", delete)
    assert body["response"]["allowed"] is True, body
    delete["request"]["oldObject"]["metadata"]["labels"] = {"protected": "yes"}
    _, body = await post(client, "validate", delete)
    assert body["response"]["status"]["message"] == "protect: protected pod"
    harness.close()


@pytest.mark.asyncio
async def test_delete_object_is_null_in_cel(aiohttp_client, tmp_path):
    null_object = gpu_policy("null-object", {
        "match": {"resources": ["pods"], "operations": ["DELETE"]},
        "validations": [{"expression": "object == null", "message": "object is not null"}]})
    harness = Harness([write_policies(tmp_path, null_object)])
    client = await aiohttp_client(harness.app)
    _, body = await post(client, "validate", bug_review("kyverno-kyverno-4374.yaml"))
    harness.close()
    assert body["response"]["allowed"] is True, body["response"]


@pytest.mark.asyncio
async def test_dry_run_is_answered_the_same_but_not_recorded(client, recorder):
    cpu = cpu_pod_review("dry")
    cpu["request"]["dryRun"] = True
    _, dry = await post(client, "mutate", cpu)
    assert dry["response"] == {"uid": "dry", "allowed": True}
    cpu["request"]["dryRun"] = False
    cpu["request"]["uid"] = "wet"
    _status, wet = await post(client, "mutate", cpu)
    assert wet["response"] == {"uid": "wet", "allowed": True}
    assert recorder.calls == [("wet", "mutate")]


@pytest.mark.asyncio
async def test_audit_annotation_values_are_bounded(aiohttp_client, tmp_path):
    long = gpu_policy("a" * 80, {
        "validationActions": ["Audit"],
        "auditAnnotations": [{"key": "long",
                              "valueExpression": "object.metadata.annotations['big']"}]})
    harness = Harness([write_policies(tmp_path, long)])
    client = await aiohttp_client(harness.app)
    review = cpu_pod_review()
    review["request"]["object"]["metadata"]["annotations"] = {"big": "y" * 20_000}
    _status, body = await post(client, "validate", review)
    annotations = body["response"]["auditAnnotations"]
    ((key, value),) = annotations.items()
    assert len(key) <= 63 and len(value) == 10_240 and value.endswith("...")
    harness.close()


@pytest.mark.asyncio
async def test_evaluation_errors_follow_each_policys_failure_policy(aiohttp_client, tmp_path):
    spec = {"validations": [{"expression": "object.metadata.labels['team'] == 'a'"}]}
    strict = gpu_policy("needs-team", {**spec, "failurePolicy": "Fail"})
    lenient = gpu_policy("wants-team", {**spec, "failurePolicy": "Ignore"})
    harness = Harness([write_policies(tmp_path, strict, lenient)])
    client = await aiohttp_client(harness.app)
    _status, body = await post(client, "validate", gpu_pod_review())
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"].startswith(
        "needs-team: validations[0] failed to evaluate")
    assert "wants-team" not in body["response"]["status"]["message"]
    text = harness.metrics.exposition().decode()
    for name in ("needs-team", "wants-team"):
        assert ('gpuguard_admission_evaluation_errors_total{endpoint="validate",policy="'
                f'{name}"}} 1.0') in text
    harness.close()


def test_response_builder_omits_empty_parts():
    envelope = wire.Envelope("admission.k8s.io/v1", "u", {})
    assert wire.response(envelope, allowed=True, patch=[]) == {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": True}}
    denied = wire.response(envelope, allowed=False, message="m", reason="Invalid")
    assert denied["response"]["status"]["code"] == 422
    assert wire.status_code("SomethingElse") == 403


def _same(a, b):
    """Equal, and of the same types all the way down (1 and 1.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("text", [
    '{"n": 123456789012345678901234567890}',  # past 64 bits: an exact int, never a float
    '{"n": -9223372036854775809, "m": 18446744073709551615, "k": -9223372036854775808}',
    '{"s": "\\ud800", "t": "\\udc00x"}',  # lone surrogate escapes: accepted, as before
    '{"f": 1e400, "g": -1e400}',  # out of range: infinity, as before
    '{"f": 0.1, "g": -0.0, "h": 5e-324, "i": 1.7976931348623157e308, "j": 1E2, "k": 10}',
    '{"u": "\u00e9\\u00e9\\ud83d\\ude00\\u0000", "\\n": "\\"", "a": 1, "b": 2}',
    '[true, false, null, [], {}, "", 0, -1]',
])
def test_json_is_read_exactly_as_the_standard_library_reads_it(text):
    assert _same(wire.decode_json(text.encode(), max_depth=100), json.loads(text))


def test_json_is_written_as_ascii():
    value = {"s": "\u00e9\U0001f600", "big": 2**70, "lone": "\ud800", "n": [1, 0.5, None, True],
             "nested": {"k": ("t", 1)}}
    data = wire.encode(value)
    assert data.isascii()
    assert json.loads(data) == {**value, "nested": {"k": ["t", 1]}}
    assert wire.encode({"a": [1, "x"], "b": None}) == b'{"a":[1,"x"],"b":null}'


def test_depth_walk():
    assert not wire.too_deep({"a": [{"b": 1}]}, 3)
    assert wire.too_deep({"a": [{"b": {}}]}, 3)
    assert not wire.too_deep([], 1)
    assert not wire.too_deep("x", 1)
    assert wire.too_deep([[]], 1)


def _depth(value):
    """Levels of nesting by plain recursion (the top container is level 1; a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _random_json(rng, depth):
    """A JSON value mixing wide and deep objects and arrays (deterministic for ``rng``)."""
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice([1, "s", None, 2.5, True, [], {}])
    children = [_random_json(rng, depth - rng.choice([1, 1, 2])) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.5:
        return children
    return {f"k{i}": child for i, child in enumerate(children)}


def test_depth_walk_agrees_with_recursion_on_mixed_shapes():
    import random

    rng = random.Random(13)
    for _ in range(300):
        value = _random_json(rng, rng.randint(1, 12))
        depth = _depth(value)
        for limit in range(1, 14):
            assert wire.too_deep(value, limit) is (depth > limit), (value, limit)


def test_a_deep_branch_behind_wide_levels_is_too_deep():
    # 60,000 shallow objects, then one array nested past the limit at the end of the list.
    deep = "x"
    for _ in range(99):
        deep = [deep]
    body = json.dumps({"env": [{"name": f"V{i}", "value": "v"} for i in range(60_000)]
                       + [{"deep": deep}]}).encode()
    with pytest.raises(wire.WireError) as caught:
        wire.decode_json(body, max_depth=100)
    assert (caught.value.status, caught.value.message) == (
        400, "the request body nests JSON deeper than 100 levels")
    assert wire.decode_json(body, max_depth=102)["env"][-1]["deep"][0][0]


@pytest.mark.parametrize("text", [
    '{"i": 999999999999999999, "j": -999999999999999999, "k": 0, "z": -0}',  # 18 digits
    '{"f": 1.7976931348623157e308, "g": 5e-324, "h": -0.0, "e": 1E2}',
    '{"u": "\\u00e9\\ud83d\\ude00\\u0000 \\" \\\\", "\\u00e9k": "v", "a": 1, "b": 2}',
    '{"l": [true, false, null, [], {}, ""], "m": {"n": {"o": [1, [2, [3]]]}}}',
    '[' * 100 + ']' * 100,
    # Compact, as kube-apiserver writes it (orjson writes it back byte for byte): past 53 bits,
    # within int64.
    '{"i":12345678901234567,"j":-9007199254740993,"k":[9007199254740992]}',
])
def test_checked_bodies_are_json_the_cel_runtime_takes_as_it_is(text):
    from policies.cel.runtime import to_cel_data

    value, checked = wire.decode_checked(text.encode(), max_depth=100)
    assert checked
    # What checked vouches for (policies.cel.runtime.checked_json): the walk changes nothing.
    assert to_cel_data(value) is value


@pytest.mark.parametrize(("text", "max_depth"), [
    ('{"s": "\\ud800"}', 100),  # a lone surrogate: the standard library decodes it
    ('{"f": 1e400}', 100),  # infinity
    ('{"f": -1.8e308}', 100),  # just past a double: infinity too
    ('{"s": "\\udc00x"}', 100),  # a lone low surrogate
    ('{"i": 9223372036854775808}', 100),  # past int64 (19 digits: never orjson)
    ('{"i": 1000000000000000000}', 100),  # 19 digits within int64: the standard library too
    ('{"a": 1}', 101),  # the limit is past what the CEL runtime takes
    # Compact bodies orjson would write back as they are, or nearly: past int64 but within
    # uint64 (orjson reads an int), past uint64 (orjson reads a float, written back as one),
    # 19 digits within int64.
    ('{"i":9223372036854775808}', 100),
    ('{"i":18446744073709551616,"j":[1]}', 100),
    ('{"i":-9223372036854775809}', 100),
    ('{"i":1000000000000000000}', 100),
])
def test_bodies_the_cel_runtime_would_walk_are_not_checked(text, max_depth):
    value, checked = wire.decode_checked(text.encode(), max_depth=max_depth)
    assert not checked
    assert value == json.loads(text)  # decoded as the standard library decodes it
    assert json.dumps(value) == json.dumps(json.loads(text))  # ints stay ints


def test_envelopes_say_whether_their_body_was_checked():
    body = (ROOT / "examples" / "admission" / "gpu-pod-review.json").read_bytes()
    assert wire.decode_envelope(body, max_depth=100).checked
    assert wire.decode_body(body, None, max_bytes=3 * MiB, max_depth=100).checked
    assert not wire.decode_envelope(body, max_depth=200).checked
    unchecked = body.replace(b'"uid":', b'"big": 12345678901234567890, "uid":', 1)
    assert not wire.decode_envelope(unchecked, max_depth=100).checked


def test_settings_are_checked():
    with pytest.raises(ValueError, match="deadline_ms: must be at least 1"):
        ServerSettings(deadline_ms=0)
    with pytest.raises(ValueError, match="port: 70000 is not a TCP port"):
        ServerSettings(port=70000)
    with pytest.raises(ValueError, match="inline_max_bytes: must not be negative"):
        ServerSettings(inline_max_bytes=-1)


@pytest.mark.asyncio
async def test_log_objects_puts_bodies_in_the_decision_line(aiohttp_client, tmp_path, caplog):
    harness = Harness([write_policies(tmp_path, TOLERATE)],
                      settings=ServerSettings(port=0, log_objects=True))
    client = await aiohttp_client(harness.app)
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    review = gpu_pod_review("logged")
    await post(client, "mutate", review)
    record = next(r for r in caplog.records if r.msg == "admission")
    assert record.fields["object"] == review["request"]["object"]
    assert record.fields["oldObject"] is None
    assert record.fields["patchOperations"] == 1
    harness.close()


def test_log_lines_are_json_with_the_fields():
    import io
    import logging

    from webhook import logs

    stream = io.StringIO()
    logs.configure("info", stream)
    try:
        logging.getLogger("gpuguard.webhook.admission").info(
            "admission", extra={"fields": {"uid": "u", "latency_ms": 1.5, "odd": {1, 2}}})
        logging.getLogger("gpuguard.webhook.admission").debug("hidden")
    finally:
        logs.unconfigure()
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["msg"] == "admission" and entry["level"] == "info"
    assert entry["uid"] == "u" and entry["latency_ms"] == 1.5 and entry["odd"] == "{1, 2}"
    assert entry["logger"] == "gpuguard.webhook.admission"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    with pytest.raises(ValueError, match="log level 'loud'"):
        logs.configure("loud")


def test_log_fields_writes_the_same_line_and_leaves_other_set_ups_to_logging():
    import io
    import logging

    from webhook import logs

    stream = io.StringIO()
    logs.configure("info", stream)
    admission = logging.getLogger("gpuguard.webhook.admission")
    fields = {"uid": "u", "name": "caf\u00e9", "latency_ms": 0.5, "odd": {1}, "big": 2**70}
    captured = []

    class Capture(logging.Handler):
        def emit(self, record):
            captured.append(record)

    capture = Capture()
    try:
        logs.log_fields(admission, logging.INFO, "admission", fields)  # straight to the stream
        admission.info("admission", extra={"fields": fields})  # through logging
        logs.log_fields(admission, logging.DEBUG, "hidden", fields)  # below the level
        admission.addHandler(capture)  # another handler: the record must reach it
        logs.log_fields(admission, logging.WARNING, "rejected", {"uid": "w"})
    finally:
        admission.removeHandler(capture)
        logs.unconfigure()
    direct, logged, rejected = stream.getvalue().splitlines()
    assert direct.isascii()
    assert re.sub(r'"time":"[^"]*"', "", direct) == re.sub(r'"time":"[^"]*"', "", logged)
    assert json.loads(direct)["name"] == "caf\u00e9" and json.loads(direct)["big"] == 2**70
    assert json.loads(rejected)["level"] == "warning" and json.loads(rejected)["uid"] == "w"
    assert [(r.getMessage(), r.fields) for r in captured] == [("rejected", {"uid": "w"})]


def _decided(decision):
    return (decision.allowed, decision.decision, decision.message, decision.warnings,
            dict(decision.audit_annotations), decision.patch, decision.policy_outcomes,
            decision.fallback)


REVIEWS = sorted((ROOT / "examples" / "admission").glob("*.json")) + sorted(
    (ROOT / "tests" / "data" / "admissionreviews").glob("*.json"))


@pytest.mark.asyncio
@pytest.mark.parametrize("path", REVIEWS, ids=[p.name for p in REVIEWS])
async def test_checked_bodies_are_decided_as_unchecked_ones(path, monkeypatch):
    from policies.cel import runtime as cel
    from webhook.admission import Endpoint

    walked = []  # the top-level values the CEL data check walked

    def is_clean(value, depth, counts=None, walk=cel._is_clean):
        if depth == 0:
            walked.append(value)
        return walk(value, depth, counts)

    monkeypatch.setattr(cel, "_is_clean", is_clean)

    from webhook.admission import CHECKED_MIN_BYTES

    review = review_file(path.name) if path.parent.name == "admissionreviews" \
        else json.loads(path.read_text(encoding="utf-8"))
    review["padding"] = "x" * CHECKED_MIN_BYTES  # outside the request: only the size grows
    body = json.dumps(review).encode()
    checked = wire.decode_envelope(body, max_depth=100)
    assert checked.checked
    unchecked = wire.parse_envelope(json.loads(body), len(body))  # the standard library's
    assert not unchecked.checked
    harness = Harness(None)
    try:
        for endpoint in Endpoint:
            answers = []
            for envelope in (checked, unchecked):
                try:
                    answers.append(_decided(await harness.admitter.admit(envelope, endpoint)))
                except wire.WireError as error:
                    answers.append((error.status, error.message))
            assert answers[0] == answers[1]
    finally:
        harness.close()
    assert not cel._CHECKED  # every block ended: nothing is held past its request
    objects = [e.request.get(k) for e in (checked, unchecked) for k in ("object", "oldObject")]
    # The checked body's objects were never walked; the unchecked ones were, whenever a policy
    # applied (the CEL data is built only then).
    assert not any(value is objects[0] or value is objects[1] for value in walked)
    if walked:
        assert any(value is objects[2] or value is objects[3] for value in walked)


@pytest.mark.parametrize(("body", "path"), [
    (b'{"a": 1, "a": 2}', "a"),
    (b'{"request":{"object":{"spec":{"containers":[{"securityContext":'
     b'{"privileged":true,"privileged":false}}]}}}}',
     "request.object.spec.containers[0].securityContext.privileged"),
    (b'{"x": {"a b": 1, "a\\u0020b": 2}}', 'x["a b"]'),  # an escape spelling the same key
    # Indented, as people write it: without and with whitespace inside strings (the check
    # compares the body whitespace aside).
    (b'{\n  "a": {\n    "k": 1,\n    "k": 2\n  }\n}', "a.k"),
    (b'{\n  "a": "x y",\n  "b": {"c d": "e f",\n        "c d": "g"}\n}', 'b["c d"]'),
], ids=["top", "nested", "escaped", "indented", "indented-spaces-in-strings"])
def test_a_duplicate_key_is_a_400_naming_its_path(body, path):
    with pytest.raises(wire.WireError) as caught:
        wire.decode_json(body, max_depth=100)
    assert caught.value.status == 400
    assert caught.value.message.startswith(f"{path}: duplicate key in the request body")


def test_the_same_key_in_different_objects_is_not_a_duplicate():
    body = b'{\n  "a": {"name": 1},\n  "b": [{"name": 2}, {"name": 3}]\n}'
    assert wire.decode_json(body, max_depth=100) == {"a": {"name": 1},
                                                      "b": [{"name": 2}, {"name": 3}]}
    spaced = b'{\n  "a b": {"name": "x y"},\n  "b": [{"name": " "}, {"name": "\\t"}]\n}'
    assert wire.decode_json(spaced, max_depth=100) == {
        "a b": {"name": "x y"}, "b": [{"name": " "}, {"name": "\t"}]}
