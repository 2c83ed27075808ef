"""The running server: deadline and failurePolicy (HAMi-160, kueue-5244), policy hot reload and
ConfigMap symlink swaps under concurrent requests, broken updates, certificate rotation under
concurrent requests with a real TLS client (HAMi-1572), readiness, metrics, graceful shutdown and
the ``gpuguard serve`` process (``--dev``, SIGTERM, several workers).

No assertion is about time. Deadlines, time slices and the shutdown delay run on a
:class:`~tests.fakes.fake_timer.ManualTimer` the tests advance; a test waits for an event (a thread
entered, an evaluation ended) or, where the server offers none (a hot reload), polls for a state
with a generous upper bound.
"""

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from certs.generate import generate_ca, generate_serving_cert
from certs.tls import ReloadingTLS
from kube.namespaces import StaticNamespaces
from tests.fakes.fake_timer import ManualTimer
from tests.fakes.webhook_harness import (
    JSON,
    Harness,
    bug_review,
    gpu_policy,
    loader,
    patch_of,
    write_policies,
)
from tests.paths import ROOT
from webhook.health import Health
from webhook.policy_store import PolicyStore
from webhook.server import Server
from webhook.settings import ServerSettings

WAIT_S = 30.0  # upper bound of every wait; never an assertion about speed
PROCESS_WAIT_S = 120.0  # the same for a gpuguard serve process (start-up on a loaded machine)

pytestmark = pytest.mark.asyncio


def deny(name, message, **extra):
    return gpu_policy(name, {"validations": [{"expression": "false", "message": message}],
                             **extra})


