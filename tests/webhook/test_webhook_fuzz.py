"""Property-based fuzzing of /validate and /mutate (hypothesis): whatever the body, its content
type and its content coding, the answer is a 200 AdmissionReview or a 4xx Status — never a 5xx —
and has the contract's shape; and every log line the run writes is JSON.

The app runs in-process (no sockets beyond loopback, no TLS) on one event loop kept for the
whole module, served as the server serves it (aiohttp's own body decompression off), so each
example is one HTTP round trip. Examples are derandomized: the same run every time.
"""

import asyncio
import copy
import gzip
import io
import json
import zlib

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.webhook_harness import (
    Harness,
    bug_review,
    check_review_response,
    check_status_body,
    gpu_policy,
    write_policies,
)
from webhook import logs
from webhook.connections import handler_args

POLICIES = [
    gpu_policy("max-gpus", {"validations": [{"expression": "gpu.count <= 2",
                                             "message": "too many GPUs"}]}),
    gpu_policy("tolerate", {
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "mutations": [{"addToleration": {"key": "nvidia.com/gpu", "operator": "Exists",
                                         "effect": "NoSchedule"}},
                      {"setAnnotation": {"key": "gpuguard.io/checked", "value": "yes"}}]}),
    gpu_policy("warn-shared", {"validationActions": ["Warn", "Audit"],
                               "validations": [{"expression": "!gpu.shared"}]}),
    gpu_policy("labels", {"failurePolicy": "Ignore",
                          "validations": [{"expression": "object.metadata.labels.team != ''"}]}),
]
BASE = bug_review("kyverno-kyverno-532.yaml")
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain", "",
                 "application/JSON", "application/json-patch+json", "multipart/form-data"]


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz-policies")
    harness = Harness([write_policies(directory, *POLICIES)])
    assert harness.result.outcome == "loaded", harness.result.errors
    loop = asyncio.new_event_loop()
    server = TestServer(harness.app, loop=loop)
    loop.run_until_complete(server.start_server(**handler_args(keepalive_s=120.0)))
    client = TestClient(server, loop=loop)
    loop.run_until_complete(client.start_server())
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()
    harness.close()


@pytest.fixture(scope="module")
def log_lines():
    """Every log line of the module's run, as the server writes them (JSON, see webhook.logs)."""
    stream = io.StringIO()
    logs.configure("info", stream)
    yield stream
    logs.unconfigure()


def check_logs(stream):
    lines = stream.getvalue().splitlines()
    assert lines
    for line in lines:
        entry = json.loads(line)  # fails on any line that is not JSON
        assert {"time", "level", "logger", "msg"} <= set(entry)
        assert "Traceback" not in str(entry.get("error")), entry  # bad input is not a bug


def exchange(app_client, endpoint, data, content_type="application/json", encoding=None):
    loop, client = app_client

    async def go():
        headers = {"Content-Type": content_type} if content_type else {}
        if encoding is not None:
            headers["Content-Encoding"] = encoding
        response = await client.post(f"/{endpoint}", data=data, headers=headers)
        return response.status, await response.read()

    return loop.run_until_complete(go())


def check(status, raw, sent, endpoint):
    assert status < 500, raw[:300]
    body = json.loads(raw)
    if status == 200:
        check_review_response(body, sent, endpoint)
    else:
        assert 400 <= status < 500
        check_status_body(body, status)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
PATHS = [("apiVersion",), ("kind",), ("request",), ("request", "uid"),
         ("request", "operation"), ("request", "object"), ("request", "oldObject"),
         ("request", "kind"), ("request", "resource"), ("request", "namespace"),
         ("request", "name"), ("request", "userInfo"), ("request", "userInfo", "groups"),
         ("request", "subResource"), ("request", "dryRun"), ("request", "object", "metadata"),
         ("request", "object", "spec"), ("request", "object", "spec", "containers"),
         ("request", "object", "metadata", "annotations"), ("request", "object", "kind"),
         ("request", "object", "spec", "containers", 0, "resources"),
         ("request", "object", "spec", "containers", 0, "resources", "limits")]