async def until(predicate, what, bound_s=WAIT_S):
    """Poll ``predicate`` (sync or async) until true; fail after ``bound_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound_s
    while loop.time() < end:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def settings(**overrides):
    # No idle cap: a test client's pool may reuse a connection the cap is closing.
    base = {"host": "127.0.0.1", "port": 0, "shutdown_delay_s": 0.0, "drain_timeout_s": 10.0,
            "policy_reload_s": 0.05, "tls_reload_s": 0.05, "max_idle_connections": 10_000}
    return ServerSettings(**{**base, **overrides})


async def waited(event, what):
    """Wait for a ``threading.Event`` set by another thread; fail after WAIT_S."""
    if not await asyncio.to_thread(event.wait, WAIT_S):
        raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def running(policies, *, tls=None, namespaces=None, timer=None, **overrides):
    """A started server; ``timer`` (default a new :class:`ManualTimer`) is ``server.timer``."""
    store = PolicyStore([str(p) for p in policies] if policies is not None else None, loader)
    server = Server(settings(**overrides), store, StaticNamespaces(namespaces or {}, "test"),
                    tls, timer=timer if timer is not None else ManualTimer())
    await server.start()
    try:
        yield server
    finally:
        if server.runner is not None and not server.health.shutting_down:
            await server.shutdown()


def url(server, path, scheme="http"):
    return f"{scheme}://127.0.0.1:{server.port}{path}"


async def post(session, server, endpoint, body, scheme="http"):
    async with session.post(url(server, f"/{endpoint}", scheme), data=json.dumps(body),
                            headers=JSON) as response:
        return response.status, await response.json()


async def readiness(session, server, scheme="http"):
    async with session.get(url(server, "/readyz", scheme)) as response:
        return response.status, await response.json()


def sample(server, name, **labels):
    return server.metrics.registry.get_sample_value(name, labels) or 0.0


def gpu_pod(uid="gpu"):
    review = bug_review("Project-HAMi-HAMi-160.yaml", "gpu_pod")
    review["request"]["uid"] = uid
    return review


class Blocker:
    """Replaces an engine's evaluate with one that waits until released (a stuck evaluation).

    With ``timer`` and ``stuck_for``, the stuck evaluation lets that many seconds pass on the
    server's timer as it enters (the time it is stuck for), so the deadline is reached while it
    is known to be running. It blocks its thread: only for servers evaluating in the thread
    pool (``inline_max_bytes=0``), as a stuck inline evaluation would block the event loop.
    """

    def __init__(self, engine, timer=None, stuck_for=0.0):
        self.engine = engine
        self.original = engine.evaluate
        self.timer = timer
        self.stuck_for = stuck_for
        self.release = threading.Event()
        self.entered = threading.Event()
        engine.evaluate = self

    def __call__(self, *args, **kwargs):
        self.thread = threading.current_thread()
        self.entered.set()
        if self.timer is not None:
            self.timer.advance(self.stuck_for)
        self.release.wait(WAIT_S)
        return self.original(*args, **kwargs)


class SlowPolicies:
    """Slow policies, on the server's :class:`ManualTimer`.

    Wraps the engine's evaluate so that the ``expired`` check it is given, which the engine
    runs before each policy, first advances the timer by ``seconds`` from the second check on
    (as if the policy before it had taken that long): once that is more than the deadline the
    webhook's own check must report the time as up. With ``hold``, that check then waits for
    the event (a thread-pool evaluation still running when the answer goes out). Records the
    threads evaluations ran on, the checks and how each evaluation ended (``ended`` is set at
    each end).
    """

    def __init__(self, engine, timer, seconds, hold=None):
        self.original = engine.evaluate
        self.timer = timer
        self.seconds = seconds
        self.hold = hold
        self.threads = []
        self.checks = 0
        self.outcomes = []  # what each evaluation ended with: "verdict" or the exception's name
        self.ended = threading.Event()
        engine.evaluate = self

    def __call__(self, review, *, expired=None, **kwargs):
        self.threads.append(threading.current_thread())
        checks = 0

        def late():
            nonlocal checks
            checks += 1
            self.checks += 1
            if checks > 1:
                self.timer.advance(self.seconds)
                if self.hold is not None:
                    self.hold.wait(WAIT_S)
            return expired()
        try:
            verdict = self.original(review, expired=late, **kwargs)
        except Exception as exc:
            self.outcomes.append(type(exc).__name__)
            self.ended.set()
            raise
        self.outcomes.append("verdict")
        self.ended.set()
        return verdict


# --- deadline and failurePolicy (HAMi-160, kueue-5244) ---------------------------------------

GPU_FAIL = gpu_policy("gpu-scheduler-check", {
    "failurePolicy": "Fail", "match": {"excludeNamespaces": ["kube-system"]},
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "validations": [{"expression": "gpu.count <= 8"}]})
GPU_IGNORE = gpu_policy("gpu-hint", {
    "failurePolicy": "Ignore",
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "validations": [{"expression": "gpu.count <= 8"}]})


async def test_deadline_denies_when_a_matching_policy_is_fail_hami_160(tmp_path):
    path = write_policies(tmp_path, GPU_FAIL, GPU_IGNORE)
    async with running([path], deadline_ms=50, inline_max_bytes=0) as server, \
            aiohttp.ClientSession() as session:
        blocker = Blocker(server.store.current.engine, server.timer, stuck_for=0.06)
        status, body = await post(session, server, "validate", gpu_pod("g1"))
        assert blocker.entered.is_set() and not blocker.release.is_set()  # still evaluating
        assert blocker.thread is not threading.current_thread()  # in the pool, off the loop
        blocker.release.set()
        assert status == 200
        response = body["response"]
        assert response["uid"] == "g1"  # response_must_echo_uid
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["message"] == (
            "gpuguard: the evaluation did not finish within the 50 ms deadline; denied because "
            "these matching policies have failurePolicy Fail: gpu-scheduler-check")
        # The system pod is outside the Fail policy's scope: allowed, with a warning.
        blocker.release.clear()
        system = bug_review("Project-HAMi-HAMi-160.yaml", "non_gpu_system_pod")
        status, body = await post(session, server, "validate", system)
        blocker.release.set()
        assert body["response"]["allowed"] is True
        assert body["response"]["warnings"] == [
            "gpuguard: the evaluation did not finish within the 50 ms deadline; allowed without "
            "policy checks because the matching policies have failurePolicy Ignore"]
        assert "patch" not in body["response"]
        text = server.metrics.exposition().decode()
        assert 'gpuguard_admission_fallbacks_total{cause="deadline",endpoint="validate"} 2.0' \
            in text


async def test_deadline_allows_with_a_warning_when_only_ignore_policies_match(tmp_path):
    path = write_policies(tmp_path, GPU_IGNORE)
    async with running([path], deadline_ms=50, inline_max_bytes=0) as server, \
            aiohttp.ClientSession() as session:
        blocker = Blocker(server.store.current.engine, server.timer, stuck_for=0.06)
        status, body = await post(session, server, "mutate", gpu_pod())
        assert blocker.entered.is_set()
        blocker.release.set()
        assert status == 200 and body["response"]["allowed"] is True
        assert body["response"]["warnings"][0].startswith(
            "gpuguard: the evaluation did not finish within the 50 ms deadline; allowed")
        assert "patch" not in body["response"]


async def test_engine_exception_follows_failure_policy(tmp_path):
    path = write_policies(tmp_path, GPU_FAIL)
    async with running([path]) as server, aiohttp.ClientSession() as session:
        def broken(*args, **kwargs):
            raise RuntimeError("engine bug")
        server.store.current.engine.evaluate = broken
        status, body = await post(session, server, "validate", gpu_pod())
        assert status == 200
        assert body["response"]["status"]["message"] == (
            "gpuguard: the evaluation failed (RuntimeError: engine bug); denied because these "
            "matching policies have failurePolicy Fail: gpu-scheduler-check")
        job = bug_review("kubernetes-sigs-kueue-5244.yaml")  # a Job without GPUs
        status, body = await post(session, server, "mutate", job)
        assert body["response"]["allowed"] is True  # no mutating policy: nothing can fail


async def test_small_bodies_are_evaluated_inline_and_large_ones_in_the_pool(tmp_path):
    path = write_policies(tmp_path, GPU_FAIL)
    small = gpu_pod("small")
    async with running([path], inline_max_bytes=len(json.dumps(small))) as server, \
            aiohttp.ClientSession() as session:
        slow = SlowPolicies(server.store.current.engine, server.timer, 0.0)
        status, body = await post(session, server, "validate", small)
        assert status == 200 and body["response"]["allowed"] is True
        large = gpu_pod("large")
        large["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * 100}
        status, body = await post(session, server, "validate", large)
        assert status == 200 and body["response"]["allowed"] is True
        loop_thread = threading.current_thread()
        assert slow.threads[0] is loop_thread and slow.threads[1] is not loop_thread
        assert slow.checks == 2  # the deadline is checked on both paths


@pytest.mark.parametrize("inline_max_bytes", [64 * 1024, 0], ids=["inline", "pool"])
async def test_deadline_stops_a_slow_evaluation_between_policies(tmp_path, inline_max_bytes):
    # Each policy's pass outlasts the 50 ms deadline: the check before the second policy sees
    # the time is up, the evaluation stops there and failurePolicy answers. In the pool, that
    # check waits until the answer is out: the answer must not wait for the evaluation.
    path = write_policies(tmp_path, GPU_IGNORE, GPU_FAIL)
    answered = None if inline_max_bytes else threading.Event()
    async with running([path], deadline_ms=50, inline_max_bytes=inline_max_bytes) as server, \
            aiohttp.ClientSession() as session:
        slow = SlowPolicies(server.store.current.engine, server.timer, 0.06, hold=answered)
        try:
            status, body = await post(session, server, "validate", gpu_pod("slow"))
        finally:
            if answered is not None:
                assert not slow.ended.is_set()  # still evaluating when answered
                answered.set()
        assert status == 200
        response = body["response"]
        assert response["uid"] == "slow" and response["allowed"] is False
        assert response["status"]["message"] == (
            "gpuguard: the evaluation did not finish within the 50 ms deadline; denied because "
            "these matching policies have failurePolicy Fail: gpu-scheduler-check")
        assert (slow.threads[0] is threading.current_thread()) == bool(inline_max_bytes)
        # Inline, it stopped before answering; in the pool the answer did not wait for it, and
        # the abandoned evaluation stops at its next check instead of running to the end.
        await waited(slow.ended, "the evaluation to stop")
        assert slow.outcomes == ["EvaluationExpired"] and slow.checks == 2
        assert sample(server, "gpuguard_admission_fallbacks_total", endpoint="validate",
                      cause="deadline") == 1.0


async def test_an_evaluation_too_slow_for_the_loop_is_done_again_in_the_pool(tmp_path):
    """Slow policies must not hold the event loop (health probes, other requests) for long: an
    inline evaluation still running after its slice is abandoned and redone in the pool, and
    the answer is the policies' own, not a fallback."""
    path = write_policies(tmp_path, GPU_IGNORE, GPU_FAIL)
    async with running([path], deadline_ms=5000, inline_slice_ms=20) as server, \
            aiohttp.ClientSession() as session:
        slow = SlowPolicies(server.store.current.engine, server.timer, 0.03)
        status, body = await post(session, server, "validate", gpu_pod("slow"))
        assert status == 200 and body["response"]["allowed"] is True
        assert "warnings" not in body["response"]
        loop_thread = threading.current_thread()
        assert slow.threads[0] is loop_thread and slow.threads[1] is not loop_thread
        assert slow.outcomes == ["EvaluationExpired", "verdict"]
        assert sample(server, "gpuguard_admission_inline_handoffs_total") == 1.0
        assert sample(server, "gpuguard_admission_fallbacks_total", endpoint="validate",
                      cause="deadline") == 0.0
        # One overrun may be a one-off (a first compile, a preempted process); the third within
        # 30 s (on the timer: 0.03 s per slow policy) says the policies are slow: from then on
        # requests go to the pool directly.
        for uid in ("second", "third", "fourth"):
            status, body = await post(session, server, "validate", gpu_pod(uid))
            assert status == 200 and body["response"]["allowed"] is True
        assert [t is loop_thread for t in slow.threads] == [True, False] * 3 + [False]
        assert slow.outcomes[-1] == "verdict"
        assert sample(server, "gpuguard_admission_inline_handoffs_total") == 3.0


# --- policy hot reload -----------------------------------------------------------------------


async def fire(session, server, count, uid_prefix, scheme="http"):
    async def one(i):
        return await post(session, server, "validate", gpu_pod(f"{uid_prefix}-{i}"), scheme)
    return await asyncio.gather(*(one(i) for i in range(count)))


async def test_hot_reload_under_concurrent_requests(tmp_path):
    path = write_policies(tmp_path, deny("version", "generation one"))
    async with running([path]) as server, aiohttp.ClientSession() as session:
        first = asyncio.create_task(fire(session, server, 150, "a"))
        await asyncio.sleep(0)
        write_policies(tmp_path, deny("version", "generation two"))
        during = await first
        await until(lambda: server.store.current.generation == 2, "the reload")
        after = await fire(session, server, 50, "b")
        for status, body in during + after:
            assert status == 200
            assert body["response"]["status"]["message"] in (
                "version: generation one", "version: generation two")
        assert {b["response"]["status"]["message"] for _, b in after} == \
            {"version: generation two"}
        status, ready = await readiness(session, server)
        assert status == 200 and ready["checks"]["policies"]["generation"] == 2
        text = server.metrics.exposition().decode()
        assert 'gpuguard_policy_reloads_total{outcome="success"} 2.0' in text


async def test_an_update_that_leaves_no_policies_is_rejected_not_served_as_allow_all(tmp_path):
    """A truncated file or an emptied directory must not become "allow everything", nor the
    built-in library: the last good set keeps serving and the error says why."""
    from webhook.policy_store import LOADED, REJECTED, RETRY

    directory = tmp_path / "policies"
    path = write_policies(directory, deny("version", "generation one"))
    store = PolicyStore([str(directory)], loader)
    assert store.load().outcome == LOADED
    path.write_text("")  # a writer that truncates before it writes
    assert store.check().outcome == RETRY  # a change: loaded once it holds still
    result = store.check()
    assert result.outcome == REJECTED and "the file is empty (0 bytes)" in result.errors[0]
    assert store.current.generation == 1 and store.current.engine.policies.names() == ("version",)
    path.unlink()  # the directory emptied
    assert store.check().outcome == RETRY
    assert store.check().outcome == REJECTED and store.current.generation == 1
    empty = PolicyStore([str(tmp_path / "policies")], loader)
    assert empty.load().outcome == REJECTED and empty.current is None
    assert "an empty set would allow everything" in empty.last_errors[0]