@st.composite
def mutated_reviews(draw):
    """A real AdmissionReview with a few fields replaced by arbitrary JSON or removed."""
    review = copy.deepcopy(BASE)
    if draw(st.booleans()):
        review["apiVersion"] = "admission.k8s.io/v1beta1"
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = review
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                break
        else:
            if isinstance(parent, dict):
                if draw(st.booleans()):
                    parent.pop(path[-1], None)
                else:
                    parent[path[-1]] = draw(json_values)
            elif isinstance(parent, list) and parent:
                parent[0] = draw(json_values)
    return review


bodies = st.one_of(
    st.binary(max_size=300).map(lambda b: (b, None)),
    json_values.map(lambda v: (json.dumps(v).encode(), None)),
    mutated_reviews().map(lambda r: (json.dumps(r).encode(), r)),
    mutated_reviews().map(lambda r: (json.dumps(r).encode("utf-16"), None)),
    mutated_reviews().map(lambda r: (json.dumps(r, ensure_ascii=False).encode()[:-7], None)),
    st.integers(1, 3000).map(lambda n: (b'{"a":' * n + b"1" + b"}" * n, None)),
)


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(body=bodies, endpoint=st.sampled_from(["validate", "mutate"]))
def test_fuzzed_bodies_never_get_a_5xx(app_client, log_lines, body, endpoint):
    data, review = body
    status, raw = exchange(app_client, endpoint, data)
    if status == 200:
        assert review is not None
    check(status, raw, review, endpoint)
    check_logs(log_lines)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(review=mutated_reviews(), content_type=st.sampled_from(CONTENT_TYPES),
       endpoint=st.sampled_from(["validate", "mutate", "null-validate"]))
def test_fuzzed_reviews_and_content_types(app_client, log_lines, review, content_type, endpoint):
    status, raw = exchange(app_client, endpoint, json.dumps(review).encode(), content_type)
    check(status, raw, review, endpoint)
    if content_type.split(";")[0].strip().lower() != "application/json":
        assert status == 415
    check_logs(log_lines)


CODINGS = ["gzip", "x-gzip", "GZIP", "deflate", "identity", "br", "zstd", "gzip, gzip",
           "gzip, identity", " "]
KNOWN = {"gzip": gzip.compress, "x-gzip": gzip.compress, "GZIP": gzip.compress,
         "deflate": zlib.compress, "gzip, identity": gzip.compress}


@st.composite
def encoded(draw):
    """``(coding, bytes, review, kind)``: a review compressed as its header says (``right``),
    or compressed some other way (``other``), cut short (``cut``), or garbage."""
    coding = draw(st.sampled_from(CODINGS))
    review = draw(mutated_reviews())
    plain = json.dumps(review).encode()
    pack = KNOWN.get(coding, lambda data: data)
    kind = draw(st.sampled_from(["right", "other", "cut", "garbage"]))
    if kind == "right":
        data = pack(plain)
    elif kind == "other":
        data = draw(st.sampled_from([gzip.compress, zlib.compress, bytes]))(plain)
    elif kind == "cut":
        data = pack(plain)
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    else:
        data = draw(st.binary(max_size=300))
    return coding, data, review, kind


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sample=encoded(), endpoint=st.sampled_from(["validate", "mutate"]))
def test_fuzzed_content_encodings_never_get_a_5xx(app_client, log_lines, sample, endpoint):
    """On main a gzip Content-Encoding on a plain body was a 500 with a traceback."""
    coding, data, review, kind = sample
    status, raw = exchange(app_client, endpoint, data, encoding=coding)
    check(status, raw, review, endpoint)  # a 200 answers the review (uid echoed)
    if coding.strip().lower() in ("br", "zstd", "gzip, gzip"):
        assert status == 415
    elif kind == "right":
        assert status in (200, 400)  # 400: a mutated review the engine cannot read
    elif kind == "garbage":
        assert status != 200
    check_logs(log_lines)