def configmap_version(directory, stamp, documents):
    """What the kubelet does for a ConfigMap volume: a new ..<stamp> dir, then swap ..data."""
    version = directory / f"..{stamp}"
    version.mkdir()
    for name, text in documents.items():
        (version / name).write_text(text)
    temporary = directory / "..data_tmp"
    temporary.symlink_to(version.name)
    os.replace(temporary, directory / "..data")
    for name in documents:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


async def test_configmap_symlink_swap_is_reloaded_once_per_key(tmp_path):
    mount = tmp_path / "policies"
    mount.mkdir()
    configmap_version(mount, "2026_11_29_12_00_00.1", {
        "limits.yaml": deny("limits", "first"), "more.yaml": deny("more", "first")})
    async with running([mount]) as server, aiohttp.ClientSession() as session:
        assert server.store.current.names == ("limits", "more")  # not the ..<stamp> copies
        _, body = await post(session, server, "validate", gpu_pod())
        assert body["response"]["status"]["message"] == "limits: first; more: first"
        configmap_version(mount, "2026_11_29_12_05_00.2", {
            "limits.yaml": deny("limits", "second"), "more.yaml": deny("more", "second")})
        await until(lambda: server.store.current.generation == 2, "the ConfigMap swap")
        assert server.store.current.names == ("limits", "more")
        _status, body = await post(session, server, "validate", gpu_pod())
        assert body["response"]["status"]["message"] == "limits: second; more: second"


async def test_broken_update_is_rejected_and_the_last_good_set_keeps_serving(tmp_path, caplog):
    path = write_policies(tmp_path, deny("good", "still the good set"))
    caplog.set_level("ERROR", logger="gpuguard.webhook.server")
    async with running([path]) as server, aiohttp.ClientSession() as session:
        write_policies(tmp_path, gpu_policy("broken", {"validations": [{"expression":
                                                                      "gpu.count <="}]}))
        await until(lambda: server.store.last_errors, "the rejection")
        status, body = await post(session, server, "validate", gpu_pod())
        assert body["response"]["status"]["message"] == "good: still the good set"
        status, ready = await readiness(session, server)
        assert status == 200
        rejected = ready["checks"]["policies"]["rejectedUpdate"]
        # The CEL error, and the policy the file no longer holds (it was renamed "broken").
        assert len(rejected) == 2 and "spec.validations[0].expression: CEL error" in rejected[0]
        assert "no longer holds GPUPolicy/good (loaded from it in generation 1)" in rejected[1]
        assert 'gpuguard_policy_reloads_total{outcome="rejected"} 1.0' in \
            server.metrics.exposition().decode()
        assert any(r.msg.startswith("policy update rejected; still serving generation 1")
                   for r in caplog.records)
        write_policies(tmp_path, deny("good", "fixed"))
        await until(lambda: server.store.current.generation == 2, "the fixed reload")
        status, ready = await readiness(session, server)
        assert "rejectedUpdate" not in ready["checks"]["policies"]


async def test_broken_policies_at_start_mean_not_ready_until_fixed(tmp_path):
    path = tmp_path / "policies.yaml"
    path.write_text("kind: GPUPolicy\napiVersion: gpuguard.io/v1alpha1\nspec: 3\n")
    async with running([path]) as server, aiohttp.ClientSession() as session:
        status, ready = await readiness(session, server)
        assert status == 503 and ready["checks"]["policies"]["ok"] is False
        status, body = await post(session, server, "validate", gpu_pod())
        assert status == 503 and body["reason"] == "ServiceUnavailable"
        write_policies(tmp_path, deny("good", "loaded"))
        await until(lambda: server.store.current is not None, "the first good load")
        status, ready = await readiness(session, server)
        assert status == 200


# --- TLS: a real client verifying the CA, and certificate rotation (HAMi-1572) --------------


def tls_files(directory, ca, name):
    cert, key = generate_serving_cert(ca[0], ca[1], "gpuguard", "gpuguard-system", 1,
                                      extra_sans=("localhost", "127.0.0.1"))
    (directory / f"{name}.crt").write_bytes(cert)
    (directory / f"{name}.key").write_bytes(key)
    return cert


def der(cert_pem):
    return x509.load_pem_x509_certificate(cert_pem).public_bytes(Encoding.DER)


async def peer_certificate(port, client_context):
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context,
                                                   server_hostname="127.0.0.1")
    certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return certificate


async def raw_exchange(reader, writer, body):
    data = json.dumps(body).encode()
    writer.write(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])
    return head.split(b" ", 2)[1], json.loads(await reader.readexactly(length))


async def test_tls_client_verifies_ca_and_rotation_keeps_connections_hami_1572(tmp_path):
    ca = generate_ca("test webhook CA", 1)
    cert_a = tls_files(tmp_path, ca, "tls")
    client_context = ssl.create_default_context(cadata=ca[0].decode())
    tls = ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    path = write_policies(tmp_path, gpu_policy("tolerate", {
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "mutations": [{"addToleration": {"key": "nvidia.com/gpu", "operator": "Exists"}}]}))
    async with running([path], tls=tls) as server:
        connector = aiohttp.TCPConnector(ssl=client_context)
        async with aiohttp.ClientSession(connector=connector) as session:
            status, body = await post(session, server, "mutate", gpu_pod(), "https")
            assert status == 200 and patch_of(body)
            status, ready = await readiness(session, server, "https")
            assert ready["checks"]["tls"] == {"ok": True, "detail": "serving"}
            assert await peer_certificate(server.port, client_context) == der(cert_a)
            # A keep-alive connection opened before the rotation ...
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=client_context, server_hostname="127.0.0.1")
            assert (await raw_exchange(reader, writer, gpu_pod("k1")))[0] == b"200"
            # ... cert-manager renews (same CA) while requests keep coming.
            load = asyncio.create_task(fire(session, server, 100, "r", "https"))
            cert_b = tls_files(tmp_path, ca, "tls.new")
            os.replace(tmp_path / "tls.new.key", tmp_path / "tls.key")
            os.replace(tmp_path / "tls.new.crt", tmp_path / "tls.crt")
            await until(lambda: sample(server, "gpuguard_tls_reloads_total", outcome="success"),
                        "the certificate reload")
            results = await load
            assert all(status == 200 for status, _ in results)  # no handshake errors
            assert await peer_certificate(server.port, client_context) == der(cert_b)
            status, answer = await raw_exchange(reader, writer, gpu_pod("k2"))
            assert status == b"200" and answer["response"]["uid"] == "k2"
            assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == \
                der(cert_a)  # the open connection kept its certificate
            writer.close()
            # Bad new material: reload refused, the old certificate keeps serving.
            (tmp_path / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nbroken\n")
            await until(lambda: server.health.tls_reload_error, "the refused reload")
            status, ready = await readiness(session, server, "https")
            assert status == 200 and "lastReloadError" in ready["checks"]["tls"]
            assert await peer_certificate(server.port, client_context) == der(cert_b)
            assert sample(server, "gpuguard_tls_reloads_total", outcome="failure") >= 1


async def test_readiness_fails_for_an_expired_certificate(tmp_path):
    store = PolicyStore(None, loader)
    store.load()
    health = Health(store, StaticNamespaces({}, "test"),
                    certificate_check=lambda: "the serving certificate tls.crt expired at X")
    health.tls_up = True
    ready, detail = health.readiness()
    assert not ready
    assert detail["checks"]["tls"] == {"ok": False,
                                       "detail": "the serving certificate tls.crt expired at X"}


# --- metrics and graceful shutdown -----------------------------------------------------------


async def test_metrics_page_names_every_metric(aiohttp_client, tmp_path):
    harness = Harness([write_policies(tmp_path, deny("d", "no"))])
    client = await aiohttp_client(harness.app)
    await client.post("/validate", data=json.dumps(gpu_pod()), headers=JSON)
    await client.post("/validate", data=b"{", headers=JSON)
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    for line in (
        'gpuguard_admission_requests_total{decision="denied",endpoint="validate"} 1.0',
        'gpuguard_admission_requests_total{decision="bad_request",endpoint="validate"} 1.0',
        'gpuguard_admission_policy_decisions_total{decision="deny",endpoint="validate",'
        'policy="d"} 1.0',
        'gpuguard_admission_duration_seconds_bucket{endpoint="validate",le="0.0001"}',
        "gpuguard_admission_requests_in_flight 0.0",
    ):
        assert line in text, line
    for name in ("gpuguard_policy_reloads_total", "gpuguard_tls_reloads_total",
                 "gpuguard_admission_evaluation_errors_total",
                 "gpuguard_admission_fallbacks_total", "gpuguard_policies_loaded"):
        assert f"# TYPE {name.removesuffix('_total')}" in text
    harness.close()


async def test_graceful_shutdown_drains_in_flight_requests(tmp_path):
    path = write_policies(tmp_path, deny("d", "no"))
    async with running([path], shutdown_delay_s=0.3, deadline_ms=20_000,
                       drain_timeout_s=2 * WAIT_S, inline_max_bytes=0) as server, \
            aiohttp.ClientSession() as session:
        blocker = Blocker(server.store.current.engine)
        in_flight = asyncio.create_task(post(session, server, "validate", gpu_pod("slow")))
        await waited(blocker.entered, "the request to be evaluating")
        shutdown = asyncio.create_task(server.shutdown())
        await until(lambda: server.health.shutting_down, "shutdown to begin")
        # The delay is on the server's timer: it lasts until the test moves the timer on.
        status, ready = await readiness(session, server)  # still answering, not ready
        assert status == 503 and ready["checks"]["shutdown"]["detail"] == "shutting down"
        assert server.runner.addresses
        server.timer.advance(0.3)
        await until(lambda: not server.runner.addresses, "the listener to close")
        with pytest.raises(aiohttp.ClientConnectionError):  # no new connections now
            async with aiohttp.ClientSession() as fresh:
                await readiness(fresh, server)
        assert not in_flight.done()
        blocker.release.set()  # the request in flight still completes
        status, body = await in_flight
        assert status == 200 and body["response"]["uid"] == "slow"
        await shutdown
        with pytest.raises(aiohttp.ClientConnectionError):
            await readiness(session, server)


# --- the gpuguard serve process --------------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """``gpuguard serve --dev`` in a subprocess, started and listening on every worker.

    The port is one found free, which another process may take before gpuguard binds it: a
    start that fails with "cannot start the server" is tried again on another port. The
    deadline is generous (the process runs on the real clock): a loaded machine must not turn
    an answer into a failurePolicy fallback.
    """

    ATTEMPTS = 5

    def __init__(self, *args, workers=1):
        self.workers = workers
        for _ in range(self.ATTEMPTS):
            self._start(args)
            if self._wait_started():
                return
            code, logs = self.stop()
            if not any(e["msg"] == "cannot start the server" for e in self.logged()):
                raise AssertionError(f"gpuguard serve did not start (exit {code}): {logs}")
        raise AssertionError(f"no free port in {self.ATTEMPTS} attempts")

    def _start(self, args):
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuguard", "serve", "--dev", "--port", str(self.port),
             "--shutdown-delay-s", "0.1", "--deadline-ms", "25000",
             "--workers", str(self.workers), *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The curl banner comes once the first worker listens; none when it cannot start (the
        # port was taken meanwhile: _wait_started then sees "cannot start the server").
        self.banner = ""
        while "mutate" not in self.banner:
            line = self.process.stdout.readline()
            if not line:
                break
            self.banner += line
        self.ca_file = self.context = None
        if self.banner:
            self.ca_file = re.search(r"--cacert (\S+)", self.banner)[1]
            self.context = ssl.create_default_context(cafile=self.ca_file)
        self.log_lines = []
        self._logged = threading.Condition()
        self._ended = False
        self._reader = threading.Thread(target=self._read_logs, daemon=True)
        self._reader.start()

    def _read_logs(self):
        for line in self.process.stderr:
            with self._logged:
                self.log_lines.append(line)
                self._logged.notify_all()
        with self._logged:
            self._ended = True
            self._logged.notify_all()

    def _wait_started(self):
        """True once every worker logged "listening"; False when one could not start."""
        def settled():
            entries = self.logged()
            listening = {e["pid"] for e in entries if e["msg"] == "listening"}
            failed = any(e["msg"] == "cannot start the server" for e in entries)
            return len(listening) == self.workers or failed or self._ended
        with self._logged:
            assert self._logged.wait_for(settled, PROCESS_WAIT_S), "".join(self.log_lines)
        return len({e["pid"] for e in self.logged() if e["msg"] == "listening"}) == self.workers

    def logged(self):
        return [json.loads(line) for line in list(self.log_lines) if line.startswith("{")]

    async def get(self, session, path):
        async with session.get(f"https://localhost:{self.port}{path}",
                               ssl=self.context) as response:
            return response.status, await response.text()

    async def wait_ready(self, session):
        async def ready():
            with contextlib.suppress(aiohttp.ClientError):
                return (await self.get(session, "/readyz"))[0] == 200
            return False
        await until(ready, "gpuguard serve to be ready", PROCESS_WAIT_S)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(PROCESS_WAIT_S)
        self._reader.join(PROCESS_WAIT_S)
        return code, "".join(self.log_lines)


async def test_serve_dev_prints_a_working_curl_command_and_stops_on_sigterm():
    serve = ServeProcess()
    try:
        assert f"https://localhost:{serve.port}/validate" in serve.banner
        command = next(line.strip() for line in serve.banner.splitlines()
                       if line.strip().startswith("curl") and "/validate" in line)
        async with aiohttp.ClientSession() as session:
            await serve.wait_ready(session)
        result = await asyncio.to_thread(
            subprocess.run, ["sh", "-c", command + " -s"], capture_output=True, text=True,
            cwd=ROOT, check=False)
        body = json.loads(result.stdout)
        assert body["response"]["uid"] == "0b8f5a4e-7f1c-4a57-9a8e-2c1d2f1e0001"
        assert body["response"]["allowed"] is False
        assert "gpu-requests-equal-limits" in body["response"]["status"]["message"]
    finally:
        code, logs = serve.stop()
    assert code == 0, logs
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert any(m.startswith("no cluster configured (no kubeconfig, not in a pod): running "
                            "standalone") for m in messages)
    decision = next(line for line in lines if line["msg"] == "admission")
    assert {"uid", "kind", "namespace", "name", "operation", "decision", "latency_ms"} <= \
        set(decision)
    assert "object" not in decision
    assert messages.index("shutting down: reporting not ready") < messages.index("stopped")


async def test_serve_with_two_workers_sums_metrics_across_workers():
    serve = ServeProcess(workers=2)  # both workers listening
    try:
        async with aiohttp.ClientSession() as session:
            await serve.wait_ready(session)
            review = json.loads((ROOT / "examples" / "admission" /
                                 "gpu-pod-review.json").read_text())
            for _ in range(20):
                # A new connection each time, so that SO_REUSEPORT spreads them.
                async with aiohttp.ClientSession() as fresh, fresh.post(
                        f"https://localhost:{serve.port}/mutate", json=review,
                        ssl=serve.context) as response:
                    assert response.status == 200
            _status, text = await serve.get(session, "/metrics")
        total = sum(float(m[1]) for m in re.finditer(
            r'gpuguard_admission_requests_total\{decision="allowed",endpoint="mutate"\} (\S+)',
            text))
        assert total == 20.0
    finally:
        code, logs = serve.stop()
    assert code == 0, logs
    pids = {json.loads(line)["pid"] for line in logs.splitlines()
            if line.startswith("{") and '"msg":"listening"' in line}
    assert len(pids) == 2


async def test_serve_without_certificate_is_a_usage_error():
    result = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpuguard", "serve"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--cert and --key are required" in result.stderr


async def test_serve_with_refused_tls_material_is_a_usage_error(tmp_path):
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    result = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpuguard", "serve", "--cert",
                             str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key")],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("gpuguard serve: error: ")
    assert "tls.crt" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "/nonexistent/policies"],
     "--policies /nonexistent/policies: no such file or directory"),
    (["--namespace-labels", "/nonexistent/ns.yaml"], "/nonexistent/ns.yaml: cannot be read"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "kubeconfig /nonexistent/kubeconfig: no such file"),
    (["--deadline-ms", "0"], "deadline_ms: must be at least 1, got 0"),
    (["--inline-slice-ms", "0"], "inline_slice_ms: must be at least 1, got 0"),
    (["--workers", "0"], "workers: must be at least 1, got 0"),
    (["--client-ca", "/nonexistent/ca.crt"], "--client-ca /nonexistent/ca.crt: file not found"),
    (["--header-timeout-s", "0"], "header_timeout_s: must be above 0 seconds, got 0.0"),
    (["--max-connections", "0"], "max_connections: must be at least 1, got 0"),
    (["--max-large-requests", "0"], "max_large_requests: must be at least 1, got 0"),
    (["--max-idle-connections", "-1"], "max_idle_connections: must not be negative, got -1"),
])
async def test_serve_input_errors_exit_2_with_one_line(args, message):
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gpuguard", "serve", "--dev", *args], cwd=ROOT,
        capture_output=True, text=True, check=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpuguard serve")]
    assert len(errors) == 1 and errors[0].startswith(f"gpuguard serve: error: {message}")
